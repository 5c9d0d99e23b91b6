//! `mysql://user:pass@host:3306/db` (also `mariadb://`): a lease table in
//! MariaDB ≥ 10.5 (it uses `DELETE … RETURNING`).
//!
//! # Layout
//!
//! [`SCHEMA`], created on first use under `GET_LOCK('fenced_schema')`:
//! the same four tables as the PostgreSQL backend, with names as
//! `VARBINARY` (compared byte for byte: no case folding, no trailing-space
//! padding) and times as milliseconds of the **database's** clock
//! (`SYSDATE(3)`), never a client's.
//!
//! `?mode=advisory` is the other mode, in
//! [`mysql_advisory`](crate::backend::sql::mysql_advisory).
//!
//! Every grant is one `READ COMMITTED` transaction that first locks the
//! name's `fenced_locks` row, so acquirers of one name are serialised
//! whatever the server's default isolation, then applies the grant rule
//! every backend shares ([`grantable`]).
//!
//! # Wake-ups without polling
//!
//! MySQL has no NOTIFY. Each client keeps one *doorbell* connection
//! waiting on the server in `GET_LOCK` for a lock that a second connection
//! of the client (its anchor) holds; a blocked acquirer records the
//! doorbell's connection id in `fenced_waiters`. After a change, the
//! releaser runs `KILL QUERY <id>` for the oldest waiter, which ends that
//! wait at once; the woken client looks again. A wake-up that lands while a
//! doorbell re-arms is lost, and a holder that dies wakes nobody, so
//! waiters also look again when the first lease in their way ends. `KILL
//! QUERY` of one's own user's connections needs no privilege.
//!
//! Connection ids start again from 1 when the server restarts, while the
//! waiters' rows survive it: a wake-up must never reach a connection that
//! took over an old doorbell's id. So each doorbell holds the user lock
//! `fenced_doorbell:<its connection id>` for as long as it lives, and a
//! releaser wakes only ids whose lock is held by that very connection.

use crate::backend::sql::{SqlUrl, hold_row, ms, waiters_and_token};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::grant::{Decision, decide, stands};
use crate::spi::lease::QUEUE_TTL;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, HoldRef, LockBackend, LockStatus, Outcome, RegisterValue,
    RegisterWrite, Renewal, Reply, Store, Withdrawal, WriteRule,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{Connection, MySqlConnection, Row};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

mod attempt;
mod doorbell;
mod holds;
pub(crate) mod queries;
mod store;
use doorbell::*;
use queries::*;

pub(crate) struct MySqlBackend {
    pool: MySqlPool,
    label: String,
    /// `mysql://host:port/database`, whatever URL named it.
    identity: String,
    /// How long one request may take (`timeout=`).
    timeout: Duration,
    wakeups: Arc<Wakeups>,
    /// The connection id of this client's doorbell.
    bell: Arc<AtomicI64>,
    /// The doorbell's task: from the start in the lease-table mode; in
    /// advisory mode, whose lock waiters the server itself wakes, only
    /// once a register is watched.
    doorbell: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// How the doorbell connects.
    bell_opts: MySqlConnectOptions,
    /// When this client last refreshed its watcher row of each register
    /// key (see `Store::watch_register`).
    watching: crate::backend::sql::Watching,
    /// Whether `fenced_try_grant2` exists (see [`TRY_GRANT_DDL`]).
    fast: AtomicBool,
    /// Whether `fenced_holds` has the `holder` column.
    holders: bool,
}

impl Drop for MySqlBackend {
    fn drop(&mut self) {
        if let Some(d) = self.doorbell.get_mut() {
            d.abort();
        }
    }
}

impl MySqlBackend {
    /// Where this backend's waiters are woken (shared with the advisory
    /// backend built on it).
    pub(crate) fn wakeups(&self) -> &Arc<Wakeups> {
        &self.wakeups
    }

