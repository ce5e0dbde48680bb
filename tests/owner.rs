//! Owner labels stored with the lock: inspect shows who holds a lock on every
//! node, never the secret token; the token alone still decides who may extend or release; a
//! caller's own token; labels and tokens checked; a lock broken by force.

mod common;

use std::time::Duration;

use common::{env, env_with, get, resource, values, Env};
use fredlock::{
    AcquireOptions, Error, InvalidInput, KeepAliveOptions, LostReason, NotHeldReason, Redlock,
    Verdict, SEPARATOR,
};

const TTL: Duration = Duration::from_secs(10);

fn invalid<T: std::fmt::Debug>(r: Result<T, Error>) -> InvalidInput {
    match r {
        Err(Error::InvalidInput(e)) => e,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

/// Every node shows the holder's label and fingerprint, and the stored value is
/// `token 0x1f label`.
async fn shown_everywhere(redlock: &Redlock, r: &str, label: &str, fingerprint: &str) {
    let seen = redlock.inspect(r).await.expect("inspect");
    assert_eq!(seen.nodes.len(), 3);
    for n in &seen.nodes {
        let h = n.state.as_ref().expect("answered").as_ref().expect("held");
        assert_eq!(h.label.as_deref(), Some(label), "{}", n.node);
        assert_eq!(h.fingerprint, fingerprint, "{}", n.node);
        assert!(h.ttl.is_some_and(|t| t <= TTL && t > Duration::ZERO));
    }
    match seen.verdict() {
        Verdict::Held(h) => assert_eq!(h.label.as_deref(), Some(label)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_label_is_host_and_pid_on_every_node() {
    let Env {
        redlock,
        nodes: _nodes,
    } = env(3).await;
    let (r, key) = resource(&redlock, "owner-default");
    let lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    let label = lock.label().expect("a default label").to_string();
    assert!(
        label.ends_with(&format!(":{}", std::process::id())),
        "{label}"
    );
    shown_everywhere(&redlock, &r, &label, &lock.fingerprint()).await;
    // What the nodes store: the secret token, the separator, the label.
    let want = format!("{}{SEPARATOR}{label}", lock.token());
    assert_eq!(lock.value(), want);
    assert_eq!(values(&redlock, &key).await, vec![Some(want); 3]);
    // The inspection never carries the token.
    let seen = redlock.inspect(&r).await.expect("inspect");
    assert!(!format!("{seen:?}").contains(lock.token()));
    lock.release().await.expect("release");
    assert_eq!(
        redlock.inspect(&r).await.expect("inspect").verdict(),
        Verdict::Free
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_label_and_a_per_call_label() {
    let Env {
        redlock,
        nodes: _nodes,
    } = env_with(3, |b| b.owner_label("billing worker 7")).await;
    let (r, _) = resource(&redlock, "owner-builder");
    let lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    assert_eq!(lock.label(), Some("billing worker 7"));
    shown_everywhere(&redlock, &r, "billing worker 7", &lock.fingerprint()).await;
    lock.release().await.expect("release");

    let options = AcquireOptions::new().label("backup run 1842 ✓");
    let lock = redlock
        .acquire_using(r.as_str(), TTL, &options)
        .await
        .expect("acquire");
    shown_everywhere(&redlock, &r, "backup run 1842 ✓", &lock.fingerprint()).await;
    lock.release().await.expect("release");

    // An empty label stores none: the value is the token alone.
    let (r2, key2) = resource(&redlock, "owner-empty");
    let options = AcquireOptions::new().label("");
    let lock = redlock
        .acquire_using(r2.as_str(), TTL, &options)
        .await
        .expect("acquire");
    assert_eq!(lock.label(), None);
    // The acquire returns at its quorum: node 0's SET may land just after.
    let token = lock.token().to_string();
    assert!(
        common::eventually(Duration::from_secs(5), || async {
            get(&redlock, 0, &key2).await.as_deref() == Some(token.as_str())
        })
        .await
    );
    let seen = redlock.inspect(&r2).await.expect("inspect");
    let h = seen.holder().expect("held");
    assert_eq!(
        (h.label.as_deref(), h.fingerprint.clone()),
        (None, lock.fingerprint())
    );
    lock.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_token_extends_releases_and_keeps_alive() {
    let Env {
        redlock,
        nodes: _nodes,
    } = env(3).await;
    let (r, key) = resource(&redlock, "owner-token");
    let token = format!("job-{:032x}", rand::random::<u128>());
    let options = AcquireOptions::new()
        .token(token.clone())
        .label("job runner");
    let mut lock = redlock
        .acquire_using(r.as_str(), TTL, &options)
        .await
        .expect("acquire");
    assert_eq!(lock.token(), token);
    assert_eq!(
        get(&redlock, 1, &key).await,
        Some(format!("{token}{SEPARATOR}job runner"))
    );
    lock.extend(TTL).await.expect("extend");
    // Held: a second acquire with another token is refused.
    let other = redlock.try_acquire(r.as_str(), TTL).await.expect("try");
    assert!(other.is_none());
    // Kept alive (batched renewal) with its value: extended at once (99% of the TTL left).
    let guard = lock
        .keep_alive_with(KeepAliveOptions::default().renew_when_left(0.99))
        .expect("options");
    tokio::time::timeout(Duration::from_secs(5), guard.handle().changed())
        .await
        .expect("an extension within 5 s")
        .expect("not lost");
    assert_eq!(guard.handle().extensions(), 1);
    assert_eq!(guard.label(), Some("job runner"));
    guard.release().await.expect("release");
    assert!(common::freed_within(&redlock, &key, Duration::from_secs(2)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_value_without_separator_is_still_reported() {
    let Env {
        redlock,
        nodes: _nodes,
    } = env(3).await;
    let (r, key) = resource(&redlock, "owner-foreign");
    for i in 0..3 {
        common::set_foreign(&redlock, i, &key).await;
    }
    let seen = redlock.inspect(&r).await.expect("inspect");
    let h = seen.holder().expect("held on every node");
    assert_eq!(h.label, None);
    assert!(h.has_token("someone-else"));
    assert!(matches!(seen.verdict(), Verdict::Held(_)));
    // Split: two different holders, none on a quorum.
    common::del(&redlock, 0, &key).await;
    common::del(&redlock, 1, &key).await;
    let seen = redlock.inspect(&r).await.expect("inspect");
    assert_eq!(seen.verdict(), Verdict::Split);
}

/// The label is public: knowing it (even as the same label) gives no power over a lock. A
/// stale holder with the same label cannot delete or extend its successor's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_with_the_same_label_cannot_touch_the_new_lock() {
    let Env {
        redlock,
        nodes: _nodes,
    } = env_with(3, |b| b.owner_label("same label")).await;
    let (r, key) = resource(&redlock, "owner-stale");
    let mut stale = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    // Its keys vanish (as if expired), and a new holder with the same label takes over.
    for i in 0..3 {
        common::del(&redlock, i, &key).await;
    }
    let new = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    assert_eq!(new.label(), stale.label());
    let err = stale.extend(TTL).await.expect_err("not ours");
    assert!(
        matches!(
            err,
            Error::NotHeld {
                reason: NotHeldReason::TokenGone,
                ..
            }
        ),
        "{err:?}"
    );
    let err = stale.release().await.expect_err("not ours");
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    assert_eq!(
        values(&redlock, &key).await,
        vec![Some(new.value().to_string()); 3]
    );
    // A caller who knows the label and guesses a token is refused too.
    let guess = AcquireOptions::new().token("guess").label("same label");
    let got = redlock
        .acquire_using(r.as_str(), TTL, &guess.wait(Duration::ZERO))
        .await;
    assert!(matches!(got, Err(Error::Contended { .. })), "{got:?}");
    new.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_labels_and_tokens_are_invalid_input() {
    let nodes = fredlock_testkit::LocalNodes::start(1).await.expect("node");
    for bad in ["two\nlines", "tab\there", "sep\x1fhere", "\x1b[31mred"] {
        let got = Redlock::builder()
            .nodes(nodes.urls())
            .owner_label(bad)
            .build()
            .await;
        assert!(
            matches!(invalid(got), InvalidInput::InvalidLabel { .. }),
            "{bad:?}"
        );
    }
    let long = "x".repeat(fredlock::MAX_LABEL_LEN + 1);
    let got = Redlock::builder()
        .nodes(nodes.urls())
        .owner_label(long.clone())
        .build()
        .await;
    assert!(matches!(invalid(got), InvalidInput::InvalidLabel { .. }));

    let redlock = common::build(nodes.urls(), |b| b).await;
    let r = common::unique("owner-bad");
    let per_call = AcquireOptions::new().label(long);
    let got = redlock.acquire_using(r.as_str(), TTL, &per_call).await;
    assert!(matches!(invalid(got), InvalidInput::InvalidLabel { .. }));
    for bad in [
        String::new(),
        "secret\x1fpart".to_string(),
        "t".repeat(fredlock::MAX_TOKEN_LEN + 1),
    ] {
        let options = AcquireOptions::new().token(bad.clone());
        let err = invalid(redlock.acquire_using(r.as_str(), TTL, &options).await);
        assert!(matches!(err, InvalidInput::InvalidToken { .. }), "{err:?}");
        // The token is a secret: never in the message, nor in the options' Debug.
        if !bad.is_empty() {
            assert!(!err.to_string().contains("secret"), "{err}");
            assert!(!format!("{options:?}").contains("secret"));
        }
    }
    // Nothing was sent.
    assert_eq!(
        redlock.inspect(&r).await.expect("inspect").verdict(),
        Verdict::Free
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_reports_whose_lock_it_broke_and_the_holder_notices() {
    let Env {
        redlock,
        nodes: _nodes,
    } = env_with(3, |b| b.owner_label("doomed holder")).await;
    let (r, key) = resource(&redlock, "owner-break");
    let lock = redlock.acquire(r.as_str(), TTL).await.expect("acquire");
    let fingerprint = lock.fingerprint();
    let guard = lock.keep_alive();
    let broken = redlock.force_release(&r).await.expect("break");
    let h = broken.holder().expect("it was held on a quorum");
    assert_eq!(h.label.as_deref(), Some("doomed holder"));
    assert_eq!(h.fingerprint, fingerprint);
    assert!(h.ttl.is_some());
    assert_eq!(values(&redlock, &key).await, vec![None; 3]);
    let reason = tokio::time::timeout(TTL, guard.lost())
        .await
        .expect("lost before its deadline");
    assert_eq!(reason, LostReason::TokenGone);
    // Breaking a free lock deletes nothing and says so.
    let again = redlock.force_release(&r).await.expect("break");
    assert_eq!(again.verdict(), Verdict::Free);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_leaders_carry_the_label() {
    let Env {
        redlock,
        nodes: _nodes,
    } = env_with(3, |b| b.owner_label("pool member")).await;
    let sem = redlock
        .semaphore(common::unique("owner-sem"), 2)
        .expect("semaphore");
    let permit = sem.acquire(TTL).await.expect("permit");
    assert_eq!(permit.label(), Some("pool member"));
    let view = sem.inspect().await.expect("inspect");
    let held: Vec<_> = view.slots.iter().filter_map(|s| s.holder()).collect();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].label.as_deref(), Some("pool member"));
    assert_eq!(held[0].fingerprint, permit.fingerprint());
    permit.release().await.expect("release");

    let name = common::unique("owner-elect");
    let election = redlock.elect(name.clone(), TTL).expect("elect");
    let term = tokio::time::timeout(TTL, election.leader())
        .await
        .expect("leader");
    let seen = redlock.inspect(&name).await.expect("inspect");
    let h = seen.holder().expect("held");
    assert_eq!(h.label.as_deref(), Some("pool member"));
    assert!(h.has_token(term.token()));
    election.resign().await;
}
