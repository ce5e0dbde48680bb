//! The campaigns' observers, shared by the elections of one `Redlock`: one per resource and
//! priority.
//!
//! A campaign follows the leader's priority and the requests to yield through an observer of
//! the campaigns' channel (see `Redlock::observe_as`): a subscriber connection per node and a
//! read of every node to start. Every `Election` of one `Redlock` on the same resource and
//! priority shares one, and it stays open [`LINGER`] after the last of them ends: a leader that
//! resigns after its job and campaigns again (a new `Election`) finds it subscribed and up to
//! date, and sends nothing to start (about 27 commands per term with 3 nodes: the connections'
//! `CLIENT ID`, `PING`, `SUBSCRIBE` and `QUIT`, and the first read). `Redlock::close` closes the
//! ones no election uses.
//!
//! Owns: the registry of shared campaign observers. Must not: read or write the election.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::base::error::Result;
use crate::primitives::leader::ElectionState;
use crate::primitives::observe::Observer;
use crate::rounds::redlock::Redlock;

/// How long a campaign observer that no election uses stays open.
pub(crate) const LINGER: Duration = Duration::from_secs(10);

/// Locks a mutex, a poisoned one included (its data is a plain value).
pub(crate) fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A resource and a campaign priority.
type Key = (String, u32);

/// The next entry's id.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The shared campaign observers of one `Redlock` (kept in its `campaigns` slot).
#[derive(Clone, Default)]
pub(crate) struct CampaignObservers(Arc<Mutex<HashMap<Key, Entry>>>);

struct Entry {
    observer: Arc<Observer>,
    /// Tells this entry from a later one for the same key (see `take_up`).
    id: u64,
    /// The elections using it.
    users: usize,
    /// Counts the times `users` fell to 0: a linger timer closes the observer only if no
    /// election took it up since the timer started.
    idled: u64,
}

/// One election's use of a shared campaign observer. Dropping it lets the observer go, once
/// no election took it up for [`LINGER`].
pub(crate) struct CampaignView {
    state: watch::Receiver<ElectionState>,
    key: Key,
    /// The entry it uses.
    id: u64,
    registry: CampaignObservers,
}

impl CampaignView {
    /// The campaign's view of the election (the leader's priority, requests to yield).
    pub(crate) fn state(&self) -> watch::Receiver<ElectionState> {
        self.state.clone()
    }
}

impl Drop for CampaignView {
    fn drop(&mut self) {
        self.registry.release(&self.key, self.id);
    }
}

impl Redlock {
    /// The campaign observer of `resource` for candidates of `priority`: the one an election of
    /// this `Redlock` uses or left less than [`LINGER`] ago, else a new one (see
    /// [`observe_as`](Self::observe_as)).
    ///
    /// Cancellation: dropping the future closes what it opened.
    pub(crate) async fn campaign_observer(
        &self,
        resource: &str,
        priority: u32,
    ) -> Result<CampaignView> {
        let registry = self.inner.campaigns.get_or_replace(
            |_: &CampaignObservers| true,
            || {
                let registry = CampaignObservers::default();
                let idle = registry.clone();
                self.inner.on_close(Box::new(move || idle.close_unused()));
                registry
            },
        );
        let key = (resource.to_string(), priority);
        if let Some(view) = registry.take_up(&key) {
            return Ok(view);
        }
        let observer = self.observe_as(resource, Some(priority)).await?;
        Ok(registry.insert(key, Arc::new(observer)))
    }
}

impl CampaignObservers {
    /// A view of the observer for `key`, if there is one still running (one left by a runtime
    /// that shut down, with its linger timer, is dropped).
    fn take_up(&self, key: &Key) -> Option<CampaignView> {
        let mut map = locked(&self.0);
        if map.get(key).is_some_and(|e| !e.observer.is_running()) {
            map.remove(key);
        }
        let entry = map.get_mut(key)?;
        entry.users += 1;
        Some(self.view(key.clone(), entry))
    }

    /// Registers `observer` for `key` and a view of it; when another election registered one
    /// meanwhile, a view of that one (and `observer` closes as it drops).
    fn insert(&self, key: Key, observer: Arc<Observer>) -> CampaignView {
        let mut map = locked(&self.0);
        let entry = map.entry(key.clone()).or_insert_with(|| Entry {
            observer,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            users: 0,
            idled: 0,
        });
        entry.users += 1;
        self.view(key, entry)
    }

    fn view(&self, key: Key, entry: &Entry) -> CampaignView {
        CampaignView {
            state: entry.observer.state(),
            key,
            id: entry.id,
            registry: self.clone(),
        }
    }

    /// An election stopped using entry `id` for `key`: the last one starts its linger.
    fn release(&self, key: &Key, id: u64) {
        let idled = {
            let mut map = locked(&self.0);
            let Some(entry) = map.get_mut(key).filter(|e| e.id == id) else {
                return;
            };
            entry.users = entry.users.saturating_sub(1);
            if entry.users > 0 {
                return;
            }
            entry.idled = entry.idled.wrapping_add(1);
            entry.idled
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime to time the linger (it is shutting down): closed now.
            let gone = locked(&self.0).remove(key);
            drop(gone);
            return;
        };
        let (registry, key) = (self.clone(), key.clone());
        rt.spawn(async move {
            tokio::time::sleep(LINGER).await;
            let gone = {
                let mut map = locked(&registry.0);
                match map.get(&key) {
                    Some(e) if e.users == 0 && e.idled == idled => map.remove(&key),
                    _ => None,
                }
            };
            // Dropped outside the lock: the observer's connections close in the background.
            drop(gone);
        });
    }

    /// Closes every observer that no election uses (the `Redlock` is closing).
    fn close_unused(&self) {
        let unused: Vec<Entry> = {
            let mut map = locked(&self.0);
            let keys: Vec<Key> = map
                .iter()
                .filter(|(_, e)| e.users == 0)
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        drop(unused);
    }
}
