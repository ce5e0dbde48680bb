//! Nodes with replicas from the shell: `--confirm-replicas` on a Sentinel-managed group
//! (`LocalSentinel`: a primary, a replica, a sentinel), and `health` weighing each node's
//! replicas against it.

mod support;

use fredlock_testkit::{LocalNodes, LocalSentinel};
use support::*;

/// `health` on a group: its replica and lag shown; without confirmation a failover could lose
/// a key (warned); confirmed by 1 it is healthy; asking for 2 of its 1 replica, no lock could
/// be granted there (warned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_weighs_replicas_against_the_confirmation() {
    let g = LocalSentinel::start(1, 1).await.expect("a Sentinel group");
    let urls = [g.url()];
    let health = |confirm: Option<&str>| {
        let mut cmd = fredlock(&urls);
        // The testkit's servers keep nothing on disk.
        cmd.args(["health", "--allow", "no-persistence"]);
        if let Some(n) = confirm {
            cmd.args(["--confirm-replicas", n]);
        }
        cmd
    };
    let out = output(health(None)).await;
    let text = stdout(&out);
    assert_eq!(code(&out), 1, "{text}{}", stderr(&out));
    assert!(text.contains("replicas 1 (lag"), "{text}");
    assert!(text.contains("[replicas-connected]"), "{text}");

    let out = output(health(Some("1"))).await;
    let text = stdout(&out);
    assert_eq!(code(&out), 0, "{text}{}", stderr(&out));
    assert!(!text.contains("WARNING"), "{text}");

    let out = output(health(Some("2"))).await;
    let text = stdout(&out);
    assert_eq!(code(&out), 1, "{text}{}", stderr(&out));
    assert!(text.contains("[too-few-replicas]"), "{text}");
}

/// `run --confirm-replicas 1`: CMD runs on a group whose replica confirms, and not on a
/// server without replicas, where the error says how many confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_for_a_replica_to_confirm() {
    let g = LocalSentinel::start(1, 1).await.expect("a Sentinel group");
    let bare = LocalNodes::start(1).await.expect("a node");
    let run = |urls: &[String]| {
        let mut cmd = fredlock(urls);
        // A generous bound: the flag is under test here, not the replica's speed on a busy machine.
        cmd.args(["--confirm-replicas", "1", "--confirm-timeout", "2s"]);
        cmd.args([
            "run",
            "--ttl",
            "10s",
            "--wait",
            "0s",
            &unique("confirm"),
            "--",
            "true",
        ]);
        cmd
    };
    let out = output(run(&[g.url()])).await;
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));

    let out = output(run(&bare.urls())).await;
    let err = stderr(&out);
    assert_ne!(code(&out), 0, "granted without a replica: {err}");
    assert!(err.contains("0 of 1 replicas"), "{err}");
}
