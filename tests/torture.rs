//! A short torture run (N = 3 and N = 5, each 13 s without and 13 s with fencing; semaphore
//! permits in every run; every fault of rows 1-9, 13-15) must find
//! no violation within Redlock's assumptions, and every negative control must find the
//! violation planted in it (the delayed-restart control none). The same on N = 3 Redis Clusters
//! of 3 shards (shards killed, frozen, their connections reset, slots migrating), with row 11's
//! control on clusters (a shard restarted EMPTY at once must be caught). The tables are printed
//! (see them with `--nocapture`). The seed is fixed; `FREDLOCK_TORTURE_SEED` overrides it, and a
//! failing seed replays with the command the table prints. `make torture` runs the long version.
//! Fleet mode: 32 clients, each its own `Redlock`, waiting for 3 hot resources under every
//! fault, must find no violation; its liveness controls must flag a thundering-herd strawman and
//! must not flag fredlock polling.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use fredlock_testkit::torture::{self, FaultKind, Report, TortureConfig};

const DEFAULT_SEED: u64 = 0x5EED_2024;
/// Each N runs once without and once with fencing (durable nodes, fenced locks and registers).
const RUN: Duration = Duration::from_secs(13);
/// The cluster runs (each start forms three clusters, and a shard restart waits about the
/// cluster's node timeout): once without and once with fencing.
const CLUSTER_RUN: Duration = Duration::from_secs(10);
const SHARDS: usize = 3;
/// The fleet run, and each of its two liveness controls.
const FLEET_RUN: Duration = Duration::from_secs(15);
const FLEET_CONTROL: Duration = Duration::from_secs(6);
/// The controls' fleet: 32 clients (as `make torture`'s) on 2 resources. With 16 the herd sat
/// at 0.42-0.56x its floor, against the flag at 0.5x (failed once in a clean clone, Valkey);
/// with 32 at 0.26-0.29x, while fredlock's waiters stay at 0.69-0.73x (3 runs each, Valkey).
const CONTROL_CLIENTS: usize = 32;
const CONTROL_RESOURCES: usize = 2;

/// The tests each start several redis-servers and load both cores: run them one at a time
/// (a starved machine would only test the scheduler).
static SERIAL: Mutex<()> = Mutex::new(());

fn seed() -> u64 {
    std::env::var("FREDLOCK_TORTURE_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(DEFAULT_SEED)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// No violation in the run; else the first few, with the seed that replays it.
fn assert_no_violation(r: &Report, seed: u64) {
    assert_eq!(
        r.violations(),
        0,
        "{}, seed {seed}: {:#?}",
        r.config.label(),
        r.check.violations.iter().take(5).collect::<Vec<_>>()
    );
}

/// The least a run must have done to be worth checking (a broken run, or one that only met
/// unavailable nodes, grants next to nothing).
struct Floors {
    granted: u64,
    verified_sections: usize,
    writes_completed: usize,
}

fn assert_busy(r: &Report, floors: Floors) {
    let run = r.config.label();
    assert!(
        r.stats.granted >= floors.granted,
        "{run}: only {} grants",
        r.stats.granted
    );
    assert!(
        r.check.verified_sections >= floors.verified_sections,
        "{run}: only {} verified sections",
        r.check.verified_sections
    );
    assert!(
        r.check.writes_completed >= floors.writes_completed,
        "{run}: only {} counter writes",
        r.check.writes_completed
    );
}

/// The data node was never faulted, the semaphores were used, and in fencing mode the fenced
/// register was written.
fn assert_modes_ran(r: &Report) {
    let run = r.config.label();
    assert_eq!(
        r.stats.data_errors, 0,
        "{run}: the data node is never faulted"
    );
    assert!(
        r.stats.permits >= 10,
        "{run}: only {} permits",
        r.stats.permits
    );
    if r.config.fencing {
        assert!(
            r.stats.fenced_accepted >= 10,
            "{run}: only {} fenced writes accepted",
            r.stats.fenced_accepted
        );
    }
}

#[test]
fn torture_finds_no_violation_within_the_assumptions() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = seed();
    println!("torture seed {seed} (set FREDLOCK_TORTURE_SEED to change it)");
    let started = Instant::now();
    let reports = runtime().block_on(async {
        let mut reports = Vec::new();
        for n in [3, 5] {
            for fencing in [false, true] {
                let mut config = TortureConfig::new(n, seed, RUN);
                config.fencing = fencing;
                let report = torture::run(config)
                    .await
                    .expect("set up the torture run (is redis-server installed?)");
                reports.push(report);
            }
        }
        reports
    });
    println!("{}", torture::markdown(&reports, &[]));
    println!("wall time {:?}", started.elapsed());
    for r in &reports {
        let n = r.config.nodes;
        assert_no_violation(r, seed);
        // The floors leave room for a busy machine: with two cores shared by other builds (load
        // average 8) 13 s debug runs of this seed granted 29 to 151 per row (one verified 29 to
        // 45 sections and completed 55 to 89 counter writes), and so did the code before
        // wake-ups and batched keep-alive; a quiet machine grants several hundred.
        let floors = Floors {
            granted: 20,
            verified_sections: 10,
            writes_completed: 20,
        };
        assert_busy(r, floors);
        let injected: u64 = r.faults.values().map(|f| f.0).sum();
        assert!(injected >= 15, "N={n}: only {injected} faults");
        // The schedule deals every kind once before picking at random: all rows are covered.
        for kind in FaultKind::ALL {
            assert!(r.faults.contains_key(&kind), "N={n}: no {kind:?} injected");
        }
        assert_modes_ran(r);
        // The read-write locks were taken on both sides, and leases were resumed.
        assert!(
            r.stats.rw_reads >= 1 && r.stats.rw_writes >= 1,
            "N={n}: read-write lock: {} reads, {} writes",
            r.stats.rw_reads,
            r.stats.rw_writes
        );
        assert!(r.stats.leases_resumed >= 1, "N={n}: no lease resumed");
    }
}

#[test]
fn negative_controls_detect_the_planted_violations() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let controls = runtime().block_on(torture::negative_controls());
    println!("{}", torture::markdown(&[], &controls));
    assert_eq!(controls.len(), 11);
    for c in &controls {
        assert!(
            c.pass,
            "negative control {:?} (row {}) failed: {c:#?}",
            c.name, c.row
        );
        if c.expect_violation {
            assert!(c.violations >= 1);
        } else {
            assert_eq!(c.violations, 0);
        }
    }
}

