//! [`Redlock::inspect`]: who holds a resource, node by node, read atomically per node.
//!
//! Owns: the inspection round and its view types (also the round `force` breaks locks with).
//! Must not: change anything on a node itself.

use std::sync::Arc;
use std::time::Duration;

use crate::base::error::{NodeError, Result};
use crate::nodes::node::Node;
use crate::rounds::quorum::{fan_out, Late};
use crate::rounds::redlock::Redlock;

/// What one node says about a resource, from [`Redlock::inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// The node, as `host:port/db`.
    pub node: String,
    /// `Ok(None)`: free here; `Ok(Some(holder))`: held here; `Err`: this node could not say.
    pub state: std::result::Result<Option<Holder>, NodeError>,
}

/// Who holds a lock key on one node: its public label and token fingerprint, never the secret
/// token itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The owner label stored with the lock (see
    /// [`Builder::owner_label`](crate::Builder::owner_label)); `None` when the value has no
    /// separator: a lock stored without a label, by an older fredlock, or a value someone else
    /// put there.
    pub label: Option<String>,
    /// 12 hex digits of the SHA-1 of the token (of the whole value when it has no separator):
    /// tells holders apart, and equals the holder's own
    /// [`Lock::fingerprint`](crate::Lock::fingerprint). Useless for guessing the token.
    pub fingerprint: String,
    /// Time left before the key expires on that node; `None` when the key has no expiry.
    pub ttl: Option<Duration>,
}

impl Holder {
    /// The holder that a value read at a lock key stands for, as `inspect` reports it: split at
    /// its first [`SEPARATOR`](crate::SEPARATOR), the token part reduced to its fingerprint.
    /// `pttl` is the key's `PTTL` in milliseconds (negative: no expiry, or no key).
    pub fn from_value(value: &str, pttl: i64) -> Holder {
        let (token, label) = crate::base::owner::split(value);
        Holder {
            label: label.map(str::to_string),
            fingerprint: crate::base::owner::fingerprint(token),
            ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        }
    }

    /// Whether this holder's token is `token` (compares fingerprints): how a holder, or a test,
    /// recognises its own lock in an inspection without the token ever being shown.
    pub fn has_token(&self, token: &str) -> bool {
        self.fingerprint == crate::base::owner::fingerprint(token)
    }

    /// Whether `other` is the same holder (same fingerprint and label).
    fn same(&self, other: &Holder) -> bool {
        self.fingerprint == other.fingerprint && self.label == other.label
    }
}

/// What an [`Inspection`] says about a resource as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Every node answered and none holds it.
    Free,
    /// One holder on at least a quorum of nodes: the current owner.
    Held(Holder),
    /// No holder on a quorum, yet the key is set somewhere (a lock being acquired or released
    /// right now, a failed attempt's leftovers, or holders split by a fault), or too few nodes
    /// answered to say.
    Split,
}

/// Who holds a resource, node by node. See [`Redlock::inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// The resource inspected.
    pub resource: String,
    /// How many nodes make a quorum.
    pub quorum: usize,
    /// Each configured node's view, in configuration order.
    pub nodes: Vec<NodeView>,
}

impl Inspection {
    /// The holder on at least a quorum of nodes, if any: the current owner (the TTL shown is
    /// the first such node's; see [`remaining`](Self::remaining) for the longest).
    pub fn holder(&self) -> Option<&Holder> {
        let holders = self.nodes.iter().filter_map(|n| match &n.state {
            Ok(Some(h)) => Some(h),
            _ => None,
        });
        let mut counts: Vec<(&Holder, usize)> = Vec::new();
        for h in holders {
            match counts.iter_mut().find(|(k, _)| k.same(h)) {
                Some((_, c)) => *c += 1,
                None => counts.push((h, 1)),
            }
        }
        counts
            .into_iter()
            .find(|&(_, c)| c >= self.quorum)
            .map(|(h, _)| h)
    }

    /// Free, held on a quorum, or split (see [`Verdict`]).
    pub fn verdict(&self) -> Verdict {
        if self.is_free() {
            return Verdict::Free;
        }
        match self.holder() {
            Some(h) => Verdict::Held(h.clone()),
            None => Verdict::Split,
        }
    }

    /// True when every node answered and none holds the key.
    pub fn is_free(&self) -> bool {
        self.nodes.iter().all(|n| matches!(n.state, Ok(None)))
    }

    /// The largest remaining TTL among the nodes where the holder's fingerprint is
    /// `fingerprint` (see [`Holder::fingerprint`]).
    pub fn remaining(&self, fingerprint: &str) -> Option<Duration> {
        self.nodes
            .iter()
            .filter_map(|n| match &n.state {
                Ok(Some(h)) if h.fingerprint == fingerprint => h.ttl,
                _ => None,
            })
            .max()
    }
}

impl Redlock {
    /// Reads who holds `resource` on every node (owner label, token fingerprint and remaining
    /// TTL; never the secret token), atomically per node.
    /// Waits for every node, each bounded by the per-node timeout (default 500 ms here).
    /// Never changes anything.
    ///
    /// Cancellation: safe at any point (read-only).
    pub async fn inspect(&self, resource: &str) -> Result<Inspection> {
        self.holders_round(resource, |node, key, timeout| node.inspect(key, timeout))
            .await
    }

