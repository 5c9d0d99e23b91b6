//! What the core reports through the `metrics` facade (feature
//! `metrics`): the names and labels are listed in [`crate::metrics`].
//! Without a recorder installed, each call builds its labels (a few small
//! allocations) and records nothing.

use crate::core::hold::LostReason;
use std::time::Duration;

/// One call to the backend: `op` is `attempt`, `renew`, `release`,
/// `abandon`, `status` or `force_release`.
pub(crate) fn request(backend: &'static str, op: &'static str, took: Duration, ok: bool) {
    #[cfg(feature = "metrics")]
    {
        let result = if ok { "ok" } else { "error" };
        metrics::counter!("fenced_requests_total", "backend" => backend, "op" => op, "result" => result)
            .increment(1);
        metrics::histogram!("fenced_request_seconds", "backend" => backend, "op" => op)
            .record(took.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, op, took, ok);
}

/// An acquisition's end: `outcome` is `granted`, `busy` (not had within
/// the caller's wait) or `error`.
pub(crate) fn acquired(backend: &'static str, outcome: &'static str, waited: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("fenced_acquire_wait_seconds", "backend" => backend, "outcome" => outcome)
        .record(waited.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, outcome, waited);
}

/// A hold's end, `lost` or `released` (or dropped), after `held`.
pub(crate) fn hold_ended(backend: &'static str, end: &'static str, held: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("fenced_hold_seconds", "backend" => backend, "end" => end)
        .record(held.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, end, held);
}

/// A lost signal.
pub(crate) fn lost(backend: &'static str, reason: LostReason) {
    #[cfg(feature = "metrics")]
    {
        let reason = match reason {
            LostReason::Expired => "expired",
            LostReason::Taken => "taken",
            LostReason::SessionExpired => "session_expired",
            LostReason::Closed => "closed",
        };
        metrics::counter!("fenced_lost_total", "backend" => backend, "reason" => reason)
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, reason);
}

/// One hold's renewal: `result` is `renewed`, `gone`, `late` (confirmed
/// after the hold's deadline had passed: it renews nothing) or `unknown`
/// (the call failed; retried while the lease allows). For a renewed hold,
/// `margin` is the lease it had left when the confirmation arrived: the
/// renewal's lag, read the other way round; near zero, a slower round
/// trip or a later tick loses the hold.
pub(crate) fn renewal(backend: &'static str, result: &'static str, margin: Option<Duration>) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("fenced_renewals_total", "backend" => backend, "result" => result)
            .increment(1);
        if let Some(m) = margin {
            metrics::histogram!("fenced_renewal_margin_seconds", "backend" => backend)
                .record(m.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, result, margin);
}
