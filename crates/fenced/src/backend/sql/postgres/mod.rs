//! `postgres://user:pass@host:5432/db`: a lease table in PostgreSQL.
//!
//! # Layout
//!
//! [`SCHEMA`], created on first use (under an advisory lock, so processes
//! that start together do not race): `fenced_locks` has a row per name
//! with its last fencing token, kept after release so tokens only rise;
//! `fenced_holds` a row per grant with its owner, mode, token and expiry;
//! `fenced_waiters` the fair queue; `fenced_registers` fenced registers.
//!
//! Every grant is one short `READ COMMITTED` transaction that first locks
//! the name's `fenced_locks` row (`INSERT … ON CONFLICT DO UPDATE`), so two
//! acquirers of one name are serialised whatever the server's default
//! isolation, then applies the grant rule every backend shares
//! ([`grantable`]). A lock with no hold row at all is granted in one round
//! trip by the function `fenced_try_grant`, the same steps server-side.
//! **All times are the database's** (`clock_timestamp()`), never a
//! client's: expiry, queue places, and the token floor (a token is never
//! below the database clock in µs).
//!
//! # Wake-ups
//!
//! Every change `NOTIFY`s channel `fenced_wake` with the lock name (sent at
//! commit); each client `LISTEN`s on one connection and wakes its waiters
//! of that name. Waiters fair or not take a place in `fenced_waiters`, and
//! a change a waiter may use names the queue's head first
//! (`\x02<ticket>:<name>`), so only the head's process looks: without it,
//! each release woke a waiter in every waiting process, and all but one
//! asked in vain (S2 in `docs/benchmarks.md`). The bare name follows for
//! clients that do not read heads, and a client that does skips it
//! ([`Heard`]). A holder that dies sends nothing, so waiters also look
//! again when the first lease in their way ends.

use crate::backend::sql::{SqlUrl, hold_row, ms, waiters_and_token};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::grant::{Decision, decide, stands};
use crate::spi::lease::QUEUE_TTL;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, HoldRef, LockBackend, LockStatus, Outcome, RegisterValue,
    RegisterWrite, Renewal, Reply, Store, Withdrawal,
};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection, Row};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

mod attempt;
mod holds;
pub(crate) mod queries;
mod store;
use queries::*;

