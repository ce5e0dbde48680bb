//! The tables, part two: the cluster and capacity figures of (g) and (h) and the per-round spread
//! behind the medians. Measures nothing.

use crate::load::{per_cycle, shares, CLUSTER_SHARDS, LOADER_CONNECTIONS, LOADER_DEPTH};
use crate::report::{cpu, rates, Results};
use crate::rounds::Series;
use crate::runs::{Clusters, Mixed};
use crate::servers::{Metered, Work};
use crate::support::median;
use crate::TASKS;

/// The (g) and (h) figures several tables use.
pub(crate) struct G {
    pub(crate) gs_work: Work,
    pub(crate) gs_cycles: u64,
    pub(crate) gc_work: Work,
    pub(crate) gc_cycles: u64,
    pub(crate) gs: f64,
    pub(crate) gc: f64,
    pub(crate) cs: f64,
    pub(crate) cc: f64,
    pub(crate) g_shares: String,
    pub(crate) g_min: f64,
    pub(crate) g_max: f64,
    pub(crate) k_shares: String,
    pub(crate) k_min: f64,
    pub(crate) k_max: f64,
    pub(crate) d_per: f64,
    pub(crate) g_per: f64,
    pub(crate) us_single: f64,
    pub(crate) us_shard: f64,
    pub(crate) net_single: f64,
    pub(crate) net_shard: f64,
}

pub(crate) fn g_rates(r: &[Metered]) -> Vec<f64> {
    r.iter().map(|m| m.round.per_second).collect()
}

pub(crate) fn g_figures(r: &Results) -> G {
    let (keep, c) = (&r.keep, &r.clusters);
    let g_total = |rounds: &[Metered]| {
        let mut work = Work::default();
        for m in rounds {
            work.add(&m.work);
        }
        (work, rounds.iter().map(|m| m.round.cycles).sum::<u64>())
    };
    let (gs_work, gs_cycles) = g_total(&c.g_single);
    let (gc_work, gc_cycles) = g_total(&c.g_cluster);
    let (g_shares, g_min, g_max) = shares(&gc_work.per_server, CLUSTER_SHARDS);
    let (k_shares, k_min, k_max) = shares(&c.g_keep.per_server, CLUSTER_SHARDS);
    G {
        gs: median(g_rates(&c.g_single)),
        gc: median(g_rates(&c.g_cluster)),
        cs: gs_work.commands() as f64 / gs_cycles.max(1) as f64,
        cc: gc_work.commands() as f64 / gc_cycles.max(1) as f64,
        d_per: keep.commands_per_second / keep.locks as f64,
        g_per: c.g_keep.commands_per_second / c.g_keep.locks as f64,
        us_single: gs_work.cpu_per_command_us(),
        us_shard: gc_work.cpu_per_command_us(),
        net_single: gs_work.net_cpu_per_command_us(c.idle_single),
        net_shard: gc_work.net_cpu_per_command_us(c.idle_shards),
        gs_work,
        gs_cycles,
        gc_work,
        gc_cycles,
        g_shares,
        g_min,
        g_max,
        k_shares,
        k_min,
        k_max,
    }
}

