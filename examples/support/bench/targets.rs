//! What a cycle runs against: the raw fred floor ([`Floor`]), rslock and fredlock behind one
//! [`Target`], and the Redlocks the bench builds. One acquire+release cycle each; no rounds, no
//! statistics.
use std::sync::Arc;
use std::time::Duration;

/// The floor's compare-and-delete, the classic single-key form.
pub(crate) const FLOOR_RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

use fredlock::fred::clients::Client;
use fredlock::fred::prelude::{
    ClientLike, Config, Expiration, KeysInterface, LuaInterface, ReconnectPolicy, SetOptions, Value,
};
use fredlock::{NodeErrorKind, Redlock, ReleaseReport, Vote};
use futures::stream::{FuturesUnordered, StreamExt};

use crate::TTL;

/// The raw floor: one plain fred client per node and nothing else.
pub(crate) struct Floor {
    pub(crate) clients: Vec<Client>,
    /// SHA1 of [`FLOOR_RELEASE`], as returned by `SCRIPT LOAD` on every node.
    pub(crate) release_sha: String,
}

impl Floor {
    /// Connects one client per URL with the settings of fredlock's own clients (see
    /// `src/nodes/node.rs`): TCP_NODELAY above all (without it, Nagle's algorithm can hold a small
    /// request back until the previous one is acknowledged, up to the ~40 ms delayed-ACK time),
    /// and the same reconnect policy, attempts, buffer and default timeout, so that only the code
    /// on top of the client differs.
    pub(crate) async fn connect(urls: &[String]) -> Floor {
        let mut clients = Vec::with_capacity(urls.len());
        for url in urls {
            let mut config =
                Config::from_url(url).unwrap_or_else(|e| panic!("floor: bad URL {url}: {e}"));
            // Deliberately a copy of fredlock's client settings (src/nodes/node.rs), not a call into
            // them: the floor must stay plain fred, and a fair baseline needs the same settings.
            config.fail_fast = true;
            let client = fredlock::fred::types::Builder::from_config(config)
                .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
                .with_connection_config(|c| {
                    c.connection_timeout = Duration::from_secs(2);
                    c.internal_command_timeout = Duration::from_secs(2);
                    c.max_command_attempts = 1;
                    c.max_command_buffer_len = 100_000;
                    c.tcp.nodelay = Some(true);
                })
                .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(5))
                .build()
                .unwrap_or_else(|e| panic!("floor: cannot build a client for {url}: {e}"));
            client
                .init()
                .await
                .unwrap_or_else(|e| panic!("floor: cannot connect to {url}: {e}"));
            clients.push(client);
        }
        let mut release_sha = None;
        for (client, url) in clients.iter().zip(urls) {
            let sha: String = client
                .script_load(FLOOR_RELEASE)
                .await
                .unwrap_or_else(|e| panic!("floor: SCRIPT LOAD on {url}: {e}"));
            assert!(
                release_sha.as_ref().is_none_or(|s| *s == sha),
                "floor: SCRIPT LOAD returned different SHA1s"
            );
            release_sha = Some(sha);
        }
        Floor {
            clients,
            release_sha: release_sha.expect("floor: at least one node"),
        }
    }

    /// One acquire+release: SET NX PX everywhere at once, decided at 2 of 3 OKs, then EVALSHA
    /// everywhere at once, decided at 2 of 3 deletions (the third node's command still runs,
    /// in order on its connection; nobody waits for it), as a Redlock decides.
    /// The replies are checked (a benchmark of failing commands would be meaningless), which
    /// costs a few comparisons.
    pub(crate) async fn cycle(&self, key: &str) {
        // A fresh 128-bit token per lock, as fredlock makes: part of any correct lock.
        let token = format!("{:032x}", rand::random::<u128>());
        let quorum = self.clients.len() / 2 + 1;
        let mut sets: FuturesUnordered<_> = self
            .clients
            .iter()
            .map(|c| {
                c.set::<Value, _, _>(
                    key,
                    token.as_str(),
                    Some(Expiration::PX(TTL.as_millis() as i64)),
                    Some(SetOptions::NX),
                    false,
                )
            })
            .collect();
        // Decided at a quorum of OKs, as a Redlock decides: one refusal is tolerated (seen once
        // in a loaded run: a node still held an earlier cycle's token, 3 ms old, after that
        // cycle's release; it expires with its TTL and costs this cycle nothing else).
        let (mut ok, mut refused) = (0, 0);
        while ok < quorum {
            match sets.next().await {
                Some(Ok(Value::String(s))) if s == "OK" => ok += 1,
                Some(Ok(Value::Null)) if refused < self.clients.len() - quorum => refused += 1,
                other => {
                    let mut seen = Vec::new();
                    for c in &self.clients {
                        let v: Option<String> = c.get(key).await.ok().flatten();
                        let t: i64 = c.pttl(key).await.unwrap_or(-9);
                        seen.push(format!("{v:?} pttl {t}"));
                    }
                    panic!("floor: SET {key} NX: expected OK, got {other:?}; token {token}; nodes {seen:?}")
                }
            }
        }
        drop(sets);
        let mut dels: FuturesUnordered<_> = self
            .clients
            .iter()
            .map(|c| c.evalsha::<i64, _, _, _>(self.release_sha.as_str(), key, token.as_str()))
            .collect();
        // Decided at a quorum of deletions. A node whose SET was not awaited may not hold the
        // key (its SET dropped unsent, or refused): its 0 is one of the tolerated answers.
        let (mut deleted, mut other) = (0, 0);
        while deleted < quorum {
            match dels.next().await {
                Some(Ok(1)) => deleted += 1,
                Some(Ok(0)) if other < self.clients.len() - quorum => other += 1,
                reply => panic!("floor: EVALSHA release {key}: expected 1, got {reply:?}"),
            }
        }
    }
}

