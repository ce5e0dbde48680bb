//! Proves the testkit itself works against real `redis-server` processes:
//! node lifecycle and control, the raw RESP client, and every proxy fault.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use fredlock_testkit::{
    from_env_or_start, resp_command, Blackhole, Fault, FaultProxy, LocalNodes, RespValue, Server,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

/// Long enough that a reply which is going to come has come (loopback).
const SILENCE: Duration = Duration::from_millis(300);
/// Generous bound for replies that must arrive.
const ANSWER: Duration = Duration::from_secs(5);

fn simple(s: &str) -> RespValue {
    RespValue::Simple(s.to_owned())
}

fn bulk(s: &str) -> RespValue {
    RespValue::Bulk(Some(s.as_bytes().to_vec()))
}

/// A raw client connection that keeps unparsed bytes between replies, so
/// tests control exactly when requests are written and replies awaited.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn connect(addr: SocketAddr) -> io::Result<Conn> {
        Ok(Conn {
            stream: TcpStream::connect(addr).await?,
            buf: Vec::new(),
        })
    }

    async fn send(&mut self, args: &[&str]) -> io::Result<()> {
        self.stream
            .write_all(&RespValue::encode_command(args))
            .await
    }

    /// Next reply, or `TimedOut` if none is complete within `limit`.
    async fn recv(&mut self, limit: Duration) -> io::Result<RespValue> {
        let read = async {
            loop {
                if let Some((value, used)) = RespValue::parse(&self.buf)? {
                    self.buf.drain(..used);
                    return Ok(value);
                }
                if self.stream.read_buf(&mut self.buf).await? == 0 {
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                }
            }
        };
        timeout(limit, read)
            .await
            .unwrap_or_else(|_| Err(io::Error::from(io::ErrorKind::TimedOut)))
    }

    async fn call(&mut self, args: &[&str]) -> io::Result<RespValue> {
        self.send(args).await?;
        self.recv(ANSWER).await
    }

    /// Sends every request, then checks that no reply comes (a fault withholds them).
    async fn unanswered(&mut self, requests: &[&[&str]]) {
        for args in requests {
            self.send(args).await.unwrap();
        }
        assert_timed_out(self.recv(SILENCE).await);
    }
}

/// One node, a proxy in front of it (passing), and a connection through the proxy.
async fn proxied() -> (LocalNodes, FaultProxy, Conn) {
    let nodes = LocalNodes::start(1).await.unwrap();
    let proxy = FaultProxy::start(nodes.addr(0)).await.unwrap();
    let conn = Conn::connect(proxy.addr()).await.unwrap();
    (nodes, proxy, conn)
}

/// The peer closed the connection or reset it (which one depends on timing).
fn assert_closed(err: &io::Error) {
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof
        ),
        "{err}"
    );
}

fn assert_timed_out(result: io::Result<RespValue>) {
    match result {
        Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
}

/// Polls until connecting to `addr` is refused (listeners close asynchronously).
async fn assert_refused_soon(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match TcpStream::connect(addr).await {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(10)).await,
            other => panic!("{addr} still accepts connections: {other:?}"),
        }
    }
}

#[tokio::test]
async fn three_independent_nodes_answer_commands() {
    let nodes = LocalNodes::start(3).await.unwrap();
    assert_eq!(nodes.len(), 3);
    assert!(!nodes.is_empty());

    let urls = nodes.urls();
    assert_eq!(urls.len(), 3);
    for (i, url) in urls.iter().enumerate() {
        assert_eq!(url, &format!("redis://127.0.0.1:{}", nodes.port(i)));
        assert_eq!(url, &nodes.url(i));
        assert!(nodes.is_running(i));
    }
    let mut ports: Vec<u16> = (0..3).map(|i| nodes.port(i)).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3, "ports must be distinct: {ports:?}");

    for i in 0..3 {
        assert_eq!(nodes.command(i, &["PING"]).await.unwrap(), simple("PONG"));
        let value = format!("value-{i}");
        assert_eq!(
            nodes.command(i, &["SET", "key", &value]).await.unwrap(),
            simple("OK")
        );
        assert_eq!(
            nodes.command(i, &["GET", "key"]).await.unwrap(),
            RespValue::Bulk(Some(value.into_bytes()))
        );
    }
    // Independent: a key on one node is not on the others.
    nodes.set(0, "only-on-0", "x").await.unwrap();
    assert_eq!(
        nodes.get(0, "only-on-0").await.unwrap().as_deref(),
        Some("x")
    );
    assert_eq!(nodes.get(1, "only-on-0").await.unwrap(), None);
    assert_eq!(nodes.get(2, "only-on-0").await.unwrap(), None);

    // Server errors are values, not I/O errors.
    match nodes.command(0, &["NO-SUCH-COMMAND"]).await.unwrap() {
        RespValue::Error(e) => assert!(e.starts_with("ERR"), "{e}"),
        other => panic!("expected an error reply, got {other:?}"),
    }
    // Arrays and integers come back structured.
    assert_eq!(
        nodes
            .command(0, &["RPUSH", "list", "a", "b"])
            .await
            .unwrap(),
        RespValue::Integer(2)
    );
    assert_eq!(
        nodes
            .command(0, &["LRANGE", "list", "0", "-1"])
            .await
            .unwrap(),
        RespValue::Array(Some(vec![bulk("a"), bulk("b"),]))
    );
    // Bad indexes are errors, not panics.
    assert_eq!(
        nodes.command(3, &["PING"]).await.unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
}

