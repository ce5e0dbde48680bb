//! The report of a run ([`Report`]) and the markdown of one or more runs and the negative
//! controls.
//!
//! Owns presentation only: the table's rows (one group a function), the details under it, the
//! controls' table and the replay commands. Must not compute anything a verdict depends on
//! (the checker and the controls decide; this file prints what they found).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::config::TortureConfig;
use super::fault_kind::FaultKind;
use super::fleet::{Liveness, LivenessControl};
use super::stats::Stats;
use super::verdict::ControlResult;
use crate::checker::{CheckerReport, NoteKind, ViolationKind};

/// Everything one run produced.
#[derive(Debug, Clone)]
pub struct Report {
    /// The run's configuration.
    pub config: TortureConfig,
    /// Counters.
    pub stats: Stats,
    /// Faults injected: count and total time held, by kind.
    pub faults: BTreeMap<FaultKind, (u64, Duration)>,
    /// Episodes of the schedule that did not run: their nodes were all busy with another lane's
    /// episode (the cluster lanes 1 and 2 act only on free nodes), or their lane was held up
    /// until the clients had stopped.
    pub skipped_episodes: usize,
    /// Episodes in the schedule.
    pub episodes: usize,
    /// [`fingerprint`](super::fingerprint) of the schedule.
    pub fingerprint: u64,
    /// The checker's verdict.
    pub check: CheckerReport,
    /// Wall time of the whole run (set-up and checks included).
    pub wall: Duration,
    /// Lock keys left on the nodes right after the run (each checked to expire within the TTL).
    pub leftover_keys: usize,
    /// The worst wake-up delay of a probe task sleeping 5 ms at a time during the run: how late
    /// ANY timer of this process could fire (the yardstick for the lost-signal lateness).
    pub timer_lateness: Duration,
    /// Fleet mode: the liveness rows' verdict (see [`Liveness`](super::Liveness)).
    pub liveness: Option<Liveness>,
}

impl Report {
    /// Violations found (any kind).
    pub fn violations(&self) -> usize {
        self.check.violations.len()
    }
}

/// The runs' table: one row a measure, one cell a run.
struct Table<'a> {
    runs: &'a [Report],
    rows: Vec<(String, Vec<String>)>,
}

impl Table<'_> {
    fn row(&mut self, name: &str, f: &dyn Fn(&Report) -> String) {
        self.rows
            .push((name.to_string(), self.runs.iter().map(f).collect()));
    }
}

/// The report of one or more runs and the controls, as markdown: one column per run.
pub fn markdown(runs: &[Report], controls: &[ControlResult]) -> String {
    let mut out = String::new();
    if !runs.is_empty() {
        let mut table = Table {
            runs,
            rows: Vec::new(),
        };
        setup_rows(&mut table);
        outcome_rows(&mut table);
        section_rows(&mut table);
        probe_rows(&mut table);
        fault_and_violation_rows(&mut table);
        timing_and_note_rows(&mut table);
        liveness_rows(&mut table);
        write_table(&mut out, table);
        write_details(&mut out, runs);
    }
    if !controls.is_empty() {
        write_controls(&mut out, controls);
    }
    if !runs.is_empty() {
        write_replay(&mut out, runs);
    }
    out
}

