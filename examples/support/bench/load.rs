//! Load beyond the cycle rounds: many locks kept alive ([`keep_alive_load`]), the Redis Cluster
//! Redlocks of (g) and their shares per shard, and one server saturated by a pipelined raw-RESP
//! loader ([`saturate`]).

use crate::servers::{Meter, Server, Snapshot, Work};
use crate::targets::FLOOR_RELEASE;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fredlock::Redlock;
use fredlock_testkit::RespValue;

use crate::support::{process_cpu, resident_bytes};
use crate::TTL;

/// (d) What holding many locks with keep-alive costs.
pub(crate) struct KeepAliveLoad {
    pub(crate) locks: usize,
    pub(crate) ttl: Duration,
    pub(crate) bytes_per_lock: Option<f64>,
    /// Server memory per held lock, per Redlock node ([`data_memory`]).
    pub(crate) server_bytes_per_lock: f64,
    pub(crate) commands_per_second: f64,
    /// Commands per server over the window (per node for [`Meter::Clients`]).
    pub(crate) per_server: Vec<u64>,
    /// Extension rounds per lock over the window (about 3: one every 2/3 of the TTL).
    pub(crate) extensions_per_lock: f64,
    /// Time taken to acquire them all (256 acquires in flight at a time).
    pub(crate) acquired_in: Duration,
    pub(crate) lost: usize,
}

/// Acquires `locks` locks with keep-alive at once, measures this process's memory growth, the
/// servers' memory growth and their command rate over two TTLs (every lock extended about three
/// times), releases, closes `redlock`.
pub(crate) async fn keep_alive_load(
    redlock: Redlock,
    meter: Meter<'_>,
    prefix: &str,
    locks: usize,
    ttl: Duration,
) -> KeepAliveLoad {
    let before = resident_bytes();
    let server_before = meter.data_memory(&redlock).await;
    let acquiring = Instant::now();
    let mut guards = Vec::with_capacity(locks);
    let mut pending = futures::stream::FuturesUnordered::new();
    use futures::StreamExt;
    for i in 0..locks {
        let (redlock, name) = (redlock.clone(), format!("{prefix}:{i}"));
        pending.push(async move { redlock.acquire(name.as_str(), ttl).await });
        if pending.len() >= 256 {
            let lock = pending.next().await.expect("one result").expect("acquire");
            guards.push(lock.keep_alive());
        }
    }
    while let Some(lock) = pending.next().await {
        guards.push(lock.expect("acquire").keep_alive());
    }
    let acquired_in = acquiring.elapsed();
    let after = resident_bytes();
    let server_after = meter.data_memory(&redlock).await;
    let window = ttl * 2;
    let extensions = |guards: &[fredlock::KeepAlive]| {
        guards
            .iter()
            .map(|g| u64::from(g.extensions()))
            .sum::<u64>()
    };
    let c0 = meter.commands(&redlock).await;
    let e0 = extensions(&guards);
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let c1 = meter.commands(&redlock).await;
    let e1 = extensions(&guards);
    let elapsed = t0.elapsed().as_secs_f64();
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let releases =
        futures::stream::iter(guards.into_iter().map(|g| g.release())).buffer_unordered(256);
    let _: Vec<_> = releases.collect().await;
    let nodes = redlock.node_names().len();
    redlock.close().await;
    let per_server: Vec<u64> = c0.iter().zip(&c1).map(|(a, b)| b - a).collect();
    KeepAliveLoad {
        locks,
        ttl,
        bytes_per_lock: match (before, after) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / locks as f64),
            _ => None,
        },
        server_bytes_per_lock: server_after.saturating_sub(server_before) as f64
            / (locks * nodes) as f64,
        commands_per_second: per_server.iter().sum::<u64>() as f64 / elapsed,
        per_server,
        extensions_per_lock: (e1 - e0) as f64 / locks as f64,
        acquired_in,
        lost,
    }
}

/// (g) Shards per Redlock node.
pub(crate) const CLUSTER_SHARDS: usize = 3;

