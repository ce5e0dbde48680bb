//! End-to-end: the real `fredlock` binary against local redis-server nodes.
//!
//! Waits are bounded polls of a file or of the nodes (no sleep stands in for an event), and
//! timing bounds carry generous margins: CI machines are small and shared.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fredlock_testkit::{FaultProxy, LocalNodes};
use support::*;
use tokio::process::Command;
use tokio::time::Instant;

/// Critical sections from a log of `S id` / `E id` lines: whether any two overlap (a start
/// while another section is open).
fn overlaps(log: &str) -> bool {
    let mut open = 0;
    for line in log.lines() {
        if line.starts_with("S ") {
            open += 1;
            if open > 1 {
                return true;
            }
        } else if line.starts_with("E ") {
            open -= 1;
        }
    }
    false
}

/// A section that logs its start and end (with a timestamp) around a pause.
fn section(log: &Path, id: &str) -> Vec<String> {
    let script =
        r#"echo "S $1 $(date +%s.%N)" >> "$2"; sleep 0.3; echo "E $1 $(date +%s.%N)" >> "$2""#;
    vec![
        "sh".into(),
        "-c".into(),
        script.into(),
        "sh".into(),
        id.into(),
        log.display().to_string(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_on_one_name_never_overlap_and_without_the_lock_they_do() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let dir = Scratch::new("overlap");
    let log = dir.file("locked.log");
    let name = unique("overlap");
    // Two processes, three rounds each, all started together.
    let mut runs = Vec::new();
    for p in 0..2 {
        for round in 0..3 {
            let mut cmd = fredlock(&urls);
            cmd.args(["run", "--ttl", "5s", &name, "--"])
                .args(section(&log, &format!("p{p}r{round}")));
            runs.push(cmd.spawn().expect("spawn"));
        }
    }
    for run in &mut runs {
        assert_eq!(wait_exit(run, Duration::from_secs(60)).await, 0);
    }
    let locked = read(&log);
    assert_eq!(locked.lines().count(), 12, "{locked}");
    assert!(
        !overlaps(&locked),
        "sections overlapped under the lock:\n{locked}"
    );

    // The control: the same sections without fredlock overlap, so the check can fail.
    let free = dir.file("free.log");
    let mut direct = Vec::new();
    for p in 0..2 {
        let args = section(&free, &format!("p{p}"));
        let mut cmd = Command::new(&args[0]);
        cmd.args(&args[1..]);
        direct.push(cmd.spawn().expect("spawn"));
    }
    for d in &mut direct {
        assert_eq!(wait_exit(d, Duration::from_secs(10)).await, 0);
    }
    assert!(
        overlaps(&read(&free)),
        "the control did not overlap:\n{}",
        read(&free)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let name = unique("codes");
    let run = |args: &[&str]| {
        let mut cmd = fredlock(&urls);
        cmd.arg("run").args(args);
        cmd
    };
    // CMD's own code, and 128 + signal.
    let out = output(run(&[&name, "--", "sh", "-c", "exit 3"])).await;
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let out = output(run(&[&name, "--", "sh", "-c", "kill -TERM $$"])).await;
    assert_eq!(code(&out), 128 + SIGTERM, "{}", stderr(&out));
    // Stdout passes through.
    let out = output(run(&[&name, "--", "echo", "hello from CMD"])).await;
    assert_eq!(
        (code(&out), stdout(&out)),
        (0, "hello from CMD\n".to_string())
    );
    // Not found, not executable.
    let out = output(run(&[&name, "--", "/nonexistent/cmd"])).await;
    assert_eq!(code(&out), 127, "{}", stderr(&out));
    let out = output(run(&[&name, "--", "/"])).await;
    assert_eq!(code(&out), 126, "{}", stderr(&out));

    // Held by someone else: 75, a custom code, and after --wait.
    let holder = redlock(&urls, "the test's holder").await;
    let lock = holder
        .acquire(name.as_str(), Duration::from_secs(30))
        .await
        .expect("hold");
    let out = output(run(&["--no-wait", &name, "--", "true"])).await;
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the test's holder"),
        "{}",
        stderr(&out)
    );
    let out = output(run(&[
        "--no-wait",
        "--conflict-exit-code",
        "9",
        &name,
        "--",
        "true",
    ]))
    .await;
    assert_eq!(code(&out), 9);
    let started = Instant::now();
    let out = output(run(&["--wait", "600ms", &name, "--", "true"])).await;
    assert_eq!(code(&out), 75, "{}", stderr(&out));
    assert!(started.elapsed() >= Duration::from_millis(600));
    // Without a terminal, waiting is quiet: only the final message.
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(!stderr(&out).contains("waiting for"), "{}", stderr(&out));
    lock.release().await.expect("release");

    // Usage: 64.
    for args in [
        vec!["run", &name],
        vec!["run", "--ttl", "10x", &name, "--", "true"],
        vec!["run", "--wait", "1s", "--no-wait", &name, "--", "true"],
        vec!["run", "--conflict-exit-code", "300", &name, "--", "true"],
        vec!["break", &name],
        vec!["frobnicate"],
    ] {
        let mut cmd = fredlock(&urls);
        cmd.args(&args);
        let out = output(cmd).await;
        assert_eq!(code(&out), 64, "{args:?}: {}", stderr(&out));
    }
    let mut cmd = fredlock(&[]);
    cmd.args(["inspect", &name]);
    let out = output(cmd).await;
    assert_eq!(code(&out), 64);
    assert!(stderr(&out).contains("FREDLOCK_NODES"), "{}", stderr(&out));
    // --help documents the exit codes.
    let mut cmd = fredlock(&urls);
    cmd.arg("--help");
    let out = output(cmd).await;
    assert_eq!(code(&out), 0);
    assert!(stdout(&out).contains("EXIT CODES"), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_break_show_the_holders_label() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let name = unique("break");
    let holder = redlock(&urls, "backup job 42 on db-1").await;
    let lock = holder
        .acquire(name.as_str(), Duration::from_secs(30))
        .await
        .expect("hold");
    let guard = lock.keep_alive();

    let mut cmd = fredlock(&urls);
    cmd.args(["inspect", &name]);
    let out = output(cmd).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("held on a quorum"), "{text}");
    assert_eq!(text.matches("backup job 42 on db-1").count(), 4, "{text}");
    assert!(text.contains(&guard.fingerprint()), "{text}");
    assert!(!text.contains(guard.token()), "the token leaked:\n{text}");

    let mut cmd = fredlock(&urls);
    cmd.args(["inspect", "--json", &name]);
    let out = output(cmd).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["verdict"], "held");
    assert_eq!(v["holder"]["label"], "backup job 42 on db-1");
    assert_eq!(v["nodes"].as_array().map(Vec::len), Some(3));

    let mut cmd = fredlock(&urls);
    cmd.args(["break", &name, "--yes"]);
    let out = output(cmd).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("broke the lock of \"backup job 42 on db-1\""),
        "{text}"
    );
    assert!(text.contains("left"), "{text}");
    // The holder learns it lost the lock.
    let reason = tokio::time::timeout(Duration::from_secs(30), guard.lost())
        .await
        .expect("lost");
    assert_eq!(reason, fredlock::LostReason::TokenGone);
    let mut cmd = fredlock(&urls);
    cmd.args(["inspect", "--json", &name]);
    let v: serde_json::Value = serde_json::from_slice(&output(cmd).await.stdout).expect("JSON");
    assert_eq!(v["verdict"], "free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_finds_eviction_duplicates_and_a_lost_majority() {
    let mut nodes = LocalNodes::start_durable(3).await.expect("nodes");
    let urls = nodes.urls();
    let health = |urls: &[String], json: bool| {
        let mut cmd = fredlock(urls);
        cmd.arg("health");
        if json {
            cmd.arg("--json");
        }
        cmd
    };
    // Durable primaries with noeviction: healthy.
    let out = output(health(&urls, false)).await;
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("healthy"), "{}", stdout(&out));

    nodes
        .command(1, &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
        .await
        .expect("CONFIG SET");
    let out = output(health(&urls, true)).await;
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["status"], "degraded");
    assert_eq!(v["nodes"][1]["maxmemory_policy"], "allkeys-lru");
    let warned = v["nodes"][1]["warnings"].to_string();
    assert!(warned.contains("allkeys-lru"), "{warned}");
    assert_eq!(v["nodes"][0]["warnings"].as_array().map(Vec::len), Some(0));
    nodes
        .command(1, &["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .await
        .expect("CONFIG SET");

    // A server listed twice: node 0 again, behind a proxy (another address).
    let alias = FaultProxy::start(nodes.addr(0)).await.expect("proxy");
    let mut listed = urls.clone();
    listed.push(alias.url());
    let out = output(health(&listed, false)).await;
    assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("same server"), "{text}");
    assert!(text.contains("node 3"), "{text}");

    // A majority down: no quorum.
    nodes.kill(1).expect("kill");
    nodes.kill(2).expect("kill");
    let out = output(health(&urls, false)).await;
    assert_eq!(code(&out), 2, "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("DOWN"), "{}", stdout(&out));
}

/// A leader killed with SIGKILL: its CMD dies with it, and the other process leads within
/// TTL + a margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_hands_over_when_the_leader_is_killed() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let dir = Scratch::new("leader");
    let log = dir.file("leaders.log");
    let name = unique("leader");
    let ttl = Duration::from_secs(2);
    let mut procs = Vec::new();
    for id in ["A", "B"] {
        let mut cmd = fredlock(&urls);
        cmd.args(["leader", "--ttl", "2s", "--kill-after", "1s", &name, "--"])
            .args([
                "sh",
                "-c",
                r#"echo "lead $1 $$" >> "$2"; exec sleep 1000"#,
                "sh",
            ])
            .arg(id)
            .arg(&log);
        procs.push((id, cmd.spawn().expect("spawn")));
    }
    assert!(
        eventually(Duration::from_secs(20), || read(&log).lines().count() >= 1).await,
        "no leader"
    );
    let first = read(&log);
    let fields: Vec<&str> = first.split_whitespace().collect();
    let (leader, cmd_pid) = (fields[1].to_string(), fields[2].to_string());
    let Some(index) = procs.iter().position(|(id, _)| *id == leader) else {
        panic!("unknown leader {leader}");
    };
    let (_, mut killed) = procs.remove(index);
    let killed_at = Instant::now();
    signal(killed.id().expect("pid"), SIGKILL);
    let _ = killed.wait().await;
    // Its CMD dies with it (parent-death signal), so it never runs without the lock.
    let proc_dir = PathBuf::from(format!("/proc/{cmd_pid}"));
    assert!(
        eventually(Duration::from_secs(5), || !proc_dir.exists()
            || read(&proc_dir.join("stat")).contains(") Z"))
        .await,
        "the killed leader's CMD (pid {cmd_pid}) still runs"
    );
    assert!(
        eventually(ttl + Duration::from_secs(8), || read(&log).lines().count()
            >= 2)
        .await,
        "no handover:\n{}",
        read(&log)
    );
    let handover = killed_at.elapsed();
    let log_now = read(&log);
    let second = log_now.lines().nth(1).unwrap_or_default();
    assert!(!second.contains(&leader), "{log_now}");
    assert!(handover <= ttl + Duration::from_secs(8), "{handover:?}");
    eprintln!("handover after {handover:?} (TTL {ttl:?})");
    // The new leader stops cleanly on SIGTERM: passed to CMD, whose code becomes fredlock's.
    let (_, mut other) = procs.remove(0);
    signal(other.id().expect("pid"), SIGTERM);
    assert_eq!(
        wait_exit(&mut other, Duration::from_secs(20)).await,
        128 + SIGTERM
    );
}

/// The lock is broken while CMD runs: CMD gets SIGTERM, fredlock exits 76. Then SIGTERM to
/// fredlock itself reaches CMD, and the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_stops_cmd_and_signals_reach_it() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let dir = Scratch::new("lost");
    let log = dir.file("cmd.log");
    let name = unique("lost");
    let script = r#"trap 'echo got-term >> "$1"; exit 0' TERM; echo started >> "$1"; while true; do sleep 0.05; done"#;
    let start = |name: &str| {
        let mut cmd = fredlock(&urls);
        cmd.args(["run", "--ttl", "2s", "--kill-after", "5s", name, "--"])
            .args(["sh", "-c", script, "sh"])
            .arg(&log);
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        cmd.spawn().expect("spawn")
    };
    let mut run = start(&name);
    assert!(eventually(Duration::from_secs(20), || read(&log).contains("started")).await);
    let mut cmd = fredlock(&urls);
    cmd.args(["break", &name, "--yes"]);
    assert_eq!(code(&output(cmd).await), 0);
    assert!(
        eventually(Duration::from_secs(10), || read(&log).contains("got-term")).await,
        "CMD never got SIGTERM:\n{}",
        read(&log)
    );
    assert_eq!(wait_exit(&mut run, Duration::from_secs(20)).await, 76);

    // SIGTERM to fredlock: CMD's trap runs, its code (0) is fredlock's, the lock is released.
    std::fs::write(&log, "").expect("truncate");
    let name2 = unique("term");
    let mut run = start(&name2);
    assert!(eventually(Duration::from_secs(20), || read(&log).contains("started")).await);
    signal(run.id().expect("pid"), SIGTERM);
    assert_eq!(wait_exit(&mut run, Duration::from_secs(20)).await, 0);
    assert!(read(&log).contains("got-term"));
    let observer = redlock(&urls, "observer").await;
    let seen = observer.inspect(&name2).await.expect("inspect");
    assert!(seen.is_free(), "{seen:?}");
}

