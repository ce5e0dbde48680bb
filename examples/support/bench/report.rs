//! The tables, part one: [`Results`] (everything the full run measured), the header, the summary
//! table and the details. Measures nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::load::KeepAliveLoad;
use crate::plan::Plan;
use crate::rounds::{SemaphoreRound, Series, Throughput, SEM_PERMITS, SEM_TASKS};
use crate::runs::{Clusters, Mixed};
use crate::serial;
use crate::support::keepalive::{Sample, Variant};
use crate::support::median;
use crate::support::waiters::Series as WSeries;
use crate::{TASKS, TTL};

/// Everything the full run measured, for the tables.
pub(crate) struct Results {
    pub(crate) nproc: usize,
    pub(crate) redis_version: String,
    pub(crate) date: String,
    pub(crate) git: String,
    pub(crate) command: String,
    pub(crate) where_: String,
    pub(crate) blackhole_connections: usize,
    pub(crate) run: String,
    pub(crate) load_before: String,
    pub(crate) load_after: String,
    pub(crate) measured_for: Duration,
    pub(crate) mixed: Mixed,
    pub(crate) serial: serial::Serial,
    pub(crate) t_floor: Vec<Throughput>,
    pub(crate) t_rslock: Vec<Throughput>,
    pub(crate) t_healthy: Vec<Throughput>,
    pub(crate) sem_rounds: Vec<SemaphoreRound>,
    pub(crate) keep: KeepAliveLoad,
    pub(crate) clusters: Clusters,
    pub(crate) waited: Vec<(&'static str, WSeries)>,
    pub(crate) kept: BTreeMap<&'static str, Vec<Sample>>,
    pub(crate) scaled: Vec<(usize, Series, Series)>,
}

pub(crate) fn yes_no(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}

pub(crate) fn rates(t: &[Throughput]) -> Vec<f64> {
    t.iter().map(|t| t.per_second).collect()
}

pub(crate) fn cpu(t: &[Throughput]) -> Option<f64> {
    let v: Option<Vec<f64>> = t.iter().map(|t| t.cpu_per_cycle_us).collect();
    v.map(median)
}

/// The medians most rows use.
pub(crate) struct Key {
    pub(crate) f50: f64,
    pub(crate) h50: f64,
    pub(crate) f99: f64,
    pub(crate) h99: f64,
    pub(crate) tf: f64,
    pub(crate) th: f64,
    pub(crate) tr: f64,
    pub(crate) r50: f64,
    pub(crate) r99: f64,
    pub(crate) c50: f64,
    pub(crate) c99: f64,
    pub(crate) d50: f64,
    pub(crate) d99: f64,
}

impl Results {
    pub(crate) fn key(&self) -> Key {
        let m = &self.mixed;
        Key {
            f50: m.s_floor.p50(),
            h50: m.s_healthy.p50(),
            f99: m.s_floor.p99(),
            h99: m.s_healthy.p99(),
            tf: median(rates(&self.t_floor)),
            th: median(rates(&self.t_healthy)),
            tr: median(rates(&self.t_rslock)),
            r50: m.s_rslock.p50(),
            r99: m.s_rslock.p99(),
            c50: m.s_silent.p50(),
            c99: m.s_silent.p99(),
            d50: m.s_stalled.p50(),
            d99: m.s_stalled.p99(),
        }
    }
}

pub(crate) fn print_header(r: &Results, plan: &Plan) {
    let Results {
        nproc,
        redis_version,
        date,
        git,
        command,
        where_,
        load_before,
        load_after,
        serial,
        ..
    } = r;

    println!();
    println!("machine: nproc={nproc}, {redis_version}, {date}");
    println!("fredlock {} (git {git})", env!("CARGO_PKG_VERSION"));
    println!("command: `{command}`");
    println!("nodes: {where_}");
    println!(
        "method: TTL {} s; serial: median over {} interleaved rounds of {} cycles per variant \
         (after {} warm-up cycles); throughput: {TASKS} tasks, median over {} interleaved rounds \
         of {} ms per variant ((g) the same, single servers and clusters alternating); kept \
         alive: TTL {} s, measured over two TTLs; loader: {} ms after {} ms of warm-up",
        TTL.as_secs(),
        plan.rounds,
        plan.cycles,
        plan.warmup_cycles,
        plan.throughput_rounds,
        plan.throughput_round.as_millis(),
        plan.keep_ttl.as_secs(),
        plan.saturation.as_millis(),
        (plan.saturation / 5).as_millis()
    );
    println!();
    // Issue 11's table: fredlock against rslock and the raw floor, all from this run.
    println!("load average (1, 5, 15 min): before {load_before}; after {load_after}");
    println!();
    serial.print(plan.rounds, plan.cycles);
}

pub(crate) fn print_summary(r: &Results, plan: &Plan) {
    let Key {
        f50,
        h50,
        tf,
        th,
        tr,
        r50,
        c50,
        ..
    } = r.key();
    let Results {
        waited,
        kept: _,
        scaled: _,
        ..
    } = r;

    println!("| workload | raw fred floor | rslock 0.10 | fredlock | fredlock / rslock | fredlock / floor | target | met? |");
    println!("|---|---:|---:|---:|---:|---:|---|---|");
    println!(
        "| serial acquire+release p50, µs | {f50:.1} | {r50:.1} | {h50:.1} | {:.3} | {:.3} | ≤ 0.9x rslock | {} |",
        h50 / r50,
        h50 / f50,
        yes_no(h50 / r50 <= 0.9)
    );
    let (tn, node_name) = r.serial.best_node_throughput();
    let best = crate::best_of(&[tf, tr, tn]);
    println!(
        "| {TASKS} tasks, own keys, cycles/s ({node_name}, the faster Node library, in its own process after the serial rounds: {tn:.0}) | {tf:.0} | {tr:.0} | {th:.0} | {:.3} | {:.3} | ≥ 1.2x the best of rslock, the floor and the Node libraries ({:.3}) | {} |",
        th / tr,
        th / tf,
        th / best,
        yes_no(th / best >= 1.2)
    );
    let w = |name: &str| {
        waited
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s)
            .expect("a waiter variant")
    };
    let (w_poll, w_wake, w_rs, w_mutex) = (
        w("fredlock, polling"),
        w("fredlock, woken by release"),
        w("rslock 0.10"),
        w("in-process tokio Mutex (ceiling, no Redis)"),
    );
    let rate = |s: &WSeries| s.median(|r| r.per_second);
    let cmds = |s: &WSeries| s.median(|r| r.commands_per_acquisition);
    println!(
        "| 16 waiters on one key, 1 ms hold (precise), acquisitions/s (retry 5 ms + 5 ms jitter; rslock: 0-10 ms): fredlock woken by release (polling: {:.0}; in-process mutex ceiling: {:.0}) | — | {:.0} | {:.0} | {:.3} | — | ≥ 1.5x the best peer | {} |",
        rate(w_poll),
        rate(w_mutex),
        rate(w_rs),
        rate(w_wake),
        rate(w_wake) / rate(w_rs),
        yes_no(rate(w_wake) / rate(w_rs) >= 1.5)
    );
    println!(
        "| the same: Redis commands per acquisition (INFO commandstats; polling: {:.1}) | — | {:.1} | {:.1} | {:.3} | — | ≤ 0.5x the thriftiest peer | {} |",
        cmds(w_poll),
        cmds(w_rs),
        cmds(w_wake),
        cmds(w_wake) / cmds(w_rs),
        yes_no(cmds(w_wake) / cmds(w_rs) <= 0.5)
    );
    let waits = |s: &WSeries| {
        format!(
            "{:.1} / {:.1} / {:.0}",
            s.median(|r| r.p50_us) / 1e3,
            s.median(|r| r.p99_us) / 1e3,
            s.max(|r| r.max_us) / 1e3
        )
    };
    println!(
        "| the same: wait per acquisition p50 / p99 / max, ms (polling: {}; mutex: {}) | — | {} | {} | — | — | — | — |",
        waits(w_poll),
        waits(w_mutex),
        waits(w_rs),
        waits(w_wake)
    );
    println!(
        "| 1 of 3 nodes never answers (a blackhole; node timeout 500 ms), p50, µs (ratio: against healthy fredlock) | — | — | {c50:.1} | — | {:.3} | ≤ 1.5x healthy | {} |",
        c50 / h50,
        yes_no(c50 / h50 <= 1.5)
    );
    print_summary_kept(r, plan);
}

