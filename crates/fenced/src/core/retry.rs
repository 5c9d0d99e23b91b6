//! Retry policies for operations that fail transiently.
//!
//! These are Curator's four policies from the seeds (exponential backoff,
//! N times, until elapsed, one time) plus `never`. Every backend uses them
//! the same way: an acquisition or renewal that meets an
//! [`Unavailable`](crate::ErrorKind::Unavailable) error asks the policy
//! whether, and after how long, to try again.

use crate::error::{Error, Result};
use crate::spi::lease::{MAX_LEASE, jitter};
use std::time::Duration;

/// The shortest pause between retries a policy that retries more than
/// once may have.
pub const MIN_RETRY_PAUSE: Duration = Duration::from_millis(1);
/// The longest pause between retries a policy may have.
pub const MAX_RETRY_PAUSE: Duration = Duration::from_secs(3600);

/// When to retry an operation that failed transiently.
///
/// ```
/// use fenced::RetryPolicy;
/// use std::time::Duration;
/// let p = RetryPolicy::exponential(Duration::from_millis(50), Duration::from_secs(2), 10).unwrap();
/// // The first retry waits about 50 ms (up to 25% jitter either way) ...
/// let d = p.delay(0, Duration::ZERO).unwrap();
/// assert!(d >= Duration::from_millis(37) && d <= Duration::from_millis(63));
/// // ... and after 10 retries it gives up.
/// assert_eq!(p.delay(10, Duration::ZERO), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryPolicy {
    /// Never retry.
    Never,
    /// Retry once after `sleep`.
    OneTime {
        /// Pause before the retry.
        sleep: Duration,
    },
    /// Retry up to `times` times, `sleep` apart.
    NTimes {
        /// How many retries.
        times: u32,
        /// Pause between retries.
        sleep: Duration,
    },
    /// Retry every `sleep` until `max_elapsed` has passed since the first try.
    UntilElapsed {
        /// Give up once this much time has passed since the first try.
        max_elapsed: Duration,
        /// Pause between retries.
        sleep: Duration,
    },
    /// Retry up to `max_retries` times, doubling the pause from `base` up to
    /// `cap`, each pause jittered by ±25% so that clients that failed
    /// together do not retry together.
    Exponential {
        /// First pause.
        base: Duration,
        /// Longest pause.
        cap: Duration,
        /// How many retries.
        max_retries: u32,
    },
}

impl Default for RetryPolicy {
    /// Exponential from 50 ms to 2 s, 30 retries: rides out a server
    /// restart or a failover of a minute without hammering it.
    fn default() -> Self {
        RetryPolicy::Exponential {
            base: Duration::from_millis(50),
            cap: Duration::from_secs(2),
            max_retries: 30,
        }
    }
}

