//! The hot-path sender of one single-server node ([`Batch`]: what its callers see) and its
//! batcher task (see `batch` for what both keep and why). The task takes
//! what is queued, in order, and sends it: a run of hot-path operations as one batch (waiting
//! for that batch's answer before the next, so operations accumulate meanwhile), any other
//! command alone in its place (see `Batch::ordered`), without waiting for a batch's answer:
//! only for the hand-over of what was queued before it.
//!
//! Owns: putting an operation in the queue or sending it directly, taking from the queue,
//! sending a batch and answering its operations, resending orphaned releases after a
//! connection failure. Must not: choose a command (`node_*`) or its plain form (`batch`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::Client;
use fred::prelude::{ClientLike, Value};
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::base::error::{NodeError, NodeErrorKind};
use crate::base::scripts::Scripts;
use crate::nodes::batch::{
    fixed, lock, orphaned_release, send_one, Boxed, Caller, Held, Kind, Op, Queue, Shared, Start,
    Work, MAX_OPS,
};
use crate::nodes::connection::{options, State};

/// The hot-path sender of one single-server node, and the keeper of its command order. Clones
/// share one queue; the node closes it when dropped.
#[derive(Clone)]
pub(crate) struct Batch {
    client: Client,
    state: Arc<State>,
    shared: Arc<Shared>,
}

/// Marks a direct send as answered (or abandoned) when dropped.
struct Direct<'a>(&'a Shared);

impl Drop for Direct<'_> {
    fn drop(&mut self) {
        let mut q = lock(&self.0.queue);
        q.direct = q.direct.saturating_sub(1);
    }
}

