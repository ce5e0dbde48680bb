//! `fredlock leader` (CMD runs only while elected, told its term and value) and
//! `fredlock observe` (who leads, one JSON line per change), plus the election part of
//! `fredlock inspect`.

use std::ffi::OsString;
use std::io::Write;
use std::time::Duration;

use fredlock::{ElectOptions, Leader, Redlock};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::child::{self, Signals};
use crate::duration::show;
use crate::exit;
use crate::nodes;

/// What `leader` was asked.
pub struct LeaderOptions {
    pub name: String,
    pub ttl: Duration,
    pub kill_after: Duration,
    /// The campaign value (`--value`), shown to every observer while this process leads.
    pub value: String,
    /// `--priority`: a higher one takes over from a lower leader.
    pub priority: u32,
    /// `--no-quorum-timeout`: give up (exit 69) when no quorum answered for this long (the
    /// connect wait included).
    pub no_quorum: Duration,
    /// When fredlock began to connect (the `--no-quorum-timeout` clock starts there).
    pub connecting_since: Instant,
    pub cmd: Vec<OsString>,
}

/// Campaigns for `name`; runs CMD while leading, with `FREDLOCK_TERM` (the term number, a
/// fencing token) and `FREDLOCK_LEADER_VALUE` in its environment. Returns the exit code.
pub async fn leader(redlock: &Redlock, o: LeaderOptions) -> i32 {
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fredlock: cannot install signal handlers: {e}");
            return exit::SOFTWARE;
        }
    };
    let options = ElectOptions::default()
        .value(o.value.clone())
        .priority(o.priority);
    let election = match redlock.elect_with_options(o.name.as_str(), o.ttl, options) {
        Ok(e) => e,
        Err(e) => return exit::fail(&e),
    };
    nodes::warn_at_start(redlock, &o.name).await;
    // The connect wait counts towards the first wait for a quorum only.
    let mut connecting_since = Some(o.connecting_since);
    loop {
        let term = tokio::select! {
            term = election.leader() => term,
            sig = signals.recv() => {
                election.resign().await;
                return 128 + sig;
            }
            why = nodes::no_quorum_for(redlock, &o.name, o.no_quorum, connecting_since.take()) => {
                election.resign().await;
                eprintln!("fredlock: {:?}: {why}", o.name);
                return exit::UNAVAILABLE;
            }
        };
        let env = [
            ("FREDLOCK_TERM", term.number().to_string()),
            ("FREDLOCK_LEADER_VALUE", term.value.clone()),
        ];
        let mut running = match child::spawn_with_env(&o.cmd, &env) {
            Ok(c) => c,
            Err(code) => {
                election.resign().await;
                return code;
            }
        };
        loop {
            tokio::select! {
                status = running.wait() => {
                    election.resign().await;
                    return child::code(status);
                }
                () = election.term_ended(&term) => {
                    eprintln!(
                        "fredlock: term {} of {:?} ended; stopping CMD (SIGTERM, SIGKILL after {}), campaigning again",
                        term.number(),
                        o.name,
                        show(o.kill_after)
                    );
                    let status = running.stop(o.kill_after).await;
                    eprintln!("fredlock: CMD stopped (exit code {})", child::code(status));
                    break;
                }
                sig = signals.recv() => {
                    if child::should_forward(sig) {
                        running.signal(sig);
                    }
                }
            }
        }
    }
}

/// `{"leader": {"value": ..., "term": ..., "label": ..., "ttl_ms": ...}}` or `{"leader": null}`.
pub fn leader_json(leader: &Option<Leader>) -> Value {
    match leader {
        Some(l) => json!({
            "leader": {
                "value": l.value,
                "term": l.term,
                "label": l.label,
                "ttl_ms": u64::try_from(l.remaining().as_millis()).unwrap_or(u64::MAX),
            }
        }),
        None => json!({ "leader": null }),
    }
}

/// `fredlock observe NAME`: one JSON line at start and on every change of leader, term or
/// value, until interrupted.
pub async fn observe(redlock: &Redlock, name: &str) -> i32 {
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fredlock: cannot install signal handlers: {e}");
            return exit::SOFTWARE;
        }
    };
    let observer = match redlock.observe(name).await {
        Ok(o) => o,
        Err(e) => return exit::fail(&e),
    };
    let mut rx = observer.watch();
    loop {
        let line = leader_json(&rx.borrow_and_update());
        let mut out = std::io::stdout().lock();
        // A closed stdout (the reader went away) ends it.
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            break;
        }
        drop(out);
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            sig = signals.recv() => {
                observer.close().await;
                // Interrupted is how it is meant to end.
                return if sig == libc::SIGINT || sig == libc::SIGTERM { exit::OK } else { 128 + sig };
            }
        }
    }
    observer.close().await;
    exit::OK
}

/// The election part of `fredlock inspect NAME`: a line for people, and the JSON value.
pub async fn inspect_election(redlock: &Redlock, name: &str) -> (Option<String>, Value) {
    match redlock.leader_of(name).await {
        Ok(Some(l)) => (
            Some(format!(
                "election: leader {:?}, term {}, {} left",
                l.value,
                l.term,
                show(l.remaining())
            )),
            json!({"value": l.value, "term": l.term, "label": l.label}),
        ),
        Ok(None) => (None, Value::Null),
        Err(e) => (Some(format!("election: unknown ({e})")), Value::Null),
    }
}