#[tokio::test]
async fn convenience_helpers_work() {
    let nodes = LocalNodes::start(1).await.unwrap();
    nodes.set(0, "lock:a", "token").await.unwrap();
    nodes.set(0, "lock:b", "token").await.unwrap();
    nodes.set(0, "other", "x").await.unwrap();

    assert_eq!(nodes.pttl(0, "lock:a").await.unwrap(), -1);
    assert_eq!(nodes.pttl(0, "missing").await.unwrap(), -2);
    assert!(nodes.pexpire(0, "lock:a", 10_000).await.unwrap());
    assert!(!nodes.pexpire(0, "missing", 10_000).await.unwrap());
    let ttl = nodes.pttl(0, "lock:a").await.unwrap();
    assert!((9_000..=10_000).contains(&ttl), "ttl {ttl}");

    let mut keys = nodes.keys(0, "lock:*").await.unwrap();
    keys.sort();
    assert_eq!(keys, ["lock:a", "lock:b"]);

    // SCRIPT FLUSH makes a cached script unknown again.
    let sha = match nodes
        .command(0, &["SCRIPT", "LOAD", "return 1"])
        .await
        .unwrap()
    {
        RespValue::Bulk(Some(sha)) => String::from_utf8(sha).unwrap(),
        other => panic!("SCRIPT LOAD: {other:?}"),
    };
    assert_eq!(
        nodes.command(0, &["EVALSHA", &sha, "0"]).await.unwrap(),
        RespValue::Integer(1)
    );
    nodes.script_flush(0).await.unwrap();
    match nodes.command(0, &["EVALSHA", &sha, "0"]).await.unwrap() {
        RespValue::Error(e) => assert!(e.starts_with("NOSCRIPT"), "{e}"),
        other => panic!("expected NOSCRIPT, got {other:?}"),
    }

    // CLIENT PAUSE: no answers during the pause, answers after it.
    nodes.client_pause(0, 600).await.unwrap();
    assert_timed_out(nodes.command_timeout(0, &["PING"], SILENCE).await);
    assert_eq!(nodes.command(0, &["PING"]).await.unwrap(), simple("PONG"));

    nodes.flushall(0).await.unwrap();
    assert!(nodes.keys(0, "*").await.unwrap().is_empty());
}

#[tokio::test]
async fn killed_node_refuses_and_restarts_empty_on_same_port() {
    let mut nodes = LocalNodes::start(3).await.unwrap();
    for i in 0..3 {
        nodes.set(i, "survivor", "yes").await.unwrap();
    }
    let port = nodes.port(1);

    nodes.kill(1).unwrap();
    assert!(!nodes.is_running(1));
    assert_eq!(nodes.pid(1), None);
    let err = nodes.command(1, &["PING"]).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    assert!(nodes.pause(1).is_err(), "cannot pause a dead node");
    // Killing again is a no-op; the other nodes are untouched.
    nodes.kill(1).unwrap();
    assert_eq!(
        nodes.get(0, "survivor").await.unwrap().as_deref(),
        Some("yes")
    );

    nodes.restart(1).await.unwrap();
    assert!(nodes.is_running(1));
    assert_eq!(nodes.port(1), port);
    assert_eq!(nodes.command(1, &["PING"]).await.unwrap(), simple("PONG"));
    assert_eq!(nodes.get(1, "survivor").await.unwrap(), None);
    assert!(nodes.keys(1, "*").await.unwrap().is_empty());

    // restart of a running node: also kill -9 and empty.
    nodes.set(2, "k", "v").await.unwrap();
    let old_pid = nodes.pid(2).unwrap();
    nodes.restart(2).await.unwrap();
    assert_ne!(nodes.pid(2), Some(old_pid));
    assert_eq!(nodes.get(2, "k").await.unwrap(), None);

    // kill + start_node: same port, empty.
    nodes.set(0, "k", "v").await.unwrap();
    let port0 = nodes.port(0);
    nodes.kill(0).unwrap();
    nodes.start_node(0).await.unwrap();
    assert_eq!(nodes.port(0), port0);
    assert_eq!(nodes.get(0, "k").await.unwrap(), None);
    // start_node on a running node changes nothing.
    let pid = nodes.pid(0);
    nodes.start_node(0).await.unwrap();
    assert_eq!(nodes.pid(0), pid);
}