/// On a terminal, a waiting `run` says whom it waits for. The terminal is script(1)'s
/// pseudo-terminal (util-linux); skipped where there is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_on_a_terminal_shows_the_holder() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: script(1) is not installed");
        return;
    }
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let name = unique("tty");
    let holder = redlock(&urls, "report job (bob)").await;
    let lock = holder
        .acquire(name.as_str(), Duration::from_secs(30))
        .await
        .expect("hold");
    let line = format!(
        "{} run --wait 2500ms {name} -- true",
        env!("CARGO_BIN_EXE_fredlock")
    );
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"])
        .env("FREDLOCK_NODES", urls.join(","))
        .stdin(Stdio::null());
    let out = output(cmd).await;
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        shown.contains("waiting for") && shown.contains("report job (bob)"),
        "{shown}"
    );
    // Updated about once a second while it waits.
    assert!(shown.matches("waiting for").count() >= 2, "{shown}");
    lock.release().await.expect("release");
}

/// A node whose user may not run scripts on a server without DELIFEQ (Redis 7.0) can hold no
/// lock: `health` says why and what to do, and never calls it down (it answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_names_a_node_that_can_grant_no_lock() {
    let nodes = LocalNodes::start_on(fredlock_testkit::Server::Redis, 3)
        .await
        .expect("nodes");
    for i in 0..3 {
        let args = [
            "ACL",
            "SETUSER",
            "app",
            "on",
            ">pw-1",
            "~*",
            "&*",
            "+@all",
            "-@scripting",
        ];
        nodes.command(i, &args).await.expect("ACL SETUSER");
    }
    let app = |i: usize| format!("redis://app:pw-1@127.0.0.1:{}", nodes.port(i));
    let why = "has no DELIFEQ: grant +@scripting, or use Valkey >= 9.0 / Redis >= 8.4";

    // One such node: degraded, that node named with the server's words and the fix.
    let mut urls = nodes.urls();
    urls[0] = app(0);
    let mut cmd = fredlock(&urls);
    cmd.arg("health");
    let out = output(cmd).await;
    let text = stdout(&out);
    assert_eq!(code(&out), 1, "{text}{}", stderr(&out));
    let line = text
        .lines()
        .find(|l| l.starts_with("node 0"))
        .expect("node 0's line");
    assert!(line.contains("UNUSABLE (it answered)"), "{line}");
    assert!(
        line.contains("this user may not run scripts (NOPERM"),
        "{line}"
    );
    assert!(line.contains(why), "{line}");
    assert!(!text.contains("DOWN"), "{text}");

    // Every node: no quorum, each named, none called down.
    let urls: Vec<String> = (0..3).map(app).collect();
    let mut cmd = fredlock(&urls);
    cmd.arg("health");
    let out = output(cmd).await;
    let text = stdout(&out);
    assert_eq!(code(&out), 2, "{text}{}", stderr(&out));
    assert_eq!(text.matches(why).count(), 3, "{text}");
    assert!(!text.contains("DOWN"), "{text}");
}