/// What ran: the run's shape, seed, schedule and timeouts.
fn setup_rows(t: &mut Table) {
    t.row("mode", &|r| {
        match (r.config.fencing, r.config.cluster_shards.is_some()) {
            (true, false) => "locks, semaphores, fencing (durable nodes)",
            (false, false) => "locks, semaphores",
            (true, true) => "locks, semaphores, fencing (durable cluster nodes)",
            (false, true) => "locks, semaphores (cluster nodes)",
        }
        .to_string()
    });
    t.row("nodes N / clients K / resources M (+ foreign)", &|r| {
        let nodes = match r.config.cluster_shards {
            Some(shards) => format!("{} clusters of {shards} shards", r.config.nodes),
            None => r.config.nodes.to_string(),
        };
        format!(
            "{nodes} / {} / {} (+{})",
            r.config.clients, r.config.resources, r.config.foreign_resources
        )
    });
    t.row("duration (run / wall incl. set-up and checks)", &|r| {
        format!(
            "{:.0} s / {:.1} s",
            r.config.duration.as_secs_f64(),
            r.wall.as_secs_f64()
        )
    });
    t.row("seed", &|r| r.config.seed.to_string());
    t.row("schedule: episodes / fingerprint", &|r| {
        format!("{} / {:016x}", r.episodes, r.fingerprint)
    });
    // Only where it says something: plain nodes' lanes keep to their schedule.
    let shown = t
        .runs
        .iter()
        .any(|r| r.config.cluster_shards.is_some() || r.skipped_episodes > 0);
    if shown {
        t.row(
            "schedule: episodes skipped (nodes busy, or lane late at the end)",
            &|r| r.skipped_episodes.to_string(),
        );
    }
    t.row("TTL range / node timeout (patient)", &|r| {
        format!(
            "{}-{} ms / {} ms ({} ms)",
            r.config.ttl_min.as_millis(),
            r.config.ttl_max.as_millis(),
            r.config.node_timeout.as_millis(),
            r.config.patient_node_timeout.as_millis()
        )
    });
}

/// What the acquisitions got.
fn outcome_rows(t: &mut Table) {
    t.row("acquisitions attempted", &|r| r.stats.attempted.to_string());
    t.row("granted", &|r| r.stats.granted.to_string());
    t.row("failed: Contended", &|r| r.stats.contended.to_string());
    t.row("failed: Unavailable", &|r| r.stats.unavailable.to_string());
    t.row("failed: ValidityExpired", &|r| {
        r.stats.validity_expired.to_string()
    });
    t.row("granted, then Lost (keep-alive / with_lock)", &|r| {
        r.stats.lost.to_string()
    });
    t.row("failed: other", &|r| r.stats.other.to_string());
}

/// What was done under the locks: windows, writes, extends, releases, stale locks.
fn section_rows(t: &mut Table) {
    t.row("windows checked (grant x resource)", &|r| {
        r.check.windows.to_string()
    });
    t.row("critical sections verified (>= 1 write in window)", &|r| {
        r.check.verified_sections.to_string()
    });
    t.row(
        "counter writes completed / uncertain / skipped by guard",
        &|r| {
            format!(
                "{} / {} / {}",
                r.check.writes_completed, r.check.writes_uncertain, r.stats.writes_skipped
            )
        },
    );
    t.row("extends ok / attempted (live locks)", &|r| {
        format!("{} / {}", r.stats.extends_ok, r.stats.extends)
    });
    t.row("keys re-set on nodes that had lost them (repairs)", &|r| {
        r.stats.repairs.to_string()
    });
    t.row("releases ok / not held / failed", &|r| {
        format!(
            "{} / {} / {}",
            r.stats.releases_ok, r.stats.releases_not_held, r.stats.releases_failed
        )
    });
    t.row("stale extends / stale releases (with a new holder)", &|r| {
        format!(
            "{} / {} ({})",
            r.stats.stale_extends,
            r.stats.stale_releases + r.stats.stale_releases_with_holder,
            r.stats.stale_releases_with_holder
        )
    });
}

