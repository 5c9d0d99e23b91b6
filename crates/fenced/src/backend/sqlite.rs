//! `sqlite:///path/to/locks.db`: the embedded default.
//!
//! A lease table in one SQLite file (WAL mode), shared by every process on
//! the host that opens the same path. No server to run.
//!
//! # Layout
//!
//! [`SCHEMA`] below: `fenced_holds` has one row per grant (a mutex or write
//! hold, a read hold, or a semaphore's permits) with its owner
//! `<client id>:<owner id>`, mode, token and expiry; `fenced_tokens` keeps
//! the last fencing token of every name, after release too, so tokens only
//! rise; `fenced_waiters` holds blocked acquirers (the FIFO queue in fair
//! mode, and where to wake them); `fenced_registers` holds fenced registers.
//!
//! Every grant is decided inside one `BEGIN IMMEDIATE` transaction (SQLite
//! serialises writers, so two acquirers can never both win) by the same
//! rule as every other backend ([`grantable`]).
//!
//! # Waking waiters without polling
//!
//! Each client binds a Unix datagram socket (in Linux's abstract namespace:
//! no file to clean up; elsewhere a file in the temporary directory). A blocked acquirer records that address in
//! `fenced_waiters` in the same transaction that found the lock busy; a
//! release (or an expiry noticed by anyone) sends the lock name to the
//! oldest waiting address after it commits. A crashed holder sends nothing, so a
//! waiter also re-checks when the holder's lease runs out, and at least
//! every couple of seconds. Only the oldest waiter is woken per change (see
//! `notify`), so a release costs one re-attempt, not one per waiting process.
//!
//! # Guarantee and known holes
//!
//! Exact exclusion among processes on this host. Lease expiry is by the
//! host's wall clock (all processes share it); a clock stepped forward by
//! more than a lease can free a lock early, and the local lost signal, on
//! the monotonic clock, does not see that. Fencing tokens are persisted in
//! the file and never fall below the wall clock in microseconds.

