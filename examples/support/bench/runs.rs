//! The full run's groups of measurements, each returning its figures: the interleaved serial rows
//! ([`mixed_rounds`]), the cluster rows, waiters, keep-alive children and N = 3, 5, 7. Must not
//! print the tables.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fredlock::Redlock;
use fredlock_testkit::{Blackhole, Fault, FaultProxy, LocalCluster, LocalNodes, TestNodes};
use futures::future::join_all;

use crate::load::{
    cluster_redlock, keep_alive_load, saturate, KeepAliveLoad, Saturation, CLUSTER_SHARDS,
};
use crate::plan::Plan;
use crate::rounds::{serial_round, throughput_round, Series};
use crate::servers::{idle_rate, metered_round, Meter, Metered, Server};
use crate::support;
use crate::support::keepalive::{run_child, ChildSpec, Sample, Variant};
use crate::support::waiters::{self, Hold, Series as WSeries, Target as WTarget};
use crate::targets::{redlock, rslock_target, socket_addr, Floor, Target};
use crate::SILENT_NODE_TIMEOUT;

/// (w) 16 waiters on one key with a 1 ms hold (the precise hold of `bench_waiters`): fredlock
/// polling, fredlock woken by release, rslock and an in-process mutex, interleaved within each
/// round (order alternating), after a warm-up round each.
pub(crate) async fn waiter_rounds(
    urls: &[String],
    plan: &Plan,
    run: &str,
) -> Vec<(&'static str, WSeries)> {
    let mut addrs = Vec::new();
    for u in urls {
        addrs.push(support::addr_of(u).await);
    }
    let build = |wake: bool| {
        Redlock::builder()
            .nodes(urls.to_vec())
            .retry(waiters::RETRY)
            .wake_on_release(wake)
            .build()
    };
    let variants: Vec<(&'static str, WTarget)> = vec![
        (
            "fredlock, polling",
            WTarget::Redlock(build(false).await.expect("build")),
        ),
        (
            "fredlock, woken by release",
            WTarget::Redlock(build(true).await.expect("build")),
        ),
        (
            "rslock 0.10",
            WTarget::Rslock(Arc::new(waiters::rslock(urls))),
        ),
        (
            "in-process tokio Mutex (ceiling, no Redis)",
            WTarget::Local(Arc::new(tokio::sync::Mutex::new(()))),
        ),
    ];
    let key = format!("{run}:waiters");
    for (_, t) in &variants {
        waiters::round(t, &addrs, &key, Hold::Precise, 0.3).await;
    }
    let mut series: Vec<WSeries> = variants.iter().map(|_| WSeries::default()).collect();
    for r in 0..plan.waiter_rounds {
        let mut order: Vec<usize> = (0..variants.len()).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for v in order {
            let got = waiters::round(
                &variants[v].1,
                &addrs,
                &key,
                Hold::Precise,
                plan.waiter_secs,
            );
            series[v].0.push(got.await);
        }
    }
    for (_, t) in &variants {
        if let WTarget::Redlock(r) = t {
            r.close().await;
        }
    }
    variants.into_iter().map(|(n, _)| n).zip(series).collect()
}

/// (k) The keep-alive children (see `support::keepalive`): per round a batched, a per-lock and a
/// plain child, the order alternating; samples per variant.
pub(crate) async fn keepalive_rounds(
    urls: &[String],
    plan: &Plan,
    run: &str,
) -> BTreeMap<&'static str, Vec<Sample>> {
    let mut out: BTreeMap<&'static str, Vec<Sample>> = BTreeMap::new();
    for round in 0..plan.keepalive_rounds {
        let mut order = [Variant::PerLock, Variant::Batched, Variant::Plain];
        if round % 2 == 1 {
            order.reverse();
        }
        for variant in order {
            let (urls, prefix) = (urls.to_vec(), format!("{run}:k{round}:{}", variant.name()));
            let (locks, ttl) = (plan.keepalive_locks, plan.keepalive_ttl);
            let sample = tokio::task::spawn_blocking(move || {
                run_child(&ChildSpec {
                    variant,
                    urls: &urls,
                    prefix: &prefix,
                    locks,
                    ttl,
                    window: ttl * 2,
                })
            })
            .await
            .expect("a keep-alive child");
            out.entry(variant.name()).or_default().push(sample);
        }
    }
    out
}

