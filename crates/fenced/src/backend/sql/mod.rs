//! The SQL family: SQLite, PostgreSQL and MySQL/MariaDB lease tables, and
//! the two session-held advisory backends built beside them.

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "mysql")]
pub(crate) mod mysql_advisory;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "postgres")]
pub(crate) mod postgres_advisory;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::spi::sync::unpoisoned;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::spi::{Attempt, Outcome};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::time::Duration;

/// Database sessions that hold no lock, kept for the next session-held
/// lock instead of a new connection each time.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct IdleSessions<T>(std::sync::Mutex<Vec<T>>);

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<T> IdleSessions<T> {
    /// How many are kept; more are closed.
    const MAX: usize = 8;

    pub(crate) fn new() -> Self {
        IdleSessions(std::sync::Mutex::new(Vec::new()))
    }

    pub(crate) fn take(&self) -> Option<T> {
        unpoisoned(&self.0).pop()
    }

    /// Keeps `s` if there is room; otherwise it is dropped, which closes it.
    pub(crate) fn put(&self, s: T) {
        let mut idle = unpoisoned(&self.0);
        if idle.len() < Self::MAX {
            idle.push(s);
        }
    }

    pub(crate) fn clear(&self) {
        unpoisoned(&self.0).clear();
    }
}

/// Whether a pooled connection idle for a while still has its server: a
/// ping, but only for one idle longer than [`STALE_AFTER`]. sqlx pings every
/// connection it hands out by default, a round trip before each grant and
/// each release; a connection in steady use needs none, and one that died
/// fails its statement as any error in flight does, which the caller
/// retries.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn still_there<C: sqlx::Connection>(
    c: &mut C,
    meta: sqlx::pool::PoolConnectionMetadata,
) -> std::result::Result<bool, sqlx::Error> {
    if meta.idle_for > STALE_AFTER {
        c.ping().await?;
    }
    Ok(true)
}

/// How long a pooled connection may sit idle before it is pinged on use.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const STALE_AFTER: Duration = Duration::from_secs(10);

/// The SQL lease tables' one-round-trip grant (`fenced_try_grant`, a
/// function each backend creates with its tables): tried first for an
/// unfair, unqueued acquire while the function is usable. `Ok(None)` leaves
/// the decision to the full transaction: the lock has holds, the call met a
/// conflict, or the function is `gone` (dropped, or not ours to run), which
/// also stops later tries.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn try_fast_grant<F>(
    usable: &std::sync::atomic::AtomicBool,
    req: &Attempt,
    call: F,
    conflict: impl Fn(&sqlx::Error) -> bool,
    gone: impl Fn(&sqlx::Error) -> bool,
) -> std::result::Result<Option<Outcome>, sqlx::Error>
where
    F: std::future::Future<Output = std::result::Result<Option<i64>, sqlx::Error>>,
{
    use std::sync::atomic::Ordering;
    if req.fair || req.ticket.is_some() || !usable.load(Ordering::Relaxed) {
        return Ok(None);
    }
    match call.await {
        Ok(token) => Ok(token.map(|t| Outcome::granted(t as u64))),
        Err(e) if conflict(&e) => Ok(None),
        Err(e) if gone(&e) => {
            usable.store(false, Ordering::Relaxed);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
