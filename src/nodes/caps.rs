//! What one node's server lets this client do without Lua: whether it may run scripts at all,
//! and which native compare-and-delete command it has (Valkey >= 9.0: `DELIFEQ`; Redis >= 8.4:
//! `DELEX ... IFEQ`). Both servers with such a command also have `SET ... IFEQ`, which extends
//! a lock without a script.
//!
//! How it is learnt, at every (re)connect (`connection` calls [`probe`] right after the `INFO`
//! that identifies the server, before the node counts), in one round trip of three commands that
//! change nothing:
//! - `EVALSHA <40 zeros> 0`: `NOSCRIPT` means scripts may run; `NOPERM` (or an unknown command)
//!   means this user may not run them;
//! - `DELIFEQ <probe key> <random value>` and `DELEX <probe key> IFEQ <random value>`: an integer
//!   (or a key-permission `NOPERM`) means the command exists and this user may run it; an unknown
//!   command or a command-permission `NOPERM` means not. The value is 128 random bits, so nothing
//!   can be deleted.
//!
//! Why asking the commands rather than reading the version (`valkey_version` /
//! `redis_version` in `INFO server`): the answer also covers what the version cannot tell,
//! the user's ACL (`-delifeq`), a renamed or disabled command, a proxy, a fork, and `INFO`
//! itself being denied. The version is still read (from the `INFO` reply already fetched, so for
//! free) to word the errors: "Redis 7.0.15 has no DELIFEQ".
//!
//! At run time an answer can still correct the probe: a script refused with `NOPERM` marks
//! scripts denied, a native command unknown to the server stops its use (see `native`).
//!
//! Owns: the per-node capability flags and the probe. Must not: decide which command a lock
//! operation sends (`native` and `node` do).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use fred::clients::Client;
use fred::prelude::{ClientLike, Options, Value};
use fred::types::{ClusterHash, CustomCommand};

/// The native compare-and-delete a node offers (each comes with `SET ... IFEQ`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Native {
    /// None (or not known yet, or not allowed for this user): scripts do it.
    None,
    /// Valkey >= 9.0: `DELIFEQ key value`.
    DelIfEq,
    /// Redis >= 8.4: `DELEX key IFEQ value` (built, not tested: no such server here).
    DelEx,
}

/// Whether this node's user may run scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scripts {
    /// Not probed yet (a cluster node, or a probe that did not answer): assumed allowed.
    Unknown,
    /// `EVALSHA` answered `NOSCRIPT` (or a script ran).
    Allowed,
    /// `NOPERM`, or scripting is not available on this server.
    Denied,
}

/// One node's capabilities, shared by its connection (which probes) and its commands.
#[derive(Debug)]
pub(crate) struct Caps {
    native: AtomicU8,
    scripts: AtomicU8,
    /// Scripts refused so far (`deny_scripts`): a probe that started before the latest refusal
    /// does not undo it with the older answer it got.
    denials: std::sync::atomic::AtomicU64,
    /// `Valkey 9.1.2`, `Redis 7.0.15`, or `this server` when `INFO` could not be read.
    server: Mutex<String>,
    /// The server's words when it refused a script (`NOPERM User app has no permissions ...`).
    denied: Mutex<String>,
    /// The [`Cached`] scripts that ran on this connection since the last (re)connect, so the
    /// server has them cached and EVALSHA finds them (unless someone flushed the cache
    /// meanwhile): one bit each.
    cached: AtomicU8,
    /// The `always_eval` scripts (by `Script::slot`) known to be in the server's cache: sent
    /// by EVALSHA, never resent (see `scripts`).
    known: std::sync::atomic::AtomicU64,
}

