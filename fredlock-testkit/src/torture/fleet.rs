// This file owns fleet mode's liveness: the counters the clients keep on the hot resources
// ([`Live`]), the floor lane that measures what one uncontended client gets in the same run
// ([`Floor`]), the verdict ([`Liveness`]) and the liveness controls (a thundering-herd strawman
// that must be flagged, fredlock polling that must not). It must not judge safety: the checker
// does, unchanged.
//! Fleet mode's liveness rows and their controls.
//!
//! In fleet mode ([`TortureConfig::fleet`](super::TortureConfig::fleet)) 32 or more clients,
//! each its own `Redlock` with its own connections and subscribers, wait for a few hot
//! resources. Beside the safety checks, the run reports per hot resource the acquisitions per
//! second and the longest wait, judged against a FLOOR measured in the same run (not an absolute
//! number: the machine is small, shared and noisy): one more client, alone on a resource of its
//! own, straight on the nodes, first cycles acquire + release for [`CALIBRATION`] before the
//! contenders and the faults start (what one uncontended acquire + release costs on this
//! machine now), then keeps cycling for the whole run, under the same node faults and load
//! (its longest gap between two grants is the run's worst outage).
//!
//! - `solo cycle` = the calibration's median cycle (after its first cycles);
//! - `mean hold` = the hot resources' critical sections (grant to the release call) / grants;
//! - a hot resource's rate counts only the time outside the floor client's outages (gaps
//!   between two of its grants beyond [`OUTAGE_GAP`]);
//! - floor rate = 1 / (mean hold + solo cycle): a hot resource handed over as fast as one
//!   uncontended acquire + release; a resource is flagged below [`RATE_SHARE`] of it (the
//!   contention's own load counts against the contenders: a design whose waiters burn the
//!   machine is not live);
//! - floor wait = waiters per resource x (mean hold + solo cycle) (one fair turn each) + the
//!   floor client's longest gap between two grants; the longest wait is flagged above
//!   [`WAIT_FACTOR`] times it.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use fredlock::Redlock;
use tokio::time::Instant;

use super::config::FLEET_RETRY;
use super::env::io_err;
use crate::strawman::HerdLock;
use crate::LocalNodes;

/// A hot resource is flagged when its rate is below this share of the floor rate (runs
/// without faults: the liveness controls).
pub const RATE_SHARE: f64 = 0.5;
/// The same in the fleet torture run, where faults also keep the hot resources idle (a client
/// whose link holds its replies leaves its key on the nodes for up to its TTL, whatever the
/// design) and the floor client sees only node faults.
pub const FAULT_RATE_SHARE: f64 = 0.2;
/// The longest wait is flagged above this many floor waits: a wait that long is starvation,
/// not the tail of an unfair (barging) lock, whose longest wait in a 6 s control run is 10 to
/// 25 fair turns.
pub const WAIT_FACTOR: f64 = 50.0;
/// A gap between two of the floor client's grants longer than this is an outage (its excess):
/// far above one cycle, even on a loaded machine.
pub const OUTAGE_GAP: Duration = Duration::from_millis(100);
/// How long the floor client calibrates, alone, before the run.
pub const CALIBRATION: Duration = Duration::from_secs(1);
/// Liveness counters of the hot resources, summed over the clients.
#[derive(Debug, Clone, Default)]
pub struct Live {
    /// Grants per hot resource (by index).
    pub grants: BTreeMap<usize, u64>,
    /// Time held, grant to release, over all those grants.
    pub held: Duration,
    /// Waiting acquires that ended (granted or not).
    pub waits: u64,
    /// The longest of them.
    pub longest_wait: Duration,
    /// Waiting acquires that ran out of their wait and gave up.
    pub gave_up: u64,
}

impl Live {
    /// Adds another client's counters.
    pub fn merge(&mut self, o: &Live) {
        for (r, n) in &o.grants {
            *self.grants.entry(*r).or_default() += n;
        }
        self.held += o.held;
        self.waits += o.waits;
        self.longest_wait = self.longest_wait.max(o.longest_wait);
        self.gave_up += o.gave_up;
    }

    /// A grant of hot resource `resource`, held `held` (grant to the release call).
    pub fn granted(&mut self, resource: usize, held: Duration) {
        *self.grants.entry(resource).or_default() += 1;
        self.held += held;
    }