/// (n) Serial p50 for N = 3, 5, 7 nodes: the raw floor and fredlock at each N, all six
/// interleaved in every round. Returns per N: (N, floor series, fredlock series).
pub(crate) async fn scaling_rounds(plan: &Plan, run: &str) -> Vec<(usize, Series, Series)> {
    let nodes = LocalNodes::start(7)
        .await
        .expect("start 7 local redis-server nodes");
    let urls = nodes.urls();
    let mut targets = Vec::new();
    for n in [3, 5, 7] {
        let floor = Target::Floor(Arc::new(Floor::connect(&urls[..n]).await));
        let fredlock = Target::Fredlock(redlock(urls[..n].to_vec(), None).await);
        targets.push((n, floor, fredlock));
    }
    let res: Vec<String> = targets
        .iter()
        .map(|(n, ..)| format!("{run}:n{n}"))
        .collect();
    let mixed: Vec<(&Target, &str)> = targets
        .iter()
        .zip(&res)
        .flat_map(|((_, f, l), r)| [(f, r.as_str()), (l, r.as_str())])
        .collect();
    serial_round(&mixed, plan.warmup_cycles / 2).await;
    let mut series: Vec<(Series, Series)> = targets.iter().map(|_| Default::default()).collect();
    for _ in 0..plan.rounds {
        let mut rounds = serial_round(&mixed, plan.n_cycles).await.into_iter();
        for (floor, fredlock) in &mut series {
            floor.push(rounds.next().expect("one result per variant"));
            fredlock.push(rounds.next().expect("one result per variant"));
        }
    }
    for (_, _, l) in &targets {
        if let Target::Fredlock(r) = l {
            r.close().await;
        }
    }
    targets
        .iter()
        .map(|(n, ..)| *n)
        .zip(series)
        .map(|(n, (f, l))| (n, f, l))
        .collect()
}

/// The fault variants and peers of the serial rows (a), (c), (c'), (e).
pub(crate) struct Targets {
    pub(crate) floor: Target,
    pub(crate) rslock: Target,
    pub(crate) healthy: Target,
    pub(crate) fenced: Target,
    pub(crate) silent: Target,
    pub(crate) stalled: Target,
    pub(crate) blackhole: Blackhole,
    /// Kept alive for `stalled`.
    pub(crate) _proxy: FaultProxy,
    /// The nodes, as the tables name them.
    pub(crate) where_: String,
}

