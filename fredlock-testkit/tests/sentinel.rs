//! `LocalSentinel` with more than one of everything: 2 replicas and 3 sentinels (a quorum of
//! 2) agree on the primary, fail over together when it is killed (the replica promoted has the
//! data), and take the old primary back as a replica; a group without sentinels is refused.

use std::time::Duration;

use fredlock_testkit::{resp_command, LocalSentinel, RespValue, SENTINEL_SERVICE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sentinels_and_two_replicas_fail_over_together() {
    let mut g = LocalSentinel::start(2, 3).await.expect("a Sentinel group");
    let old = g.primary().await.expect("primary");
    assert_eq!(old, 0, "node 0 starts as the primary");
    g.data().set(old, "k", "v").await.expect("SET");
    g.wait_synced(old, 2).await.expect("both replicas have it");

    assert_eq!(g.kill_primary().await.expect("kill"), old);
    let new = g.wait_new_primary(old).await.expect("a replica promoted");
    assert_ne!(new, old);
    assert_eq!(
        g.data().get(new, "k").await.expect("GET").as_deref(),
        Some("v")
    );
    g.start_node(old)
        .await
        .expect("the old primary back as a replica");
    for i in 0..3 {
        let named = resp_command(
            g.sentinel_addr(i),
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_SERVICE],
            Duration::from_secs(1),
        )
        .await
        .expect("the sentinel answers");
        let port = g.data().port(new).to_string().into_bytes();
        assert!(
            matches!(&named, RespValue::Array(Some(a)) if a.get(1) == Some(&RespValue::Bulk(Some(port.clone())))),
            "sentinel {i} names {named:?}"
        );
    }
    assert!(
        g.url().contains("&node=127.0.0.1:"),
        "every sentinel in the URL: {}",
        g.url()
    );
}

#[tokio::test]
async fn a_group_needs_a_sentinel() {
    let err = LocalSentinel::start(1, 0).await.expect_err("no sentinel");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}
