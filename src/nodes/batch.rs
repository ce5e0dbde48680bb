//! Coalescing of the hot path: the single-key `SET NX` of an acquire and the single-key release
//! that concurrent tasks send to one single-server node go out as ONE script call per node
//! while an earlier call of theirs is still in flight, instead of one fred command each.
//!
//! Why: on a small machine, throughput under concurrency is client CPU, and fred's cost is per
//! command (a `Command` allocation, a channel hop to its router task, a timer, a flush per
//! script command, a oneshot back). 64 tasks cycling acquire+release send 6 commands per cycle;
//! folded into one call per node per round trip, most of that cost is paid once per batch.
//!
//! How, per node:
//! - **Direct when idle.** An operation that finds nothing of this node's hot path in flight
//!   (but, at most, one earlier operation of its own caller: a serial caller's previous
//!   release, decided without this node) and nothing queued is sent by its caller at once, in
//!   its plain form: a serial caller pays no hop and no batching. The plain form of an
//!   acquire is `SET NX`; of a release, the node's native compare-and-delete where it has one
//!   (`DELIFEQ`, `DELEX`: see `caps`, `native`), else the release script by EVALSHA (see
//!   [`lone_release`]); on the key's gate while no line is known there, the release and a read
//!   of the line's flag (`GATE_FLAG`; the batch script's `f` operation does the same), the
//!   wake-up of a head, when the flag is set, left to `Node::gate_release`.
//! - **Queued otherwise.** Anything else joins the node's queue; one batcher task per node
//!   takes everything queued (up to [`MAX_OPS`]), sends it as one `EVAL` of
//!   [`BATCH`](crate::base::scripts) (a lone operation, or every operation on a node whose user may
//!   not run scripts, in its plain form, written together), and waits for the answer before it
//!   sends the next batch, so operations arriving meanwhile accumulate.
//!
//! - **Every other command in the same order.** Any other command for the node (a script, an
//!   extension, a shortening, a fencing raise, a gate's line script: see `Batch::ordered`)
//!   goes the same way: sent by its caller at once when nothing is queued or being handed to
//!   fred, else queued, and the batcher sends it alone in its place, right after what was
//!   queued before it was handed to fred (it does not wait for a batch's answer).
//!
//! What it keeps, and why each holds:
//! - **Per-node order.** The queue is FIFO; the batcher hands over what it takes in queue order
//!   (the script runs a batch's operations in queue order); a direct send happens only when
//!   nothing is queued or being handed to fred; every send goes through the node's one fred
//!   client (one connection). A command's future queues it or hands it to fred when first
//!   polled, so a command issued after another one for the same key (a release after its
//!   `SET`, a shortening after the `SET` still queued on a busy node) is written after it.
//!   Once queued, a command is sent even if its caller stops waiting, as fred sends a command
//!   it holds: so an acquire's clean-up never overtakes the acquire it cleans up.
//! - **No replay.** A batch is sent once, with one attempt (fredlock's fred options): a call
//!   that fails or times out fails every operation it carried, whose outcome then counts as
//!   unknown (an acquire cleans up there, a release is retried by `background`), exactly as
//!   for a single command.
//! - **No NOSCRIPT for a batch.** The batch script is always sent whole (`EVAL`): a resent
//!   batch could set a key after the release queued behind it. A lone release goes by EVALSHA
//!   and is resent with EVAL on `NOSCRIPT`, which is safe for a release (see [`lone_release`]).
//! - **Timeouts.** Each operation keeps its deadline: one still queued when it passes is
//!   answered with a timeout and never sent (as fred skips a timed-out command it has not
//!   written); a batch's fred timeout is the earliest deadline among its operations.
//! - **Cancellation.** A caller that stops waiting leaves its operation to the batcher: it is
//!   sent anyway, and whatever follows it (an acquire's clean-up release) queues behind it.
//!
//! Owns: the queue of one node (its batcher task is `batcher`); sending an acquire's `SET` and a
//! release in plain form. Must not: decide votes (node and reply do), or batch anything whose reply
//! carries more than a 1/0 answer (fenced acquires, multi-key locks and cluster nodes take
//! their own paths in `node`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::clients::Client;
use fred::prelude::{ClientLike, Expiration, KeysInterface, SetOptions, Value};
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::base::error::{NodeError, NodeErrorKind};
use crate::base::scripts::Scripts;
use crate::nodes::caps::Cached;
use crate::nodes::connection::{options, State};

