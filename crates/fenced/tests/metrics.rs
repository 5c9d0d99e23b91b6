//! What fenced reports through the `metrics` facade, read back through
//! the Prometheus exporter the example uses: every acquisition, hold,
//! request, renewal and lost signal is counted under its labels. A test
//! binary of its own: the recorder is global, and no other test may add to
//! what it counts.

#![cfg(feature = "metrics")]

use fenced::{Client, LostReason};
use std::time::Duration;

/// The value of the Prometheus line that starts with `series` (name and
/// labels), 0 if there is none.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(start_paused = true)]
async fn acquisitions_holds_requests_renewals_and_losses_are_counted() {
    // The recorder is the process's: this test has its binary to itself.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let client = Client::connect("memory://metrics-test").await.unwrap();
    let lock = client.mutex("m").unwrap();
    for _ in 0..3 {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    let busy = lock.acquire().await.unwrap();
    assert!(
        lock.clone()
            .owner(&fenced::Owner::new())
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    drop(busy);
    // A fixed lease that runs out.
    let short = client
        .mutex("short")
        .unwrap()
        .fixed_lease(Duration::from_millis(20));
    let g = short.acquire().await.unwrap();
    assert_eq!(g.lost().await, LostReason::Expired);
    drop(g);
    // One that runs out unnoticed and is dropped after: lost too.
    let g = short.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(g);
    // A renewed lease held past two of its renewals (on tokio's paused
    // clock: the renewals come when due, however loaded the machine).
    let renewed = client
        .mutex("renewed")
        .unwrap()
        .lease(Duration::from_millis(300));
    let g = renewed.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(g.is_held(), "renewals keep it past its lease");
    drop(g);
    client.close().await;

    let text = metrics.render();
    let m = |series: &str| value(&text, series);
    let wait = "fenced_acquire_wait_seconds_count";
    assert_eq!(
        m(&format!("{wait}{{backend=\"memory\",outcome=\"granted\"}}")),
        7.0,
        "{text}"
    );
    assert_eq!(
        m(&format!("{wait}{{backend=\"memory\",outcome=\"busy\"}}")),
        1.0,
        "{text}"
    );
    let holds = "fenced_hold_seconds_count";
    assert_eq!(
        m(&format!("{holds}{{backend=\"memory\",end=\"released\"}}")),
        5.0,
        "{text}"
    );
    assert_eq!(
        m(&format!("{holds}{{backend=\"memory\",end=\"lost\"}}")),
        2.0,
        "{text}"
    );
    assert_eq!(
        m("fenced_lost_total{backend=\"memory\",reason=\"expired\"}"),
        2.0,
        "{text}"
    );
    let attempts = "fenced_requests_total{backend=\"memory\",op=\"attempt\",result=\"ok\"}";
    // At least one a grant (a try may meet a release still on its way).
    assert!(m(attempts) >= 8.0, "{text}");
    assert!(!text.contains("lock=\""), "lock names are never labels");
    assert!(
        m("fenced_requests_total{backend=\"memory\",op=\"release\",result=\"ok\"}") >= 4.0,
        "{text}"
    );
    // Held past its lease: only renewals kept it.
    assert!(
        m("fenced_renewals_total{backend=\"memory\",result=\"renewed\"}") >= 2.0,
        "{text}"
    );
    assert!(
        m("fenced_renewal_margin_seconds_count{backend=\"memory\"}") >= 2.0,
        "{text}"
    );
}