    pub(crate) async fn open(url: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
        let SqlUrl {
            label,
            mut driver,
            pool_size,
            advisory,
            timeout,
        } = SqlUrl::parse(url, "MySQL", "GET_LOCK session locks")?;
        if driver.scheme() == "mariadb" {
            let _ = driver.set_scheme("mysql");
        }
        let opts = MySqlConnectOptions::from_str(driver.as_str())
            .map_err(|e| Error::invalid(format!("bad MySQL URL {label:?}: {e}")).with_source(e))?;
        let table =
            Self::connect(label, opts.clone(), pool_size, !advisory, timeout, wakeups).await?;
        if advisory {
            return crate::backend::sql::mysql_advisory::MySqlAdvisory::open(Arc::new(table), opts)
                .await;
        }
        Ok(Arc::new(table))
    }

    /// The lease table's pool (with the schema in place), and the doorbell
    /// if `doorbell`.
    async fn connect(
        label: String,
        opts: MySqlConnectOptions,
        pool_size: u32,
        doorbell: bool,
        timeout: Duration,
        wakeups: Arc<Wakeups>,
    ) -> Result<MySqlBackend> {
        let identity = format!(
            "mysql://{}:{}/{}",
            opts.get_host(),
            opts.get_port(),
            opts.get_database().unwrap_or("")
        );
        // A wait for a row lock gives up no later than the client does
        // (the setting counts whole seconds).
        let lock_wait = timeout.as_secs().max(1);
        crate::backend::sql::first_connection::<sqlx::MySqlConnection>(&opts, timeout)
            .await
            .map_err(|e| match e {
                Some(e) => db(&label, e),
                None => Error::unavailable(format!(
                    "MySQL at {label} did not answer within {timeout:?}"
                )),
            })?;
        let pool = MySqlPoolOptions::new()
            .max_connections(pool_size)
            .acquire_timeout(timeout)
            .test_before_acquire(false)
            .before_acquire(|c, meta| Box::pin(crate::backend::sql::still_there(c, meta)))
            // Once per connection rather than a round trip per grant: every
            // transaction of ours runs READ COMMITTED, whatever the server's
            // default.
            .after_connect(move |c, _| {
                Box::pin(async move {
                    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .execute(&mut *c)
                        .await?;
                    let wait = format!("SET SESSION innodb_lock_wait_timeout = {lock_wait}");
                    sqlx::raw_sql(sqlx::AssertSqlSafe(wait))
                        .execute(c)
                        .await
                        .map(drop)
                })
            })
            .connect_with(opts.clone())
            .await
            .map_err(|e| db(&label, e))?;
        let (fast, holders);
        {
            let mut c = pool.acquire().await.map_err(|e| db(&label, e))?;
            sqlx::query("SELECT GET_LOCK('fenced_schema', 30)")
                .execute(&mut *c)
                .await
                .map_err(|e| db(&label, e))?;
            for t in SCHEMA {
                if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(*t)).execute(&mut *c).await {
                    let _ = sqlx::query("SELECT RELEASE_LOCK('fenced_schema')")
                        .execute(&mut *c)
                        .await;
                    return Err(db(&label, e));
                }
            }
            holders = has_holder_column(&mut c, &label).await;
            // CREATE FUNCTION is not a preparable statement: text protocol.
            // The one-call grant writes the holder: without the column,
            // every acquire takes the full transaction.
            fast = holders
                && match sqlx::raw_sql(TRY_GRANT_DDL).execute(&mut *c).await {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::warn!(
                            server = %label,
                            error = %e,
                            "{}",
                            crate::backend::sql::NO_GRANT_FUNCTION
                        );
                        false
                    }
                };
            sqlx::query("SELECT RELEASE_LOCK('fenced_schema')")
                .execute(&mut *c)
                .await
                .map_err(|e| db(&label, e))?;
            // A global setting only, so unlike PostgreSQL's
            // synchronous_commit it cannot be raised for our sessions.
            let flush: Option<i64> = sqlx::query_scalar(
                "SELECT CAST(@@GLOBAL.innodb_flush_log_at_trx_commit AS SIGNED)",
            )
            .fetch_one(&mut *c)
            .await
            .ok();
            if flush == Some(0) {
                tracing::warn!(
                    server = %label,
                    "innodb_flush_log_at_trx_commit is 0: a server crash forgets up to a \
                     second of acknowledged grants and token raises, so a lock can go to \
                     two holders; set it to 1 (or 2, which survives a server crash but not \
                     the machine's)"
                );
            }
        }
        let me = MySqlBackend {
            pool,
            label,
            identity,
            timeout,
            wakeups,
            bell: Arc::new(AtomicI64::new(0)),
            doorbell: Default::default(),
            // The doorbell sleeps by design: no slow-statement warnings for it.
            bell_opts: sqlx::ConnectOptions::disable_statement_logging(opts),
            watching: Default::default(),
            fast: fast.into(),
            holders,
        };
        if doorbell {
            me.start_doorbell().await?;
        }
        Ok(me)
    }

    /// Starts this client's doorbell unless it runs already.
    pub(super) async fn start_doorbell(&self) -> Result<()> {
        let mut doorbell = self.doorbell.lock().await;
        if doorbell.is_some() {
            return Ok(());
        }
        let mut first = MySqlConnection::connect_with(&self.bell_opts)
            .await
            .map_err(|e| self.db(e))?;
        let id = doorbell_id(&mut first).await.map_err(|e| self.db(e))?;
        self.bell.store(id, Ordering::Release);
        *doorbell = Some(tokio::spawn(doorbell_loop(
            first,
            self.bell_opts.clone(),
            self.bell.clone(),
            self.wakeups.clone(),
        )));
        Ok(())
    }

    pub(crate) fn db(&self, e: sqlx::Error) -> Error {
        db(&self.label, e)
    }

    /// The server's name in messages (password redacted).
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// The shared pool, for statements that need no session of their own.
    /// The names a query of [`NAMES`]'s shape finds under `prefix` (bound
    /// as bytes, as often as the query takes it).
    pub(crate) async fn names_by(&self, sql: &'static str, prefix: &str) -> Result<Vec<LockName>> {
        let mut q = sqlx::query_as::<_, (Vec<u8>,)>(sql);
        for _ in 0..sql.matches('?').count() {
            q = q.bind(prefix.as_bytes());
        }
        let rows = q.fetch_all(&self.pool).await.map_err(|e| self.db(e))?;
        Ok(crate::backend::sql::names_of(
            rows.into_iter().filter_map(|r| String::from_utf8(r.0).ok()),
        ))
    }

    pub(crate) fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Raises and returns the fencing token of `name` (advisory mode): one
    /// statement, never below the database clock in µs, read back through
    /// `LAST_INSERT_ID(expr)` in the reply.
    pub(crate) async fn next_token(&self, name: &str) -> Result<u64> {
        let r = sqlx::query(NEXT_TOKEN)
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(|e| self.db(e))?;
        Ok(r.last_insert_id())
    }

    /// The last token of `name`, 0 if none.
    pub(crate) async fn last_token(&self, name: &str) -> Result<u64> {
        let row = sqlx::query(LAST_TOKEN)
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.db(e))?;
        Ok(row.try_get::<i64, _>("token").map_err(|e| self.db(e))? as u64)
    }
}

