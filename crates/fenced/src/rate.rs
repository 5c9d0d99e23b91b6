//! Rate limiters kept by the server's clock.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::rate::RateCost;
use std::time::Duration;
use tokio::time::Instant;

/// The most permits a burst may hold.
pub const MAX_BURST: u32 = 1_000_000;

/// How far ahead of now a limiter may run, `burst / rate`, at most
/// (2^40 µs, about 12.7 days): every engine counts the times exactly.
const MAX_TOLERANCE_US: u64 = 1 << 40;

/// What a rate limiter said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateDecision {
    /// The permits were granted.
    Granted,
    /// Not now: asked again after this long, the same request would be
    /// granted if nobody else takes permits meanwhile.
    RetryAfter(Duration),
}

impl RateDecision {
    /// Whether the permits were granted.
    pub fn is_granted(&self) -> bool {
        matches!(self, RateDecision::Granted)
    }
}

/// A rate limiter shared by every client of the backend: at most
/// `burst` permits at once, and `rate` a second after that, by GCRA (the
/// generic cell rate algorithm) on the **server's** clock, so clients
/// whose clocks disagree still share one limit (Redisson's
/// `RRateLimiter` reads the client's clock).
///
/// Each decision is one atomic step on the server: a script on Redis
/// (one round trip, `TIME` inside it), one statement on PostgreSQL, a
/// short transaction on MariaDB, one statement on the SQLite file (the
/// host's clock is its server's). The state is one number per name, the
/// time the limiter would be idle again; every client sharing a name
/// must give it the same rate and burst. etcd and ZooKeeper do not tell
/// a client their time, and a RedLock has no one server: there, making
/// one is refused.
///
/// A decision whose reply was lost may have been granted: as with any
/// write, only the server knows.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use fenced::RateDecision;
/// let client = fenced::Client::connect("memory://rate-doc").await?;
/// // 5 a second, up to 2 at once.
/// let api = client.rate_limiter("partner-api", 5.0, 2)?;
/// assert!(api.try_acquire(2).await?.is_granted());
/// let RateDecision::RetryAfter(wait) = api.try_acquire(1).await? else {
///     panic!("the burst is spent")
/// };
/// assert!(wait <= std::time::Duration::from_millis(200));
/// api.acquire(1).await?; // waits for it
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct RateLimiter {
    client: Client,
    name: LockName,
    /// µs between permits at the steady rate.
    interval_us: u64,
    burst: u32,
}

impl RateLimiter {
    pub(crate) fn new(client: &Client, name: &str, rate: f64, burst: u32) -> Result<RateLimiter> {
        let name = LockName::new(name)?;
        if !client.inner.backend.has_rate_limiters() {
            return Err(Error::invalid(format!(
                "{}:// has no rate limiters: they need one server whose clock every client \
                 reads (Redis, PostgreSQL, MariaDB, SQLite)",
                client.inner.backend.scheme()
            )));
        }
        if !(rate.is_finite() && (1e-6..=1e6).contains(&rate)) {
            return Err(Error::invalid(format!(
                "rate limiter {:?}: a rate of {rate} a second; it takes 0.000001 to 1000000",
                name.as_str()
            )));
        }
        if burst == 0 || burst > MAX_BURST {
            return Err(Error::invalid(format!(
                "rate limiter {:?}: a burst of {burst}; it takes 1 to {MAX_BURST}",
                name.as_str()
            )));
        }
        let interval_us = ((1e6 / rate).round() as u64).max(1);
        if interval_us.saturating_mul(u64::from(burst)) > MAX_TOLERANCE_US {
            return Err(Error::invalid(format!(
                "rate limiter {:?}: a burst of {burst} at {rate} a second lasts longer than \
                 the {} days a limiter may run ahead",
                name.as_str(),
                MAX_TOLERANCE_US / 86_400_000_000
            )));
        }
        Ok(RateLimiter {
            client: client.clone(),
            name,
            interval_us,
            burst,
        })
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// Takes `n` permits if the limit allows now; else says when to ask
    /// again. One round trip.
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for `n` = 0 or above the
    /// burst (never granted).
    pub async fn try_acquire(&self, n: u32) -> Result<RateDecision> {
        if n == 0 || n > self.burst {
            return Err(Error::invalid(format!(
                "rate limiter {:?}: {n} permits at once; it grants 1 to its burst, {}",
                self.name(),
                self.burst
            )));
        }
        let cost = RateCost {
            cost_us: self.interval_us * u64::from(n),
            tolerance_us: self.interval_us * u64::from(self.burst),
        };
        let inner = &self.client.inner;
        let wait = inner
            .write("rate_acquire", inner.backend.rate_acquire(&self.name, cost))
            .await?;
        Ok(match wait {
            None => RateDecision::Granted,
            Some(d) => RateDecision::RetryAfter(d),
        })
    }

    /// Takes `n` permits, waiting as long as the limit says.
    pub async fn acquire(&self, n: u32) -> Result<()> {
        self.acquire_until(n, None).await.map(drop)
    }

    /// Takes `n` permits if the limit allows within `timeout`; whether it
    /// did. Gives up at once when the server says the wait is longer.
    pub async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<bool> {
        // A timeout too long to count is no timeout.
        self.acquire_until(n, Instant::now().checked_add(timeout))
            .await
    }

    async fn acquire_until(&self, n: u32, until: Option<Instant>) -> Result<bool> {
        loop {
            let wait = match self.try_acquire(n).await? {
                RateDecision::Granted => return Ok(true),
                RateDecision::RetryAfter(wait) => wait,
            };
            // Waiters told the same time spread over up to one interval
            // (a refusal's wait can be 0 when computed from an older
            // state), so they do not all ask again at once.
            let spread = self.interval_us.clamp(1_000, 100_000);
            let now = Instant::now();
            let due = now.checked_add(wait);
            if let Some(u) = until
                && due.is_none_or(|d| d > u)
            {
                return Ok(false);
            }
            // At most an hour at a time (a wait no clock can count is
            // asked again then), and never past the deadline.
            let due = due.unwrap_or(now + Duration::from_secs(3600));
            let wake = due + Duration::from_micros(fastrand::u64(0..spread));
            let wake = wake
                .min(until.unwrap_or(wake))
                .min(now + Duration::from_secs(3600));
            tokio::time::sleep_until(wake).await;
        }
    }
}