/// A Redlock over `urls` (cluster nodes) once every node has read its slot table.
pub(crate) async fn cluster_redlock(urls: &[String]) -> Redlock {
    let redlock = Redlock::builder()
        .nodes(urls.to_vec())
        .connect_wait(Duration::from_secs(20))
        .build()
        .await
        .expect("build a Redlock over the clusters");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = redlock.inspect("probe").await.expect("inspect");
        if seen.nodes.iter().all(|n| n.state.is_ok()) {
            return redlock;
        }
        assert!(
            Instant::now() < deadline,
            "a cluster node is still not up after 20 s: {:?}",
            seen.nodes.iter().map(|n| &n.state).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// "33%/34%/33%": each server's share of the total of its group of `group` servers (a Redlock
/// node's shards), groups separated by " · "; and the smallest and largest share.
pub(crate) fn shares(per_server: &[u64], group: usize) -> (String, f64, f64) {
    let (mut min, mut max) = (f64::MAX, 0f64);
    let text = per_server
        .chunks(group)
        .map(|shards| {
            let total = shards.iter().sum::<u64>().max(1) as f64;
            shards
                .iter()
                .map(|&n| {
                    let share = 100.0 * n as f64 / total;
                    (min, max) = (min.min(share), max.max(share));
                    format!("{share:.1}%")
                })
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect::<Vec<_>>()
        .join(" · ");
    (text, min, max)
}

/// "set 3.0, eval 3.0, ...": calls per cycle of each command.
pub(crate) fn per_cycle(work: &Work, cycles: u64) -> String {
    work.per_command
        .iter()
        .filter(|(_, &n)| n > 0)
        .map(|(name, &n)| format!("{name} {:.2}", n as f64 / cycles.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

/// (h) The loader: connections, and acquire+release pairs in flight on each.
pub(crate) const LOADER_CONNECTIONS: usize = 8;
pub(crate) const LOADER_DEPTH: usize = 64;

/// (h) One server driven as hard as it goes.
pub(crate) struct Saturation {
    pub(crate) commands_per_second: f64,
    /// Server CPU time / wall time: about 1.0 when saturated.
    pub(crate) busy: f64,
    pub(crate) cpu_per_command_us: f64,
    /// This process's CPU time / wall time meanwhile (the loader's cost).
    pub(crate) client_busy: Option<f64>,
}

/// Drives one server with the commands of a lock cycle on one node, as fredlock sends them (a
/// `SET key token NX PX ttl`, then a compare-and-delete script sent with `EVAL`), pipelined
/// [`LOADER_DEPTH`] cycles deep on each of [`LOADER_CONNECTIONS`] connections, raw RESP, so that
/// the client costs far less than the server and the server's own limit shows. Runs a warm-up
/// of a fifth of `duration` first.
pub(crate) async fn saturate(server: &Server, prefix: &str, duration: Duration) -> Saturation {
    let load = |end: Instant| {
        let tasks: Vec<_> = (0..LOADER_CONNECTIONS)
            .map(|c| tokio::spawn(pipelined_cycles(server.addr, format!("{prefix}:{c}"), end)))
            .collect();
        async move {
            let mut cycles = 0;
            for task in tasks {
                cycles += task.await.expect("a loader task panicked");
            }
            cycles
        }
    };
    load(Instant::now() + duration / 5).await;
    let before = Snapshot::take(std::slice::from_ref(server)).await;
    let client_before = process_cpu();
    let start = Instant::now();
    load(start + duration).await;
    let elapsed = start.elapsed();
    let client = client_before
        .zip(process_cpu())
        .map(|(a, b)| b.saturating_sub(a));
    let after = Snapshot::take(std::slice::from_ref(server)).await;
    let work = Work::between(&before, &after);
    Saturation {
        commands_per_second: work.commands() as f64 / elapsed.as_secs_f64(),
        busy: work.cpu.as_secs_f64() / elapsed.as_secs_f64(),
        cpu_per_command_us: work.cpu_per_command_us(),
        client_busy: client.map(|c| c.as_secs_f64() / elapsed.as_secs_f64()),
    }
}

/// One loader connection: batches of [`LOADER_DEPTH`] SET NX PX + EVAL pairs on keys of its own,
/// every reply checked, until `end`. Returns the cycles done.
pub(crate) async fn pipelined_cycles(addr: SocketAddr, prefix: String, end: Instant) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("loader: connect to {addr}: {e}"));
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let keys: Vec<String> = (0..LOADER_DEPTH).map(|k| format!("{prefix}:{k}")).collect();
    let ttl = TTL.as_millis().to_string();
    let (mut request, mut replies, mut chunk) = (Vec::new(), Vec::new(), vec![0u8; 64 * 1024]);
    let mut cycles = 0;
    while Instant::now() < end {
        let token = format!("{:032x}", rand::random::<u128>());
        request.clear();
        for key in &keys {
            request.extend(RespValue::encode_command(&[
                "SET", key, &token, "NX", "PX", &ttl,
            ]));
            request.extend(RespValue::encode_command(&[
                "EVAL",
                FLOOR_RELEASE,
                "1",
                key,
                &token,
            ]));
        }
        stream.write_all(&request).await.expect("loader: write");
        let mut read = 0;
        let mut at = 0;
        while read < 2 * LOADER_DEPTH {
            match RespValue::parse(&replies[at..]).expect("loader: a RESP reply") {
                Some((reply, used)) => {
                    at += used;
                    let ok = match read % 2 {
                        0 => reply == RespValue::Simple("OK".into()),
                        _ => reply == RespValue::Integer(1),
                    };
                    assert!(ok, "loader: unexpected reply {reply:?}");
                    read += 1;
                }
                None => {
                    let n = stream.read(&mut chunk).await.expect("loader: read");
                    assert!(n > 0, "loader: {addr} closed the connection");
                    replies.extend_from_slice(&chunk[..n]);
                }
            }
        }
        replies.drain(..at);
        cycles += LOADER_DEPTH as u64;
    }
    cycles
}