    /// A waiting acquire that ended after `waited`, granted or not.
    pub fn waited(&mut self, waited: Duration, granted: bool) {
        self.waits += 1;
        self.longest_wait = self.longest_wait.max(waited);
        self.gave_up += u64::from(!granted);
    }
}

/// What one uncontended client got in the run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Floor {
    /// The median acquire + release cycle during the calibration, alone on the machine's nodes
    /// (see `calibrate`).
    pub solo_cycle: Duration,
    /// Acquire + release cycles completed during the run.
    pub cycles: u64,
    /// The longest time between two grants (or from the start to the first).
    pub longest_gap: Duration,
    /// The time no grant was possible: the sum of the gaps between two grants beyond
    /// [`OUTAGE_GAP`] (a majority down, frozen or cut off).
    pub outage: Duration,
    /// How long it ran.
    pub window: Duration,
}

/// The floor's calibration: `redlock` alone on `resource`, cycling acquire + release for
/// [`CALIBRATION`]; the median cycle after the first [`CALIBRATION_WARMUP`] (the mean of all
/// of them when fewer came).
///
/// Why the median: the mean took every stall of a fresh Redlock on fresh nodes (its first
/// scripts sent whole, the machine still busy starting the nodes) into "the uncontended
/// cycle"; seen once as a herd control's floor at 2.30 ms against 1.13 ms for the control run
/// right after it, which left the herd at 0.56x its floor, unflagged.
pub async fn calibrate(redlock: &Redlock, resource: &str, ttl: Duration) -> Duration {
    let start = Instant::now();
    let mut cycles = Vec::new();
    while start.elapsed() < CALIBRATION {
        let t0 = Instant::now();
        if let Ok(lock) = redlock.acquire(resource, ttl).await {
            let _ = lock.release().await;
            cycles.push(t0.elapsed());
        }
    }
    if cycles.len() < 2 * CALIBRATION_WARMUP {
        return start.elapsed() / (cycles.len() as u32).max(1);
    }
    let mut measured = cycles.split_off(CALIBRATION_WARMUP);
    measured.sort_unstable();
    measured[measured.len() / 2]
}

/// Cycles of a calibration left out of its median: a fresh Redlock's first cycles.
const CALIBRATION_WARMUP: usize = 10;

/// The floor lane: `redlock` alone on `resource`, cycling acquire + release until `stop_at`
/// (after a calibration that measured `solo_cycle`).
pub async fn floor_lane(
    redlock: Redlock,
    resource: String,
    ttl: Duration,
    solo_cycle: Duration,
    stop_at: Instant,
) -> Floor {
    let start = Instant::now();
    let mut floor = Floor {
        solo_cycle,
        ..Floor::default()
    };
    let mut last = start;
    while Instant::now() < stop_at {
        let Ok(Ok(lock)) =
            tokio::time::timeout_at(stop_at, redlock.acquire(resource.as_str(), ttl)).await
        else {
            continue;
        };
        let now = Instant::now();
        floor.longest_gap = floor.longest_gap.max(now - last);
        floor.outage += (now - last).saturating_sub(OUTAGE_GAP);
        last = now;
        let _ = lock.release().await;
        floor.cycles += 1;
    }
    floor.window = start.elapsed();
    redlock.close().await;
    floor
}

/// The liveness verdict of one run.
#[derive(Debug, Clone)]
pub struct Liveness {
    /// Who contended (the run's label, or the control's client).
    pub label: String,
    /// Acquisitions per second of each hot resource.
    pub rates: Vec<f64>,
    /// See the module docs.
    pub floor_rate: f64,
    /// The longest wait of any waiting acquire.
    pub longest_wait: Duration,
    /// See the module docs.
    pub floor_wait: Duration,
    /// Waiting acquires that ended.
    pub waits: u64,
    /// Of those, how many gave up (waited out their retry budget).
    pub gave_up: u64,
    /// The floor client's cycles per second and longest gap.
    pub floor: Floor,
    /// The share of the floor rate below which a resource is flagged.
    pub share: f64,
    /// A rate below `share` of the floor, or a wait beyond [`WAIT_FACTOR`] floors.
    pub flagged: bool,
}

