//! Every Lua script fredlock runs. The scripts are the `.lua` files in `lua/`, each with a
//! header that gives its KEYS, ARGV and reply; this file names them, says how each is sent,
//! and hashes them. A script assembled from fragments (`line_lib.lua`, `gate_free_fn.lua`,
//! `elect_lib.lua`, `sem_take.lua`: shared Lua functions) is the fragments, then its own file.
//! Headers are not sent (see [`Script`]).
//!
//! Most scripts are sent with EVALSHA and, on `NOSCRIPT` (after `SCRIPT FLUSH` or a node
//! restart), resent at once with EVAL on the same connection (see [`crate::nodes::node`]).
//! ACQUIRE_MANY, BATCH and the RELEASE of several keys or of a caller's token are always sent
//! with EVAL, because a resend breaks per-node order (a lone release with a fresh token goes by
//! EVALSHA: see `batch::release_script`; on a server with `DELIFEQ` it needs no script at all,
//! see `native`):
//! - a release can be answered after its caller stopped waiting (a paused node, a dropped
//!   future); a late NOSCRIPT then has nobody left to resend it, leaving the key for a TTL;
//! - an acquire answered NOSCRIPT after the quorum was decided would be resent AFTER the
//!   release queued behind it, setting a key nobody releases (the SCRIPT FLUSH test caught it).
//!
//! A resent extend lands at worst after a release, where it finds no token and does nothing.
//! EVAL costs the script's body on the wire (up to 1.6 KB) and a SHA1 of it on the server.
//!
//! So the scripts that must never be resent (`always_eval`, each with its own [`Script::slot`])
//! go whole until a connection to a single server has run them once, and then by EVALSHA
//! without any resend: a `NOSCRIPT` answer means the script did not run, so that node simply
//! refuses that one attempt (its retry sends the body again); nothing can land late.
//!
//! All scripts touch only their `KEYS`, and all of one call's keys share a hash slot on a Redis
//! Cluster node (`slots` names derived keys that way; `node` splits a multi-resource lock into one
//! call per slot).
//!
//! Owns: the scripts' list, how each is sent, their hashes. Must not: send anything (the node
//! layer does).

use crate::base::sem_rw_scripts::{
    sem_take, RW_DOWNGRADE, RW_READ, RW_VIEW, RW_WRITE, SEM_ACQUIRE,
};

/// A script and its SHA1, computed once.
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) body: &'static str,
    pub(crate) sha: String,
    /// Never resend: the body (EVAL) until the server is known to have it, then the hash
    /// (EVALSHA) with no resend on `NOSCRIPT` (see the top of this file).
    pub(crate) always_eval: bool,
    /// For an `always_eval` script: its bit among the scripts a connection knows the server
    /// has (`Caps::knows`).
    pub(crate) slot: Option<u8>,
}