pub(crate) async fn targets(nodes: &TestNodes, urls: &[String], run: &str) -> Targets {
    let urls = urls.to_vec();

    let floor = Target::Floor(Arc::new(Floor::connect(&urls).await));
    let rslock = rslock_target(&urls);
    let healthy_redlock = redlock(urls.clone(), None).await;
    // Node names as fredlock shows them (`host:port/db`): URLs may carry passwords.
    let where_ = match &nodes {
        TestNodes::Local(_) => "3 local redis-server nodes",
        TestNodes::External(_) => "FREDLOCK_NODES",
    };
    let where_ = format!("{where_} ({})", healthy_redlock.node_names().join(", "));
    let healthy = Target::Fredlock(healthy_redlock);
    // (e): the same, handing out fencing tokens (one more round per acquire: the write-back).
    let fenced = Target::Fredlock(
        Redlock::builder()
            .nodes(urls.clone())
            .fencing_tokens(true)
            .build()
            .await
            .expect("build a fencing Redlock"),
    );

    // (c): the third node is a listener that accepts TCP and never answers, from the start.
    let blackhole = Blackhole::start()
        .await
        .expect("start the blackhole listener");
    let silent_urls = vec![urls[0].clone(), urls[1].clone(), blackhole.url()];
    let silent = Target::Fredlock(redlock(silent_urls, Some(SILENT_NODE_TIMEOUT)).await);

    // (c'): the third node connects normally through a proxy, which then swallows everything.
    let proxy = FaultProxy::start(socket_addr(&urls[2]).await)
        .await
        .expect("start the fault proxy");
    let stalled_urls = vec![urls[0].clone(), urls[1].clone(), proxy.url()];
    let stalled_redlock = redlock(stalled_urls, Some(SILENT_NODE_TIMEOUT)).await;
    // `inspect` waits for every node: proof that the proxied node is connected and answering
    // before it goes silent.
    let probe = stalled_redlock
        .inspect(&format!("{run}:probe"))
        .await
        .expect("inspect through the proxy");
    if let Err(e) = &probe.nodes[2].state {
        panic!("the proxied node did not answer before the fault: {e}");
    }
    proxy.set(Fault::Blackhole);
    let stalled = Target::Fredlock(stalled_redlock);

    // Commands to a silent node stay in flight until the per-node timeout; let them expire
    // before measuring anything else, so their timers and clean-up do not land in another
    // variant's round.
    Targets {
        floor,
        rslock,
        healthy,
        fenced,
        silent,
        stalled,
        blackhole,
        _proxy: proxy,
        where_,
    }
}

/// The serial series of (a), (c), (c') and (e).
pub(crate) struct Mixed {
    pub(crate) s_floor: Series,
    pub(crate) s_rslock: Series,
    pub(crate) s_healthy: Series,
    pub(crate) s_silent: Series,
    pub(crate) s_stalled: Series,
    pub(crate) s_fenced: Series,
}

/// (a), (c), (e) in interleaved blocks, (c') alone after each round.
pub(crate) async fn mixed_rounds(t: &Targets, plan: &Plan, run: &str) -> Mixed {
    let (serial_res, silent_res, stalled_res, fenced_res) = (
        format!("{run}:serial"),
        format!("{run}:silent"),
        format!("{run}:stalled"),
        format!("{run}:fenced"),
    );
    let Targets {
        floor,
        rslock,
        healthy,
        fenced,
        silent,
        stalled,
        ..
    } = t;

    let settle = || tokio::time::sleep(SILENT_NODE_TIMEOUT + Duration::from_millis(100));

    // (a) and (c): floor, fredlock and fredlock with a blackhole node take turns in small blocks.
    // fred never completes its handshake with the blackhole (its PING is never answered), so
    // commands to it fail at once and leave nothing behind that could slow the others down.
    let mixed = [
        (floor, serial_res.as_str()),
        (rslock, serial_res.as_str()),
        (healthy, serial_res.as_str()),
        (silent, silent_res.as_str()),
        (fenced, fenced_res.as_str()),
    ];
    // (c'): measured on its own, because everything it sends to the silent node stays in flight
    // for 500 ms and would then expire during the other variants' cycles.
    let alone = [(stalled, stalled_res.as_str())];

    // Warm-up: connections, scripts cached in Redis, allocator and CPU caches, for each variant.
    serial_round(&mixed, plan.warmup_cycles).await;
    serial_round(&alone, plan.warmup_cycles).await;
    settle().await;

    let (mut s_floor, mut s_rslock, mut s_healthy, mut s_silent, mut s_stalled, mut s_fenced) = (
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
        Series::default(),
    );
    for _ in 0..plan.rounds {
        let mut mixed_rounds = serial_round(&mixed, plan.cycles).await.into_iter();
        for series in [
            &mut s_floor,
            &mut s_rslock,
            &mut s_healthy,
            &mut s_silent,
            &mut s_fenced,
        ] {
            series.push(mixed_rounds.next().expect("one result per variant"));
        }
        let mut alone_rounds = serial_round(&alone, plan.cycles).await.into_iter();
        s_stalled.push(alone_rounds.next().expect("one result per variant"));
        settle().await;
    }

    Mixed {
        s_floor,
        s_rslock,
        s_healthy,
        s_silent,
        s_stalled,
        s_fenced,
    }
}

