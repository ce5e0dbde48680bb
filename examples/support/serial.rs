//! `bench`'s serial rows on both tokio runtimes: one acquire+release of one lock at a time on
//! the 3 nodes, p50, for the raw fred floor, fredlock and rslock on tokio's default multi-thread
//! runtime (this process's) and on a current-thread runtime (a thread of its own with its own
//! clients), plus node-redlock (a child `node` process, see `node_redlock`), all in one run.
//!
//! Method: every variant runs blocks of [`BLOCK`](crate::rounds::BLOCK) cycles in turn, in a rotating
//! order, so a change in the machine's load falls on all of them alike; a round's p50 is taken
//! per variant, and the table shows the median over rounds, with each ratio against the floor
//! of the same runtime and run. Included by `bench` only (it uses `bench`'s targets).

use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use crate::support::median;
use crate::support::node_redlock::{NodeLib, NodeRedlock};
use crate::targets::{Floor, Names, Target};

/// Which runtime a variant runs on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Runtime {
    Multi,
    Current,
}

/// The three Rust targets, in this order on both runtimes.
const RUST: [&str; 3] = ["raw fred floor", "fredlock", "rslock 0.10"];

/// A block of cycles for the current-thread runtime's thread.
struct Job {
    target: usize,
    cycles: usize,
    reply: oneshot::Sender<Vec<u64>>,
}

/// The floor, fredlock and rslock on a current-thread runtime in a thread of their own (fred
/// clients must live on the runtime that runs their router tasks).
struct CurrentThread {
    jobs: mpsc::UnboundedSender<Job>,
    thread: std::thread::JoinHandle<()>,
}

impl CurrentThread {
    async fn start(urls: Vec<String>, resource: String) -> CurrentThread {
        let (jobs, mut rx) = mpsc::unbounded_channel::<Job>();
        let (ready_tx, ready) = oneshot::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a current-thread tokio runtime");
            rt.block_on(async move {
                let targets = rust_targets(&urls).await;
                let names = Names::new(resource);
                let _ = ready_tx.send(());
                while let Some(job) = rx.recv().await {
                    let target = targets[job.target].clone();
                    let names = names.clone();
                    // A task of its own, as a request handler would run.
                    let work =
                        tokio::spawn(async move { timed(&target, &names, job.cycles).await });
                    let _ = job
                        .reply
                        .send(work.await.expect("a current-thread block panicked"));
                }
            });
        });
        ready.await.expect("the current-thread runtime started");
        CurrentThread { jobs, thread }
    }

    async fn block(&self, target: usize, cycles: usize) -> Vec<u64> {
        let (reply, rx) = oneshot::channel();
        self.jobs
            .send(Job {
                target,
                cycles,
                reply,
            })
            .expect("the current-thread runtime is running");
        rx.await.expect("the current-thread runtime answered")
    }

    fn stop(self) {
        drop(self.jobs);
        let _ = self.thread.join();
    }
}

/// Floor, fredlock, rslock (the order of [`RUST`]) on the runtime this runs on.
async fn rust_targets(urls: &[String]) -> Vec<Target> {
    let floor = Target::Floor(std::sync::Arc::new(Floor::connect(urls).await));
    let fredlock = Target::Fredlock(crate::targets::redlock(urls.to_vec(), None).await);
    let mut manager = rslock::LockManager::new(urls.to_vec());
    manager.set_retry(3, std::time::Duration::from_millis(5));
    let rslock = Target::Rslock(std::sync::Arc::new(manager));
    vec![floor, fredlock, rslock]
}

/// `cycles` serial cycles: each one's duration in nanoseconds.
async fn timed(target: &Target, names: &Names, cycles: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        let start = Instant::now();
        target.cycle(names).await;
        out.push(start.elapsed().as_nanos() as u64);
    }
    out
}

fn p50_us(mut ns: Vec<u64>) -> f64 {
    ns.sort_unstable();
    ns.get(ns.len() / 2)
        .map_or(f64::NAN, |v| *v as f64 / 1_000.0)
}

/// The Node libraries, in the order of their variants (6, 7) and columns.
const NODE_LIBS: [NodeLib; 2] = [NodeLib::Redlock, NodeLib::Universal];

/// The measured p50s (µs) per round: `rust[runtime][target]`, and each Node library's.
pub struct Serial {
    rust: [[Vec<f64>; 3]; 2],
    node: [Vec<f64>; 2],
    /// Why a Node library has no figure, when it has none; else `node --version`.
    node_note: [Result<String, String>; 2],
    load_before: String,
    load_after: String,
    /// Commands per uncontended cycle on each node: the floor's and fredlock's.
    commands: Option<[Vec<NodeCycle>; 2]>,
    /// Each Node library's cycles/s with [`TASKS`](crate::TASKS) concurrent loops on their own
    /// keys, per round.
    node_tput: [Vec<f64>; 2],
}