    /// `op` on `resource`'s key on every node, waiting for each (bounded by the per-node
    /// timeout, default 500 ms here), reported as an [`Inspection`].
    pub(crate) async fn holders_round<F, Fut>(&self, resource: &str, op: F) -> Result<Inspection>
    where
        F: Fn(Arc<Node>, String, Duration) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<Option<(String, i64)>, NodeError>>
            + Send
            + 'static,
    {
        crate::base::slots::check_size(resource)?;
        let key = self.key(resource);
        let timeout = self
            .inner
            .node_timeout
            .unwrap_or(Duration::from_millis(500));
        let calls = self
            .inner
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, op(n.clone(), key.clone(), timeout)));
        let answers = fan_out(self.inner.nodes.len(), calls, None, Late::Drop, |_| false).await;
        let nodes = answers
            .into_iter()
            .zip(&self.inner.nodes)
            .map(|(answer, node)| NodeView {
                node: node.name.clone(),
                state: match answer {
                    Some(Ok(found)) => {
                        Ok(found.map(|(value, pttl)| Holder::from_value(&value, pttl)))
                    }
                    Some(Err(e)) => Err(e),
                    None => Err(NodeError {
                        node: node.name.clone(),
                        kind: crate::base::error::NodeErrorKind::Timeout,
                        message: "no answer".into(),
                    }),
                },
            })
            .collect();
        Ok(Inspection {
            resource: resource.to_string(),
            quorum: self.inner.quorum,
            nodes,
        })
    }
}

/// A read-write lock node by node. See [`RwLock::inspect`](crate::RwLock::inspect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwInspection {
    /// The lock's name.
    pub name: String,
    /// How many nodes make a quorum.
    pub quorum: usize,
    /// One view per node, in configuration order.
    pub nodes: Vec<RwNodeView>,
}

/// One node's view of a read-write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwNodeView {
    /// The node, as `host:port/db`.
    pub node: String,
    /// What the node holds, or why it could not say.
    pub state: std::result::Result<RwNodeState, NodeError>,
}

/// What one node holds for a read-write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwNodeState {
    /// The writer, if one holds the lock here.
    pub writer: Option<Holder>,
    /// Whether a writer waits here (new readers are refused).
    pub writer_waiting: bool,
    /// Every live reader here.
    pub readers: Vec<Holder>,
}

impl RwInspection {
    /// The writer whose token is on a quorum of nodes, if any.
    pub fn writer(&self) -> Option<&Holder> {
        let states: Vec<&RwNodeState> = self.states().collect();
        let writers = states.iter().filter_map(|s| s.writer.as_ref());
        writers.clone().find(|w| {
            writers
                .clone()
                .filter(|o| o.fingerprint == w.fingerprint)
                .count()
                >= self.quorum
        })
    }

    /// How many readers hold a share on a quorum of nodes.
    pub fn readers(&self) -> usize {
        let mut seen: Vec<&str> = self
            .states()
            .flat_map(|s| s.readers.iter().map(|r| r.fingerprint.as_str()))
            .collect();
        seen.sort_unstable();
        seen.chunk_by(|a, b| a == b)
            .filter(|run| run.len() >= self.quorum)
            .count()
    }

    fn states(&self) -> impl Iterator<Item = &RwNodeState> + Clone {
        self.nodes.iter().filter_map(|n| n.state.as_ref().ok())
    }
}

/// A node's state from the view script's pairs: writer, mark, readers.
pub(crate) fn node_state(pairs: &[Option<(String, i64)>]) -> RwNodeState {
    let holder = |p: &Option<(String, i64)>| p.as_ref().map(|(v, t)| Holder::from_value(v, *t));
    RwNodeState {
        writer: pairs.first().and_then(holder),
        writer_waiting: pairs.get(1).is_some_and(Option::is_some),
        readers: pairs.iter().skip(2).filter_map(holder).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_needs_a_quorum() {
        let view = |t: Option<&str>| NodeView {
            node: "n".into(),
            state: Ok(t.map(|t| Holder::from_value(t, 1000))),
        };
        let i = Inspection {
            resource: "r".into(),
            quorum: 2,
            nodes: vec![view(Some("a")), view(Some("b")), view(None)],
        };
        assert_eq!(i.holder(), None);
        assert!(!i.is_free());
        assert_eq!(i.verdict(), Verdict::Split);
        let i = Inspection {
            nodes: vec![view(Some("a\x1fme")), view(Some("a\x1fme")), view(None)],
            ..i
        };
        let h = i.holder().expect("a quorum");
        assert_eq!(h.label.as_deref(), Some("me"));
        assert_eq!(h.fingerprint, crate::base::owner::fingerprint("a"));
        assert_eq!(i.verdict(), Verdict::Held(h.clone()));
        // Same token, another label: not the same holder.
        let i = Inspection {
            nodes: vec![view(Some("a\x1fme")), view(Some("a\x1fyou")), view(None)],
            ..i
        };
        assert_eq!(i.holder(), None);
        let i = Inspection {
            nodes: vec![view(None), view(None), view(None)],
            ..i
        };
        assert_eq!(i.verdict(), Verdict::Free);
    }

    #[test]
    fn the_token_is_never_shown() {
        let h = Holder::from_value("s3cret\x1fworker-1", 5);
        assert_eq!(h.label.as_deref(), Some("worker-1"));
        assert!(!format!("{h:?}").contains("s3cret"));
        let foreign = Holder::from_value("someone-else", -1);
        assert_eq!((foreign.label, foreign.ttl), (None, None));
    }
}
