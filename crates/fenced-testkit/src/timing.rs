//! One scale for every time bound in the tests (Curator's `Timing`).

use std::time::Duration;

/// Scales the test suite's time bounds: set `FENCED_TEST_TIMING=3` on a
/// slow or loaded machine. Bounds are liveness limits ("acquired within"),
/// never speed assertions.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    scale: f64,
}

impl Default for Timing {
    fn default() -> Self {
        let scale = std::env::var("FENCED_TEST_TIMING")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .unwrap_or(1.0);
        Timing { scale }
    }
}

impl Timing {
    /// `ms` milliseconds, scaled.
    pub fn ms(&self, ms: u64) -> Duration {
        Duration::from_millis(ms).mul_f64(self.scale)
    }

    /// A generous bound for "this must happen": 10 s, scaled.
    pub fn eventually(&self) -> Duration {
        self.ms(10_000)
    }

    /// Re-checks `cond` every 10 ms (scaled) until it holds; panics with
    /// `what` if it has not within [`eventually`](Timing::eventually). For
    /// state that changes in the background (a child process taking a
    /// lock, a withdrawal in the release worker), never for speed.
    pub async fn wait_until<F, Fut>(&self, what: &str, mut cond: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + self.eventually();
        while !cond().await {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(self.ms(10)).await;
        }
    }

    /// Runs `op` until it returns something other than an `Unavailable`
    /// error (a server restarting, a failover under way), pausing 100 ms
    /// (scaled) between tries; panics on another error or after
    /// [`eventually`](Timing::eventually).
    pub async fn until_available<T, F, Fut>(&self, what: &str, mut op: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = fenced::Result<T>>,
    {
        let deadline = tokio::time::Instant::now() + self.eventually();
        loop {
            match op().await {
                Ok(v) => return v,
                Err(e) if e.kind() == fenced::ErrorKind::Unavailable => {
                    assert!(tokio::time::Instant::now() < deadline, "{what}: {e}");
                    tokio::time::sleep(self.ms(100)).await;
                }
                Err(e) => panic!("{what}: {e}"),
            }
        }
    }
}