#[tokio::test]
async fn a_durable_node_keeps_acknowledged_writes_across_kill_9() {
    let mut nodes = LocalNodes::start_durable(2).await.unwrap();
    nodes.set(0, "counter", "41").await.unwrap();
    nodes.set(1, "counter", "41").await.unwrap();
    nodes.kill(0).unwrap();
    nodes.start_node(0).await.unwrap();
    assert_eq!(
        nodes.get(0, "counter").await.unwrap().as_deref(),
        Some("41")
    );
    nodes.restart(1).await.unwrap();
    assert_eq!(
        nodes.get(1, "counter").await.unwrap().as_deref(),
        Some("41")
    );
    // Nodes started fresh (a new LocalNodes) never see an earlier run's data.
    let fresh = LocalNodes::start_durable(1).await.unwrap();
    assert_eq!(fresh.get(0, "counter").await.unwrap(), None);
}

#[tokio::test]
async fn paused_node_times_out_and_answers_after_resume() {
    let nodes = LocalNodes::start(2).await.unwrap();
    nodes.pause(0).unwrap();
    assert!(nodes.is_running(0), "a stopped process is still running");
    assert_timed_out(nodes.command_timeout(0, &["PING"], SILENCE).await);
    // The other node is unaffected.
    assert_eq!(nodes.command(1, &["PING"]).await.unwrap(), simple("PONG"));

    // A command sent while paused is answered once the node resumes.
    let mut conn = Conn::connect(nodes.addr(0)).await.unwrap();
    conn.send(&["SET", "during-pause", "1"]).await.unwrap();
    assert_timed_out(conn.recv(SILENCE).await);
    nodes.resume(0).unwrap();
    assert_eq!(conn.recv(ANSWER).await.unwrap(), simple("OK"));
    assert_eq!(
        nodes.get(0, "during-pause").await.unwrap().as_deref(),
        Some("1")
    );
}

#[tokio::test]
async fn drop_kills_every_process() {
    let mut nodes = LocalNodes::start(3).await.unwrap();
    nodes.pause(1).unwrap(); // a stopped process must die too
    nodes.kill(2).unwrap();
    let pids: Vec<u32> = (0..2).map(|i| nodes.pid(i).unwrap()).collect();
    let addrs: Vec<SocketAddr> = (0..3).map(|i| nodes.addr(i)).collect();
    drop(nodes);
    for addr in addrs {
        let err = TcpStream::connect(addr).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    }
    if cfg!(target_os = "linux") {
        for pid in pids {
            // Reaped, so not even a zombie is left.
            assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        }
    }
}

#[tokio::test]
async fn from_env_or_start_starts_local_nodes_without_env() {
    if std::env::var_os("FREDLOCK_NODES").is_some() {
        return; // Configured for external nodes; covered by the unit test.
    }
    let mut nodes = from_env_or_start(2).await.unwrap();
    let urls = nodes.urls();
    assert_eq!(urls.len(), 2);
    let local = nodes.local().unwrap();
    assert_eq!(urls, local.urls());
    assert_eq!(local.command(1, &["PING"]).await.unwrap(), simple("PONG"));
    nodes.local_mut().unwrap().kill(1).unwrap();
    assert!(!nodes.local().unwrap().is_running(1));
}