/// The most operations one batch call carries; the rest wait for the next one.
pub(crate) const MAX_OPS: usize = 256;

/// Lock keys and the stored value, shared by every per-node command of one lock.
pub(crate) struct Held {
    pub(crate) keys: Vec<String>,
    /// What every key holds and every script compares: the secret token, then the separator
    /// and the owner label (see `owner`). Unique per acquisition attempt, unless the caller
    /// gave the token (`custom`).
    pub(crate) value: String,
    /// The caller chose the token: it may repeat across this acquire's attempts, so a failed
    /// attempt's clean-up must never be resent late (see `Inner::release_unawaited`, and the
    /// orphaned releases here).
    pub(crate) custom: bool,
    /// The resource names (for error messages; never sent).
    pub(crate) resources: Vec<String>,
    /// With fencing: each key's counter key, in the same order; empty otherwise.
    pub(crate) fence_keys: Vec<String>,
    /// The wait line this lock's keys are gated by, if any (its gate node's acquire and
    /// release take the line scripts, never this batcher).
    pub(crate) line: Option<LineRef>,
    /// Whether a repair (keys re-set where missing, see `Node::repair`) may still be sent, and
    /// how many were made.
    pub(crate) repairs: Repairs,
    /// The first key and the value as command arguments (see [`Wire`]).
    pub(crate) wire: Wire,
    /// An election's term, set once its attempt was granted: the record and the yield request
    /// beside the lock key, whose view a release announces to observers in the same script
    /// (see `Node::release_here`; a failed attempt's clean-up announces nothing).
    pub(crate) announce: std::sync::OnceLock<Arc<[String; 2]>>,
    /// Which nodes' batchers hold this lock's latest single-key operation (see [`Batched`]).
    pub(crate) batched: Batched,
}

/// Bit `i` set: node `i`'s latest single-key hot-path operation of a lock (its acquire's `SET`,
/// then its release) went into that node's batcher queue instead of being sent by its caller.
/// Such an operation is the batcher's from then on: it is sent whether its caller waits or not,
/// never after its deadline, and a release whose caller stopped waiting is resent by the
/// batcher if it fails for the connection (see `Op::orphaned`). A round may then drop a late
/// call to that node instead of finishing it in a task (see `Inner::release_all`,
/// `quorum::fan_out_handed`). Set or cleared by each operation when first polled; nodes past
/// the 64th are never marked (their late calls are finished as before).
#[derive(Default)]
pub(crate) struct Batched(std::sync::atomic::AtomicU64);

impl Batched {
    /// Records whether node `index`'s operation was queued (`true`) or sent directly (or went
    /// another way: every acquire and release clears the mark first).
    pub(crate) fn mark(&self, index: usize, queued: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(bit) = (index < 64).then(|| 1u64 << index) else {
            return;
        };
        if queued {
            self.0.fetch_or(bit, Relaxed);
        } else if self.0.load(Relaxed) & bit != 0 {
            self.0.fetch_and(!bit, Relaxed);
        }
    }

    /// Whether node `index`'s latest operation of this lock is its batcher's.
    pub(crate) fn queued(&self, index: usize) -> bool {
        index < 64 && self.0.load(std::sync::atomic::Ordering::Relaxed) & (1 << index) != 0
    }
}

/// A lock's first key and its value as fred arguments, made at first use and shared by every
/// command of the lock after it: cloning one counts a reference, where a `&str` argument is
/// copied into a new buffer for each command (and that buffer again when fred encodes it).
/// Measured on 3 nodes (a counting allocator, exact): 137 -> 116 allocations per serial
/// acquire+release cycle, 84 -> 64 per cycle with 64 tasks (the raw fred floor: 83, serial).
#[derive(Default)]
pub(crate) struct Wire(std::sync::OnceLock<(Str, Str)>);