/// A deadlock or lock-wait timeout: the transaction can simply run again.
fn is_conflict(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "40001" || c == "HY000" && e.to_string().contains("try restarting"))
}

/// The server's own error number (`ER_…`), where the error came from it.
fn error_number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(|d| d.number())
}

/// Maps a driver error to fenced's kinds.
fn db(label: &str, e: sqlx::Error) -> Error {
    let code = e
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned());
    match code.as_deref() {
        // access denied, unknown database
        Some("28000") | Some("42000")
            if e.to_string().contains("denied") || e.to_string().contains("Unknown database") =>
        {
            Error::invalid(format!("MySQL at {label} refused us: {e}")).with_source(e)
        }
        Some("08S01") | Some("08004") | Some("HY000") | Some("40001") => {
            Error::unavailable(format!("MySQL at {label} cannot serve us now: {e}")).with_source(e)
        }
        Some(_) => {
            Error::protocol(format!("MySQL at {label} answered with an error: {e}")).with_source(e)
        }
        None => match e {
            sqlx::Error::ColumnDecode { .. }
            | sqlx::Error::Decode(_)
            | sqlx::Error::ColumnNotFound(_)
            | sqlx::Error::TypeNotFound { .. } => {
                Error::protocol(format!("unexpected data from MySQL at {label}: {e}"))
                    .with_source(e)
            }
            _ => Error::unavailable(format!("MySQL at {label} is unreachable: {e}")).with_source(e),
        },
    }
}