impl Batch {
    pub(crate) fn new(client: Client, state: Arc<State>) -> Batch {
        Batch {
            client,
            state,
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                notify: Notify::new(),
                drained: Notify::new(),
            }),
        }
    }

    /// `SET key token NX PX ttl_ms` for `held`'s one key: the plain command's reply (`OK` or nil).
    pub(crate) async fn acquire(
        &self,
        held: &Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        self.run(held, Kind::Acquire { ttl_ms }, timeout).await
    }

    /// The release script for `held`'s one key: the plain script's reply (keys deleted).
    pub(crate) async fn release(
        &self,
        held: &Arc<Held>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        self.run(held, Kind::Release, timeout).await
    }

    /// The release of `held`'s one key on its gate while no line is known there: the release
    /// and a read of the line's flag (`GATE_FLAG` alone, in a batch the batch script's `f`
    /// operation). Reply: an integer, 1 when deleted, plus 2 when the flag is set and the key
    /// free; the wake-up of the head is left to the caller.
    pub(crate) async fn gate_free(
        &self,
        held: &Arc<Held>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        self.run(held, Kind::GateFree, timeout).await
    }

    /// Fails every queued operation and ends the batcher (the node is dropped).
    pub(crate) fn close(&self) {
        let ops = {
            let mut q = lock(&self.shared.queue);
            q.closed = true;
            std::mem::take(&mut q.ops)
        };
        self.shared.notify.notify_one();
        for op in ops {
            let _ = op.reply.send(Err(self.closed()));
        }
    }

    fn closed(&self) -> NodeError {
        NodeError {
            node: self.state.name.clone(),
            kind: NodeErrorKind::Client,
            message: "the node was closed before this command was sent".to_string(),
        }
    }

    fn ended(&self) -> NodeError {
        NodeError {
            node: self.state.name.clone(),
            kind: NodeErrorKind::Client,
            message: "the batcher ended without an answer".to_string(),
        }
    }

    async fn run(
        &self,
        held: &Arc<Held>,
        kind: Kind,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        // Direct only when nothing of the hot path is in flight either, but this caller's own
        // earlier command (else it batches: see `direct_ok`).
        let me = Caller::current();
        let idle = |q: &mut Queue| {
            let idle = q.closed || direct_ok(q, me);
            if idle {
                if q.direct == 0 {
                    q.direct_by = Some(me);
                }
                q.direct += 1;
            }
            idle
        };
        let work = || Work::Key {
            held: held.clone(),
            kind,
        };
        let queued = self.enqueue(timeout, idle, work);
        // A queued acquire or release is the batcher's to finish; a gate's release is not (its
        // caller may still have a head to wake).
        let owned = queued.is_some() && matches!(kind, Kind::Acquire { .. } | Kind::Release);
        held.batched.mark(self.state.index, owned);
        match queued {
            None => {
                let _direct = Direct(&self.shared);
                // Handed to fred on this first poll, before anything else can be sent here.
                send_one(&self.client, &self.state, held, kind, timeout).await
            }
            Some(rx) => rx.await.unwrap_or_else(|_| Err(self.ended())),
        }
    }

    /// Any other command for this node, on `keys`, in this node's order for those keys:
    /// `work(timeout)` is sent at once when nothing queued touches one of `keys` and nothing is
    /// being handed to fred (whatever is in flight was handed over before it), else it joins
    /// the queue and the batcher starts it, alone, once nothing queued before it touches its
    /// keys, with the time left (a deadline passed in the queue: `failed` with a timeout,
    /// nothing sent). Either way it is handed to fred or queued when this future is first
    /// polled, and a dropped future leaves it to be sent, as fred does with a command it holds.
    /// This keeps a shortening, an extension or a fencing raise from overtaking its lock's own
    /// `SET` still waiting in the queue, without making other keys' commands wait for it.
    pub(crate) async fn ordered<T: Send + 'static>(
        &self,
        keys: Vec<String>,
        timeout: Duration,
        work: impl FnOnce(Duration) -> Boxed<T> + Send + 'static,
        failed: impl FnOnce(NodeError) -> T,
    ) -> T {
        let mut direct = Some(work);
        let mut answer = None;
        let queued = {
            let (work, answer) = (&mut direct, &mut answer);
            // What is in flight was handed over before; only what waits in the queue for one
            // of these keys (or is being handed over) must go first.
            let keys = &keys;
            let idle = |q: &mut Queue| {
                q.closed || (!q.handing && !q.ops.iter().any(|op| op.work.touches(keys)))
            };
            // Only when queued: a direct send costs no channel and no box.
            let call = move || {
                let work = work.take();
                let (tx, rx) = oneshot::channel::<T>();
                *answer = Some(rx);
                let start: Start = Box::new(move |left| {
                    Box::pin(async move {
                        if let Some(work) = work {
                            let _ = tx.send(work(left).await);
                        }
                    })
                });
                Work::Call {
                    keys: keys.clone(),
                    start,
                }
            };
            self.enqueue(timeout, idle, call)
        };
        match (queued, direct, answer) {
            (None, Some(work), _) => work(timeout).await,
            (Some(rx), _, Some(answer)) => match rx.await {
                Ok(Ok(_)) => answer.await.unwrap_or_else(|_| failed(self.ended())),
                Ok(Err(e)) => failed(e),
                Err(_) => failed(self.ended()),
            },
            // Never: queued means the closure ran, direct means it did not.
            _ => failed(self.ended()),
        }
    }

    /// Resolves once everything queued so far was handed to fred (at once when nothing is
    /// queued, or no batcher runs to send it): `Node::close` waits for it before it quits the
    /// connection, so its `QUIT` does not overtake a queued release.
    pub(crate) async fn drained(&self) {
        loop {
            let drained = self.shared.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            {
                let q = lock(&self.shared.queue);
                if q.closed || !q.started || (q.ops.is_empty() && !q.handing) {
                    return;
                }
            }
            drained.await;
        }
    }

    /// Queues `work()` unless `idle` (which also sees a closed queue): `None` then (the
    /// caller sends directly, now), else the receiver of its answer. Starts the batcher if
    /// needed.
    fn enqueue(
        &self,
        timeout: Duration,
        idle: impl FnOnce(&mut Queue) -> bool,
        work: impl FnOnce() -> Work,
    ) -> Option<oneshot::Receiver<Result<Value, NodeError>>> {
        let mut q = lock(&self.shared.queue);
        if idle(&mut q) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        q.ops.push(Op {
            work: work(),
            deadline: now.checked_add(timeout).unwrap_or(now),
            reply: tx,
            resent: 0,
        });
        let start = !q.started;
        q.started = true;
        // The batcher waits only when the queue was empty, or for a batch's answer: a command
        // may be sendable at once (no key in common with what waits).
        let first = q.ops.len() == 1
            || matches!(
                q.ops.last(),
                Some(Op {
                    work: Work::Call { .. },
                    ..
                })
            );
        drop(q);
        if start {
            tokio::spawn(batcher(
                self.client.clone(),
                self.state.clone(),
                self.shared.clone(),
            ));
        }
        if first {
            self.shared.notify.notify_one();
        }
        Some(rx)
    }
}

