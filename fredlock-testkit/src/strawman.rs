//! Strawmen: designs that look right and are not, kept so that the checkers can be shown to
//! catch them (negative controls).
//!
//! [`NaiveSemaphore`] counts holders per node: each node admits a holder while its own set has
//! fewer than `permits` members, and a holder is admitted when a quorum of nodes admitted it.
//! Different majorities can admit different holders, so a partition admits more holders than
//! permits while no node ever holds more than `permits` members.
//!
//! [`NaiveRwLock`] counts readers per node and admits a reader that any node counted: a
//! writer that reaches a majority without that node sees no reader, and both hold at once.
//!
//! [`NaiveFencing`] hands out fencing tokens as "INCR the counter on every node that granted,
//! take the largest": different majorities advance different counters, so a token repeats
//! (N = 3, grants on nodes {0,1}, {0,2}, {0,1}, {1,2} give tokens 1, 2, 3, 3).
//!
//! [`HerdLock`] is safe and not live: every release (a holder's, and the clean-up of every
//! attempt that lost) publishes on the key's channel, and EVERY waiting client is subscribed
//! and retries on every message: a thundering herd, whose losing attempts clean up and publish
//! again, so the storm lasts as long as anyone waits. The fleet liveness rows must flag it.

use fredlock::fred::clients::Client;
use fredlock::fred::interfaces::{ClientLike, EventInterface, KeysInterface, PubsubInterface};
use fredlock::fred::prelude::{Config, Expiration, LuaInterface, Options, SetOptions};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Admit ARGV[1] into the set KEYS[1] while it has fewer than ARGV[2] members; expire the set
/// after ARGV[3] ms. Reply 1 admitted, 0 full.
const ADMIT: &str = r#"
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"#;

/// A semaphore that counts holders per node and votes: UNSAFE under partitions (see the module
/// docs). For negative controls only.
#[derive(Debug, Clone)]
pub struct NaiveSemaphore {
    key: String,
    permits: usize,
    ttl: Duration,
}

impl NaiveSemaphore {
    /// A naive semaphore `name` with `permits` permits whose holders expire after `ttl`.
    pub fn new(name: &str, permits: usize, ttl: Duration) -> NaiveSemaphore {
        NaiveSemaphore {
            key: format!("strawman:sem:{name}"),
            permits,
            ttl,
        }
    }

    /// Asks every node in `clients` (one client per node, as this holder reaches them) to admit
    /// `holder`; admitted when a quorum of `nodes` did. A node that fails or times out (100 ms)
    /// counts as a refusal.
    pub async fn acquire(&self, clients: &[Client], nodes: usize, holder: &str) -> bool {
        let options = Options {
            timeout: Some(Duration::from_millis(100)),
            max_attempts: Some(1),
            ..Options::default()
        };
        let calls = clients.iter().map(|c| {
            let args = vec![
                holder.to_string(),
                self.permits.to_string(),
                self.ttl.as_millis().to_string(),
            ];
            let key = self.key.clone();
            let c = c.clone();
            let options = options.clone();
            async move {
                // `eval` ignores per-command options in fred 10; bound it from outside.
                let call = c.eval::<i64, _, _, _>(ADMIT, vec![key], args);
                matches!(
                    tokio::time::timeout(options.timeout.unwrap_or_default(), call).await,
                    Ok(Ok(1))
                )
            }
        });
        let admitted = futures_admitted(calls).await;
        admitted > nodes / 2
    }
}

/// Fencing tokens by "INCR on each granting node, token = max": UNSAFE (tokens repeat when
/// successive grants reach different majorities; see the module docs). For negative controls
/// only.
#[derive(Debug, Clone)]
pub struct NaiveFencing {
    key: String,
}

impl NaiveFencing {
    /// Naive tokens for `resource`.
    pub fn new(resource: &str) -> NaiveFencing {
        NaiveFencing {
            key: format!("strawman:fence:{resource}"),
        }
    }

    /// The token a holder granted by the nodes in `clients` (one client per granting node)
    /// gets: the largest of their incremented counters; `None` when no node answered.
    pub async fn token(&self, clients: &[Client]) -> Option<u64> {
        let mut best = None;
        for c in clients {
            let incr = c.eval::<u64, _, _, _>(
                "return redis.call('INCR', KEYS[1])",
                vec![self.key.clone()],
                Vec::<String>::new(),
            );
            if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(100), incr).await {
                best = best.max(Some(n));
            }
        }
        best
    }
}

/// Read: counted on a node without a writer (KEYS[1] the writer, KEYS[2] the readers set).
const NAIVE_READ: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"#;

/// Write: set on a node that counts no reader and has no writer.
const NAIVE_WRITE: &str = r#"
if redis.call('SCARD', KEYS[2]) > 0 or redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"#;

/// A read-write lock that counts readers per node and admits a reader counted by ANY node (no
/// quorum for readers; a writer needs a quorum of nodes that count no reader): UNSAFE, a writer
/// that reaches other nodes than a reader never sees it. For negative controls only.
#[derive(Debug, Clone)]
pub struct NaiveRwLock {
    writer: String,
    readers: String,
    ttl: Duration,
}

impl NaiveRwLock {
    /// A naive read-write lock `name` whose holders expire after `ttl`.
    pub fn new(name: &str, ttl: Duration) -> NaiveRwLock {
        NaiveRwLock {
            writer: format!("strawman:rw:{{{name}}}:w"),
            readers: format!("strawman:rw:{{{name}}}:r"),
            ttl,
        }
    }

    /// A read share for `holder`, asking the nodes in `clients` (as this reader reaches them):
    /// admitted when any of them counted it.
    pub async fn read(&self, clients: &[Client], holder: &str) -> bool {
        self.ask(NAIVE_READ, clients, holder).await > 0
    }

