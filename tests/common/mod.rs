//! Helpers shared by the integration tests: nodes, a Redlock over them, raw reads.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use fredlock::fred::prelude::KeysInterface;
use fredlock::{Builder, Redlock, Retry};
use fredlock_testkit::{self as testkit, LocalNodes, TestNodes};
use tokio::time::Instant;

/// Nodes plus a Redlock over them.
pub struct Env {
    pub nodes: TestNodes,
    pub redlock: Redlock,
}

/// Fast retries for tests: contention resolves in milliseconds.
pub fn fast_retry() -> Retry {
    Retry {
        attempts: 3,
        delay: Duration::from_millis(5),
        jitter: Duration::from_millis(5),
    }
}

/// `n` nodes (FREDLOCK_NODES if set, local processes otherwise) and a Redlock.
pub async fn env(n: usize) -> Env {
    env_with(n, |b| b).await
}

/// As [`env`], with builder tweaks.
pub async fn env_with(n: usize, tweak: impl FnOnce(Builder) -> Builder) -> Env {
    let nodes = testkit::from_env_or_start(n)
        .await
        .expect("start redis-server nodes");
    let redlock = tweak(Redlock::builder().nodes(nodes.urls()).retry(fast_retry()))
        .build()
        .await
        .expect("build");
    Env { nodes, redlock }
}

/// Always local nodes (for tests that kill, pause or restart them).
pub async fn local_with(n: usize, tweak: impl FnOnce(Builder) -> Builder) -> (LocalNodes, Redlock) {
    let nodes = LocalNodes::start(n)
        .await
        .expect("start redis-server nodes");
    let redlock = tweak(Redlock::builder().nodes(nodes.urls()).retry(fast_retry()))
        .build()
        .await
        .expect("build");
    (nodes, redlock)
}

/// A resource name no other test (or earlier run on external nodes) uses.
pub fn unique(name: &str) -> String {
    format!("test:{name}:{:016x}", rand::random::<u64>())
}

/// GET `key` on node `i` through the Redlock's own client.
pub async fn get(redlock: &Redlock, i: usize, key: &str) -> Option<String> {
    redlock
        .client(i)
        .expect("node")
        .get(key)
        .await
        .expect("GET")
}

/// SET a foreign value at `key` on node `i`, expiring after 30 s.
pub async fn set_foreign(redlock: &Redlock, i: usize, key: &str) {
    let client = redlock.client(i).expect("node");
    let _: () = client
        .set(
            key,
            "someone-else",
            Some(fredlock::fred::types::Expiration::PX(30_000)),
            None,
            false,
        )
        .await
        .expect("SET");
}

/// DEL `key` on node `i`.
pub async fn del(redlock: &Redlock, i: usize, key: &str) {
    let _: i64 = redlock
        .client(i)
        .expect("node")
        .del(key)
        .await
        .expect("DEL");
}

/// The value of `key` on every node.
pub async fn values(redlock: &Redlock, key: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for i in 0..redlock.node_names().len() {
        out.push(get(redlock, i, key).await);
    }
    out
}

/// Polls `check` until it holds or `within` passes. For state that changes in the background
/// (a release finishing on a slow node), where there is no event to await.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Installs a tracing subscriber once (RUST_LOG decides what is shown).
pub fn trace() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Any command on node `i` (for types fredlock's fred features do not cover, e.g. lists).
pub async fn raw(redlock: &Redlock, i: usize, args: &[&str]) -> fredlock::fred::prelude::Value {
    use fredlock::fred::prelude::ClientLike;
    use fredlock::fred::types::{ClusterHash, CustomCommand};
    let cmd = CustomCommand::new(args[0].to_string(), ClusterHash::Random, false);
    let rest: Vec<String> = args[1..].iter().map(|s| s.to_string()).collect();
    redlock
        .client(i)
        .expect("node")
        .custom(cmd, rest)
        .await
        .expect("command")
}

/// One fault proxy per local node and a Redlock that reaches the nodes only through them.
pub async fn behind_proxies(
    nodes: &LocalNodes,
    tweak: impl FnOnce(Builder) -> Builder,
) -> (Vec<fredlock_testkit::FaultProxy>, Redlock) {
    let mut proxies = Vec::new();
    for i in 0..nodes.len() {
        proxies.push(
            fredlock_testkit::FaultProxy::start(nodes.addr(i))
                .await
                .expect("proxy"),
        );
    }
    let redlock = tweak(Redlock::builder().nodes(proxies.iter().map(|p| p.url())))
        .build()
        .await
        .expect("build");
    (proxies, redlock)
}

/// Whether node `i` loses `key` within `within` (a background release landing, a key expiring).
pub async fn gone_within(nodes: &LocalNodes, i: usize, key: &str, within: Duration) -> bool {
    eventually(within, || async {
        nodes.get(i, key).await.expect("GET").is_none()
    })
    .await
}
