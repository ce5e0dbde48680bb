//! Plain locks with and without Lua, side by side on 3 local Valkey nodes.
//!
//! ```text
//! make valkey-server && cargo run --release --example bench_valkey [-- --quick]
//! ```
//!
//! One serial cycle = acquire + extend + release of one lock (TTL 10 s). Three Redlocks over the
//! same 3 `valkey-server` nodes, each through its own ACL user:
//! - `scripts`: a user allowed everything but `DELIFEQ`, so fredlock releases and extends with
//!   its Lua scripts everywhere (what it does on a server without `DELIFEQ`);
//! - `native`: a user allowed everything: `DELIFEQ` and `SET ... IFEQ` on the nodes, except the
//!   lock's gate node (the node keeping its wait line), which takes its line scripts;
//! - `no-lua`: a user without scripting (`+@all -@scripting`): `DELIFEQ` and `SET ... IFEQ` on
//!   every node, and no wait line (waiters would poll).
//!
//! Reported per variant: the cycle's latency (p50, p99; the median over rounds of each round's
//! percentile), the server CPU per cycle (`used_cpu_sys + used_cpu_user` of `INFO cpu`, summed
//! over the 3 nodes, before and after each block of cycles, divided by the cycles; the `INFO`
//! calls themselves are included, 6 per block), and the commands each node ran per cycle
//! (`INFO commandstats` after `CONFIG RESETSTAT`, a separate run of each variant alone).
//! The variants take turns in blocks of cycles within each round, so a change in the machine's
//! load falls on all of them alike.

use std::time::{Duration, Instant};

use fredlock::{Redlock, Retry};
use fredlock_testkit::{LocalNodes, RespValue, Server};

const PASSWORD: &str = "bench-valkey-1";
const TTL: Duration = Duration::from_secs(10);

struct Variant {
    name: &'static str,
    rule: &'static [&'static str],
    redlock: Option<Redlock>,
    samples: Vec<Vec<Duration>>,
    cpu_us: f64,
    cycles: u64,
}

fn text(reply: RespValue) -> String {
    match reply {
        RespValue::Bulk(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
        other => format!("{other:?}"),
    }
}

/// Server CPU (user + sys, in µs) of every node.
async fn server_cpu_us(nodes: &LocalNodes) -> f64 {
    let mut total = 0.0;
    for i in 0..nodes.len() {
        let info = text(nodes.command(i, &["INFO", "cpu"]).await.expect("INFO cpu"));
        for field in ["used_cpu_sys:", "used_cpu_user:"] {
            let v: f64 = info
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse().ok())
                .expect("cpu field");
            total += v * 1e6;
        }
    }
    total
}

async fn cycle(redlock: &Redlock, resource: &str) {
    let mut lock = redlock.acquire(resource, TTL).await.expect("acquire");
    lock.extend(TTL).await.expect("extend");
    lock.release().await.expect("release");
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Commands per cycle on each node (`cmdstat_x:calls=`), from one variant run alone.
async fn commands_per_cycle(nodes: &LocalNodes, redlock: &Redlock, resource: &str) -> String {
    const N: u64 = 200;
    for i in 0..nodes.len() {
        nodes
            .command(i, &["CONFIG", "RESETSTAT"])
            .await
            .expect("RESETSTAT");
    }
    for _ in 0..N {
        cycle(redlock, resource).await;
    }
    let mut out = Vec::new();
    for i in 0..nodes.len() {
        let stats = text(
            nodes
                .command(i, &["INFO", "commandstats"])
                .await
                .expect("stats"),
        );
        let mut parts = Vec::new();
        for line in stats.lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, tail)) = rest.split_once(":calls=") else {
                continue;
            };
            let calls: u64 = tail
                .split(',')
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            if ["info", "config|resetstat", "ping", "client|id"].contains(&name) {
                continue;
            }
            parts.push(format!("{name} {:.2}", calls as f64 / N as f64));
        }
        parts.sort();
        out.push(format!("node {i}: {}", parts.join(", ")));
    }
    out.join("; ")
}

