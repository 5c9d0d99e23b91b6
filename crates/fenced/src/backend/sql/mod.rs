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

use crate::spi::Mode;
use crate::spi::grant::LiveHold;
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
        // A CA file with a mode that does not verify would be ignored by
        // the driver, which then accepts any certificate: refused, so that
        // naming a CA always means it is checked against.
        let mode = kept
            .iter()
            .find(|(k, _)| matches!(k.as_str(), "sslmode" | "ssl-mode" | "sslMode"))
            .map(|(_, v)| v.to_ascii_lowercase().replace('_', "-"));
        let verifies = mode
            .as_deref()
            .is_some_and(|m| matches!(m, "verify-ca" | "verify-full" | "verify-identity"));
        if let Some((k, _)) = kept
            .iter()
            .find(|(k, _)| matches!(k.as_str(), "sslrootcert" | "ssl-ca" | "sslca"))
            && !verifies
        {
            let modes = if engine == "PostgreSQL" {
                "sslmode=verify-ca or sslmode=verify-full"
            } else {
                "ssl-mode=VERIFY_CA or ssl-mode=VERIFY_IDENTITY"
            };
            return Err(Error::invalid(format!(
                "{k}= in {label:?} is checked only with {modes}: without one the server's \
                 certificate is not verified at all; add one"
            )));
        }
        // A URL that asks for TLS in a build without it fails here, not
        // at the first connection with the driver's words for it.
        #[cfg(not(feature = "tls"))]
        if let Some((k, v)) = kept.iter().find(|(k, v)| {
            matches!(k.as_str(), "sslmode" | "ssl-mode" | "sslMode")
                && !matches!(
                    v.to_ascii_lowercase().as_str(),
                    "disable" | "disabled" | "allow" | "prefer" | "preferred"
                )
        }) {
            return Err(Error::invalid(format!(
                "{k}={v} in {label:?} needs TLS, which is not in this build of fenced \
                 (cargo feature `tls`)"
            )));
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

/// The fenced register `name` of a lease table, read by `sql` (binding
/// the name; its columns `value` and `fence`), its errors told by `err`.
pub(crate) async fn read_register<DB>(
    pool: &sqlx::Pool<DB>,
    sql: &'static str,
    name: &crate::name::LockName,
    err: impl Fn(sqlx::Error) -> crate::error::Error,
) -> crate::error::Result<crate::spi::RegisterValue>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'static str: sqlx::ColumnIndex<DB::Row>,
    Vec<u8>: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
{
    use sqlx::Row;
    let row = sqlx::query(sql)
        .bind(name.as_str())
        .fetch_optional(pool)
        .await
        .map_err(&err)?;
    row.map(|r| Ok((r.try_get("value")?, r.try_get::<i64, _>("fence")? as u64)))
        .transpose()
        .map_err(err)
}

/// Lock names read back from a table's `name` column, for
/// [`names`](crate::spi::LockBackend::names); a row no lock name could
/// have made (written by hand) is passed over.
/// When this client last refreshed its watcher row of each register
/// key (see `Store::watch_register`): the many tasks of one client that
/// watch one register refresh it once per fallback period between them,
/// well inside its [`QUEUE_TTL`](crate::spi::lease::QUEUE_TTL).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
#[derive(Default)]
pub(crate) struct Watching(std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>);

#[cfg(any(feature = "sqlite", feature = "mysql"))]
impl Watching {
    /// Whether `key`'s row is due a refresh: not refreshed within the
    /// last fallback period.
    fn due(&self, key: &str) -> bool {
        let period = crate::core::acquire::MAX_FALLBACK;
        let watching = crate::spi::sync::unpoisoned(&self.0);
        watching.get(key).is_none_or(|at| at.elapsed() >= period)
    }

    /// Runs `refresh` if `key`'s row is due one, and marks it refreshed
    /// once it has been.
    pub(crate) async fn refresh<F>(&self, key: &str, refresh: F) -> crate::error::Result<()>
    where
        F: std::future::Future<Output = crate::error::Result<()>>,
    {
        if self.due(key) {
            refresh.await?;
            self.refreshed(key);
        }
        Ok(())
    }

    /// `key`'s row was refreshed (or made) just now.
    fn refreshed(&self, key: &str) {
        let mut watching = crate::spi::sync::unpoisoned(&self.0);
        watching.retain(|_, at| at.elapsed() < crate::spi::lease::QUEUE_TTL);
        watching.insert(key.to_owned(), std::time::Instant::now());
    }
}

pub(crate) fn names_of(rows: impl IntoIterator<Item = String>) -> Vec<crate::name::LockName> {
    rows.into_iter()
        .filter_map(|n| crate::name::LockName::new(&n).ok())
        .collect()
}

/// A status query's `waiters` and `token` (the last issued) columns.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn waiters_and_token<R>(r: &R) -> Result<(usize, u64), sqlx::Error>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let waiters: i64 = r.try_get("waiters")?;
    let token: i64 = r.try_get("token")?;
    Ok((waiters as usize, token as u64))
}

