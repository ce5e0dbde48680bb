//! A degraded fleet, seen by a library user: `Redlock::node_status` names each node that does
//! not count and why, and a node that is not a Redis server says so, in the same words
//! wherever it shows. Each test here failed before (see comments).

mod common;

use std::time::Duration;

use common::unique;
use fredlock::{Error, NodeErrorKind, Redlock, Retry, Vote};
use fredlock_testkit::LocalNodes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The words every "not a Redis server" cause ends with.
const CHECK: &str = "is this port a Redis or Valkey server?";

/// A port that answers like an HTTP server (one 400 reply per connection).
async fn http_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let _ = socket.read(&mut request).await;
                let reply = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
                let _ = socket.write_all(reply).await;
            });
        }
    });
    port
}

/// A port that accepts connections and never answers.
async fn silent_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    port
}

/// One attempt per acquire; `build()` waits at most 300 ms for a quorum (well before a silent
/// port's first attempt fails, after 2 s).
fn build(urls: Vec<String>) -> fredlock::Builder {
    Redlock::builder()
        .nodes(urls)
        .retry(Retry::once())
        .node_timeout(Duration::from_millis(300))
        .connect_wait(Duration::from_millis(300))
}

/// Before: with a wrong password on one node of three, `build()` and acquires succeeded and
/// nothing a program could call said so (a WARN log without a subscriber, a gauge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refusing_the_password_is_reported() {
    let nodes = LocalNodes::start(3).await.expect("nodes");
    nodes
        .command(2, &["CONFIG", "SET", "requirepass", "right-pw"])
        .await
        .expect("requirepass");
    let mut urls = nodes.urls();
    urls[2] = format!("redis://:wrong-pw@127.0.0.1:{}", nodes.port(2));
    let redlock = build(urls).build().await.expect("a quorum accepts us");
    let lock = redlock
        .acquire(unique("degraded").as_str(), Duration::from_secs(5))
        .await
        .expect("two nodes grant");
    lock.release().await.expect("release");

    let status = redlock.settled_node_status(Duration::from_secs(5)).await;
    assert_eq!(status, redlock.node_status(), "settled, the same at once");
    let names = redlock.node_names();
    for (i, s) in status.iter().enumerate().take(2) {
        assert_eq!(s.name, names[i]);
        assert!(s.usable && s.reachable && !s.connecting, "{s:?}");
        assert_eq!(s.cause, None);
    }
    let s = &status[2];
    assert_eq!(s.name, names[2]);
    assert!(!s.usable && s.reachable && !s.connecting, "{s:?}");
    let cause = s.cause.as_ref().expect("a cause");
    assert_eq!(cause.kind, NodeErrorKind::Auth, "{cause}");
    assert!(cause.message.contains("WRONGPASS"), "{cause}");
    assert!(!cause.message.contains("wrong-pw"), "{cause}");
    assert_eq!(cause.node, names[2]);
}

/// Before: an HTTP server on a node's port gave "unexpected reply: not connected: Decode
/// Error: frame_type: Invalid frame type.", and a port that never answers "Connection closed
/// unexpectedly." (inspect, the CLI) or "Request timed out." (acquires): neither said what to
/// check. And the acquire's summary counted nodes two ways ("1 of 3 nodes answered, 1 of them
/// with an error ... (0 granted, 0 refused, 2 failed, 1 pending)").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_is_not_redis_says_so() {
    let nodes = LocalNodes::start(1).await.expect("nodes");
    let (http, silent) = (http_port().await, silent_port().await);
    let urls = vec![
        format!("redis://127.0.0.1:{http}"),
        format!("redis://127.0.0.1:{silent}"),
        nodes.url(0),
    ];
    let redlock = build(urls).build().await.expect("build");
    let r = unique("not-redis");

    // While the silent port's first attempt runs (it fails after 2 s): "not connected yet",
    // the same in an inspection and in an acquire's votes.
    let now = redlock.node_status();
    assert!(
        now[1].connecting && !now[1].usable && !now[1].reachable,
        "{now:?}"
    );
    let seen = redlock.inspect(r.as_str()).await.expect("inspect");
    let inspected = seen.nodes[1].state.as_ref().expect_err("not connected");
    assert!(
        inspected.message.contains("not connected yet"),
        "{inspected}"
    );
    let err = redlock
        .acquire(r.as_str(), Duration::from_secs(5))
        .await
        .expect_err("one node of three usable");
    counts_agree(&err);

    let status = redlock.settled_node_status(Duration::from_secs(10)).await;
    let (h, s) = (&status[0], &status[1]);
    let cause = h.cause.as_ref().expect("HTTP: a cause");
    assert!(h.reachable && !h.usable, "{h:?}");
    assert_eq!(cause.kind, NodeErrorKind::UnexpectedReply, "{cause}");
    assert!(cause.message.contains(CHECK), "{cause}");
    let cause = s.cause.as_ref().expect("silent: a cause");
    assert!(!s.reachable && !s.usable && !s.connecting, "{s:?}");
    assert_eq!(cause.kind, NodeErrorKind::Timeout, "{cause}");
    assert!(cause.message.contains(CHECK), "{cause}");
    assert!(!cause.message.contains("Request timed out"), "{cause}");

    // The same words in an inspection and in an acquire's error.
    let seen = redlock.inspect(r.as_str()).await.expect("inspect");
    let err = redlock
        .acquire(r.as_str(), Duration::from_secs(5))
        .await
        .expect_err("one node of three usable");
    let Error::Unavailable { votes, .. } = &err else {
        panic!("expected Unavailable: {err:?}");
    };
    for i in 0..2 {
        let inspected = seen.nodes[i].state.as_ref().expect_err("not usable");
        assert!(inspected.message.contains(CHECK), "{inspected}");
        if let Vote::Failed(e) = &votes.0[i] {
            assert!(e.message.contains(CHECK), "{e}");
        }
    }
    assert!(err.to_string().contains(CHECK), "{err}");
    counts_agree(&err);
}

/// The acquire's summary counts every node once: `A of N nodes answered, Q grants needed (g
/// granted, r refused, e answered with an error, u did not answer, p not waited for)`, with
/// A = g + r + e and N = g + r + e + u + p.
fn counts_agree(err: &Error) {
    let shown = err.to_string();
    let Error::Unavailable {
        nodes, reachable, ..
    } = err
    else {
        panic!("expected Unavailable: {err:?}");
    };
    assert!(
        shown.contains(&format!("{reachable} of {nodes} nodes answered")),
        "{shown}"
    );
    let inner = shown
        .split_once("needed (")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(inner, _)| inner)
        .unwrap_or_else(|| panic!("no breakdown: {shown}"));
    let mut counted = std::collections::HashMap::new();
    for part in inner.split(", ") {
        let (n, what) = part.split_once(' ').expect("`N what`");
        counted.insert(what, n.parse::<usize>().expect("a count"));
    }
    let of = |what: &str| counted.get(what).copied().unwrap_or(0);
    let answered = of("granted") + of("refused") + of("answered with an error");
    assert_eq!(answered, *reachable, "{shown}");
    let all = answered + of("did not answer") + of("not waited for");
    assert_eq!(all, *nodes, "{shown}");
    assert_eq!(counted.len(), inner.split(", ").count(), "{shown}");
}