impl Variant {
    fn new(name: &'static str, rule: &'static [&'static str]) -> Variant {
        Variant {
            name,
            rule,
            redlock: None,
            samples: Vec::new(),
            cpu_us: 0.0,
            cycles: 0,
        }
    }
}

async fn run(quick: bool) {
    let nodes = LocalNodes::start_on(Server::Valkey, 3)
        .await
        .expect("valkey-server nodes (make valkey-server)");
    let mut variants = vec![
        Variant::new("scripts (user -delifeq)", &["+@all", "-delifeq"]),
        Variant::new("native where possible (scripts allowed)", &["+@all"]),
        Variant::new(
            "no Lua at all (user -@scripting)",
            &["+@all", "-@scripting"],
        ),
    ];
    connect(&nodes, &mut variants).await;
    let (rounds, block, blocks) = if quick { (3, 100, 4) } else { (7, 200, 10) };
    measure(&nodes, &mut variants, rounds, blocks, block).await;
    println!(
        "Valkey 9.1.2, 3 local nodes, serial acquire+extend+release, {rounds} rounds x {blocks} blocks x {block} cycles per variant (interleaved):\n"
    );
    print_latency(&variants);
    println!("\nCommands per cycle (each variant alone, CONFIG RESETSTAT first):");
    for v in &variants {
        let redlock = v.redlock.as_ref().expect("built");
        println!(
            "- {}: {}",
            v.name,
            commands_per_cycle(&nodes, redlock, v.name).await
        );
    }
    for v in &variants {
        if let Some(r) = &v.redlock {
            r.close().await;
        }
    }
}

/// One ACL user per variant on every node, with the variant's rule, and its Redlock.
async fn connect(nodes: &LocalNodes, variants: &mut [Variant]) {
    for (v, variant) in variants.iter_mut().enumerate() {
        let user = format!("bench{v}");
        let password = format!(">{PASSWORD}");
        for i in 0..nodes.len() {
            let mut args = vec!["ACL", "SETUSER", &user, "on", &password, "~*", "&*"];
            args.extend_from_slice(variant.rule);
            nodes.command(i, &args).await.expect("ACL SETUSER");
        }
        let urls: Vec<String> = (0..nodes.len())
            .map(|i| format!("redis://{user}:{PASSWORD}@127.0.0.1:{}", nodes.port(i)))
            .collect();
        let redlock = Redlock::builder()
            .nodes(urls)
            .retry(Retry::once())
            .require_quorum(true)
            .build()
            .await
            .expect("build");
        variant.redlock = Some(redlock);
    }
}

/// A warm-up, then `rounds` rounds of `blocks` blocks of `block` cycles per variant, the
/// variants taking turns block by block; the servers' CPU is read around every block.
async fn measure(
    nodes: &LocalNodes,
    variants: &mut [Variant],
    rounds: usize,
    blocks: usize,
    block: u64,
) {
    // Warm-up: connections, scripts cached, allocator.
    for v in variants.iter() {
        let redlock = v.redlock.as_ref().expect("built");
        for _ in 0..300 {
            cycle(redlock, v.name).await;
        }
    }
    for _ in 0..rounds {
        let mut round: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
        for _ in 0..blocks {
            for (v, variant) in variants.iter_mut().enumerate() {
                let redlock = variant.redlock.as_ref().expect("built");
                let before = server_cpu_us(nodes).await;
                for _ in 0..block {
                    let t = Instant::now();
                    cycle(redlock, variant.name).await;
                    round[v].push(t.elapsed());
                }
                variant.cpu_us += server_cpu_us(nodes).await - before;
                variant.cycles += block;
            }
        }
        for (v, samples) in round.into_iter().enumerate() {
            variants[v].samples.push(samples);
        }
    }
}

/// The latency table: median across rounds of each round's p50 and p99, and server CPU.
fn print_latency(variants: &[Variant]) {
    println!("| path | p50 | p99 | server CPU per cycle (3 nodes) |");
    println!("|---|---|---|---|");
    for v in variants {
        let mut p50 = Vec::new();
        let mut p99 = Vec::new();
        for s in &v.samples {
            let mut s = s.clone();
            s.sort();
            p50.push(percentile(&s, 0.50));
            p99.push(percentile(&s, 0.99));
        }
        println!(
            "| {} | {:.0} us | {:.0} us | {:.1} us |",
            v.name,
            median(p50).as_secs_f64() * 1e6,
            median(p99).as_secs_f64() * 1e6,
            v.cpu_us / v.cycles as f64
        );
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // Measured in a spawned task, as a request handler would run.
    rt.block_on(async { tokio::spawn(run(quick)).await.expect("bench") });
}