/// A row of `fenced_holds`, as every lease table keeps it: the lease left
/// read from a `left_ms` column, or from `expires_ms` against the
/// database's `now` (in milliseconds) where the query read that.
pub(crate) fn hold_row<R>(r: &R, now: Option<i64>) -> Result<LiveHold, sqlx::Error>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    i16: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let code: i16 = r.try_get("mode")?;
    let take: i32 = r.try_get("take")?;
    let max: i32 = r.try_get("max")?;
    let mode = Mode::from_code(i64::from(code), take as u32, max as u32).ok_or_else(|| {
        sqlx::Error::Decode(format!("fenced_holds has an unknown mode {code}").into())
    })?;
    let left_ms = match now {
        Some(now) => r.try_get::<i64, _>("expires_ms")? - now,
        None => r.try_get("left_ms")?,
    };
    // Only status selects the record: an attempt decides without it.
    let holder = match r.try_get::<Option<String>, _>("holder") {
        Ok(h) => h,
        Err(sqlx::Error::ColumnNotFound(_)) => None,
        Err(e) => return Err(e),
    };
    Ok(LiveHold {
        hold_id: r.try_get("hold_id")?,
        owner: r.try_get("owner")?,
        mode,
        token: r.try_get::<i64, _>("token")? as u64,
        left_ms,
        holder,
    })
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
        drop(self.keep(s));
    }

    /// Keeps `s` if there is room; otherwise hands it back.
    pub(crate) fn keep(&self, s: T) -> Option<T> {
        let mut idle = unpoisoned(&self.0);
        if idle.len() < Self::MAX {
            idle.push(s);
            return None;
        }
        Some(s)
    }

    pub(crate) fn clear(&self) {
        unpoisoned(&self.0).clear();
    }

    /// Takes out the sessions `f` picks.
    #[cfg(feature = "mysql")]
    pub(crate) fn take_where(&self, f: impl Fn(&T) -> bool) -> Vec<T> {
        let mut idle = unpoisoned(&self.0);
        let (picked, kept) = std::mem::take(&mut *idle).into_iter().partition(f);
        *idle = kept;
        picked
    }

    /// The least of `f` over the sessions kept.
    #[cfg(feature = "mysql")]
    pub(crate) fn min_of<K: Ord>(&self, f: impl Fn(&T) -> K) -> Option<K> {
        unpoisoned(&self.0).iter().map(f).min()
    }
}