/// The next `always_eval` script's slot.
static NEXT_SLOT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// A script's text as sent: without the lines that start with `--` in the first column (each
/// file's header, and the headers of the fragments it is assembled from), so that a contract
/// costs nothing on the wire; comments inside the code are indented and stay.
fn without_headers(text: &'static str) -> &'static str {
    if !text.split('\n').any(|line| line.starts_with("--")) {
        return text;
    }
    let kept: String = text
        .split_inclusive('\n')
        .filter(|line| !line.starts_with("--"))
        .collect();
    // Once per script and process (`Scripts::get`): the bodies live as long as the process.
    Box::leak(kept.into_boxed_str())
}

impl Script {
    fn new(text: &'static str) -> Self {
        let body = without_headers(text);
        Script {
            body,
            sha: fred::util::sha1_hash(body),
            always_eval: false,
            slot: None,
        }
    }

    fn eval_only(body: &'static str) -> Self {
        let slot = NEXT_SLOT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Script {
            always_eval: true,
            slot: (slot < 64).then_some(slot),
            ..Script::new(body)
        }
    }
}

/// `lua/acquire_many.lua`: Acquire several keys at once, all or none.
const ACQUIRE_MANY: &str = include_str!("lua/acquire_many.lua");

/// `lua/extend.lua`: Extend: only if EVERY key still holds our token, then reset every key's
/// TTL.
const EXTEND: &str = include_str!("lua/extend.lua");

/// `lua/repair.lua`: Repair a held lock on a node where (some of) its keys are missing: only if
/// no key holds another value, set every key to our value with the TTL (a missing key is
/// created, one of ours has its TTL reset); all or none.
const REPAIR: &str = include_str!("lua/repair.lua");

/// `lua/release.lua`: Release: delete each key that still holds our token, leave every other
/// key alone.
const RELEASE: &str = include_str!("lua/release.lua");

/// `lua/shorten.lua`: Shorten (hold at least): only if EVERY key still holds our token, lower
/// each key's TTL to ARGV[2] ms; a key whose TTL is already shorter (or that has none) keeps
/// it, so this never lengthens a lock nor re-creates a key.
const SHORTEN: &str = include_str!("lua/shorten.lua");

/// `lua/lease_check.lua`: Check a lease (a lock handed to another process): whether EVERY key
/// still holds our token, and the shortest TTL left among them.
const LEASE_CHECK: &str = include_str!("lua/lease_check.lua");

/// `lua/inspect.lua`: Inspect one key atomically.
const INSPECT: &str = include_str!("lua/inspect.lua");

/// `lua/break.lua`: Break a lock by force, whoever holds it (an operator's `fredlock break`):
/// read the value and its TTL, and delete the key (the caller then pokes the key's wait line,
/// see LINE_LEAVE).
const BREAK: &str = include_str!("lua/break.lua");

/// `lua/acquire_fenced.lua`: Acquire several keys at once, all or none, and read each key's
/// fencing counter in the same script, so that a grant never lacks its counter.
const ACQUIRE_FENCED: &str = include_str!("lua/acquire_fenced.lua");

/// `lua/fence_raise.lua`: Raise fencing counters: a max-register, so a late or repeated write
/// never lowers one.
const FENCE_RAISE: &str = include_str!("lua/fence_raise.lua");

/// `lua/line_lib.lua`: The wait line of a lock key on its gate node (see `line` and `redlock`'s
/// waiting): a sorted set of waiter members (`<instance>:<seq>`, score = arrival order) and,
/// per member, a lease key `<line>|<member>` that the waiter renews while it waits (a waiter
/// whose process died drops out when its lease expires).
macro_rules! line_lib {
    () => {
        include_str!("lua/line_lib.lua")
    };
}

/// `lua/gate_acquire.lua`: Acquire one lock key on its gate node: granted only to the head of
/// the key's wait line (or to anyone while the line is empty), so that the woken head never
/// splits votes with the waiters behind it.
const GATE_ACQUIRE: &str = concat!(line_lib!(), include_str!("lua/gate_acquire.lua"),);

/// `lua/sem_gate.lua`: Take one semaphore slot on the semaphore's gate node: `take()` (see
/// `sem_take!` in `sem_rw_scripts`) for the head of the semaphore's wait line only (or anyone
/// while it is empty); a refused waiter joins the line.
const SEM_GATE: &str = concat!(sem_take!(), line_lib!(), include_str!("lua/sem_gate.lua"),);

/// `lua/gate_release.lua`: Release on a gate node: RELEASE, then, for a holder's release, wake
/// the head of the line when a key is free (whoever deleted it: an expired or broken holder's
/// key counts too); a clean-up (`q`) wakes it only when it deleted a key (someone may have been
/// refused by it); for a waiter's failed attempt, put the waiter back at the FRONT of the line
/// (its turn is not lost to a barging client), but only a waiter that held a place here (its
/// lease key lives): one whose attempts never reached the gate joins at the back at its next
/// attempt.
const GATE_RELEASE: &str = concat!(line_lib!(), include_str!("lua/gate_release.lua"),);

/// `lua/line_leave.lua`: Leave a wait line (a waiter that gave up, was cancelled or timed out,
/// or was granted by the other nodes while this gate refused it), and when the leaver was its
/// head (or no member is given: a poke after a lock was broken) wake the next head: for its
/// turn when a key is free (`leave`), otherwise only to look at the gate (`look`), which tells
/// it that it is the head now (a waiter far behind would learn it only at its next `ZRANK`, up
/// to 4 s later, and a key held by a client that ignores lines is freed without a wake-up).
const LINE_LEAVE: &str = concat!(line_lib!(), include_str!("lua/line_leave.lua"),);

/// `lua/gate_free_fn.lua`: `free()`: the body of [`GATE_FREE`] (see there), as a function that
/// also returns what the lock key holds after it (`false`: nothing), for [`ELECT_GATE_FREE`]'s
/// announcement.
macro_rules! gate_free_fn {
    () => {
        include_str!("lua/gate_free_fn.lua")
    };
}

/// `lua/gate_free.lua`: A holder's release on its gate node, for a key known to have a line:
/// the line's head, then one `MGET` of the key, its line's flag (set while the line has
/// members) and the head's lease; without a flag, the compare-and-delete and nothing more; with
/// one, the head is woken as GATE_RELEASE does (a head whose lease is gone is passed over, as
/// `live_head` does).
const GATE_FREE: &str = concat!(
    line_lib!(),
    gate_free_fn!(),
    include_str!("lua/gate_free.lua"),
);

/// `lua/gate_flag.lua`: A lone release on a key's gate while this process knows of no line
/// there: the compare-and-delete and a read of the line's flag in the same `MGET` (as GATE_FREE
/// reads them), and nothing of the line's library: the common, uncontended release costs the
/// server what a plain release does.
const GATE_FLAG: &str = include_str!("lua/gate_flag.lua");

/// `lua/pass.lua`: A holder hands its lock to a waiter of its own process, on a node that is
/// not the key's gate: where the key still holds the holder's value (or is free), it now holds
/// the waiter's.
const PASS: &str = include_str!("lua/pass.lua");

/// `lua/gate_pass.lua`: PASS on the key's gate, in line order: passed only when no member of
/// another process is ahead of the waiter in the key's line (the waiter then leaves the line; a
/// waiter not in the line, queued in its process, passes only when every member is of its
/// process); otherwise nothing is changed (the holder cleans up where PASS landed elsewhere,
/// then releases here as usual, which wakes the head: the head never finds the waiter's keys in
/// its way).
const GATE_PASS: &str = concat!(line_lib!(), include_str!("lua/gate_pass.lua"),);

/// `lua/view_many.lua`: Read several keys atomically.
const VIEW_MANY: &str = include_str!("lua/view_many.lua");

/// `lua/extend_many.lua`: Extend many locks in one call (the keep-alive's batched renewal): per
/// lock, exactly what [`EXTEND`] does for one, so each lock's answer is its own.
const EXTEND_MANY: &str = include_str!("lua/extend_many.lua");

/// `lua/batch.lua`: Many single-key operations of concurrent locks on one node, in one call
/// (see `batch`): each does exactly what its plain form does, in the order given, so a release
/// never runs before an earlier acquire of the same token.
const BATCH: &str = include_str!("lua/batch.lua");

/// `lua/elect_lib.lua`: The election scripts' shared functions: - `view(lock, record, yield)`:
/// this node's view of the election, `{live, term, value, priority, version, pttl, label,
/// yield, yield_pttl}` (see [`ELECT_VIEW`]); `view_of` builds it from the lock's value and the
/// record's fields when the script has them already, and reads the request to yield only when
/// given its key (`yield_key`; without it the view has none: `''` and -2); - `announce(record,
/// v, channel)`: publishes the view `v` on the record's name, or on `channel` when given (the
/// campaigns' channel `<record>|prio`, which hears only what changes a campaign: a request to
/// yield, a claim of another priority than the last term's); returns the number of receivers.
macro_rules! elect_lib {
    () => {
        include_str!("lua/elect_lib.lua")
    };
}

/// `lua/elect_claim.lua`: An election's leader claims its term, or changes its campaign value
/// within it (proclaim).
const ELECT_CLAIM: &str = concat!(elect_lib!(), include_str!("lua/elect_claim.lua"),);

/// `lua/elect_view.lua`: Read an election's state atomically, without its secret token.
const ELECT_VIEW: &str = concat!(elect_lib!(), include_str!("lua/elect_view.lua"),);

/// `lua/elect_yield.lua`: A preferred candidate asks the leader of a term to yield.
const ELECT_YIELD: &str = concat!(elect_lib!(), include_str!("lua/elect_yield.lua"),);

/// `lua/elect_notify.lua`: Announces this node's view of an election to its observers (after a
/// resign), without the request to yield (see `elect_lib`).
const ELECT_NOTIFY: &str = concat!(elect_lib!(), include_str!("lua/elect_notify.lua"),);

/// `lua/elect_extend.lua`: An election term's extension, and the announcement of this node's
/// view after it, so that observers learn the new TTL without reading (see `observe`).
const ELECT_EXTEND: &str = concat!(elect_lib!(), include_str!("lua/elect_extend.lua"),);

/// `lua/elect_resign.lua`: The release of an election's term on a node that is not its line's
/// gate, and the announcement of this node's view after it (what ELECT_NOTIFY sends, in the
/// same script; once the key holds no value, a view that is not live and names no term, without
/// reading the record: an observer names a leader from live views alone).
const ELECT_RESIGN: &str = concat!(elect_lib!(), include_str!("lua/elect_resign.lua"),);

/// `lua/elect_gate_free.lua`: GATE_FREE for an election's term, and the announcement of the
/// election's view on this node after it (as ELECT_RESIGN announces it, without reading the
/// lock key again).
const ELECT_GATE_FREE: &str = concat!(
    line_lib!(),
    elect_lib!(),
    gate_free_fn!(),
    include_str!("lua/elect_gate_free.lua"),
);

/// The scripts, hashed once per process.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire_many: Script,
    pub(crate) extend: Script,
    pub(crate) repair: Script,
    pub(crate) shorten: Script,
    pub(crate) lease_check: Script,
    pub(crate) rw_read: Script,
    pub(crate) rw_write: Script,
    pub(crate) rw_view: Script,
    pub(crate) rw_downgrade: Script,
    pub(crate) release: Script,
    pub(crate) inspect: Script,
    pub(crate) force_break: Script,
    pub(crate) acquire_fenced: Script,
    pub(crate) fence_raise: Script,
    pub(crate) sem_acquire: Script,
    pub(crate) view_many: Script,
    pub(crate) extend_many: Script,
    pub(crate) batch: Script,
    pub(crate) gate_acquire: Script,
    pub(crate) sem_gate: Script,
    pub(crate) gate_release: Script,
    pub(crate) gate_free: Script,
    pub(crate) elect_gate_free: Script,
    pub(crate) gate_flag: Script,
    pub(crate) pass: Script,
    pub(crate) gate_pass: Script,
    pub(crate) line_leave: Script,
    pub(crate) elect_resign: Script,
    pub(crate) elect_extend: Script,
    pub(crate) elect_claim: Script,
    pub(crate) elect_view: Script,
    pub(crate) elect_yield: Script,
    pub(crate) elect_notify: Script,
}

