//! What a new user tripped over, end to end: the real `fredlock` binary against local
//! redis-server nodes. Each test failed before its fix (see the comments).
//!
//! Waits are bounded polls of a file or of the process (no sleep stands in for an event);
//! the bounds that are the feature (within about a second) carry generous margins.

mod support;

use std::process::Stdio;
use std::time::Duration;

use fredlock_testkit::LocalNodes;
use support::*;
use tokio::time::Instant;

/// Node names as fredlock shows them (`127.0.0.1:PORT/0`).
fn shown(nodes: &LocalNodes, i: usize) -> String {
    format!("127.0.0.1:{}/0", nodes.port(i))
}

/// Before: with every node refusing connections and no `--wait`, `run` waited forever and
/// printed nothing (and `leader` too). Now it says at once why (each node's cause) and exits
/// 69 once no quorum answered for `--no-quorum-timeout` (default 10 s, from the start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_run_and_leader_say_why_and_give_up() {
    let mut nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    for i in 0..3 {
        nodes.kill(i).expect("kill");
    }
    let dir = Scratch::new("no-quorum");
    let errors = dir.file("stderr");
    let name = unique("no-quorum");
    // The default bound: the causes at once, 69 after about 10 s.
    let mut cmd = fredlock(&urls);
    cmd.args(["run", &name, "--", "true"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&errors).expect("stderr file"));
    let started = Instant::now();
    let mut run = cmd.spawn().expect("spawn");
    assert!(
        eventually(Duration::from_secs(8), || read(&errors)
            .contains("Connection refused"))
        .await,
        "no cause said within 8 s: {}",
        read(&errors)
    );
    let said = read(&errors);
    for i in 0..3 {
        assert!(said.contains(&shown(&nodes, i)), "{said}");
    }
    assert_eq!(wait_exit(&mut run, Duration::from_secs(40)).await, 69);
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(10), "gave up after {took:?}");
    let said = read(&errors);
    assert!(said.contains("--no-quorum-timeout"), "{said}");

    // A bound of one's own; and `leader`.
    for sub in ["run", "leader"] {
        let mut cmd = fredlock(&urls);
        cmd.args([sub, "--no-quorum-timeout", "1s", &name, "--", "true"]);
        let out = output(cmd).await;
        assert_eq!(code(&out), 69, "{sub}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("Connection refused"),
            "{sub}: {}",
            stderr(&out)
        );
    }
}

/// Before: `--no-quorum-timeout` counted from the end of the connect wait (2 s with every node
/// refusing), so `run` and `leader` gave up 2 s late (12 s for the default 10 s). Now the
/// connect wait is part of it. The bound is the feature, measured from the first notice (made
/// right after the connect wait, so the process's start-up under load does not count): with a
/// 4 s bound the exit came 4 s after it before, about 2 s after it now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_no_quorum_timeout_includes_the_connect_wait() {
    let mut nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    for i in 0..3 {
        nodes.kill(i).expect("kill");
    }
    let dir = Scratch::new("no-quorum-late");
    for sub in ["run", "leader"] {
        let errors = dir.file(&format!("{sub}.stderr"));
        let mut cmd = fredlock(&urls);
        cmd.args([
            sub,
            "--no-quorum-timeout",
            "4s",
            &unique("late"),
            "--",
            "true",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&errors).expect("stderr file"));
        let started = Instant::now();
        let mut child = cmd.spawn().expect("spawn");
        let noticed = eventually(Duration::from_secs(30), || {
            read(&errors).contains("cannot reach a quorum")
        })
        .await;
        assert!(noticed, "{sub}: {}", read(&errors));
        let notice = Instant::now();
        assert_eq!(wait_exit(&mut child, Duration::from_secs(30)).await, 69);
        let (took, after_notice) = (started.elapsed(), notice.elapsed());
        assert!(
            took >= Duration::from_secs(4),
            "{sub}: gave up after {took:?}"
        );
        assert!(
            after_notice < Duration::from_millis(3_500),
            "{sub}: gave up {after_notice:?} after the first notice: the connect wait was not counted"
        );
    }
}

/// Before: one node down made `inspect` say "split: no holder on a quorum" and exit 0 for a
/// free lock. A node that did not answer is neither a holder nor a split.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_break_with_nodes_down() {
    let mut nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let held = unique("held");
    let free = unique("free");
    let holder = redlock(&urls, "held by the test").await;
    let lock = holder
        .acquire(held.as_str(), Duration::from_secs(60))
        .await
        .expect("hold");
    nodes.kill(2).expect("kill");
    let down = shown(&nodes, 2);
    let run = |args: &[&str]| {
        let mut cmd = fredlock(&urls);
        cmd.args(args);
        output(cmd)
    };

    let out = run(&["inspect", &free]).await;
    assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!("free on 2 of 3 nodes; {down} did not answer")),
        "{text}"
    );
    assert!(!text.contains("split"), "{text}");
    let out = run(&["inspect", "--json", &free]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["verdict"], "free");
    assert_eq!(v["answered"], 2);
    assert_eq!(v["unanswered"][0], down.as_str());

    let out = run(&["inspect", &held]).await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("held on a quorum by \"held by the test\""),
        "{text}"
    );
    assert!(text.contains(&format!("{down} did not answer")), "{text}");

    // break: 1 when a node did not answer (it may still hold the key).
    let out = run(&["break", &held, "--yes"]).await;
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stdout(&out).contains("did not answer"), "{}", stdout(&out));
    drop(lock);

    // Two of three down: no quorum answered, 69, and the verdict is unknown.
    nodes.kill(1).expect("kill");
    let out = run(&["inspect", "--json", &free]).await;
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["verdict"], "unknown");
    let out = run(&["break", &free, "--yes"]).await;
    assert_eq!(code(&out), 69, "{}", stderr(&out));
}

