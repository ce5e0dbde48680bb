//! Many locks' extensions on one node at once (a keepalive batch): one script call per TTL
//! among the locks (and per hash slot on a cluster node), each lock answered on its own. Only
//! where this node's user may not run scripts (and the server has `SET ... IFEQ`): one
//! pipeline of a `SET ... IFEQ` per lock, written together under one deadline (see `native`).
//!
//! Owns: grouping a batch's locks into script calls and their arguments, and spreading the
//! answers back per lock.
//! Must not: decide which locks are renewed or when (renewal), decode a reply by hand (reply),
//! or count votes across nodes (quorum).

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::Value;

use crate::base::error::Vote;
use crate::base::reply;
use crate::nodes::batch::Held;
use crate::nodes::node::{all, Node};

/// One lock's share of a batched extension (see [`Node::extend_many`]): its keys and token, and
/// the TTL to set.
#[derive(Debug)]
pub(crate) struct Extension {
    pub(crate) held: Arc<Held>,
    pub(crate) ttl_ms: u64,
}

/// Part of a batched extension that one script call carries: a lock (its index in the batch)
/// and which of its keys (`None`: all of them; on a cluster node, one hash slot's share).
type Part = (usize, Option<Vec<usize>>);

impl Node {
    /// Extends many locks at once: per lock, what [`extend`](Self::extend) does for one (reset
    /// every key's TTL if all still hold its token, never re-create a key), with one script call
    /// per TTL among the locks (usually one) on a single server, and one per TTL and hash slot
    /// on a cluster node (a cluster script stays in one slot; a lock whose keys span slots is
    /// granted only if every slot granted). Where this user may not run scripts: one pipeline
    /// of `SET ... IFEQ` (see `native`). Returns one vote per lock, in batch order; a call
    /// that failed (a timeout, a reset connection) fails every lock it carried, and one lock's
    /// bad key (WRONGTYPE) fails that lock alone.
    ///
    /// Cancellation: as [`extend`](Self::extend): a call already handed to fred still runs, and
    /// only ever extends keys that still hold their lock's token.
    pub(crate) async fn extend_many(
        self: Arc<Self>,
        batch: Arc<Vec<Extension>>,
        timeout: Duration,
    ) -> Vec<Vote> {
        if let Err(e) = self.state.counts() {
            return vec![Vote::Failed(e); batch.len()];
        }
        if let Some(mut votes) = self.extend_many_native(&batch, timeout).await {
            self.confirm_all(&mut votes, timeout).await;
            return votes;
        }
        // An election's term alone, announcing its new TTL to observers (see `extend`).
        let announced: Vec<usize> = (0..batch.len())
            .filter(|&j| self.announced(&batch[j].held).is_some())
            .collect();
        // One script per TTL (and, on a cluster, per hash slot); a lock's keys may span slots.
        let mut groups: Vec<(u64, Vec<Part>)> = Vec::new();
        let mut index: std::collections::HashMap<(u64, u16), usize> = Default::default();
        let mut add = |ttl_ms: u64, slot: u16, part: Part| {
            let g = *index.entry((ttl_ms, slot)).or_insert_with(|| {
                groups.push((ttl_ms, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push(part);
        };
        for (j, x) in batch.iter().enumerate() {
            if announced.contains(&j) {
                continue;
            }
            let slot_of = |i: usize| match self.is_cluster() {
                true => x
                    .held
                    .keys
                    .get(i)
                    .map_or(0, |k| crate::base::slots::slot(k)),
                false => 0,
            };
            match self.slot_groups(&x.held.keys) {
                None => add(x.ttl_ms, slot_of(0), (j, None)),
                Some(slot_groups) => {
                    for g in slot_groups {
                        let slot = g.first().map_or(0, |&i| slot_of(i));
                        add(x.ttl_ms, slot, (j, Some(g)));
                    }
                }
            }
        }
        let alone = futures::future::join_all(announced.iter().map(|&j| {
            let x = &batch[j];
            self.clone()
                .extend_unconfirmed(x.held.clone(), x.ttl_ms, timeout)
        }));
        let this = &*self;
        let batch = &*batch;
        let grouped = futures::future::join_all(
            groups
                .iter()
                .map(|(ttl_ms, parts)| this.extend_parts(batch, *ttl_ms, parts, timeout)),
        );
        let (alone, answers) = futures::future::join(alone, grouped).await;
        let mut per_lock: Vec<Vec<Vote>> = vec![Vec::new(); batch.len()];
        for (&j, vote) in announced.iter().zip(alone) {
            per_lock[j].push(vote);
        }
        for ((_, parts), votes) in groups.iter().zip(answers) {
            for ((j, _), vote) in parts.iter().zip(votes) {
                per_lock[*j].push(vote);
            }
        }
        let mut votes: Vec<Vote> = per_lock
            .into_iter()
            .map(|votes| match votes.is_empty() {
                // Never: every lock has a key. But no answer is never a grant.
                true => Vote::Failed(self.unexpected("answer")),
                false => all(votes),
            })
            .collect();
        self.confirm_all(&mut votes, timeout).await;
        votes
    }

    /// One `WAIT` confirms every extension of a batch (see `confirm`).
    async fn confirm_all(&self, votes: &mut [Vote], timeout: Duration) {
        if self.confirm.is_some() && votes.contains(&Vote::Granted) {
            let confirmed = self.confirmed(Vote::Granted, timeout).await;
            for vote in votes.iter_mut().filter(|v| **v == Vote::Granted) {
                *vote = confirmed.clone();
            }
        }
    }

    /// On a single server whose user may not run scripts but has `SET ... IFEQ`, with only
    /// one-key locks in `batch`: one pipeline of a command per lock (see `native`). `None`
    /// wherever scripts may run: there the batched script does it in ONE call, where a
    /// command per lock costs the client a message, a timer and a wake-up per lock.
    async fn extend_many_native(
        &self,
        batch: &[Extension],
        timeout: Duration,
    ) -> Option<Vec<Vote>> {
        let client = self.client()?;
        if !self.state.caps.lua_free_only() {
            return None;
        }
        let items: Vec<_> = batch.iter().map(|x| (x.held.clone(), x.ttl_ms)).collect();
        let keys = batch
            .iter()
            .flat_map(|x| x.held.keys.iter().cloned())
            .collect();
        let (client, state) = (client.clone(), self.state.clone());
        let count = items.len();
        let work = move |timeout| -> crate::nodes::batch::Boxed<_> {
            Box::pin(async move {
                let items = items
                    .iter()
                    .map(|(held, ttl_ms)| (held.keys.as_slice(), held.value.as_str(), *ttl_ms));
                crate::nodes::native::extend_many(&client, &state, items, timeout).await
            })
        };
        let replies = self
            .in_order(keys, timeout, work, |e| Some(vec![Err(e); count]))
            .await?;
        Some(
            replies
                .into_iter()
                .map(|r| reply::set_nx(&self.name, r))
                .collect(),
        )
    }

    /// One batched extend script over `parts` of `batch`, all with `ttl_ms`: one vote per part.
    async fn extend_parts(
        &self,
        batch: &[Extension],
        ttl_ms: u64,
        parts: &[Part],
        timeout: Duration,
    ) -> Vec<Vote> {
        let scripts = crate::base::scripts::Scripts::get();
        let count = |(j, idx): &Part| idx.as_ref().map_or(batch[*j].held.keys.len(), Vec::len);
        let key_count: usize = parts.iter().map(count).sum();
        let reply = self
            .eval_with(&scripts.extend_many, timeout, |first| {
                let mut args = Vec::with_capacity(3 + 2 * key_count);
                args.push(Value::from(first));
                args.push(Value::Integer(key_count as i64));
                for (j, idx) in parts {
                    let keys = &batch[*j].held.keys;
                    match idx {
                        None => args.extend(keys.iter().map(|k| Value::from(k.as_str()))),
                        Some(idx) => {
                            args.extend(idx.iter().map(|&i| Value::from(keys[i].as_str())))
                        }
                    }
                }
                args.push(Value::Integer(ttl_ms as i64));
                for part in parts {
                    let token = batch[part.0].held.value.as_str();
                    args.extend((0..count(part)).map(|_| Value::from(token)));
                }
                args
            })
            .await;
        reply::extended_many(&self.name, reply, parts.len())
    }
}