use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::grant::{Held, grantable, next_token, permits_differ};
use crate::spi::lease::QUEUE_TTL;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, DEFAULT_TIMEOUT, HoldRef, HolderInfo, LockBackend,
    LockStatus, Mode, Outcome, RegisterValue, Renewal, Store, Ticket,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Row, SqliteConnection};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The tables, created on first use (also shown in the README).
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fenced_holds (
    hold_id    TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    owner      TEXT NOT NULL,      -- <client id>:<owner id>
    mode       INTEGER NOT NULL,   -- 0 exclusive, 1 shared, 2 permits
    take       INTEGER NOT NULL,   -- permits taken (mode 2)
    max        INTEGER NOT NULL,   -- permits in all (mode 2)
    token      INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL    -- host wall clock, ms since 1970
);
CREATE INDEX IF NOT EXISTS fenced_holds_name ON fenced_holds (name);
CREATE TABLE IF NOT EXISTS fenced_tokens (
    name  TEXT PRIMARY KEY,
    token INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fenced_waiters (
    ticket     INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL,
    fair       INTEGER NOT NULL,
    wake_addr  TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS fenced_waiters_name ON fenced_waiters (name, ticket);
CREATE TABLE IF NOT EXISTS fenced_registers (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    fence INTEGER NOT NULL
) WITHOUT ROWID;
";

const PURGE_HOLDS: &str = "DELETE FROM fenced_holds WHERE name = ?1 AND expires_ms <= ?2";
const PURGE_WAITERS: &str = "DELETE FROM fenced_waiters WHERE name = ?1 AND expires_ms <= ?2";
const SELECT_HOLDS: &str =
    "SELECT hold_id, owner, mode, take, max, token, expires_ms FROM fenced_holds WHERE name = ?1";
const MY_TICKET: &str = "SELECT ticket FROM fenced_waiters WHERE ticket = ?1 AND name = ?2";
const FAIR_AHEAD: &str =
    "SELECT EXISTS (SELECT 1 FROM fenced_waiters WHERE name = ?1 AND fair = 1 AND ticket < ?2)";
const LAST_TOKEN: &str = "SELECT token FROM fenced_tokens WHERE name = ?1";
const SET_TOKEN: &str = "INSERT INTO fenced_tokens (name, token) VALUES (?1, ?2)
    ON CONFLICT (name) DO UPDATE SET token = excluded.token";
const INSERT_HOLD: &str = "INSERT INTO fenced_holds
    (hold_id, name, owner, mode, take, max, token, expires_ms)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
const DELETE_TICKET: &str = "DELETE FROM fenced_waiters WHERE ticket = ?1";
const REFRESH_TICKET: &str = "UPDATE fenced_waiters SET expires_ms = ?2 WHERE ticket = ?1";
const INSERT_WAITER: &str = "INSERT INTO fenced_waiters (name, fair, wake_addr, expires_ms)
    VALUES (?1, ?2, ?3, ?4) RETURNING ticket";
const RENEW: &str =
    "UPDATE fenced_holds SET expires_ms = ?3 WHERE hold_id = ?1 AND expires_ms > ?2";
const RELEASE: &str = "DELETE FROM fenced_holds WHERE hold_id = ?1 RETURNING expires_ms";
const WAKE_ADDRS: &str = "SELECT wake_addr FROM fenced_waiters
    WHERE name = ?1 AND expires_ms > ?2 ORDER BY ticket LIMIT 8";
const FORGET_ADDR: &str = "DELETE FROM fenced_waiters WHERE wake_addr = ?1";
const COUNT_WAITERS: &str =
    "SELECT COUNT(*) FROM fenced_waiters WHERE name = ?1 AND expires_ms > ?2";
const FORCE_RELEASE: &str = "DELETE FROM fenced_holds WHERE name = ?1";
const REGISTER_READ: &str =
    "SELECT CAST(value AS BLOB) AS value, fence FROM fenced_registers WHERE name = ?1";
const REGISTER_FENCED: &str =
    "INSERT INTO fenced_registers (name, value, fence) VALUES (?1, ?2, ?3)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value, fence = excluded.fence
    WHERE fenced_registers.fence <= excluded.fence";
const REGISTER_UNFENCED: &str =
    "INSERT INTO fenced_registers (name, value, fence) VALUES (?1, ?2, 0)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value";
const REGISTER_CREATE: &str = "INSERT INTO fenced_registers (name, value, fence) VALUES (?1, ?2, 1)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value, fence = 1
    WHERE fenced_registers.fence = 0";
const REGISTER_SWAP: &str =
    "UPDATE fenced_registers SET value = ?2, fence = fence + 1 WHERE name = ?1 AND fence = ?3";
const REGISTER_DECREMENT: &str = "UPDATE fenced_registers
    SET value = CAST(CAST(CAST(value AS INTEGER) - ?2 AS TEXT) AS BLOB)
    WHERE name = ?1 AND CAST(value AS INTEGER) >= ?2
    RETURNING CAST(value AS INTEGER) AS value";

pub(crate) struct SqliteBackend {
    pool: SqlitePool,
    path: PathBuf,
    wakeups: Arc<Wakeups>,
    wake: wake::Endpoint,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

impl SqliteBackend {
    pub(crate) async fn open(path: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
        let path = path.split('?').next().unwrap_or_default();
        if path.is_empty() {
            return Err(Error::invalid(
                "sqlite URL has no file path; write sqlite:///absolute/path/locks.db",
            ));
        }
        let path = PathBuf::from(path);
        let opts = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            // No longer than a request may take: a writer that holds the
            // file longer makes the attempt fail (and retry while the
            // caller's deadline allows) rather than wait on.
            .busy_timeout(DEFAULT_TIMEOUT);
        let cannot = |e: sqlx::Error| {
            Error::unavailable(format!(
                "cannot open the SQLite lock file {}: {e}",
                path.display()
            ))
            .with_source(e)
        };
        // Switching a new file into WAL mode takes an exclusive lock that
        // SQLite's busy timeout does not wait for (see sqlx's notes on
        // `journal_mode`), so processes that open a fresh file together can
        // be told "database is locked": retry that, briefly, with backoff.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut pause = Duration::from_millis(5);
        let pool = loop {
            match open_pool(opts.clone()).await {
                Ok(pool) => break pool,
                Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(crate::retry::jitter(pause)).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(e) => return Err(cannot(e)),
            }
        };
        let wake = wake::Endpoint::bind(wakeups.clone())?;
        Ok(Arc::new(SqliteBackend {
            pool,
            path,
            wakeups,
            wake,
        }))
    }

    async fn attempt_tx(&self, req: &Attempt) -> Result<(Outcome, bool)> {
        let now = now_ms();
        let name = req.name.as_str();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
        let c: &mut SqliteConnection = &mut tx;
        let purged = q(PURGE_HOLDS)
            .bind(name)
            .bind(now)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        let mut changed = purged.rows_affected() > 0;
        q(PURGE_WAITERS)
            .bind(name)
            .bind(now)
            .execute(&mut *c)
            .await
            .map_err(db)?;
        let rows = q(SELECT_HOLDS)
            .bind(name)
            .fetch_all(&mut *c)
            .await
            .map_err(db)?;
        let holds = rows.iter().map(hold_row).collect::<Result<Vec<_>>>()?;
        // A retry of an attempt whose commit went through but whose answer
        // was lost: the grant stands (as the Redis script has it).
        if let Some(h) = holds.iter().find(|h| h.hold_id == req.hold_id) {
            let token = h.token;
            tx.commit().await.map_err(db)?;
            return Ok((Outcome::granted(token), changed));
        }
        let mine: Option<Ticket> = match req.ticket {
            Some(t) => q(MY_TICKET)
                .bind(t)
                .bind(name)
                .fetch_optional(&mut *c)
                .await
                .map_err(db)
                .and_then(scalar)?,
            None => None,
        };
        let queued_ahead = if req.fair {
            let row = q(FAIR_AHEAD)
                .bind(name)
                .bind(mine.unwrap_or(i64::MAX))
                .fetch_one(&mut *c)
                .await
                .map_err(db)?;
            row.try_get::<bool, _>(0).map_err(db)?
        } else {
            false
        };
        let held = holds.iter().map(|h| Held {
            owner_key: &h.owner,
            mode: h.mode,
        });
        let decision = grantable(held, &req.owner_key, req.mode, req.fair, queued_ahead);
        let outcome = if let Err(theirs) = decision {
            Outcome::Refused(permits_differ(name, theirs, req.mode.permits().1))
        } else if decision == Ok(true) {
            let last: Option<i64> = q(LAST_TOKEN)
                .bind(name)
                .fetch_optional(&mut *c)
                .await
                .map_err(db)
                .and_then(scalar)?;
            let token = next_token(last.unwrap_or(0).max(0) as u64);
            let token_i = i64::try_from(token)
                .map_err(|_| Error::protocol(format!("fencing token of {name:?} overflowed")))?;
            q(SET_TOKEN)
                .bind(name)
                .bind(token_i)
                .execute(&mut *c)
                .await
                .map_err(db)?;
            let (take, max) = req.mode.permits();
            q(INSERT_HOLD)
                .bind(&req.hold_id)
                .bind(name)
                .bind(&req.owner_key)
                .bind(req.mode.code())
                .bind(i64::from(take))
                .bind(i64::from(max))
                .bind(token_i)
                .bind(now.saturating_add(ms(req.lease)))
                .execute(&mut *c)
                .await
                .map_err(db)?;
            if let Some(t) = mine {
                q(DELETE_TICKET)
                    .bind(t)
                    .execute(&mut *c)
                    .await
                    .map_err(db)?;
                // The next fair waiter may be grantable now (readers in a row).
                changed |= req.fair;
            }
            Outcome::granted(token)
        } else {
            let expires = now + ms(QUEUE_TTL);
            let ticket = match (mine, req.will_wait) {
                (Some(t), _) => {
                    q(REFRESH_TICKET)
                        .bind(t)
                        .bind(expires)
                        .execute(&mut *c)
                        .await
                        .map_err(db)?;
                    Some(t)
                }
                (None, true) => {
                    let row = q(INSERT_WAITER)
                        .bind(name)
                        .bind(req.fair)
                        .bind(self.wake.addr())
                        .bind(expires)
                        .fetch_one(&mut *c)
                        .await
                        .map_err(db)?;
                    Some(row.try_get(0).map_err(db)?)
                }
                (None, false) => None,
            };
            let retry_after = holds
                .iter()
                .map(|h| Duration::from_millis((h.expires_ms - now).max(1) as u64))
                .min();
            Outcome::Busy(Blocked {
                ticket,
                retry_after,
            })
        };
        tx.commit().await.map_err(db)?;
        Ok((outcome, changed))
    }

    /// Wakes the oldest waiter of `name` (and every waiter in this process).
    ///
    /// One wake-up per change, as Curator hands a lock to the next node, not
    /// a herd: the woken waiter, once granted, wakes the next if it can go
    /// too. An address nobody listens on any more is forgotten and the next
    /// oldest is tried.
    async fn notify(&self, name: &str) {
        self.wakeups.bump(name);
        let rows = match q(WAKE_ADDRS)
            .bind(name)
            .bind(now_ms())
            .fetch_all(&self.pool)
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                tracing::debug!(error = %e, "could not list waiters; they will re-check on their own");
                return;
            }
        };
        for row in rows {
            let Ok(addr) = row.try_get::<String, _>(0) else {
                continue;
            };
            if addr == self.wake.addr() || self.wake.send(&addr, name) {
                return;
            }
            let _ = q(FORGET_ADDR).bind(&addr).execute(&self.pool).await;
        }
    }
}

async fn open_pool(opts: SqliteConnectOptions) -> Result<SqlitePool, sqlx::Error> {
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .min_connections(1)
        .connect_with(opts)
        .await?;
    sqlx::raw_sql(SCHEMA).execute(&pool).await?;
    Ok(pool)
}

/// SQLITE_BUSY or SQLITE_LOCKED, with any extended code.
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}