impl Held {
    fn wire(&self) -> &(Str, Str) {
        self.wire.0.get_or_init(|| {
            let key = self.keys.first().map_or("", String::as_str);
            (Str::from(key), Str::from(self.value.as_str()))
        })
    }

    /// The first key, as a command argument.
    pub(crate) fn key_arg(&self) -> Str {
        self.wire().0.clone()
    }

    /// The value, as a command argument.
    pub(crate) fn value_arg(&self) -> Str {
        self.wire().1.clone()
    }
}

/// A lock's repairs (its keys re-set where missing while held: `Node::repair`). Closed for
/// good by its first release, shorten or hand-over; a repair checks it and hands its command to
/// the connection in one step under the mutex, so none is written after the release there.
#[derive(Debug, Default)]
pub(crate) struct Repairs {
    closed: Mutex<bool>,
    made: std::sync::atomic::AtomicU64,
}

impl Repairs {
    /// No repair is sent from now on.
    pub(crate) fn close(&self) {
        *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = true;
    }

    /// Polls `call` once (which hands its command to the connection) unless closed: `None`
    /// when closed (nothing sent), else the first poll's result.
    pub(crate) fn first_poll<F: std::future::Future + ?Sized>(
        &self,
        call: std::pin::Pin<&mut F>,
        cx: &mut std::task::Context<'_>,
    ) -> Option<std::task::Poll<F::Output>> {
        let closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        match *closed {
            true => None,
            false => Some(call.poll(cx)),
        }
    }

