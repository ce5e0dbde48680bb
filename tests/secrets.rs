//! A lock's token is a secret (whoever knows it can extend or release the lock), so no public
//! type shows it: `Debug` and `Display` of every type that holds one (or that an error wraps)
//! show the token's fingerprint at most, and `Debug` stays short enough for a log line.
//! Against real nodes.

mod common;

use std::fmt::{Debug, Display};
use std::time::Duration;

use fredlock::{AcquireOptions, KeepAliveOptions, Lease, Role};

const TTL: Duration = Duration::from_secs(10);
const CUSTOM: &str = "MY-SECRET-TOKEN-123";
/// The longest `Debug` of a one-resource lock type that still reads as one log line.
const SHORT: usize = 300;

/// Every 12-character piece of `token` (a Debug that shows a token's prefix leaks it too; a
/// fingerprint, 12 hex digits of a hash, is a different text).
fn pieces(token: &str) -> Vec<&str> {
    let n = 12.min(token.len());
    (0..=token.len() - n).map(|i| &token[i..i + n]).collect()
}

/// `shown` contains no piece of any of `tokens`.
#[track_caller]
fn hides(what: &str, shown: &str, tokens: &[&str]) {
    for token in tokens {
        for piece in pieces(token) {
            assert!(
                !shown.contains(piece),
                "{what} shows (part of) the token {token:?}: {shown}"
            );
        }
    }
}

/// `Debug` (plain and pretty) hides the tokens and stays short.
#[track_caller]
fn debug_hides(what: &str, value: &impl Debug, tokens: &[&str]) {
    let debug = format!("{value:?}");
    hides(what, &debug, tokens);
    hides(what, &format!("{value:#?}"), tokens);
    assert!(
        debug.len() < SHORT,
        "{what}'s Debug is {} characters: {debug}",
        debug.len()
    );
}

/// `Debug` and `Display` hide the tokens.
#[track_caller]
fn both_hide(what: &str, value: &(impl Debug + Display), tokens: &[&str]) {
    debug_hides(what, value, tokens);
    hides(what, &value.to_string(), tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_their_guards_never_show_the_token() {
    let env = common::env(3).await;
    let redlock = &env.redlock;
    let options = AcquireOptions::new().token(CUSTOM).label("job-7");
    let (r, _) = common::resource(redlock, "secret-lock");

    let lock = redlock
        .acquire_using(r.as_str(), TTL, &options)
        .await
        .expect("acquire");
    assert_eq!(lock.token(), CUSTOM);
    let debug = format!("{lock:?}");
    assert!(debug.contains(&lock.fingerprint()), "{debug}");
    assert!(debug.contains("job-7"), "the label is public: {debug}");
    debug_hides("Lock", &lock, &[CUSTOM]);

    // A held lock that someone else asks for: the error shows neither token.
    let other = redlock.acquire_with(r.as_str(), TTL, Duration::ZERO).await;
    let err = other.expect_err("held");
    both_hide("Error::Contended", &err, &[CUSTOM]);
    // Inspection shows label and fingerprint, never the token (a report of every node: not
    // short).
    let seen = redlock.inspect(&r).await.expect("inspect");
    hides("Inspection", &format!("{seen:?}"), &[CUSTOM]);

    // Options the keep-alive rejects hand the lock back inside an error.
    let bad = KeepAliveOptions::default().renew_when_left(2.0);
    let rejected = lock.keep_alive_with(bad).expect_err("rejected");
    both_hide("Rejected", &*rejected, &[CUSTOM]);
    let lock = rejected.lock;

    let guard = lock.keep_alive();
    assert!(format!("{guard:?}").contains(&guard.fingerprint()));
    debug_hides("KeepAlive", &guard, &[CUSTOM]);
    debug_hides("LockHandle", &guard.handle(), &[CUSTOM]);
    let lease: Lease = guard.into_lease().await.expect("lease");
    // A lease's Display IS the secret, by design (it is how the lock is handed over).
    debug_hides("Lease", &lease, &[CUSTOM]);
    redlock.release_lease(&lease).await.expect("release");

    // A fresh token: the default 32 hex digits are just as secret.
    let shown = redlock
        .with_lock(r.as_str(), TTL, |handle| async move {
            let token = handle.token().to_string();
            (format!("{handle:?}"), format!("{handle:#?}"), token)
        })
        .await
        .expect("with_lock");
    hides("LockHandle", &shown.0, &[&shown.2]);
    hides("LockHandle", &shown.1, &[&shown.2]);
    assert!(shown.0.len() < SHORT, "{}", shown.0);

    let lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    let token = lock.token().to_string();
    debug_hides("Lock", &lock, &[&token]);
    redlock.force_release(&r).await.expect("force release");
    let err = lock.release().await.expect_err("released by force");
    both_hide("Error::NotHeld", &err, &[&token]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_rwlock_guards_and_elections_never_show_the_token() {
    let env = common::env(3).await;
    let redlock = &env.redlock;

    let semaphore = redlock
        .semaphore(common::unique("secret-sem"), 2)
        .expect("semaphore");
    let permit = semaphore.acquire(TTL).await.expect("permit");
    debug_hides("Permit", &permit, &[permit.token()]);
    debug_hides("Semaphore", &semaphore, &[permit.token()]);
    permit.release().await.expect("release");

    let rw = redlock.rwlock(common::unique("secret-rw")).expect("rwlock");
    let read = rw.read(TTL).await.expect("read");
    debug_hides("ReadGuard", &read, &[read.token()]);
    read.release().await.expect("release");
    let write = rw.write(TTL).await.expect("write");
    debug_hides("WriteGuard", &write, &[write.token()]);
    write.release().await.expect("release");

    let resource = common::unique("secret-election");
    let election = redlock.elect(resource.as_str(), TTL).expect("elect");
    let term = election.leader().await;
    let token = term.token().to_string();
    assert_eq!(token.len(), 32, "a fresh token");
    assert!(format!("{term:?}").contains(&term.fingerprint()));
    debug_hides("Term", &term, &[&token]);
    debug_hides("Role", &Role::Leader(term.clone()), &[&token]);
    debug_hides("Election", &election, &[&token]);
    let leader = redlock.leader_of(&resource).await.expect("read");
    debug_hides("Leader", &leader, &[&token]);
    election.resign().await;
}
