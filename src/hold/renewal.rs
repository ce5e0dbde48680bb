//! Who extends a kept-alive lock, and when: the per-lock cycle (schedule, budget, retries), and
//! the two drivers of that cycle: the Redlock's shared renewer (the default), which extends the
//! locks due at about the same time with ONE script call per node, and a task per lock
//! (`KeepAliveOptions::batched(false)`).
//!
//! The state every party sees is one value (`Status`, in a `StatusCell`, see `status`) that
//! only moves forward; a driver publishes a new deadline only if it was obtained before the old
//! one passed and lies after it.
//!
//! The driver owns each [`Lock`] inside a [`Holder`] whose `Drop` publishes "lost" BEFORE the
//! lock (and so its keys) goes: whatever way the driver ends (a panic, the runtime shutting
//! down, an early return), no handle can still say "held" once the keys may be released. The
//! shared renewer keeps its holders in its own future, so the same holds for every lock it
//! renews at once; the next keep-alive on that Redlock starts a new renewer.
//!
//! **Batches.** Each renewal's time is rounded down to a grid of 2^k ms, the largest not above
//! `min(ttl / 20, 500 ms)` (never sooner than `ttl / 10` after that lock's previous round: see
//! [`Pacing::batch_at`]); the renewer wakes at the earliest such time and takes every lock due
//! by then, so locks due within one grain of each other share a batch. Locks extended in one
//! batch get the same new deadline and so stay due together. A batch carries at
//! most [`MAX_BATCH_KEYS`] keys (a lock with more goes alone), so that no script holds a node for
//! long. Each lock keeps its own cycle: its TTL within its budget, its quorum of nodes that
//! extended IT (the script answers per lock), its validity counted from before the batch was
//! sent, its own retries and its own lost signal (see `Inner::extend_many` in `redlock`). A
//! batch's results are applied once every lock of it is decided, at most one per-node timeout
//! after it was sent (the most patient one every lock of the batch allows); waiting costs no
//! validity. Batches run concurrently; a lock is in at most one at a time, and a guard's
//! release or drop is served at once, batch in flight or not.
//!
//! Owns: [`Holder`], the per-lock cycle and both drivers, the batch bound. The status and its
//! lost/expire transitions are `status`'s; the arithmetic of the schedule is `pacing`'s; the
//! public handles are `keepalive`'s. Must not: talk to nodes except through the rounds of [`Lock`] and
//! the Redlock (`extend_inner`, `extend_many`).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::base::error::{Error, LostReason, NotHeldReason, Result};
use crate::hold::pacing::{self, fire_at, KeepAliveOptions, Pacing};
use crate::hold::status::{expire, mark_lost, Shared, Status};
use crate::rounds::held_rounds::ExtendRequest;
use crate::rounds::lock::Lock;
use crate::rounds::redlock::Redlock;

/// The most keys one batched extend script carries (a lock with more keys is sent alone).
///
/// Why 128, measured on redis-server 7.0.15 (2 shared cores, load 4.5; medians of 5 runs):
/// the node's CPU per lock falls from ~40 µs for a one-lock call to 4.7 µs at 32 keys per call
/// and 2.6-2.9 µs from 64 keys on, where the script's own GET and PEXPIRE per key dominate, so a
/// bigger batch saves almost nothing more; but it holds the node longer, delaying every other
/// client's commands there: a call of 128 keys took 0.3 ms, 256 keys 0.7 ms, 512 keys 1.5 ms.
/// `examples/bench_keepalive.rs` prints the duration of the batches it sends.
pub(crate) const MAX_BATCH_KEYS: usize = 128;

/// A driver's lock. Whatever way the driver ends without handing the lock back (a panic, the
/// runtime shutting down, a return that forgot to), dropping this publishes "lost" FIRST, and
/// only then drops the lock, which releases its keys in the background.
pub(crate) struct Holder {
    lock: Option<Lock>,
    tx: Shared,
}

impl Holder {
    /// Holds `lock`, whose status is `tx`.
    pub(crate) fn new(lock: Lock, tx: Shared) -> Holder {
        Holder {
            lock: Some(lock),
            tx,
        }
    }

