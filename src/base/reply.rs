//! What Redis answers look like: the decoding of every command's and script's reply into a
//! [`Vote`], a [`Slot`], fencing counters or a key's holder, and anything else into a typed
//! [`NodeError`] (`UnexpectedReply`, never a grant).
//!
//! Owns: the reply shape of each command and script (see `scripts` for the scripts' contracts),
//! and the per-node answer types [`Acquired`] and [`Slot`]. Must not: send a command, know how
//! fred is configured (that is `node`), or count votes across nodes (that is `quorum`).

use fred::prelude::Value;

use crate::base::error::{NodeError, NodeErrorKind, Vote};

/// One node's answer to an acquire: its vote and, with fencing, each key's counter.
#[derive(Debug)]
pub(crate) struct Acquired {
    pub(crate) vote: Vote,
    pub(crate) counters: Option<Vec<u64>>,
    /// A gate's refusal: the waiter's place in the key's wait line.
    pub(crate) queue: Option<Queue>,
    /// A gate's grant to the head of a line (others may still wait).
    pub(crate) lined: bool,
}

/// Where a gate's refusal left a waiter (see `scripts::GATE_ACQUIRE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Queue {
    /// Place in the line: 0 = head, 1.. = behind it (the exact place only when asked for),
    /// -1 = not in it (the acquire does not wait).
    pub(crate) rank: i64,
    /// `rank` is the exact place; `false` when the gate was not asked for it (a newcomer's
    /// join): then 1 means "somewhere behind the head" and 2 "two places or more behind it".
    pub(crate) exact: bool,
    /// For the head, the lock key's PTTL on the gate in ms (-1: a key without expiry); below
    /// -1 otherwise (not read; [`Queue::IN_PROCESS`]: not asked at all).
    pub(crate) pttl: i64,
}

impl Queue {
    /// Queued behind a waiter of the same `Redlock` without asking any node (see
    /// `handover`): second in line as far as the waiter's timer goes, and not in the gate's line.
    pub(crate) const IN_PROCESS: Queue = Queue {
        rank: 1,
        exact: true,
        pttl: -4,
    };
}

impl Acquired {
    pub(crate) fn plain(vote: Vote) -> Acquired {
        Acquired {
            vote,
            counters: None,
            queue: None,
            lined: false,
        }
    }
}

/// The gate acquire script's reply: `{1, counter}` granted (the counter is the fencing
/// counter's value when `fenced`), `{0, rank, pttl}` refused with the waiter's place in line
/// (the exact place when `ranked`: the script was asked for it).
pub(crate) fn gate_acquired(
    node: &str,
    reply: Result<Value, NodeError>,
    fenced: bool,
    ranked: bool,
) -> Acquired {
    match reply {
        Ok(Value::Array(parts)) => match parts.as_slice() {
            [Value::Integer(1), c, rest @ ..] if rest.len() <= 1 => {
                let lined = matches!(rest, [Value::Integer(1)]);
                match (fenced, counter(c)) {
                    (false, _) => Acquired {
                        lined,
                        ..Acquired::plain(Vote::Granted)
                    },
                    (true, Some(c)) => Acquired {
                        counters: Some(vec![c]),
                        lined,
                        ..Acquired::plain(Vote::Granted)
                    },
                    // Set, but the counter is garbage: not a grant (and released as unknown).
                    (true, None) => {
                        Acquired::plain(Vote::Failed(unexpected(node, "a numeric fencing counter")))
                    }
                }
            }
            [Value::Integer(0), Value::Integer(rank), Value::Integer(pttl)] if *rank >= -1 => {
                Acquired {
                    queue: Some(Queue {
                        rank: *rank,
                        exact: ranked || *rank <= 0,
                        pttl: *pttl,
                    }),
                    ..Acquired::plain(Vote::Refused)
                }
            }
            _ => Acquired::plain(Vote::Failed(unexpected(
                node,
                "{1, counter} or {0, rank, pttl}",
            ))),
        },
        Ok(_) => Acquired::plain(Vote::Failed(unexpected(node, "an array"))),
        Err(e) => Acquired::plain(Vote::Failed(e)),
    }
}