/// The probes, the checks run, and the data node's health.
fn probe_rows(t: &mut Table) {
    t.row("takeover / revival probes", &|r| {
        format!("{} / {}", r.stats.takeovers, r.stats.revivals)
    });
    t.row("foreign-resource attempts", &|r| {
        r.stats.foreign_attempts.to_string()
    });
    t.row("quorum inspections after grant", &|r| {
        r.stats.quorum_checks.to_string()
    });
    t.row("semaphore permits granted", &|r| {
        r.stats.permits.to_string()
    });
    t.row("read-write lock: reads / writes granted", &|r| {
        format!("{} / {}", r.stats.rw_reads, r.stats.rw_writes)
    });
    t.row(
        "leases resumed / failed; resumed after the deadline: refused",
        &|r| {
            let s = &r.stats;
            format!(
                "{} / {}; {}",
                s.leases_resumed, s.leases_failed, s.leases_refused
            )
        },
    );
    t.row(
        "fenced writes accepted / refused (in window); stalled past deadline: accepted / refused",
        &|r| {
            let s = &r.stats;
            format!(
                "{} / {}; {} / {}",
                s.fenced_accepted,
                s.fenced_refused,
                s.fenced_stale_accepted,
                s.fenced_stale_refused
            )
        },
    );
    t.row("S6 clean-up probes: cancelled / failed / released", &|r| {
        let p = r.stats.cleanup_probes;
        format!("{} / {} / {}", p[0], p[1], p[2])
    });
    t.row("checks run", &|r| {
        r.check
            .checks
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    });
    t.row("data-node errors", &|r| r.stats.data_errors.to_string());
}

