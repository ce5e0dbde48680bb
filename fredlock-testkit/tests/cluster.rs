//! Proves `LocalCluster` against real `redis-server` processes in cluster mode: formation with
//! every slot covered, keys placed by a fred cluster client where `shard_of_slot` says, a shard
//! killed, paused and restarted, and a slot migration held half-way (ASK) then finished (MOVED).

use std::collections::BTreeSet;
use std::io;
use std::time::Duration;

use fredlock::fred::prelude::{ClientLike, Config, KeysInterface};
use fredlock::fred::types::Builder;
use fredlock_testkit::{resp_pipeline, LocalCluster, Migration, RespValue, CLUSTER_SLOTS};
use tokio::time::Instant;

/// Long enough that a reply which is going to come has come (loopback).
const SILENCE: Duration = Duration::from_millis(300);
/// Generous bound for replies that must arrive.
const ANSWER: Duration = Duration::from_secs(5);

fn ok() -> RespValue {
    RespValue::Simple("OK".to_owned())
}

fn bulk(s: &str) -> RespValue {
    RespValue::Bulk(Some(s.as_bytes().to_vec()))
}

/// The `-MOVED slot 127.0.0.1:port` / `-ASK slot 127.0.0.1:port` error a shard answers.
fn redirect(kind: &str, slot: u16, port: u16) -> RespValue {
    RespValue::Error(format!("{kind} {slot} 127.0.0.1:{port}"))
}

/// One field of `CLUSTER INFO` on shard `i`.
async fn info_field(cluster: &LocalCluster, i: usize, name: &str) -> String {
    let RespValue::Bulk(Some(info)) = cluster
        .nodes()
        .command(i, &["CLUSTER", "INFO"])
        .await
        .unwrap()
    else {
        panic!("CLUSTER INFO on shard {i} is not a bulk string");
    };
    String::from_utf8(info)
        .unwrap()
        .lines()
        .find_map(|l| Some(l.strip_prefix(name)?.strip_prefix(':')?.trim().to_owned()))
        .unwrap_or_else(|| panic!("no {name} in CLUSTER INFO"))
}

/// `GET key` sent to shard `i` itself (no redirect followed).
async fn raw_get(cluster: &LocalCluster, i: usize, key: &str) -> RespValue {
    cluster.nodes().command(i, &["GET", key]).await.unwrap()
}

/// A fred cluster client (fred's defaults: it follows MOVED and ASK) on `cluster.url()`.
async fn fred_client(cluster: &LocalCluster) -> fredlock::fred::clients::Client {
    let config = Config::from_url(&cluster.url()).unwrap();
    assert!(config.server.is_clustered(), "{:?}", config.server);
    let client = Builder::from_config(config).build().unwrap();
    client.init().await.unwrap();
    client
}

#[tokio::test]
async fn comes_up_with_every_slot_covered_once() {
    let cluster = LocalCluster::start(3).await.unwrap();
    assert_eq!(cluster.shards(), 3);
    let ports: Vec<u16> = (0..3).map(|i| cluster.port(i)).collect();
    assert_eq!(
        cluster.url(),
        format!(
            "redis-cluster://127.0.0.1:{}?node=127.0.0.1:{}&node=127.0.0.1:{}",
            ports[0], ports[1], ports[2]
        )
    );
    assert_eq!(
        cluster.seed_urls(),
        ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
    );
    let mut all_ports: BTreeSet<u16> = ports.iter().copied().collect();
    all_ports.extend((0..3).map(|i| cluster.bus_port(i)));
    assert_eq!(all_ports.len(), 6, "client and bus ports must be distinct");

    // The slot table: three contiguous, even ranges that partition 0..=16383.
    let ranges: Vec<_> = (0..3).map(|i| cluster.slot_ranges(i)).collect();
    assert_eq!(ranges[0], vec![0..=5460]);
    assert_eq!(ranges[1], vec![5461..=10922]);
    assert_eq!(ranges[2], vec![10923..=16383]);
    assert_eq!(cluster.shard_of_slot(0), 0);
    assert_eq!(cluster.shard_of_slot(5461), 1);
    assert_eq!(cluster.shard_of_slot(CLUSTER_SLOTS - 1), 2);

    let ids: BTreeSet<&str> = (0..3).map(|i| cluster.node_id(i)).collect();
    assert_eq!(ids.len(), 3);
    for i in 0..3 {
        assert_eq!(info_field(&cluster, i, "cluster_state").await, "ok");
        assert_eq!(
            info_field(&cluster, i, "cluster_slots_assigned").await,
            "16384"
        );
        assert_eq!(info_field(&cluster, i, "cluster_slots_ok").await, "16384");
        assert_eq!(info_field(&cluster, i, "cluster_known_nodes").await, "3");
        assert_eq!(info_field(&cluster, i, "cluster_size").await, "3");
        // Every shard maps every slot exactly once, to the shard the table names.
        let RespValue::Array(Some(entries)) = cluster
            .nodes()
            .command(i, &["CLUSTER", "SLOTS"])
            .await
            .unwrap()
        else {
            panic!("CLUSTER SLOTS is not an array");
        };
        let mut covered = vec![0u8; usize::from(CLUSTER_SLOTS)];
        for entry in entries {
            let RespValue::Array(Some(parts)) = entry else {
                panic!("bad CLUSTER SLOTS entry")
            };
            let (RespValue::Integer(first), RespValue::Integer(last)) = (&parts[0], &parts[1])
            else {
                panic!("bad CLUSTER SLOTS range")
            };
            let RespValue::Array(Some(primary)) = &parts[2] else {
                panic!("bad CLUSTER SLOTS primary")
            };
            let RespValue::Integer(port) = primary[1] else {
                panic!("bad CLUSTER SLOTS port")
            };
            for slot in *first as u16..=*last as u16 {
                covered[usize::from(slot)] += 1;
                assert_eq!(port, i64::from(cluster.port(cluster.shard_of_slot(slot))));
            }
        }
        assert!(
            covered.iter().all(|&n| n == 1),
            "shard {i}: a slot not covered exactly once"
        );
    }
    // Asked of the server, hash tags included.
    assert_eq!(cluster.slot_of_key("foo").await.unwrap(), 12182);
    assert_eq!(
        cluster.slot_of_key("{user1}.a").await.unwrap(),
        cluster.slot_of_key("{user1}.b").await.unwrap()
    );
}

