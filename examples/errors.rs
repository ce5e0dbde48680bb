//! Provokes every error fredlock returns, against local redis-server nodes it starts itself, and
//! prints each one's message as a Markdown table (the one in docs/guide.md, "Errors").
//!
//! ```text
//! make errors
//! ```

use std::time::Duration;

use fredlock::{Error, KeepAliveOptions, Redlock, Retry};
use fredlock_testkit::{FaultProxy, LocalNodes};

/// Rows of the table: the case, and the message fredlock gives.
type Rows = Vec<(&'static str, String)>;
/// What `main` and each step return.
type Run<T> = Result<T, Box<dyn std::error::Error>>;

/// The TTL of the locks taken to provoke the errors.
const TTL: Duration = Duration::from_secs(5);
/// The password node 0 is given half-way (it must never show in a message).
const SECRET: &str = "s3cret-pw";

#[tokio::main]
async fn main() -> Run<()> {
    let nodes = LocalNodes::start(3).await?;
    let mut rows = Rows::new();
    let redlock = quick(Redlock::builder().nodes(nodes.urls()))
        .build()
        .await?;
    lock_errors(&nodes, &redlock, &mut rows).await?;
    unreachable_nodes(&nodes, &mut rows).await?;
    without_quorum(&mut rows).await?;
    configuration_and_input(&nodes, &redlock, &mut rows).await?;
    semaphores_and_names(&redlock, &mut rows).await?;

    println!("| case | message |");
    println!("|---|---|");
    for (case, message) in rows {
        assert!(!message.contains(SECRET), "a password leaked: {message}");
        println!("| {case} | `{}` |", message.replace('|', "\\|"));
    }
    Ok(())
}

/// One attempt, a short wait for connections.
fn quick(b: fredlock::Builder) -> fredlock::Builder {
    b.retry(Retry::once())
        .connect_wait(Duration::from_millis(500))
}

/// Contention (a lock, a read-write lock's writer), a minimum hold longer than the TTL, a release after expiry, a TTL too short, a lock lost during `with_lock`.
async fn lock_errors(nodes: &LocalNodes, redlock: &Redlock, rows: &mut Rows) -> Run<()> {
    let held = redlock.acquire("orders:42", TTL).await?;
    rows.push(("contention", err(redlock.acquire("orders:42", TTL).await)));
    let rw = redlock.rwlock("catalog")?;
    let reader = rw.read(TTL).await?;
    rows.push((
        "a writer kept out by readers",
        err(rw.write(TTL).await.map(drop)),
    ));
    reader.release().await?;
    let hold = fredlock::AcquireOptions::new().hold_at_least(Duration::from_secs(60));
    rows.push((
        "a minimum hold longer than the TTL",
        err(redlock.acquire_using("orders:46", TTL, &hold).await),
    ));
    for i in 0..3 {
        nodes
            .command(i, &["DEL", &redlock.key("orders:42")])
            .await?;
    }
    rows.push(("release after the keys expired", err(held.release().await)));
    rows.push((
        "TTL too short for the network",
        err(redlock
            .acquire("orders:43", Duration::from_micros(2_100))
            .await),
    ));
    let lost = redlock.with_lock("orders:44", Duration::from_millis(300), |_| async {
        std::future::pending::<()>().await
    });
    let wipe = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        for i in 0..3 {
            let _ = nodes.command(i, &["DEL", &redlock.key("orders:44")]).await;
        }
        std::future::pending::<()>().await
    };
    tokio::select! { e = lost => rows.push(("lock lost during with_lock", err(e))), () = wipe => {} }
    Ok(())
}

/// Nodes that cannot be reached, each with its own cause. Leaves node 0 with a password.
async fn unreachable_nodes(nodes: &LocalNodes, rows: &mut Rows) -> Run<()> {
    nodes
        .command(0, &["CONFIG", "SET", "requirepass", SECRET])
        .await?;
    let refused = format!("redis://127.0.0.1:{}", free_port());
    let mixed = quick(Redlock::builder().nodes([
        format!("redis://:wrong-{SECRET}@127.0.0.1:{}", nodes.port(0)),
        refused.clone(),
        "redis://no-such-host.invalid:6379".to_string(),
    ]))
    .build()
    .await?;
    rows.push((
        "no quorum reachable (wrong password, refused, unknown host)",
        err(mixed.acquire("orders:42", TTL).await),
    ));
    // Credentials refused by (a quorum of) the nodes: build() fails at once.
    rows.push((
        "a node that needs a password (build)",
        err(
            quick(Redlock::builder().nodes([format!("redis://127.0.0.1:{}", nodes.port(0))]))
                .build()
                .await,
        ),
    ));
    rows.push((
        "an unknown ACL user (build)",
        err(quick(Redlock::builder().nodes([format!(
            "redis://nobody:{SECRET}@127.0.0.1:{}",
            nodes.port(1)
        )]))
        .build()
        .await),
    ));
    rows.push(("TLS: certificate not trusted", tls_failure(nodes).await?));
    rows.push((
        "strict build without a quorum",
        err(quick(Redlock::builder().nodes([
            refused.clone(),
            format!("redis://127.0.0.1:{}", free_port()),
        ]))
        .require_quorum(true)
        .build()
        .await),
    ));
    Ok(())
}