/// What a woken head's turn without a script found on its gate (`ZPOPMIN` of the line and
/// the key's `SET NX`, sent together: see `Node::turn_plain`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PlainTurn {
    /// It popped itself and set the key: granted.
    Granted,
    /// It popped itself but the key is held: its own score, to be put back at its place.
    Held(String),
    /// It popped another member (`(member, score)`, to be put back) or nothing; `set`: its
    /// `SET` landed all the same (a key to give back).
    NotHead {
        other: Option<(String, String)>,
        set: bool,
    },
}

/// Decodes a plain turn's two replies for member `me` (`ZPOPMIN`: `[member, score]` or `[]`,
/// flat or nested; `SET NX`: `OK` or nil). Anything else is an unexpected reply.
pub(crate) fn plain_turn(
    node: &str,
    me: &str,
    popped: Value,
    set: Value,
) -> Result<PlainTurn, NodeError> {
    let set = match set {
        Value::String(s) if s == "OK" => true,
        Value::Null => false,
        _ => return Err(unexpected(node, "OK or nil from SET NX")),
    };
    let pair = match popped {
        Value::Array(items) => match items.as_slice() {
            [] => None,
            [Value::Array(inner)] => Some(inner.clone()),
            _ => Some(items),
        },
        _ => return Err(unexpected(node, "an array from ZPOPMIN")),
    };
    let other = match pair.as_deref() {
        None => None,
        Some([member, score]) => {
            // A score is a finite number (it is put back as it came).
            let score = match score {
                Value::Double(f) => Some(format!("{f}")),
                Value::Integer(i) => Some(i.to_string()),
                Value::String(_) | Value::Bytes(_) => score.as_str().map(|s| s.into_owned()),
                _ => None,
            }
            .filter(|t| t.parse::<f64>().is_ok_and(f64::is_finite));
            match (member.as_str(), score) {
                (Some(m), Some(score)) => Some((m.into_owned(), score)),
                _ => return Err(unexpected(node, "[member, score] from ZPOPMIN")),
            }
        }
        Some(_) => return Err(unexpected(node, "[member, score] from ZPOPMIN")),
    };
    Ok(match other {
        Some((m, _)) if m == me && set => PlainTurn::Granted,
        Some((m, score)) if m == me => PlainTurn::Held(score),
        other => PlainTurn::NotHead { other, set },
    })
}

/// The gate release script's reply for `keys` keys: `{deleted, woken member or ''}`. The vote
/// is [`released`]'s; the member is the waiter the release woke.
pub(crate) fn gate_released(
    node: &str,
    reply: Result<Value, NodeError>,
    keys: usize,
) -> (Vote, Option<String>) {
    match reply {
        Ok(Value::Array(parts)) => match parts.as_slice() {
            [n @ Value::Integer(_), woken] => {
                let woken = woken
                    .as_str()
                    .map(|w| w.into_owned())
                    .filter(|w| !w.is_empty());
                (released(node, Ok(n.clone()), keys), woken)
            }
            _ => (Vote::Failed(unexpected(node, "{deleted, woken}")), None),
        },
        Ok(_) => (Vote::Failed(unexpected(node, "an array")), None),
        Err(e) => (Vote::Failed(e), None),
    }
}

/// One node's answer to a hand-over (`scripts::PASS`, `GATE_PASS`): what it means for the
/// holder's release and for the waiter's acquire.
#[derive(Debug, Clone)]
pub(crate) struct Passed {
    /// The holder's release: granted where its key was deleted or now holds the waiter's value.
    pub(crate) ours: Vote,
    /// The waiter's acquire: granted where its key is set.
    pub(crate) theirs: Vote,
    /// The gate did not pass (another process's waiter is ahead) and changed nothing: the
    /// holder's key is still there, for its ordinary release.
    pub(crate) kept: bool,
}