/// The summary's keep-alive rows and the N = 3, 5, 7 rows.
pub(crate) fn print_summary_kept(r: &Results, plan: &Plan) {
    let Results { kept, scaled, .. } = r;
    let k = |v: Variant, f: &dyn Fn(&Sample) -> f64| {
        median(
            kept.get(v.name())
                .map_or(Vec::new(), |s| s.iter().map(f).collect()),
        )
    };
    let k_lost: u64 = kept.values().flatten().map(|s| s.lost).sum();
    let per_lock_scripts = |v: Variant| k(v, &|s| s.scripts_per_s) / plan.keepalive_locks as f64;
    println!(
        "| batched keep-alive, {} locks (TTL {} s): client→node script calls/s per held lock (a task per lock: {:.4}) | — | — | {:.5} | — | — | ≥ 10x fewer than a task per lock | {} ({:.0}x) |",
        plan.keepalive_locks,
        plan.keepalive_ttl.as_secs_f64(),
        per_lock_scripts(Variant::PerLock),
        per_lock_scripts(Variant::Batched),
        yes_no(per_lock_scripts(Variant::PerLock) / per_lock_scripts(Variant::Batched) >= 10.0),
        per_lock_scripts(Variant::PerLock) / per_lock_scripts(Variant::Batched)
    );
    let node_cpu = |v: Variant| k(v, &|s| s.node_cpu);
    println!(
        "| the same: node CPU s per held lock per minute, 3 nodes (a task per lock: {:.6}) | — | — | {:.6} | — | — | ≥ 2x less | {} ({:.2}x) |",
        node_cpu(Variant::PerLock),
        node_cpu(Variant::Batched),
        yes_no(node_cpu(Variant::PerLock) / node_cpu(Variant::Batched) >= 2.0),
        node_cpu(Variant::PerLock) / node_cpu(Variant::Batched)
    );
    let (heap, rss) = (
        k(Variant::Batched, &|s| s.heap_per_lock),
        k(Variant::Batched, &|s| s.rss_per_lock),
    );
    println!(
        "| the same: memory per held lock, live heap (RSS: {rss:.0} B; a task per lock: {:.0} B heap; {k_lost} locks lost) | — | — | {heap:.0} B | — | — | ≤ 1 KB | {} |",
        k(Variant::PerLock, &|s| s.heap_per_lock),
        yes_no(heap <= 1024.0 && k_lost == 0)
    );
    for (n, floor, fredlock) in scaled {
        let (f, l) = (floor.p50(), fredlock.p50());
        println!(
            "| N = {n}: serial acquire+release p50, µs | {f:.1} | — | {l:.1} | — | {:.3} | ≤ 1.0x the floor | {} |",
            l / f,
            yes_no(l / f <= 1.0)
        );
    }
}

