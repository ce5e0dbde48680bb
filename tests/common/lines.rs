//! The wait lines as the tests see them: a resource's line on its gate, and a probe of
//! fredlock's own events (a test's way to act exactly between two steps of an acquire).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fredlock_testkit::{LocalNodes, RespValue};
use tracing_subscriber::layer::SubscriberExt;

use super::eventually;

/// A function to run on the first event with a message.
pub type Hook = (String, Box<dyn FnOnce() + Send>);

/// Counts fredlock's retry-loop events by message, and runs a hook on the first event with a
/// given message (synchronously, on the thread that emitted it: exactly between two steps).
#[derive(Clone, Default)]
pub struct Probe {
    counts: Arc<Mutex<std::collections::HashMap<String, usize>>>,
    hook: Arc<Mutex<Option<Hook>>>,
}

impl Probe {
    pub fn count(&self, message: &str) -> usize {
        self.counts
            .lock()
            .unwrap()
            .get(message)
            .copied()
            .unwrap_or(0)
    }
    /// Every message seen so far, with its count.
    pub fn counts(&self) -> std::collections::HashMap<String, usize> {
        self.counts.lock().unwrap().clone()
    }
    pub fn on_first(&self, message: &str, f: impl FnOnce() + Send + 'static) {
        *self.hook.lock().unwrap() = Some((message.to_string(), Box::new(f)));
    }
    /// Installs the probe for this thread (use a current-thread runtime: every task runs here).
    ///
    /// Also installs, once per test binary, a global subscriber that wants fredlock's events
    /// (it only counts them): tracing caches each callsite's interest from the subscribers that
    /// exist when a thread first hits it, so a thread with no subscriber at all (another test,
    /// or a "process" of this test running in a thread of its own) could otherwise mark a
    /// callsite as wanted by nobody, and this probe would never see its events (seen: a waiter's
    /// "attempt failed" went unseen, 1 round in 10 with both cores busy).
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        static GLOBAL: std::sync::Once = std::sync::Once::new();
        GLOBAL.call_once(|| {
            let everyone = tracing_subscriber::registry().with(Probe::default());
            let _ = tracing::subscriber::set_global_default(everyone);
        });
        let subscriber = tracing_subscriber::registry().with(self.clone());
        let guard = tracing::subscriber::set_default(subscriber);
        // Other tests of this binary may have hit fredlock's callsites first, with no
        // subscriber: make them ask again, or this probe may never see its events.
        tracing::callsite::rebuild_interest_cache();
        guard
    }
}

struct Message(Option<String>);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Probe {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if !event.metadata().target().starts_with("fredlock") {
            return;
        }
        let mut m = Message(None);
        event.record(&mut m);
        let Some(message) = m.0 else {
            return;
        };
        *self
            .counts
            .lock()
            .unwrap()
            .entry(message.clone())
            .or_default() += 1;
        let hook = {
            let mut hook = self.hook.lock().unwrap();
            match hook.as_ref() {
                Some((on, _)) if *on == message => hook.take(),
                _ => None,
            }
        };
        if let Some((_, f)) = hook {
            f();
        }
    }
}

/// The wait line of `resource` on its gate: the members, head first (ZRANGE).
pub async fn line_members(
    nodes: &LocalNodes,
    redlock: &fredlock::Redlock,
    resource: &str,
) -> Vec<String> {
    let gate = redlock.line_node(resource).expect("a gate");
    let line = line_key(redlock, resource);
    match nodes
        .command(gate, &["ZRANGE", &line, "0", "-1"])
        .await
        .unwrap()
    {
        RespValue::Array(Some(v)) => v
            .into_iter()
            .filter_map(|m| match m {
                RespValue::Bulk(Some(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The key of `resource`'s wait line (`<prefix>~line:{<lock key>}`).
pub fn line_key(redlock: &fredlock::Redlock, resource: &str) -> String {
    format!("{}~line:{{{}}}", redlock.key(""), redlock.key(resource))
}

/// Waits until `resource`'s line has `n` members.
pub async fn line_has(
    nodes: &LocalNodes,
    redlock: &fredlock::Redlock,
    resource: &str,
    n: usize,
) -> bool {
    eventually(Duration::from_secs(5), || async {
        line_members(nodes, redlock, resource).await.len() == n
    })
    .await
}

/// The commands clients sent to node `i` since its slow log was reset (with every command
/// logged: `slowlog-log-slower-than 0`), oldest first, each as its name and arguments.
pub async fn sent_commands(nodes: &LocalNodes, i: usize) -> Vec<Vec<String>> {
    let log = nodes.command(i, &["SLOWLOG", "GET", "1024"]).await.unwrap();
    let RespValue::Array(Some(entries)) = log else {
        panic!("SLOWLOG GET: {log:?}");
    };
    let text = |v: &RespValue| match v {
        RespValue::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
        RespValue::Simple(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let mut sent: Vec<Vec<String>> = entries
        .iter()
        .filter_map(|e| match e {
            RespValue::Array(Some(fields)) => match fields.get(3) {
                Some(RespValue::Array(Some(args))) => Some(args.iter().map(text).collect()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    sent.reverse();
    sent
}