impl Liveness {
    /// Judges `live` (over `window`, `resources` hot resources, `clients` clients) against
    /// the floor of the same run, flagging a rate below `share` of it.
    pub fn judge(
        label: String,
        live: &Live,
        floor: Floor,
        (resources, clients): (usize, usize),
        window: Duration,
        share: f64,
    ) -> Liveness {
        // Rates over the time a grant was possible at all.
        let secs = window.saturating_sub(floor.outage).as_secs_f64().max(1e-3);
        let rates: Vec<f64> = (0..resources)
            .map(|r| live.grants.get(&r).copied().unwrap_or(0) as f64 / secs)
            .collect();
        let grants: u64 = live.grants.values().sum();
        let mean_hold = live.held.as_secs_f64() / grants.max(1) as f64;
        let solo_cycle = floor.solo_cycle.as_secs_f64();
        let turn = mean_hold + solo_cycle;
        let floor_rate = 1.0 / turn;
        let per_resource = clients as f64 / resources.max(1) as f64;
        let floor_wait = Duration::from_secs_f64(per_resource * turn) + floor.longest_gap;
        let slow = rates.iter().any(|&r| r < share * floor_rate);
        let stuck = live.longest_wait.as_secs_f64() > WAIT_FACTOR * floor_wait.as_secs_f64();
        Liveness {
            label,
            rates,
            floor_rate,
            longest_wait: live.longest_wait,
            floor_wait,
            waits: live.waits,
            gave_up: live.gave_up,
            floor,
            share,
            flagged: slow || stuck,
        }
    }

    /// The lowest rate as a share of the floor rate.
    pub fn rate_share(&self) -> f64 {
        self.rates.iter().copied().fold(f64::INFINITY, f64::min) / self.floor_rate
    }

    /// The longest wait in floor waits.
    pub fn wait_ratio(&self) -> f64 {
        self.longest_wait.as_secs_f64() / self.floor_wait.as_secs_f64().max(1e-9)
    }

    /// The rows' text: rates (floor), longest wait (floor), verdict.
    pub fn cells(&self) -> [String; 3] {
        let rates: Vec<String> = self.rates.iter().map(|r| format!("{r:.0}")).collect();
        [
            format!(
                "{} (floor {:.0}: solo cycle {:.2} ms + mean hold; lowest {:.2}x, flag < {}x)",
                rates.join(" / "),
                self.floor_rate,
                self.floor.solo_cycle.as_secs_f64() * 1e3,
                self.rate_share(),
                self.share
            ),
            format!(
                "{:.0} ms (floor {:.0} ms; {:.2}x, flag > {WAIT_FACTOR}x; {} of {} waits gave up; outages {:.1} s)",
                self.longest_wait.as_secs_f64() * 1e3,
                self.floor_wait.as_secs_f64() * 1e3,
                self.wait_ratio(),
                self.gave_up,
                self.waits,
                self.floor.outage.as_secs_f64()
            ),
            if self.flagged {
                "**FLAGGED**".into()
            } else {
                "live".into()
            },
        ]
    }
}

/// One liveness control: who contended, whether it had to be flagged, the verdict.
#[derive(Debug, Clone)]
pub struct LivenessControl {
    /// The verdict.
    pub liveness: Liveness,
    /// Whether it had to be flagged.
    pub expect_flagged: bool,
    /// The verdict is the expected one.
    pub pass: bool,
}

/// Which client a liveness control runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    /// [`HerdLock`]: every release wakes every waiter.
    Herd,
    /// fredlock with its default settings: waiters wait in line, woken by release (must not be
    /// flagged).
    Polling,
}

/// The liveness controls on 3 fresh nodes, no faults: `clients` clients on `resources` hot
/// resources for `duration` each, the herd strawman (must be flagged) and fredlock with its
/// default settings (must not be), each with its floor lane.
pub async fn liveness_controls(
    clients: usize,
    resources: usize,
    duration: Duration,
) -> io::Result<Vec<LivenessControl>> {
    let mut out = Vec::new();
    for (contender, expect_flagged) in [(Contender::Herd, true), (Contender::Polling, false)] {
        let nodes = LocalNodes::start(3).await?;
        let liveness = control_run(&nodes, contender, clients, resources, duration).await?;
        out.push(LivenessControl {
            pass: liveness.flagged == expect_flagged,
            liveness,
            expect_flagged,
        });
    }
    Ok(out)
}

