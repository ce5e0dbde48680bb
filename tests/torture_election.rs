//! The torture run's election mode (see `fredlock_testkit::torture::election`): candidates and
//! observers under a seeded fault schedule. No overlapping leader windows, growing term numbers,
//! no observer naming a superseded term past the bound; and the control (an observer that never
//! resyncs) must be caught. `FREDLOCK_TORTURE_SEED` overrides the seed.

use std::time::Duration;

use fredlock_testkit::torture::election::{self, ElectionConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_under_faults_keep_leaders_apart_and_observers_right() {
    let seed = std::env::var("FREDLOCK_TORTURE_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0x5EED_2024);
    let config = ElectionConfig::new(seed, Duration::from_secs(25));
    let report = election::run(config)
        .await
        .expect("set up (is redis-server installed?)");
    println!(
        "seed {seed}: {} terms, {} fault episodes, {} observer changes; control: {} findings",
        report.terms,
        report.episodes,
        report.observed,
        report.control_violations.len()
    );
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert!(report.terms >= 3, "only {} terms", report.terms);
    assert!(report.episodes >= 5, "only {} episodes", report.episodes);
    assert!(
        report.control_caught(),
        "the never-resyncing observer was not caught"
    );
    println!("control caught: {}", report.control_violations[0]);
}