    fn lock(&mut self) -> &mut Lock {
        // `lock` is `None` only after `hand_back`, which consumes the holder.
        let present = self.lock.as_mut();
        present.expect("the lock is present until handed back") // ok: see above
    }

    /// Ends the driver's work normally: the lock goes back to whoever asks for it.
    fn hand_back(mut self) -> Lock {
        let present = self.lock.take();
        present.expect("the lock is present until handed back") // ok: see `lock`
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if self.lock.is_some() {
            mark_lost(&self.tx, LostReason::TaskEnded);
            tracing::warn!("fredlock: keep-alive task ended without handing its lock back (panic or runtime shutdown); the lock counts as lost and is released");
        }
        // `self.lock` is dropped after this: its keys are released in the background.
    }
}

/// What a lock's cycle waits for next.
#[derive(Debug, Clone, Copy)]
enum Next {
    /// Start an extension round at `at`; `retry`: after a failed round (then never early).
    Round { at: Instant, retry: bool },
    /// Nothing more will be sent: mark the lock lost at `at` (its lost signal), then done.
    /// `gave_up`: no retry fitted before the deadline.
    Expire { at: Instant, gave_up: bool },
    /// A round is in flight.
    InFlight,
    /// Lost: nothing more to do; the lock waits to be handed back.
    Done,
}

/// One kept-alive lock's cycle: sleep until `renew_when_left` of the TTL is left (and at least
/// `ttl / 10` after the previous round started); size the round's TTL within the budget, afresh
/// on every retry; send it only if it moves the deadline forward by at least `ttl / 20`; publish
/// the new deadline only if it is later than the published one and obtained before that one
/// passed; retry a failed round while validity is left. Both drivers run exactly this.
pub(crate) struct Renewal {
    holder: Holder,
    pacing: Pacing,
    max_extensions: Option<u32>,
    hold_end: Option<Instant>,
    /// When the previous round started.
    last_round: Instant,
    /// The published deadline when this cycle began: what a round must move forward.
    cycle_deadline: Instant,
    next: Next,
    /// Where the shared renewer filed this lock in its schedule, if it did.
    filed: Option<Instant>,
}

impl Renewal {
    /// The cycle of `holder`'s lock, with `options` (validated) and the budget's end.
    pub(crate) fn new(
        mut holder: Holder,
        options: &KeepAliveOptions,
        hold_end: Option<Instant>,
    ) -> Renewal {
        let lock = holder.lock();
        let pacing = Pacing::new(
            options,
            lock.ttl(),
            hold_end,
            lock.redlock().inner.drift_factor,
        );
        let last_round = lock.acquired_at();
        let cycle_deadline = holder.tx.borrow().deadline;
        let mut renewal = Renewal {
            holder,
            pacing,
            max_extensions: options.max_extensions,
            hold_end,
            last_round,
            cycle_deadline,
            next: Next::Done,
            filed: None,
        };
        renewal.plan();
        renewal
    }

    /// The top of a cycle: wait for the end of the budget, or for the next renewal.
    fn plan(&mut self) {
        let tx = &self.holder.tx;
        let Status {
            deadline,
            final_deadline,
            extensions,
            ..
        } = tx.borrow();
        let spent = self.max_extensions.is_some_and(|m| extensions >= m);
        if final_deadline || spent {
            tx.send_if_modified(|s| !std::mem::replace(&mut s.final_deadline, true));
            tracing::debug!("keep-alive budget spent; the lock expires at its deadline");
            self.next = Next::Expire {
                at: fire_at(deadline),
                gave_up: false,
            };
        } else {
            self.cycle_deadline = deadline;
            self.next = Next::Round {
                at: self.pacing.renew_at(deadline, self.last_round),
                retry: false,
            };
        }
    }