/// A hand-over's `{code, ''}`: 0 someone else's key, 2 passed, 3 free and set for the waiter,
/// 4 (the gate) not passed, nothing changed.
pub(crate) fn passed(node: &str, reply: Result<Value, NodeError>) -> Passed {
    let failed = |e: NodeError| Passed {
        ours: Vote::Failed(e.clone()),
        theirs: Vote::Failed(e),
        kept: false,
    };
    let parts = match reply {
        Ok(Value::Array(parts)) => parts,
        Ok(_) => return failed(unexpected(node, "a hand-over's {code, woken}")),
        Err(e) => return failed(e),
    };
    let code = match parts.as_slice() {
        [Value::Integer(code), _] => *code,
        _ => return failed(unexpected(node, "a hand-over's {code, ''}")),
    };
    let (ours, theirs) = match code {
        0 | 4 => (Vote::Refused, Vote::Refused),
        2 => (Vote::Granted, Vote::Granted),
        3 => (Vote::Refused, Vote::Granted),
        _ => return failed(unexpected(node, "a hand-over code of 0, 2, 3 or 4")),
    };
    Passed {
        ours,
        theirs,
        kept: code == 4,
    }
}

/// One node's answer to a slot request.
#[derive(Debug, Clone)]
pub(crate) enum Slot {
    /// Set the slot at this position of the order; its counter (0 without fencing).
    Took { position: usize, counter: u64 },
    /// Every slot is taken.
    Full,
    /// Refused by the semaphore's gate: this place in its wait line (0 = head, 1 = behind it,
    /// -1 = not in it).
    Waiting(i64),
    /// The name is in use with this other number of permits.
    Mismatch(String),
    /// An error or timeout: outcome unknown.
    Failed(NodeError),
}

