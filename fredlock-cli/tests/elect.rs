//! End-to-end: `fredlock leader --value --priority`, `fredlock observe` and the election part
//! of `fredlock inspect`, with the real binary against local redis-server nodes.

mod support;

use std::process::Stdio;
use std::time::Duration;

use fredlock::ElectOptions;
use fredlock_testkit::LocalNodes;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_gives_cmd_its_term_and_value() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let name = unique("term");
    let out = std::env::temp_dir().join(format!("{name}.out"));
    let mut cmd = fredlock(&urls);
    cmd.args([
        "leader",
        "--ttl",
        "5s",
        "--value",
        "10.1.2.3:8080",
        "--priority",
        "3",
        &name,
        "--",
    ])
    .args([
        "sh",
        "-c",
        &format!(
            "echo \"$FREDLOCK_TERM $FREDLOCK_LEADER_VALUE\" > {}",
            out.display()
        ),
    ]);
    let status = tokio::time::timeout(Duration::from_secs(30), cmd.status())
        .await
        .expect("finished")
        .expect("ran");
    assert_eq!(status.code(), Some(0));
    let written = std::fs::read_to_string(&out).expect("CMD wrote its environment");
    let _ = std::fs::remove_file(&out);
    let (term, value) = written.trim().split_once(' ').expect("two fields");
    assert_eq!(value, "10.1.2.3:8080");
    let term: u64 = term.parse().expect("a term number");
    assert!(term >= 1);
    // CMD exited, so the leader resigned: nobody leads, and the next term is larger.
    let r = redlock(&urls, "elect-test").await;
    assert_eq!(r.leader_of(&name).await.expect("read"), None);
    let e = r
        .elect(name.as_str(), Duration::from_secs(5))
        .expect("elect");
    assert!(e.leader().await.number() > term);
    e.resign().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_prints_one_json_line_per_change_and_inspect_shows_the_term() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let name = unique("observe");
    let mut child = fredlock(&urls)
        .args(["observe", &name])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(next(&mut lines).await["leader"], serde_json::Value::Null);
    let r = redlock(&urls, "elect-test").await;
    let options = ElectOptions::default().value("10.0.0.7:9000");
    let e = r
        .elect_with_options(name.as_str(), Duration::from_secs(30), options)
        .expect("elect");
    let term = e.leader().await;
    let line = next(&mut lines).await;
    assert_eq!(line["leader"]["value"], "10.0.0.7:9000");
    assert_eq!(line["leader"]["term"], term.number());
    e.proclaim("10.0.0.8:9000").await.expect("proclaim");
    assert_eq!(next(&mut lines).await["leader"]["value"], "10.0.0.8:9000");

    // inspect shows the value and term, in text and JSON.
    let out = fredlock(&urls)
        .args(["inspect", &name])
        .output()
        .await
        .expect("inspect");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(&format!("leader \"10.0.0.8:9000\", term {}", term.number())),
        "{text}"
    );
    let out = fredlock(&urls)
        .args(["inspect", "--json", &name])
        .output()
        .await
        .expect("inspect");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["election"]["term"], term.number());

    e.resign().await;
    assert_eq!(next(&mut lines).await["leader"], serde_json::Value::Null);
    // Interrupted is the normal end.
    signal(child.id().expect("pid"), SIGINT);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exited")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_and_inspect_show_the_label_given_to_leader() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    let urls = nodes.urls();
    let name = unique("label");
    let mut observe = fredlock(&urls)
        .args(["observe", &name])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn observe");
    let mut lines = BufReader::new(observe.stdout.take().expect("stdout")).lines();
    assert_eq!(next(&mut lines).await["leader"], serde_json::Value::Null);
    let mut leader = fredlock(&urls)
        .args([
            "leader",
            "--label",
            "sched-a",
            "--value",
            "10.0.0.9:80",
            &name,
            "--",
        ])
        .args(["sleep", "60"])
        .spawn()
        .expect("spawn leader");
    let line = next(&mut lines).await;
    assert_eq!(line["leader"]["value"], "10.0.0.9:80", "{line}");
    assert_eq!(line["leader"]["label"], "sched-a", "{line}");
    let out = output({
        let mut cmd = fredlock(&urls);
        cmd.args(["inspect", "--json", &name]);
        cmd
    })
    .await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["election"]["label"], "sched-a", "{json}");
    assert_eq!(json["holder"]["label"], "sched-a", "{json}");

    // SIGTERM goes on to CMD, whose exit ends the term: observe says so.
    signal(leader.id().expect("pid"), SIGTERM);
    assert_eq!(wait_exit(&mut leader, Duration::from_secs(20)).await, 143);
    assert_eq!(next(&mut lines).await["leader"], serde_json::Value::Null);
    signal(observe.id().expect("pid"), SIGINT);
    assert_eq!(wait_exit(&mut observe, Duration::from_secs(10)).await, 0);
}

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

/// The next JSON line `fredlock observe` prints (within 10 s).
async fn next(lines: &mut Lines) -> serde_json::Value {
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("a line within 10 s")
        .expect("read")
        .expect("not closed");
    serde_json::from_str(&line).expect("JSON")
}
