//! What an operator or an inspection asks one node about locks it need not hold: who holds a
//! key (INSPECT, or GET and PTTL where scripts are denied), several keys read at once, and a
//! forced delete.
//!
//! Owns: the arguments of these reads and of the forced delete.
//! Must not: decode a reply by hand (reply), judge what a holder means (ops), or poke a wait
//! line (the caller does, see `node_gate`).

use std::sync::Arc;
use std::time::Duration;

use crate::base::error::{NodeError, NodeErrorKind};
use crate::base::reply;
use crate::base::scripts::Script;
use crate::nodes::batch::Held;
use crate::nodes::node::{Backend, Node};

impl Node {
    /// Reads several keys atomically: per key `Some((value, pttl_ms))`, or `None` when absent.
    pub(crate) async fn view(
        self: Arc<Self>,
        keys: Arc<Vec<String>>,
        timeout: Duration,
    ) -> Result<Vec<Option<(String, i64)>>, NodeError> {
        if let Err(e) = self.state.counts() {
            if e.kind == NodeErrorKind::Duplicate {
                return Err(e);
            }
        }
        let (this, keys) = (&*self, &*keys);
        let view = |idx: Vec<usize>| async move {
            let scripts = crate::base::scripts::Scripts::get();
            let refs: Vec<&str> = idx.iter().map(|&i| keys[i].as_str()).collect();
            let reply = this
                .script_on(&scripts.view_many, &refs, &[], timeout)
                .await;
            reply::views(&this.name, reply, idx.len()).map(|v| (idx, v))
        };
        let Some(groups) = self.slot_groups(keys) else {
            return view((0..keys.len()).collect()).await.map(|(_, v)| v);
        };
        let mut out = vec![None; keys.len()];
        for part in futures::future::join_all(groups.into_iter().map(view)).await {
            let (idx, views) = part?;
            for (i, v) in idx.into_iter().zip(views) {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// Who holds `key` here: `Some((value, pttl_ms))`, or `None` when the key does not exist.
    pub(crate) async fn inspect(
        self: Arc<Self>,
        key: String,
        timeout: Duration,
    ) -> Result<Option<(String, i64)>, NodeError> {
        // Where scripts are denied but plain locks work: GET and PTTL (see `native`).
        if let (Backend::Server(client), true) = (&self.backend, self.state.caps.lua_free_only()) {
            if let Err(e) = self.state.counts() {
                if e.kind == NodeErrorKind::Duplicate {
                    return Err(e);
                }
            }
            let (client, state, keys) = (client.clone(), self.state.clone(), vec![key.clone()]);
            let work = move |timeout| -> crate::nodes::batch::Boxed {
                Box::pin(async move {
                    crate::nodes::native::inspect(&client, &state, &key, timeout).await
                })
            };
            let reply = self.in_order(keys, timeout, work, Err).await;
            return reply::holder(&self.name, reply);
        }
        // INSPECT takes no ARGV, but `script` always appends the value; Redis ignores it.
        let scripts = crate::base::scripts::Scripts::get();
        self.holder_script(&scripts.inspect, key, None, timeout)
            .await
    }

    /// Deletes `key` here whoever holds it, and says what it held: `Some((value, pttl_ms))`, or
    /// `None` when there was no key. (The caller pokes the key's wait line, see `leave_line`.)
    pub(crate) async fn force_delete(
        self: Arc<Self>,
        key: String,
        timeout: Duration,
    ) -> Result<Option<(String, i64)>, NodeError> {
        let scripts = crate::base::scripts::Scripts::get();
        self.holder_script(&scripts.force_break, key, None, timeout)
            .await
    }

    /// A script on one key that answers with its holder (INSPECT, FORCE_BREAK). A duplicate
    /// entry answers its duplicate error (an operator must see it); other nodes not identified
    /// yet are still asked.
    async fn holder_script(
        &self,
        script: &Script,
        key: String,
        extra: Option<u64>,
        timeout: Duration,
    ) -> Result<Option<(String, i64)>, NodeError> {
        if let Err(e) = self.state.counts() {
            if e.kind == NodeErrorKind::Duplicate {
                return Err(e);
            }
        }
        let held = Held {
            keys: vec![key],
            value: String::new(),
            custom: false,
            resources: Vec::new(),
            fence_keys: Vec::new(),
            line: None,
            repairs: Default::default(),
            wire: Default::default(),
            announce: Default::default(),
            batched: Default::default(),
        };
        let reply = self.script(script, &held, extra, timeout).await;
        reply::holder(&self.name, reply)
    }
}
