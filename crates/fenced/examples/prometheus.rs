//! fenced's metrics in Prometheus's text format: install a recorder (here
//! `metrics-exporter-prometheus`), use locks, and serve what it renders at
//! `/metrics` with the HTTP server the application already has.
//!
//! ```sh
//! cargo run -p fenced --example prometheus                  # memory://
//! FENCED_BACKEND=redis://127.0.0.1:6379 cargo run -p fenced --features redis --example prometheus
//! ```

use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let url = std::env::var("FENCED_BACKEND").unwrap_or_else(|_| "memory://".to_owned());
    let client = fenced::Client::connect(&url).await?;
    let lock = client.mutex("nightly-report")?;
    for _ in 0..3 {
        let guard = lock.acquire().await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
        guard.release().await?;
    }
    client.close().await;
    // A web handler would answer GET /metrics with this.
    print!("{}", metrics.render());
    Ok(())
}