/// Opens one connection outside the pool and closes it, so that a server
/// that cannot be reached is reported as what it is (connection refused, a
/// name that does not resolve, a wrong password) as soon as it is known:
/// the pool retries such errors until its acquire timeout and then says
/// only that it timed out. `Err(None)`: no answer within `timeout`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn first_connection<C: sqlx::Connection>(
    opts: &<C as sqlx::Connection>::Options,
    timeout: Duration,
) -> std::result::Result<(), Option<sqlx::Error>> {
    match tokio::time::timeout(timeout, C::connect_with(opts)).await {
        Ok(Ok(conn)) => {
            // Closing politely is a courtesy; the pool opens its own.
            let _ = tokio::time::timeout(timeout, conn.close()).await;
            Ok(())
        }
        Ok(Err(e)) => Err(Some(e)),
        Err(_) => Err(None),
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

/// A duration in whole milliseconds, as the lease tables count.
pub(crate) fn ms(d: std::time::Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// The insert of a granted hold's row in a server lease table's
/// transaction: hold id, name, owner, mode, take, max, token, `until` (the
/// lease, in the engine's type and meaning), and the holder's record when
/// the table has its column (`with`; else `without`, which leaves it out).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn grant_row<'q, DB, L>(
    (with, without): (&'static str, &'static str),
    holders: bool,
    req: &'q Attempt,
    token: i64,
    until: L,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>
where
    DB: sqlx::Database,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i16: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i32: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    L: sqlx::Encode<'q, DB> + sqlx::Type<DB> + Send + 'q,
{
    let (take, max) = req.mode.permits();
    let q = sqlx::query(if holders { with } else { without })
        .bind(req.hold_id.as_str())
        .bind(req.name.as_str())
        .bind(req.owner_key.as_str())
        .bind(req.mode.code() as i16)
        .bind(take as i32)
        .bind(max as i32)
        .bind(token)
        .bind(until);
    if holders {
        q.bind(req.holder.as_str())
    } else {
        q
    }
}

/// What a role that may not create the one-call grant function is told.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const NO_GRANT_FUNCTION: &str =
    "cannot create the function fenced_try_grant2: every acquire takes the full transaction";

/// The one-round-trip grant (`sql`, the backend's call of its
/// `fenced_try_grant`): the token of a grant, or `None` when the full
/// transaction must decide. The lease is bound as `lease` (milliseconds,
/// in the type the engine's function takes). A caller with a queue
/// ticket runs `ticketed` instead, if given, with the ticket bound last:
/// a statement that withdraws it with the grant (see [`attempt`]). A busy
/// lock so costs one round trip more than before; answering "busy" here instead measured
/// slower on PostgreSQL's S2 (397–430 against 463–475 acquisitions/s in
/// alternating runs; why, I have not found), and S2 with this version is
/// unchanged (436–514 against 456–535/s).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn call_try_grant<DB, L>(
    pool: &sqlx::Pool<DB>,
    sql: &'static str,
    req: &Attempt,
    lease: L,
    ticketed: Option<&'static str>,
) -> Result<Option<i64>, sqlx::Error>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i16: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i32: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    L: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB> + Send + 'static,
    (Option<i64>,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let (take, max) = req.mode.permits();
    let (sql, ticket) = match (ticketed, req.ticket) {
        (Some(ticketed), Some(ticket)) => (ticketed, Some(ticket)),
        _ => (sql, None),
    };
    let q = sqlx::query_scalar(sql)
        .bind(req.name.as_str())
        .bind(req.hold_id.as_str())
        .bind(req.owner_key.as_str())
        .bind(req.mode.code() as i16)
        .bind(take as i32)
        .bind(max as i32)
        .bind(lease)
        .bind(req.holder.as_str());
    if let Some(t) = ticket {
        q.bind(t).fetch_one(pool).await
    } else {
        q.fetch_one(pool).await
    }
}

/// A server lease table's attempt: the one-round-trip grant
/// (`fenced_try_grant`, a function each backend creates with its tables)
/// for an unfair acquire while the function is usable (one that holds a
/// queue place only if the `call` withdraws it with the grant, as
/// `withdraws` says), else the
/// full transaction `tx`, run again (up to ten times) when the server
/// aborts it for a `conflict`. The call leaves the decision to the
/// transaction when the lock has holds, the call met a conflict, or the
/// function is `gone` (dropped, or not ours to run), which also stops
/// later calls.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn attempt<F, T, TF>(
    usable: &std::sync::atomic::AtomicBool,
    req: &Attempt,
    call: F,
    mut tx: T,
    conflict: impl Fn(&sqlx::Error) -> bool,
    gone: impl Fn(&sqlx::Error) -> bool,
    withdraws: bool,
) -> std::result::Result<Outcome, sqlx::Error>
where
    F: std::future::Future<Output = std::result::Result<Option<i64>, sqlx::Error>>,
    T: FnMut() -> TF,
    TF: std::future::Future<Output = std::result::Result<Outcome, sqlx::Error>>,
{
    use std::sync::atomic::Ordering;
    if !req.fair && (req.ticket.is_none() || withdraws) && usable.load(Ordering::Relaxed) {
        match call.await {
            Ok(Some(token)) => return Ok(Outcome::granted(token as u64)),
            Ok(None) => {}
            Err(e) if conflict(&e) => {}
            Err(e) if gone(&e) => usable.store(false, Ordering::Relaxed),
            Err(e) => return Err(e),
        }
    }
    let mut tries = 0;
    loop {
        match tx().await {
            Err(e) if conflict(&e) && tries < 10 => tries += 1,
            done => return done,
        }
    }
}