    /// When the shared renewer takes this lock's next step (renewals rounded to the batch grid
    /// counted from `epoch`, retries and expiries exactly when due); `None` while a round is in
    /// flight or once done.
    fn due(&self, epoch: Instant) -> Option<Instant> {
        match self.next {
            Next::Round { at, retry: false } => {
                Some(self.pacing.batch_at(at, self.last_round, epoch))
            }
            Next::Round { at, retry: true } | Next::Expire { at, .. } => Some(at),
            Next::InFlight | Next::Done => None,
        }
    }

    /// Starts the round that is due, at `now`: `Some(ttl)` to send, or `None` when no round
    /// within the budget would move the deadline forward (an extension now could only shorten
    /// the keys): the last deadline then stands, and the cycle waits for it.
    fn begin_round(&mut self, now: Instant) -> Option<Duration> {
        self.last_round = now;
        let ttl = self.pacing.round_ttl(now);
        if !self.pacing.useful(ttl, now, self.cycle_deadline) {
            self.holder.tx.send_modify(|s| s.final_deadline = true);
            self.plan();
            return None;
        }
        self.next = Next::InFlight;
        Some(ttl)
    }

    /// The outcome of the round started with `ttl`; on success the lock already carries the
    /// deadline the nodes gave.
    fn finish_round(&mut self, ttl: Duration, result: Result<()>) {
        let full_ttl = self.pacing.ttl;
        let hold_end = self.hold_end;
        let obtained = self.holder.lock().deadline();
        let tx = &self.holder.tx;
        match result {
            Ok(()) => {
                let new_deadline = pacing::cap(obtained, hold_end);
                let published = tx.send_if_modified(|s| {
                    if s.lost.is_some()
                        || Instant::now() >= fire_at(s.deadline)
                        || new_deadline <= s.deadline
                    {
                        return false;
                    }
                    s.deadline = new_deadline;
                    s.extensions = s.extensions.saturating_add(1);
                    if ttl < full_ttl {
                        // Shortened to fit the budget: this is the last one.
                        s.final_deadline = true;
                    }
                    true
                });
                if !published {
                    // Someone saw the old deadline pass first: the lock counts as lost.
                    expire(tx);
                    if tx.borrow().lost.is_some() {
                        self.next = Next::Done;
                        return;
                    }
                }
                self.plan();
            }
            Err(Error::NotHeld {
                reason: NotHeldReason::TokenGone,
                ..
            }) => {
                tracing::warn!(resources = ?self.holder.lock().resources(), "fredlock: lock lost: a quorum no longer holds the token");
                mark_lost(&self.holder.tx, LostReason::TokenGone);
                self.next = Next::Done;
            }
            Err(Error::NotHeld { .. }) => {
                expire(tx);
                mark_lost(tx, LostReason::Expired);
                tracing::warn!(resources = ?self.holder.lock().resources(), "fredlock: lock lost: deadline passed before an extension succeeded");
                self.next = Next::Done;
            }
            Err(e) => {
                tracing::debug!(error = %e, "extension round failed; retrying within validity");
                let give_up = fire_at(tx.borrow().deadline);
                self.next = match self.pacing.retry_at(Instant::now(), give_up) {
                    Some(at) => Next::Round { at, retry: true },
                    None => Next::Expire {
                        at: give_up,
                        gave_up: true,
                    },
                };
            }
        }
    }

    /// The `Expire` step is due: the lock counts as lost from its lost signal on.
    fn expire_now(&mut self) {
        expire(&self.holder.tx);
        if let Next::Expire { gave_up: true, .. } = self.next {
            tracing::warn!(resources = ?self.holder.lock().resources(), "fredlock: lock lost: no extension succeeded before the deadline");
        }
        self.next = Next::Done;
    }

    /// Ends the cycle: the lock goes back to the guard.
    fn into_lock(self) -> Lock {
        self.holder.hand_back()
    }
}

/// How a [`KeepAlive`](crate::KeepAlive) reaches whoever extends its lock.
#[derive(Debug)]
pub(crate) enum Driver {
    /// A task of its own (`batched(false)`); it returns the lock when stopped or done.
    Alone {
        stop: oneshot::Sender<()>,
        task: JoinHandle<Lock>,
    },
    /// The Redlock's shared renewer holds the lock under this id.
    Shared { renewer: Renewer, id: u64 },
    /// Stopped (the lock was handed back), or the renewer could not be reached.
    Ended,
}

