//! What [`Client::doctor`](crate::Client::doctor) finds: the server's (or
//! the host's) settings that fenced's guarantees rest on, each with a
//! verdict.
//!
//! The torture suite measures the guarantees against servers at their
//! defaults; a deployment can weaken them with a setting (a Redis without
//! persistence forgets every lock in a restart, a PostgreSQL with
//! `synchronous_commit = off` may forget a grant it answered). The doctor
//! reads those settings and says what each means for the locks.

use std::fmt;

/// One setting checked by [`Client::doctor`](crate::Client::doctor).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Check {
    /// What was checked, short (`persistence`, `synchronous_commit`).
    pub name: String,
    /// What it means for the locks.
    pub verdict: Verdict,
    /// What was found, and why it matters.
    pub detail: String,
}

impl Check {
    pub(crate) fn new(name: &str, verdict: Verdict, detail: impl Into<String>) -> Check {
        Check {
            name: name.to_owned(),
            verdict,
            detail: detail.into(),
        }
    }
}

/// How a setting bears on the guarantees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// As the guarantees assume.
    Pass,
    /// Could not be read (a managed server that hides its configuration).
    Unknown,
    /// Weakens a guarantee under some fault; often a deliberate trade.
    Warn,
    /// Breaks a guarantee the backend otherwise keeps under a fault it
    /// claims to survive.
    Fail,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "pass",
            Verdict::Unknown => "unknown",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        })
    }
}

/// [`clock_offset`] from the server's clock read as seconds since 1970,
/// or `Unknown` with why it could not be read.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn clock_read<E: fmt::Display>(epoch_secs: Result<f64, E>) -> Check {
    match epoch_secs {
        Ok(now) => clock_offset((now * 1e6) as i64),
        Err(e) => Check::new("clock", Verdict::Unknown, e.to_string()),
    }
}

/// The offset of the server's wall clock from this host's, as a check:
/// fenced never compares the two (leases run on the server's clock and
/// the client's monotonic one), but people reading both do.
#[cfg_attr(
    not(any(feature = "redis", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn clock_offset(server_epoch_us: i64) -> Check {
    let here = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let off_ms = (server_epoch_us - here) as f64 / 1000.0;
    let verdict = if off_ms.abs() > 1000.0 {
        Verdict::Warn
    } else {
        Verdict::Pass
    };
    Check::new(
        "clock",
        verdict,
        format!(
            "the server's clock is {off_ms:+.1} ms from this host's; fenced does not depend on \
             it (leases run on the server's clock), but times in logs and tools will disagree \
             beyond a second"
        ),
    )
}
