//! A node that refuses our credentials (`requirepass` set, no password in its URL): the fleet
//! has lost fault tolerance, and it must not be silent. The node is logged at WARN level once
//! per change of its state, with the server's words; when it accepts us again that is logged
//! too (`build()` failing when no quorum accepts them is in `tests/errors.rs`). Before, a
//! lone refusing node was logged only by `build()`, and its recovery not at all.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, unique};
use fredlock::Redlock;
use fredlock_testkit::LocalNodes;
use tracing_subscriber::layer::SubscriberExt;

const SECRET: &str = "credentials-test-secret";

/// One event: its level and its fields, as text.
type Event = (tracing::Level, HashMap<String, String>);

/// Counts fredlock's WARN and INFO events per node, with their text.
#[derive(Clone, Default)]
struct Probe {
    events: Arc<Mutex<Vec<Event>>>,
}

impl Probe {
    /// Events of `level` about `node`.
    fn about(&self, level: tracing::Level, node: &str) -> Vec<HashMap<String, String>> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, f)| *l == level && f.get("node").map(String::as_str) == Some(node))
            .map(|(_, f)| f.clone())
            .collect()
    }
}

struct Fields(HashMap<String, String>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Probe {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if !event.metadata().target().starts_with("fredlock") {
            return;
        }
        let mut fields = Fields(HashMap::new());
        event.record(&mut fields);
        self.events
            .lock()
            .unwrap()
            .push((*event.metadata().level(), fields.0));
    }
}

/// Takes the password off node `i` (authenticating first, on the same connection).
async fn unset_password(nodes: &LocalNodes, i: usize) {
    let replies = fredlock_testkit::resp_pipeline(
        nodes.addr(i),
        &[&["AUTH", SECRET], &["CONFIG", "SET", "requirepass", ""]],
        Duration::from_secs(5),
    )
    .await
    .expect("AUTH, CONFIG SET");
    assert!(!format!("{replies:?}").contains("ERR"), "{replies:?}");
}

/// The only test of this binary: the probe is this thread's subscriber, and no other test
/// may have made fredlock's callsites uninterested first. Current-thread runtime: every task (the connections' too) runs on the thread the probe is
/// installed on.
#[tokio::test]
async fn a_node_refusing_credentials_is_logged_once_per_change() {
    let probe = Probe::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(probe.clone()));
    tracing::callsite::rebuild_interest_cache();

    let nodes = LocalNodes::start(3).await.expect("nodes");
    nodes
        .command(2, &["CONFIG", "SET", "requirepass", SECRET])
        .await
        .expect("requirepass");
    let redlock = Redlock::builder()
        .nodes(nodes.urls())
        .build()
        .await
        .expect("a quorum accepts the credentials");
    let refusing = redlock.node_names()[2].clone();
    assert!(
        eventually(Duration::from_secs(5), || async {
            !probe.about(tracing::Level::WARN, &refusing).is_empty()
        })
        .await,
        "no warning about {refusing}: {:?}",
        probe.events.lock().unwrap()
    );
    let warned = probe.about(tracing::Level::WARN, &refusing);
    let cause = warned[0].get("cause").cloned().unwrap_or_default();
    assert!(cause.contains("NOAUTH"), "{warned:?}");
    // The node keeps refusing while the connection retries (about 7 times in 2.5 s: 20 ms
    // doubling to 1 s): still one warning, since its state did not change.
    let lock = redlock
        .acquire(unique("still-works").as_str(), Duration::from_secs(5))
        .await
        .expect("2 of 3 nodes grant");
    lock.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        probe.about(tracing::Level::WARN, &refusing).len(),
        1,
        "{:?}",
        probe.about(tracing::Level::WARN, &refusing)
    );
    // Accepted again: said once, at INFO.
    unset_password(&nodes, 2).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            !probe.about(tracing::Level::INFO, &refusing).is_empty()
        })
        .await,
        "no word that {refusing} is usable again"
    );
    redlock.close().await;
}