pub(crate) fn print_details_capacity(r: &Results) {
    let Results { keep, clusters, .. } = r;
    let Clusters {
        g_keep, saturation, ..
    } = clusters;
    let G {
        gc_work,
        gs,
        gc,
        cs,
        cc,
        g_min,
        g_max,
        k_min,
        k_max,
        d_per,
        g_per,
        net_single,
        net_shard,
        ..
    } = g_figures(r);
    let even = 100.0 / CLUSTER_SHARDS as f64;

    // Extending at 2/3 of the TTL: locks x nodes / (ttl x 2/3) EVALSHA per second, plus the
    // commands each script runs (GET, PEXPIRE), which INFO counts too.
    let rounds_per_second = keep.locks as f64 / (keep.ttl.as_secs_f64() * 2.0 / 3.0);
    println!(
        "| (d) {} locks kept alive (TTL {} s): memory per held lock | — | {} | — | — | — |",
        keep.locks,
        keep.ttl.as_secs(),
        keep.bytes_per_lock
            .map_or("n/a".to_string(), |b| format!("{:.0} B", b))
    );
    println!(
        "| (d) {} locks kept alive: Redis commands/s, all nodes (extension rounds/s: {:.0}) | — | {:.0} | — | — | {} lost |",
        keep.locks,
        rounds_per_second,
        keep.commands_per_second,
        keep.lost
    );
    println!(
        "| (g) {TASKS} tasks, a fresh key per cycle, each of 3 nodes a {CLUSTER_SHARDS}-shard Redis Cluster: cycles/s (baseline: fredlock on 3 single servers) | {gs:.0} | {gc:.0} | {:.3} | — (2 cores: distribution, not speed-up) | — |",
        gc / gs
    );
    println!(
        "| (g) Redis commands per acquire+release, all 3 nodes (INFO commandstats; baseline: single servers) | {cs:.2} | {cc:.2} | {:.3} | — | — |",
        cc / cs
    );
    println!(
        "| (g) each shard's share of its node's commands, min / max of {} shards (even: {even:.1}%) | — | {g_min:.1}% / {g_max:.1}% | — | — | — |",
        gc_work.per_server.len()
    );
    println!(
        "| (g) {} locks kept alive on the clusters (TTL {} s): Redis commands/s per held lock, all nodes (baseline: (d), {} locks on single servers) | {d_per:.3} | {g_per:.3} | {:.3} | — | {} lost |",
        g_keep.locks,
        g_keep.ttl.as_secs(),
        keep.locks,
        g_per / d_per,
        g_keep.lost
    );
    println!(
        "| (g) kept-alive locks on the clusters: each shard's share of its node's commands, min / max (even: {even:.1}%) | — | {k_min:.1}% / {k_max:.1}% | — | — | — |"
    );
    println!(
        "| (h) redis-server CPU per Redis command during (g), net of the idle servers' own use, µs (baseline: single servers; fredlock: cluster shards) | {net_single:.2} | {net_shard:.2} | {:.3} | — | — |",
        net_shard / net_single
    );
    println!(
        "| (h) one redis-server driven by a pipelined raw-RESP loader ({LOADER_CONNECTIONS} connections x {LOADER_DEPTH} cycles in flight, SET NX PX + EVAL release): Redis commands/s (server CPU busy {:.0}%, loader {}) | — | {:.0} | — | — | {} |",
        saturation.busy * 100.0,
        saturation
            .client_busy
            .map_or("n/a".to_string(), |b| format!("{:.0}%", b * 100.0)),
        saturation.commands_per_second,
        if saturation.busy >= 0.9 { "saturated" } else { "**not saturated**" }
    );
    println!(
        "| (d) server memory per held lock, per node, B (INFO used_memory - mem_clients_normal; baseline: single servers, (d); fredlock: a {CLUSTER_SHARDS}-shard cluster node, (g)) | {:.0} | {:.0} | {:.3} | — | — |",
        keep.server_bytes_per_lock,
        g_keep.server_bytes_per_lock,
        g_keep.server_bytes_per_lock / keep.server_bytes_per_lock
    );
    println!();
}

pub(crate) fn print_spread(r: &Results) {
    let Results {
        mixed,
        t_floor,
        t_rslock,
        t_healthy,
        ..
    } = r;
    let Mixed {
        s_floor,
        s_rslock,
        s_healthy,
        s_silent,
        s_stalled,
        s_fenced,
    } = mixed;

    // The spread behind the medians, and what the silent node did: enough to judge the noise.
    for name in ["p50", "p99"] {
        let of = |s: &Series| list(if name == "p50" { &s.p50 } else { &s.p99 });
        println!(
            "per-round {name} (µs): floor [{}], rslock [{}], fredlock [{}], blackhole [{}], silent-after-connect [{}], fencing [{}]",
            of(s_floor),
            of(s_rslock),
            of(s_healthy),
            of(s_silent),
            of(s_stalled),
            of(s_fenced)
        );
    }
    println!(
        "per-round cycles/s: floor [{}], rslock [{}], fredlock [{}]",
        list(&rates(t_floor)),
        list(&rates(t_rslock)),
        list(&rates(t_healthy))
    );
    if let (Some(f), Some(r), Some(h)) = (cpu(t_floor), cpu(t_rslock), cpu(t_healthy)) {
        println!(
            "(b) client CPU per cycle (this process, all threads; median of rounds): floor {f:.1} µs, rslock {r:.1} µs, fredlock {h:.1} µs ({:.2}x the floor, {:.2}x rslock)",
            h / f,
            h / r
        );
    }
    for (name, t) in [
        ("blackhole", s_silent.third),
        ("silent-after-connect", s_stalled.third),
    ] {
        println!(
            "third node's release vote ({name}): answered {}, pending (still in flight) {}, failed: timeout {}, connection {}, other {}",
            t.answered, t.pending, t.failed_timeout, t.failed_connection, t.failed_other
        );
    }
    print_spread_g(r);
}

