//! End-to-end, the real `fredlock` binary: `run --hold-at-least` (cron de-duplication, and its
//! refusal of a minimum longer than the TTL) and leases handed between processes (`acquire`,
//! `extend --lease`, `release --lease`).

mod support;

use std::process::Stdio;

use fredlock_testkit::LocalNodes;
use support::*;

/// Two "replicas" fire the same job one after the other, the second starting well within the
/// first one's minimum hold: with `--hold-at-least` the job runs once; without it (the
/// control), twice.
async fn runs_of_a_job(nodes: &[String], hold: Option<&str>) -> (usize, Vec<i32>) {
    let name = unique("cron");
    let dir = Scratch::new("cron");
    let file = dir.file("runs.log");
    let mut codes = Vec::new();
    for _ in 0..2 {
        let mut cmd = fredlock(nodes);
        cmd.args(["run", "--no-wait", "--ttl", "60s"]);
        if let Some(hold) = hold {
            cmd.args(["--hold-at-least", hold]);
        }
        cmd.arg(&name)
            .arg("--")
            .args(["sh", "-c", &format!("echo ran >> '{}'", file.display())]);
        codes.push(code(&output(cmd).await));
    }
    let runs = std::fs::read_to_string(&file)
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

/// A minimum longer than the TTL is refused as the library refuses it (exit 64, CMD never
/// run), against an explicit --ttl as against the default 30 s; the TTL is never raised.
#[tokio::test]
async fn a_minimum_longer_than_the_ttl_is_refused() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let dir = Scratch::new("hold-long");
    let file = dir.file("ran");
    for ttl in [Some("10s"), None] {
        let mut cmd = fredlock(&urls);
        cmd.args(["run", "--no-wait", "--hold-at-least", "1m"]);
        if let Some(ttl) = ttl {
            cmd.args(["--ttl", ttl]);
        }
        cmd.arg(unique("hold-long")).arg("--").args([
            "sh",
            "-c",
            &format!("echo ran >> '{}'", file.display()),
        ]);
        let out = output(cmd).await;
        assert_eq!(code(&out), 64, "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("--hold-at-least 1m is longer than --ttl"),
            "{err}"
        );
    }
    assert!(!file.exists(), "CMD ran");
}

/// A deploy pipeline: step one takes the lock and prints its lease, exits; a later step (another
/// process) extends it, then releases it. In between the lock is held (another acquire gets the
/// conflict code); afterwards the lease no longer holds (the distinct exit code), and bad lease
/// text is a usage error.
#[tokio::test]
async fn a_lease_passes_the_lock_between_processes() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let name = unique("deploy");
    let mut step1 = fredlock(&urls);
    step1.args(["acquire", &name, "--ttl", "10m"]);
    let out = output(step1).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let lease = stdout(&out).trim().to_string();
    assert!(lease.starts_with("fredlock-lease:"), "{lease:?}");

    // Held while the pipeline runs, though step one exited.
    let mut other = fredlock(&urls);
    other.args(["acquire", &name, "--ttl", "10s"]);
    let out = output(other).await;
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    assert!(stdout(&out).is_empty());

    // A later step extends it through FREDLOCK_LEASE and gets a new lease...
    let mut step2 = fredlock(&urls);
    step2
        .env("FREDLOCK_LEASE", &lease)
        .args(["extend", "--ttl", "20m"]);
    let out = output(step2).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let extended = stdout(&out).trim().to_string();
    assert!(extended.starts_with("fredlock-lease:") && extended != lease);
    let ttl = nodes
        .pttl(0, &format!("fredlock:{name}"))
        .await
        .expect("PTTL");
    assert!(ttl > 600_000, "extended to 20m: PTTL {ttl}");

    // ...and the last step releases it, reading the lease from stdin.
    let mut step3 = fredlock(&urls);
    step3
        .args(["release", "--lease", "-"])
        .stdin(Stdio::piped());
    step3.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = step3.spawn().expect("spawn");
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(format!("{extended}\n").as_bytes())
            .await
            .expect("write");
    }
    let out = child.wait_with_output().await.expect("release ran");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        nodes
            .get(0, &format!("fredlock:{name}"))
            .await
            .expect("GET"),
        None
    );

    // The lease no longer holds: release and extend say so with their own code.
    for args in [["release", "--lease"], ["extend", "--lease"]] {
        let mut again = fredlock(&urls);
        again.args(args).arg(&extended);
        let out = output(again).await;
        assert_eq!(code(&out), 76, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("no longer held"), "{}", stderr(&out));
    }
    // Garbage is a usage error that names the problem.
    let mut bad = fredlock(&urls);
    bad.args(["release", "--lease", "fredlock-lease:1:oops"]);
    let out = output(bad).await;
    assert_eq!(code(&out), 64);
    assert!(
        stderr(&out).contains("not a fredlock lease"),
        "{}",
        stderr(&out)
    );
}