pub(crate) struct PgBackend {
    pool: PgPool,
    label: String,
    /// `postgres://host:port/database`, whatever URL named it.
    identity: String,
    /// How long one request may take (`timeout=`).
    timeout: Duration,
    /// Whether `fenced_try_grant2` can be called.
    fast: std::sync::atomic::AtomicBool,
    /// Whether `fenced_holds` has the `holder` column.
    holders: bool,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl PgBackend {
    /// Opens `postgres://…`: the lease table, or with `?mode=advisory`
    /// session advisory locks beside it.
    pub(crate) async fn open(url: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
        let (me, opts, advisory) = PgBackend::open_table(url, wakeups.clone()).await?;
        if advisory {
            return crate::backend::sql::postgres_advisory::PgAdvisory::open(me, opts, wakeups)
                .await;
        }
        Ok(me)
    }

    /// The lease-table backend, the options for more connections, and
    /// whether `mode=advisory` was asked for.
    async fn open_table(
        url: &str,
        wakeups: Arc<Wakeups>,
    ) -> Result<(Arc<PgBackend>, PgConnectOptions, bool)> {
        let SqlUrl {
            label,
            driver,
            pool_size,
            advisory,
            timeout,
        } = SqlUrl::parse(url, "PostgreSQL", "session advisory locks")?;
        let opts = PgConnectOptions::from_str(driver.as_str()).map_err(|e| {
            Error::invalid(format!("bad PostgreSQL URL {label:?}: {e}")).with_source(e)
        })?;
        let identity = format!(
            "postgres://{}:{}/{}",
            opts.get_host(),
            opts.get_port(),
            opts.get_database().unwrap_or(opts.get_username())
        );
        crate::backend::sql::first_connection::<sqlx::PgConnection>(&opts, timeout)
            .await
            .map_err(|e| match e {
                Some(e) => db(&label, e),
                None => Error::unavailable(format!(
                    "PostgreSQL at {label} did not answer within {timeout:?}"
                )),
            })?;
        let pool = PgPoolOptions::new()
            .max_connections(pool_size)
            .acquire_timeout(timeout)
            .test_before_acquire(false)
            .before_acquire(|c, meta| Box::pin(crate::backend::sql::still_there(c, meta)))
            .after_connect(move |c, _| Box::pin(prepare(c, timeout)))
            .connect_with(opts.clone())
            .await
            .map_err(|e| db(&label, e))?;
        let mut tx = pool.begin().await.map_err(|e| db(&label, e))?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(SCHEMA_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(|e| db(&label, e))?;
        // A role given only DML on tables an administrator created may not
        // run even `CREATE TABLE IF NOT EXISTS` (it needs CREATE on the schema).
        let has_tables: bool = sqlx::query_scalar(HAS_TABLES)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| db(&label, e))?;
        if !has_tables {
            sqlx::raw_sql(SCHEMA).execute(&mut *tx).await.map_err(|e| {
                if has_state(&e, &["42501"]) {
                    Error::invalid(format!(
                        "{label} does not let this role create fenced's tables ({e}): \
                         create them as the README's PostgreSQL layout shows, or grant \
                         CREATE on the schema"
                    ))
                    .with_source(e)
                } else {
                    db(&label, e)
                }
            })?;
        }
        let holders = has_holder_column(&mut tx, &label).await?;
        // The one-call grant writes the holder: without the column, every
        // acquire takes the full transaction.
        let fast = holders && {
            let mut savepoint = tx.begin().await.map_err(|e| db(&label, e))?;
            match sqlx::raw_sql(TRY_GRANT_DDL).execute(&mut *savepoint).await {
                Ok(_) => savepoint.commit().await.is_ok(),
                Err(e) => {
                    tracing::warn!(
                        server = %label,
                        error = %e,
                        "{}",
                        crate::backend::sql::NO_GRANT_FUNCTION
                    );
                    let _ = savepoint.rollback().await;
                    false
                }
            }
        };
        tx.commit().await.map_err(|e| db(&label, e))?;
        // The listener keeps a connection for good: one of its own, not one
        // of the `pool=` the grants share (with `pool=1` it took the only
        // one, and no grant could run).
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(timeout)
            .connect_lazy_with(opts.clone());
        let mut listener = PgListener::connect_with(&listen_pool)
            .await
            .map_err(|e| db(&label, e))?;
        listener.listen(CHANNEL).await.map_err(|e| db(&label, e))?;
        let listener = tokio::spawn(listen(listener, wakeups));
        let me = Arc::new(PgBackend {
            pool,
            label,
            identity,
            timeout,
            fast: fast.into(),
            holders,
            listener,
        });
        Ok((me, opts, advisory))
    }

    /// The URL with its password hidden.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// Wakes the waiters of `name` in every client.
    pub(crate) async fn wake_waiters(&self, name: &str) {
        if let Err(e) = sqlx::query(NOTIFY).bind(name).fetch_one(&self.pool).await {
            tracing::debug!(error = %e, "NOTIFY failed; waiters will look again on their own");
        }
    }

    /// Raises and returns the fencing token of `name` (advisory mode).
    pub(crate) async fn next_token(&self, c: &mut PgConnection, name: &str) -> Result<u64> {
        let row = sqlx::query(NEXT_TOKEN)
            .bind(name)
            .fetch_one(c)
            .await
            .map_err(|e| self.db(e))?;
        Ok(row.try_get::<i64, _>("token").map_err(|e| self.db(e))? as u64)
    }

    /// The last token of `name`.
    pub(crate) async fn last_token(&self, name: &str) -> Result<u64> {
        let row = sqlx::query(STATUS_WAITERS)
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.db(e))?;
        Ok(row.try_get::<i64, _>("token").map_err(|e| self.db(e))? as u64)
    }

    /// The shared pool, for queries that need no session of their own.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(crate) fn db(&self, e: sqlx::Error) -> Error {
        db(&self.label, e)
    }
}

/// The queue head a notification names (`\x02<ticket>:<name>`), if it
/// names one. A control character starts no lock name.
fn head_of(payload: &str) -> Option<(i64, &str)> {
    let (ticket, name) = payload.strip_prefix('\u{2}')?.split_once(':')?;
    Some((ticket.parse().ok().filter(|t| *t > 0)?, name))
}