/// The (g) part of [`print_spread`]: cluster rounds, commands per cycle and by shard, and the
/// kept-alive locks.
fn print_spread_g(r: &Results) {
    let Results {
        keep,
        clusters,
        nproc,
        ..
    } = r;
    let Clusters {
        g_single,
        g_cluster,
        g_keep,
        ..
    } = clusters;
    let G {
        gs_work,
        gs_cycles,
        gc_work,
        gc_cycles,
        g_shares,
        k_shares,
        ..
    } = g_figures(r);
    println!(
        "(g) per-round cycles/s: single servers [{}], clusters [{}]",
        list(&g_rates(g_single)),
        list(&g_rates(g_cluster))
    );
    let g_cpu = |r: &[Metered]| {
        let v: Option<Vec<f64>> = r.iter().map(|m| m.round.cpu_per_cycle_us).collect();
        v.map(median)
    };
    if let (Some(s), Some(c)) = (g_cpu(g_single), g_cpu(g_cluster)) {
        println!(
            "(g) client CPU per cycle (median of rounds): single servers {s:.1} µs, clusters {c:.1} µs ({:.2}x)",
            c / s
        );
    }
    println!(
        "(g) Redis commands per cycle, by command: single servers: {}; clusters: {}",
        per_cycle(&gs_work, gs_cycles),
        per_cycle(&gc_work, gc_cycles)
    );
    println!("(g) each node's commands by shard (node 1 · node 2 · node 3): {g_shares}");
    println!("(g) kept-alive locks, each node's commands by shard: {k_shares}");
    if keep.lost > 0 || g_keep.lost > 0 {
        println!(
            "(d), (g) WARNING: kept-alive locks were lost ({} of {} on single servers, acquired in {:.1} s; {} of {} on clusters, acquired in {:.1} s): this process could not extend them in time (is the machine overloaded?), so their commands/s are below the steady rate",
            keep.lost,
            keep.locks,
            keep.acquired_in.as_secs_f64(),
            g_keep.lost,
            g_keep.locks,
            g_keep.acquired_in.as_secs_f64()
        );
    }
    println!(
        "(d), (g) extension rounds per kept-alive lock over the two-TTL window (3 expected): single servers {:.2}, clusters {:.2}",
        keep.extensions_per_lock, g_keep.extensions_per_lock
    );
    println!(
        "(g) these {nproc} cores run the client, the 3 single servers and the 9 shards together: the cluster row shows how evenly the shards share the commands and what routing by slot costs the client, not a speed-up (on their own machines, each shard would bring its own core)"
    );
}

/// A list of figures, one decimal each, space-separated.
fn list(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn print_capacity(r: &Results) {
    let Results {
        keep,
        clusters,
        run,
        measured_for,
        blackhole_connections,
        ..
    } = r;
    let Clusters {
        idle_single,
        idle_shards,
        g_keep,
        saturation,
        ..
    } = clusters;
    let G {
        cs,
        d_per,
        g_per,
        us_single,
        us_shard,
        net_single,
        net_shard,
        ..
    } = g_figures(r);

    let ttl_s = keep.ttl.as_secs_f64();
    println!("(h) capacity inputs, from this run:");
    println!(
        "  - a lock cycle (acquire+release, one key): {cs:.1} Redis commands over the 3 nodes, {:.1} per node",
        cs / 3.0
    );
    println!(
        "  - a held lock with keep-alive (extended every 2/3 of the TTL; 3 nodes x 3 commands per round = 13.5 / TTL in s expected): {d_per:.2} commands/s over the 3 nodes at TTL {ttl_s:.0} s on single servers ({} lost), {g_per:.2} on clusters ({} lost), i.e. {:.1} and {:.1} / TTL in s per node",
        keep.lost,
        g_keep.lost,
        d_per * ttl_s / 3.0,
        g_per * g_keep.ttl.as_secs_f64() / 3.0
    );
    println!(
        "  - redis-server CPU per command under fredlock's traffic in (g), net of idle use: {net_single:.2} µs on a single server, {net_shard:.2} µs on a cluster shard, i.e. {:.0} and {:.0} commands/s per fully busy core (gross: {us_single:.2} and {us_shard:.2} µs; idle: {:.1} ms/s for the 3 single servers, {:.1} ms/s for the 9 shards)",
        1e6 / net_single,
        1e6 / net_shard,
        idle_single * 1e3,
        idle_shards * 1e3
    );
    println!(
        "  - pipelined (the loader): {:.2} µs per command, {:.0} commands/s at {:.0}% of a core, i.e. {:.0} commands/s per fully busy core",
        saturation.cpu_per_command_us,
        saturation.commands_per_second,
        saturation.busy * 100.0,
        1e6 / saturation.cpu_per_command_us
    );
    println!(
        "  - memory per held lock: {:.0} B per node on single servers, {:.0} B per cluster node (keys of {} bytes, 32-character tokens); {} in the holding process",
        keep.server_bytes_per_lock,
        g_keep.server_bytes_per_lock,
        format!("fredlock:{run}:keep:1234").len(),
        keep.bytes_per_lock
            .map_or("n/a".to_string(), |b| format!("{b:.0} B"))
    );
    println!(
        "measured in {:.1} s (blackhole accepted {} connections)",
        measured_for.as_secs_f64(),
        blackhole_connections
    );
}
