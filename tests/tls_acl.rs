//! ACL users and TLS, against local nodes (TLS always on redis-server, see its test): every
//! operation works for an ACL user limited to fredlock's key prefix and the commands fredlock
//! sends (the rule docs/operations.md gives operators), the same user cannot touch other keys, a
//! user missing a command gets the server's NOPERM in the error, and `rediss://` URLs work with a
//! private CA.
//!
//! One `#[test]` per concern, each with its own runtime: the TLS test sets `SSL_CERT_FILE` (the
//! variable rustls' native roots read), which is process-wide, so it runs in this binary alone.

mod common;

use std::time::Duration;

use fredlock::fred::prelude::KeysInterface;
use fredlock::{Error, Redlock, Retry, Vote};
use fredlock_testkit::{LocalNodes, RespValue, Server};

const PASSWORD: &str = "locker-secret-7";
const TTL: Duration = Duration::from_secs(10);

/// The ACL rule from docs/operations.md (user name and password aside), for prefix `fredlock:`.
const RULE: &[&str] = &[
    "on",
    "resetkeys",
    "~fredlock:*",
    "resetchannels",
    "&fredlock:*",
    "-@all",
    "+set",
    "+eval",
    "+evalsha",
    "+info",
    "+ping",
    "+subscribe",
    "+unsubscribe",
    "+get",
    "+mget",
    "+del",
    "+exists",
    "+pexpire",
    "+pttl",
    "+publish",
    "+zadd",
    "+zrange",
    "+zrem",
    "+zrank",
    "+zpopmin",
    "+sadd",
    "+srem",
    "+smembers",
    "+hset",
    "+hget",
    "+hmget",
    "+client|id",
];

/// The documented rule for these nodes' server: on Valkey (9.0 or newer) it adds `+delifeq`, so
/// that plain locks release without Lua; without it the connect-time probe of `DELIFEQ` is
/// refused, which `ACL LOG` records. (Redis 7 refuses a rule naming a command it lacks.)
fn documented(nodes: &LocalNodes) -> Vec<&'static str> {
    let mut rule = RULE.to_vec();
    if nodes.server() == fredlock_testkit::Server::Valkey {
        rule.push("+delifeq");
    }
    rule
}

async fn add_user(nodes: &LocalNodes, user: &str, rule: &[&str]) {
    let password = format!(">{PASSWORD}");
    for i in 0..nodes.len() {
        let mut args = vec!["ACL", "SETUSER", user];
        args.extend_from_slice(rule);
        args.push(&password);
        let reply = nodes.command(i, &args).await.expect("ACL SETUSER");
        assert!(format!("{reply:?}").contains("OK"), "{reply:?}");
    }
}

fn user_urls(nodes: &LocalNodes, user: &str) -> Vec<String> {
    (0..nodes.len())
        .map(|i| format!("redis://{user}:{PASSWORD}@127.0.0.1:{}", nodes.port(i)))
        .collect()
}