    /// One more repair was made.
    pub(crate) fn made(&self) {
        self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many repairs were made.
    pub(crate) fn count(&self) -> u64 {
        self.made.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Where a lock's wait line is, and this lock's part in it (see `line` and the gate scripts).
#[derive(Debug)]
pub(crate) struct LineRef {
    /// The gate node's index.
    pub(crate) gate: usize,
    /// The line's key on the gate.
    pub(crate) key: String,
    /// The waiter's member name (`None`: this acquire does not wait, so never joins).
    pub(crate) member: Option<std::sync::Arc<str>>,
    /// What a release on the gate does: `false` (an attempt's clean-up) puts the member back
    /// at the front of the line, quietly without one; `true` (set when the lock is granted)
    /// wakes the line's head.
    pub(crate) wake: std::sync::atomic::AtomicBool,
    /// The Redlock's line state: a release that woke one of its own members wakes it at once.
    pub(crate) local: std::sync::Arc<crate::base::line::Line>,
    /// The gate granted this attempt (set by the attempt when the others refused): its clean-up
    /// puts the member at the front of the line even without a place there before (it was the
    /// head, or the line was empty), so the holder's release wakes it.
    pub(crate) at_gate: std::sync::atomic::AtomicBool,
    /// Ask the gate for the waiter's exact place behind the head (`ZRANK`, asked first: a member
    /// found in line is not added again): a waiter already in line looking at its timer (far
    /// behind, it renews without looking next time: see the acquire loop), or one that polls (it
    /// paces itself by it).
    pub(crate) rank: bool,
    /// What the attempt knows of its place in the line (see `scripts::GATE_ACQUIRE`).
    pub(crate) place: Place,
    /// Where the gate's answer to this attempt is told, even when it comes after the attempt
    /// was decided (`None`: the attempt carries no member).
    pub(crate) answer: Option<Arc<GateAnswer>>,
    /// The waiter's call on the gate while it runs: what ends the lock there waits for it.
    pub(crate) call: crate::base::line::GateCall,
}

/// What a waiter's attempt heard from its gate: told by the gate's call when it answers (also
/// after the attempt was decided without it), read by the waiter's place, which then leaves the
/// line only if the gate may have it there.
#[derive(Debug, Default)]
pub(crate) struct GateAnswer {
    /// 0: no answer yet; 1: granted (the gate took the member out of its line); 2: anything
    /// else (refused, failed: the member may be in line).
    state: std::sync::atomic::AtomicU8,
    told: Notify,
}

impl GateAnswer {
    /// The gate answered: granted or not.
    pub(crate) fn tell(&self, granted: bool) {
        let state = if granted { 1 } else { 2 };
        self.state
            .store(state, std::sync::atomic::Ordering::Release);
        self.told.notify_waiters();
    }

    /// Whether the gate answered with a grant (so far).
    pub(crate) fn granted(&self) -> bool {
        self.state.load(std::sync::atomic::Ordering::Acquire) == 1
    }

    /// Whether the gate granted, once it answered or `bound` passed (then `false`).
    pub(crate) async fn granted_within(&self, bound: Duration) -> bool {
        let told = self.told.notified();
        tokio::pin!(told);
        told.as_mut().enable();
        if self.state.load(std::sync::atomic::Ordering::Acquire) == 0 {
            let _ = tokio::time::timeout(bound, told).await;
        }
        self.granted()
    }
}

/// What a waiter's attempt knows of its place in its line: the gate reads only what it must.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Woken by the gate as the head: the gate pops the line's first entry.
    Turn,
    /// Not in the line yet: the gate reads the line's tail only.
    New,
    /// In the line, or not known: the gate looks at the head.
    Look,
}

impl Place {
    /// The argument `GATE_ACQUIRE` takes for it.
    pub(crate) fn arg(self) -> &'static str {
        match self {
            Place::Turn => "turn",
            Place::New => "new",
            Place::Look => "",
        }
    }
}

impl LineRef {
    /// A line reference whose releases wake the head (a granted lock's).
    pub(crate) fn granted(&self) -> LineRef {
        LineRef {
            gate: self.gate,
            key: self.key.clone(),
            member: None,
            wake: std::sync::atomic::AtomicBool::new(true),
            local: self.local.clone(),
            at_gate: std::sync::atomic::AtomicBool::new(false),
            rank: false,
            place: Place::Look,
            answer: None,
            call: Default::default(),
        }
    }
}

impl std::fmt::Debug for Held {
    // The value starts with the secret token: only its fingerprint and the label are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (token, label) = crate::base::owner::split(&self.value);
        f.debug_struct("Held")
            .field("keys", &self.keys)
            .field("fingerprint", &crate::base::owner::fingerprint(token))
            .field("label", &label)
            .finish_non_exhaustive()
    }
}

impl Held {
    /// The resource names as errors show them (a semaphore permit as its semaphore's name,
    /// never an internal key).
    pub(crate) fn names(&self) -> crate::base::error::Names {
        crate::base::error::Names(
            self.resources
                .iter()
                .map(|r| crate::base::slots::shown(r))
                .collect(),
        )
    }

    /// Whether this lock's keys are re-set where missing while it is held: a plain lock's (one
    /// or several resources, fenced or not, an election's term), never a semaphore permit's or
    /// a read-write lock's (their keys live under reserved names, and a node's slot or reader
    /// bookkeeping would not match a key set alone).
    pub(crate) fn heals(&self) -> bool {
        !self
            .resources
            .iter()
            .any(|r| r.starts_with(crate::base::slots::RESERVED))
    }
}

/// What an operation does to its lock's (single) key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `SET key token NX PX ttl_ms`.
    Acquire { ttl_ms: u64 },
    /// The release script.
    Release,
    /// The release on the key's gate while no line is known there: the compare-and-delete and
    /// a read of the line's flag (`GATE_FLAG` alone, the batch's `f` operation in a batch); the
    /// wake-up of a head, if the flag says there may be one, is left to the caller (see
    /// `Node::gate_free_batched`).
    GateFree,
}