/// The hold of a control's grant (about the length of a fleet client's critical section).
const CONTROL_HOLD: Duration = Duration::from_millis(1);
/// The TTL of a control's locks.
const CONTROL_TTL: Duration = Duration::from_secs(2);

async fn control_run(
    nodes: &LocalNodes,
    contender: Contender,
    clients: usize,
    resources: usize,
    duration: Duration,
) -> io::Result<Liveness> {
    let urls = nodes.urls();
    let names: Vec<String> = (0..resources).map(|r| format!("hot:{r}")).collect();
    let floor_lock = Redlock::builder()
        .nodes(urls.clone())
        .retry(FLEET_RETRY)
        .build()
        .await
        .map_err(io_err)?;
    let mut tasks = Vec::new();
    let mut herds = Vec::new();
    let mut redlocks = Vec::new();
    for _ in 0..clients {
        match contender {
            Contender::Herd => herds.push(
                HerdLock::connect(&urls, &names, Duration::from_millis(50))
                    .await
                    .map_err(io_err)?,
            ),
            Contender::Polling => redlocks.push(
                Redlock::builder()
                    .nodes(urls.clone())
                    .retry(FLEET_RETRY)
                    .build()
                    .await
                    .map_err(io_err)?,
            ),
        }
    }
    let solo_cycle = calibrate(&floor_lock, "floor", CONTROL_TTL).await;
    let start = Instant::now();
    let stop_at = start + duration;
    let floor = tokio::spawn(floor_lane(
        floor_lock,
        "floor".into(),
        CONTROL_TTL,
        solo_cycle,
        stop_at,
    ));
    for (i, herd) in herds.into_iter().enumerate() {
        tasks.push(tokio::spawn(herd_client(
            herd,
            i % resources,
            names[i % resources].clone(),
            stop_at,
        )));
    }
    for (i, redlock) in redlocks.into_iter().enumerate() {
        tasks.push(tokio::spawn(polling_client(
            redlock,
            i % resources,
            names[i % resources].clone(),
            stop_at,
        )));
    }
    let mut live = Live::default();
    for t in tasks {
        live.merge(&t.await.map_err(io_err)?);
    }
    let floor = floor.await.map_err(io_err)?;
    let label = match contender {
        Contender::Herd => "strawman: every release wakes every waiter (thundering herd)",
        Contender::Polling => "fredlock (waiting in line, woken by release)",
    };
    Ok(Liveness::judge(
        format!("{label}, {clients} clients"),
        &live,
        floor,
        (resources, clients),
        start.elapsed(),
        RATE_SHARE,
    ))
}

async fn herd_client(mut herd: HerdLock, index: usize, resource: String, stop_at: Instant) -> Live {
    let mut live = Live::default();
    while Instant::now() < stop_at {
        let t0 = Instant::now();
        let token = herd.acquire(&resource, CONTROL_TTL, stop_at).await;
        let granted_at = Instant::now();
        // The herd never gives up before the end of the run.
        live.waited(granted_at - t0, true);
        let Some(token) = token else { break };
        tokio::time::sleep(CONTROL_HOLD).await;
        live.granted(index, granted_at.elapsed());
        herd.release(&resource, &token).await;
    }
    herd.close().await;
    live
}

async fn polling_client(
    redlock: Redlock,
    index: usize,
    resource: String,
    stop_at: Instant,
) -> Live {
    let mut live = Live::default();
    while Instant::now() < stop_at {
        let t0 = Instant::now();
        let got =
            tokio::time::timeout_at(stop_at, redlock.acquire(resource.as_str(), CONTROL_TTL)).await;
        let granted_at = Instant::now();
        match got {
            Ok(Ok(lock)) => {
                live.waited(granted_at - t0, true);
                tokio::time::sleep(CONTROL_HOLD).await;
                live.granted(index, granted_at.elapsed());
                let _ = lock.release().await;
            }
            // Cut by the end of the run: a wait, not a give-up.
            Err(_) => live.waited(granted_at - t0, true),
            Ok(Err(_)) => live.waited(granted_at - t0, false),
        }
    }
    redlock.close().await;
    live
}