impl Scripts {
    pub(crate) fn get() -> &'static Scripts {
        static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
        SCRIPTS.get_or_init(|| Scripts {
            acquire_many: Script::eval_only(ACQUIRE_MANY),
            extend: Script::new(EXTEND),
            // Creates keys, as an acquire does: EVAL-only (a late resend could land after the
            // release queued behind it).
            repair: Script::eval_only(REPAIR),
            // Like EXTEND, a resend can only find the token gone and do nothing.
            shorten: Script::new(SHORTEN),
            // Read-only: a resend changes nothing.
            lease_check: Script::new(LEASE_CHECK),
            // Acquires: EVAL-only, for the reason given at the top of this file.
            rw_read: Script::eval_only(RW_READ),
            rw_write: Script::eval_only(RW_WRITE),
            rw_view: Script::new(RW_VIEW),
            // Deletes the writer key, as a release does: EVAL-only.
            rw_downgrade: Script::eval_only(RW_DOWNGRADE),
            release: Script::eval_only(RELEASE),
            inspect: Script::new(INSPECT),
            // A deletion is sent whole, like a release: a late NOSCRIPT resend could delete a
            // NEWER holder's key.
            force_break: Script::eval_only(BREAK),
            // Acquires are EVAL-only, for the reason given at the top of this file.
            acquire_fenced: Script::eval_only(ACQUIRE_FENCED),
            fence_raise: Script::new(FENCE_RAISE),
            sem_acquire: Script::eval_only(SEM_ACQUIRE),
            view_many: Script::new(VIEW_MANY),
            // Like EXTEND: a resent batch lands at worst after a release, where each lock's
            // token is gone and nothing is done for it.
            extend_many: Script::new(EXTEND_MANY),
            // A resent batch could land after a release queued behind it: EVAL only.
            batch: Script::eval_only(BATCH),
            // Acquires and releases: EVAL-only like the others (a late NOSCRIPT resend would
            // break per-node order). Leaving a line is idempotent and orders with nothing.
            gate_acquire: Script::eval_only(GATE_ACQUIRE),
            sem_gate: Script::eval_only(SEM_GATE),
            gate_release: Script::eval_only(GATE_RELEASE),
            // Deletes only its caller's token, like a lone release (see the top of this file).
            gate_free: Script::new(GATE_FREE),
            elect_gate_free: Script::new(ELECT_GATE_FREE),
            gate_flag: Script::new(GATE_FLAG),
            // Hand-overs create the waiter's key, as an acquire does: EVAL-only.
            pass: Script::eval_only(PASS),
            gate_pass: Script::eval_only(GATE_PASS),
            line_leave: Script::new(LINE_LEAVE),
            // A resent claim or yield re-checks everything it depends on: EVALSHA is safe.
            elect_claim: Script::new(ELECT_CLAIM),
            elect_view: Script::new(ELECT_VIEW),
            elect_yield: Script::new(ELECT_YIELD),
            elect_notify: Script::new(ELECT_NOTIFY),
            // Deletes only the term's own fresh token, like a lone release.
            elect_resign: Script::new(ELECT_RESIGN),
            // Like EXTEND: never creates a key, so a late resend only finds it gone.
            elect_extend: Script::new(ELECT_EXTEND),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_not_sent_and_code_comments_are() {
        assert_eq!(without_headers("-- a\n-- b\nreturn 1\n"), "return 1\n");
        assert_eq!(without_headers("x()\n  -- why\n"), "x()\n  -- why\n");
        let s = Scripts::get();
        for script in [
            &s.gate_acquire,
            &s.elect_gate_free,
            &s.sem_gate,
            &s.batch,
            &s.extend,
        ] {
            assert!(!script.body.split('\n').any(|l| l.starts_with("--")));
            assert!(script.body.contains("redis.call"), "{}", script.body);
        }
    }

    #[test]
    fn every_lua_file_says_its_contract_and_is_used() {
        let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/base");
        let rust = [
            include_str!("scripts.rs"),
            include_str!("sem_rw_scripts.rs"),
        ]
        .concat();
        for entry in std::fs::read_dir(base.join("lua")).expect("src/base/lua") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("read");
            assert!(text.starts_with("-- "), "{} has no header", path.display());
            let name = path.file_name().expect("name").to_string_lossy();
            let named = format!("include_str!(\"lua/{name}\")");
            assert!(rust.contains(&named), "{name} is not included");
        }
    }
}