impl Driver {
    /// Starts extending `lock` (whose status channel is `tx`) with `options` (validated), by a
    /// task of its own or by the Redlock's shared renewer. Must be called inside a tokio runtime.
    pub(crate) fn start(
        lock: Lock,
        tx: Shared,
        options: &KeepAliveOptions,
        hold_end: Option<Instant>,
    ) -> Driver {
        let redlock = lock.redlock().clone();
        let renewal = Renewal::new(Holder::new(lock, tx), options, hold_end);
        if !options.batched {
            let (stop, stop_rx) = oneshot::channel();
            let task = tokio::spawn(run_alone(renewal, stop_rx));
            return Driver::Alone { stop, task };
        }
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let mut msg = Msg::Add(id, Box::new(renewal));
        // A renewer whose runtime shut down is replaced; a send can only fail if the renewer
        // ended between the check and the send, so the second try reaches a fresh one.
        for _ in 0..2 {
            let renewer = Renewer::of(&redlock);
            match renewer.0.send(msg) {
                Ok(()) => return Driver::Shared { renewer, id },
                Err(mpsc::error::SendError(back)) => msg = back,
            }
        }
        // The runtime is shutting down: dropping the message drops the holder, which publishes
        // "lost" first, then releases the lock.
        drop(msg);
        Driver::Ended
    }

    /// Stops extending and hands the lock back (an extension in flight is abandoned: its
    /// commands are queued on each node before anything sent after this). `None` when the
    /// driver ended without it: its holder then published "lost" and released the lock.
    ///
    /// Cancellation: dropping the future after the stop was sent drops the lock when it comes
    /// back, which releases it in the background.
    pub(crate) async fn stop(&mut self) -> Option<Lock> {
        match std::mem::replace(self, Driver::Ended) {
            Driver::Alone { stop, task } => {
                let _ = stop.send(());
                match task.await {
                    Ok(lock) => Some(lock),
                    Err(e) => {
                        tracing::error!(error = %e, "fredlock: keep-alive task failed; the lock expires with its TTL");
                        None
                    }
                }
            }
            Driver::Shared { renewer, id } => {
                let (reply, back) = oneshot::channel();
                renewer.0.send(Msg::Stop(id, reply)).ok()?;
                back.await.ok()
            }
            Driver::Ended => None,
        }
    }

    /// The guard was dropped: stop extending and release the lock in the background.
    pub(crate) fn abandon(&mut self) {
        match std::mem::replace(self, Driver::Ended) {
            // Dropping `stop` ends the task, which drops the Lock, which releases.
            Driver::Alone { .. } | Driver::Ended => {}
            Driver::Shared { renewer, id } => {
                let _ = renewer.0.send(Msg::Drop(id));
            }
        }
    }
}

/// The per-lock driver (`batched(false)`): one task that runs the cycle and sends each round
/// with [`Lock`]'s own extend (one script call per node per round). Hands the lock back when
/// stopped or lost.
async fn run_alone(mut renewal: Renewal, mut stop: oneshot::Receiver<()>) -> Lock {
    let span =
        tracing::debug_span!("fredlock.keep_alive", resources = ?renewal.holder.lock().resources());
    loop {
        match renewal.next {
            Next::Round { at, .. } => {
                tokio::select! {
                    biased;
                    _ = &mut stop => return renewal.into_lock(),
                    () = tokio::time::sleep_until(at) => {}
                }
                let Some(ttl) = renewal.begin_round(Instant::now()) else {
                    continue;
                };
                let result = tokio::select! {
                    biased;
                    _ = &mut stop => return renewal.into_lock(),
                    r = tracing::Instrument::instrument(renewal.holder.lock().extend_inner(ttl, true), span.clone()) => r,
                };
                renewal.finish_round(ttl, result);
            }
            Next::Expire { at, .. } => {
                tokio::select! {
                    biased;
                    _ = &mut stop => return renewal.into_lock(),
                    () = tokio::time::sleep_until(at) => {}
                }
                renewal.expire_now();
            }
            Next::InFlight | Next::Done => return renewal.into_lock(),
        }
    }
}

