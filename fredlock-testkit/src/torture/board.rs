//! The proxies' fault board ([`Board`]): which fault each client's proxy to each node has, in
//! two layers (the node lane's partitions win over the client lanes' link faults), and the
//! epochs a client reads to tell whether its link to a node changed during an operation.
//!
//! Owns the switching of proxy faults and the link epochs. Must not decide which fault to set
//! (the lanes of `faults.rs` do) nor hold the rest of the run's state (`env.rs` holds the board).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::config::TortureConfig;
use crate::{Fault, FaultProxy};

/// Each client's proxies have two fault layers: the node lane's (a partition of every client)
/// wins over the client lanes' (one client's link). Each layer ends its swallowing faults with a
/// reset, so the effective fault does too. On cluster nodes there are no proxies: the board
/// only keeps the link epochs, which connection kills bump.
pub(super) struct Board {
    /// Per client and node; empty on cluster nodes.
    proxies: Vec<Vec<FaultProxy>>,
    layers: Mutex<Vec<Vec<[Fault; 2]>>>,
    /// Per client and node, bumped whenever that proxy's effective fault changes.
    epochs: Vec<Vec<AtomicU64>>,
}

impl Board {
    /// Every client's proxies, all passing (none on cluster nodes).
    pub(super) fn new(config: &TortureConfig, proxies: Vec<Vec<FaultProxy>>) -> Board {
        Board {
            layers: Mutex::new(vec![vec![[Fault::Pass; 2]; config.nodes]; config.clients]),
            epochs: (0..config.clients)
                .map(|_| (0..config.nodes).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            proxies,
        }
    }

    pub(super) fn set(&self, layer: usize, clients: &[usize], nodes: &[usize], fault: Fault) {
        let mut layers = self.layers.lock().unwrap_or_else(|p| p.into_inner());
        for &c in clients {
            for &n in nodes {
                let l = &mut layers[c][n];
                l[layer] = fault;
                let effective = if l[0] != Fault::Pass { l[0] } else { l[1] };
                let Some(proxy) = self.proxies.get(c).and_then(|mine| mine.get(n)) else {
                    continue;
                };
                if proxy.fault() != effective {
                    self.epochs[c][n].fetch_add(1, Ordering::SeqCst);
                }
                proxy.set(effective);
            }
        }
    }

    /// Every client's link to `nodes` was (or is about to be) reset by the node itself.
    pub(super) fn bump_links(&self, nodes: &[usize]) {
        for mine in &self.epochs {
            for &n in nodes {
                if let Some(e) = mine.get(n) {
                    e.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    /// One client's proxy epochs, by node.
    pub(super) fn epochs(&self, client: usize) -> Vec<u64> {
        self.epochs[client]
            .iter()
            .map(|e| e.load(Ordering::SeqCst))
            .collect()
    }
}
