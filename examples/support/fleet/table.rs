//! Every cell of the fleet table, measured in one run, and the table with the fleet targets
//! next to the figures.

use std::sync::Arc;
use std::time::Duration;

use fredlock::Redlock;

use super::super::etcd::EtcdServer;
use super::super::waiters::{self, Hold, Target};
use super::{run_cell, Cell, Client, Work, PROCESSES};

/// How long each cell runs.
pub struct Plan {
    /// The window of every fleet cell.
    pub window: Duration,
    /// In-process row: rounds per variant, and seconds per round.
    pub in_process_rounds: usize,
    pub in_process_secs: f64,
    /// The workloads measured (all three unless `--fleet-work` names one).
    pub works: Vec<Work>,
}

impl Plan {
    pub fn full() -> Plan {
        Plan {
            window: Duration::from_secs(4),
            in_process_rounds: 3,
            in_process_secs: 2.0,
            works: Work::ALL.to_vec(),
        }
    }
    pub fn quick() -> Plan {
        Plan {
            window: Duration::from_millis(1_500),
            in_process_rounds: 1,
            in_process_secs: 1.5,
            works: Work::ALL.to_vec(),
        }
    }
}

/// Everything the fleet table shows.
pub struct Fleet {
    pub cells: Vec<Cell>,
    /// etcd's version when its cells were measured, or why they were not.
    pub etcd: Result<String, String>,
    /// 16 waiters as tasks of this process: fredlock default and `tokio::sync::Mutex`, acq/s
    /// (medians of the rounds), and fredlock's commands per acquisition.
    pub in_process: Option<(f64, f64, f64)>,
    pub window: Duration,
    pub load_before: String,
    pub load_after: String,
}

/// Measures every cell: for each P, the mutex, the semaphore and the election, each client in
/// turn (the order of the clients alternating from one P to the next, so that a change in the
/// machine's load does not always fall on the same one); then the in-process row.
pub async fn measure(urls: &[String], run: &str, plan: &Plan) -> Fleet {
    let load_before = super::super::loadavg();
    // Whether etcd starts here (its version); each etcd cell then gets a member of its own:
    // the calls a cell's children leave waiting at the end of its window (a lock or a campaign
    // dropped with its connection) stay in the member until their leases expire, and in one
    // shared member they held up the next cells.
    let wanted = plan
        .works
        .iter()
        .any(|w| w.clients().contains(&Client::Etcd));
    let etcd = match wanted {
        true => EtcdServer::start().await.map(|e| e.version.clone()),
        false => Err("no workload of this run has an etcd cell".into()),
    };
    if let Err(why) = &etcd {
        eprintln!("bench: the fleet table runs without etcd: {why}");
    }
    let mut cells = Vec::new();
    for (i, &p) in PROCESSES.iter().enumerate() {
        for &work in &plan.works {
            let mut clients = work.clients().to_vec();
            clients.retain(|&c| c != Client::Etcd || etcd.is_ok());
            if i % 2 == 1 {
                clients.reverse();
            }
            for client in clients {
                let key = format!("{run}:fleet:{}:{:?}:{p}", work.name(), client);
                eprintln!("bench: fleet {} {} P={p} ...", work.name(), client.name());
                let member = match client {
                    Client::Etcd => match EtcdServer::start().await {
                        Ok(member) => Some(member),
                        Err(why) => {
                            eprintln!("bench: no etcd cell for {} P={p}: {why}", work.name());
                            continue;
                        }
                    },
                    _ => None,
                };
                let etcd_urls: Vec<String> = member.iter().map(|e| e.url.clone()).collect();
                let child_urls = match member {
                    Some(_) => &etcd_urls[..],
                    None => urls,
                };
                let cell = run_cell(urls, child_urls, &key, work, client, p, plan.window).await;
                cells.push(cell);
                drop(member);
            }
        }
    }
    let in_process = match plan.works.contains(&Work::Mutex) {
        true => Some(in_process(urls, run, plan).await),
        false => None,
    };
    Fleet {
        cells,
        etcd,
        in_process,
        window: plan.window,
        load_before,
        load_after: super::super::loadavg(),
    }
}

