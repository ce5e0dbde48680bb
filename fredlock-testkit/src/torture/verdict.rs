//! A negative control's verdict ([`ControlResult`]): runs one scenario and judges the checker's
//! report against what the scenario must show (a violation of a given kind, or none).
//!
//! Owns the judging, which the lock controls (`controls.rs`) and the semaphore, read-write and
//! fencing controls (`mode_controls.rs`) share. Must not set up a scenario: each control file
//! brings its own.

use std::future::Future;
use std::io;

use crate::checker::{CheckerReport, ViolationKind};

/// One negative control's outcome.
#[derive(Debug, Clone)]
pub struct ControlResult {
    /// What the scenario is.
    pub name: &'static str,
    /// The fault-matrix row.
    pub row: &'static str,
    /// Whether the checker must find a violation (otherwise it must find none).
    pub expect_violation: bool,
    /// The kind it must find at least once, when it must find one.
    pub expected: Option<ViolationKind>,
    /// Violations found.
    pub violations: usize,
    /// Their kinds.
    pub kinds: Vec<ViolationKind>,
    /// Whether the checker did what was expected (for an expected violation: at least one of
    /// the expected kind was found).
    pub pass: bool,
    /// How the scenario went (placement of the locks), or why it could not run.
    pub detail: String,
}

/// Runs `scenario` and judges its report: with `expected`, the checker must have found at least
/// one violation of that kind; without, none. A scenario that could not run fails.
pub(super) async fn control(
    name: &'static str,
    row: &'static str,
    expected: Option<ViolationKind>,
    scenario: impl Future<Output = io::Result<(CheckerReport, String)>>,
) -> ControlResult {
    let expect_violation = expected.is_some();
    match scenario.await {
        Ok((report, detail)) => {
            let mut kinds: Vec<ViolationKind> = report.violations.iter().map(|v| v.kind).collect();
            kinds.sort();
            kinds.dedup();
            let pass = match expected {
                Some(kind) => report.count(kind) >= 1,
                None => report.violations.is_empty(),
            };
            ControlResult {
                name,
                row,
                expect_violation,
                expected,
                violations: report.violations.len(),
                kinds,
                pass,
                detail,
            }
        }
        Err(e) => ControlResult {
            name,
            row,
            expect_violation,
            expected,
            violations: 0,
            kinds: Vec::new(),
            pass: false,
            detail: format!("could not run: {e}"),
        },
    }
}
