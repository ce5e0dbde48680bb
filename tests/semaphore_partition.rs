//! The partition schedule that breaks per-node counting: three holders, each reaching a
//! different majority of three nodes ({0,1}, {1,2}, {0,2}), a semaphore of 2 permits.
//! The strawman that counts holders per node admits all three (the negative control: the check
//! can see a violation); fredlock's semaphore, under the same schedule, admits at most two.

mod common;

use std::time::Duration;

use common::unique;
use fredlock::Redlock;
use fredlock_testkit::strawman::NaiveSemaphore;
use fredlock_testkit::{FaultProxy, LocalNodes};

const VIEWS: [[usize; 2]; 3] = [[0, 1], [1, 2], [0, 2]];
const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_node_counting_admits_too_many_and_slots_do_not() {
    let nodes = LocalNodes::start(3).await.expect("nodes");

    // The strawman: each holder asks only the nodes it reaches.
    let direct = Redlock::builder()
        .nodes(nodes.urls())
        .build()
        .await
        .expect("build");
    let naive = NaiveSemaphore::new(&unique("naive"), 2, TTL);
    let mut admitted = 0;
    for (h, view) in VIEWS.iter().enumerate() {
        let clients: Vec<_> = view
            .iter()
            .map(|&i| direct.client(i).expect("node").clone())
            .collect();
        if naive.acquire(&clients, 3, &format!("holder-{h}")).await {
            admitted += 1;
        }
    }
    assert_eq!(
        admitted, 3,
        "the strawman should admit 3 holders of 2 permits"
    );

    // fredlock: each holder's Redlock reaches the same majority; the third node resets.
    let name = unique("slots");
    let mut holders = Vec::new();
    let mut proxies = Vec::new();
    for view in VIEWS {
        let mine = FaultProxy::partition(&nodes, &view).await.expect("proxies");
        let urls: Vec<String> = mine.iter().map(FaultProxy::url).collect();
        proxies.extend(mine);
        let redlock = Redlock::builder()
            .nodes(urls)
            .retry(common::retry(20, 5, 5))
            .connect_wait(Duration::from_millis(300))
            .build()
            .await
            .expect("build");
        let sem = redlock.semaphore(name.clone(), 2).expect("semaphore");
        if let Some(permit) = sem.try_acquire(TTL).await.ok().flatten() {
            holders.push(permit);
        } else if let Ok(permit) = sem.acquire(TTL).await {
            holders.push(permit);
        }
    }
    assert!(holders.len() <= 2, "{} holders of 2 permits", holders.len());
    assert!(!holders.is_empty(), "nobody got a permit");
    let check = direct.semaphore(name, 2).expect("semaphore");
    assert!(check.count().await.expect("count") <= 2);
}
