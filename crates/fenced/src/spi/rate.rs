//! The rate limiter's rule: GCRA (the generic cell rate algorithm), as
//! every backend applies it by its server's clock.
//!
//! A limiter of rate `r` and burst `b` keeps one number per name, the
//! *theoretical arrival time* (TAT): when the limiter would be idle again
//! had every grant come at the steady rate. A request for `n` permits at
//! server time `now` costs `n · T` (`T = 1 / r`, the emission interval):
//! it is granted if `max(TAT, now) + n · T − b · T ≤ now`, and then the TAT
//! becomes `max(TAT, now) + n · T`; otherwise it may come back after the
//! difference. So at most `b` permits pass at once, and `r` a second
//! after that. All times are whole microseconds.

use std::time::Duration;

/// What one decision asks for, in microseconds of the server's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RateCost {
    /// `n · T`: how far a grant moves the TAT on.
    pub(crate) cost_us: u64,
    /// `b · T`: how far ahead of now the TAT may run.
    pub(crate) tolerance_us: u64,
}

/// The rule: from the stored TAT (0 if none) at `now_us`, the new TAT if
/// granted, else how long until it would be.
pub(crate) fn gcra(tat_us: u64, now_us: u64, cost: RateCost) -> Result<u64, Duration> {
    let next = tat_us.max(now_us).saturating_add(cost.cost_us);
    let allowed_from = next.saturating_sub(cost.tolerance_us);
    if allowed_from <= now_us {
        Ok(next)
    } else {
        Err(Duration::from_micros(allowed_from - now_us))
    }
}

/// The answer of a backend without rate limiters, should it be asked
/// (the client refuses to make one first).
pub(crate) fn refused(who: &str) -> super::types::Reply<'static, Option<Duration>> {
    let e = crate::error::Error::invalid(format!("{who} has no rate limiters"));
    Box::pin(async move { Err(e) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate() {
        // 10 a second (T = 100 ms), burst 3.
        let cost = RateCost {
            cost_us: 100_000,
            tolerance_us: 300_000,
        };
        let mut tat = 0;
        let now = 1_000_000;
        for _ in 0..3 {
            tat = gcra(tat, now, cost).unwrap();
        }
        assert_eq!(gcra(tat, now, cost), Err(Duration::from_millis(100)));
        assert!(gcra(tat, now + 100_000, cost).is_ok());
        // Idle for long: the burst is back, no more.
        let later = now + 10_000_000;
        let mut t = tat;
        for _ in 0..3 {
            t = gcra(t, later, cost).unwrap();
        }
        assert!(gcra(t, later, cost).is_err());
    }
}