/// Calls per cycle of each command on one node.
type Calls = std::collections::BTreeMap<String, f64>;

/// What one node did per uncontended cycle: its commands, and its CPU time (INFO cpu, user and
/// system) in µs.
#[derive(Default)]
struct NodeCycle {
    calls: Calls,
    cpu_us: f64,
}

/// Cycles measured for the commands per cycle.
const COMMAND_CYCLES: usize = 1000;

/// The `host:port` of a `redis://` URL without credentials, when it is an IP address.
fn socket_addr(url: &str) -> Option<std::net::SocketAddr> {
    let rest = url.strip_prefix("redis://")?;
    rest.split('/').next()?.parse().ok()
}

/// What each node ran per serial cycle of the floor, then of fredlock, after a warm-up (INFO
/// commandstats, which counts the calls inside scripts too; the bench's own INFO and CONFIG left
/// out): `None` when a node is not a plain `redis://IP:port` this process can read directly.
async fn commands_per_cycle(urls: &[String], run: &str) -> Option<[Vec<NodeCycle>; 2]> {
    let servers: Vec<crate::servers::Server> = urls
        .iter()
        .map(|u| socket_addr(u).map(|addr| crate::servers::Server { addr }))
        .collect::<Option<_>>()?;
    let targets = rust_targets(urls).await;
    let names = Names::new(format!("{run}:serial-commands"));
    let mut out: [Vec<NodeCycle>; 2] = Default::default();
    for (t, per_node) in out.iter_mut().enumerate() {
        // Warm-up: a connection's first release sends the script whole; that is not measured.
        timed(&targets[t], &names, 50).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let before = crate::servers::Snapshot::take(&servers).await;
        timed(&targets[t], &names, COMMAND_CYCLES).await;
        // The release a cycle does not wait for (the third node's) lands meanwhile.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let after = crate::servers::Snapshot::take(&servers).await;
        for (i, (b, a)) in before.calls.iter().zip(&after.calls).enumerate() {
            let calls: Calls = a
                .iter()
                .map(|(name, n)| {
                    let d = n.saturating_sub(b.get(name).copied().unwrap_or(0));
                    (name.clone(), d as f64 / COMMAND_CYCLES as f64)
                })
                .filter(|(_, n)| *n > 0.0)
                .collect();
            let cpu = after.cpu[i].saturating_sub(before.cpu[i]);
            let cpu_us = cpu.as_secs_f64() * 1e6 / COMMAND_CYCLES as f64;
            per_node.push(NodeCycle { calls, cpu_us });
        }
    }
    Some(out)
}

/// "set 1.00, evalsha 1.00 (2.00)": calls per cycle of each command, and their sum.
fn calls_text(calls: &Calls) -> String {
    let list: Vec<String> = calls.iter().map(|(n, c)| format!("{n} {c:.2}")).collect();
    format!("{} ({:.2})", list.join(", "), calls.values().sum::<f64>())
}

/// Everything the rounds run on.
struct Variants {
    multi: Vec<Target>,
    current: CurrentThread,
    node: [Option<NodeRedlock>; 2],
    multi_names: Names,
    node_key: String,
}

impl Variants {
    /// One block of variant `v` (0-2: multi-thread targets, 3-5: current-thread, 6-7: Node).
    async fn block(&mut self, v: usize, cycles: usize) -> Option<Vec<u64>> {
        match v {
            0..=2 => {
                let (target, names) = (self.multi[v].clone(), self.multi_names.clone());
                Some(
                    crate::rounds::spawn_and_wait(
                        async move { timed(&target, &names, cycles).await },
                    )
                    .await,
                )
            }
            3..=5 => Some(self.current.block(v - 3, cycles).await),
            _ => match self.node.get_mut(v - 6).and_then(Option::as_mut) {
                Some(node) => Some(node.block(cycles, &format!("{}{v}", self.node_key)).await),
                None => None,
            },
        }
    }
}

/// One round of `cycles` cycles per variant, in rotating blocks: each variant's p50 (µs).
async fn round(variants: &mut Variants, cycles: usize) -> Vec<Option<f64>> {
    const N: usize = 8;
    let mut samples: Vec<Option<Vec<u64>>> = vec![Some(Vec::new()); N];
    let mut done = 0;
    for block in 0.. {
        if done >= cycles {
            break;
        }
        let size = crate::rounds::BLOCK.min(cycles - done);
        for k in 0..N {
            let v = (block + k) % N;
            match variants.block(v, size).await {
                Some(ns) => {
                    if let Some(s) = samples[v].as_mut() {
                        s.extend(ns);
                    }
                }
                None => samples[v] = None,
            }
        }
        done += size;
    }
    samples.into_iter().map(|s| s.map(p50_us)).collect()
}