/// A one-node Redlock on `url`, one attempt per acquire.
async fn one_node(url: &str) -> Redlock {
    Redlock::builder()
        .nodes([url])
        .retry(Retry::once())
        .require_quorum(true)
        .build()
        .await
        .expect("build")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Every operation as a user who may only touch `fredlock:*` keys and channels and run the
/// commands of the documented rule; the ACL log stays empty (nothing was refused).
#[test]
fn an_acl_user_limited_to_the_prefix_can_do_everything() {
    runtime().block_on(async {
        let nodes = LocalNodes::start(3).await.expect("nodes");
        add_user(&nodes, "locker", &documented(&nodes)).await;
        let redlock = Redlock::builder()
            .nodes(user_urls(&nodes, "locker"))
            .retry(common::fast_retry())
            .fencing_tokens(true)
            .require_quorum(true)
            .build()
            .await
            .expect("build as the ACL user");
        exercise(&redlock).await;
        redlock.close().await;
        nothing_refused(&nodes).await;
    });
}

/// A user whose rule predates `ZPOPMIN` (the documented rule before 2026-11-29): the head that a
/// release wakes still gets its gate's vote (the gate looks at the line instead of popping it),
/// so the lock holds the gate's key too, and the gate keeps its lines. Fails when the pop's
/// refusal fails the gate's script, or ends the node's lines (a waiter then polls).
#[test]
fn a_rule_without_zpopmin_still_gives_the_woken_head_its_gate() {
    runtime().block_on(async {
        let nodes = LocalNodes::start(3).await.expect("nodes");
        let rule: Vec<&str> = documented(&nodes)
            .into_iter()
            .filter(|c| *c != "+zpopmin")
            .collect();
        add_user(&nodes, "older", &rule).await;
        let build = || async {
            Redlock::builder()
                .nodes(user_urls(&nodes, "older"))
                .retry(Retry {
                    attempts: u32::MAX,
                    delay: Duration::from_secs(2),
                    jitter: Duration::ZERO,
                })
                .build()
                .await
                .expect("build as the ACL user")
        };
        let (holder, waiter) = (build().await, build().await);
        let r = "acl:woken";
        let gate = waiter.line_node(r).expect("a gate");
        let held = holder.acquire(r, TTL).await.expect("acquire");
        let task = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.acquire(r, TTL).await }
        });
        // In line, and listening for its wake-up on the gate.
        let listening = common::eventually(Duration::from_secs(5), || async {
            common::pubsub_clients(&nodes, gate).await > 0
        });
        assert!(listening.await, "the waiter never subscribed");
        held.release().await.expect("release");
        let lock = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the woken head took the lock")
            .expect("waiter task")
            .expect("acquire");
        // The acquire returns at a quorum: the gate's answer (here its script's turn, after the
        // refused pop) may land after the other two nodes'.
        let key = waiter.key(r);
        let ours = RespValue::Bulk(Some(lock.value().as_bytes().to_vec()));
        let on_gate = common::eventually(Duration::from_secs(5), || async {
            nodes.command(gate, &["GET", &key]).await.expect("GET") == ours
        });
        assert!(on_gate.await, "the gate did not grant the woken head");
        // The refused pop did not end the gate's lines: the waiter lines up there again.
        lock.release().await.expect("release");
        let held = holder.acquire(r, TTL).await.expect("acquire");
        let task = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.acquire(r, TTL).await }
        });
        assert!(
            common::lines::line_has(&nodes, &waiter, r, 1).await,
            "the waiter's gate keeps no line since the pop was refused"
        );
        held.release().await.expect("release");
        let lock = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the woken head took the lock again")
            .expect("waiter task")
            .expect("acquire");
        lock.release().await.expect("release");
        holder.close().await;
        waiter.close().await;
    });
}

/// The ACL log of every node is empty: no command, key or channel was refused (fred, for one,
/// sends `CLIENT ID` on every new connection and shrugs off a refusal, so only the log shows it).
async fn nothing_refused(nodes: &LocalNodes) {
    for i in 0..nodes.len() {
        let log = nodes.command(i, &["ACL", "LOG"]).await.expect("ACL LOG");
        let denied = match &log {
            RespValue::Array(Some(entries)) => entries.len(),
            other => panic!("ACL LOG: {other:?}"),
        };
        assert_eq!(denied, 0, "node {i} refused the user something: {log:?}");
    }
}

/// What fredlock does, end to end: lock, multi-resource, extend, inspect, keep-alive, release;
/// a waiter woken by a release; a semaphore permit; an election.
async fn exercise(redlock: &Redlock) {
    let mut lock = redlock.acquire("acl:one", TTL).await.expect("acquire");
    assert!(lock.fencing_token().is_some());
    lock.extend(TTL).await.expect("extend");
    let seen = redlock.inspect("acl:one").await.expect("inspect");
    assert!(seen.holder().is_some(), "{seen:?}");
    // A waiter, woken by the release below (wake-ups subscribe to the lock key's channel).
    let waiter = tokio::spawn({
        let redlock = redlock.clone();
        async move {
            redlock
                .acquire_with("acl:one", TTL, Duration::from_secs(5))
                .await
        }
    });
    let guard = lock.keep_alive();
    let report = guard.release().await.expect("release");
    assert!(
        report
            .votes
            .0
            .iter()
            .all(|v| matches!(v, Vote::Granted | Vote::Pending)),
        "{report:?}"
    );
    let next = waiter.await.expect("waiter task").expect("waiter acquires");
    next.release().await.expect("release");

    let both = redlock
        .acquire(["acl:a", "acl:b"], TTL)
        .await
        .expect("multi-resource");
    both.release().await.expect("release");

    let sem = redlock.semaphore("acl:pool", 2).expect("semaphore");
    let permit = sem.acquire(TTL).await.expect("permit");
    assert_eq!(sem.count().await.expect("count"), 1);
    permit.release().await.expect("release permit");

    let election = redlock.elect("acl:leader", TTL).expect("elect");
    tokio::time::timeout(Duration::from_secs(5), election.leader())
        .await
        .expect("leads");
    assert!(election.is_leader());
}