/// Marks the batcher as gone when its task ends, however it ends (the node closed, or the
/// runtime that ran it shut down, dropping it mid-batch): the next operation queued starts a
/// new one on its own runtime, and callers still waiting for a queued operation are answered
/// with an error rather than left waiting (releases nobody waits for stay queued for it).
struct Running(Arc<Shared>, String);

impl Drop for Running {
    fn drop(&mut self) {
        let waiting = {
            let mut q = lock(&self.0.queue);
            q.started = false;
            q.batch = false;
            q.handing = false;
            let (waiting, orphans) = std::mem::take(&mut q.ops)
                .into_iter()
                .partition::<Vec<Op>, _>(|op| !op.reply.is_closed());
            q.ops = orphans;
            waiting
        };
        for op in waiting {
            let _ = op.reply.send(Err(NodeError {
                node: self.1.clone(),
                kind: NodeErrorKind::Client,
                message: "the batcher's runtime shut down before this command was sent".into(),
            }));
        }
    }
}

/// What the batcher took from the queue.
enum Taken {
    /// A run of hot-path operations, sent as one batch.
    Batch(Vec<Op>),
    /// One other command.
    Call(Op),
}

/// Whether a hot-path operation of `me` may be sent directly: nothing queued or being handed
/// to fred, no batch in flight, and no direct send in flight but, at most, one of `me`'s own.
///
/// The exception is the serial caller: its acquire's `SET` to a node often finds its previous
/// release still in flight there (decided by a quorum without waiting for that node). Queueing
/// it would cost a hop through the batcher task for nothing to share it with (the caller has
/// no other command to add); sent directly it is written behind that release on the same
/// connection. Measured on a serial acquire+release cycle (3 local nodes, p50 against the raw
/// fred floor): 1.25x -> 1.21x on a multi-thread runtime, 1.40-1.48x -> 1.29-1.30x on a
/// current-thread one, with 64 tasks unchanged (0.98x, 1.03x). Any other caller's operation
/// in flight means concurrency, which the batcher is for.
fn direct_ok(q: &Queue, me: Caller) -> bool {
    let quiet = q.ops.is_empty() && !q.handing && !q.batch;
    quiet && (q.direct == 0 || (q.direct == 1 && q.direct_by == Some(me)))
}