/// Any other command for this node (see `Batch::ordered`): started by the batcher with the
/// time left before its deadline; the future it returns hands the command to fred when first
/// polled and answers its caller itself.
pub(super) type Start = Box<dyn FnOnce(Duration) -> Unit + Send>;
type Unit = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// What a queued operation is.
pub(super) enum Work {
    /// A hot-path operation on `held`'s one key, batched with its neighbours.
    Key { held: Arc<Held>, kind: Kind },
    /// Any other command, on `keys`, sent alone once no operation queued before it touches
    /// one of its keys.
    Call { keys: Vec<String>, start: Start },
}

impl Work {
    /// Whether this operation touches one of `keys`.
    pub(super) fn touches(&self, keys: &[String]) -> bool {
        match self {
            Work::Key { held, .. } => held.keys.first().is_some_and(|k| keys.contains(k)),
            Work::Call { keys: mine, .. } => mine.iter().any(|k| keys.contains(k)),
        }
    }
}

/// One queued operation.
pub(super) struct Op {
    pub(super) work: Work,
    pub(super) deadline: Instant,
    pub(super) reply: oneshot::Sender<Result<Value, NodeError>>,
    /// How often this (release) was resent after a connection failure (see [`resend`]).
    pub(super) resent: u32,
}

/// A release nobody waits for any more is resent after a connection failure at most this often.
const MAX_RESENDS: u32 = 8;

/// A release whose caller stopped waiting for its answer, and whose token is fresh (see
/// [`Op::orphaned`]).
pub(super) fn orphaned_release(op: &Op) -> bool {
    matches!(&op.work, Work::Key { held, kind: Kind::Release | Kind::GateFree } if !held.custom)
        && op.reply.is_closed()
}

impl Op {
    /// A release whose caller stopped waiting (a clean-up, a release decided on other nodes)
    /// and which failed without a server's answer (the connection, a timeout, a call never
    /// sent): today's fred would have written it after the
    /// reconnect had it still been in fred's buffer, so it is resent (see [`resend`]).
    ///
    /// Never with a caller's token: it repeats across one acquire's attempts, and a late
    /// release could delete what the next attempt set.
    pub(super) fn orphaned(&self, answer: &Result<Value, NodeError>) -> bool {
        orphaned_release(self)
            && self.resent < MAX_RESENDS
            && matches!(answer, Err(e) if matches!(e.kind, NodeErrorKind::Connection | NodeErrorKind::Timeout | NodeErrorKind::Client))
    }
}

/// Who sends a direct operation: a tokio task, or a thread outside any task (a `block_on`,
/// as under `#[tokio::main]`). A task may move between threads, so a task is known by its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Caller {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Caller {
    pub(super) fn current() -> Caller {
        match tokio::task::try_id() {
            Some(id) => Caller::Task(id),
            None => Caller::Thread(std::thread::current().id()),
        }
    }
}

#[derive(Default)]
pub(super) struct Queue {
    pub(super) ops: Vec<Op>,
    /// A batch was taken from the queue and is being handed to fred or awaits its answer.
    pub(super) batch: bool,
    /// The batcher took a batch or a call from the queue and has not handed it to fred yet:
    /// nothing may be sent directly meanwhile (it would overtake what was queued before it).
    pub(super) handing: bool,
    /// Direct sends handed to fred (or about to be) and not answered yet.
    pub(super) direct: usize,
    /// Who made the direct sends in flight (set by the first of them; a second one is made
    /// only by the same caller, see `batcher::direct_ok`).
    pub(super) direct_by: Option<Caller>,
    /// The batcher task was started.
    pub(super) started: bool,
    /// The node is gone: queued operations fail, the batcher ends.
    pub(super) closed: bool,
}

pub(super) struct Shared {
    pub(super) queue: Mutex<Queue>,
    /// Wakes the batcher: something was queued, or a batch was answered.
    pub(super) notify: Notify,
    /// Woken by the batcher when it finds the queue empty (see `Batch::drained`).
    pub(super) drained: Notify,
}