/// What one notification asks of this client's waiters.
#[derive(Debug, PartialEq, Eq)]
enum Heard<'a> {
    /// The head of `name`'s queue may go: wake it alone.
    Head(&'a str, i64),
    /// Something changed: wake the waiters of this name.
    Name(&'a str),
    /// The bare name that follows a head, for older clients: the head
    /// was woken already, and no one else need look.
    Skip,
}

/// Reads notifications in the order they come: a head, then the same
/// name from the same server process (one transaction's two, which reach
/// a listener together and in order), is one wake-up.
#[derive(Default)]
struct Notices {
    /// The last notification's head, and the server process that sent it.
    after_head: Option<(u32, String)>,
}

impl Notices {
    fn read<'a>(&mut self, pid: u32, payload: &'a str) -> Heard<'a> {
        let before = self.after_head.take();
        if let Some((ticket, name)) = head_of(payload) {
            self.after_head = Some((pid, name.to_owned()));
            return Heard::Head(name, ticket);
        }
        match before {
            Some((p, name)) if p == pid && name == payload => Heard::Skip,
            _ => Heard::Name(payload),
        }
    }
}

/// Turns notifications into wake-ups; after a lost connection (sqlx's
/// listener reconnects on its own) every waiter looks again.
async fn listen(mut listener: PgListener, wakeups: Arc<Wakeups>) {
    let mut notices = Notices::default();
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) => match notices.read(n.process_id(), n.payload()) {
                Heard::Head(name, ticket) => wakeups.wake_ticket(name, ticket),
                Heard::Name(name) => wakeups.wake(name),
                Heard::Skip => {}
            },
            Ok(None) => {
                notices = Notices::default();
                tracing::debug!("PostgreSQL listener reconnected; waiters will look again");
                wakeups.wake_each();
            }
            Err(e) => {
                tracing::debug!(error = %e, "PostgreSQL listener failed; retrying");
                notices = Notices::default();
                wakeups.wake_each();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Whether the server's error has one of these SQLSTATEs.
pub(crate) fn has_state(e: &sqlx::Error, states: &[&str]) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| states.contains(&c.as_ref()))
}

/// Serialization failure or deadlock: the transaction can simply run again.
fn is_conflict(e: &sqlx::Error) -> bool {
    has_state(e, &["40001", "40P01"])
}

/// Maps a driver error to fenced's kinds.
pub(crate) fn db(label: &str, e: sqlx::Error) -> Error {
    let code = e
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned());
    match code.as_deref() {
        // invalid authorization, password, database or role
        Some(c) if c.starts_with("28") || c == "3D000" => {
            Error::invalid(format!("PostgreSQL at {label} refused us: {e}")).with_source(e)
        }
        Some("22P02") => Error::protocol(format!(
            "PostgreSQL at {label}: a register does not hold a decimal integer ({e})"
        ))
        .with_source(e),
        Some(c)
            if c.starts_with("08")
                || c.starts_with("57")
                || c.starts_with("53")
                || c == "40001"
                || c == "40P01" =>
        {
            Error::unavailable(format!("PostgreSQL at {label} cannot serve us now: {e}"))
                .with_source(e)
        }
        Some(_) => Error::protocol(format!("PostgreSQL at {label} answered with an error: {e}"))
            .with_source(e),
        None => match e {
            sqlx::Error::ColumnDecode { .. }
            | sqlx::Error::Decode(_)
            | sqlx::Error::ColumnNotFound(_)
            | sqlx::Error::TypeNotFound { .. } => {
                Error::protocol(format!("unexpected data from PostgreSQL at {label}: {e}"))
                    .with_source(e)
            }
            _ => Error::unavailable(format!("PostgreSQL at {label} is unreachable: {e}"))
                .with_source(e),
        },
    }
}