/// What a guard asks of the shared renewer.
enum Msg {
    /// Keep this lock alive.
    Add(u64, Box<Renewal>),
    /// Stop and hand the lock back ([`KeepAlive::release`](crate::KeepAlive::release)).
    Stop(u64, oneshot::Sender<Lock>),
    /// The guard was dropped: stop and release the lock in the background.
    Drop(u64),
}

/// The handle to a Redlock's shared renewer task (kept in the Redlock's `renewer` slot).
#[derive(Debug, Clone)]
pub(crate) struct Renewer(mpsc::UnboundedSender<Msg>);

impl Renewer {
    /// `redlock`'s renewer, started (on the current runtime) if it has none or its runtime shut
    /// down. The renewer holds no reference to the Redlock of its own (only the locks it
    /// renews do), so it ends once the Redlock and every guard are gone.
    fn of(redlock: &Redlock) -> Renewer {
        redlock.inner.renewer.get_or_replace(
            |r: &Renewer| !r.0.is_closed(),
            || {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(run_renewer(rx));
                Renewer(tx)
            },
        )
    }
}

/// The shared renewer: runs every registered lock's cycle, extending the locks due at about the
/// same time together, and answers the guards' requests at any time, batches in flight or not.
async fn run_renewer(mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut book = Book::new();
    let mut rounds = FuturesUnordered::new();
    let mut open = true;
    let sleep = tokio::time::sleep_until(Instant::now());
    tokio::pin!(sleep);
    loop {
        for batch in book.start_due(Instant::now()) {
            rounds.push(batch.run());
        }
        if !open && rounds.is_empty() && book.idle() {
            // No guard can reach the renewer any more and nothing is scheduled.
            return;
        }
        let wake = book.next_wake();
        if let Some(at) = wake {
            sleep.as_mut().reset(at);
        }
        tokio::select! {
            biased;
            // First, so that a batch just started is polled (its commands handed to fred) before
            // a stop that arrives meanwhile hands its lock back to be released.
            Some(done) = rounds.next(), if !rounds.is_empty() => book.finish(done),
            msg = rx.recv(), if open => match msg {
                Some(msg) => {
                    book.handle(msg);
                    // Registrations come in bursts: take what is queued in one go.
                    for _ in 0..255 {
                        match rx.try_recv() {
                            Ok(msg) => book.handle(msg),
                            Err(_) => break,
                        }
                    }
                }
                None => open = false,
            },
            () = &mut sleep, if wake.is_some() => {}
        }
    }
}

/// The shared renewer's locks and their schedule.
struct Book {
    locks: HashMap<u64, Box<Renewal>>,
    /// `(when, id)` of every lock waiting for a step (not in flight, not done).
    schedule: BTreeSet<(Instant, u64)>,
    /// Where the batch grid is counted from.
    epoch: Instant,
}

impl Book {
    fn new() -> Book {
        Book {
            locks: HashMap::new(),
            schedule: BTreeSet::new(),
            epoch: Instant::now(),
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Add(id, mut renewal) => {
                self.file(id, &mut renewal);
                self.locks.insert(id, renewal);
            }
            Msg::Stop(id, reply) => {
                if let Some(renewal) = self.remove(id) {
                    // If nobody waits any more, the lock comes back here and is dropped, which
                    // releases it in the background.
                    let _ = reply.send(renewal.into_lock());
                }
            }
            Msg::Drop(id) => {
                if let Some(renewal) = self.remove(id) {
                    drop(renewal.into_lock());
                }
            }
        }
    }

    /// Files `renewal`'s next step in the schedule.
    fn file(&mut self, id: u64, renewal: &mut Renewal) {
        file_in(&mut self.schedule, id, renewal, self.epoch);
    }

