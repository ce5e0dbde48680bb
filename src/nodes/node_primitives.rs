//! The commands on one node of the primitives above a lock: a semaphore's slot (through its
//! gate's wait line on the gate), a read-write lock's scripts, and an election's scripts.
//!
//! Owns: the arguments of a semaphore's slot scripts; the common guards of a primitive's script
//! (a node that may not vote sends nothing; a script that may create keys is marked in flight on
//! a cluster node).
//! Must not: decode a reply by hand (reply), count votes across nodes (quorum), or know what a
//! primitive's scripts mean (primitives).

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::Value;

use crate::base::error::NodeError;
use crate::base::reply::{self, Slot};
use crate::base::scripts::Script;
use crate::nodes::batch::LineRef;
use crate::nodes::node::{Backend, Node};
use crate::nodes::node_gate::line_argv;

/// A semaphore slot request, the same for every node of one attempt.
#[derive(Debug)]
pub(crate) struct SlotRequest {
    pub(crate) meta_key: String,
    /// The slot keys in the order to try.
    pub(crate) slot_keys: Vec<String>,
    /// With fencing: their counters in the same order; empty otherwise.
    pub(crate) fence_keys: Vec<String>,
    /// The value to store (see [`Held::value`](crate::nodes::batch::Held::value)).
    pub(crate) value: String,
    pub(crate) ttl_ms: u64,
    /// The semaphore's wait line (its gate takes the slot through it).
    pub(crate) line: Option<LineRef>,
}

impl Node {
    /// Takes the first free slot of a semaphore, in the order given.
    pub(crate) async fn take_slot(
        self: Arc<Self>,
        req: Arc<SlotRequest>,
        timeout: Duration,
    ) -> Slot {
        if let Err(e) = self.state.counts() {
            return Slot::Failed(e);
        }
        let _running = self.inflight(&req.value);
        let slot = match &self.backend {
            Backend::Server(_) => self.take_slot_here(&req, timeout).await,
            Backend::Cluster(_) => {
                let here = self.take_slot_here(&req, timeout);
                Box::pin(crate::nodes::cluster::creating(&req.value, here)).await
            }
        };
        self.confirmed_slot(slot, timeout).await
    }

    async fn take_slot_here(&self, req: &SlotRequest, timeout: Duration) -> Slot {
        let scripts = crate::base::scripts::Scripts::get();
        let keys: Vec<&str> = std::iter::once(&req.meta_key)
            .chain(&req.slot_keys)
            .chain(&req.fence_keys)
            .map(String::as_str)
            .collect();
        let fenced = if req.fence_keys.is_empty() { "0" } else { "1" };
        let mut argv = vec![
            Value::from(req.value.as_str()),
            Value::Integer(req.ttl_ms as i64),
            Value::Integer(req.slot_keys.len() as i64),
            Value::from(fenced),
        ];
        let mut keys = keys;
        let script = match self.gated(&req.line) {
            Some(line) => {
                keys.push(&line.key);
                argv.extend(line_argv(line));
                &scripts.sem_gate
            }
            None => &scripts.sem_acquire,
        };
        let reply = self.script_on(script, &keys, &argv, timeout).await;
        reply::slot(&self.name, reply, req.slot_keys.len())
    }

    /// A script of a primitive above (a read-write lock's) over `keys`, which share one hash
    /// slot, with `argv`. `creating`: the value the script may store, for an acquire (on a
    /// cluster node a release of that value then waits for it, as for a lock's acquire; with
    /// confirmation, its reply stands once the replicas acknowledged it).
    pub(crate) async fn eval_script(
        self: Arc<Self>,
        script: &'static Script,
        keys: Arc<Vec<String>>,
        argv: Arc<Vec<Value>>,
        creating: Option<Arc<str>>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        self.state.counts()?;
        let _running = creating.as_deref().and_then(|v| self.inflight(v));
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let here = self.script_on(script, &refs, &argv, timeout);
        let creates = creating.is_some();
        let reply = match (&self.backend, creating) {
            (Backend::Cluster(_), Some(value)) => {
                Box::pin(crate::nodes::cluster::creating(&value, here)).await
            }
            _ => here.await,
        };
        // An acquire's write counts once the replicas confirmed it (see `confirm`).
        match creates {
            true => self.confirmed_reply(reply, timeout).await,
            false => reply,
        }
    }

    /// Any script over `keys` (of one hash slot) and `argv`; a node that may not vote (not
    /// identified yet, a duplicate) answers its error without anything being sent.
    pub(crate) async fn run_script(
        self: Arc<Self>,
        script: &'static Script,
        keys: Arc<Vec<String>>,
        argv: Arc<Vec<Value>>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        self.state.counts()?;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.script_on(script, &refs, &argv, timeout).await
    }

    /// [`run_script`](Self::run_script) for a script that raises a fencing counter (an
    /// election's claim): its reply counts once the replicas have the write, with confirmation
    /// on (see `confirm`), as a raise by itself does.
    pub(crate) async fn run_script_confirmed(
        self: Arc<Self>,
        script: &'static Script,
        keys: Arc<Vec<String>>,
        argv: Arc<Vec<Value>>,
        timeout: Duration,
    ) -> Result<Value, NodeError> {
        let reply = self.clone().run_script(script, keys, argv, timeout).await;
        Box::pin(self.confirmed_reply(reply, timeout)).await
    }
}