/// What a cycle runs on.
#[derive(Clone)]
pub(crate) enum Target {
    Floor(Arc<Floor>),
    Fredlock(Redlock),
    /// rslock 0.10 (redis-rs multiplexed connections), the most used Rust Redlock: a peer.
    Rslock(Arc<rslock::LockManager>),
}

/// A resource name and the floor's key for it (a different key: fredlock's last release of a
/// cycle may still be in flight when the floor starts, on another connection).
#[derive(Clone)]
pub(crate) struct Names {
    pub(crate) resource: String,
    pub(crate) floor_key: String,
    pub(crate) rslock_key: String,
}

impl Names {
    pub(crate) fn new(resource: String) -> Names {
        Names {
            floor_key: format!("floor:{resource}"),
            rslock_key: format!("rslock:{resource}"),
            resource,
        }
    }
}

impl Target {
    /// One acquire+release. For fredlock, the release report (it shows what the third node did).
    pub(crate) async fn cycle(&self, names: &Names) -> Option<ReleaseReport> {
        match self {
            Target::Floor(floor) => {
                floor.cycle(&names.floor_key).await;
                None
            }
            Target::Rslock(manager) => {
                let lock = manager
                    .lock(names.rslock_key.as_bytes(), TTL)
                    .await
                    .unwrap_or_else(|e| panic!("rslock: lock {}: {e:?}", names.rslock_key));
                manager.unlock(&lock).await;
                None
            }
            Target::Fredlock(redlock) => {
                let lock = redlock
                    .acquire(names.resource.as_str(), TTL)
                    .await
                    .unwrap_or_else(|e| panic!("fredlock: acquire {}: {e}", names.resource));
                let report = lock
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("fredlock: release {}: {e}", names.resource));
                Some(report)
            }
        }
    }
}

/// How the third node's release went, over a serial run (for the silent-node rows: it shows
/// whether its commands failed at once or were still in flight when fredlock moved on).
#[derive(Default, Clone, Copy)]
pub(crate) struct ThirdNode {
    pub(crate) answered: u64,
    pub(crate) pending: u64,
    pub(crate) failed_timeout: u64,
    pub(crate) failed_connection: u64,
    pub(crate) failed_other: u64,
}

impl ThirdNode {
    pub(crate) fn add(&mut self, report: &ReleaseReport) {
        match report.votes.0.get(2) {
            Some(Vote::Granted | Vote::Refused) => self.answered += 1,
            Some(Vote::Pending) | None => self.pending += 1,
            Some(Vote::Failed(e)) => match e.kind {
                NodeErrorKind::Timeout => self.failed_timeout += 1,
                NodeErrorKind::Connection => self.failed_connection += 1,
                _ => self.failed_other += 1,
            },
        }
    }

    pub(crate) fn merge(&mut self, other: ThirdNode) {
        self.answered += other.answered;
        self.pending += other.pending;
        self.failed_timeout += other.failed_timeout;
        self.failed_connection += other.failed_connection;
        self.failed_other += other.failed_other;
    }
}

/// `host:port` of a `redis://` URL, resolved, for the fault proxy.
pub(crate) async fn socket_addr(url: &str) -> std::net::SocketAddr {
    let config = Config::from_url(url).unwrap_or_else(|e| panic!("bad node URL {url}: {e}"));
    let server = config
        .server
        .hosts()
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no host in {url}"));
    tokio::net::lookup_host((server.host.to_string(), server.port))
        .await
        .unwrap_or_else(|e| panic!("cannot resolve {url}: {e}"))
        .next()
        .unwrap_or_else(|| panic!("{url} resolves to no address"))
}

pub(crate) async fn redlock(urls: Vec<String>, node_timeout: Option<Duration>) -> Redlock {
    let mut builder = Redlock::builder().nodes(urls);
    if let Some(t) = node_timeout {
        builder = builder.node_timeout(t);
    }
    builder.build().await.expect("build a Redlock")
}

pub(crate) fn rslock_target(urls: &[String]) -> Target {
    let mut manager = rslock::LockManager::new(urls.to_vec());
    // Own keys, so contention never retries; a retry would only show up as a failure.
    manager.set_retry(3, Duration::from_millis(5));
    Target::Rslock(Arc::new(manager))
}
