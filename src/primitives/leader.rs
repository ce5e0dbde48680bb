//! Who leads an election, read from any process: the election record every node keeps beside
//! the lock key (term number, campaign value, priority), the rounds that write it (a leader's
//! claim and proclaim, a preferred candidate's request to yield, a resign's notice) and the one
//! round that reads it ([`Redlock::leader_of`]).
//!
//! A record counts on a node only while the lock key there holds the record's lock value, so a
//! leader that is gone (released, expired, taken over) is never named, whatever its record
//! still says. A leader is named only when a quorum of nodes agree on the same term.
//!
//! Owns: the record's rounds and their decoding, [`Leader`]. Must not: campaign (the election
//! does) or keep connections of its own (the observer does).

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::Value;
use tokio::time::Instant;

use crate::base::error::{
    Error, InvalidInput, Names, NodeError, NodeErrorKind, Result, Vote, Votes,
};
use crate::base::scripts::Script;
use crate::rounds::quorum::{fan_out, Late};
use crate::rounds::redlock::Redlock;

/// Who leads an election, as a quorum of nodes says ([`Redlock::leader_of`],
/// [`Observer`](crate::Observer)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's campaign value ([`ElectOptions::value`](crate::ElectOptions::value), or what
    /// it last proclaimed): for example the address followers forward requests to.
    pub value: String,
    /// The term number: the term's fencing token, strictly larger than every earlier term's of
    /// this election (it counts the transitions). Give it with every write a leader makes, so
    /// that a deposed leader's late write can be told apart and refused.
    pub term: u64,
    /// The owner label stored with the leader's lock, if any (public, as
    /// [`Redlock::inspect`] shows it).
    pub label: Option<String>,
    /// When a quorum of nodes will have let the term's keys expire unless the leader extends
    /// them (on this process's monotonic clock, measured from before the read).
    pub valid_until: Instant,
}

impl Leader {
    /// Time left before [`valid_until`](Self::valid_until); zero once passed.
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// Same leader, term and value (the validity estimate aside).
    pub(crate) fn same(a: &Option<Leader>, b: &Option<Leader>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.term == b.term && a.value == b.value && a.label == b.label,
            _ => false,
        }
    }
}

/// One node's view of an election (the `ELECT_VIEW` script's reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeView {
    /// The lock key holds the record's term here.
    pub(crate) live: bool,
    pub(crate) term: u64,
    pub(crate) value: String,
    pub(crate) priority: u32,
    pub(crate) version: u64,
    pub(crate) pttl: i64,
    pub(crate) label: String,
    /// A pending request to yield: `(term, priority, pttl)`.
    pub(crate) yield_to: Option<(u64, u32, i64)>,
}

/// What one read of every node found.
#[derive(Debug, Clone, Default)]
pub(crate) struct ElectionState {
    pub(crate) leader: Option<Leader>,
    /// The leader's priority (0 without a leader).
    pub(crate) priority: u32,
    /// The term and version of the leader's value (`(0, 0)` without a leader).
    pub(crate) version: (u64, u64),
    /// The strongest pending request to yield any node reports: `(term, priority, until)`.
    pub(crate) yield_to: Option<(u64, u32, Instant)>,
    /// When to read again even if nothing is published: when the leader's keys expire at a
    /// quorum unless extended (`None` without a leader).
    pub(crate) recheck_at: Option<Instant>,
    /// Since when this reader has seen no leader (`None` while there is one).
    pub(crate) vacant_since: Option<Instant>,
}

impl ElectionState {
    /// Whether no request to yield stands and the leader (if any) has `priority` too.
    pub(crate) fn same_priority(&self, priority: u32) -> bool {
        self.yield_to.is_none() && (self.leader.is_none() || self.priority == priority)
    }
}

fn unexpected(node: &str, wanted: &str) -> NodeError {
    NodeError {
        node: node.to_string(),
        kind: NodeErrorKind::UnexpectedReply,
        message: format!("expected {wanted}"),
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(n) => Some(*n),
        _ => None,
    }
}