impl PgBackend {
    /// `fenced doctor` on PostgreSQL: commit durability and the clock.
    /// What cannot be read (a managed server's restrictions) is
    /// `Unknown`, with why.
    pub(crate) async fn checks(&self) -> Result<Vec<crate::doctor::Check>> {
        use crate::doctor::{Check, Verdict};
        let mut out = Vec::new();
        // fenced turns synchronous_commit on for its own sessions (see
        // DURABLE_COMMITS): what matters is that it took, and what the
        // server gives everyone else.
        let commit: std::result::Result<(String, String), _> = sqlx::query_as(
            "SELECT current_setting('synchronous_commit'), reset_val \
             FROM pg_settings WHERE name = 'synchronous_commit'",
        )
        .fetch_one(&self.pool)
        .await;
        out.push(match commit {
            Ok((ours, _)) if ours == "off" => Check::new(
                "synchronous_commit",
                Verdict::Fail,
                "off on fenced's own sessions: a commit is acknowledged before it is durable, \
                 so a server crash can forget a grant it answered and let a second holder in",
            ),
            Ok((ours, default)) if default == "off" => Check::new(
                "synchronous_commit",
                Verdict::Pass,
                format!(
                    "off by default on this server, but fenced sets it to {ours} on its own \
                     sessions: grants are durable when answered (other writers here are not)"
                ),
            ),
            Ok((ours, _)) => Check::new(
                "synchronous_commit",
                Verdict::Pass,
                format!("{ours}: a grant is durable when answered"),
            ),
            Err(e) => Check::new("synchronous_commit", Verdict::Unknown, e.to_string()),
        });
        let fsync: std::result::Result<String, _> =
            sqlx::query_scalar("SHOW fsync").fetch_one(&self.pool).await;
        out.push(match fsync {
            Ok(f) if f == "off" => Check::new(
                "fsync",
                Verdict::Fail,
                "off: a crash of the host (not of PostgreSQL alone) can lose grants and \
                 corrupt the database; set it to on",
            ),
            Ok(f) => Check::new("fsync", Verdict::Pass, f),
            Err(e) => Check::new("fsync", Verdict::Unknown, e.to_string()),
        });
        let now: std::result::Result<f64, _> =
            sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
                .fetch_one(&self.pool)
                .await;
        out.push(crate::doctor::clock_read(now));
        Ok(out)
    }
}

/// Whether `fenced_holds` has the `holder` column, adding it to tables an
/// older fenced made; a role that may not alter them goes on without it
/// (holds then show no holder), and says so.
async fn has_holder_column(c: &mut sqlx::PgConnection, label: &str) -> Result<bool> {
    let has = async |c: &mut sqlx::PgConnection| {
        sqlx::query_scalar::<_, bool>(HAS_HOLDER)
            .fetch_one(c)
            .await
            .map_err(|e| db(label, e))
    };
    if has(&mut *c).await? {
        return Ok(true);
    }
    let mut savepoint = sqlx::Connection::begin(&mut *c)
        .await
        .map_err(|e| db(label, e))?;
    match sqlx::query(ADD_HOLDER).execute(&mut *savepoint).await {
        Ok(_) => {
            savepoint.commit().await.map_err(|e| db(label, e))?;
            Ok(true)
        }
        Err(e) => {
            let _ = savepoint.rollback().await;
            if has(&mut *c).await.unwrap_or(false) {
                return Ok(true);
            }
            // A lock wait that timed out (the table busy) is tried again
            // by the next client to open; missing rights, by nobody.
            tracing::warn!(
                server = %label,
                error = %e,
                "cannot add the column holder to fenced_holds: holds will not show their \
                 host, process and command, and every acquire takes the full transaction \
                 (ALTER TABLE fenced_holds ADD COLUMN holder TEXT)"
            );
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Heard, Notices, head_of};

    #[test]
    fn a_head_and_its_bare_name_are_one_wake_up() {
        assert_eq!(head_of("\u{2}42:orders:7"), Some((42, "orders:7")));
        assert_eq!(head_of("orders"), None);
        assert_eq!(head_of("\u{2}x:orders"), None);
        assert_eq!(head_of("\u{2}0:orders"), None);
        let mut n = Notices::default();
        assert_eq!(n.read(7, "\u{2}42:a"), Heard::Head("a", 42));
        assert_eq!(n.read(7, "a"), Heard::Skip);
        // Only the one right after the head is its pair.
        assert_eq!(n.read(7, "a"), Heard::Name("a"));
        // An older client's release sends the bare name alone.
        assert_eq!(n.read(8, "a"), Heard::Name("a"));
        // Another process's, or another name's, is not the pair.
        assert_eq!(n.read(7, "\u{2}43:a"), Heard::Head("a", 43));
        assert_eq!(n.read(9, "a"), Heard::Name("a"));
        assert_eq!(n.read(7, "\u{2}44:a"), Heard::Head("a", 44));
        assert_eq!(n.read(7, "b"), Heard::Name("b"));
        assert_eq!(n.read(7, "\u{1}register"), Heard::Name("\u{1}register"));
    }
}