struct HoldRow {
    hold_id: String,
    owner: String,
    mode: Mode,
    token: u64,
    expires_ms: i64,
}

fn hold_row(r: &sqlx::sqlite::SqliteRow) -> Result<HoldRow> {
    let code: i64 = r.try_get("mode").map_err(db)?;
    let take: i64 = r.try_get("take").map_err(db)?;
    let max: i64 = r.try_get("max").map_err(db)?;
    let mode = Mode::from_code(code, take as u32, max as u32)
        .ok_or_else(|| Error::protocol(format!("fenced_holds has an unknown mode {code}")))?;
    Ok(HoldRow {
        hold_id: r.try_get("hold_id").map_err(db)?,
        owner: r.try_get("owner").map_err(db)?,
        mode,
        token: r.try_get::<i64, _>("token").map_err(db)? as u64,
        expires_ms: r.try_get("expires_ms").map_err(db)?,
    })
}

/// The first column of an optional row.
fn scalar<T>(row: Option<sqlx::sqlite::SqliteRow>) -> Result<Option<T>>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.map(|r| r.try_get(0)).transpose().map_err(db)
}

fn q(
    sql: &'static str,
) -> sqlx::query::Query<'static, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    sqlx::query(sql)
}

/// Maps a driver error: a busy or locked database and I/O trouble are
/// transient; a row that does not decode is a protocol error.
fn db(e: sqlx::Error) -> Error {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::TypeNotFound { .. } => {
            Error::protocol(format!("unexpected data in the SQLite lock file: {e}")).with_source(e)
        }
        _ => Error::unavailable(format!("SQLite: {e}")).with_source(e),
    }
}