/// Decodes one node's `ELECT_VIEW` reply; anything else is an `UnexpectedReply` error.
pub(crate) fn decode_view(
    node: &str,
    reply: Result<Value, NodeError>,
) -> Result<NodeView, NodeError> {
    let wanted =
        "the election view [live, term, value, priority, version, pttl, label, yield, yield_pttl]";
    let Value::Array(parts) = reply? else {
        return Err(unexpected(node, wanted));
    };
    let [live, term, value, priority, version, pttl, label, yield_raw, yield_pttl] =
        parts.as_slice()
    else {
        return Err(unexpected(node, wanted));
    };
    let num = |v: &Value| int(v).ok_or_else(|| unexpected(node, wanted));
    let text = |v: &Value| {
        v.as_str()
            .map(|s| s.into_owned())
            .ok_or_else(|| unexpected(node, wanted))
    };
    let yield_text = text(yield_raw)?;
    let yield_to = if yield_text.is_empty() {
        None
    } else {
        let (t, p) = yield_text
            .split_once(':')
            .ok_or_else(|| unexpected(node, "a yield request 'term:priority'"))?;
        let t = t.parse().map_err(|_| unexpected(node, "a yield term"))?;
        let p = p
            .parse()
            .map_err(|_| unexpected(node, "a yield priority"))?;
        Some((t, p, num(yield_pttl)?))
    };
    Ok(NodeView {
        live: num(live)? == 1,
        term: u64::try_from(num(term)?).map_err(|_| unexpected(node, "a term >= 0"))?,
        value: text(value)?,
        priority: u32::try_from(num(priority)?).map_err(|_| unexpected(node, "a priority"))?,
        version: u64::try_from(num(version)?).unwrap_or(0),
        pttl: num(pttl)?,
        label: text(label)?,
        yield_to,
    })
}

/// One node's view and when it was true: the server read it at some instant between `from`
/// and `to` (a read's start and end; a message's arrival for both: see `decode_announced`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamped {
    pub(crate) view: NodeView,
    pub(crate) from: Instant,
    pub(crate) to: Instant,
}

impl Stamped {
    /// The earliest instant this node's lock key may expire (unless extended since).
    pub(crate) fn expires_from(&self) -> Instant {
        let pttl = Duration::from_millis(u64::try_from(self.view.pttl.max(0)).unwrap_or(0));
        self.from.checked_add(pttl).unwrap_or(self.from)
    }
}

/// The election state that `views` (one per node, `None` unknown) show: a leader when `quorum`
/// nodes hold the same live term.
pub(crate) fn tally(views: &[Option<Stamped>], quorum: usize) -> ElectionState {
    let ms = |pttl: i64| Duration::from_millis(u64::try_from(pttl.max(0)).unwrap_or(0));
    let at = |t: Instant, pttl: i64| t.checked_add(ms(pttl)).unwrap_or(t);
    let live: Vec<&Stamped> = views.iter().flatten().filter(|v| v.view.live).collect();
    let mut state = ElectionState::default();
    for s in views.iter().flatten() {
        if let Some((t, p, pttl)) = s.view.yield_to {
            let until = at(s.to, pttl);
            if state.yield_to.is_none_or(|(_, q, _)| p > q) {
                state.yield_to = Some((t, p, until));
            }
        }
    }
    let Some(best) = live
        .iter()
        .map(|s| s.view.term)
        .filter(|t| live.iter().filter(|s| s.view.term == *t).count() >= quorum)
        .max()
    else {
        return state;
    };
    let same: Vec<&&Stamped> = live.iter().filter(|s| s.view.term == best).collect();
    // The quorum-th latest expiry: until then a quorum still holds the term (the earliest
    // each may be, for the validity; the latest, for when to look again).
    let quorum_th = |mut ends: Vec<Instant>| {
        ends.sort_unstable_by(|a, b| b.cmp(a));
        ends.get(quorum.saturating_sub(1)).copied()
    };
    let (Some(valid_until), Some(recheck)) = (
        quorum_th(same.iter().map(|s| at(s.from, s.view.pttl)).collect()),
        quorum_th(same.iter().map(|s| at(s.to, s.view.pttl)).collect()),
    ) else {
        return state;
    };
    // The newest value of the term (a proclaim may have reached only some nodes yet).
    let Some(newest) = same.iter().map(|s| &s.view).max_by_key(|v| v.version) else {
        return state;
    };
    state.priority = newest.priority;
    state.version = (best, newest.version);
    state.recheck_at = recheck.checked_add(Duration::from_millis(1));
    state.leader = Some(Leader {
        value: newest.value.clone(),
        term: best,
        label: (!newest.label.is_empty()).then(|| newest.label.clone()),
        valid_until,
    });
    state
}