/// The next thing to send: a batch of the hot-path operations (up to [`MAX_OPS`], in queue
/// order) that no command queued before them shares a key with, unless a batch still awaits
/// its answer (operations accumulate meanwhile); else the first command that no operation
/// queued before it shares a key with. `None`: nothing can go yet (the queue is empty, or
/// everything waits for the batch in flight).
fn take(q: &mut Queue) -> Option<Taken> {
    let mut blocked: Vec<&str> = Vec::new();
    let is_blocked =
        |blocked: &[&str], keys: &[String]| keys.iter().any(|k| blocked.contains(&k.as_str()));
    let mut batch = Vec::new();
    let mut call = None;
    for (i, op) in q.ops.iter().enumerate() {
        match &op.work {
            Work::Key { held, .. } => {
                let free = !q.batch && batch.len() < MAX_OPS && !is_blocked(&blocked, &held.keys);
                match free {
                    true => batch.push(i),
                    false => blocked.extend(held.keys.iter().map(String::as_str)),
                }
            }
            Work::Call { keys, .. } => {
                if call.is_none() && !is_blocked(&blocked, keys) {
                    call = Some(i);
                }
                blocked.extend(keys.iter().map(String::as_str));
            }
        }
    }
    // A batch first: a command on one of its keys then goes right after its hand-over.
    let taken = match (batch.is_empty(), call) {
        (false, _) => {
            q.batch = true;
            Taken::Batch(remove(&mut q.ops, &batch))
        }
        (true, Some(i)) => Taken::Call(q.ops.remove(i)),
        (true, None) => return None,
    };
    q.handing = true;
    Some(taken)
}

/// Removes the operations at `idx` (ascending) from `ops`, keeping both in queue order.
fn remove(ops: &mut Vec<Op>, idx: &[usize]) -> Vec<Op> {
    let mut taken = Vec::with_capacity(idx.len());
    let mut kept = Vec::with_capacity(ops.len() - idx.len());
    let mut next = idx.iter().peekable();
    for (i, op) in std::mem::take(ops).into_iter().enumerate() {
        match next.peek() {
            Some(&&j) if j == i => {
                next.next();
                taken.push(op);
            }
            _ => kept.push(op),
        }
    }
    *ops = kept;
    taken
}

/// The batcher of one node: sends what is queued, in order, until the node closes.
pub(super) async fn batcher(client: Client, state: Arc<State>, shared: Arc<Shared>) {
    let _running = Running(shared.clone(), state.name.clone());
    loop {
        let notified = shared.notify.notified();
        let taken = {
            let mut q = lock(&shared.queue);
            if q.closed {
                return;
            }
            let taken = take(&mut q);
            if q.ops.is_empty() && !q.handing {
                shared.drained.notify_waiters();
            }
            taken
        };
        match taken {
            None => notified.await,
            Some(Taken::Call(op)) => start_call(&state, &shared, op).await,
            Some(Taken::Batch(ops)) => {
                let (client, state, inner) = (client.clone(), state.clone(), shared.clone());
                let send = Box::pin(send_batch(client, state, inner, ops));
                hand_over(&shared, send, BatchDone(shared.clone())).await;
            }
        }
    }
}

/// Polls `send` once (which hands its command to fred), lets direct sends go again, and
/// leaves the rest (the answer) to a task that holds `guard` until it ends.
async fn hand_over<G: Send + 'static>(shared: &Shared, mut send: Boxed<()>, guard: G) {
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(send.as_mut().poll(cx))).await;
    lock(&shared.queue).handing = false;
    if first.is_pending() {
        tokio::spawn(async move {
            let _guard = guard;
            send.await;
        });
    }
}

/// Clears the batch in flight when its answer was handled (or its task dropped), and wakes the
/// batcher for the next one.
struct BatchDone(Arc<Shared>);

impl Drop for BatchDone {
    fn drop(&mut self) {
        lock(&self.0.queue).batch = false;
        self.0.notify.notify_one();
    }
}

/// Starts a queued command (see `Batch::ordered`) with the time left before its deadline, or
/// answers a timeout without sending it when none is left.
async fn start_call(state: &State, shared: &Shared, op: Op) {
    let now = Instant::now();
    let start = match op.work {
        Work::Call { start, .. } if op.deadline > now => start,
        // Its deadline passed in the queue (or, never, a hot-path operation: see `take`).
        _ => {
            lock(&shared.queue).handing = false;
            let _ = op.reply.send(Err(NodeError {
                node: state.name.clone(),
                kind: NodeErrorKind::Timeout,
                message: "timed out before it was sent (queued behind a slower batch)".into(),
            }));
            return;
        }
    };
    let left = op.deadline.saturating_duration_since(now);
    hand_over(shared, start(left), ()).await;
    let _ = op.reply.send(Ok(Value::Null));
}

