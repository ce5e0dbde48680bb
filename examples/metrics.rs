//! fredlock's metrics in Prometheus' text format: take, contend for, extend and release a few
//! locks on local nodes, then print what a `/metrics` endpoint would serve.
//!
//! ```text
//! cargo run --example metrics --features metrics
//! ```
//!
//! fredlock only calls the `metrics` facade; the exporter is the application's choice. Here it
//! is `metrics-exporter-prometheus`, rendering to a string (a service would serve it over HTTP,
//! for example with that crate's `http-listener` feature).

use std::time::Duration;

use fredlock::Redlock;
use fredlock_testkit::LocalNodes;
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let nodes = LocalNodes::start(3).await?; // three local redis-server processes
    let redlock = Redlock::builder().nodes(nodes.urls()).build().await?;

    let ttl = Duration::from_secs(5);
    for i in 0..20 {
        let mut lock = redlock.acquire(format!("orders:{}", i % 4), ttl).await?;
        if i % 5 == 0 {
            lock.extend(ttl).await?;
            // Someone else wants it meanwhile: contended.
            let other = redlock
                .try_acquire(format!("orders:{}", i % 4), ttl)
                .await?;
            assert!(other.is_none());
        }
        lock.release().await?;
    }
    redlock.close().await;
    print!("{}", prometheus.render());
    Ok(())
}