#[test]
fn cluster_torture_finds_no_violation_and_its_control_is_caught() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = seed();
    println!("cluster torture seed {seed} (set FREDLOCK_TORTURE_SEED to change it)");
    let started = Instant::now();
    let (reports, controls) = runtime().block_on(async {
        let mut reports = Vec::new();
        for fencing in [false, true] {
            let mut config = TortureConfig::new(3, seed, CLUSTER_RUN).on_clusters(SHARDS);
            config.fencing = fencing;
            let report = torture::run(config)
                .await
                .expect("set up the cluster torture run (is redis-server installed?)");
            reports.push(report);
        }
        (reports, torture::cluster_controls(SHARDS).await)
    });
    println!("{}", torture::markdown(&reports, &controls));
    println!("wall time {:?}", started.elapsed());
    for r in &reports {
        let run = r.config.label();
        assert_no_violation(r, seed);
        let floors = Floors {
            granted: 100,
            verified_sections: 50,
            writes_completed: 100,
        };
        assert_busy(r, floors);
        // Every cluster fault was injected, none of the proxies' (there are none).
        for &kind in FaultKind::CLUSTER.iter() {
            assert!(r.faults.contains_key(&kind), "{run}: no {kind:?} injected");
        }
        assert!(
            r.faults.keys().all(|k| FaultKind::CLUSTER.contains(k)),
            "{run}: {:?}",
            r.faults.keys()
        );
        assert_modes_ran(r);
    }
    // Row 11 on clusters: a shard restarted EMPTY at once is caught, the delayed restart is not.
    assert_eq!(controls.len(), 2);
    for c in &controls {
        assert!(
            c.pass,
            "cluster control {:?} (row {}) failed: {c:#?}",
            c.name, c.row
        );
    }
    assert!(controls[0].expect_violation && controls[0].violations >= 1);
    assert!(!controls[1].expect_violation && controls[1].violations == 0);
}

#[test]
fn fleet_torture_is_safe_and_its_liveness_controls_are_judged_right() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = seed();
    println!("fleet torture seed {seed} (set FREDLOCK_TORTURE_SEED to change it)");
    let started = Instant::now();
    let (report, controls) = runtime().block_on(async {
        let config = TortureConfig::fleet(3, seed, FLEET_RUN);
        let report = torture::run(config)
            .await
            .expect("set up the fleet torture run (is redis-server installed?)");
        let controls =
            torture::liveness_controls(CONTROL_CLIENTS, CONTROL_RESOURCES, FLEET_CONTROL)
                .await
                .expect("set up the liveness controls");
        (report, controls)
    });
    println!("{}", torture::markdown(std::slice::from_ref(&report), &[]));
    println!("{}", torture::liveness_markdown(&controls));
    println!("wall time {:?}", started.elapsed());
    assert_no_violation(&report, seed);
    assert_eq!(report.config.clients, 32);
    // See the floors of the first test; today's default hands a hot resource over a few times
    // a second here (see the liveness rows).
    let floors = Floors {
        granted: 15,
        verified_sections: 0,
        writes_completed: 15,
    };
    assert_busy(&report, floors);
    let injected: u64 = report.faults.values().map(|f| f.0).sum();
    assert!(injected >= 15, "only {injected} faults");
    let live = report
        .liveness
        .as_ref()
        .expect("fleet mode judges liveness");
    assert_eq!(live.rates.len(), 3, "a rate per hot resource");
    assert!(live.waits >= 10, "only {} waiting acquires", live.waits);
    // The liveness rows are judged against a floor measured in the same run: fredlock's own
    // fleet, under every fault, must not be flagged; the herd (every release wakes every
    // waiter of every client) must be, and it must do worse than fredlock with its default
    // settings on the same nodes (a verdict that flagged everything would prove nothing).
    // Whether fredlock also clears the controls' stricter threshold is `make torture`'s control
    // (release build): this debug build on 2 cores saturates the machine.
    assert!(!live.flagged, "fredlock's fleet was flagged: {live:#?}");
    assert_eq!(controls.len(), 2);
    let (herd, fredlock) = (&controls[0].liveness, &controls[1].liveness);
    assert!(
        controls[0].expect_flagged && controls[0].pass,
        "the herd was not flagged: {herd:#?}"
    );
    assert!(
        herd.rate_share() < fredlock.rate_share(),
        "the herd ({:.2} of its floor) did not do worse than fredlock ({:.2})",
        herd.rate_share(),
        fredlock.rate_share()
    );
}