/// Runs `missing_binary_child` in a child test process with a bogus binary
/// path: changing the environment inside this multi-threaded test process
/// would race with the other tests.
#[test]
fn missing_binary_error_says_how_to_install() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["missing_binary_child", "--exact", "--nocapture"])
        .env("FREDLOCK_REDIS_SERVER", "/nonexistent/redis-server")
        .env("FREDLOCK_VALKEY_SERVER", "/nonexistent/valkey-server")
        .env("FREDLOCK_TESTKIT_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn missing_binary_child() {
    if std::env::var_os("FREDLOCK_TESTKIT_CHILD").is_none() {
        return; // Only meaningful when run by the test above.
    }
    // On the server `FREDLOCK_SERVER` names (the matrix runs this on both), each with its hint.
    let hint = match Server::from_env().unwrap() {
        Server::Redis => {
            "install it with `apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis`"
        }
        Server::Valkey => "run `make valkey-server`",
    };
    let err = LocalNodes::start(1).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    let msg = err.to_string();
    assert!(msg.contains(hint), "{msg}");
}

#[tokio::test]
async fn proxy_pass_forwards_both_ways() {
    let nodes = LocalNodes::start(1).await.unwrap();
    let proxy = FaultProxy::start(nodes.addr(0)).await.unwrap();
    assert_eq!(proxy.fault(), Fault::Pass);
    assert_eq!(proxy.upstream(), nodes.addr(0));
    assert_eq!(proxy.url(), format!("redis://{}", proxy.addr()));
    assert_ne!(proxy.addr(), nodes.addr(0));

    let reply = resp_command(proxy.addr(), &["PING"], ANSWER).await.unwrap();
    assert_eq!(reply, simple("PONG"));
    let mut conn = Conn::connect(proxy.addr()).await.unwrap();
    assert_eq!(
        conn.call(&["SET", "via-proxy", "1"]).await.unwrap(),
        simple("OK")
    );
    // The write really reached the node.
    assert_eq!(
        nodes.get(0, "via-proxy").await.unwrap().as_deref(),
        Some("1")
    );
    // A reply bigger than one proxy chunk arrives whole.
    let big = "x".repeat(200_000);
    assert_eq!(
        conn.call(&["SET", "big", &big]).await.unwrap(),
        simple("OK")
    );
    assert_eq!(
        conn.call(&["GET", "big"]).await.unwrap(),
        RespValue::Bulk(Some(big.into_bytes()))
    );
    assert_eq!(proxy.connections(), 2);
}

#[tokio::test]
async fn proxy_blackhole_swallows_then_pass_resumes_with_new_data() {
    let (nodes, proxy, mut conn) = proxied().await;
    assert_eq!(conn.call(&["PING"]).await.unwrap(), simple("PONG"));

    proxy.set(Fault::Blackhole);
    assert_eq!(proxy.fault(), Fault::Blackhole);
    conn.unanswered(&[&["PING"]]).await;
    // Requests are not forwarded either: the SET never reaches the node.
    conn.send(&["SET", "blackholed", "1"]).await.unwrap();
    assert_timed_out(conn.recv(SILENCE).await);
    assert_eq!(nodes.get(0, "blackholed").await.unwrap(), None);
    // New connections are accepted but silent too.
    let mut fresh = Conn::connect(proxy.addr()).await.unwrap();
    fresh.send(&["PING"]).await.unwrap();
    assert_timed_out(fresh.recv(SILENCE).await);

    proxy.set(Fault::Pass);
    // Swallowed bytes are gone; new bytes pass, and only their reply comes.
    assert_eq!(conn.call(&["ECHO", "after"]).await.unwrap(), bulk("after"));
    assert_timed_out(conn.recv(SILENCE).await);
    assert_eq!(fresh.call(&["PING"]).await.unwrap(), simple("PONG"));
}

#[tokio::test]
async fn proxy_hold_replies_delivers_after_switch() {
    let (nodes, proxy, mut conn) = proxied().await;

    proxy.set(Fault::HoldReplies);
    conn.unanswered(&[&["SET", "held", "1"], &["ECHO", "second"]])
        .await;
    // The request did reach the node; only the reply is held.
    assert_eq!(nodes.get(0, "held").await.unwrap().as_deref(), Some("1"));

    proxy.set(Fault::Pass);
    assert_eq!(conn.recv(ANSWER).await.unwrap(), simple("OK"));
    assert_eq!(conn.recv(ANSWER).await.unwrap(), bulk("second"));
    assert_eq!(conn.call(&["PING"]).await.unwrap(), simple("PONG"));
}

