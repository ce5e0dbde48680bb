//! The exit codes of `fredlock` (documented in `--help` and docs/operations.md), and the code
//! for a library error.
//!
//! Owns the numbers and the mapping from [`Error`] to them. Must not know any subcommand: every
//! other file uses it, and it uses none of them.

use fredlock::Error;

/// Success.
pub const OK: i32 = 0;
/// `health`: degraded; `inspect`, `break`: a node did not answer (it may hold the key).
pub const DEGRADED: i32 = 1;
/// `health`: fewer than a quorum of distinct servers reachable.
pub const NO_QUORUM: i32 = 2;
/// Bad usage or input: unknown option, no nodes, a bad URL, label or duration, `break`
/// without `--yes`.
pub const USAGE: i32 = 64;
/// The nodes are unavailable: too few answered to form a quorum.
pub const UNAVAILABLE: i32 = 69;
/// An unexpected failure inside fredlock.
pub const SOFTWARE: i32 = 70;
/// The lock is held by someone else (`--no-wait`, or `--wait` ran out). Change it with
/// `--conflict-exit-code`.
pub const CONFLICT: i32 = 75;
/// `run`: the lock was lost while CMD ran; CMD was stopped. `extend`, `release`: the lease
/// no longer holds the lock (it expired, or someone else took it).
pub const LOST: i32 = 76;
/// CMD is not executable.
pub const NOT_EXECUTABLE: i32 = 126;
/// CMD was not found.
pub const NOT_FOUND: i32 = 127;

/// The exit code for a library error, after printing it.
pub fn fail(e: &Error) -> i32 {
    eprintln!("fredlock: {e}");
    match e {
        Error::InvalidInput(_) => USAGE,
        Error::Contended { .. } => CONFLICT,
        Error::Unavailable { .. } | Error::Connect { .. } | Error::ValidityExpired { .. } => {
            UNAVAILABLE
        }
        _ => SOFTWARE,
    }
}
