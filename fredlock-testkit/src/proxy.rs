//! In-process TCP fault injection: a switchable [`FaultProxy`] in front of a
//! node, and a [`Blackhole`] listener that accepts but never answers.
//!
//! Both run as tokio tasks in the test's own runtime, so no root, `tc` or
//! iptables is needed, and both stop when dropped.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Size of one forwarded chunk; faults are decided per chunk.
const CHUNK: usize = 16 * 1024;
/// Upper bound for the proxy's own connect to the upstream node.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a [`FaultProxy`] currently does to the traffic it relays.
///
/// The fault is looked up when a chunk of bytes arrives at the proxy, so a
/// change applies to every byte read after it, on every open connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Relay everything unchanged (the default).
    Pass,
    /// Delay every reply chunk (server -> client) by this long after it
    /// reached the proxy. Replies stay in order; requests are not delayed.
    Latency(Duration),
    /// Accept connections and read from both sides but relay nothing either
    /// way (requests never reach the node, replies never reach the client).
    /// Swallowed bytes are gone for good: after switching back to
    /// [`Pass`](Fault::Pass), only new bytes flow, so a connection that lived
    /// through a blackhole has a desynchronized RESP stream and the client
    /// should drop it. Use [`HoldReplies`](Fault::HoldReplies) for a stall
    /// that recovers cleanly.
    Blackhole,
    /// Relay requests to the node (so writes happen) but discard its replies.
    DropReplies,
    /// Relay requests, and buffer the node's replies while this fault is set.
    /// Switching to any other fault except [`Reset`](Fault::Reset) delivers
    /// the held replies, in order; `Reset` discards them with the connection.
    HoldReplies,
    /// Abort every open connection with a TCP RST and reset each new one
    /// right after accepting it.
    Reset,
}

/// A TCP proxy on `127.0.0.1` in front of one upstream node, whose behaviour
/// ([`Fault`]) can be switched at run time.
///
/// Point a client at [`url`](Self::url) instead of the node's own URL. Create
/// one proxy per node (and one per client if clients must see different
/// faults). Every connection gets its own upstream connection. Dropping the
/// proxy stops the listener and closes every relayed connection.
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    fault: watch::Sender<State>,
    connections: Arc<AtomicUsize>,
    /// The accept loop; it owns every connection task (see `accept_loop`).
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy listening on a free `127.0.0.1` port, relaying to
    /// `upstream`, initially in [`Fault::Pass`]. Must be called within a
    /// tokio runtime, which then runs the proxy.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (fault, _) = watch::channel(State {
            fault: Fault::Pass,
            resets: 0,
        });
        let connections = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(accept_loop(
            listener,
            upstream,
            fault.clone(),
            Arc::clone(&connections),
        ));
        Ok(FaultProxy {
            addr,
            upstream,
            fault,
            connections,
            task,
        })
    }

    /// One proxy per node of `nodes`; those not in `reachable` reset every connection: a
    /// client over their URLs is partitioned from all nodes but `reachable` (a minority
    /// partition seen from one client). Keep the proxies alive as long as the client is used.
    pub async fn partition(
        nodes: &crate::LocalNodes,
        reachable: &[usize],
    ) -> io::Result<Vec<FaultProxy>> {
        let mut proxies = Vec::with_capacity(nodes.len());
        for i in 0..nodes.len() {
            let proxy = FaultProxy::start(nodes.addr(i)).await?;
            if !reachable.contains(&i) {
                proxy.set(Fault::Reset);
            }
            proxies.push(proxy);
        }
        Ok(proxies)
    }

    /// The proxy's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:PORT` URL of the proxy, for clients.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The node the proxy relays to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Switches the fault for all open and future connections.
    ///
    /// A [`Reset`](Fault::Reset) resets every connection open at that moment even if the fault
    /// is switched again before a connection's task gets to run: a watch channel only keeps the
    /// latest value, so on a busy runtime `Reset` then `Pass` could otherwise look like `Pass`
    /// alone, and a connection that lived through a blackhole or dropped replies would go on
    /// with a desynchronized stream (which real TCP cannot do).
    pub fn set(&self, fault: Fault) {
        // `send_modify` also works while no connection is subscribed.
        self.fault.send_modify(|s| {
            s.fault = fault;
            if fault == Fault::Reset {
                s.resets += 1;
            }
        });
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        self.fault.borrow().fault
    }

    /// Number of client connections accepted so far (including ones that
    /// were reset or could not reach the upstream).
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("fault", &self.fault())
            .field("connections", &self.connections())
            .finish()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every
        // connection task; their sockets are closed as they are dropped.
        self.task.abort();
    }
}

