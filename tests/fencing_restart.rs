//! Fencing on durable nodes (append-only file, `appendfsync always`, as fencing needs) that
//! restart with their data: one client acquires and releases a lock again and again while, for
//! each acquire, one node is frozen and, every second acquire, another is killed and started
//! again on its port. The frozen node is resumed after the release, and may be the next one
//! killed: it then dies having read only part of what was written to it while frozen, a lock's
//! `SET` but not its release, and comes back from its append-only file with the key. A lost
//! release must be sent again once the node is back, or the key stays its full TTL, and with
//! another node frozen no try of the next acquires gets a quorum until it expires.
//! The second test cuts that release deterministically (a proxy swallows it, then resets the
//! connection).

mod common;

use std::time::Duration;

use common::{behind_proxies, build, gone_within, trace, unique};
use fredlock::fred::prelude::ClientLike;
use fredlock::{Redlock, Retry};
use fredlock_testkit::{Fault, LocalNodes};
use rand::{Rng, SeedableRng};

const TTL: Duration = Duration::from_secs(5);
const ACQUIRES: usize = 120;
/// Grants of [`ACQUIRES`] the schedule must reach.
const GOAL: usize = 115;

/// One run of the schedule: returns how many acquires got the lock.
async fn schedule(nodes: &mut LocalNodes, redlock: &Redlock, seed: u64) -> usize {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let r = unique("fenced-restart");
    let mut granted = 0;
    let mut last_token = 0;
    for n in 0..ACQUIRES {
        let frozen = rng.random_range(0..nodes.len());
        if n % 2 == 1 {
            let restarted = (frozen + rng.random_range(1..nodes.len())) % nodes.len();
            nodes.kill(restarted).expect("kill");
            nodes
                .start_node(restarted)
                .await
                .expect("start with its data");
        }
        nodes.pause(frozen).expect("freeze");
        match redlock.acquire(r.as_str(), TTL).await {
            Ok(lock) => {
                granted += 1;
                let token = lock.fencing_token().expect("fencing on: a token");
                assert!(
                    token > last_token,
                    "acquire {n}: token {token} after {last_token}"
                );
                last_token = token;
                let _ = lock.release().await;
            }
            Err(e) => eprintln!("acquire {n} (node {frozen} frozen): {e}"),
        }
        nodes.resume(frozen).expect("resume");
    }
    granted
}

/// The schedule: at least [`GOAL`] of [`ACQUIRES`] acquires get the lock. Before, a release
/// lost with a killed node left its key there (see the module docs), and each such key cost
/// the acquires of the next few seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_and_freezes_leave_no_key_behind() {
    trace();
    let mut nodes = LocalNodes::start_durable(3).await.expect("durable nodes");
    let redlock = build(nodes.urls(), |b| {
        b.fencing_tokens(true).retry(Retry::default())
    })
    .await;
    let seed = std::env::var("FREDLOCK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("seed {seed} (FREDLOCK_SEED={seed} replays the schedule)");
    let granted = schedule(&mut nodes, &redlock, seed).await;
    eprintln!("granted {granted} of {ACQUIRES} on {:?}", nodes.server());
    assert!(
        granted >= GOAL,
        "granted {granted} of {ACQUIRES} (seed {seed}); the goal is {GOAL}"
    );
}

/// A lock granted by nodes 1 and 2 while node 0 holds its replies (its `SET` applied there,
/// answered late); its release returns once nodes 1 and 2 answered, while node 0's release
/// is swallowed by the proxy, and the connection is then reset: that release failed without
/// reaching the node. It must be sent again once node 0 is reachable, well within the TTL.
/// Before, a release still running when the quorum answered was dropped: its failure went
/// unseen and the key stayed on node 0 for its whole TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cut_after_the_quorum_answered_is_sent_again() {
    trace();
    let nodes = LocalNodes::start_durable(3).await.expect("durable nodes");
    let (proxies, redlock) = behind_proxies(&nodes, |b| {
        b.fencing_tokens(true)
            .node_timeout(Duration::from_secs(2))
            .retry(Retry::default())
    })
    .await;
    let r = unique("cut-release");
    let key = redlock.key(&r);
    proxies[0].set(Fault::HoldReplies);
    let lock = redlock
        .acquire(r.as_str(), Duration::from_secs(30))
        .await
        .expect("granted by nodes 1 and 2");
    assert!(
        !gone_within(&nodes, 0, &key, Duration::ZERO).await,
        "node 0 never applied the SET: the scenario is not what it claims"
    );
    proxies[0].set(Fault::Blackhole);
    lock.release().await.expect("released by nodes 1 and 2");
    proxies[0].set(Fault::Reset);
    let client = redlock.client(0).expect("node 0").clone();
    let failing = common::eventually(Duration::from_secs(10), || {
        let client = client.clone();
        async move { client.ping::<String>(None).await.is_err() }
    });
    assert!(
        failing.await,
        "node 0 kept answering through a resetting proxy"
    );
    proxies[0].set(Fault::Pass);
    assert!(
        gone_within(&nodes, 0, &key, Duration::from_secs(5)).await,
        "the release cut on node 0 was never sent again: the key is still there (PTTL {})",
        nodes.pttl(0, &key).await.expect("PTTL")
    );
}