impl LockBackend for SqliteBackend {
    fn scheme(&self) -> &'static str {
        "sqlite"
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> BoxFuture<'a, Result<Outcome>> {
        Box::pin(async move {
            let (outcome, changed) = self.attempt_tx(req).await?;
            if changed {
                self.notify(req.name.as_str()).await;
            }
            Ok(outcome)
        })
    }

    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> BoxFuture<'a, Result<Vec<Renewal>>> {
        Box::pin(async move {
            let now = now_ms();
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
            let mut out = Vec::with_capacity(holds.len());
            for h in holds {
                let r = q(RENEW)
                    .bind(&h.hold_id)
                    .bind(now)
                    .bind(now.saturating_add(ms(h.lease)))
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                out.push(Renewal::from(r.rows_affected() == 1));
            }
            tx.commit().await.map_err(db)?;
            Ok(out)
        })
    }

    fn identity(&self) -> String {
        // The file, whatever path led to it.
        let file = std::fs::canonicalize(&self.path).unwrap_or_else(|_| self.path.clone());
        format!("sqlite://{}", file.display())
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let row = q(RELEASE)
                .bind(&hold.hold_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            let Some(row) = row else { return Ok(false) };
            let expires: i64 = row.try_get(0).map_err(db)?;
            self.notify(hold.name.as_str()).await;
            Ok(expires > now_ms())
        })
    }

    fn abandon<'a>(
        &'a self,
        name: &'a LockName,
        ticket: Option<Ticket>,
        hold_id: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if let Some(t) = ticket {
                q(DELETE_TICKET)
                    .bind(t)
                    .execute(&self.pool)
                    .await
                    .map_err(db)?;
            }
            q(RELEASE)
                .bind(hold_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            self.notify(name.as_str()).await;
            Ok(())
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<LockStatus>> {
        Box::pin(async move {
            let now = now_ms();
            let mut c = self.pool.acquire().await.map_err(db)?;
            let rows = q(SELECT_HOLDS)
                .bind(name.as_str())
                .fetch_all(&mut *c)
                .await
                .map_err(db)?;
            let mut holders = Vec::new();
            for r in &rows {
                let h = hold_row(r)?;
                if h.expires_ms > now {
                    holders.push(HolderInfo {
                        owner: h.owner,
                        mode: h.mode,
                        token: h.token,
                        lease_left: Duration::from_millis((h.expires_ms - now) as u64),
                    });
                }
            }
            let waiters: i64 = q(COUNT_WAITERS)
                .bind(name.as_str())
                .bind(now)
                .fetch_one(&mut *c)
                .await
                .map_err(db)?
                .try_get(0)
                .map_err(db)?;
            let last: Option<i64> = q(LAST_TOKEN)
                .bind(name.as_str())
                .fetch_optional(&mut *c)
                .await
                .map_err(db)
                .and_then(scalar)?;
            Ok(LockStatus {
                holders,
                waiters: waiters as usize,
                last_token: last.unwrap_or(0) as u64,
            })
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<usize>> {
        Box::pin(async move {
            let r = q(FORCE_RELEASE)
                .bind(name.as_str())
                .execute(&self.pool)
                .await
                .map_err(db)?;
            self.notify(name.as_str()).await;
            Ok(r.rows_affected() as usize)
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.pool.close().await })
    }
}

impl Store for SqliteBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<RegisterValue>> {
        Box::pin(async move {
            let row = q(REGISTER_READ)
                .bind(name.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            row.map(|r| {
                let v: Vec<u8> = r.try_get("value").map_err(db)?;
                let f: i64 = r.try_get("fence").map_err(db)?;
                Ok((v, f as u64))
            })
            .transpose()
        })
    }

    fn register_write<'a>(
        &'a self,
        name: &'a LockName,
        fence: Option<u64>,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let r = match fence {
                Some(f) => {
                    let f = crate::spi::codec::fence_i64(f)?;
                    q(REGISTER_FENCED)
                        .bind(name.as_str())
                        .bind(value)
                        .bind(f)
                        .execute(&self.pool)
                        .await
                }
                None => {
                    q(REGISTER_UNFENCED)
                        .bind(name.as_str())
                        .bind(value)
                        .execute(&self.pool)
                        .await
                }
            }
            .map_err(db)?;
            Ok(r.rows_affected() == 1)
        })
    }

    fn register_swap<'a>(
        &'a self,
        name: &'a LockName,
        expected: u64,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            // The version after it must fit the column too.
            crate::spi::codec::fence_i64(crate::spi::codec::next_version(name, expected)?)?;
            let expected = crate::spi::codec::fence_i64(expected)?;
            let r = if expected == 0 {
                q(REGISTER_CREATE).bind(name.as_str()).bind(value)
            } else {
                q(REGISTER_SWAP)
                    .bind(name.as_str())
                    .bind(value)
                    .bind(expected)
            }
            .execute(&self.pool)
            .await
            .map_err(db)?;
            Ok(r.rows_affected() == 1)
        })
    }

    fn register_decrement<'a>(
        &'a self,
        name: &'a LockName,
        by: i64,
    ) -> BoxFuture<'a, Result<Option<i64>>> {
        Box::pin(async move {
            let row = q(REGISTER_DECREMENT)
                .bind(name.as_str())
                .bind(by)
                .fetch_optional(&self.pool)
                .await
                .map_err(db)?;
            scalar(row)
        })
    }
}