#[tokio::test]
async fn bad_arguments_are_errors() {
    assert_eq!(
        LocalCluster::start(0).await.unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    let mut cluster = LocalCluster::start(1).await.unwrap();
    assert_eq!(cluster.slot_ranges(0), vec![0..=CLUSTER_SLOTS - 1]);
    assert!(!cluster.url().contains('?'), "{}", cluster.url());
    let invalid = |e: io::Error| e.kind() == io::ErrorKind::InvalidInput;
    assert!(invalid(cluster.kill_shard(1).unwrap_err()));
    assert!(invalid(cluster.pause_shard(1).unwrap_err()));
    assert!(invalid(cluster.key_on_shard(1, "k").await.unwrap_err()));
    assert!(invalid(cluster.begin_migration(0, 1).await.unwrap_err()));
    // Slot 0 is on shard 0 already.
    assert!(invalid(cluster.begin_migration(0, 0).await.unwrap_err()));
    assert!(invalid(
        cluster.begin_migration(CLUSTER_SLOTS, 0).await.unwrap_err()
    ));
    assert!(invalid(cluster.finish_migration(0).await.unwrap_err()));
    assert!(invalid(cluster.migrate_keys(0, 1).await.unwrap_err()));
}

#[tokio::test]
async fn a_fred_cluster_client_writes_where_shard_of_slot_says() {
    let cluster = LocalCluster::start(3).await.unwrap();
    let client = fred_client(&cluster).await;
    let mut shards_used = BTreeSet::new();
    for n in 0..40 {
        let key = format!("placed:{n}");
        let value = format!("v{n}");
        client
            .set::<(), _, _>(key.as_str(), value.as_str(), None, None, false)
            .await
            .unwrap();
        let slot = cluster.slot_of_key(&key).await.unwrap();
        let owner = cluster.shard_of_slot(slot);
        assert_eq!(cluster.shard_of_key(&key).await.unwrap(), owner);
        shards_used.insert(owner);
        assert_eq!(
            cluster.nodes().get(owner, &key).await.unwrap().as_deref(),
            Some(value.as_str())
        );
        for other in (0..3).filter(|&i| i != owner) {
            assert_eq!(
                cluster
                    .nodes()
                    .command(other, &["GET", &key])
                    .await
                    .unwrap(),
                redirect("MOVED", slot, cluster.port(owner)),
                "{key} asked of shard {other}"
            );
        }
    }
    assert_eq!(shards_used.len(), 3, "40 keys should reach every shard");
    for i in 0..3 {
        let key = cluster.key_on_shard(i, "fredlock:job-").await.unwrap();
        assert!(key.starts_with("fredlock:job-"), "{key}");
        assert_eq!(cluster.shard_of_key(&key).await.unwrap(), i);
    }
    client.quit().await.unwrap();
}

#[tokio::test]
async fn a_killed_shard_fails_only_its_slots_and_restarts_empty_with_them() {
    let mut cluster = LocalCluster::start(3).await.unwrap();
    let mut keys = Vec::new();
    for i in 0..3 {
        let key = cluster.key_on_shard(i, "k").await.unwrap();
        cluster.nodes().set(i, &key, "before").await.unwrap();
        keys.push(key);
    }
    let id = cluster.node_id(1).to_owned();
    let dead_slot = cluster.slot_of_key(&keys[1]).await.unwrap();

    cluster.kill_shard(1).unwrap();
    assert!(!cluster.is_running(1));
    let refused = cluster
        .nodes()
        .command(1, &["GET", &keys[1]])
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);

    // Past the node timeout the others flag shard 1 as failed, and still serve their slots.
    let deadline = Instant::now() + Duration::from_secs(15);
    while info_field(&cluster, 0, "cluster_slots_fail").await == "0" {
        assert!(Instant::now() < deadline, "shard 1 never flagged as failed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in [0, 2] {
        assert_eq!(info_field(&cluster, i, "cluster_state").await, "ok");
        assert_eq!(
            cluster.nodes().get(i, &keys[i]).await.unwrap().as_deref(),
            Some("before")
        );
        assert_eq!(
            cluster
                .nodes()
                .command(i, &["SET", &keys[i], "during"])
                .await
                .unwrap(),
            ok()
        );
        // The dead shard's keys are still its own: a redirect to a refused port.
        assert_eq!(
            cluster
                .nodes()
                .command(i, &["GET", &keys[1]])
                .await
                .unwrap(),
            redirect("MOVED", dead_slot, cluster.port(1))
        );
    }
    // With a shard down, `wait_ok` waits (for up to 30 s): it must not succeed.
    let waited = tokio::time::timeout(Duration::from_secs(2), cluster.wait_ok()).await;
    assert!(
        waited.is_err(),
        "wait_ok returned {waited:?} with a shard down"
    );

    cluster.restart_shard(1).await.unwrap();
    assert!(cluster.is_running(1));
    assert_eq!(cluster.node_id(1), id);
    assert_eq!(
        cluster
            .nodes()
            .command(1, &["CLUSTER", "MYID"])
            .await
            .unwrap(),
        bulk(&id),
        "the restarted shard keeps its identity"
    );
    assert_eq!(info_field(&cluster, 1, "cluster_state").await, "ok");
    // Back with its slots, without its data.
    assert_eq!(cluster.nodes().get(1, &keys[1]).await.unwrap(), None);
    cluster.nodes().set(1, &keys[1], "after").await.unwrap();
    for i in [0, 2] {
        assert_eq!(
            cluster.nodes().get(i, &keys[i]).await.unwrap().as_deref(),
            Some("during")
        );
    }
    // A fred cluster client reaches all three again.
    let client = fred_client(&cluster).await;
    for (i, key) in keys.iter().enumerate() {
        let expected = if i == 1 { "after" } else { "during" };
        let value: Option<String> = client.get(key.as_str()).await.unwrap();
        assert_eq!(value.as_deref(), Some(expected), "shard {i}");
    }
    client.quit().await.unwrap();
}

#[tokio::test]
async fn a_paused_shard_stalls_only_its_slots() {
    let cluster = LocalCluster::start(3).await.unwrap();
    let key0 = cluster.key_on_shard(0, "p").await.unwrap();
    let key2 = cluster.key_on_shard(2, "p").await.unwrap();
    cluster.nodes().set(0, &key0, "x").await.unwrap();
    cluster.nodes().set(2, &key2, "y").await.unwrap();

    // Shard 0 is the one `slot_of_key` asks first: paused, it must be skipped.
    cluster.pause_shard(0).unwrap();
    let stalled = cluster
        .nodes()
        .command_timeout(0, &["GET", &key0], SILENCE)
        .await
        .unwrap_err();
    assert_eq!(stalled.kind(), io::ErrorKind::TimedOut);
    assert_eq!(
        cluster.nodes().get(2, &key2).await.unwrap().as_deref(),
        Some("y")
    );
    assert_eq!(cluster.shard_of_key(&key2).await.unwrap(), 2);

    cluster.resume_shard(0).unwrap();
    assert_eq!(
        cluster
            .nodes()
            .command_timeout(0, &["GET", &key0], ANSWER)
            .await
            .unwrap(),
        bulk("x"),
        "a paused shard keeps its data"
    );
    cluster.wait_ok().await.unwrap();
}

#[tokio::test]
async fn a_migration_in_progress_answers_ask_then_finishes_with_moved() {
    let mut cluster = LocalCluster::start(3).await.unwrap();
    // Three keys of one slot (hash tag); two of them exist before the migration.
    let (a, b, fresh) = ("{mig}a", "{mig}b", "{mig}fresh");
    let slot = cluster.slot_of_key(a).await.unwrap();
    let from = cluster.shard_of_slot(slot);
    let to = (from + 1) % 3;
    let (from_port, to_port) = (cluster.port(from), cluster.port(to));
    cluster.nodes().set(from, a, "A").await.unwrap();
    cluster.nodes().set(from, b, "B").await.unwrap();
    assert!(cluster.nodes().pexpire(from, b, 60_000).await.unwrap());

    assert_eq!(
        cluster.begin_migration(slot, to).await.unwrap(),
        Migration { from, to }
    );
    assert_eq!(cluster.migration(slot), Some(Migration { from, to }));
    assert_eq!(
        cluster.shard_of_slot(slot),
        from,
        "the source owns it until the end"
    );
    let invalid = cluster.begin_migration(slot, to).await.unwrap_err();
    assert_eq!(
        invalid.kind(),
        io::ErrorKind::InvalidInput,
        "already migrating"
    );

    // The source serves what it still holds, and sends the rest of the slot to the target.
    assert_eq!(raw_get(&cluster, from, a).await, bulk("A"));
    assert_eq!(
        raw_get(&cluster, from, fresh).await,
        redirect("ASK", slot, to_port)
    );
    assert_eq!(
        cluster
            .nodes()
            .command(from, &["SET", fresh, "F"])
            .await
            .unwrap(),
        redirect("ASK", slot, to_port),
        "a new key of a migrating slot is created on the target"
    );
    // The target serves the slot only after ASKING (on the same connection).
    assert_eq!(
        raw_get(&cluster, to, a).await,
        redirect("MOVED", slot, from_port)
    );
    let asked = resp_pipeline(
        cluster.addr(to),
        &[&["ASKING"], &["SET", fresh, "F"]],
        ANSWER,
    )
    .await
    .unwrap();
    assert_eq!(asked, vec![ok(), ok()]);

    // One key moves: now the source sends it to the target too.
    assert_eq!(cluster.migrate_keys(slot, 1).await.unwrap(), 1);
    let moved_first = if raw_get(&cluster, from, a).await == bulk("A") {
        b
    } else {
        a
    };
    let moved_value = if moved_first == a { "A" } else { "B" };
    assert_eq!(
        raw_get(&cluster, from, moved_first).await,
        redirect("ASK", slot, to_port)
    );
    let asked = resp_pipeline(
        cluster.addr(to),
        &[&["ASKING"], &["GET", moved_first]],
        ANSWER,
    )
    .await
    .unwrap();
    assert_eq!(asked, vec![ok(), bulk(moved_value)]);
    // A multi-key command over a moved and an unmoved key cannot be served on either side.
    match cluster
        .nodes()
        .command(from, &["MGET", a, b])
        .await
        .unwrap()
    {
        RespValue::Error(e) => assert!(e.starts_with("TRYAGAIN"), "{e}"),
        other => panic!("expected TRYAGAIN, got {other:?}"),
    }

    cluster.finish_migration(slot).await.unwrap();
    assert_eq!(cluster.migration(slot), None);
    assert_eq!(cluster.shard_of_slot(slot), to);
    assert!(cluster.slot_ranges(to).contains(&(slot..=slot)));
    for key in [a, b, fresh] {
        assert_eq!(
            raw_get(&cluster, from, key).await,
            redirect("MOVED", slot, to_port)
        );
    }
    assert_eq!(
        cluster.nodes().get(to, a).await.unwrap().as_deref(),
        Some("A")
    );
    assert_eq!(
        cluster.nodes().get(to, b).await.unwrap().as_deref(),
        Some("B")
    );
    assert_eq!(
        cluster.nodes().get(to, fresh).await.unwrap().as_deref(),
        Some("F")
    );
    let ttl = cluster.nodes().pttl(to, b).await.unwrap();
    assert!((1..=60_000).contains(&ttl), "MIGRATE keeps the TTL: {ttl}");
    // The other shard agrees (wait_ok checked every shard's CLUSTER SLOTS).
    let third = 3 - from - to;
    assert_eq!(
        raw_get(&cluster, third, a).await,
        redirect("MOVED", slot, to_port)
    );

    // And the slot can go back.
    cluster.begin_migration(slot, from).await.unwrap();
    cluster.finish_migration(slot).await.unwrap();
    assert_eq!(cluster.shard_of_slot(slot), from);
    assert_eq!(
        cluster.nodes().get(from, fresh).await.unwrap().as_deref(),
        Some("F")
    );
}

#[tokio::test]
async fn drop_stops_every_shard() {
    let cluster = LocalCluster::start(3).await.unwrap();
    let addrs: Vec<_> = (0..3).map(|i| cluster.addr(i)).collect();
    drop(cluster);
    for addr in addrs {
        let err = tokio::net::TcpStream::connect(addr).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{addr}");
    }
}