impl MySqlBackend {
    /// `fenced doctor` on MariaDB and MySQL: redo-log durability and the
    /// clock; with `advisory`, what bounds a `GET_LOCK` too. What cannot
    /// be read is `Unknown`, with why.
    pub(crate) async fn checks(&self, advisory: bool) -> Result<Vec<crate::doctor::Check>> {
        use crate::doctor::{Check, Verdict};
        let mut out = Vec::new();
        let flush: std::result::Result<i64, _> =
            sqlx::query_scalar("SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED)")
                .fetch_one(&self.pool)
                .await;
        let name = "innodb_flush_log_at_trx_commit";
        out.push(match flush {
            Ok(f @ (1 | 3)) => Check::new(
                name,
                Verdict::Pass,
                format!("{f}: a grant is on disk before it is answered"),
            ),
            Ok(2) => Check::new(
                name,
                Verdict::Warn,
                "2: the redo log reaches the kernel at each commit and the disk once a \
                 second, so a crash of the host (not of the server alone) can forget up to a \
                 second of grants and let a second holder in",
            ),
            Ok(n) => Check::new(
                name,
                Verdict::Fail,
                format!(
                    "{n}: the redo log is written once a second, so a server crash can forget \
                     up to a second of grants and let a second holder in; set it to 1"
                ),
            ),
            Err(e) => Check::new(name, Verdict::Unknown, e.to_string()),
        });
        if advisory {
            // GET_LOCK is local to one node of a Galera cluster: two
            // clients on two nodes both get the lock.
            let wsrep: std::result::Result<String, _> =
                sqlx::query_scalar("SELECT CAST(@@wsrep_on AS CHAR)")
                    .fetch_one(&self.pool)
                    .await;
            out.push(match wsrep {
                Ok(on) if on == "1" || on.eq_ignore_ascii_case("on") => Check::new(
                    "galera",
                    Verdict::Fail,
                    "wsrep_on: GET_LOCK is local to the node a client is connected to, so \
                     clients of two nodes both get a lock; use the lease table (no \
                     ?mode=advisory), which Galera replicates",
                ),
                Ok(_) => Check::new("galera", Verdict::Pass, "not a Galera node"),
                // MySQL and a MariaDB built without wsrep have no such
                // variable: no Galera.
                Err(_) => Check::new("galera", Verdict::Pass, "no wsrep: not a Galera node"),
            });
        }
        let now: std::result::Result<f64, _> =
            sqlx::query_scalar("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) AS DOUBLE)")
                .fetch_one(&self.pool)
                .await;
        out.push(crate::doctor::clock_read(now));
        Ok(out)
    }
}

/// Whether `fenced_holds` has the `holder` column, adding it to tables an
/// older fenced made; a user who may not alter them goes on without it
/// (holds then show no holder), and says so. Run under `fenced_schema`,
/// which the caller releases after: no error returns early.
async fn has_holder_column(c: &mut sqlx::MySqlConnection, label: &str) -> bool {
    let has = async |c: &mut sqlx::MySqlConnection| {
        sqlx::query_scalar::<_, i64>(HAS_HOLDER)
            .fetch_one(c)
            .await
            .map(|n| n > 0)
    };
    let added = match has(&mut *c).await {
        Ok(true) => return true,
        Ok(false) => sqlx::query(ADD_HOLDER).execute(&mut *c).await.map(drop),
        Err(e) => Err(e),
    };
    match added {
        Ok(()) => true,
        // Another process added it first (the schema lock timed out).
        Err(_) if has(&mut *c).await.unwrap_or(false) => true,
        Err(e) => {
            tracing::warn!(
                server = %label,
                error = %e,
                "cannot add the column holder to fenced_holds: holds will not show their \
                 host, process and command"
            );
            false
        }
    }
}