/// Decodes a view a node announced (`announce` in the election scripts: `view1:<live>:<term>:
/// <priority>:<version>:<pttl>:<yield_pttl>:<value bytes>:<label bytes>:` then the value, the
/// label and the yield request); `None` for any other message (an older version's
/// `term:version`, `yield`, `ended`) or a malformed one.
pub(crate) fn decode_announced(message: &str) -> Option<NodeView> {
    let rest = message.strip_prefix("view1:")?;
    let mut fields = rest.splitn(9, ':');
    let mut num = || fields.next()?.parse::<i64>().ok();
    let (live, term, priority, version, pttl, yield_pttl, value_len, label_len) = (
        num()?,
        num()?,
        num()?,
        num()?,
        num()?,
        num()?,
        num()?,
        num()?,
    );
    let tail = fields.next()?;
    let value_len = usize::try_from(value_len).ok()?;
    let label_end = value_len.checked_add(usize::try_from(label_len).ok()?)?;
    let value = tail.get(..value_len)?;
    let label = tail.get(value_len..label_end)?;
    let yield_text = tail.get(label_end..)?;
    let yield_to = match yield_text {
        "" => None,
        y => {
            let (t, p) = y.split_once(':')?;
            Some((t.parse().ok()?, p.parse().ok()?, yield_pttl))
        }
    };
    Some(NodeView {
        live: live == 1,
        term: u64::try_from(term).ok()?,
        value: value.to_string(),
        priority: u32::try_from(priority).ok()?,
        version: u64::try_from(version).unwrap_or(0),
        pttl,
        label: label.to_string(),
        yield_to,
    })
}

/// What a leader writes into the record (see `scripts::ELECT_CLAIM`).
pub(crate) struct Record<'a> {
    /// The term's lock value: written only where the lock key still holds it.
    pub(crate) lock_value: &'a str,
    pub(crate) term: u64,
    pub(crate) value: &'a str,
    pub(crate) priority: u32,
    /// 1 for the claim, one more per proclaim.
    pub(crate) version: u64,
    /// What is left of the term's lock, in ms, no more than the keys' TTL on any node (its
    /// validity: the claim follows the acquire): announced as the view's TTL instead of a
    /// `PTTL` per node. `None`: the script reads it.
    pub(crate) pttl_ms: Option<u64>,
}

/// How a write to the record went.
#[derive(Debug)]
pub(crate) enum Written {
    /// A quorum wrote it.
    Done,
    /// A quorum no longer holds our lock value, or a later term exists: we do not lead.
    NotLeader,
    /// Too few nodes answered.
    Unavailable(Votes),
}

impl Redlock {
    /// Who leads the election `resource` right now, as a quorum of nodes says: `Some` when a
    /// quorum of nodes hold the same term and its lock, `None` when no valid term exists (no
    /// leader, a handover in progress, or no quorum agrees). One read per node, sent at once,
    /// each bounded by the per-node timeout (default 500 ms here); never changes anything.
    ///
    /// Errors: [`Error::Unavailable`] when fewer than a quorum of nodes answered (then nobody
    /// can tell); [`InvalidInput`] for an empty, reserved or too long name.
    ///
    /// Cancellation: safe at any point (read-only).
    pub async fn leader_of(&self, resource: &str) -> Result<Option<Leader>> {
        Ok(self.election_state(resource).await?.leader)
    }

    /// Reads the election's state on every node (see [`leader_of`](Self::leader_of)).
    pub(crate) async fn election_state(&self, resource: &str) -> Result<ElectionState> {
        let views = self.election_views(resource).await?;
        Ok(tally(&views, self.inner.quorum))
    }