/// Sends `ops` as one call and answers each. Operations whose deadline passed are answered
/// with a timeout and not sent.
async fn send_batch(client: Client, state: Arc<State>, shared: Arc<Shared>, ops: Vec<Op>) {
    let (client, state, shared) = (&client, &state, &shared);
    let now = Instant::now();
    // Only hot-path operations are taken into a batch (see `take`).
    let ops = ops.into_iter().filter_map(keyed);
    // A release nobody waits for is sent late rather than not at all (it deletes only its own
    // token, and its SET was sent before it).
    // Not with a caller's token: it repeats across attempts, and a late release could delete
    // the next attempt's key.
    let (live, expired): (Vec<Keyed>, Vec<Keyed>) =
        ops.partition(|(op, ..)| op.deadline > now || orphaned_release(op));
    for (op, ..) in expired {
        let _ = op.reply.send(Err(NodeError {
            node: state.name.clone(),
            kind: NodeErrorKind::Timeout,
            message: "timed out before it was sent (queued behind a slower batch)".to_string(),
        }));
    }
    if live.is_empty() {
        return;
    }
    // The earliest deadline still ahead; late orphaned releases alone get MIN_TIMEOUT.
    let timeout = live
        .iter()
        .map(|(op, ..)| op.deadline)
        .filter(|d| *d > now)
        .min()
        .map_or(MIN_TIMEOUT, |d| {
            d.saturating_duration_since(now)
                .max(Duration::from_millis(1))
        });
    let mut orphans = Vec::new();
    // A few operations (the serial case: a release still on its way, the next SET behind it),
    // or a user who may not run scripts: each in its plain form (written together, in queue
    // order, on the node's one connection), which costs the server less than the batch
    // script's body.
    if live.len() <= PLAIN_MAX || state.caps.scripts() == crate::nodes::caps::Scripts::Denied {
        let replies = futures::future::join_all(
            live.iter()
                .map(|(_, held, kind)| send_one(client, state, held, *kind, timeout)),
        )
        .await;
        for ((op, ..), reply) in live.into_iter().zip(replies) {
            answer(op, reply, &mut orphans);
        }
        resend(client, shared, orphans);
        return;
    }
    let scripts = Scripts::get();
    let mut args = Vec::with_capacity(2 + 4 * live.len());
    args.push(fixed(scripts.batch.body));
    args.push(Value::Integer(0));
    for (_, held, kind) in &live {
        args.push(Value::String(held.key_arg()));
        if let (Kind::GateFree, Some(line)) = (kind, &held.line) {
            args.push(Value::from(format!("{}!", line.key)));
        }
    }
    args[1] = Value::Integer(args.len() as i64 - 2);
    for (_, held, kind) in &live {
        args.push(Value::String(held.value_arg()));
        args.push(match (kind, &held.line) {
            (Kind::Acquire { ttl_ms }, _) => Value::Integer(*ttl_ms as i64),
            (Kind::GateFree, Some(_)) => fixed("f"),
            (Kind::Release | Kind::GateFree, _) => fixed("r"),
        });
    }
    let eval = CustomCommand::new_static("EVAL", ClusterHash::Offset(2), false);
    let with = client.with_options(&options(timeout));
    let call = with.custom::<Value, Value>(eval, args);
    let reply = Box::pin(call).await.map_err(|e| state.error(&e));
    let answers = crate::base::reply::batch(&state.name, reply, live.len());
    for ((op, _, kind), answer) in live.into_iter().zip(answers) {
        let reply = answer.map(|n| match kind {
            // The plain SET's reply shape: OK when set, nil when the key exists.
            Kind::Acquire { .. } if n == 1 => fixed("OK"),
            Kind::Acquire { .. } => Value::Null,
            // GateFree: 2 more when its line's flag is set (see `Node::gate_release`).
            Kind::Release | Kind::GateFree => Value::Integer(n),
        });
        self::answer(op, reply, &mut orphans);
    }
    resend(client, shared, orphans);
}