/// Measures the serial rows (`plan`'s warm-up cycles per variant, then its rounds of its cycles
/// each), then the Node libraries under the (b) load in `plan`'s throughput rounds.
pub async fn measure(urls: &[String], run: &str, plan: &crate::plan::Plan) -> Serial {
    let (warmup, rounds, cycles) = (plan.warmup_cycles, plan.rounds, plan.cycles);
    let tput = (plan.throughput_rounds, plan.throughput_round);
    let mut node = [None, None];
    let mut node_note = [Err(String::new()), Err(String::new())];
    for (i, lib) in NODE_LIBS.into_iter().enumerate() {
        match NodeRedlock::start(urls, lib).await {
            Ok(n) => {
                node_note[i] = Ok(n.version.clone());
                node[i] = Some(n);
            }
            Err(why) => {
                eprintln!("bench: {} skipped: {why}", lib.name());
                node_note[i] = Err(why);
            }
        }
    }
    let mut variants = Variants {
        multi: rust_targets(urls).await,
        current: CurrentThread::start(urls.to_vec(), format!("{run}:serial-ct")).await,
        node,
        multi_names: Names::new(format!("{run}:serial-mt")),
        node_key: format!("{run}:serial-node"),
    };
    let load_before = crate::support::loadavg();
    round(&mut variants, warmup).await;
    let mut serial = Serial {
        rust: Default::default(),
        node: Default::default(),
        node_note,
        load_before,
        load_after: String::new(),
        commands: None,
        node_tput: Default::default(),
    };
    for _ in 0..rounds {
        let p50s = round(&mut variants, cycles).await;
        for (v, p) in p50s.into_iter().enumerate() {
            match (v, p) {
                (0..=5, Some(p)) => serial.rust[v / 3][v % 3].push(p),
                (6..=7, Some(p)) => serial.node[v - 6].push(p),
                _ => {}
            }
        }
    }
    serial.load_after = crate::support::loadavg();
    serial.node_tput = node_throughput(&mut variants.node, run, tput).await;
    serial.commands = commands_per_cycle(urls, run).await;
    for node in variants.node.iter_mut().filter_map(Option::take) {
        node.stop().await;
    }
    variants.current.stop();
    serial
}

/// The (b) load on each Node library: [`TASKS`](crate::TASKS) concurrent loops on their own
/// keys, `rounds` rounds of `window` each after a warm-up round, the libraries taking turns.
async fn node_throughput(
    node: &mut [Option<NodeRedlock>; 2],
    run: &str,
    (rounds, window): (usize, std::time::Duration),
) -> [Vec<f64>; 2] {
    let mut out: [Vec<f64>; 2] = Default::default();
    for round in 0..=rounds {
        for i in [round % 2, 1 - round % 2] {
            let Some(lib) = node[i].as_mut() else {
                continue;
            };
            let rate = lib
                .throughput(crate::TASKS, window, &format!("{run}:tput-node{i}"))
                .await;
            // Round 0 warms up (connections, the JIT, one lock object per key).
            if round > 0 {
                out[i].push(rate);
            }
        }
    }
    out
}

impl Serial {
    /// The best Node library's median cycles/s under the (b) load (`NaN` without a figure),
    /// and its name.
    pub fn best_node_throughput(&self) -> (f64, &'static str) {
        NODE_LIBS
            .iter()
            .zip(&self.node_tput)
            .filter(|(_, v)| !v.is_empty())
            .map(|(lib, v)| (median(v.clone()), lib.name()))
            .fold((f64::NAN, "no Node library"), |best, x| {
                if best.0.is_nan() || x.0 > best.0 {
                    x
                } else {
                    best
                }
            })
    }

    fn p50(&self, rt: Runtime, target: usize) -> f64 {
        median(self.rust[rt as usize][target].clone())
    }