pub(super) fn lock(m: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    // The queue holds no invariant a panic could break half-way (no code panics while holding it).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One operation in its plain form, with fredlock's options: the typed `SET` (fred batches
/// those into one write), or the release: the node's native compare-and-delete when it has one
/// (`native`), else the release script (see [`lone_release`]).
pub(super) async fn send_one(
    client: &Client,
    state: &Arc<State>,
    held: &Arc<Held>,
    kind: Kind,
    timeout: Duration,
) -> Result<Value, NodeError> {
    if held.keys.is_empty() {
        return Ok(Value::Integer(0));
    }
    match kind {
        Kind::Acquire { ttl_ms } => {
            let with = client.with_options(&options(timeout));
            let set = with.set::<Value, _, _>(
                held.key_arg(),
                held.value_arg(),
                Some(Expiration::PX(ttl_ms as i64)),
                Some(SetOptions::NX),
                false,
            );
            // Boxed: fred's command futures are ~5 KB (see `node`).
            Box::pin(set).await.map_err(|e| state.error(&e))
        }
        Kind::GateFree => match held.line.as_ref() {
            Some(line) => {
                let flag = Value::from(format!("{}!", line.key));
                lone_release(client, state, held, LoneRelease::GateFlag(flag), timeout).await
            }
            None => Box::pin(send_one(client, state, held, Kind::Release, timeout)).await,
        },
        Kind::Release => {
            let (key, value) = (
                Value::String(held.key_arg()),
                Value::String(held.value_arg()),
            );
            let native = crate::nodes::native::release(client, state, key, value, timeout);
            match Box::pin(native).await {
                Some(reply) => reply,
                None => match state.caps.no_script() {
                    // Nothing of ours can be here: acquires send nothing to such a node.
                    Some(message) => Err(NodeError {
                        node: state.name.clone(),
                        kind: NodeErrorKind::Permission,
                        message,
                    }),
                    None => lone_release(client, state, held, LoneRelease::Plain, timeout).await,
                },
            }
        }
    }
}

/// Which script a lone release of one key sends.
enum LoneRelease {
    /// `RELEASE`: the compare-and-delete.
    Plain,
    /// `GATE_FLAG` on the key's gate, with its line's flag key.
    GateFlag(Value),
}

/// The release script for one key (or `GATE_FLAG` on its gate: the same, plus a read of the
/// line's flag). EVAL the first time on each connection (which puts the script in the server's
/// cache: a fresh or restarted server never answers `NOSCRIPT`, so the release keeps its place
/// in this node's order), EVALSHA from then on, and on `NOSCRIPT` (someone flushed the cache)
/// EVAL at once, which then lands after whatever this process sent the node meanwhile. A caller
/// that stops waiting after the EVALSHA was handed to fred leaves the rest to a task (see
/// [`Finish`]), so a `NOSCRIPT` answer is never left without its resend. Resent late, a release
/// still deletes only its own token, which no later command of ours stores (tokens are fresh per
/// attempt). With a caller's token (repeated across attempts) always EVAL: a late resend could
/// delete the next attempt's key.
async fn lone_release(
    client: &Client,
    state: &Arc<State>,
    held: &Arc<Held>,
    which: LoneRelease,
    timeout: Duration,
) -> Result<Value, NodeError> {
    let scripts = Scripts::get();
    let (script, cached, flag) = match which {
        LoneRelease::Plain => (&scripts.release, Cached::Release, None),
        LoneRelease::GateFlag(flag) => (&scripts.gate_flag, Cached::GateFlag, Some(flag)),
    };
    let args = move |first: &'static str, held: &Held| {
        let mut args = Vec::with_capacity(5);
        args.push(fixed(first));
        args.push(Value::Integer(1 + flag.is_some() as i64));
        args.push(Value::String(held.key_arg()));
        args.extend(flag.clone());
        args.push(Value::String(held.value_arg()));
        args
    };
    if held.custom || !state.caps.is_cached(cached) {
        let cmd = CustomCommand::new_static("EVAL", ClusterHash::Offset(2), false);
        let with = client.with_options(&options(timeout));
        let call = with.custom::<Value, Value>(cmd, args(script.body, held));
        let reply = Box::pin(call).await.map_err(|e| state.error(&e));
        if reply.is_ok() {
            state.caps.set_cached(cached, true);
        }
        return crate::nodes::native::scripted(state, reply);
    }
    let sha = args(&script.sha, held);
    let again = held.clone();
    let body = move || args(script.body, &again);
    let reply = by_sha(client, state, cached, sha, body, timeout).await;
    // A `NOPERM` for the script command marks scripts denied here, and says what to do.
    crate::nodes::native::scripted(state, reply)
}