/// The rule is a real limit (the test above could pass with a user allowed everything): the
/// same user cannot read a key outside the prefix. And a user missing a command fredlock needs
/// gets an error with the server's own words (NOPERM) and the node's name.
#[test]
fn the_acl_limits_hold_and_a_missing_command_is_named() {
    runtime().block_on(async {
        let nodes = LocalNodes::start(1).await.expect("nodes");
        add_user(&nodes, "locker", &documented(&nodes)).await;
        let redlock = one_node(&user_urls(&nodes, "locker")[0]).await;
        let outside = redlock
            .client(0)
            .expect("single server")
            .get::<Option<String>, _>("other:key")
            .await
            .expect_err("a key outside the prefix");
        assert!(outside.details().contains("NOPERM"), "{outside:?}");
        redlock.close().await;

        // Without EVAL/EVALSHA (and without a native compare-and-delete for this user): a
        // lock taken by SET could never be released, so none is granted: `build()` says so.
        let without: Vec<&str> = RULE
            .iter()
            .copied()
            .filter(|c| *c != "+eval" && *c != "+evalsha")
            .collect();
        add_user(&nodes, "noscript", &without).await;
        let err = Redlock::builder()
            .nodes([user_urls(&nodes, "noscript")[0].clone()])
            .retry(Retry::once())
            .build()
            .await
            .expect_err("no lock can be released here");
        let shown = err.to_string();
        assert!(shown.contains("NOPERM"), "{shown}");
        assert!(shown.contains("+@scripting"), "{shown}");
        assert!(shown.contains(&nodes.port(0).to_string()), "{shown}");
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert!(matches!(err, Error::NotPermitted { .. }), "{err:?}");
        let keys = nodes.command(0, &["KEYS", "*"]).await.expect("KEYS");
        assert!(!format!("{keys:?}").contains("acl:noscript"), "{keys:?}");
    });
}

/// Scripts taken away from the user while a lock is held (an ACL change at run time): the
/// release on the key's gate learns it from the server's `NOPERM`, and from then on no lock is
/// taken on that node (it could not be released there): the error says what to grant, and
/// nothing is sent (on Valkey the release falls back to `DELIFEQ` and succeeds).
#[test]
fn scripts_taken_away_at_run_time_are_learnt_by_a_release() {
    runtime().block_on(async {
        let nodes = LocalNodes::start(1).await.expect("nodes");
        add_user(&nodes, "locker", &documented(&nodes)).await;
        let redlock = one_node(&user_urls(&nodes, "locker")[0]).await;
        // Warm-up: the connection knows its release scripts.
        let lock = redlock.acquire("acl:late", TTL).await.expect("acquire");
        lock.release().await.expect("release");
        let lock = redlock.acquire("acl:late", TTL).await.expect("acquire");
        let revoke = ["ACL", "SETUSER", "locker", "-eval", "-evalsha"];
        nodes.command(0, &revoke).await.expect("ACL SETUSER");
        let released = lock.release().await;
        if nodes.server() == fredlock_testkit::Server::Valkey {
            assert!(released.is_ok(), "{released:?}");
            return;
        }
        let shown = released.expect_err("no script may run").to_string();
        assert!(shown.contains("NOPERM"), "{shown}");
        nodes
            .command(0, &["CONFIG", "RESETSTAT"])
            .await
            .expect("RESETSTAT");
        // Learnt: a lock that could not be released here is not taken (nothing is sent), and
        // the error says what to do.
        let err = redlock
            .try_acquire("acl:late-2", TTL)
            .await
            .expect_err("refused before anything is sent");
        assert!(matches!(err, Error::NotPermitted { .. }), "{err:?}");
        assert!(err.to_string().contains("+@scripting"), "{err}");
        let stats = nodes
            .command(0, &["INFO", "commandstats"])
            .await
            .expect("INFO");
        let stats = format!("{stats:?}");
        assert!(!stats.contains("cmdstat_set:"), "a SET was sent: {stats}");
    });
}