    /// Prints the table (markdown) and the per-round figures under it.
    pub fn print(&self, rounds: usize, cycles: usize) {
        let yes_no = |ok: bool| if ok { "yes" } else { "**no**" };
        // Each Node library's p50 (NaN without a figure), and the best of them.
        let node: Vec<f64> = self.node.iter().map(|v| median(v.clone())).collect();
        let best_node = node
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .fold(f64::NAN, f64::min);
        let cell = |x: f64| {
            if x.is_finite() {
                format!("{x:.1}")
            } else {
                "—".to_string()
            }
        };
        let notes: Vec<String> = NODE_LIBS
            .iter()
            .zip(&self.node_note)
            .map(|(lib, note)| match note {
                Ok(v) => format!("{} on ioredis 5, node {v}", lib.name()),
                Err(why) => format!("{}: skipped ({why})", lib.name()),
            })
            .collect();
        println!(
            "Serial acquire+release of one lock, 3 nodes: p50, µs (median of {rounds} rounds of {cycles} cycles per variant, interleaved in blocks of {}; the Node libraries each in a child process with its own event loop: {}; load average before {}, after {})",
            crate::rounds::BLOCK,
            notes.join(", "),
            self.load_before,
            self.load_after
        );
        println!();
        println!("| tokio runtime | raw fred floor (2 of 3) | fredlock | fredlock / floor | rslock 0.10 | rslock / floor | {} | {} | fredlock / best Node | target | met? |", NODE_LIBS[0].name(), NODE_LIBS[1].name());
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
        for (rt, name) in [
            (Runtime::Multi, "multi-thread (default)"),
            (Runtime::Current, "current-thread"),
        ] {
            let (f, l, r) = (self.p50(rt, 0), self.p50(rt, 1), self.p50(rt, 2));
            let (target, met) = match rt {
                Runtime::Multi => ("≤ 1.10x floor", l / f <= 1.10),
                Runtime::Current => (
                    "≤ 1.10x floor, ≤ 1.0x the best Node library",
                    l / f <= 1.10 && (best_node.is_nan() || l / best_node <= 1.0),
                ),
            };
            let vs_node = if best_node.is_finite() {
                format!("{:.3}", l / best_node)
            } else {
                "—".to_string()
            };
            println!(
                "| {name} | {f:.1} | {l:.1} | {:.3} | {r:.1} | {:.3} | {} | {} | {vs_node} | {target} | {} |",
                l / f,
                r / f,
                cell(node[0]),
                cell(node[1]),
                yes_no(met)
            );
        }
        println!();
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        for (rt, name) in [
            (Runtime::Multi, "multi-thread"),
            (Runtime::Current, "current-thread"),
        ] {
            let per = &self.rust[rt as usize];
            println!(
                "serial per-round p50 (µs), {name}: {} [{}], {} [{}], {} [{}]",
                RUST[0],
                list(&per[0]),
                RUST[1],
                list(&per[1]),
                RUST[2],
                list(&per[2])
            );
        }
        self.print_commands();
        for (lib, v) in NODE_LIBS.iter().zip(&self.node) {
            if !v.is_empty() {
                println!("serial per-round p50 (µs), {}: [{}]", lib.name(), list(v));
            }
        }
        self.print_node_throughput();
        println!();
    }
}

impl Serial {
    /// Each Node library's cycles/s under the (b) load: the median and every round.
    fn print_node_throughput(&self) {
        for (lib, v) in NODE_LIBS.iter().zip(&self.node_tput) {
            if !v.is_empty() {
                let rates: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
                println!(
                    "{} tasks on their own keys, {} (one event loop, {} concurrent loops; rounds alternating with the other Node library, after the serial rounds): median {:.0} cycles/s, per round [{}]",
                    crate::TASKS,
                    lib.name(),
                    crate::TASKS,
                    median(v.clone()),
                    rates.join(" ")
                );
            }
        }
    }

    /// The commands per uncontended cycle on each node, floor beside fredlock, and the target.
    fn print_commands(&self) {
        let Some([floor, fredlock]) = &self.commands else {
            println!("commands per uncontended cycle: not measured (nodes not readable directly)");
            return;
        };
        println!(
            "Commands per uncontended cycle on each node (INFO commandstats over {COMMAND_CYCLES} serial cycles after a warm-up; calls inside scripts counted; each node's CPU time from INFO cpu, user and system, over the same cycles):"
        );
        println!();
        println!(
            "| node | raw fred floor | fredlock | server CPU µs per cycle, floor / fredlock |"
        );
        println!("|---|---|---|---:|");
        for (i, (f, l)) in floor.iter().zip(fredlock).enumerate() {
            println!(
                "| {i} | {} | {} | {:.1} / {:.1} |",
                calls_text(&f.calls),
                calls_text(&l.calls),
                f.cpu_us,
                l.cpu_us
            );
        }
        let total = |c: &NodeCycle| c.calls.values().sum::<f64>();
        // Allow for a stray command of the bench's own over 1000 cycles.
        let fewer = floor
            .iter()
            .zip(fredlock)
            .all(|(f, l)| total(l) <= total(f) + 0.01);
        let no_eval = fredlock
            .iter()
            .all(|l| l.calls.get("eval").copied().unwrap_or(0.0) < 0.01);
        println!();
        println!(
            "target: no more commands per node than the floor, no EVAL after warm-up: {}",
            if fewer && no_eval {
                "met"
            } else {
                "**not met**"
            }
        );
        println!();
    }
}
