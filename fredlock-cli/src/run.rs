//! `fredlock run`: CMD under a kept-alive lock.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use fredlock::{AcquireOptions, Error, KeepAlive, Lock, Redlock, Verdict};
use tokio::time::Instant;

use crate::child::{self, Child, Signals};
use crate::duration::show;
use crate::exit;
use crate::nodes;

/// What `run` was asked.
pub struct RunOptions {
    pub name: String,
    pub ttl: Duration,
    /// How long to wait for the lock (`ZERO`: one attempt, `MAX`: no limit).
    pub wait: Duration,
    /// Keep the lock at least this long from its acquisition, whenever CMD exits.
    pub hold_at_least: Option<Duration>,
    pub kill_after: Duration,
    /// Exit 69 when no quorum answered for this long while waiting (the connect wait included).
    pub no_quorum: Duration,
    /// When fredlock began to connect (the `--no-quorum-timeout` clock starts there).
    pub connecting_since: Instant,
    pub conflict: i32,
    pub cmd: Vec<OsString>,
}

/// Acquires, runs CMD with the lock kept alive, releases. Returns the exit code.
pub async fn run(redlock: &Redlock, o: RunOptions) -> i32 {
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fredlock: cannot install signal handlers: {e}");
            return exit::SOFTWARE;
        }
    };
    let lock = match acquire(redlock, &o, &mut signals).await {
        Ok(lock) => lock,
        Err(code) => return code,
    };
    let guard = lock.keep_alive();
    let cmd = match child::spawn(&o.cmd) {
        Ok(c) => c,
        Err(code) => {
            if let Err(e) = guard.release().await {
                eprintln!("fredlock: releasing {:?}: {e}", o.name);
            }
            return code;
        }
    };
    supervise(redlock, &o, guard, cmd, &mut signals).await
}

/// Waits for the lock as `o` says, showing on a terminal who holds it meanwhile. `Err`: the
/// exit code (a signal, no quorum for `--no-quorum-timeout`, held by someone else, an error).
async fn acquire(redlock: &Redlock, o: &RunOptions, signals: &mut Signals) -> Result<Lock, i32> {
    let mut options = AcquireOptions::new().wait(o.wait);
    let ttl = o.ttl;
    if let Some(at_least) = o.hold_at_least {
        // At most the TTL (checked with the arguments; the acquire refuses it too).
        options = options.hold_at_least(at_least);
    }
    let terminal = std::io::stderr().is_terminal();
    nodes::warn_at_start(redlock, &o.name).await;
    let acquired = {
        let acquire = redlock.acquire_using(o.name.as_str(), ttl, &options);
        tokio::select! {
            got = acquire => got,
            // Dropping the acquire releases whatever its attempt may have set.
            sig = signals.recv() => {
                clear_line(terminal);
                return Err(128 + sig);
            }
            // Waiting is for the lock, not for nodes that are down.
            why = nodes::no_quorum_for(redlock, &o.name, o.no_quorum, Some(o.connecting_since)), if !o.wait.is_zero() => {
                clear_line(terminal);
                eprintln!("fredlock: {:?}: {why}", o.name);
                return Err(exit::UNAVAILABLE);
            }
            () = waiting_display(redlock, &o.name), if terminal && !o.wait.is_zero() => {
                return Err(exit::SOFTWARE);
            }
        }
    };
    clear_line(terminal);
    match acquired {
        Ok(lock) => Ok(lock),
        Err(Error::Contended { attempts, .. }) => {
            let holder = describe_holder(redlock, &o.name).await;
            let waited = if o.wait.is_zero() {
                "--no-wait".to_string()
            } else {
                format!("gave up after {} ({attempts} attempts)", show(o.wait))
            };
            eprintln!("fredlock: {:?} is held {holder}; {waited}", o.name);
            Err(o.conflict)
        }
        Err(e) => Err(exit::fail(&e)),
    }
}

/// While CMD runs: passes signals on, and stops CMD when the lock is lost (the keep-alive
/// says so, or the token is gone from the nodes). Returns the exit code.
async fn supervise(
    redlock: &Redlock,
    o: &RunOptions,
    guard: KeepAlive,
    mut cmd: Child,
    signals: &mut Signals,
) -> i32 {
    // A `break` (or a takeover after expiry) is noticed within about a second by this check,
    // not only at the next extension.
    let token = guard.token().to_string();
    let gone = nodes::token_gone(redlock, &o.name, &token);
    tokio::pin!(gone);
    loop {
        tokio::select! {
            status = cmd.wait() => {
                if let Err(e) = guard.release().await {
                    eprintln!("fredlock: CMD finished, but {e}");
                }
                return child::code(status);
            }
            without = &mut gone => {
                eprintln!(
                    "fredlock: lock {:?} lost ({without} of {} nodes no longer hold our token: broken, or expired and taken over); stopping CMD (SIGTERM, SIGKILL after {})",
                    o.name,
                    redlock.node_names().len(),
                    show(o.kill_after)
                );
                let status = cmd.stop(o.kill_after).await;
                eprintln!("fredlock: CMD stopped (exit code {})", child::code(status));
                return exit::LOST;
            }
            reason = guard.lost() => {
                eprintln!(
                    "fredlock: lock {:?} lost ({reason}); stopping CMD (SIGTERM, SIGKILL after {})",
                    o.name,
                    show(o.kill_after)
                );
                let status = cmd.stop(o.kill_after).await;
                eprintln!("fredlock: CMD stopped (exit code {})", child::code(status));
                return exit::LOST;
            }
            sig = signals.recv() => {
                if child::should_forward(sig) {
                    cmd.signal(sig);
                }
            }
        }
    }
}

/// On a terminal, says once a second what `run` waits for. Never returns.
async fn waiting_display(redlock: &Redlock, name: &str) {
    loop {
        let holder = describe_holder(redlock, name).await;
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2Kfredlock: waiting for {name:?}, held {holder}"
        );
        let _ = err.flush();
        drop(err);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn clear_line(terminal: bool) {
    if terminal {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K");
        let _ = err.flush();
    }
}

/// `by "label" (fingerprint ...) for 12.3s more`, or why that is not known.
async fn describe_holder(redlock: &Redlock, name: &str) -> String {
    match redlock.inspect(name).await {
        Ok(seen) => match seen.verdict() {
            Verdict::Held(h) => {
                let left = seen
                    .remaining(&h.fingerprint)
                    .map_or("without expiry".to_string(), |t| {
                        format!("for {} more", show(t))
                    });
                format!(
                    "by {} (fingerprint {}) {left}",
                    crate::show::label(h.label.as_deref()),
                    h.fingerprint
                )
            }
            Verdict::Free => "by nobody right now".to_string(),
            _ if nodes::failures(&seen).len() > seen.nodes.len() - seen.quorum => format!(
                "by someone unknown: too few nodes answered ({})",
                nodes::causes(&nodes::failures(&seen))
            ),
            _ => "by no one on a quorum (being handed over, or split)".to_string(),
        },
        Err(e) => format!("by someone (inspect failed: {e})"),
    }
}