impl Backend for SqliteBackend {}

impl std::fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SqliteBackend({})", self.path.display())
    }
}

/// Datagram wake-ups between processes (see the module docs). Written by
/// hand: no crate offers cross-process notification for SQLite.
///
/// On Linux the sockets live in the abstract namespace (no file to clean
/// up, and every user of the host can reach them); elsewhere (macOS, the
/// BSDs) they are files in the temporary directory, removed when the
/// client closes, and a process of another user may not be able to reach
/// them: its waiters then find the lock free by their timed re-check.
mod wake {
    use crate::error::{Error, Result};
    use crate::spi::wake::Wakeups;
    use std::os::unix::net::UnixDatagram;
    use std::sync::Arc;

    pub(super) struct Endpoint {
        addr: String,
        sender: UnixDatagram,
        task: tokio::task::JoinHandle<()>,
    }

    fn fail(e: std::io::Error) -> Error {
        Error::unavailable(format!("cannot bind a wake-up socket: {e}")).with_source(e)
    }

    #[cfg(target_os = "linux")]
    fn socket_addr(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
    }

    #[cfg(not(target_os = "linux"))]
    fn socket_addr(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
        std::os::unix::net::SocketAddr::from_pathname(name)
    }

    /// A fresh address, and the socket bound to it.
    #[cfg(target_os = "linux")]
    fn bind() -> Result<(String, UnixDatagram)> {
        let addr = format!("fenced/{}", uuid::Uuid::new_v4().simple());
        let sock = UnixDatagram::bind_addr(&socket_addr(&addr).map_err(fail)?).map_err(fail)?;
        Ok((addr, sock))
    }