/// (g) and (h): the cluster rows and the saturated single server.
pub(crate) struct Clusters {
    pub(crate) g_single: Vec<Metered>,
    pub(crate) g_cluster: Vec<Metered>,
    pub(crate) idle_single: f64,
    pub(crate) idle_shards: f64,
    pub(crate) g_keep: KeepAliveLoad,
    pub(crate) saturation: Saturation,
}

pub(crate) async fn cluster_rows(nodes: &TestNodes, plan: &Plan, run: &str) -> Clusters {
    // (g) Each node a 3-shard cluster against 3 single servers, both local (with FREDLOCK_NODES,
    // 3 local single servers of its own), so that the servers can be read and reset directly.
    let own_singles;
    let singles: &LocalNodes = match nodes.local() {
        Some(local) => local,
        None => {
            own_singles = LocalNodes::start(3)
                .await
                .expect("start 3 local redis-server nodes");
            &own_singles
        }
    };
    let clusters: Vec<LocalCluster> = join_all((0..3).map(|_| LocalCluster::start(CLUSTER_SHARDS)))
        .await
        .into_iter()
        .map(|c| c.expect("start a local 3-shard Redis Cluster"))
        .collect();
    let cluster_urls: Vec<String> = clusters.iter().map(LocalCluster::url).collect();
    let single_servers = Server::all(singles);
    let shard_servers: Vec<Server> = clusters
        .iter()
        .flat_map(|c| Server::all(c.nodes()))
        .collect();
    let single_lock = redlock(singles.urls(), None).await;
    let cluster_lock = cluster_redlock(&cluster_urls).await;
    let g_prefix = format!("{run}:g");
    let on_single = Target::Fredlock(single_lock.clone());
    let on_cluster = Target::Fredlock(cluster_lock.clone());
    throughput_round(&on_single, &g_prefix, plan.throughput_warmup, true).await;
    throughput_round(&on_cluster, &g_prefix, plan.throughput_warmup, true).await;
    for server in single_servers.iter().chain(&shard_servers) {
        server.reset_stats().await;
    }
    // What the servers burn idle, to take out of the CPU per command of (h).
    let idle_window = plan.throughput_round * 3;
    let (idle_single, idle_shards) = (
        idle_rate(&single_servers, idle_window).await,
        idle_rate(&shard_servers, idle_window).await,
    );
    let (mut g_single, mut g_cluster) = (Vec::new(), Vec::new());
    for round in 0..plan.throughput_rounds {
        for turn in 0..2 {
            if (round + turn) % 2 == 0 {
                let m = metered_round(
                    &on_single,
                    &g_prefix,
                    plan.throughput_round,
                    &single_servers,
                );
                g_single.push(m.await);
            } else {
                let m = metered_round(
                    &on_cluster,
                    &g_prefix,
                    plan.throughput_round,
                    &shard_servers,
                );
                g_cluster.push(m.await);
            }
        }
    }
    single_lock.close().await;
    cluster_lock.close().await;
    let g_keep = keep_alive_load(
        cluster_redlock(&cluster_urls).await,
        Meter::Servers(&shard_servers),
        &format!("{run}:gkeep"),
        plan.cluster_kept,
        plan.keep_ttl,
    )
    .await;
    drop(clusters);

    // (h) One single server saturated by the pipelined loader.
    let saturation = saturate(&single_servers[0], &format!("{run}:sat"), plan.saturation).await;
    Clusters {
        g_single,
        g_cluster,
        idle_single,
        idle_shards,
        g_keep,
        saturation,
    }
}