/// Before: `break` reached a `fredlock run` holder only at its next extension, about 19 s
/// later with the default `--ttl 30s`. Now within about a second (a check every second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_stops_a_running_command_within_about_a_second() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let dir = Scratch::new("break-fast");
    let log = dir.file("cmd.log");
    let name = unique("break-fast");
    let script = r#"trap 'echo got-term >> "$1"; exit 0' TERM; echo started >> "$1"; while true; do sleep 0.05; done"#;
    let mut cmd = fredlock(&urls);
    cmd.args(["run", &name, "--"])
        .args(["sh", "-c", script, "sh"])
        .arg(&log)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut run = cmd.spawn().expect("spawn");
    assert!(eventually(Duration::from_secs(20), || read(&log).contains("started")).await);
    let mut cmd = fredlock(&urls);
    cmd.args(["break", &name, "--yes"]);
    assert_eq!(code(&output(cmd).await), 0);
    let broken_at = Instant::now();
    assert!(
        eventually(Duration::from_secs(30), || read(&log).contains("got-term")).await,
        "CMD never got SIGTERM"
    );
    let took = broken_at.elapsed();
    eprintln!("CMD stopped {took:?} after the break");
    // About a second (a check every second, each bounded by 500 ms); 5 s is the margin.
    assert!(took <= Duration::from_secs(5), "took {took:?}");
    assert_eq!(wait_exit(&mut run, Duration::from_secs(20)).await, 76);
}

/// Before: a node that refused our credentials was silent: `run --no-wait` ran CMD, exit 0,
/// nothing on stderr. Now `run` names the node and the server's words, `health` shows it, and
/// when no quorum accepts the credentials `run` exits 69 at once (the library's `build()` fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refusing_credentials_is_named() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    nodes
        .command(2, &["CONFIG", "SET", "requirepass", "cli-secret"])
        .await
        .expect("requirepass");
    let name = unique("auth");
    let mut cmd = fredlock(&urls);
    cmd.args(["run", "--no-wait", &name, "--", "echo", "ran"]);
    let out = output(cmd).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "ran\n");
    let said = stderr(&out);
    assert!(said.contains("NOAUTH"), "{said}");
    assert!(said.contains(&shown(&nodes, 2)), "{said}");
    assert!(said.contains("2 of 3 nodes usable"), "{said}");

    let mut cmd = fredlock(&urls);
    cmd.args(["health", "--allow", "no-persistence"]);
    let out = output(cmd).await;
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    assert!(stdout(&out).contains("NOAUTH"), "{}", stdout(&out));

    nodes
        .command(1, &["CONFIG", "SET", "requirepass", "cli-secret"])
        .await
        .expect("requirepass");
    let mut cmd = fredlock(&urls);
    cmd.args(["run", "--no-wait", &name, "--", "echo", "ran"]);
    let out = output(cmd).await;
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert!(stderr(&out).contains("NOAUTH"), "{}", stderr(&out));
}

/// Before: `health` exited 1 "degraded" on nodes run in memory on purpose, with no way to
/// acknowledge it. Now each warning has a stable id and `--allow ID` makes it a note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_can_allow_a_warning_by_its_id() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let health = |args: &[&str]| {
        let mut cmd = fredlock(&urls);
        cmd.arg("health").args(args);
        output(cmd)
    };
    let out = health(&["--json"]).await;
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["nodes"][0]["warnings"][0]["id"], "no-persistence");
    assert!(v["nodes"][0]["warnings"][0]["message"]
        .as_str()
        .is_some_and(|m| m.contains("no persistence")));

    let out = health(&["--allow", "no-persistence"]).await;
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert!(stdout(&out).contains("healthy"), "{}", stdout(&out));
    assert!(stdout(&out).contains("note (allowed)"), "{}", stdout(&out));
    let out = health(&["--allow", "no-persistence", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["status"], "healthy");
    assert_eq!(v["nodes"][1]["notes"][0]["id"], "no-persistence");

    // Another warning is not covered by that allowance; --allow is repeatable.
    nodes
        .command(0, &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
        .await
        .expect("CONFIG SET");
    let out = health(&["--allow", "no-persistence"]).await;
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    assert!(stdout(&out).contains("[eviction]"), "{}", stdout(&out));
    let out = health(&["--allow", "no-persistence", "--allow", "eviction"]).await;
    assert_eq!(code(&out), 0, "{}", stdout(&out));

    // Unknown ids, and a server listed twice (never acceptable), are usage errors.
    for id in ["no-such-warning", "duplicate"] {
        let out = health(&["--allow", id]).await;
        assert_eq!(code(&out), 64, "{id}: {}", stderr(&out));
    }
}

/// Before: `--nodes` with the URLs separated by spaces failed with "invalid port number".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_may_be_separated_by_spaces() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let name = unique("spaces");
    for list in [
        urls.join(" "),
        urls.join(", "),
        format!(" {} \n", urls.join("  ")),
    ] {
        let mut cmd = fredlock(&[]);
        cmd.args(["--nodes", &list, "inspect", &name]);
        let out = output(cmd).await;
        assert_eq!(code(&out), 0, "{list:?}: {}", stderr(&out));
        assert!(stdout(&out).contains(": free"), "{}", stdout(&out));
        let mut cmd = fredlock(&[]);
        cmd.env("FREDLOCK_NODES", &list).args(["inspect", &name]);
        let out = output(cmd).await;
        assert_eq!(code(&out), 0, "{list:?}: {}", stderr(&out));
    }
}