    #[cfg(not(target_os = "linux"))]
    fn bind() -> Result<(String, UnixDatagram)> {
        // Short: a socket path has room for about 100 bytes on macOS.
        let id = &uuid::Uuid::new_v4().simple().to_string()[..16];
        let path = std::env::temp_dir().join(format!("fenced-{id}.sock"));
        let sock = UnixDatagram::bind(&path).map_err(fail)?;
        Ok((path.display().to_string(), sock))
    }

    impl Endpoint {
        pub(super) fn bind(wakeups: Arc<Wakeups>) -> Result<Self> {
            let (addr, sock) = bind()?;
            sock.set_nonblocking(true).map_err(fail)?;
            let sock = tokio::net::UnixDatagram::from_std(sock).map_err(fail)?;
            let sender = UnixDatagram::unbound().map_err(fail)?;
            sender.set_nonblocking(true).map_err(fail)?;
            let task = tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    match sock.recv(&mut buf).await {
                        Ok(n) => {
                            if let Ok(name) = std::str::from_utf8(&buf[..n]) {
                                wakeups.bump(name);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "wake-up socket failed; waiters fall back to timed re-checks");
                            return;
                        }
                    }
                }
            });
            Ok(Endpoint { addr, sender, task })
        }

        pub(super) fn addr(&self) -> &str {
            &self.addr
        }

        /// Sends `name` to `addr`; false when nobody listens there any more.
        /// A full receive queue counts as delivered: that process already has
        /// wake-ups pending.
        pub(super) fn send(&self, addr: &str, name: &str) -> bool {
            let Ok(to) = socket_addr(addr) else {
                return false;
            };
            match self.sender.send_to_addr(name.as_bytes(), &to) {
                Ok(_) => true,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ),
            }
        }
    }

    impl Drop for Endpoint {
        fn drop(&mut self) {
            self.task.abort();
            #[cfg(not(target_os = "linux"))]
            let _ = std::fs::remove_file(&self.addr);
        }
    }
}
