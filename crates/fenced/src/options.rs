//! Per-lock options: lease, renewal, fairness, waiting, retries, owner.

use crate::core::retry::RetryPolicy;
use crate::error::{Error, Result};
use crate::owner::Owner;
use std::time::Duration;

/// Redisson's default lease, renewed every third of it by the watchdog.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest lease fenced accepts.
pub const MIN_LEASE: Duration = Duration::from_millis(1);
pub use crate::spi::lease::MAX_LEASE;
/// The most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 1_000_000;

/// How a hold's lease is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Lease {
    /// The lease is renewed every third of its length by the client's
    /// watchdog for as long as the guard lives (Redisson's default).
    Renewed(Duration),
    /// The lease runs out after this long whatever the holder does; the
    /// guard's lost signal fires then.
    Fixed(Duration),
}

impl Lease {
    /// The lease's length.
    pub fn duration(self) -> Duration {
        match self {
            Lease::Renewed(d) | Lease::Fixed(d) => d,
        }
    }

    /// True when the watchdog renews it.
    pub fn is_renewed(self) -> bool {
        matches!(self, Lease::Renewed(_))
    }

    pub(crate) fn validate(self) -> Result<()> {
        let d = self.duration();
        if d < MIN_LEASE {
            return Err(Error::invalid(format!(
                "lease {d:?} is shorter than the minimum of {MIN_LEASE:?}"
            )));
        }
        if d > MAX_LEASE {
            return Err(Error::invalid(format!(
                "lease {d:?} is longer than the maximum of {MAX_LEASE:?}"
            )));
        }
        Ok(())
    }
}

/// Options of one lock handle; set through the builder methods of
/// [`Lock`](crate::Lock).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LockOptions {
    pub(crate) lease: Lease,
    pub(crate) fair: bool,
    pub(crate) wait_timeout: Option<Duration>,
    pub(crate) retry: RetryPolicy,
    pub(crate) owner: Option<Owner>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            lease: Lease::Renewed(DEFAULT_LEASE),
            fair: false,
            wait_timeout: None,
            retry: RetryPolicy::default(),
            owner: None,
        }
    }
}

impl LockOptions {
    pub(crate) fn validate(&self) -> Result<()> {
        self.lease.validate()?;
        self.retry.validate()
    }

    /// The lease.
    pub fn lease(&self) -> Lease {
        self.lease
    }

    /// Whether waiters are served first come, first served.
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// How long [`Lock::acquire`](crate::Lock::acquire) waits; `None` is for ever.
    pub fn wait_timeout(&self) -> Option<Duration> {
        self.wait_timeout
    }
}
