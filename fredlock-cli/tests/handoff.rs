//! End-to-end, the real `fredlock` binary: `run --hold-at-least` (cron de-duplication) and
//! leases handed between processes (`acquire`, `extend --lease`, `release --lease`).

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use fredlock_testkit::LocalNodes;
use tokio::process::Command;

/// The binary, with `nodes` as FREDLOCK_NODES and no other fredlock variable.
fn fredlock(nodes: &[String]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fredlock"));
    cmd.env("FREDLOCK_NODES", nodes.join(","))
        .env_remove("FREDLOCK_PREFIX")
        .env_remove("FREDLOCK_LABEL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn output(mut cmd: Command) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("fredlock finished within 60 s")
        .expect("fredlock ran")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("an exit code")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn unique(name: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::UNIX_EPOCH
            .elapsed()
            .map_or(0, |d| d.as_nanos()),
    );
    format!("cli-{name}-{:016x}", h.finish())
}

/// A scratch file path, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Two "replicas" fire the same job one after the other, the second starting well within the
/// first one's minimum hold: with `--hold-at-least` the job runs once; without it (the
/// control), twice.
async fn runs_of_a_job(nodes: &[String], hold: Option<&str>) -> (usize, Vec<i32>) {
    let name = unique("cron");
    let file = Scratch(std::env::temp_dir().join(unique("cron-log")));
    let mut codes = Vec::new();
    for _ in 0..2 {
        let mut cmd = fredlock(nodes);
        cmd.args(["run", "--no-wait", "--ttl", "60s"]);
        if let Some(hold) = hold {
            cmd.args(["--hold-at-least", hold]);
        }
        cmd.arg(&name)
            .arg("--")
            .args(["sh", "-c", &format!("echo ran >> '{}'", file.0.display())]);
        codes.push(code(&output(cmd).await));
    }
    let runs = std::fs::read_to_string(&file.0)
        .unwrap_or_default()
        .lines()
        .count();
    (runs, codes)
}

#[tokio::test]
async fn a_cron_job_fired_twice_runs_once_with_hold_at_least() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    // Each run takes well under a second; the minimum is far longer than two of them.
    let (runs, codes) = runs_of_a_job(&urls, Some("60s")).await;
    assert_eq!(runs, 1, "exit codes {codes:?}");
    assert_eq!(codes, vec![0, 75]);
    // The control: without the minimum, the first release lets the second replica in.
    let (runs, codes) = runs_of_a_job(&urls, None).await;
    assert_eq!(runs, 2, "exit codes {codes:?}");
    assert_eq!(codes, vec![0, 0]);
}