/// 16 waiters as tasks of ONE process, fredlock default against a `tokio::sync::Mutex` with the
/// same precise hold, rounds interleaved.
async fn in_process(urls: &[String], run: &str, plan: &Plan) -> (f64, f64, f64) {
    let addrs = super::addrs(urls).await;
    let redlock = Redlock::builder()
        .nodes(urls.to_vec())
        .retry(waiters::RETRY)
        .build()
        .await
        .expect("build a Redlock");
    let targets = [
        Target::Redlock(redlock.clone()),
        Target::Local(Arc::new(tokio::sync::Mutex::new(()))),
    ];
    let key = format!("{run}:fleet:in-process");
    let (mut fred, mut local, mut cmds) = (Vec::new(), Vec::new(), Vec::new());
    for t in &targets {
        waiters::round(t, &addrs, &key, Hold::Precise, 0.3).await;
    }
    for r in 0..plan.in_process_rounds {
        for i in [r % 2, 1 - r % 2] {
            let got = waiters::round(
                &targets[i],
                &addrs,
                &key,
                Hold::Precise,
                plan.in_process_secs,
            );
            let got = got.await;
            if i == 0 {
                fred.push(got.per_second);
                cmds.push(got.commands_per_acquisition);
            } else {
                local.push(got.per_second);
            }
        }
    }
    redlock.close().await;
    let m = super::super::median;
    (m(fred), m(local), m(cmds))
}

impl Fleet {
    fn cell(&self, work: Work, client: Client, p: usize) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.work == work && c.client == client && c.processes == p)
    }

    /// The figures, one row per cell.
    pub fn print_cells(&self) {
        println!(
            "| workload | P | client | acquisitions/s | Redis commands / acquisition | wait p50 / p99 / max, ms | per process min / max (ratio) | CPU cores: clients / nodes |"
        );
        println!("|---|---:|---|---:|---:|---|---|---|");
        for c in &self.cells {
            let (unit, wait) = match c.work {
                Work::Election => ("terms/s", "handover"),
                _ => ("", ""),
            };
            let overlaps = match c.overlaps {
                0 => String::new(),
                n => format!(" **{n} overlapping terms**"),
            };
            // etcd's cells send the Redis nodes nothing, and etcd's own CPU is not read.
            let (commands, nodes) = match c.client {
                Client::Etcd => ("—".to_string(), "— (etcd)".to_string()),
                _ => (
                    format!("{:.1}", c.commands_per_acquisition),
                    format!("{:.2}", c.server_cores),
                ),
            };
            println!(
                "| {} | {} | {} | {:.0}{}{} | {commands} | {}{:.1} / {:.1} / {:.0} | {} / {} ({:.2}) | {:.2} / {nodes} |",
                c.work.name(),
                c.processes,
                c.client.name(),
                c.per_second,
                if unit.is_empty() { "" } else { " " },
                unit,
                if wait.is_empty() { String::new() } else { format!("{wait} ") },
                c.p50_us / 1e3,
                c.p99_us / 1e3,
                c.max_us / 1e3,
                c.fewest,
                c.most,
                c.fewest as f64 / c.most.max(1) as f64,
                c.client_cores,
            );
            if !overlaps.is_empty() {
                println!("|  |  | {overlaps} |  |  |  |  |  |");
            }
        }
        let Some((f, l, cmds)) = self.in_process else {
            return;
        };
        println!(
            "| 16 waiters as tasks of ONE process | 1 | fredlock default (tokio Mutex, same hold: {l:.0}/s) | {f:.0} | {cmds:.1} | — | — | — |"
        );
    }
}

/// One target row: what, the figure, what it is compared with, the ratio (figure / compared
/// with; for the fairness row, fewest / most itself), met.
fn target(what: &str, figure: String, against: String, ratio: f64, met: bool) {
    let met = if met { "yes" } else { "**no**" };
    println!("| {what} | {figure} | {against} | {ratio:.3} | {met} |");
}