/// What the connection tasks watch: the current fault, and how many times
/// [`Fault::Reset`] was set so far (a connection opened before the latest
/// reset must be reset, even if the fault has moved on since).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    fault: Fault,
    resets: u64,
}

impl State {
    /// Whether a connection opened when `resets` was `born` must be reset now.
    fn resets(self, born: u64) -> bool {
        self.fault == Fault::Reset || self.resets > born
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    fault: watch::Sender<State>,
    connections: Arc<AtomicUsize>,
) {
    // Connection tasks live in this JoinSet (not detached) precisely so that
    // aborting this one task tears all of them down.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    connections.fetch_add(1, Ordering::Relaxed);
                    conns.spawn(relay(client, upstream, fault.subscribe()));
                }
                // E.g. out of file descriptors: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            // Reap finished connections so the set does not grow forever.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// How one direction of a relayed connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The source closed cleanly.
    Eof,
    /// The fault became [`Fault::Reset`]: abort the client connection.
    Reset,
    /// An I/O error on either socket.
    Error,
}

/// Relays one client connection until either side closes, applying the
/// current fault to every chunk.
async fn relay(mut client: TcpStream, upstream: SocketAddr, mut fault: watch::Receiver<State>) {
    let born = fault.borrow_and_update().resets;
    if fault.borrow().fault == Fault::Reset {
        abort(client);
        return;
    }
    let _ = client.set_nodelay(true);
    let connect = tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream));
    let mut server = match connect.await {
        Ok(Ok(server)) => server,
        _ => {
            // The node is down. A blackholed client must still see silence;
            // otherwise refuse like a dead node would, with a reset.
            if fault.borrow().fault == Fault::Blackhole {
                swallow_while_blackholed(&mut client, &mut fault).await;
            }
            abort(client);
            return;
        }
    };
    // Without TCP_NODELAY, small replies could sit in Nagle's buffer and add
    // delays that no fault asked for.
    let _ = server.set_nodelay(true);

    let end = {
        // The two directions are two futures polled concurrently in this one
        // task: a stalled write in one direction never blocks the other, and
        // aborting the task (proxy dropped) cancels both at once.
        let (client_rx, client_tx) = client.split();
        let (server_rx, server_tx) = server.split();
        let requests = pump_requests(client_rx, server_tx, fault.clone(), born);
        let replies = pump_replies(server_rx, client_tx, fault.clone(), born);
        tokio::pin!(requests, replies);
        tokio::select! {
            end = &mut replies => end,
            end = &mut requests => match end {
                // The client half-closed: nothing more to swallow while
                // blackholed, otherwise keep delivering the node's replies
                // until it closes too.
                End::Eof if fault.borrow().fault == Fault::Blackhole => End::Eof,
                End::Eof => replies.await,
                other => other,
            },
        }
    };
    if end == End::Reset {
        abort(client);
    }
    // Otherwise both sockets are closed normally (FIN) as they drop here.
}

/// Client -> server direction.
async fn pump_requests(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    fault: watch::Receiver<State>,
    born: u64,
) -> End {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) => {
                // Pass the half-close on, as a direct connection would.
                let _ = to.shutdown().await;
                return End::Eof;
            }
            Ok(n) => n,
            Err(_) => return End::Error,
        };
        // Copy the fault out: the watch guard must not be held across await.
        let current = *fault.borrow();
        if current.resets(born) {
            return End::Reset;
        }
        match current.fault {
            Fault::Blackhole => {} // Swallowed: the node never sees it.
            Fault::Reset => return End::Reset,
            Fault::Pass | Fault::Latency(_) | Fault::DropReplies | Fault::HoldReplies => {
                if to.write_all(&buf[..n]).await.is_err() {
                    return End::Error;
                }
            }
        }
    }
}

/// When a queued reply chunk may be written to the client.
enum Release {
    At(Instant),
    /// Held until the fault leaves [`Fault::HoldReplies`].
    Held,
}