#[tokio::test]
async fn proxy_drop_replies_loses_the_reply() {
    let (nodes, proxy, mut conn) = proxied().await;

    proxy.set(Fault::DropReplies);
    conn.unanswered(&[&["SET", "dropped-reply", "1"]]).await;
    // The write happened even though the client never heard back.
    assert_eq!(
        nodes.get(0, "dropped-reply").await.unwrap().as_deref(),
        Some("1")
    );

    proxy.set(Fault::Pass);
    // The lost "+OK" never shows up: the next reply is the PING's.
    assert_eq!(conn.call(&["PING"]).await.unwrap(), simple("PONG"));
    assert_timed_out(conn.recv(SILENCE).await);
}

#[tokio::test]
async fn proxy_latency_delays_replies_in_order() {
    let (_nodes, proxy, mut conn) = proxied().await;
    let delay = Duration::from_millis(200);

    proxy.set(Fault::Latency(delay));
    let started = Instant::now();
    assert_eq!(conn.call(&["PING"]).await.unwrap(), simple("PONG"));
    assert!(started.elapsed() >= delay, "{:?}", started.elapsed());

    // Three requests 50 ms apart: replies keep their order, and each is
    // delayed from its own arrival, so delays do not add up (~300 ms, not 600).
    let started = Instant::now();
    for word in ["a", "b", "c"] {
        conn.send(&["ECHO", word]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for word in ["a", "b", "c"] {
        assert_eq!(
            conn.recv(ANSWER).await.unwrap(),
            RespValue::Bulk(Some(word.as_bytes().to_vec()))
        );
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= delay + Duration::from_millis(100) && elapsed < Duration::from_millis(550),
        "{elapsed:?}"
    );

    proxy.set(Fault::Pass);
    let started = Instant::now();
    assert_eq!(conn.call(&["PING"]).await.unwrap(), simple("PONG"));
    assert!(started.elapsed() < delay, "{:?}", started.elapsed());
}

#[tokio::test]
async fn proxy_reset_aborts_open_and_new_connections() {
    let (_nodes, proxy, mut conn) = proxied().await;
    assert_eq!(conn.call(&["PING"]).await.unwrap(), simple("PONG"));

    proxy.set(Fault::Reset);
    // The open connection is reset without any request being sent.
    let err = conn.recv(ANSWER).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");

    // New connections are accepted by the kernel, then reset at once.
    let mut fresh = Conn::connect(proxy.addr()).await.unwrap();
    let _ = fresh.send(&["PING"]).await; // may already fail with the RST
    let err = fresh.recv(ANSWER).await.unwrap_err();
    assert_closed(&err);

    proxy.set(Fault::Pass);
    let mut conn = Conn::connect(proxy.addr()).await.unwrap();
    assert_eq!(conn.call(&["PING"]).await.unwrap(), simple("PONG"));
    assert_eq!(proxy.connections(), 3);
}

#[tokio::test]
async fn proxy_follows_the_node_and_stops_on_drop() {
    let mut nodes = LocalNodes::start(1).await.unwrap();
    let proxy = FaultProxy::start(nodes.addr(0)).await.unwrap();
    let mut conn = Conn::connect(proxy.addr()).await.unwrap();
    assert_eq!(conn.call(&["PING"]).await.unwrap(), simple("PONG"));

    // Node killed: the relayed connection closes, new ones are refused (reset).
    nodes.kill(0).unwrap();
    let err = conn.recv(ANSWER).await.unwrap_err();
    assert_closed(&err);
    let err = resp_command(proxy.addr(), &["PING"], ANSWER)
        .await
        .unwrap_err();
    assert_closed(&err);

    // Node back: the same proxy reaches it again.
    nodes.restart(0).await.unwrap();
    let mut conn = Conn::connect(proxy.addr()).await.unwrap();
    assert_eq!(conn.call(&["PING"]).await.unwrap(), simple("PONG"));

    // Dropping the proxy closes relayed connections and the listener.
    let addr = proxy.addr();
    drop(proxy);
    let err = conn.recv(ANSWER).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
    assert_refused_soon(addr).await;
}

#[tokio::test]
async fn blackhole_listener_never_answers() {
    let hole = Blackhole::start().await.unwrap();
    assert_eq!(hole.url(), format!("redis://{}", hole.addr()));
    let mut conn = Conn::connect(hole.addr()).await.unwrap();
    conn.send(&["PING"]).await.unwrap();
    assert_timed_out(conn.recv(SILENCE).await);
    assert_timed_out(resp_command(hole.addr(), &["PING"], SILENCE).await);
    assert_eq!(hole.connections(), 2);

    let addr = hole.addr();
    drop(hole);
    let err = conn.recv(ANSWER).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
    assert_refused_soon(addr).await;
}