    /// The write lock for `holder`: admitted when a quorum of `nodes` set it.
    pub async fn write(&self, clients: &[Client], nodes: usize, holder: &str) -> bool {
        self.ask(NAIVE_WRITE, clients, holder).await > nodes / 2
    }

    async fn ask(&self, script: &'static str, clients: &[Client], holder: &str) -> usize {
        let calls = clients.iter().map(|c| {
            let keys = vec![self.writer.clone(), self.readers.clone()];
            let args = vec![holder.to_string(), self.ttl.as_millis().to_string()];
            let c = c.clone();
            async move {
                let call = c.eval::<i64, _, _, _>(script, keys, args);
                matches!(
                    tokio::time::timeout(Duration::from_millis(100), call).await,
                    Ok(Ok(1))
                )
            }
        });
        futures_admitted(calls).await
    }
}

async fn futures_admitted<F: std::future::Future<Output = bool>>(
    calls: impl Iterator<Item = F>,
) -> usize {
    let mut n = 0;
    for call in calls.collect::<Vec<_>>() {
        n += usize::from(call.await);
    }
    n
}

/// Delete KEYS[1] if it holds ARGV[1] and say so on the channel KEYS[1] (everyone listens).
const HERD_RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[1], ARGV[1])
  return 1
end
return 0
"#;

/// Bound on one command of the herd (a node that does not answer counts as a refusal).
const HERD_TIMEOUT: Duration = Duration::from_millis(200);

/// A Redlock-style lock whose every release wakes every waiter of every client: a thundering
/// herd (see the module docs). For the fleet liveness control only.
pub struct HerdLock {
    nodes: Vec<Client>,
    subscribers: Vec<Client>,
    /// Bumped by every message on any channel: each waiter retries on every change.
    woken: watch::Receiver<u64>,
    _bump: Arc<watch::Sender<u64>>,
    /// Fallback pause when no message comes (a holder whose key expired).
    fallback: Duration,
}

impl HerdLock {
    /// Connects one command client and one subscriber per node URL, subscribed to the keys of
    /// `resources` (the key is `herd:<resource>`, its channel the same).
    pub async fn connect(
        urls: &[String],
        resources: &[String],
        fallback: Duration,
    ) -> Result<HerdLock, fredlock::fred::error::Error> {
        let (bump, woken) = watch::channel(0u64);
        let bump = Arc::new(bump);
        let (mut nodes, mut subscribers) = (Vec::new(), Vec::new());
        for url in urls {
            let node = Client::new(Config::from_url(url)?, None, None, None);
            node.init().await?;
            nodes.push(node);
            let sub = Client::new(Config::from_url(url)?, None, None, None);
            sub.init().await?;
            let mut rx = sub.message_rx();
            let bump = bump.clone();
            tokio::spawn(async move {
                while rx.recv().await.is_ok() {
                    bump.send_modify(|n| *n += 1);
                }
            });
            for r in resources {
                sub.subscribe(Self::key(r)).await?;
            }
            subscribers.push(sub);
        }
        Ok(HerdLock {
            nodes,
            subscribers,
            woken,
            _bump: bump,
            fallback,
        })
    }

    fn key(resource: &str) -> String {
        format!("herd:{resource}")
    }

    /// Waits for `resource` until `give_up`: `SET NX PX` on every node, granted on a quorum;
    /// otherwise releases what it set (which publishes) and retries at the next message on any
    /// channel (or after the fallback pause). Returns the token, or `None` at `give_up`.
    pub async fn acquire(
        &mut self,
        resource: &str,
        ttl: Duration,
        give_up: Instant,
    ) -> Option<String> {
        let key = Self::key(resource);
        loop {
            let token = format!("{:032x}", rand::random::<u128>());
            let mut sets = tokio::task::JoinSet::new();
            for c in &self.nodes {
                let (c, key, token) = (c.clone(), key.clone(), token.clone());
                let px = Expiration::PX(ttl.as_millis() as i64);
                sets.spawn(async move {
                    let set = c.set::<Option<String>, _, _>(
                        key,
                        token,
                        Some(px),
                        Some(SetOptions::NX),
                        false,
                    );
                    matches!(
                        tokio::time::timeout(HERD_TIMEOUT, set).await,
                        Ok(Ok(Some(_)))
                    )
                });
            }
            let votes = sets.join_all().await.into_iter().filter(|&v| v).count();
            if votes > self.nodes.len() / 2 {
                return Some(token);
            }
            self.woken.borrow_and_update();
            self.release(resource, &token).await;
            if Instant::now() >= give_up {
                return None;
            }
            let pause = tokio::time::sleep(self.fallback);
            tokio::select! {
                _ = self.woken.changed() => {}
                () = pause => {}
                () = tokio::time::sleep_until(give_up) => return None,
            }
        }
    }

    /// Deletes `token`'s key on every node where it is still there, publishing each time.
    pub async fn release(&self, resource: &str, token: &str) {
        let key = Self::key(resource);
        let mut calls = tokio::task::JoinSet::new();
        for c in &self.nodes {
            let (c, key, token) = (c.clone(), key.clone(), token.to_string());
            calls.spawn(async move {
                let call = c.eval::<i64, _, _, _>(HERD_RELEASE, vec![key], vec![token]);
                let _ = tokio::time::timeout(HERD_TIMEOUT, call).await;
            });
        }
        calls.join_all().await;
    }

    /// Quits every connection.
    pub async fn close(&self) {
        for c in self.nodes.iter().chain(&self.subscribers) {
            let _ = c.quit().await;
        }
    }
}
