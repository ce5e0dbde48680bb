//! End-to-end: a `fredlock run` whose lock missed a node heals once the node is back, so a job
//! survives the later loss of another node while two healthy nodes are up.
//!
//! Waits are bounded polls of a file or of the nodes (no sleep stands in for an event).

mod support;

use std::process::Stdio;
use std::time::Duration;

use fredlock_testkit::{LocalNodes, RespValue};
use support::*;
use tokio::time::Instant;

const WITHIN: Duration = Duration::from_secs(20);

/// The value at `key` on node `i` (`None`: no key, or the node does not answer).
async fn value_on(nodes: &LocalNodes, i: usize, key: &str) -> Option<String> {
    match nodes.command(i, &["GET", key]).await {
        Ok(RespValue::Bulk(Some(v))) => Some(String::from_utf8_lossy(&v).into_owned()),
        _ => None,
    }
}

/// The PTTL of `key` on node `i` (-2: no key; -3: the node does not answer).
async fn pttl_on(nodes: &LocalNodes, i: usize, key: &str) -> i64 {
    match nodes.command(i, &["PTTL", key]).await {
        Ok(RespValue::Integer(ms)) => ms,
        _ => -3,
    }
}

/// Polls node `i` until `check` holds for the value at `key`, at most [`WITHIN`].
async fn until_on(
    nodes: &LocalNodes,
    i: usize,
    key: &str,
    check: impl Fn(Option<&str>) -> bool,
) -> bool {
    let until = Instant::now() + WITHIN;
    loop {
        if check(value_on(nodes, i, key).await.as_deref()) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `fredlock run --ttl 3s` starts while node 2 is down (its lock on nodes 0 and 1). Node 2
/// comes back (empty), and the keep-alive sets the key there; then node 0 dies, and the job
/// goes on with nodes 1 and 2 and exits 0. Before healing, the key never reached node 2 and the
/// job was stopped (`lock "longjob" lost ... exit 76`) although two healthy nodes were up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_with_a_node_down_survives_losing_another_after_it_returns() {
    let mut nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let dir = Scratch::new("heal");
    let (log, stop) = (dir.file("cmd.log"), dir.file("stop"));
    let name = unique("longjob");
    let key = redlock(&urls, "observer").await.key(&name);
    nodes.kill(2).expect("kill node 2");

    let script =
        r#"echo started >> "$1"; while [ ! -e "$2" ]; do sleep 0.05; done; echo done >> "$1""#;
    let mut cmd = fredlock(&urls);
    cmd.args(["run", "--ttl", "3s", &name, "--"])
        .args(["sh", "-c", script, "sh"])
        .arg(&log)
        .arg(&stop);
    let errors = dir.file("stderr");
    let stderr = std::fs::File::create(&errors).expect("stderr file");
    cmd.stdout(Stdio::null()).stderr(Stdio::from(stderr));
    let mut run = cmd.spawn().expect("spawn");
    assert!(eventually(WITHIN, || read(&log).contains("started")).await);
    let value = value_on(&nodes, 0, &key).await.expect("the lock on node 0");

    nodes.start_node(2).await.expect("node 2 back, empty");
    assert!(
        until_on(&nodes, 2, &key, |v| v == Some(value.as_str())).await,
        "the lock never reached node 2 after it came back"
    );

    nodes.kill(0).expect("kill node 0");
    // Two extensions with nodes 1 and 2 alone: each resets the TTL on node 2, seen as a sample
    // above the one before it (comparing with the first sample missed an extension when that
    // sample was taken just after one: 2999 ms, and no later sample is above it).
    for n in 0..2 {
        let mut last = pttl_on(&nodes, 2, &key).await;
        let until = Instant::now() + WITHIN;
        loop {
            let now = pttl_on(&nodes, 2, &key).await;
            if now > last {
                break;
            }
            last = now;
            assert!(
                Instant::now() < until,
                "no extension {n} on node 2 (PTTL {now}); fredlock said: {}",
                read(&errors)
            );
            assert!(run.try_wait().expect("wait").is_none(), "fredlock exited");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(value_on(&nodes, 1, &key).await.as_deref(), Some(&*value));
    std::fs::write(&stop, "").expect("stop file");
    let code = wait_exit(&mut run, WITHIN).await;
    assert_eq!(code, 0, "the job did not survive: {}", read(&errors));
    assert!(read(&log).contains("done"), "{}", read(&log));
    assert_eq!(value_on(&nodes, 2, &key).await, None, "released");
}