/// `rediss://` URLs with a private CA (trusted through `SSL_CERT_FILE`, as docs/operations.md
/// tells operators) and the ACL user on top: every operation works over TLS; without the CA the
/// error says the certificate is not trusted.
#[test]
fn tls_with_a_private_ca_and_an_acl_user() {
    let dir = std::env::temp_dir().join(format!("fredlock-tls-acl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (ca_pem, cert_pem, key_pem) = certificates();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca_pem).expect("write");
    std::fs::write(dir.join("cert.pem"), cert_pem).expect("write");
    std::fs::write(dir.join("key.pem"), key_pem).expect("write");
    runtime().block_on(async {
        // TLS needs a server built with it. The valkey-server that `make valkey-server` fetches
        // is built without TLS (and CONFIG SET tls-port crashes it): TLS runs on Redis on every
        // pass of the server matrix; ACL users run on both servers (the tests above).
        let nodes = LocalNodes::start_on(Server::Redis, 3).await.expect("nodes");
        add_user(&nodes, "locker", &documented(&nodes)).await;
        let mut urls = Vec::new();
        for i in 0..nodes.len() {
            let port = nodes
                .enable_tls(i, &dir.join("cert.pem"), &dir.join("key.pem"))
                .await
                .expect("enable TLS on the node");
            urls.push(format!("rediss://locker:{PASSWORD}@localhost:{port}"));
        }

        // Not trusted yet: the error says so, per node.
        let untrusted = Redlock::builder()
            .nodes(urls.clone())
            .retry(Retry::once())
            .connect_wait(Duration::from_millis(500))
            .build()
            .await
            .expect("build (not strict)");
        let err = untrusted
            .acquire("tls:one", TTL)
            .await
            .expect_err("the CA is not trusted yet");
        assert!(
            err.to_string().to_lowercase().contains("certificate"),
            "{err}"
        );
        untrusted.close().await;

        // rustls reads the roots when a connection is made: from now on the CA is trusted.
        std::env::set_var("SSL_CERT_FILE", &ca_file);
        let redlock = Redlock::builder()
            .nodes(urls)
            .retry(common::fast_retry())
            .fencing_tokens(true)
            .require_quorum(true)
            .build()
            .await
            .expect("build over TLS as the ACL user");
        exercise(&redlock).await;
        redlock.close().await;
        std::env::remove_var("SSL_CERT_FILE");
        nothing_refused(&nodes).await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// A throw-away CA and a certificate it signed for `localhost` and 127.0.0.1 (PEM: CA, cert, key).
fn certificates() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("CA");
    let key = KeyPair::generate().expect("key");
    let params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("params");
    let cert = params.signed_by(&key, &ca, &ca_key).expect("certificate");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// Cluster nodes as the same ACL user, with the two extra commands docs/operations.md names for
/// them (`CLUSTER SLOTS` for the slot table, `ASKING` for redirects): locks, multi-resource across
/// slots, fencing and a semaphore, with every shard's ACL log empty.
#[test]
fn an_acl_user_on_cluster_nodes() {
    runtime().block_on(async {
        let clusters: Vec<fredlock_testkit::LocalCluster> =
            futures::future::join_all((0..3).map(|_| fredlock_testkit::LocalCluster::start(3)))
                .await
                .into_iter()
                .map(|c| c.expect("start a local cluster"))
                .collect();
        for c in &clusters {
            let mut rule = documented(c.nodes());
            rule.extend(["+cluster|slots", "+asking"]);
            add_user(c.nodes(), "locker", &rule).await;
        }
        let urls: Vec<String> = clusters
            .iter()
            .map(|c| {
                c.url()
                    .replacen("://", &format!("://locker:{PASSWORD}@"), 1)
            })
            .collect();
        let redlock = Redlock::builder()
            .nodes(urls)
            .retry(common::fast_retry())
            .fencing_tokens(true)
            .connect_wait(Duration::from_secs(20))
            .require_quorum(true)
            .build()
            .await
            .expect("build as the ACL user");
        let mut lock = redlock.acquire("acl:one", TTL).await.expect("acquire");
        lock.extend(TTL).await.expect("extend");
        assert!(redlock
            .inspect("acl:one")
            .await
            .expect("inspect")
            .holder()
            .is_some());
        lock.release().await.expect("release");
        // Keys in different slots (no hash tag): one script per slot on every node.
        let both = redlock
            .acquire(["acl:a", "acl:b", "acl:c"], TTL)
            .await
            .expect("multi-resource");
        assert_eq!(both.fencing_tokens().map(<[u64]>::len), Some(3));
        both.release().await.expect("release");
        let sem = redlock.semaphore("acl:pool", 2).expect("semaphore");
        let permit = sem.acquire(TTL).await.expect("permit");
        permit.release().await.expect("release permit");
        redlock.close().await;
        for c in &clusters {
            nothing_refused(c.nodes()).await;
        }
    });
}