/// Extend and release without a quorum, and a semaphore permit's release.
async fn without_quorum(rows: &mut Rows) -> Run<()> {
    let mut fleet = LocalNodes::start(3).await?;
    let two_down = quick(Redlock::builder().nodes(fleet.urls()))
        .build()
        .await?;
    let mut lock = two_down.acquire("orders:45", TTL).await?;
    let permit = two_down.semaphore("pool:api", 2)?.acquire(TTL).await?;
    fleet.kill(1)?;
    fleet.kill(2)?;
    rows.push(("extend without a quorum", err(lock.extend(TTL).await)));
    rows.push(("release without a quorum", err(lock.release().await)));
    rows.push((
        "a semaphore permit's release without a quorum",
        err(permit.release().await),
    ));
    Ok(())
}

/// Configuration and input: a server listed twice, bad URLs, TTLs, keep-alive options.
async fn configuration_and_input(
    nodes: &LocalNodes,
    redlock: &Redlock,
    rows: &mut Rows,
) -> Run<()> {
    let alias = FaultProxy::start(nodes.addr(1)).await?;
    rows.push((
        "one server twice (database index)",
        err(Redlock::builder()
            .nodes([format!("{}/0", nodes.url(1)), format!("{}/1", nodes.url(1))])
            .build()
            .await),
    ));
    rows.push((
        "one server twice (an alias, found by run_id)",
        err(
            quick(Redlock::builder().nodes([nodes.url(1), alias.url(), nodes.url(2)]))
                .build()
                .await,
        ),
    ));
    for (case, url) in [
        ("empty URL", ""),
        ("URL without a scheme", "127.0.0.1:6379"),
        ("unsupported scheme", "http://127.0.0.1:6379"),
        (
            "bad port (the password is not shown)",
            "redis://app:s3cret-pw@127.0.0.1:port",
        ),
    ] {
        rows.push((case, err(Redlock::builder().nodes([url]).build().await)));
    }
    rows.push((
        "TTL of zero",
        err(redlock.acquire("orders:42", Duration::ZERO).await),
    ));
    rows.push((
        "TTL too large",
        err(redlock.acquire("orders:42", Duration::MAX).await),
    ));
    let lock = redlock.acquire("orders:45", TTL).await?;
    rows.push((
        "keep-alive option out of range",
        match lock.keep_alive_with(KeepAliveOptions::default().renew_when_left(f64::NAN)) {
            Ok(_) => "accepted".into(),
            Err(rejected) => rejected.error.to_string(),
        },
    ));
    Ok(())
}

/// Semaphores and reserved names.
async fn semaphores_and_names(redlock: &Redlock, rows: &mut Rows) -> Run<()> {
    rows.push((
        "semaphore with 0 permits",
        err(redlock.semaphore("pool:api", 0).map(|_| ())),
    ));
    let four = redlock.semaphore("pool:api", 4)?;
    let permit = four.acquire(TTL).await?;
    rows.push((
        "the same semaphore with another number of permits",
        err(redlock.semaphore("pool:api", 2)?.acquire(TTL).await),
    ));
    permit.release().await?;
    rows.push((
        "a resource name in the reserved ~ namespace",
        err(redlock.acquire("~fence:orders:42", TTL).await),
    ));
    Ok(())
}

fn err<T>(r: Result<T, Error>) -> String {
    match r {
        Ok(_) => "(no error)".into(),
        Err(e) => e.to_string(),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(1)
}

/// Node 2 also listens with TLS, with a self-signed certificate the client does not trust.
async fn tls_failure(nodes: &LocalNodes) -> Run<String> {
    if !cfg!(feature = "tls") {
        return Ok("(built without the tls feature)".into());
    }
    let dir = std::env::temp_dir().join(format!("fredlock-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&c, cert.cert.pem())?;
    std::fs::write(&k, cert.key_pair.serialize_pem())?;
    let port = free_port().to_string();
    let (c, k) = (c.to_string_lossy(), k.to_string_lossy());
    nodes
        .command(
            2,
            &[
                "CONFIG",
                "SET",
                "tls-cert-file",
                &c,
                "tls-key-file",
                &k,
                "tls-auth-clients",
                "no",
                "tls-port",
                &port,
            ],
        )
        .await?;
    let redlock = Redlock::builder()
        .nodes([format!("rediss://localhost:{port}")])
        .retry(Retry::once())
        .connect_wait(Duration::from_millis(500))
        .build()
        .await?;
    let message = err(redlock.acquire("orders:42", Duration::from_secs(5)).await);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(message)
}
