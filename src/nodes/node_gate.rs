//! A node's side of a lock's wait line (see `base::line`): whether this node is the gate that
//! keeps a lock's line, the gate's acquire and release scripts (which queue a waiter and wake
//! the line's head), and leaving a line.
//!
//! Owns: the arguments of the line scripts (`GATE_ACQUIRE`, `GATE_RELEASE`, `LINE_LEAVE`, the
//! hand-over's `PASS` and `GATE_PASS`, and the line's part of a semaphore gate's script).
//! Must not: decode a reply by hand (reply), decide who waits or is woken (the line and the
//! acquire loop), or choose a lock's path on a node (node_lock).

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::Value;

use crate::base::error::{NodeError, NodeErrorKind, Vote};
use crate::base::reply::{self, Acquired, Passed, PlainTurn};
use crate::nodes::batch::{Held, LineRef, Place};
use crate::nodes::caps::Cached;
use crate::nodes::node::{Backend, Node};

/// The gate scripts' arguments after a semaphore's own: member, lease, channel prefix.
pub(super) fn line_argv(line: &LineRef) -> [Value; 3] {
    [
        Value::from(line.member.as_deref().unwrap_or("")),
        Value::Integer(crate::base::line::LEASE.as_millis() as i64),
        Value::from(line.local.prefix()),
    ]
}

/// `GATE_FREE`'s arguments: the value, the channel prefix, a short id of this release, `mode`.
fn gate_free_argv(held: &Held, line: &LineRef, mode: &str) -> [Value; 4] {
    [
        Value::from(held.value.as_str()),
        Value::from(line.local.prefix()),
        Value::from(format!("{:08x}", rand::random::<u32>())),
        Value::from(mode),
    ]
}

/// What a woken head's turn without a script leaves to do (see `Node::turn_plain`).
enum Turned {
    /// The gate's answer.
    Answer(Acquired),
    /// Undone (the key held, or another member popped): the line's script looks.
    Look,
    /// Not tried here: the line's script takes the turn.
    Script,
}