    /// Each node's view of the election `resource` (`None`: no answer), stamped with the read's
    /// start and end; an error when fewer than a quorum answered.
    pub(crate) async fn election_views(&self, resource: &str) -> Result<Vec<Option<Stamped>>> {
        self.check_election_name(resource)?;
        let keys = self.election_keys(resource);
        let timeout = self.read_timeout();
        let started = Instant::now();
        let answers = self
            .record_round(
                &crate::base::scripts::Scripts::get().elect_view,
                keys,
                Vec::new(),
                timeout,
            )
            .await;
        let ended = Instant::now();
        let mut votes = Vec::with_capacity(answers.len());
        let views: Vec<Option<NodeView>> = answers
            .into_iter()
            .zip(&self.inner.nodes)
            .map(|(a, node)| match a.map(|r| decode_view(&node.name, r)) {
                Some(Ok(v)) => {
                    votes.push(Vote::Granted);
                    Some(v)
                }
                Some(Err(e)) => {
                    votes.push(Vote::Failed(e));
                    None
                }
                None => {
                    votes.push(Vote::Pending);
                    None
                }
            })
            .collect();
        let reachable = views.iter().flatten().count();
        if reachable < self.inner.quorum {
            return Err(Error::Unavailable {
                round: crate::base::error::Round::Acquire,
                resources: Names(vec![resource.to_string()]),
                attempts: 1,
                nodes: self.inner.nodes.len(),
                quorum: self.inner.quorum,
                reachable,
                votes: Votes(votes),
            });
        }
        let stamp = |view| Stamped {
            view,
            from: started,
            to: ended,
        };
        Ok(views.into_iter().map(|v| v.map(stamp)).collect())
    }

    pub(crate) fn check_election_name(&self, resource: &str) -> Result<(), InvalidInput> {
        crate::base::slots::check_name(resource)?;
        self.check_slots(&[
            self.key(resource),
            self.election_key(resource),
            self.yield_key(resource),
        ])
    }

    fn read_timeout(&self) -> Duration {
        self.inner
            .node_timeout
            .unwrap_or(Duration::from_millis(500))
    }

    /// `script` over `keys` with `argv` on every node, waiting for each (each bounded by
    /// `timeout`).
    async fn record_round(
        &self,
        script: &'static Script,
        keys: Arc<Vec<String>>,
        argv: Vec<Value>,
        timeout: Duration,
    ) -> Vec<Option<Result<Value, NodeError>>> {
        self.record_round_with(script, keys, argv, timeout, false, |_| true)
            .await
    }

    /// [`record_round`](Self::record_round); `confirmed`: each node's reply counts once its
    /// replicas have the write (with confirmation on; for a claim that raises the counter).
    async fn record_round_with(
        &self,
        script: &'static Script,
        keys: Arc<Vec<String>>,
        argv: Vec<Value>,
        timeout: Duration,
        confirmed: bool,
        only: impl Fn(usize) -> bool,
    ) -> Vec<Option<Result<Value, NodeError>>> {
        let argv = Arc::new(argv);
        let nodes = self.inner.nodes.iter().enumerate();
        let calls = nodes.filter(|(i, _)| only(*i)).map(|(i, n)| {
            let (n, keys, argv) = (n.clone(), keys.clone(), argv.clone());
            let call = async move {
                match confirmed {
                    true => n.run_script_confirmed(script, keys, argv, timeout).await,
                    false => n.run_script(script, keys, argv, timeout).await,
                }
            };
            (i, call)
        });
        fan_out(self.inner.nodes.len(), calls, None, Late::Drop, |_| false).await
    }