impl RetryPolicy {
    /// Exponential backoff, checked: `base` must be non-zero and at most `cap`.
    pub fn exponential(base: Duration, cap: Duration, max_retries: u32) -> Result<Self> {
        let p = RetryPolicy::Exponential {
            base,
            cap,
            max_retries,
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks the policy's numbers: a policy that retries more than once
    /// must pause between tries (at least [`MIN_RETRY_PAUSE`]: a retry loop
    /// with no pause hammers a server that is already in trouble), and no
    /// pause may pass [`MAX_RETRY_PAUSE`].
    pub fn validate(&self) -> Result<()> {
        let too_long = |what: &str, d: Duration| {
            if d > MAX_RETRY_PAUSE {
                Err(Error::invalid(format!(
                    "retry {what} {d:?} is longer than the maximum of {MAX_RETRY_PAUSE:?}"
                )))
            } else {
                Ok(())
            }
        };
        let too_short = |what: &str, d: Duration| {
            if d < MIN_RETRY_PAUSE {
                Err(Error::invalid(format!(
                    "retry {what} {d:?} is shorter than the minimum of {MIN_RETRY_PAUSE:?}: \
                     retries without a pause would hammer the backend"
                )))
            } else {
                Ok(())
            }
        };
        match *self {
            RetryPolicy::Never => Ok(()),
            RetryPolicy::OneTime { sleep } => too_long("sleep", sleep),
            RetryPolicy::NTimes { times, sleep } => {
                too_long("sleep", sleep)?;
                if times > 1 {
                    too_short("sleep", sleep)?;
                }
                Ok(())
            }
            RetryPolicy::UntilElapsed { max_elapsed, sleep } => {
                too_long("sleep", sleep)?;
                too_short("sleep", sleep)?;
                if max_elapsed > MAX_LEASE {
                    return Err(Error::invalid(format!(
                        "retry max_elapsed {max_elapsed:?} is longer than the maximum of \
                         {MAX_LEASE:?}"
                    )));
                }
                Ok(())
            }
            RetryPolicy::Exponential { base, cap, .. } => {
                too_short("base", base)?;
                too_long("cap", cap)?;
                if base > cap {
                    return Err(Error::invalid(format!(
                        "exponential retry base {base:?} is above its cap {cap:?}"
                    )));
                }
                Ok(())
            }
        }
    }

    /// The pause before retry number `retry` (0 for the first retry), given
    /// the time since the first try; `None` means give up.
    pub fn delay(&self, retry: u32, elapsed: Duration) -> Option<Duration> {
        match *self {
            RetryPolicy::Never => None,
            RetryPolicy::OneTime { sleep } => (retry == 0).then_some(sleep),
            RetryPolicy::NTimes { times, sleep } => (retry < times).then_some(sleep),
            RetryPolicy::UntilElapsed { max_elapsed, sleep } => {
                (elapsed + sleep <= max_elapsed).then_some(sleep)
            }
            RetryPolicy::Exponential {
                base,
                cap,
                max_retries,
            } => {
                if retry >= max_retries {
                    return None;
                }
                let raw = base.saturating_mul(1u32 << retry.min(30)).min(cap);
                Some(jitter(raw))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies() {
        let s = Duration::from_millis(10);
        assert_eq!(RetryPolicy::Never.delay(0, Duration::ZERO), None);
        assert_eq!(
            RetryPolicy::OneTime { sleep: s }.delay(0, Duration::ZERO),
            Some(s)
        );
        assert_eq!(
            RetryPolicy::OneTime { sleep: s }.delay(1, Duration::ZERO),
            None
        );
        let n = RetryPolicy::NTimes { times: 2, sleep: s };
        assert_eq!(n.delay(1, Duration::ZERO), Some(s));
        assert_eq!(n.delay(2, Duration::ZERO), None);
        let u = RetryPolicy::UntilElapsed {
            max_elapsed: Duration::from_millis(100),
            sleep: s,
        };
        assert_eq!(u.delay(50, Duration::from_millis(90)), Some(s));
        assert_eq!(u.delay(0, Duration::from_millis(95)), None);
        let e = RetryPolicy::exponential(s, Duration::from_millis(80), 100).unwrap();
        let d = e.delay(20, Duration::ZERO).unwrap();
        assert!(d <= Duration::from_millis(100) && d >= Duration::from_millis(60));
        assert!(RetryPolicy::exponential(Duration::ZERO, s, 1).is_err());
        assert!(RetryPolicy::exponential(Duration::from_secs(1), s, 1).is_err());
    }

    /// Every policy that retries in a loop must pause, and no pause may be
    /// so long that adding it to the clock overflows.
    #[test]
    fn no_policy_spins_or_overflows() {
        let zero = Duration::ZERO;
        let huge = Duration::MAX;
        for bad in [
            RetryPolicy::NTimes {
                times: 1_000_000,
                sleep: zero,
            },
            RetryPolicy::UntilElapsed {
                max_elapsed: Duration::from_secs(60),
                sleep: zero,
            },
            RetryPolicy::UntilElapsed {
                max_elapsed: huge,
                sleep: Duration::from_millis(5),
            },
            RetryPolicy::OneTime { sleep: huge },
            RetryPolicy::NTimes {
                times: 2,
                sleep: huge,
            },
            RetryPolicy::Exponential {
                base: Duration::from_millis(1),
                cap: huge,
                max_retries: 3,
            },
        ] {
            let e = bad.validate().unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidInput, "{bad:?}");
        }
        for good in [
            RetryPolicy::Never,
            RetryPolicy::OneTime { sleep: zero },
            RetryPolicy::NTimes {
                times: 1,
                sleep: zero,
            },
            RetryPolicy::default(),
        ] {
            good.validate().unwrap();
        }
    }
}