/// [`target`], unless its workload was not measured (`--fleet-work` named another).
fn measured_target(what: &str, figure: String, against: String, ratio: f64, met: bool) {
    if !ratio.is_nan() {
        target(what, figure, against, ratio, met);
    }
}

impl Fleet {
    /// The fleet targets, each with the measured figures and the ratio (fredlock default;
    /// polling's figure beside it for comparison).
    pub fn print_targets(&self) {
        let (m, d, p, r) = (
            Work::Mutex,
            Client::Default,
            Client::Polling,
            Client::Rslock,
        );
        let rate = |w, c, n| self.cell(w, c, n).map_or(f64::NAN, |c| c.per_second);
        let cmds = |c, n| {
            self.cell(m, c, n)
                .map_or(f64::NAN, |c| c.commands_per_acquisition)
        };
        println!("| target (fredlock default) | figure | compared with | ratio | met? |");
        println!("|---|---:|---:|---:|---|");
        let (d64, d4, r64) = (rate(m, d, 64), rate(m, d, 4), rate(m, r, 64));
        measured_target(
            "mutex, P = 64: acquisitions/s ≥ 0.9x its own at P = 4",
            format!("{d64:.0} (polling {:.0})", rate(m, p, 64)),
            format!("{d4:.0}"),
            d64 / d4,
            d64 / d4 >= 0.9,
        );
        measured_target(
            "mutex, P = 64: acquisitions/s ≥ 1.5x rslock's",
            format!("{d64:.0}"),
            format!("{r64:.0}"),
            d64 / r64,
            d64 / r64 >= 1.5,
        );
        for n in PROCESSES {
            let (ours, etcd) = (rate(m, d, n), rate(m, Client::Etcd, n));
            measured_target(
                &format!("mutex, P = {n}: acquisitions/s ≥ etcd 3.4's mutex"),
                format!("{ours:.0}"),
                format!("{etcd:.0}"),
                ours / etcd,
                ours >= etcd,
            );
        }
        for n in PROCESSES {
            let (c, rs) = (cmds(d, n), cmds(r, n));
            // At most 20 commands (the target was 25 before 2026-11-29).
            measured_target(
                &format!("mutex, P = {n}: Redis commands / acquisition ≤ 20"),
                format!("{c:.1} (polling {:.1})", cmds(p, n)),
                "20".into(),
                c / 20.0,
                c <= 20.0,
            );
            measured_target(
                &format!("mutex, P = {n}: Redis commands / acquisition ≤ 0.5x rslock's"),
                format!("{c:.1}"),
                format!("{rs:.1}"),
                c / rs,
                c / rs <= 0.5,
            );
        }
        if let Some(c) = self.cell(m, d, 16) {
            let fair = c.fewest as f64 / c.most.max(1) as f64;
            measured_target(
                "mutex, P = 16: fewest / most acquisitions of one process ≥ 0.5",
                format!("{} / {}", c.fewest, c.most),
                "0.5".into(),
                fair,
                fair >= 0.5,
            );
        }
        let (s64, s4) = (rate(Work::Semaphore, d, 64), rate(Work::Semaphore, d, 4));
        measured_target(
            "semaphore (4 permits), P = 64: acquisitions/s ≥ 0.9x its P = 4",
            format!("{s64:.0} (polling {:.0})", rate(Work::Semaphore, p, 64)),
            format!("{s4:.0}"),
            s64 / s4,
            s64 / s4 >= 0.9,
        );
        self.print_election_targets();
        let Some((f, l, _)) = self.in_process else {
            return;
        };
        target(
            "16 waiters in one process: acquisitions/s ≥ 0.9x a tokio::sync::Mutex",
            format!("{f:.0}"),
            format!("{l:.0}"),
            f / l,
            f / l >= 0.9,
        );
    }