pub(crate) fn print_details(r: &Results) {
    let Key {
        f50,
        h50,
        f99,
        h99,
        tf,
        th,
        tr,
        r50,
        r99,
        c50,
        c99,
        d50,
        d99,
    } = r.key();
    let Results {
        mixed, sem_rounds, ..
    } = r;
    let s_fenced = &mixed.s_fenced;

    println!();
    println!("Details (the earlier rows (a)-(h)):");
    println!();
    println!("| measurement | baseline | fredlock | ratio | target | met? |");
    println!("|---|---:|---:|---:|---|---|");
    println!(
        "| (a) serial acquire+release p50, µs (baseline: raw fred floor) | {f50:.1} | {h50:.1} | {:.3} | ≤ 1.05 | {} |",
        h50 / f50,
        yes_no(h50 / f50 <= 1.05)
    );
    println!(
        "| (a) serial acquire+release p99, µs (baseline: raw fred floor) | {f99:.1} | {h99:.1} | {:.3} | — | — |",
        h99 / f99
    );
    println!(
        "| (a) serial acquire+release p50, µs (baseline: rslock 0.10) | {r50:.1} | {h50:.1} | {:.3} | ≤ 0.9 | {} |",
        h50 / r50,
        yes_no(h50 / r50 <= 0.9)
    );
    println!(
        "| (a) serial acquire+release p99, µs (baseline: rslock 0.10) | {r99:.1} | {h99:.1} | {:.3} | — | — |",
        h99 / r99
    );
    println!(
        "| (b) {TASKS} tasks, own keys: cycles/s (baseline: rslock 0.10) | {tr:.0} | {th:.0} | {:.3} | ≥ 1.2 | {} |",
        th / tr,
        yes_no(th / tr >= 1.2)
    );
    println!(
        "| (b) {TASKS} tasks, own keys: cycles/s (baseline: raw fred floor) | {tf:.0} | {th:.0} | {:.3} | ≥ 0.95 | {} |",
        th / tf,
        yes_no(th / tf >= 0.95)
    );
    println!(
        "| (c) 1 of 3 nodes a blackhole, node timeout 500 ms: p50, µs (baseline: healthy fredlock) | {h50:.1} | {c50:.1} | {:.3} | ≤ 1.5 | {} |",
        c50 / h50,
        yes_no(c50 / h50 <= 1.5)
    );
    println!(
        "| (c) 1 of 3 nodes a blackhole: p99, µs (baseline: healthy fredlock) | {h99:.1} | {c99:.1} | {:.3} | — | — |",
        c99 / h99
    );
    println!(
        "| (c') 1 of 3 nodes silent after connecting, node timeout 500 ms: p50, µs (baseline: healthy fredlock) | {h50:.1} | {d50:.1} | {:.3} | ≤ 1.5 | {} |",
        d50 / h50,
        yes_no(d50 / h50 <= 1.5)
    );
    println!(
        "| (c') 1 of 3 nodes silent after connecting: p99, µs (baseline: healthy fredlock) | {h99:.1} | {d99:.1} | {:.3} | — | — |",
        d99 / h99
    );
    let (e50, e99) = (s_fenced.p50(), s_fenced.p99());
    println!(
        "| (e) serial acquire+release p50 with fencing tokens, µs (baseline: fredlock without) | {h50:.1} | {e50:.1} | {:.3} | — | — |",
        e50 / h50
    );
    println!(
        "| (e) serial acquire+release p99 with fencing tokens, µs (baseline: fredlock without) | {h99:.1} | {e99:.1} | {:.3} | — | — |",
        e99 / h99
    );
    let sem_rate = median(sem_rounds.iter().map(|r| r.per_second).collect());
    let sem_cmds = median(
        sem_rounds
            .iter()
            .map(|r| r.commands_per_acquisition)
            .collect(),
    );
    println!(
        "| (f) semaphore, {SEM_PERMITS} permits, {SEM_TASKS} contenders, 1 ms hold: acquisitions/s (Redis commands per acquisition: {sem_cmds:.1}) | — | {sem_rate:.0} | — | — | {} over permits |",
        sem_rounds.iter().map(|r| r.over_permits).sum::<u64>()
    );
}