/// The scripts sent whole until they are known to be in the server's cache, then by hash: a
/// `NOSCRIPT` resend would land after commands sent meanwhile (a read of the same key would
/// see the key before its release).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cached {
    /// `scripts::RELEASE`, a lone release (see `batch::lone_release`).
    Release = 1,
    /// `scripts::GATE_FREE`, a holder's release on its gate.
    GateFree = 2,
    /// `scripts::GATE_FLAG`, a lone release on a gate with no known line.
    GateFlag = 4,
    /// `scripts::ELECT_GATE_FREE`, an election term's release on its gate.
    ElectGateFree = 8,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            native: AtomicU8::new(0),
            scripts: AtomicU8::new(0),
            denials: std::sync::atomic::AtomicU64::new(0),
            server: Mutex::new("this server".into()),
            denied: Mutex::new(String::new()),
            cached: AtomicU8::new(0),
            known: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Caps {
    /// The native compare-and-delete to use, if any.
    pub(crate) fn native(&self) -> Native {
        match self.native.load(Ordering::Relaxed) {
            1 => Native::DelIfEq,
            2 => Native::DelEx,
            _ => Native::None,
        }
    }

    /// Whether scripts may run here (as far as known).
    pub(crate) fn scripts(&self) -> Scripts {
        match self.scripts.load(Ordering::Relaxed) {
            1 => Scripts::Allowed,
            2 => Scripts::Denied,
            _ => Scripts::Unknown,
        }
    }

    pub(crate) fn set_native(&self, native: Native) {
        let v = match native {
            Native::None => 0,
            Native::DelIfEq => 1,
            Native::DelEx => 2,
        };
        self.native.store(v, Ordering::Relaxed);
    }

    /// A script was refused with `words` (`NOPERM ...`).
    pub(crate) fn deny_scripts(&self, words: &str) {
        let mut denied = self.denied.lock().unwrap_or_else(|p| p.into_inner());
        *denied = words.to_string();
        self.scripts.store(2, Ordering::Relaxed);
        self.denials.fetch_add(1, Ordering::Relaxed);
    }

    /// Scripts may run, as a probe begun when [`Caps::denials`] was `seen` found: unless a
    /// script was refused since (an ACL change while the probe's answers were on their way).
    fn allow_scripts(&self, seen: u64) {
        // Under the lock `deny_scripts` holds: a refusal is either counted here or comes after.
        let _denied = self.denied.lock().unwrap_or_else(|p| p.into_inner());
        if self.denials.load(Ordering::Relaxed) == seen {
            self.scripts.store(1, Ordering::Relaxed);
        }
    }

    /// How many script refusals this node has learnt (see `allow_scripts`).
    fn denials(&self) -> u64 {
        let _denied = self.denied.lock().unwrap_or_else(|p| p.into_inner());
        self.denials.load(Ordering::Relaxed)
    }

    /// Whether `script` is known to be in the server's script cache.
    pub(crate) fn is_cached(&self, script: Cached) -> bool {
        self.cached.load(Ordering::Relaxed) & script as u8 != 0
    }

    /// Forgets every script this node was known to have: the connection reached another
    /// server, or a restarted one (its script cache is empty).
    pub(crate) fn forget_scripts(&self) {
        self.cached.store(0, Ordering::Relaxed);
        self.known.store(0, Ordering::Relaxed);
    }

    /// Whether the `always_eval` script in `slot` is known to be in the server's cache.
    pub(crate) fn knows(&self, slot: u8) -> bool {
        self.known.load(Ordering::Relaxed) & (1u64 << (slot & 63)) != 0
    }

    /// Records whether the `always_eval` script in `slot` is in the server's cache.
    pub(crate) fn set_known(&self, slot: u8, known: bool) {
        let bit = 1u64 << (slot & 63);
        match known {
            true => self.known.fetch_or(bit, Ordering::Relaxed),
            false => self.known.fetch_and(!bit, Ordering::Relaxed),
        };
    }

    pub(crate) fn set_cached(&self, script: Cached, cached: bool) {
        match cached {
            true => self.cached.fetch_or(script as u8, Ordering::Relaxed),
            false => self.cached.fetch_and(!(script as u8), Ordering::Relaxed),
        };
    }

    /// `Valkey 9.1.2`, `Redis 7.0.15`, or `this server`.
    pub(crate) fn server(&self) -> String {
        self.server
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The server's words when it last refused a script.
    pub(crate) fn denied_words(&self) -> String {
        self.denied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Scripts are denied, and plain locks work through native commands.
    pub(crate) fn lua_free_only(&self) -> bool {
        self.scripts() == Scripts::Denied && self.native() != Native::None
    }

    /// Why no lock can be granted here, when this user may not run scripts and the server has
    /// no native compare-and-delete (a key set here could never be released nor extended).
    pub(crate) fn no_lock(&self) -> Option<String> {
        (self.scripts() == Scripts::Denied && self.native() == Native::None).then(|| {
            format!(
                "this user may not run scripts ({}) and {} has no DELIFEQ: grant +@scripting, or use Valkey >= 9.0 / Redis >= 8.4",
                self.denied_words(),
                self.server()
            )
        })
    }

    /// Why a script cannot run here, with the fix; `None` when scripts may run.
    pub(crate) fn no_script(&self) -> Option<String> {
        if let Some(why) = self.no_lock() {
            return Some(why);
        }
        (self.scripts() == Scripts::Denied).then(|| {
            format!(
                "{}: semaphores, fencing tokens, locks on several resources, read-write locks and elections need Lua scripts; grant +@scripting to this user (plain locks work without them here)",
                self.denied_words()
            )
        })
    }
}

/// `Valkey 9.1.2` or `Redis 7.0.15` from an `INFO server` reply (Valkey also reports
/// `redis_version:7.2.4`, so its own field comes first).
pub(crate) fn server_of(info: &str) -> Option<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(v) = field("valkey_version:") {
        return Some(format!("Valkey {v}"));
    }
    let name = match field("server_name:").as_deref() {
        Some("valkey") => "Valkey",
        _ => "Redis",
    };
    field("redis_version:").map(|v| format!("{name} {v}"))
}

/// What one probe answer says about a command: it exists and may run (`Some(true)`), it does
/// not or may not (`Some(false)`), or nothing useful (`None`: a timeout, a reset connection).
fn allowed(reply: &Result<Value, fred::error::Error>) -> Option<bool> {
    match reply {
        Ok(_) => Some(true),
        Err(e) => {
            let d = e.details();
            if d.starts_with("NOSCRIPT") || d.contains("WRONGTYPE") {
                Some(true)
            } else if d.starts_with("NOPERM") {
                // A key outside the user's patterns: the command itself is allowed.
                Some(!d.contains("to run the"))
            } else if is_unknown_command(d) {
                Some(false)
            } else if e.kind() == &fred::error::ErrorKind::Timeout
                || e.kind() == &fred::error::ErrorKind::IO
                || e.kind() == &fred::error::ErrorKind::Canceled
            {
                None
            } else {
                // Another server error (`ERR ... scripting is disabled`, a syntax error from a
                // server that has the name but not the form): not usable.
                Some(false)
            }
        }
    }
}

/// The server does not know the command (or its arguments: an older `SET` without `IFEQ`).
pub(crate) fn is_unknown_command(details: &str) -> bool {
    details.contains("unknown command") || details.contains("syntax error")
}

/// Probes `client`'s server (see the module docs) and records the answers in `caps`; `info` is
/// the `INFO server` reply when it could be read. Returns `false` when the server did not
/// answer (the caller retries as for `INFO`).
pub(crate) async fn probe(client: &Client, info: Option<&str>, caps: &Caps) -> bool {
    if let Some(server) = info.and_then(server_of) {
        *caps.server.lock().unwrap_or_else(|p| p.into_inner()) = server;
    }
    let opts = Options {
        timeout: Some(Duration::from_secs(2)),
        max_attempts: Some(1),
        fail_fast: true,
        ..Options::default()
    };
    let with = client.with_options(&opts);
    let denials = caps.denials();
    let random = format!("{:032x}", rand::random::<u128>());
    let key = format!("fredlock:probe:{random}");
    let send = |cmd: &'static str, offset: usize, args: Vec<Value>| {
        let command = CustomCommand::new_static(cmd, ClusterHash::Offset(offset), false);
        with.custom::<Value, Value>(command, args)
    };
    let (script, delifeq, delex) = futures::join!(
        Box::pin(send(
            "EVALSHA",
            2,
            vec![Value::from("0".repeat(40)), Value::Integer(0)]
        )),
        Box::pin(send(
            "DELIFEQ",
            0,
            vec![Value::from(key.as_str()), Value::from(random.as_str())]
        )),
        Box::pin(send(
            "DELEX",
            0,
            vec![
                Value::from(key.as_str()),
                Value::from("IFEQ"),
                Value::from(random.as_str())
            ]
        )),
    );
    let (Some(scripts), Some(delifeq_ok), Some(delex_ok)) =
        (allowed(&script), allowed(&delifeq), allowed(&delex))
    else {
        return false;
    };
    match (scripts, &script) {
        (true, _) => caps.allow_scripts(denials),
        (false, Err(e)) => caps.deny_scripts(e.details()),
        (false, Ok(_)) => caps.deny_scripts("scripts are not available"),
    }
    caps.set_native(match (delifeq_ok, delex_ok) {
        (true, _) => Native::DelIfEq,
        (false, true) => Native::DelEx,
        (false, false) => Native::None,
    });
    tracing::debug!(server = %caps.server(), native = ?caps.native(), scripts = ?caps.scripts(), "fredlock: node capabilities");
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_is_read_from_info() {
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
        assert_eq!(server_of(valkey).as_deref(), Some("Valkey 9.1.2"));
        let redis = "# Server\r\nredis_version:7.0.15\r\nrun_id:x\r\n";
        assert_eq!(server_of(redis).as_deref(), Some("Redis 7.0.15"));
        let old_valkey = "redis_version:7.2.5\r\nserver_name:valkey\r\n";
        assert_eq!(server_of(old_valkey).as_deref(), Some("Valkey 7.2.5"));
        assert_eq!(server_of("# Server\r\n"), None);
    }

    #[test]
    fn a_lock_needs_scripts_or_a_native_delete() {
        let caps = Caps::default();
        assert_eq!(caps.no_lock(), None);
        assert_eq!(caps.no_script(), None);
        caps.deny_scripts("NOPERM User app has no permissions to run the 'evalsha' command");
        let why = caps.no_lock().expect("no lock");
        assert!(why.contains("NOPERM User app"), "{why}");
        assert!(why.contains("this server has no DELIFEQ"), "{why}");
        caps.set_native(Native::DelIfEq);
        assert_eq!(caps.no_lock(), None);
        assert!(caps.no_script().expect("no script").contains("+@scripting"));
        // A probe begun before that refusal does not undo it with its older answer.
        let seen = caps.denials() - 1;
        caps.allow_scripts(seen);
        assert!(caps.no_script().is_some(), "a stale probe allowed scripts");
        caps.allow_scripts(caps.denials());
        assert!(caps.no_script().is_none(), "a fresh probe's answer counts");
    }
}