    /// The election targets: commands per term, terms/s at 64 against 4, the handover tail.
    fn print_election_targets(&self) {
        let (d, p) = (Client::Default, Client::Polling);
        let rate = |w, c, n| self.cell(w, c, n).map_or(f64::NAN, |c| c.per_second);
        let e = Work::Election;
        for n in PROCESSES {
            if let Some(c) = self.cell(e, d, n) {
                let per_term = |client| {
                    self.cell(e, client, n)
                        .map_or(f64::NAN, |c| c.commands_per_acquisition)
                };
                let (polling, step_down) = (per_term(p), per_term(Client::StepDown));
                target(
                    &format!("election, P = {n}: Redis commands / term ≤ 50"),
                    format!(
                        "{:.1} (polling {polling:.1}; step down {step_down:.1})",
                        c.commands_per_acquisition
                    ),
                    "50".into(),
                    c.commands_per_acquisition / 50.0,
                    c.commands_per_acquisition <= 50.0,
                );
            }
        }
        let (e64, e4) = (rate(e, d, 64), rate(e, d, 4));
        measured_target(
            "election, P = 64: terms/s ≥ 0.9x its P = 4",
            format!("{e64:.1} (polling {:.1})", rate(e, p, 64)),
            format!("{e4:.1}"),
            e64 / e4,
            e64 / e4 >= 0.9,
        );
        for n in PROCESSES {
            let p99 = |client| self.cell(e, client, n).map_or(f64::NAN, |c| c.p99_us);
            let (ours, etcd) = (p99(d), p99(Client::Etcd));
            measured_target(
                &format!("election, P = {n}: handover p99 ≤ etcd 3.4's"),
                format!("{:.1} ms", ours / 1e3),
                format!("{:.1} ms", etcd / 1e3),
                ours / etcd,
                ours <= etcd,
            );
        }
        if let Some(c) = self.cell(Work::Election, d, 64) {
            let polling = self
                .cell(Work::Election, p, 64)
                .map_or(f64::NAN, |c| c.p99_us);
            measured_target(
                "election, P = 64: handover after a resign p99 ≤ 5 ms",
                format!("{:.1} ms (polling {:.1})", c.p99_us / 1e3, polling / 1e3),
                "5 ms".into(),
                c.p99_us / 5e3,
                c.p99_us <= 5e3 && c.overlaps == 0,
            );
        }
    }

    /// Where fredlock default's commands went, per acquisition (per term), by node (0..) and
    /// command, for each of its cells: the map for the commands-per-acquisition targets.
    fn print_by_command(&self) {
        println!();
        println!("fredlock default, Redis commands per acquisition (term) by node and command:");
        for c in self.cells.iter().filter(|c| c.client == Client::Default) {
            let parts: Vec<String> = c
                .by_command
                .iter()
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect();
            println!(
                "- {} P = {}: {}",
                c.work.name(),
                c.processes,
                parts.join(", ")
            );
        }
    }

    /// The fleet table with its header, the targets and what limited the machine.
    pub fn print(&self, nproc: usize) {
        println!();
        println!(
            "Fleet: P separate processes (each one client and one waiter; fredlock: default settings but retries unbounded every 5 ms + up to 5 ms of jitter; rslock: a random pause in [0, 10 ms)), one key / one 4-permit semaphore / one leadership, a precise 1 ms hold (elections: a 50 ms term, then resign), {:.1} s per cell; commands from INFO commandstats (calls inside scripts included) over the window; load average before {}, after {}",
            self.window.as_secs_f64(),
            self.load_before,
            self.load_after
        );
        match &self.etcd {
            Ok(version) => println!("\netcd: {version}, one member per cell, data on tmpfs, through its JSON gateway (one HTTP/1.1 connection and one lease per child; lock and election services)"),
            Err(why) => println!("\netcd: not measured ({why})"),
        }
        println!();
        self.print_cells();
        println!();
        self.print_targets();
        self.print_by_command();
        let busiest = self
            .cells
            .iter()
            .map(|c| c.client_cores + c.server_cores)
            .fold(0.0, f64::max);
        println!();
        println!(
            "machine: {nproc} cores; the busiest cell kept {busiest:.2} cores busy (children + nodes; the rest is the kernel, this parent and other work): a cell whose CPU total nears {nproc} is bound by the machine, not by the lock"
        );
    }
}