/// A `'static` string as a command argument, not copied (a script's body or SHA1).
pub(super) fn fixed(s: &'static str) -> Value {
    Value::String(fred::bytes_utils::Str::from_static(s))
}

/// A script by EVALSHA (`sha`: its arguments), and on `NOSCRIPT` (someone flushed the cache) by
/// EVAL (`body` makes those arguments, built only then: the common case copies no script) at
/// once, which then lands after whatever this process sent the node meanwhile: only for a
/// release, which deletes nothing but its own fresh token. A caller that stops waiting after the
/// EVALSHA was handed to fred leaves the rest to a task (see [`Finish`]).
async fn by_sha(
    client: &Client,
    state: &Arc<State>,
    cached: Cached,
    sha: Vec<Value>,
    body: impl FnOnce() -> Vec<Value> + Send + 'static,
    timeout: Duration,
) -> Result<Value, NodeError> {
    let on: &State = state;
    let (client, state) = (client.clone(), state.clone());
    Finish::new(on, async move {
        let with = client.with_options(&options(timeout));
        let cmd = CustomCommand::new_static("EVALSHA", ClusterHash::Offset(2), false);
        match Box::pin(with.custom::<Value, Value>(cmd, sha)).await {
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                tracing::debug!(node = %state.name, "NOSCRIPT: resending the release with EVAL");
                state.caps.set_cached(cached, false);
                let cmd = CustomCommand::new_static("EVAL", ClusterHash::Offset(2), false);
                let call = with.custom::<Value, Value>(cmd, body());
                let reply = Box::pin(call).await.map_err(|e| state.error(&e));
                // The server has the script again.
                if reply.is_ok() {
                    state.caps.set_cached(cached, true);
                }
                reply
            }
            other => other.map_err(|e| state.error(&e)),
        }
    })
    .await
}

/// A boxed command future.
pub(crate) type Boxed<T = Result<Value, NodeError>> =
    std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// A command that, once handed to fred (polled once), runs to its end even if its caller
/// stops waiting: dropped half-way, the rest (waiting for the answer, and the EVAL after a
/// `NOSCRIPT`) moves to a task, counted in the node's [`Busy`](crate::nodes::busy::Busy) until
/// it ends (closing the node waits for it). Dropped before its first poll, nothing was sent,
/// and nothing is. Releases here and every script (`Node::eval_with`) are sent this way.
pub(crate) struct Finish {
    work: Option<Boxed>,
    polled: bool,
    working: Option<crate::nodes::busy::Working>,
}

impl Finish {
    /// `work` on the node of `state`, finished in a task if dropped after its first poll.
    pub(crate) fn new(
        state: &State,
        work: impl std::future::Future<Output = Result<Value, NodeError>> + Send + 'static,
    ) -> Finish {
        Finish {
            work: Some(Box::pin(work)),
            polled: false,
            working: Some(state.busy.enter()),
        }
    }
}

impl std::future::Future for Finish {
    type Output = Result<Value, NodeError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.polled = true;
        let Some(work) = self.work.as_mut() else {
            return std::task::Poll::Pending;
        };
        let out = std::task::ready!(work.as_mut().poll(cx));
        self.work = None;
        std::task::Poll::Ready(out)
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if let (true, Some(work)) = (self.polled, self.work.take()) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let working = self.working.take();
                rt.spawn(async move {
                    let _ = work.await;
                    drop(working);
                });
            }
        }
    }
}