/// The faults injected and the violations found, by kind: the kinds any of the runs can take
/// (plain nodes' first), "-" where a run's nodes cannot take the kind.
fn fault_and_violation_rows(t: &mut Table) {
    let mut kinds: Vec<FaultKind> = Vec::new();
    for kind in FaultKind::ALL.into_iter().chain(FaultKind::CLUSTER) {
        let taken = t
            .runs
            .iter()
            .any(|r| r.config.fault_kinds().contains(&kind));
        if taken && !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    for kind in kinds {
        let name = match kind.row() {
            "" => format!("fault (cluster): {}", kind.describe()),
            row => format!("fault row {row}: {}", kind.describe()),
        };
        t.row(&name, &move |r| {
            if !r.config.fault_kinds().contains(&kind) {
                return "-".to_string();
            }
            match r.faults.get(&kind) {
                Some((n, d)) => format!("{n} / {:.1} s", d.as_secs_f64()),
                None => "0".to_string(),
            }
        });
    }
    for kind in ViolationKind::ALL {
        t.row(&format!("violations {}", kind.describe()), &move |r| {
            r.check.count(kind).to_string()
        });
    }
    t.row("**violations total**", &|r| {
        format!("**{}**", r.violations())
    });
}

/// Margins, lags and lateness; the notes by kind; the keys left at the end.
fn timing_and_note_rows(t: &mut Table) {
    t.row("smallest safety margin", &|r| {
        r.check
            .min_margin
            .as_ref()
            .map_or("-".to_string(), |m| m.to_string())
    });
    t.row("max extend start lag / max lost-signal lateness", &|r| {
        format!(
            "{} / {}",
            r.check
                .max_extend_lag
                .map_or("-".into(), |d| format!("{:.3} ms", d.as_secs_f64() * 1e3)),
            r.check
                .max_lost_lateness
                .map_or("-".into(), |d| format!("{:.3} ms", d.as_secs_f64() * 1e3))
        )
    });
    t.row("max timer lateness (5 ms scheduler probe)", &|r| {
        format!("{:.3} ms", r.timer_lateness.as_secs_f64() * 1e3)
    });
    for kind in [
        NoteKind::LateWrite,
        NoteKind::LostUpdateOutsideAssumptions,
        NoteKind::GrantReturnedExpired,
        NoteKind::LostSignalLate,
        NoteKind::UnclosedWindow,
    ] {
        t.row(
            &format!("note (not a violation): {}", kind.describe()),
            &move |r| r.check.note_count(kind).to_string(),
        );
    }
    t.row(
        "lock keys left at the end (all expiring within TTL)",
        &|r| r.leftover_keys.to_string(),
    );
}

/// Fleet mode's liveness rows (only when a run is in fleet mode).
fn liveness_rows(t: &mut Table) {
    if t.runs.iter().all(|r| r.liveness.is_none()) {
        return;
    }
    let names = [
        "fleet liveness: acquisitions/s per hot resource (floor: the same run's uncontended client)",
        "fleet liveness: longest wait (floor: a fair turn for every waiter + the run's worst outage)",
        "fleet liveness: verdict",
    ];
    for (i, name) in names.into_iter().enumerate() {
        t.row(name, &move |r| {
            r.liveness
                .as_ref()
                .map_or("-".into(), |l| l.cells()[i].clone())
        });
    }
}

/// The liveness controls' table: each contender, its rows and whether the verdict is the one
/// expected.
pub fn liveness_markdown(controls: &[LivenessControl]) -> String {
    let mut out = String::from(
        "\n| liveness control | acquisitions/s per hot resource | longest wait | verdict | expected | result |\n|---|---|---|---|---|---|\n",
    );
    for c in controls {
        let [rates, wait, verdict] = c.liveness.cells();
        let _ = writeln!(
            out,
            "| {} | {rates} | {wait} | {verdict} | {} | {} |",
            c.liveness.label,
            if c.expect_flagged { "flagged" } else { "live" },
            if c.pass { "PASS" } else { "**FAIL**" }
        );
    }
    out
}

/// The table itself, one column per run.
fn write_table(out: &mut String, table: Table) {
    let runs = table.runs;
    let _ = write!(out, "| |");
    for r in runs {
        let _ = write!(out, " {} |", r.config.label());
    }
    let _ = write!(out, "\n|---|");
    for _ in runs {
        let _ = write!(out, "---|");
    }
    out.push('\n');
    for (name, cells) in table.rows {
        let _ = writeln!(out, "| {name} | {} |", cells.join(" | "));
    }
}

/// Under the table: each run's first violations, first notes and other errors.
fn write_details(out: &mut String, runs: &[Report]) {
    for r in runs {
        if !r.check.violations.is_empty() {
            let _ = writeln!(out, "\nFirst violations ({}):", r.config.label());
            for v in r.check.violations.iter().take(5) {
                let _ = writeln!(
                    out,
                    "- {} at +{:.3}s: {}",
                    v.kind,
                    v.at.as_secs_f64(),
                    v.detail
                );
            }
        }
        let interesting: Vec<_> = r
            .check
            .notes
            .iter()
            .filter(|n| n.kind != NoteKind::GrantReturnedExpired)
            .take(3)
            .collect();
        if !interesting.is_empty() {
            let _ = writeln!(out, "\nFirst notes ({}, not violations):", r.config.label());
            for n in interesting {
                let _ = writeln!(out, "- {}: {}", n.kind.describe(), n.detail);
            }
        }
        if !r.stats.other_errors.is_empty() {
            let _ = writeln!(
                out,
                "\nOther errors ({}): {:?}",
                r.config.label(),
                r.stats.other_errors
            );
        }
    }
}

/// The negative controls' table.
fn write_controls(out: &mut String, controls: &[ControlResult]) {
    let _ = writeln!(
        out,
        "\n| negative control | row | expected | got | kinds | result |\n|---|---|---|---|---|---|"
    );
    for c in controls {
        let kinds: Vec<&str> = c.kinds.iter().map(|k| k.describe()).collect();
        let _ = writeln!(
            out,
            "| {} ({}) | {} | {} | {} | {} | {} |",
            c.name,
            c.detail,
            c.row,
            match c.expected {
                Some(ViolationKind::Overlap) => ">= 1 overlap".to_string(),
                Some(kind) => format!(">= 1 {kind}"),
                None => "0".to_string(),
            },
            c.violations,
            if kinds.is_empty() {
                "-".to_string()
            } else {
                kinds.join(", ")
            },
            if c.pass { "PASS" } else { "**FAIL**" }
        );
    }
}

/// How to replay each run.
fn write_replay(out: &mut String, runs: &[Report]) {
    let _ = writeln!(
        out,
        "\nReplay (same fault schedule and per-client operation sequences; timing-dependent interleavings differ):"
    );
    for r in runs {
        let _ = writeln!(
            out,
            "- {}: `{}`",
            r.config.label(),
            r.config.replay_command()
        );
    }
}