/// A queued hot-path operation with its lock and kind.
type Keyed = (Op, Arc<Held>, Kind);

fn keyed(op: Op) -> Option<Keyed> {
    match &op.work {
        Work::Key { held, kind } => {
            let (held, kind) = (held.clone(), *kind);
            Some((op, held, kind))
        }
        Work::Call { .. } => None,
    }
}

/// The shortest fred timeout a batch is sent with (a release sent late gets at least this).
const MIN_TIMEOUT: Duration = Duration::from_millis(100);

/// Batches of at most this many operations go as plain commands, not as the batch script.
const PLAIN_MAX: usize = 4;

/// Hands `reply` to the operation's caller, or keeps an orphaned release for [`resend`].
fn answer(op: Op, reply: Result<Value, NodeError>, orphans: &mut Vec<Op>) {
    if op.orphaned(&reply) {
        orphans.push(op);
    } else {
        let _ = op.reply.send(reply);
    }
}

/// Queues `orphans` (releases nobody waits for, failed for the connection) again once the
/// connection is back: fred fails commands at once while it reconnects, where a command
/// already in its buffer would have been written after the reconnect. Resending a release is
/// safe: it deletes only its own token, and its token's SET was sent (or failed) before it.
fn resend(client: &Client, shared: &Arc<Shared>, mut orphans: Vec<Op>) {
    if orphans.is_empty() {
        return;
    }
    let (client, shared) = (client.clone(), shared.clone());
    tokio::spawn(async move {
        let pause = Duration::from_millis(10) * 2u32.pow(orphans[0].resent.min(5));
        tokio::time::sleep(pause).await;
        // A wait for the reconnect, not a command: nothing is queued in fred meanwhile.
        let _ = tokio::time::timeout(RECONNECT_WAIT, client.wait_for_connect()).await;
        let now = Instant::now();
        let deadline = now.checked_add(MIN_TIMEOUT).unwrap_or(now);
        for op in &mut orphans {
            op.resent += 1;
            op.deadline = deadline;
        }
        let mut q = lock(&shared.queue);
        if q.closed {
            return;
        }
        let first = q.ops.is_empty();
        q.ops.extend(orphans);
        drop(q);
        if first {
            shared.notify.notify_one();
        }
    });
}

/// How long an orphaned release waits for its node's connection to come back, per resend.
const RECONNECT_WAIT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller of its own (a thread's id is never reused).
    fn caller() -> Caller {
        let id = std::thread::spawn(|| std::thread::current().id());
        Caller::Thread(id.join().expect("thread"))
    }

    fn queue(direct: usize, by: Option<Caller>) -> Queue {
        Queue {
            direct,
            direct_by: by,
            ..Queue::default()
        }
    }

    #[test]
    fn only_a_callers_own_command_in_flight_lets_it_send_directly() {
        let (me, other) = (caller(), caller());
        assert!(direct_ok(&queue(0, None), me), "idle node");
        assert!(direct_ok(&queue(1, Some(me)), me), "own release in flight");
        assert!(
            !direct_ok(&queue(1, Some(other)), me),
            "another caller's command in flight: batched"
        );
        assert!(!direct_ok(&queue(2, Some(me)), me), "two in flight");
        let mut busy = queue(0, None);
        busy.batch = true;
        assert!(!direct_ok(&busy, me), "a batch in flight");
        let mut handing = queue(1, Some(me));
        handing.handing = true;
        assert!(!direct_ok(&handing, me), "a batch being handed to fred");
    }
}
