//! Work a node still has to do after its caller stopped waiting: the rest of a script whose
//! round decided without this node (the `EVAL` that follows a late `NOSCRIPT`), counted so that
//! closing the node waits for it instead of sending `QUIT` ahead of it.
//!
//! Must not: send anything itself; it only counts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long [`Busy::idle`] waits at most: far above a command's own timeout (500 ms at most
/// by default), so only a node that stopped answering makes `close` give up waiting on it.
pub(crate) const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// The count of a node's unfinished work (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Busy {
    running: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One piece of unfinished work, counted until dropped.
#[derive(Debug)]
pub(crate) struct Working(Arc<Busy>);

impl Busy {
    /// Counts one piece of work until the returned guard drops.
    pub(crate) fn enter(self: &Arc<Self>) -> Working {
        self.running.fetch_add(1, Ordering::AcqRel);
        Working(self.clone())
    }

    /// Resolves once nothing is counted, or after `bound`; `false` when the bound passed.
    pub(crate) async fn idle(&self, bound: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.idle.notified();
                tokio::pin!(idle);
                idle.as_mut().enable();
                if self.running.load(Ordering::Acquire) == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(bound, wait).await.is_ok()
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_waits_for_every_guard() {
        let busy = Arc::new(Busy::default());
        assert!(busy.idle(Duration::ZERO).await, "nothing counted");
        let (a, b) = (busy.enter(), busy.enter());
        assert!(!busy.idle(Duration::from_millis(1)).await, "two running");
        drop(a);
        let waiter = tokio::spawn({
            let busy = busy.clone();
            async move { busy.idle(Duration::from_secs(60)).await }
        });
        drop(b);
        assert!(waiter.await.unwrap(), "woken by the last guard");
    }
}
