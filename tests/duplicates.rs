//! One server must never vote twice. A database index never makes a node independent, and two
//! addresses of one server (an alias: here a TCP proxy in front of it) are found by the server's
//! `run_id` once connected, at build or later. Each test here failed before.

mod common;

use std::time::Duration;

use common::unique;
use fredlock::{Error, InvalidInput, NodeErrorKind, Redlock, Retry, Vote};
use fredlock_testkit::{Fault, FaultProxy, LocalNodes};

/// Before: `/0` and `/1` of one server were two nodes, and with the third node down ONE server
/// granted a "majority".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_indexes_of_one_server_are_one_node() {
    let nodes = LocalNodes::start(2).await.expect("nodes");
    let err = Redlock::builder()
        .nodes([
            format!("{}/0", nodes.url(0)),
            format!("{}/1", nodes.url(0)),
            nodes.url(1),
        ])
        .build()
        .await
        .expect_err("one server twice");
    match &err {
        Error::InvalidInput(InvalidInput::DuplicateNode {
            first,
            second,
            first_node,
            second_node,
            ..
        }) => {
            assert_eq!((*first, *second), (0, 1));
            assert!(first_node.ends_with("/0") && second_node.ends_with("/1"));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("same server"), "{err}");
}

/// An alias found at build: the build fails and names both entries and the shared run_id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_is_found_by_run_id_at_build() {
    let nodes = LocalNodes::start(2).await.expect("nodes");
    let alias = FaultProxy::start(nodes.addr(0)).await.expect("proxy");
    let err = Redlock::builder()
        .nodes([nodes.url(0), nodes.url(1), alias.url()])
        .build()
        .await
        .expect_err("alias of node 0");
    let shown = err.to_string();
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::DuplicateNode {
                first: 0,
                second: 2,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(shown.contains("run_id"), "{shown}");
}

/// An alias that connects only after build is never counted. Before, with the real second node
/// down, the server behind node 0 and its alias extended a lock as a "majority".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_that_connects_later_never_votes() {
    let mut nodes = LocalNodes::start(2).await.expect("nodes");
    let alias = FaultProxy::start(nodes.addr(0)).await.expect("proxy");
    alias.set(Fault::Reset);
    let redlock = Redlock::builder()
        .nodes([nodes.url(0), nodes.url(1), alias.url()])
        .retry(Retry::once())
        .connect_wait(Duration::from_millis(300))
        .build()
        .await
        .expect("a quorum of distinct servers");
    let mut lock = redlock
        .acquire(unique("alias").as_str(), Duration::from_secs(5))
        .await
        .expect("acquire on nodes 0 and 1");
    alias.set(Fault::Pass);
    // Wait until the alias connected and was identified (its vote turns into Duplicate).
    let found = common::eventually(Duration::from_secs(10), || async {
        let view = redlock.inspect("anything").await.expect("inspect");
        matches!(&view.nodes[2].state, Err(e) if e.kind == NodeErrorKind::Duplicate)
    })
    .await;
    assert!(found, "the alias was never identified as node 0's server");
    nodes.kill(1).expect("kill");
    let err = lock
        .extend(Duration::from_secs(5))
        .await
        .expect_err("one server is not a majority");
    let votes = match &err {
        Error::Unavailable { votes, .. } => votes.clone(),
        other => panic!("{other:?}"),
    };
    // Node 0 may not have answered yet when the two failures decided the round.
    assert!(votes.granted() <= 1, "{votes}");
    assert!(
        matches!(&votes.0[2], Vote::Failed(e) if e.kind == NodeErrorKind::Duplicate),
        "{votes}"
    );
}