impl Node {
    /// `line` when this node is its gate (and may keep lines).
    pub(super) fn gated<'a>(&self, line: &'a Option<LineRef>) -> Option<&'a LineRef> {
        line.as_ref()
            .filter(|l| l.gate == self.state.index)
            .filter(|_| !self.no_line.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// One key through its gate's wait line (`scripts::GATE_ACQUIRE`).
    pub(super) async fn acquire_gated(
        &self,
        held: &Held,
        line: &LineRef,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Acquired {
        let scripts = crate::base::scripts::Scripts::get();
        let Some(key) = held.keys.first() else {
            return Acquired::plain(Vote::Failed(self.unexpected("key")));
        };
        let mut keys = vec![key.as_str(), line.key.as_str()];
        if let Some(fence) = held.fence_keys.first() {
            keys.push(fence);
        }
        let member = line.member.as_deref().unwrap_or("");
        let mut place = line.place;
        if matches!(place, Place::Turn) && held.fence_keys.is_empty() && !member.is_empty() {
            match self
                .turn_plain(held, key, line, member, ttl_ms, timeout)
                .await
            {
                Turned::Answer(answer) => return answer,
                Turned::Look => place = Place::Look,
                Turned::Script => {}
            }
        }
        let rank = if line.rank { "rank" } else { "" };
        let argv = [
            Value::from(held.value.as_str()),
            Value::Integer(ttl_ms as i64),
            Value::from(member),
            Value::Integer(crate::base::line::LEASE.as_millis() as i64),
            Value::from(rank),
            Value::from(place.arg()),
        ];
        let reply = self
            .script_on(&scripts.gate_acquire, &keys, &argv, timeout)
            .await;
        reply::gate_acquired(&self.name, reply, !held.fence_keys.is_empty(), line.rank)
    }

    /// The woken head's turn without a script, on a single server and for a lock without
    /// fencing: the line's `ZPOPMIN` and the key's `SET NX PX`, handed to the connection
    /// together (2 commands where `GATE_ACQUIRE`'s turn runs 3 with its `EVALSHA`: one command
    /// fewer per hand-over). Not atomic: in the usual case the head pops itself and sets the
    /// free key, as the script does; otherwise this restores what the script would have left.
    /// The head that finds the key held goes back to its own place (its score); one that popped
    /// another member puts it back and gives back a key it set out of turn; either then lets the
    /// script look ([`Turned::Look`]), as the script's own turn does after such a pop. A user
    /// without `+zpopmin` (a NOPERM) gets the script's turn at once and from then on; any other
    /// error is a failed vote, cleaned up as any (its clean-up puts a head whose lease lives
    /// back at the front).
    async fn turn_plain(
        &self,
        held: &Held,
        key: &str,
        line: &LineRef,
        member: &str,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Turned {
        use std::sync::atomic::Ordering::Relaxed;
        if self.is_cluster() || self.no_plain_turn.load(Relaxed) {
            return Turned::Script;
        }
        let set_args = vec![
            Value::from(key),
            Value::from(held.value.as_str()),
            Value::from("NX"),
            Value::from("PX"),
            Value::Integer(i64::try_from(ttl_ms).unwrap_or(i64::MAX)),
        ];
        let (popped, set) = futures::join!(
            self.call("ZPOPMIN", 0, vec![Value::from(line.key.as_str())], timeout),
            self.call("SET", 0, set_args, timeout),
        );
        let found = match (popped, set) {
            // No `+zpopmin` (a rule older than the pop): the key back if the SET landed, and the
            // script's turn (which looks instead of popping) now and from now on. Not a failed
            // vote: a refusal counts as "scripts denied" and would end the node's lines.
            (Err(e), set) if e.kind == NodeErrorKind::Permission => {
                tracing::warn!(node = %self.name, cause = %e.message, "fredlock: a waiter's turn without a script was refused; using the line's script on this node from now on");
                self.no_plain_turn.store(true, Relaxed);
                if matches!(&set, Ok(Value::String(ok)) if *ok == "OK") {
                    if let Err(e) = self.release_script(held, timeout).await {
                        return Turned::Answer(Acquired::plain(Vote::Failed(e)));
                    }
                }
                return Turned::Script;
            }
            (Ok(p), Ok(s)) => reply::plain_turn(&self.name, member, p, s),
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        let line_key = Value::from(line.key.as_str());
        let put_back = |m: &str, score: &str| {
            let args = vec![line_key.clone(), "NX".into(), score.into(), m.into()];
            self.call("ZADD", 0, args, timeout)
        };
        match found {
            Ok(PlainTurn::Granted) => Turned::Answer(Acquired {
                lined: true,
                ..Acquired::plain(Vote::Granted)
            }),
            Ok(PlainTurn::Held(score)) => {
                // Back at its own place, then the script's look: it finds the key held, renews
                // the line (which the pop may have emptied) and tells the head the key's TTL.
                match put_back(member, &score).await {
                    Ok(_) => Turned::Look,
                    Err(e) => Turned::Answer(Acquired::plain(Vote::Failed(e))),
                }
            }
            Ok(PlainTurn::NotHead { other, set }) => {
                if let Some((m, score)) = other {
                    // A put-back at the front renews the line, as the script's does: the pop
                    // deleted a line it emptied, and the ZADD alone makes one that never expires.
                    let lease = crate::base::line::LEASE.as_millis().saturating_mul(4);
                    let renew = vec![
                        line_key.clone(),
                        Value::Integer(i64::try_from(lease).unwrap_or(i64::MAX)),
                    ];
                    // Boxed: a rare path, kept out of every acquire's future (see `future_size`).
                    let (back, renewed) = Box::pin(async {
                        futures::join!(
                            put_back(&m, &score),
                            self.call("PEXPIRE", 0, renew, timeout)
                        )
                    })
                    .await;
                    if let Err(e) = back.and(renewed) {
                        return Turned::Answer(Acquired::plain(Vote::Failed(e)));
                    }
                }
                if set {
                    if let Err(e) = self.release_script(held, timeout).await {
                        return Turned::Answer(Acquired::plain(Vote::Failed(e)));
                    }
                }
                Turned::Look
            }
            Err(e) => Turned::Answer(Acquired::plain(Vote::Failed(e))),
        }
    }

    /// The release on a gate: a holder's release or a clean-up by `scripts::GATE_FREE` (by
    /// EVALSHA: the compare-and-delete, and a hand-over to the line's head only while the key
    /// has a line); a waiter's failed attempt by `scripts::GATE_RELEASE`, which puts it back at
    /// the front of the line.
    pub(super) async fn gate_release(
        &self,
        held: &Arc<Held>,
        line: &LineRef,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        let scripts = crate::base::scripts::Scripts::get();
        let wake = line.wake.load(std::sync::atomic::Ordering::Acquire);
        let put_back: String;
        let mode = match (&line.member, wake) {
            (_, true) => "w",
            // Back at the front only while the waiter still waits (not a late retry after it
            // left the line); `+`: the gate had granted it (see `LineRef::at_gate`).
            (Some(member), false) if line.local.waits(member) => {
                match line.at_gate.load(std::sync::atomic::Ordering::Relaxed) {
                    true => put_back = format!("+{member}"),
                    false => put_back = member.to_string(),
                }
                put_back.as_str()
            }
            (_, false) => "q",
        };
        if let (true, Backend::Server(_), [key]) = (
            matches!(mode, "w" | "q"),
            &self.backend,
            held.keys.as_slice(),
        ) {
            let caps = &self.state.caps;
            // An election's term announces the election's view in its release's own script.
            let announced = self.announced(held);
            // A key with no known line: through the batcher, like any release (see
            // `gate_free_batched`): the line's own script is never sent for it.
            let lined = held.custom || line.local.is_hot(key) || announced.is_some();
            if let (Some(batch), false) = (&self.batch, lined) {
                return self
                    .gate_free_batched(batch, held, line, mode == "w", timeout)
                    .await;
            }
            // A holder's release or a clean-up on a key with a line: by EVALSHA, one read, and
            // the head woken in the same call.
            let flag = format!("{}!", line.key);
            let mut keys = vec![key.as_str(), flag.as_str(), line.key.as_str()];
            let (script, cached) = match announced {
                Some([_, record, _]) => {
                    keys.push(record);
                    (&scripts.elect_gate_free, Cached::ElectGateFree)
                }
                None => (&scripts.gate_free, Cached::GateFree),
            };
            let argv = gate_free_argv(held, line, mode);
            if caps.is_cached(cached) {
                return self.script_on(script, &keys, &argv, timeout).await;
            }
            // Whole until the server is known to have it: a NOSCRIPT resend would land after
            // whatever this Redlock sent the node meanwhile (a read would see the key held).
            let mut args = Vec::with_capacity(keys.len() + argv.len() + 2);
            args.push(Value::from(script.body));
            args.push(Value::Integer(keys.len() as i64));
            args.extend(keys.iter().map(|k| Value::from(*k)));
            args.extend(argv);
            let reply = self.call("EVAL", 2, args, timeout).await;
            let reply = crate::nodes::native::scripted(&self.state, reply);
            if reply.is_ok() {
                caps.set_cached(cached, true);
            }
            return reply;
        }
        let mut args = Vec::with_capacity(held.keys.len() + 8);
        args.push(Value::from(scripts.gate_release.body));
        args.push(Value::Integer(held.keys.len() as i64 + 1));
        args.extend(held.keys.iter().map(|k| Value::from(k.as_str())));
        args.push(Value::from(line.key.as_str()));
        args.push(Value::from(held.value.as_str()));
        args.push(Value::from(mode));
        args.push(Value::Integer(crate::base::line::LEASE.as_millis() as i64));
        args.push(Value::from(line.local.prefix()));
        args.push(Value::from(format!("{:08x}", rand::random::<u32>())));
        if let Some(e) = crate::nodes::native::scripts_refused(&self.state) {
            return Err(e);
        }
        match &self.backend {
            Backend::Server(_) => {
                let reply = self.call("EVAL", 2, args, timeout).await;
                crate::nodes::native::scripted(&self.state, reply)
            }
            Backend::Cluster(shards) => {
                let Some(first) = held.keys.first() else {
                    return Ok(Value::Array(vec![Value::Integer(0), Value::from("")]));
                };
                Box::pin(shards.call("EVAL", first, args, timeout, Some(&held.value))).await
            }
        }
    }

    /// A release on the gate through the batcher (`Batch::gate_free`): alone or in a batch,
    /// only the release and a read of the line's flag (`GATE_FLAG`, or the batch's `f`
    /// operation), never the line's library; when the flag is set and the key free (a line has
    /// members this process did not know of), the head is woken by `GATE_FREE` in `w` mode
    /// (the key now free, it only wakes), one more call on the rare path. Reply: `{deleted,
    /// woken member or ''}`.
    async fn gate_free_batched(
        &self,
        batch: &crate::nodes::batcher::Batch,
        held: &Arc<Held>,
        line: &LineRef,
        wake: bool,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        let code = match batch.gate_free(held, timeout).await {
            Ok(Value::Integer(code @ 0..=3)) => code,
            // A reply of another shape, as for the batch's other answers.
            Ok(other) => {
                return Err(NodeError {
                    node: self.name.clone(),
                    kind: crate::base::error::NodeErrorKind::UnexpectedReply,
                    message: format!("the release on the gate answered {other:?}, not 0 to 3"),
                })
            }
            Err(e) => return Err(e),
        };
        let deleted = code & 1;
        let done = |woken: Value| Ok(Value::Array(vec![Value::Integer(deleted), woken]));
        // No line, or a clean-up that freed nothing (GATE_FREE's `q` wakes nobody then).
        if code < 2 || (!wake && deleted == 0) {
            return done(Value::from(""));
        }
        let key = held.keys.first().map_or("", String::as_str);
        line.local.mark_hot(key);
        let flag = format!("{}!", line.key);
        let keys = [key, flag.as_str(), line.key.as_str()];
        let scripts = crate::base::scripts::Scripts::get();
        match self
            .script_on(
                &scripts.gate_free,
                &keys,
                &gate_free_argv(held, line, "w"),
                timeout,
            )
            .await
        {
            Ok(Value::Array(parts)) if parts.len() == 2 => {
                done(parts.into_iter().nth(1).unwrap_or(Value::Null))
            }
            // The release itself is done: the head finds the key free at its next look.
            other => {
                tracing::debug!(node = %self.name, reply = ?other, "fredlock: the wake-up after a batched release on the gate failed");
                done(Value::from(""))
            }
        }
    }

    /// Whether this node can take part in a hand-over inside the process (`PASS`): a single
    /// server that runs scripts.
    pub(crate) fn can_pass(&self) -> bool {
        !self.is_cluster()
            && !self.no_line.load(std::sync::atomic::Ordering::Relaxed)
            && crate::nodes::native::scripts_refused(&self.state).is_none()
    }

    /// Hands `from`'s key on this node to `to` (a waiter of this process): `GATE_PASS` on the
    /// key's gate (in line order), `PASS` elsewhere. Sent whole, in this node's command order
    /// for the key (behind `from`'s SET).
    pub(crate) async fn pass(
        self: Arc<Self>,
        from: Arc<Held>,
        to: Arc<Held>,
        ttl_ms: u64,
        timeout: Duration,
    ) -> Passed {
        // A node not identified yet, or the same server as another entry: no vote (as for an
        // acquire, nothing is sent).
        if let Err(e) = self.state.counts() {
            return reply::passed(&self.name, Err(e));
        }
        self.after_gate_call(&from, timeout).await;
        let scripts = crate::base::scripts::Scripts::get();
        let reply = match (from.keys.first(), self.gated(&from.line)) {
            (None, _) => Err(self.unexpected("a key to hand over")),
            (Some(key), Some(line)) => {
                let member = to.line.as_ref().and_then(|l| l.member.as_deref());
                let argv = [
                    Value::from(from.value.as_str()),
                    Value::from(to.value.as_str()),
                    Value::Integer(i64::try_from(ttl_ms).unwrap_or(i64::MAX)),
                    Value::from(member.unwrap_or("")),
                    Value::from(line.local.member_prefix()),
                ];
                let keys = [key.as_str(), line.key.as_str()];
                self.script_on(&scripts.gate_pass, &keys, &argv, timeout)
                    .await
            }
            (Some(key), None) => {
                let argv = [
                    Value::from(from.value.as_str()),
                    Value::from(to.value.as_str()),
                    Value::Integer(i64::try_from(ttl_ms).unwrap_or(i64::MAX)),
                ];
                self.script_on(&scripts.pass, &[key.as_str()], &argv, timeout)
                    .await
            }
        };
        let mut passed = reply::passed(
            &self.name,
            crate::nodes::native::scripted(&self.state, reply),
        );
        // The waiter's key counts once the replicas confirmed it (see `confirm`).
        passed.theirs = self.confirmed(passed.theirs, timeout).await;
        passed
    }

    /// Waits (at most `timeout`) until `held`'s own call on this node as its gate is over, if
    /// one still runs (see `GateCall`), so that what ends the lock here lands after it.
    pub(super) async fn after_gate_call(&self, held: &Held, timeout: Duration) {
        let line = held.line.as_ref().filter(|l| l.gate == self.state.index);
        if let Some(line) = line.filter(|l| l.call.is_running()) {
            // Boxed: a rare path, kept out of every release's future (see `future_size`).
            Box::pin(line.call.settled(timeout)).await;
        }
    }

    /// Renews a waiter's place in a line without looking at the line (a waiter far from its
    /// head: see the acquire loop): `SET <line>|<member> 1 PX <lease> XX`, one command.
    /// `Ok(false)`: the place's lease was gone (it expired, or the line with it), and the waiter
    /// must look at the gate to join again.
    pub(crate) async fn renew_place(
        &self,
        line_key: &str,
        member: &str,
        timeout: Duration,
    ) -> Result<bool, NodeError> {
        let lease = crate::base::line::LEASE.as_millis() as i64;
        let args = vec![
            Value::from(format!("{line_key}|{member}")),
            Value::from("1"),
            Value::from("PX"),
            Value::Integer(lease),
            Value::from("XX"),
        ];
        match self.call("SET", 0, args, timeout).await? {
            Value::Null => Ok(false),
            Value::String(s) if s == "OK" => Ok(true),
            _ => Err(self.unexpected("OK or nil")),
        }
    }

    /// Deletes the leases `keys` of members that were granted (one `DEL`): only the rejoin of
    /// a grant refused elsewhere reads them, and none is left once the Redlock closes.
    pub(crate) async fn drop_leases(
        &self,
        keys: Vec<String>,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        let args = keys.into_iter().map(Value::from).collect();
        match self.call("DEL", 0, args, timeout).await? {
            Value::Integer(_) => Ok(()),
            _ => Err(self.unexpected("an integer")),
        }
    }

    /// A waiter's place in `line` (0 = the head), or `None` when it is not in it: `ZRANK`.
    pub(crate) async fn place_rank(
        &self,
        line: &str,
        member: &str,
        timeout: Duration,
    ) -> Result<Option<i64>, NodeError> {
        let args = vec![Value::from(line), Value::from(member)];
        match self.call("ZRANK", 0, args, timeout).await? {
            Value::Integer(rank) => Ok(Some(rank)),
            Value::Null => Ok(None),
            _ => Err(self.unexpected("an integer or nil")),
        }
    }

    /// Leaves `line` (a waiter that gave up), or with no member pokes it (a broken lock): the
    /// next head is woken, for its turn when a key is free, otherwise to look at the gate (see
    /// `scripts::LINE_LEAVE`). Returns the member woken for its turn.
    pub(crate) async fn leave_line(
        self: Arc<Self>,
        keys: Arc<Vec<String>>,
        line: Arc<(String, String, String)>,
        timeout: Duration,
    ) -> Result<Option<String>, NodeError> {
        let scripts = crate::base::scripts::Scripts::get();
        let (line_key, member, prefix) = &*line;
        let all: Vec<&str> = keys
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(line_key.as_str()))
            .collect();
        let argv = [Value::from(member.as_str()), Value::from(prefix.as_str())];
        match self
            .script_on(&scripts.line_leave, &all, &argv, timeout)
            .await?
        {
            Value::String(s) if s.is_empty() => Ok(None),
            Value::String(s) => Ok(Some(s.to_string())),
            Value::Bytes(b) if b.is_empty() => Ok(None),
            Value::Bytes(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
            _ => Err(self.unexpected("woken member")),
        }
    }
}