    /// Writes the record of a term this process leads: its number, value and priority, where
    /// the lock key still holds `lock_value`; published on every node written. The claim
    /// (version 1) first raises the lock's fencing counter to the term on every node it
    /// reaches (the campaign's acquire handed the term out unraised): `Done` means a quorum has
    /// it, so any later term's acquire reads it and goes higher.
    pub(crate) async fn write_record(
        &self,
        resource: &str,
        r: Record<'_>,
        ttl: Duration,
    ) -> Written {
        let claim = r.version == 1;
        let mut keys = self.election_keys(resource);
        if claim {
            Arc::make_mut(&mut keys).push(self.fence_key(resource));
        }
        let mut argv = vec![
            Value::from(r.lock_value),
            Value::from(r.term.to_string()),
            Value::from(r.value),
            Value::Integer(i64::from(r.priority)),
            Value::from(r.version.to_string()),
        ];
        if let Some(ms) = r.pttl_ms {
            argv.push(Value::Integer(i64::try_from(ms).unwrap_or(i64::MAX)));
        }
        let timeout = self.inner.node_timeout(ttl);
        let answers = self
            .record_round_with(
                &crate::base::scripts::Scripts::get().elect_claim,
                keys,
                argv,
                timeout,
                claim,
                |_| true,
            )
            .await;
        let mut later = false;
        let votes: Vec<Vote> = answers
            .into_iter()
            .zip(&self.inner.nodes)
            .map(|(a, node)| match a {
                Some(Ok(Value::Integer(1))) => Vote::Granted,
                Some(Ok(Value::Integer(0))) => Vote::Refused,
                Some(Ok(Value::Integer(-1))) => {
                    later = true;
                    Vote::Refused
                }
                Some(Ok(_)) => Vote::Failed(unexpected(&node.name, "1, 0 or -1")),
                Some(Err(e)) => Vote::Failed(e),
                None => Vote::Pending,
            })
            .collect();
        let votes = Votes(votes);
        if later {
            return Written::NotLeader;
        }
        match crate::rounds::quorum::outcome(&votes.0) {
            crate::rounds::quorum::Outcome::Reached => Written::Done,
            _ if votes.refused() > self.inner.nodes.len() - self.inner.quorum => Written::NotLeader,
            _ => Written::Unavailable(votes),
        }
    }

    /// Asks the leader of `term` to yield to a candidate of `priority`; the request stands for
    /// `standing`. Best effort: the answers are not needed.
    pub(crate) async fn request_yield(
        &self,
        resource: &str,
        term: u64,
        priority: u32,
        standing: Duration,
    ) {
        let keys = self.election_keys(resource);
        let argv = vec![
            Value::from(term.to_string()),
            Value::from(priority.to_string()),
            Value::Integer(i64::try_from(standing.as_millis()).unwrap_or(i64::MAX)),
        ];
        let timeout = self.read_timeout();
        self.record_round(
            &crate::base::scripts::Scripts::get().elect_yield,
            keys,
            argv,
            timeout,
        )
        .await;
    }

    /// Announces the view of `resource` to its observers after a term's release, on the nodes
    /// whose release did not: Redis Cluster nodes (a single server's release announces in its
    /// own script: `ELECT_RESIGN`, or `ELECT_GATE_FREE` on the line's gate). Best effort.
    pub(crate) async fn notify_observers(&self, resource: &str) {
        let keys = self.election_keys(resource);
        let timeout = self.read_timeout();
        let nodes = &self.inner.nodes;
        if !nodes.iter().any(|n| n.is_cluster()) {
            return;
        }
        self.record_round_with(
            &crate::base::scripts::Scripts::get().elect_notify,
            keys,
            Vec::new(),
            timeout,
            false,
            |i| nodes[i].is_cluster(),
        )
        .await;
    }

