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

/// A lease table's register statements, each binding the name first and
/// the value second: see [`RegisterSql::for_rule`].
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) struct RegisterSql {
    /// Upsert if the row's fence is at most the third argument, which
    /// becomes its fence.
    pub(crate) fenced: &'static str,
    /// Upsert whatever the fence; a new row gets fence 0.
    pub(crate) unfenced: &'static str,
    /// Insert with fence 1 unless a row with a fence above 0 exists.
    pub(crate) create: &'static str,
    /// Update and step the fence if it equals the third argument.
    pub(crate) swap: &'static str,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl RegisterSql {
    /// The statement that carries out `rule` in one step, and the number
    /// it binds third, if any.
    pub(crate) fn for_rule(
        &self,
        name: &crate::name::LockName,
        rule: crate::spi::WriteRule,
    ) -> crate::error::Result<(&'static str, Option<i64>)> {
        use crate::spi::WriteRule;
        use crate::spi::codec::{fence_i64, next_version};
        Ok(match rule {
            WriteRule::Always => (self.unfenced, None),
            WriteRule::Fence(f) => (self.fenced, Some(fence_i64(f)?)),
            WriteRule::Version(v) => {
                // The version after it must fit the column too.
                fence_i64(next_version(name, v)?)?;
                match fence_i64(v)? {
                    0 => (self.create, None),
                    v => (self.swap, Some(v)),
                }
            }
        })
    }
}

/// A server lease table's URL, with the options fenced reads taken out
/// (`timeout=`, `pool=`, `mode=`) and the rest left for the driver.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct SqlUrl {
    /// The URL with its password hidden, for messages.
    pub(crate) label: String,
    /// What the driver is given.
    pub(crate) driver: url::Url,
    pub(crate) pool_size: u32,
    /// `mode=advisory`: session locks instead of the lease table.
    pub(crate) advisory: bool,
    pub(crate) timeout: Duration,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl SqlUrl {
    /// Parses `url` of `engine` (for messages), whose advisory mode is
    /// described as `advisory_is`.
    pub(crate) fn parse(url: &str, engine: &str, advisory_is: &str) -> crate::error::Result<Self> {
        use crate::error::Error;
        let label = crate::spi::endpoints::redact(url);
        let mut driver = url::Url::parse(url)
            .map_err(|e| Error::invalid(format!("bad {engine} URL {label:?}: {e}")))?;
        let (mut pool_size, mut advisory, mut timeout) = (8, false, crate::spi::DEFAULT_TIMEOUT);
        let mut kept = Vec::new();
        for (k, v) in driver.query_pairs() {
            match k.as_ref() {
                "timeout" => timeout = crate::spi::endpoints::parse_timeout(&v, &label)?,
                "pool" => {
                    pool_size = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| {
                            Error::invalid(format!(
                                "pool={v:?} in {label:?}: a number from 1 to 1000"
                            ))
                        })?;
                }
                "mode" => match v.as_ref() {
                    "lease" => advisory = false,
                    "advisory" => advisory = true,
                    _ => {
                        return Err(Error::invalid(format!(
                            "mode={v:?} in {label:?}: use `lease` (the lease table, the \
                             default) or `advisory` ({advisory_is})"
                        )));
                    }
                },
                _ => kept.push((k.into_owned(), v.into_owned())),
            }
        }
        driver.set_query(None);
        if !kept.is_empty() {
            driver.query_pairs_mut().extend_pairs(&kept);
        }
        Ok(SqlUrl {
            label,
            driver,
            pool_size,
            advisory,
            timeout,
        })
    }
}

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
