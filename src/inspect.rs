//! [`Redlock::inspect`]: who holds a resource, node by node, read atomically per node.
//!
//! Owns: the inspection round and its view types.
//! Must not: change anything on a node.

use std::time::Duration;

use crate::error::{InvalidInput, NodeError, Result};
use crate::quorum::{fan_out, Late};
use crate::redlock::Redlock;

/// What one node says about a resource, from [`Redlock::inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// The node, as `host:port/db`.
    pub node: String,
    /// `Ok(None)`: free here; `Ok(Some(holder))`: held here; `Err`: this node could not say.
    pub state: std::result::Result<Option<Holder>, NodeError>,
}

/// A value found at a lock key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The token stored at the key (a fredlock token, or whatever else someone put there).
    pub token: String,
    /// Time left before the key expires on that node; `None` when the key has no expiry.
    pub ttl: Option<Duration>,
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
    /// The token held on at least a quorum of nodes, if any: the current owner.
    pub fn holder(&self) -> Option<&str> {
        let tokens = self.nodes.iter().filter_map(|n| match &n.state {
            Ok(Some(h)) => Some(h.token.as_str()),
            _ => None,
        });
        let mut counts: Vec<(&str, usize)> = Vec::new();
        for t in tokens {
            match counts.iter_mut().find(|(k, _)| *k == t) {
                Some((_, c)) => *c += 1,
                None => counts.push((t, 1)),
            }
        }
        counts
            .into_iter()
            .find(|&(_, c)| c >= self.quorum)
            .map(|(t, _)| t)
    }

    /// True when every node answered and none holds the key.
    pub fn is_free(&self) -> bool {
        self.nodes.iter().all(|n| matches!(n.state, Ok(None)))
    }

    /// The largest remaining TTL among the nodes that hold `token`.
    pub fn remaining(&self, token: &str) -> Option<Duration> {
        self.nodes
            .iter()
            .filter_map(|n| match &n.state {
                Ok(Some(h)) if h.token == token => h.ttl,
                _ => None,
            })
            .max()
    }
}

impl Redlock {
    /// Reads who holds `resource` on every node (value and remaining TTL), atomically per node.
    /// Waits for every node, each bounded by the per-node timeout (default 500 ms here).
    /// Never changes anything.
    ///
    /// Cancellation: safe at any point (read-only).
    pub async fn inspect(&self, resource: &str) -> Result<Inspection> {
        if resource.is_empty() {
            return Err(InvalidInput::EmptyResource.into());
        }
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
            .map(|(i, n)| (i, n.clone().inspect(key.clone(), timeout)));
        let answers = fan_out(self.inner.nodes.len(), calls, None, Late::Drop, |_| false).await;
        let nodes = answers
            .into_iter()
            .zip(&self.inner.nodes)
            .map(|(answer, node)| NodeView {
                node: node.name.clone(),
                state: match answer {
                    Some(Ok(found)) => Ok(found.map(|(token, pttl)| Holder {
                        token,
                        ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
                    })),
                    Some(Err(e)) => Err(e),
                    None => Err(NodeError {
                        node: node.name.clone(),
                        kind: crate::error::NodeErrorKind::Timeout,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_needs_a_quorum() {
        let view = |t: Option<&str>| NodeView {
            node: "n".into(),
            state: Ok(t.map(|t| Holder {
                token: t.into(),
                ttl: Some(Duration::from_secs(1)),
            })),
        };
        let i = Inspection {
            resource: "r".into(),
            quorum: 2,
            nodes: vec![view(Some("a")), view(Some("b")), view(None)],
        };
        assert_eq!(i.holder(), None);
        assert!(!i.is_free());
        let i = Inspection {
            nodes: vec![view(Some("a")), view(Some("a")), view(None)],
            ..i
        };
        assert_eq!(i.holder(), Some("a"));
    }
}