    /// The keys of an election's scripts: its lock key, its record, its request to yield.
    fn election_keys(&self, resource: &str) -> Arc<Vec<String>> {
        Arc::new(vec![
            self.key(resource),
            self.election_key(resource),
            self.yield_key(resource),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(live: bool, term: u64, value: &str, version: u64, pttl: i64) -> Option<NodeView> {
        Some(NodeView {
            live,
            term,
            value: value.into(),
            priority: 0,
            version,
            pttl,
            label: String::new(),
            yield_to: None,
        })
    }

    /// Views read at once, at `t`.
    fn read_at(t: Instant, views: [Option<NodeView>; 3]) -> Vec<Option<Stamped>> {
        let stamp = |view| Stamped {
            view,
            from: t,
            to: t,
        };
        views.into_iter().map(|v| v.map(stamp)).collect()
    }

    #[test]
    fn a_leader_needs_a_quorum_on_one_live_term() {
        let t = Instant::now();
        let s = tally(
            &read_at(
                t,
                [view(true, 3, "a", 1, 900), view(true, 3, "a", 1, 800), None],
            ),
            2,
        );
        let l = s.leader.expect("a quorum");
        assert_eq!((l.term, l.value.as_str()), (3, "a"));
        // The quorum-th longest TTL bounds the validity.
        assert_eq!(l.valid_until, t + Duration::from_millis(800));
        let s = tally(
            &read_at(
                t,
                [
                    view(true, 3, "a", 1, 900),
                    view(false, 3, "a", 1, 800),
                    None,
                ],
            ),
            2,
        );
        assert!(s.leader.is_none());
        let s = tally(
            &read_at(
                t,
                [view(true, 3, "a", 1, 900), view(true, 4, "b", 1, 800), None],
            ),
            2,
        );
        assert!(s.leader.is_none());
        // A proclaim that reached some nodes: the newest value of the term.
        let s = tally(
            &read_at(
                t,
                [
                    view(true, 5, "old", 1, 900),
                    view(true, 5, "new", 2, 900),
                    view(true, 5, "old", 1, 900),
                ],
            ),
            2,
        );
        assert_eq!(s.leader.expect("leader").value, "new");
    }

    #[test]
    fn views_of_different_times_count_from_their_own() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let mut views = read_at(t, [view(true, 3, "a", 1, 900), None, None]);
        // Node 1's view arrived 200 ms later (a message): its TTL counts from then.
        views[1] = view(true, 3, "a", 1, 900).map(|view| Stamped {
            view,
            from: t + ms(200),
            to: t + ms(250),
        });
        let s = tally(&views, 2);
        assert_eq!(s.leader.expect("a quorum").valid_until, t + ms(900));
        assert_eq!(s.recheck_at, Some(t + ms(901)));
        views[0] = views[0].take().map(|mut s| {
            s.from += ms(300);
            s.to += ms(300);
            s
        });
        let s = tally(&views, 2);
        assert_eq!(s.leader.expect("a quorum").valid_until, t + ms(1100));
        assert_eq!(s.recheck_at, Some(t + ms(1151)));
    }

    #[test]
    fn announced_views_decode_whatever_the_value_holds() {
        let value = "host:8080/ünï:code";
        let message = format!("view1:1:7:2:3:500:300:{}:2:{value}me7:9", value.len());
        let v = decode_announced(&message).expect("a view");
        assert_eq!(
            (v.live, v.term, v.priority, v.version, v.pttl),
            (true, 7, 2, 3, 500)
        );
        assert_eq!((v.value.as_str(), v.label.as_str()), (value, "me"));
        assert_eq!(v.yield_to, Some((7, 9, 300)));
        let v = decode_announced("view1:0:7:0:1:-2:-2:0:0:").expect("no leader here");
        assert_eq!((v.live, v.value.as_str(), v.yield_to), (false, "", None));
        for bad in [
            "7:1",
            "yield",
            "ended",
            "view1:1:7:2:3:500:300:99:2:short",
            "view1:1:7:2:3:500:300:1:0:ü",
            "view1:1:-7:2:3:500:300:0:0:",
            "view1:1:7:2:3:500:300:0:0:garbage",
            "view1:1:7",
        ] {
            assert_eq!(decode_announced(bad), None, "{bad}");
        }
    }

    #[test]
    fn replies_of_the_wrong_shape_are_errors() {
        let ok = Value::Array(vec![
            Value::Integer(1),
            Value::Integer(7),
            Value::from("addr"),
            Value::Integer(2),
            Value::Integer(1),
            Value::Integer(500),
            Value::from("me"),
            Value::from("7:9"),
            Value::Integer(300),
        ]);
        let v = decode_view("n", Ok(ok)).expect("view");
        assert_eq!((v.term, v.priority, v.yield_to), (7, 2, Some((7, 9, 300))));
        for bad in [
            Value::Integer(1),
            Value::Array(vec![Value::Integer(1)]),
            Value::Array(vec![Value::from("x"); 9]),
        ] {
            let e = decode_view("n", Ok(bad)).expect_err("bad");
            assert_eq!(e.kind, NodeErrorKind::UnexpectedReply);
        }
    }
}