    fn remove(&mut self, id: u64) -> Option<Box<Renewal>> {
        let renewal = self.locks.remove(&id)?;
        if let Some(at) = renewal.filed {
            self.schedule.remove(&(at, id));
        }
        Some(renewal)
    }

    fn next_wake(&self) -> Option<Instant> {
        self.schedule.first().map(|(at, _)| *at)
    }

    /// Nothing scheduled and nothing in flight.
    fn idle(&self) -> bool {
        self.schedule.is_empty()
            && self
                .locks
                .values()
                .all(|r| !matches!(r.next, Next::InFlight))
    }

    /// Runs every step that is due at `now`: expiries, and the rounds, grouped into batches of
    /// at most [`MAX_BATCH_KEYS`] keys.
    fn start_due(&mut self, now: Instant) -> Vec<Batch> {
        let mut due = Vec::new();
        while self.schedule.first().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, id)) = self.schedule.pop_first() {
                due.push(id);
            }
        }
        let mut requests = Vec::new();
        for id in due {
            let Some(renewal) = self.locks.get_mut(&id) else {
                continue;
            };
            renewal.filed = None;
            if let Next::Expire { .. } = renewal.next {
                renewal.expire_now();
                continue;
            }
            match renewal.begin_round(now) {
                Some(ttl) => {
                    let lock = renewal.holder.lock();
                    let deadline = lock.before_extend(ttl, now);
                    requests.push((
                        id,
                        lock.redlock().clone(),
                        ExtendRequest {
                            held: lock.held().clone(),
                            ttl,
                            deadline,
                        },
                    ));
                }
                None => file_in(&mut self.schedule, id, renewal, self.epoch),
            }
        }
        batches(requests)
    }

    /// A batch's outcome: each lock still here goes on with its cycle.
    fn finish(&mut self, done: Vec<(u64, Duration, Result<Instant>)>) {
        for (id, ttl, result) in done {
            let Some(renewal) = self.locks.get_mut(&id) else {
                continue; // handed back while the batch was in flight
            };
            if matches!(renewal.next, Next::InFlight) {
                let result = result.map(|deadline| renewal.holder.lock().extended(deadline, ttl));
                renewal.finish_round(ttl, result);
                file_in(&mut self.schedule, id, renewal, self.epoch);
            }
        }
    }
}

/// Files `renewal`'s next step (if it waits for one) in `schedule`, and remembers where.
fn file_in(
    schedule: &mut BTreeSet<(Instant, u64)>,
    id: u64,
    renewal: &mut Renewal,
    epoch: Instant,
) {
    renewal.filed = renewal.due(epoch);
    if let Some(at) = renewal.filed {
        schedule.insert((at, id));
    }
}

/// Requests of one Redlock sent together.
struct Batch {
    redlock: Redlock,
    ids: Vec<u64>,
    requests: Vec<ExtendRequest>,
}

impl Batch {
    /// One batched round; each lock's result with the TTL it asked for.
    async fn run(self) -> Vec<(u64, Duration, Result<Instant>)> {
        let results = self.redlock.inner.extend_many(&self.requests).await;
        self.ids
            .into_iter()
            .zip(self.requests.iter().map(|r| r.ttl))
            .zip(results)
            .map(|((id, ttl), result)| (id, ttl, result))
            .collect()
    }
}

/// Splits requests into batches of at most [`MAX_BATCH_KEYS`] keys (a lock with more keys is a
/// batch of its own), in order.
fn batches(requests: Vec<(u64, Redlock, ExtendRequest)>) -> Vec<Batch> {
    let mut out: Vec<Batch> = Vec::new();
    let mut keys = 0;
    for (id, redlock, request) in requests {
        let n = request.held.keys.len();
        match out.last_mut() {
            Some(batch) if keys + n <= MAX_BATCH_KEYS => {
                keys += n;
                batch.ids.push(id);
                batch.requests.push(request);
            }
            _ => {
                keys = n;
                out.push(Batch {
                    redlock,
                    ids: vec![id],
                    requests: vec![request],
                });
            }
        }
    }
    out
}