/// A counter as the scripts return it: a non-negative integer.
fn counter(v: &Value) -> Option<u64> {
    match v {
        Value::Integer(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// A reply of `node` that is not of the shape `wanted`.
fn unexpected(node: &str, wanted: &str) -> NodeError {
    NodeError {
        node: node.to_string(),
        kind: NodeErrorKind::UnexpectedReply,
        message: format!("expected {wanted}"),
    }
}

/// Replies of the 1/0 scripts: 1 granted, 0 refused, anything else is a failure (never a grant).
pub(crate) fn vote(node: &str, reply: Result<Value, NodeError>) -> Vote {
    match reply {
        Ok(Value::Integer(1)) => Vote::Granted,
        Ok(Value::Integer(0)) => Vote::Refused,
        Ok(_) => Vote::Failed(unexpected(node, "OK, nil, 0 or 1")),
        Err(e) => Vote::Failed(e),
    }
}

/// The reply of `SET key token NX PX ttl`: OK granted, nil refused; anything else as [`vote`].
pub(crate) fn set_nx(node: &str, reply: Result<Value, NodeError>) -> Vote {
    match reply {
        Ok(Value::String(s)) if s == "OK" => Vote::Granted,
        Ok(Value::Null) => Vote::Refused,
        other => vote(node, other),
    }
}

/// The read-write lock's write script's reply: as [`fenced_acquire`] for one key, and with a
/// refusal (`{0, 1}` or `{0, 0}`) whether a writer was in the way (or only readers).
pub(crate) fn rw_write(node: &str, reply: Result<Value, NodeError>) -> (Acquired, bool) {
    if let Ok(Value::Array(parts)) = &reply {
        match parts.as_slice() {
            [Value::Integer(0), Value::Integer(w @ (0 | 1))] => {
                return (Acquired::plain(Vote::Refused), *w == 1)
            }
            [Value::Integer(0), ..] => {
                let what = "{0, 1} or {0, 0} for a refusal";
                return (Acquired::plain(Vote::Failed(unexpected(node, what))), false);
            }
            _ => {}
        }
    }
    (fenced_acquire(node, reply, 1), false)
}

/// The fenced acquire script's reply for `keys` keys: `{1, counter per key}` or `{0}`.
pub(crate) fn fenced_acquire(node: &str, reply: Result<Value, NodeError>, keys: usize) -> Acquired {
    match reply {
        Ok(Value::Array(parts)) => match parts.split_first() {
            Some((Value::Integer(1), counters)) if counters.len() == keys => {
                match counters.iter().map(counter).collect::<Option<Vec<u64>>>() {
                    Some(counters) => Acquired {
                        counters: Some(counters),
                        ..Acquired::plain(Vote::Granted)
                    },
                    // Set, but a counter is garbage: not a grant (and released as unknown).
                    None => {
                        Acquired::plain(Vote::Failed(unexpected(node, "numeric fencing counters")))
                    }
                }
            }
            Some((Value::Integer(0), [])) => Acquired::plain(Vote::Refused),
            _ => Acquired::plain(Vote::Failed(unexpected(node, "{1, counters...} or {0}"))),
        },
        Ok(_) => Acquired::plain(Vote::Failed(unexpected(node, "an array"))),
        Err(e) => Acquired::plain(Vote::Failed(e)),
    }
}

/// One node's answer to a lease check: whether our token holds every key there, and the
/// shortest TTL left among them (ms; 0 when refused or failed).
#[derive(Debug)]
pub(crate) struct Checked {
    pub(crate) vote: Vote,
    pub(crate) pttl_ms: u64,
}

/// The lease-check script's reply: `{1, pttl}` or `{0}`. A key without expiry (PTTL -1) is no
/// lock of ours: refused.
pub(crate) fn lease_checked(node: &str, reply: Result<Value, NodeError>) -> Checked {
    let (vote, pttl_ms) = match reply {
        Ok(Value::Array(parts)) => match parts.as_slice() {
            [Value::Integer(1), Value::Integer(t)] if *t > 0 => (Vote::Granted, *t as u64),
            [Value::Integer(1), Value::Integer(_)] | [Value::Integer(0)] => (Vote::Refused, 0),
            _ => (Vote::Failed(unexpected(node, "{1, pttl} or {0}")), 0),
        },
        Ok(_) => (Vote::Failed(unexpected(node, "an array")), 0),
        Err(e) => (Vote::Failed(e), 0),
    };
    Checked { vote, pttl_ms }
}

/// The fence-raise script's reply: 1 when every counter is at least its token.
pub(crate) fn fence_raised(node: &str, reply: Result<Value, NodeError>) -> Vote {
    match reply {
        Ok(Value::Integer(1)) => Vote::Granted,
        Ok(_) => Vote::Failed(unexpected(node, "1")),
        Err(e) => Vote::Failed(e),
    }
}

/// The semaphore script's reply for a request of `slots` slots: `{1, position, counter}`, `{0}`
/// (full) or `{-1, permits}` (the name is in use with other permits).
pub(crate) fn slot(node: &str, reply: Result<Value, NodeError>, slots: usize) -> Slot {
    match reply {
        Ok(Value::Array(parts)) => match parts.as_slice() {
            [Value::Integer(1), Value::Integer(pos), c] => {
                match (usize::try_from(*pos).ok(), counter(c)) {
                    (Some(position), Some(counter)) if position < slots => {
                        Slot::Took { position, counter }
                    }
                    _ => Slot::Failed(unexpected(node, "a slot position and a counter")),
                }
            }
            [Value::Integer(0)] => Slot::Full,
            [Value::Integer(0), Value::Integer(rank)] if (-1..=1).contains(rank) => {
                Slot::Waiting(*rank)
            }
            [Value::Integer(-1), permits] => {
                Slot::Mismatch(permits.as_str().map(|p| p.into_owned()).unwrap_or_default())
            }
            _ => Slot::Failed(unexpected(node, "{1, slot, counter}, {0} or {-1, permits}")),
        },
        Ok(_) => Slot::Failed(unexpected(node, "an array")),
        Err(e) => Slot::Failed(e),
    }
}

/// The release script's reply for `keys` keys: how many it deleted. Granted when every key was
/// ours, refused when fewer were.
pub(crate) fn released(node: &str, reply: Result<Value, NodeError>, keys: usize) -> Vote {
    let all = keys as i64;
    match reply {
        Ok(Value::Integer(n)) if n == all => Vote::Granted,
        Ok(Value::Integer(n)) if (0..all).contains(&n) => Vote::Refused,
        Ok(_) => Vote::Failed(unexpected(node, "the number of keys deleted")),
        Err(e) => Vote::Failed(e),
    }
}

/// The batched extend script's reply for `locks` locks: one vote per lock, in order. `1`
/// granted, `0` refused, a string (the server's error for that lock's keys, e.g. WRONGTYPE) a
/// failure of that lock alone. A reply of any other shape, or an error for the whole call (a
/// timeout, a connection reset), fails every lock of the batch on this node: its outcome is
/// unknown, never a grant.
pub(crate) fn extended_many(
    node: &str,
    reply: Result<Value, NodeError>,
    locks: usize,
) -> Vec<Vote> {
    per_item(node, reply, locks, "1, 0 or an error for each lock")
        .into_iter()
        .map(|item| match item {
            Ok(1) => Vote::Granted,
            Ok(0) => Vote::Refused,
            Ok(_) => Vote::Failed(unexpected(node, "1, 0 or an error for each lock")),
            Err(e) => Vote::Failed(e),
        })
        .collect()
}

/// The batch script's reply for `ops` operations (see `batch`): per operation its integer
/// answer, or the server's error for that operation alone. A reply of any other shape, or an
/// error for the whole call, fails every operation: its outcome is unknown.
pub(crate) fn batch(
    node: &str,
    reply: Result<Value, NodeError>,
    ops: usize,
) -> Vec<Result<i64, NodeError>> {
    per_item(
        node,
        reply,
        ops,
        "an integer or an error for each operation",
    )
}

/// An array reply of `items` elements, each an integer or an error string (`redis.pcall`'s
/// `err`), as the batched scripts answer.
fn per_item(
    node: &str,
    reply: Result<Value, NodeError>,
    items: usize,
    wanted: &str,
) -> Vec<Result<i64, NodeError>> {
    let parts = match reply {
        Ok(Value::Array(parts)) if parts.len() == items => parts,
        Ok(_) => return vec![Err(unexpected(node, wanted)); items],
        Err(e) => return vec![Err(e); items],
    };
    let server = |message: String| NodeError {
        node: node.to_string(),
        kind: NodeErrorKind::Server,
        message,
    };
    parts
        .into_iter()
        .map(|part| match part {
            Value::Integer(n) => Ok(n),
            // Only a string is the server's words (`as_str` would also turn a number into one).
            Value::String(message) => Err(server(message.to_string())),
            Value::Bytes(message) => Err(server(String::from_utf8_lossy(&message).into_owned())),
            _ => Err(unexpected(node, wanted)),
        })
        .collect()
}

/// The inspect script's reply: `[token, pttl_ms]`, or `[nil, _]` when the key does not exist.
pub(crate) fn holder(
    node: &str,
    reply: Result<Value, NodeError>,
) -> Result<Option<(String, i64)>, NodeError> {
    match reply? {
        Value::Array(parts) => value_and_pttl(node, &parts),
        _ => Err(unexpected(node, "an array")),
    }
}

/// The view script's reply for `keys` keys: a value and a pttl per key, as [`holder`].
pub(crate) fn views(
    node: &str,
    reply: Result<Value, NodeError>,
    keys: usize,
) -> Result<Vec<Option<(String, i64)>>, NodeError> {
    let Value::Array(parts) = reply? else {
        return Err(unexpected(node, "an array"));
    };
    if parts.len() != 2 * keys {
        return Err(unexpected(node, "a value and a pttl per key"));
    }
    parts
        .chunks(2)
        .map(|pair| value_and_pttl(node, pair))
        .collect()
}

/// The read-write view script's reply: `[value, pttl]` pairs (writer, waiting mark, then each
/// live reader), as [`holder`]; at least the first two.
pub(crate) fn rw_view(
    node: &str,
    reply: Result<Value, NodeError>,
) -> Result<Vec<Option<(String, i64)>>, NodeError> {
    let Value::Array(parts) = reply? else {
        return Err(unexpected(node, "an array"));
    };
    if parts.len() < 4 || parts.len() % 2 != 0 {
        return Err(unexpected(node, "[value, pttl] pairs"));
    }
    parts
        .chunks(2)
        .map(|pair| value_and_pttl(node, pair))
        .collect()
}

/// One key's `[value, pttl_ms]`: `None` when the key does not exist.
fn value_and_pttl(node: &str, pair: &[Value]) -> Result<Option<(String, i64)>, NodeError> {
    match pair {
        [Value::Null, _] => Ok(None),
        [value, Value::Integer(pttl)] => match value.as_str() {
            Some(v) => Ok(Some((v.into_owned(), *pttl))),
            None => Err(unexpected(node, "a string value")),
        },
        _ => Err(unexpected(node, "[value, pttl]")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(v: &[i64]) -> Result<Value, NodeError> {
        Ok(Value::Array(v.iter().map(|n| Value::Integer(*n)).collect()))
    }

    #[test]
    fn a_plain_turn_is_read_whatever_shape_the_pop_comes_in() {
        let s = |t: &str| Value::from(t);
        let pair = |m: &str, score: Value| Value::Array(vec![s(m), score]);
        let ok = || s("OK");
        let turn = |p, set| plain_turn("n", "me", p, set);
        assert_eq!(turn(pair("me", s("3")), ok()), Ok(PlainTurn::Granted));
        let nested = Value::Array(vec![pair("me", Value::Double(-2.0))]);
        assert_eq!(turn(nested, Value::Null), Ok(PlainTurn::Held("-2".into())));
        assert_eq!(
            turn(pair("other", Value::Integer(7)), ok()),
            Ok(PlainTurn::NotHead {
                other: Some(("other".into(), "7".into())),
                set: true
            })
        );
        assert_eq!(
            turn(Value::Array(vec![]), Value::Null),
            Ok(PlainTurn::NotHead {
                other: None,
                set: false
            })
        );
        // Hostile replies: an error, never a grant.
        for (p, set) in [
            (pair("me", s("1")), Value::Integer(1)),
            (s("me"), ok()),
            (Value::Array(vec![s("me")]), ok()),
            (pair("me", Value::Double(f64::NAN)), ok()),
            (Value::Array(vec![s("me"), s("1"), s("x")]), ok()),
        ] {
            let r = turn(p, set);
            assert!(
                r.as_ref()
                    .is_err_and(|e| e.kind == NodeErrorKind::UnexpectedReply),
                "{r:?}"
            );
        }
    }

    fn is_unexpected(v: &Vote) -> bool {
        matches!(v, Vote::Failed(e) if e.kind == NodeErrorKind::UnexpectedReply && e.node == "n")
    }

    #[test]
    fn only_one_and_ok_are_grants() {
        assert_eq!(vote("n", Ok(Value::Integer(1))), Vote::Granted);
        assert_eq!(vote("n", Ok(Value::Integer(0))), Vote::Refused);
        assert!(is_unexpected(&vote("n", Ok(Value::Integer(2)))));
        assert!(is_unexpected(&vote("n", Ok(Value::from("OK")))));
        assert_eq!(set_nx("n", Ok(Value::from("OK"))), Vote::Granted);
        assert_eq!(set_nx("n", Ok(Value::Null)), Vote::Refused);
        assert!(is_unexpected(&set_nx("n", Ok(Value::from("QUEUED")))));
        assert!(is_unexpected(&fence_raised("n", Ok(Value::Integer(0)))));
    }

    #[test]
    fn a_refused_write_says_whether_a_writer_was_there() {
        let (a, writer) = rw_write("n", ints(&[0, 1]));
        assert_eq!((a.vote, writer), (Vote::Refused, true));
        let (a, writer) = rw_write("n", ints(&[0, 0]));
        assert_eq!((a.vote, writer), (Vote::Refused, false));
        assert!(is_unexpected(&rw_write("n", ints(&[0])).0.vote));
        assert!(is_unexpected(&rw_write("n", ints(&[0, 2])).0.vote));
        let (a, writer) = rw_write("n", ints(&[1, 7]));
        assert_eq!(
            (a.vote, a.counters, writer),
            (Vote::Granted, Some(vec![7]), false)
        );
    }

    #[test]
    fn fenced_acquire_needs_a_numeric_counter_per_key() {
        let a = fenced_acquire("n", ints(&[1, 7, 9]), 2);
        assert_eq!((a.vote, a.counters), (Vote::Granted, Some(vec![7, 9])));
        assert!(is_unexpected(&fenced_acquire("n", ints(&[1, 7]), 2).vote));
        assert!(is_unexpected(&fenced_acquire("n", ints(&[1, -1]), 1).vote));
        assert_eq!(fenced_acquire("n", ints(&[0]), 1).vote, Vote::Refused);
        assert!(is_unexpected(&fenced_acquire("n", ints(&[0, 3]), 1).vote));
    }

    #[test]
    fn slot_positions_are_within_the_request() {
        assert!(matches!(
            slot("n", ints(&[1, 2, 5]), 3),
            Slot::Took {
                position: 2,
                counter: 5
            }
        ));
        assert!(matches!(slot("n", ints(&[1, 3, 5]), 3), Slot::Failed(_)));
        assert!(matches!(slot("n", ints(&[0]), 3), Slot::Full));
        let mismatch = Ok(Value::Array(vec![Value::Integer(-1), Value::from("4")]));
        assert!(matches!(slot("n", mismatch, 3), Slot::Mismatch(p) if p == "4"));
    }

    #[test]
    fn a_hand_over_answers_for_the_holder_and_the_waiter() {
        let reply = |code: i64| Ok(Value::Array(vec![Value::Integer(code), Value::from("")]));
        let votes = |p: Passed| (p.ours, p.theirs, p.kept);
        let (g, r) = (Vote::Granted, Vote::Refused);
        assert_eq!(votes(passed("n", reply(2))), (g.clone(), g.clone(), false));
        assert_eq!(votes(passed("n", reply(3))), (r.clone(), g, false));
        assert_eq!(votes(passed("n", reply(0))), (r.clone(), r.clone(), false));
        assert_eq!(votes(passed("n", reply(4))), (r.clone(), r, true));
        // Anything else is a failure for both, never a grant.
        for bad in [reply(1), reply(-1), Ok(Value::Integer(2)), ints(&[2])] {
            let p = passed("n", bad);
            assert!(is_unexpected(&p.ours) && is_unexpected(&p.theirs), "{p:?}");
        }
    }

    #[test]
    fn release_counts_deleted_keys() {
        assert_eq!(released("n", Ok(Value::Integer(2)), 2), Vote::Granted);
        assert_eq!(released("n", Ok(Value::Integer(1)), 2), Vote::Refused);
        assert!(is_unexpected(&released("n", Ok(Value::Integer(3)), 2)));
        assert!(is_unexpected(&released("n", Ok(Value::Integer(-1)), 2)));
    }

    #[test]
    fn a_batched_extend_answers_per_lock() {
        let reply = Ok(Value::Array(vec![
            Value::Integer(1),
            Value::Integer(0),
            Value::from("WRONGTYPE Operation against a key holding the wrong kind of value"),
            Value::Integer(1),
        ]));
        let votes = extended_many("n", reply, 4);
        assert_eq!(votes[0], Vote::Granted);
        assert_eq!(votes[1], Vote::Refused);
        assert!(
            matches!(&votes[2], Vote::Failed(e) if e.kind == NodeErrorKind::Server && e.message.starts_with("WRONGTYPE"))
        );
        assert_eq!(votes[3], Vote::Granted);
        // A reply for another number of locks, or of another shape, is never a grant.
        let short = extended_many("n", ints(&[1, 1]), 3);
        assert!(short.len() == 3 && short.iter().all(is_unexpected));
        let odd = extended_many("n", ints(&[1, 2]), 2);
        assert_eq!(odd[0], Vote::Granted);
        assert!(is_unexpected(&odd[1]));
        assert!(extended_many("n", Ok(Value::Integer(1)), 1)
            .iter()
            .all(is_unexpected));
        let down = NodeError {
            node: "n".into(),
            kind: NodeErrorKind::Connection,
            message: "reset".into(),
        };
        let cut = extended_many("n", Err(down), 2);
        assert!(cut
            .iter()
            .all(|v| matches!(v, Vote::Failed(e) if e.kind == NodeErrorKind::Connection)));
    }

    #[test]
    fn holders_and_views() {
        let held = Ok(Value::Array(vec![Value::from("tok"), Value::Integer(900)]));
        assert_eq!(holder("n", held).unwrap(), Some(("tok".to_string(), 900)));
        let free = Ok(Value::Array(vec![Value::Null, Value::Integer(-2)]));
        assert_eq!(holder("n", free).unwrap(), None);
        assert!(holder("n", ints(&[1])).is_err());
        let two = Ok(Value::Array(vec![
            Value::Null,
            Value::Integer(-2),
            Value::from("v"),
            Value::Integer(5),
        ]));
        assert_eq!(
            views("n", two, 2).unwrap(),
            vec![None, Some(("v".to_string(), 5))]
        );
        assert!(views("n", ints(&[-2]), 1).is_err());
    }
}
