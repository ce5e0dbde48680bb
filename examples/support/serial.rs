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
use crate::support::node_redlock::NodeRedlock;
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

/// The measured p50s (µs) per round: `rust[runtime][target]`, and node-redlock's.
pub struct Serial {
    rust: [[Vec<f64>; 3]; 2],
    node: Vec<f64>,
    /// Why node-redlock has no figure, when it has none; else `node --version`.
    node_note: Result<String, String>,
    load_before: String,
    load_after: String,
}

/// Everything the rounds run on.
struct Variants {
    multi: Vec<Target>,
    current: CurrentThread,
    node: Option<NodeRedlock>,
    multi_names: Names,
    node_key: String,
}

impl Variants {
    /// One block of variant `v` (0-2: multi-thread targets, 3-5: current-thread, 6: node).
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
            _ => match &mut self.node {
                Some(node) => Some(node.block(cycles, &self.node_key).await),
                None => None,
            },
        }
    }
}

/// One round of `cycles` cycles per variant, in rotating blocks: each variant's p50 (µs).
async fn round(variants: &mut Variants, cycles: usize) -> Vec<Option<f64>> {
    const N: usize = 7;
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

/// Measures the serial rows: `warmup` cycles per variant, then `rounds` rounds of `cycles`.
pub async fn measure(
    urls: &[String],
    run: &str,
    warmup: usize,
    rounds: usize,
    cycles: usize,
) -> Serial {
    let node = NodeRedlock::start(urls).await;
    let node_note = node
        .as_ref()
        .map(|n| n.version.clone())
        .map_err(Clone::clone);
    if let Err(why) = &node_note {
        eprintln!("bench: node-redlock skipped: {why}");
    }
    let mut variants = Variants {
        multi: rust_targets(urls).await,
        current: CurrentThread::start(urls.to_vec(), format!("{run}:serial-ct")).await,
        node: node.ok(),
        multi_names: Names::new(format!("{run}:serial-mt")),
        node_key: format!("{run}:serial-node"),
    };
    let load_before = crate::support::loadavg();
    round(&mut variants, warmup).await;
    let mut serial = Serial {
        rust: Default::default(),
        node: Vec::new(),
        node_note,
        load_before,
        load_after: String::new(),
    };
    for _ in 0..rounds {
        let p50s = round(&mut variants, cycles).await;
        for (v, p) in p50s.into_iter().enumerate() {
            match (v, p) {
                (0..=5, Some(p)) => serial.rust[v / 3][v % 3].push(p),
                (6, Some(p)) => serial.node.push(p),
                _ => {}
            }
        }
    }
    serial.load_after = crate::support::loadavg();
    if let Some(node) = variants.node.take() {
        node.stop().await;
    }
    variants.current.stop();
    serial
}

impl Serial {
    fn p50(&self, rt: Runtime, target: usize) -> f64 {
        median(self.rust[rt as usize][target].clone())
    }

    /// Prints the table (markdown) and the per-round figures under it.
    pub fn print(&self, rounds: usize, cycles: usize) {
        let yes_no = |ok: bool| if ok { "yes" } else { "**no**" };
        let node = median(self.node.clone());
        let node_cell = |x: f64| match &self.node_note {
            Ok(_) if !self.node.is_empty() => format!("{x:.3}"),
            _ => "—".to_string(),
        };
        println!(
            "Serial acquire+release of one lock, 3 nodes: p50, µs (median of {rounds} rounds of {cycles} cycles per variant, interleaved in blocks of {}; node-redlock: {}; load average before {}, after {})",
            crate::rounds::BLOCK,
            match &self.node_note {
                Ok(v) => format!("redlock 5.0.0-beta.2 on ioredis 5, node {v}, its own event loop"),
                Err(why) => format!("skipped: {why}"),
            },
            self.load_before,
            self.load_after
        );
        println!();
        println!("| tokio runtime | raw fred floor (2 of 3) | fredlock | fredlock / floor | rslock 0.10 | rslock / floor | node-redlock 5 | fredlock / node-redlock | target | met? |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---|---|");
        for (rt, name) in [
            (Runtime::Multi, "multi-thread (default)"),
            (Runtime::Current, "current-thread"),
        ] {
            let (f, l, r) = (self.p50(rt, 0), self.p50(rt, 1), self.p50(rt, 2));
            let (target, met) = match rt {
                Runtime::Multi => ("≤ 1.05x floor", l / f <= 1.05),
                Runtime::Current => (
                    "≤ 1.05x floor, ≤ 1.0x node-redlock",
                    l / f <= 1.05 && (self.node.is_empty() || l / node <= 1.0),
                ),
            };
            let node_p50 = if self.node.is_empty() {
                "—".to_string()
            } else {
                format!("{node:.1}")
            };
            println!(
                "| {name} | {f:.1} | {l:.1} | {:.3} | {r:.1} | {:.3} | {node_p50} | {} | {target} | {} |",
                l / f,
                r / f,
                node_cell(l / node),
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
        if !self.node.is_empty() {
            println!(
                "serial per-round p50 (µs), node-redlock: [{}]",
                list(&self.node)
            );
        }
        println!();
    }
}
