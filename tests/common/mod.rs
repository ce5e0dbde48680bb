//! Helpers shared by the integration tests: nodes, a Redlock over them, raw reads.
#![allow(dead_code)]

pub mod lines;

use std::future::Future;
use std::time::Duration;

use fredlock::fred::prelude::KeysInterface;
use fredlock::{Builder, KeepAlive, KeepAliveOptions, Redlock, Retry};
use fredlock_testkit::{self as testkit, LocalNodes, TestNodes};
use tokio::time::Instant;

/// Nodes plus a Redlock over them.
pub struct Env {
    pub nodes: TestNodes,
    pub redlock: Redlock,
}

/// Fast retries for tests: contention resolves in milliseconds.
pub fn fast_retry() -> Retry {
    retry(3, 5, 5)
}

/// `attempts` attempts, `delay_ms` apart plus up to `jitter_ms` of jitter.
pub const fn retry(attempts: u32, delay_ms: u64, jitter_ms: u64) -> Retry {
    Retry {
        attempts,
        delay: Duration::from_millis(delay_ms),
        jitter: Duration::from_millis(jitter_ms),
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
    let redlock = build(nodes.urls(), tweak).await;
    Env { nodes, redlock }
}

/// Always local nodes (for tests that kill, pause or restart them).
pub async fn local_with(n: usize, tweak: impl FnOnce(Builder) -> Builder) -> (LocalNodes, Redlock) {
    let nodes = LocalNodes::start(n)
        .await
        .expect("start redis-server nodes");
    let redlock = build(nodes.urls(), tweak).await;
    (nodes, redlock)
}

/// A Redlock over `urls` with [`fast_retry`], then `tweak`.
pub async fn build(urls: Vec<String>, tweak: impl FnOnce(Builder) -> Builder) -> Redlock {
    tweak(Redlock::builder().nodes(urls).retry(fast_retry()))
        .build()
        .await
        .expect("build")
}

/// A resource name no other test (or earlier run on external nodes) uses.
pub fn unique(name: &str) -> String {
    format!("test:{name}:{:016x}", rand::random::<u64>())
}

/// A fresh resource named after `name` (see [`unique`]), and its key.
pub fn resource(redlock: &Redlock, name: &str) -> (String, String) {
    let r = unique(name);
    let key = redlock.key(&r);
    (r, key)
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

/// Whether the values of `key` on every node become `want` within `within` (a release or an
/// expiry landing on the last node).
pub async fn values_become(
    redlock: &Redlock,
    key: &str,
    want: &[Option<String>],
    within: Duration,
) -> bool {
    eventually(within, || async { values(redlock, key).await == want }).await
}

/// Whether `key` is gone from every node within `within`.
pub async fn freed_within(redlock: &Redlock, key: &str, within: Duration) -> bool {
    let none = vec![None; redlock.node_names().len()];
    values_become(redlock, key, &none, within).await
}

/// PTTL of `key` on node `i` through the Redlock's own client.
pub async fn pttl(redlock: &Redlock, i: usize, key: &str) -> i64 {
    redlock
        .client(i)
        .expect("node")
        .pttl(key)
        .await
        .expect("PTTL")
}

/// Acquires `r` for `ttl` and keeps it alive with `options`. Returns the guard and when the
/// acquire started (`Lock::acquired_at`: validity and budgets count from there).
pub async fn kept_alive(
    redlock: &Redlock,
    r: &str,
    ttl: Duration,
    options: KeepAliveOptions,
) -> (KeepAlive, Instant) {
    let lock = redlock.acquire(r, ttl).await.expect("acquire");
    let acquired_at = lock.acquired_at();
    let guard = lock.keep_alive_with(options).expect("keep-alive options");
    (guard, acquired_at)
}

/// How long a test waits for a signal that must come (`lost()`, a background task's end)
/// before it fails: far beyond any TTL, budget or deadline the tests use.
pub const SIGNAL_BOUND: Duration = Duration::from_secs(60);

/// `wait` (a `lost()`, ...), bounded by [`SIGNAL_BOUND`]: a signal that never comes fails the
/// test, naming `what`, instead of hanging `make test`.
pub async fn bounded<T>(what: &str, wait: impl Future<Output = T>) -> T {
    tokio::time::timeout(SIGNAL_BOUND, wait)
        .await
        .unwrap_or_else(|_| panic!("{what} did not come within {SIGNAL_BOUND:?}"))
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

/// Calls of `command` (as INFO names it: `eval`, `evalsha`, `publish`) node `i` served since it
/// started or since its last CONFIG RESETSTAT (INFO commandstats).
pub async fn command_calls(nodes: &LocalNodes, i: usize, command: &str) -> u64 {
    let info = nodes
        .command(i, &["INFO", "commandstats"])
        .await
        .expect("INFO commandstats");
    let fredlock_testkit::RespValue::Bulk(Some(text)) = info else {
        panic!("INFO commandstats: {info:?}");
    };
    let prefix = format!("cmdstat_{command}:calls=");
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Calls of `command` on every node (see [`command_calls`]).
pub async fn calls_on_all(nodes: &LocalNodes, command: &str) -> u64 {
    let mut total = 0;
    for i in 0..nodes.len() {
        total += command_calls(nodes, i, command).await;
    }
    total
}

/// Pub/sub client connections on node `i` (CLIENT LIST TYPE pubsub); 0 when the node does not
/// answer.
pub async fn pubsub_clients(nodes: &LocalNodes, i: usize) -> usize {
    match nodes
        .command(i, &["CLIENT", "LIST", "TYPE", "pubsub"])
        .await
    {
        Ok(fredlock_testkit::RespValue::Bulk(Some(text))) => String::from_utf8_lossy(&text)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count(),
        _ => 0,
    }
}

/// Scripts node `i` ran: its EVALSHA and EVAL calls.
pub async fn script_calls(nodes: &LocalNodes, i: usize) -> u64 {
    command_calls(nodes, i, "evalsha").await + command_calls(nodes, i, "eval").await
}