/// Server -> client direction. Reply chunks go through a FIFO queue so that
/// latency and holding never reorder bytes, while the upstream keeps being
/// read (a delayed chunk does not delay the reading of the next one, so
/// latencies do not add up).
async fn pump_replies(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    mut fault: watch::Receiver<State>,
    born: u64,
) -> End {
    let mut buf = vec![0u8; CHUNK];
    let mut queue: VecDeque<(Release, Vec<u8>)> = VecDeque::new();
    let mut upstream_open = true;
    let mut fault_open = true;
    loop {
        if !upstream_open && queue.is_empty() && fault.borrow().fault != Fault::Blackhole {
            // Everything the node sent is delivered: pass its close on. (While
            // blackholed, even the close is swallowed, like a dead link.)
            let _ = to.shutdown().await;
            return End::Eof;
        }
        let due = match queue.front() {
            Some((Release::At(at), _)) => Some(*at),
            _ => None,
        };
        tokio::select! {
            // Fault changes first, so a switch to Reset wins over pending data.
            biased;
            changed = fault.changed(), if fault_open => {
                if changed.is_err() {
                    fault_open = false;
                    continue;
                }
                let current = *fault.borrow_and_update();
                if current.resets(born) {
                    return End::Reset;
                }
                match current.fault {
                    Fault::Reset => return End::Reset,
                    Fault::HoldReplies => {}
                    _ => {
                        let now = Instant::now();
                        for (release, _) in queue.iter_mut() {
                            if matches!(release, Release::Held) {
                                *release = Release::At(now);
                            }
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                if let Some((_, bytes)) = queue.pop_front() {
                    if to.write_all(&bytes).await.is_err() {
                        return End::Error;
                    }
                }
            }
            read = from.read(&mut buf), if upstream_open => match read {
                Ok(0) | Err(_) => upstream_open = false,
                Ok(n) => {
                    let now = Instant::now();
                    let current = *fault.borrow();
                    if current.resets(born) {
                        return End::Reset;
                    }
                    let release = match current.fault {
                        Fault::Pass => Release::At(now),
                        Fault::Latency(delay) => Release::At(now + delay),
                        Fault::HoldReplies => Release::Held,
                        Fault::Blackhole | Fault::DropReplies => continue,
                        Fault::Reset => return End::Reset,
                    };
                    queue.push_back((release, buf[..n].to_vec()));
                }
            },
        }
    }
}

/// Reads and discards from a client whose upstream is unreachable, until the
/// fault leaves [`Fault::Blackhole`] or the client goes away.
async fn swallow_while_blackholed(client: &mut TcpStream, fault: &mut watch::Receiver<State>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        tokio::select! {
            read = client.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            changed = fault.changed() => {
                if changed.is_err() || fault.borrow_and_update().fault != Fault::Blackhole {
                    return;
                }
            }
        }
    }
}

/// Closes `stream` with a TCP RST instead of a FIN, so the peer sees
/// "connection reset" (like a crashed host or a middlebox dropping state).
fn abort(stream: TcpStream) {
    // SO_LINGER with a zero timeout makes close(2) send RST. Set through libc
    // rather than `TcpStream::set_linger`, which recent tokio deprecates and
    // older tokio lacks `set_zero_linger` for.
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: the fd is owned by `stream` and open for this call; the pointer
    // and length describe a live, correctly typed `linger` value.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast::<libc::c_void>(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(stream);
}

/// A listener on `127.0.0.1` that accepts TCP connections, reads and discards
/// whatever arrives, and never answers nor closes: a node that "accepts TCP
/// but never answers". Stops (closing every connection) when dropped.
pub struct Blackhole {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Blackhole {
    /// Starts the listener on a free `127.0.0.1` port. Must be called within
    /// a tokio runtime, which then runs it.
    pub async fn start() -> io::Result<Blackhole> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            // Owned here so aborting this task closes every connection.
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((mut stream, _)) => {
                            counter.fetch_add(1, Ordering::Relaxed);
                            conns.spawn(async move {
                                let mut buf = vec![0u8; CHUNK];
                                while let Ok(n) = stream.read(&mut buf).await {
                                    if n == 0 {
                                        break;
                                    }
                                }
                            });
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    },
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(Blackhole {
            addr,
            connections,
            task,
        })
    }

    // addr() and url() as on FaultProxy, on purpose: either stands in for a node in a URL list.

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:PORT` URL of the listener.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Number of connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for Blackhole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blackhole")
            .field("addr", &self.addr)
            .field("connections", &self.connections())
            .finish()
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that echoes every byte back.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_reset_superseded_before_the_connection_saw_it_still_resets_it() {
        let proxy = FaultProxy::start(echo().await).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 8];
        c.write_all(b"a").await.unwrap();
        assert_eq!(c.read(&mut buf).await.unwrap(), 1);
        proxy.set(Fault::DropReplies);
        c.write_all(b"b").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        // On this one thread, the connection's task cannot run between these two calls: it
        // only ever sees `Pass`, after the reply to "b" was dropped.
        proxy.set(Fault::Reset);
        proxy.set(Fault::Pass);
        let _ = c.write_all(b"c").await;
        match tokio::time::timeout(Duration::from_secs(2), c.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            other => panic!("the connection survived the reset: {other:?}"),
        }
        // New connections pass again.
        let mut d = TcpStream::connect(proxy.addr()).await.unwrap();
        d.write_all(b"d").await.unwrap();
        assert_eq!(d.read(&mut buf).await.unwrap(), 1);
    }
}
