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
//! [`mysql_advisory`](super::mysql_advisory).
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
//! wait at once; the woken client looks again. A ring that lands while a
//! doorbell re-arms is lost, and a holder that dies rings nothing, so
//! waiters also look again when the first lease in their way ends. `KILL
//! QUERY` of one's own user's connections needs no privilege.
//!
//! Connection ids start again from 1 when the server restarts, while the
//! waiters' rows survive it: a ring must never reach a connection that
//! took over an old doorbell's id. So each doorbell holds the user lock
//! `fenced_doorbell:<its connection id>` for as long as it lives, and a
//! releaser rings only ids whose lock is held by that very connection.

use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::grant::{Held, grantable, permits_differ};
use crate::spi::lease::QUEUE_TTL;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, HoldRef, HolderInfo, LockBackend, LockStatus, Mode,
    Outcome, RegisterValue, Renewal, Store, Ticket,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{Connection, MySqlConnection, Row};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

/// The tables (also in the README).
pub(crate) const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS fenced_locks (
        name  VARBINARY(512) PRIMARY KEY,
        token BIGINT NOT NULL DEFAULT 0
    ) ENGINE = InnoDB",
    "CREATE TABLE IF NOT EXISTS fenced_holds (
        hold_id    VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,
        name       VARBINARY(512) NOT NULL,
        owner      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        `mode`     SMALLINT NOT NULL,
        take       INT NOT NULL,
        `max`      INT NOT NULL,
        token      BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL,
        KEY fenced_holds_name (name)
    ) ENGINE = InnoDB",
    "CREATE TABLE IF NOT EXISTS fenced_waiters (
        ticket     BIGINT AUTO_INCREMENT PRIMARY KEY,
        name       VARBINARY(512) NOT NULL,
        fair       TINYINT NOT NULL,
        bell       BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL,
        KEY fenced_waiters_name (name, ticket)
    ) ENGINE = InnoDB",
    "CREATE TABLE IF NOT EXISTS fenced_registers (
        name  VARBINARY(512) PRIMARY KEY,
        value LONGBLOB NOT NULL,
        fence BIGINT NOT NULL
    ) ENGINE = InnoDB",
];

/// A free lock's grant in one round trip: `SELECT fenced_try_grant(…)`
/// runs as one statement, so in one transaction (autocommit). It does what
/// [`MySqlBackend::attempt_tx`] does for an unfair, unqueued acquire of a
/// name without holds, and returns NULL, leaving the decision to that
/// transaction, when any hold row exists. The reads are locking reads, so
/// they see the latest commits whatever the isolation level.
const TRY_GRANT_DDL: &str = "CREATE FUNCTION IF NOT EXISTS fenced_try_grant(
    p_name VARBINARY(512), p_hold VARCHAR(64) CHARACTER SET ascii,
    p_owner VARCHAR(1024) CHARACTER SET utf8mb4, p_mode SMALLINT, p_take INT, p_max INT,
    p_ms BIGINT) RETURNS BIGINT NOT DETERMINISTIC MODIFIES SQL DATA
BEGIN
    DECLARE v_last, v_us, v_now, v_token BIGINT;
    DECLARE v_holds INT;
    INSERT INTO fenced_locks (name) VALUES (p_name) ON DUPLICATE KEY UPDATE token = token;
    SELECT token, CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED),
        CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)
        INTO v_last, v_us, v_now FROM fenced_locks WHERE name = p_name FOR UPDATE;
    SELECT COUNT(*) INTO v_holds FROM fenced_holds WHERE name = p_name FOR UPDATE;
    IF v_holds > 0 THEN
        RETURN NULL;
    END IF;
    SET v_token = GREATEST(v_last + 1, v_us);
    UPDATE fenced_locks SET token = v_token WHERE name = p_name;
    INSERT INTO fenced_holds (hold_id, name, owner, `mode`, take, `max`, token, expires_ms)
        VALUES (p_hold, p_name, p_owner, p_mode, p_take, p_max, v_token, v_now + p_ms);
    RETURN v_token;
END";

const TRY_GRANT: &str = "SELECT fenced_try_grant(?, ?, ?, ?, ?, ?, ?)";

const NOW_MS: &str = "CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)";

const LOCK_NAME: &str =
    "INSERT INTO fenced_locks (name) VALUES (?) ON DUPLICATE KEY UPDATE token = token";
const READ_NAME: &str = "SELECT token,
    CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED) AS now_us,
    CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) AS now_ms
    FROM fenced_locks WHERE name = ? FOR UPDATE";
const PURGE_HOLDS: &str = "DELETE FROM fenced_holds WHERE name = ? AND expires_ms <= ?";
const PURGE_WAITERS: &str = "DELETE FROM fenced_waiters WHERE name = ? AND expires_ms <= ?";
const SELECT_HOLDS: &str = "SELECT hold_id, owner, `mode`, take, `max`, token, expires_ms
    FROM fenced_holds WHERE name = ? AND expires_ms > ?";
const QUEUE: &str = "SELECT
    CAST(EXISTS (SELECT 1 FROM fenced_waiters WHERE ticket = ? AND name = ?) AS SIGNED) AS mine,
    CAST(EXISTS (SELECT 1 FROM fenced_waiters WHERE name = ? AND fair = 1 AND ticket < ?) AS SIGNED) AS ahead";
const SET_TOKEN: &str = "UPDATE fenced_locks SET token = ? WHERE name = ?";
const INSERT_HOLD: &str = "INSERT INTO fenced_holds
    (hold_id, name, owner, `mode`, take, `max`, token, expires_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)";
const DELETE_TICKET: &str = "DELETE FROM fenced_waiters WHERE ticket = ?";
const REFRESH_TICKET: &str = "UPDATE fenced_waiters SET expires_ms = ?, bell = ? WHERE ticket = ?";
const INSERT_WAITER: &str =
    "INSERT INTO fenced_waiters (name, fair, bell, expires_ms) VALUES (?, ?, ?, ?)";
const BELLS: &str = "SELECT bell FROM fenced_waiters
    WHERE name = ? AND expires_ms > CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)
      AND IS_USED_LOCK(CONCAT('fenced_doorbell:', bell)) = bell
    ORDER BY ticket LIMIT 8";
/// What a doorbell holds to show it is one (see the module docs).
const DOORBELL_MARK: &str =
    "SELECT CAST(GET_LOCK(CONCAT('fenced_doorbell:', CONNECTION_ID()), 0) AS SIGNED) AS got";
const FORGET_BELL: &str = "DELETE FROM fenced_waiters WHERE bell = ?";
const RELEASE: &str = "DELETE FROM fenced_holds WHERE hold_id = ?
    RETURNING name, CAST(expires_ms > CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) AS SIGNED) AS live";
const ABANDON_TICKET: &str = "DELETE FROM fenced_waiters WHERE ticket = ?";
const ABANDON_HOLD: &str = "DELETE FROM fenced_holds WHERE hold_id = ?";
const STATUS_HOLDS: &str = "SELECT hold_id, owner, `mode`, take, `max`, token, expires_ms,
    CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) AS now_ms
    FROM fenced_holds WHERE name = ?";
const STATUS_REST: &str = "SELECT
    CAST((SELECT count(*) FROM fenced_waiters WHERE name = ?
          AND expires_ms > CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)) AS SIGNED) AS waiters,
    CAST(COALESCE((SELECT token FROM fenced_locks WHERE name = ?), 0) AS SIGNED) AS token";
const NEXT_TOKEN: &str = "INSERT INTO fenced_locks (name, token)
    VALUES (?, LAST_INSERT_ID(CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)))
    ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, VALUES(token)))";
const LAST_TOKEN: &str =
    "SELECT CAST(COALESCE((SELECT token FROM fenced_locks WHERE name = ?), 0) AS SIGNED) AS token";
const FORCE: &str = "DELETE FROM fenced_holds WHERE name = ?";
const REGISTER_READ: &str = "SELECT value, fence FROM fenced_registers WHERE name = ?";
const REGISTER_LOCK: &str = "SELECT value, fence FROM fenced_registers WHERE name = ? FOR UPDATE";
const REGISTER_SWAP: &str =
    "UPDATE fenced_registers SET value = ?, fence = fence + 1 WHERE name = ? AND fence = ?";
const REGISTER_CREATE: &str =
    "INSERT IGNORE INTO fenced_registers (name, value, fence) VALUES (?, ?, 1)";
const REGISTER_UPSERT: &str = "INSERT INTO fenced_registers (name, value, fence) VALUES (?, ?, ?)
    ON DUPLICATE KEY UPDATE value = VALUES(value), fence = VALUES(fence)";

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
    /// None in advisory mode, whose waiters the server itself wakes.
    doorbell: Option<tokio::task::JoinHandle<()>>,
    /// Whether `fenced_try_grant` exists (see [`TRY_GRANT_DDL`]).
    fast: AtomicBool,
}

impl Drop for MySqlBackend {
    fn drop(&mut self) {
        if let Some(d) = &self.doorbell {
            d.abort();
        }
    }
}

fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

impl MySqlBackend {
    /// Where this backend's waiters are woken (shared with the advisory
    /// backend built on it).
    pub(crate) fn wakeups(&self) -> &Arc<Wakeups> {
        &self.wakeups
    }

    pub(crate) async fn open(url: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
        let label = crate::spi::endpoints::redact(url);
        let mut parsed = url::Url::parse(url)
            .map_err(|e| Error::invalid(format!("bad MySQL URL {label:?}: {e}")))?;
        if parsed.scheme() == "mariadb" {
            let _ = parsed.set_scheme("mysql");
        }
        let mut pool_size: u32 = 8;
        let mut advisory = false;
        let mut timeout = crate::spi::DEFAULT_TIMEOUT;
        let mut kept = Vec::new();
        for (k, v) in parsed.query_pairs() {
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
                "mode" => {
                    advisory = match v.as_ref() {
                        "advisory" => true,
                        "lease" => false,
                        _ => {
                            return Err(Error::invalid(format!(
                                "mode={v:?} in {label:?}: `lease` (the default, a lease \
                                 table) or `advisory` (GET_LOCK session locks)"
                            )));
                        }
                    };
                }
                _ => kept.push((k.into_owned(), v.into_owned())),
            }
        }
        parsed.set_query(None);
        if !kept.is_empty() {
            parsed.query_pairs_mut().extend_pairs(&kept);
        }
        let opts = MySqlConnectOptions::from_str(parsed.as_str())
            .map_err(|e| Error::invalid(format!("bad MySQL URL {label:?}: {e}")).with_source(e))?;
        let table =
            Self::connect(label, opts.clone(), pool_size, !advisory, timeout, wakeups).await?;
        if advisory {
            return super::mysql_advisory::MySqlAdvisory::open(Arc::new(table), opts).await;
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
        let pool = MySqlPoolOptions::new()
            .max_connections(pool_size)
            .acquire_timeout(timeout)
            .test_before_acquire(false)
            .before_acquire(|c, meta| Box::pin(super::still_there(c, meta)))
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
        let fast;
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
            // CREATE FUNCTION is not a preparable statement: text protocol.
            fast = match sqlx::raw_sql(TRY_GRANT_DDL).execute(&mut *c).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(
                        server = %label,
                        error = %e,
                        "cannot create the function fenced_try_grant: every acquire takes \
                         the full transaction"
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
        let bell = Arc::new(AtomicI64::new(0));
        let doorbell = if doorbell {
            // The doorbell sleeps by design: no slow-statement warnings for it.
            let bell_opts = sqlx::ConnectOptions::disable_statement_logging(opts);
            let mut first = MySqlConnection::connect_with(&bell_opts)
                .await
                .map_err(|e| db(&label, e))?;
            let id = doorbell_id(&mut first).await.map_err(|e| db(&label, e))?;
            bell.store(id, Ordering::Release);
            Some(tokio::spawn(ring_loop(
                first,
                bell_opts,
                bell.clone(),
                wakeups.clone(),
            )))
        } else {
            None
        };
        Ok(MySqlBackend {
            pool,
            label,
            identity,
            timeout,
            wakeups,
            bell,
            doorbell,
            fast: fast.into(),
        })
    }

    pub(crate) fn db(&self, e: sqlx::Error) -> Error {
        db(&self.label, e)
    }

    /// The server's name in messages (password redacted).
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// The shared pool, for statements that need no session of their own.
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

    async fn attempt_inner(&self, req: &Attempt) -> Result<Outcome> {
        // Dropped since we opened, or made by a role that did not grant us
        // EXECUTE (ER_SP_DOES_NOT_EXIST, ER_PROCACCESS_DENIED_ERROR).
        let gone = |e: &sqlx::Error| matches!(error_number(e), Some(1305 | 1370));
        let fast =
            super::try_fast_grant(&self.fast, req, self.call_try_grant(req), is_conflict, gone);
        if let Some(o) = fast.await.map_err(|e| self.db(e))? {
            return Ok(o);
        }
        let mut tries = 0;
        loop {
            match self.attempt_tx(req).await {
                Err(e) if is_conflict(&e) && tries < 10 => tries += 1,
                Err(e) => return Err(self.db(e)),
                Ok((o, changed)) => {
                    if changed {
                        self.ring(req.name.as_str()).await;
                    }
                    return Ok(o);
                }
            }
        }
    }

    /// [`TRY_GRANT`]: the token of a grant in one round trip, or `None`
    /// when the full transaction must decide.
    async fn call_try_grant(&self, req: &Attempt) -> std::result::Result<Option<i64>, sqlx::Error> {
        let (take, max) = req.mode.permits();
        sqlx::query_scalar(TRY_GRANT)
            .bind(req.name.as_str())
            .bind(&req.hold_id)
            .bind(&req.owner_key)
            .bind(req.mode.code() as i16)
            .bind(take as i32)
            .bind(max as i32)
            .bind(ms(req.lease))
            .fetch_one(&self.pool)
            .await
    }

    async fn attempt_tx(&self, req: &Attempt) -> std::result::Result<(Outcome, bool), sqlx::Error> {
        let name = req.name.as_str();
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let c: &mut MySqlConnection = &mut tx;
        sqlx::query(LOCK_NAME).bind(name).execute(&mut *c).await?;
        let row = sqlx::query(READ_NAME).bind(name).fetch_one(&mut *c).await?;
        let last: i64 = row.try_get("token")?;
        let now_us: i64 = row.try_get("now_us")?;
        let now: i64 = row.try_get("now_ms")?;
        let purged = sqlx::query(PURGE_HOLDS)
            .bind(name)
            .bind(now)
            .execute(&mut *c)
            .await?;
        let mut changed = purged.rows_affected() > 0;
        sqlx::query(PURGE_WAITERS)
            .bind(name)
            .bind(now)
            .execute(&mut *c)
            .await?;
        let rows = sqlx::query(SELECT_HOLDS)
            .bind(name)
            .bind(now)
            .fetch_all(&mut *c)
            .await?;
        let holds = rows
            .iter()
            .map(|r| hold_row(r, now))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        // A retry of an attempt whose commit went through but whose answer
        // was lost: the grant stands (as the Redis script has it).
        if let Some(h) = holds.iter().find(|h| h.hold_id == req.hold_id) {
            let token = h.token as u64;
            tx.commit().await?;
            return Ok((Outcome::granted(token), changed));
        }
        let (mine, ahead) = if req.fair || req.ticket.is_some() {
            let t = req.ticket.unwrap_or(i64::MAX);
            let q = sqlx::query(QUEUE)
                .bind(t)
                .bind(name)
                .bind(name)
                .bind(t)
                .fetch_one(&mut *c)
                .await?;
            let mine = (q.try_get::<i64, _>("mine")? == 1)
                .then_some(())
                .and(req.ticket);
            (mine, q.try_get::<i64, _>("ahead")? == 1)
        } else {
            (None, false)
        };
        let held = holds.iter().map(|h| Held {
            owner_key: &h.owner,
            mode: h.mode,
        });
        let decision = grantable(held, &req.owner_key, req.mode, req.fair, ahead);
        let outcome = if let Err(theirs) = decision {
            Outcome::Refused(permits_differ(name, theirs, req.mode.permits().1))
        } else if decision == Ok(true) {
            let token = last.saturating_add(1).max(now_us);
            sqlx::query(SET_TOKEN)
                .bind(token)
                .bind(name)
                .execute(&mut *c)
                .await?;
            let (take, max) = req.mode.permits();
            sqlx::query(INSERT_HOLD)
                .bind(&req.hold_id)
                .bind(name)
                .bind(&req.owner_key)
                .bind(req.mode.code() as i16)
                .bind(take as i32)
                .bind(max as i32)
                .bind(token)
                .bind(now.saturating_add(ms(req.lease)))
                .execute(&mut *c)
                .await?;
            if let Some(t) = mine {
                sqlx::query(DELETE_TICKET).bind(t).execute(&mut *c).await?;
                changed |= req.fair;
            }
            Outcome::granted(token as u64)
        } else {
            let expires = now + ms(QUEUE_TTL);
            let bell = self.bell.load(Ordering::Acquire);
            let ticket = match (mine, req.will_wait) {
                (Some(t), _) => {
                    sqlx::query(REFRESH_TICKET)
                        .bind(expires)
                        .bind(bell)
                        .bind(t)
                        .execute(&mut *c)
                        .await?;
                    Some(t)
                }
                (None, true) => {
                    let r = sqlx::query(INSERT_WAITER)
                        .bind(name)
                        .bind(i8::from(req.fair))
                        .bind(bell)
                        .bind(expires)
                        .execute(&mut *c)
                        .await?;
                    Some(r.last_insert_id() as i64)
                }
                (None, false) => None,
            };
            let retry_after = holds
                .iter()
                .map(|h| Duration::from_millis(h.left_ms.max(1) as u64))
                .min();
            Outcome::Busy(Blocked {
                ticket,
                retry_after,
            })
        };
        tx.commit().await?;
        Ok((outcome, changed))
    }

    /// Wakes the oldest waiter of `name` (and this client's own waiters).
    async fn ring(&self, name: &str) {
        self.wakeups.bump(name);
        let rows = match sqlx::query(BELLS).bind(name).fetch_all(&self.pool).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::debug!(error = %e, "could not list waiters; they will look again on their own");
                return;
            }
        };
        let mine = self.bell.load(Ordering::Acquire);
        for row in rows {
            let Ok(bell) = row.try_get::<i64, _>("bell") else {
                continue;
            };
            if bell == mine {
                return;
            }
            if bell > 0 {
                let kill = format!("KILL QUERY {bell}");
                if sqlx::query(sqlx::AssertSqlSafe(kill))
                    .execute(&self.pool)
                    .await
                    .is_ok()
                {
                    return;
                }
            }
            // Nobody answers there any more: forget those waiters.
            let _ = sqlx::query(FORGET_BELL)
                .bind(bell)
                .execute(&self.pool)
                .await;
        }
    }
}

/// The doorbell: sleeps on the server until a `KILL QUERY` ends the sleep,
/// then wakes every waiter of this client. Reconnects if it must.
async fn ring_loop(
    mut conn: MySqlConnection,
    opts: MySqlConnectOptions,
    bell: Arc<AtomicI64>,
    wakeups: Arc<Wakeups>,
) {
    // The doorbell waits in GET_LOCK on a lock its anchor session holds,
    // not in SLEEP(): every SLEEP() in the server shares one mutex, and a
    // KILL QUERY that finds it taken retries for up to seconds, while a
    // GET_LOCK wait has a mutex of its own.
    let key = format!("fenced_bell:{}", uuid::Uuid::new_v4().simple());
    let mut anchor = None;
    loop {
        if anchor.is_none() {
            anchor = anchored(&opts, &key).await;
        }
        match wait_for_ring(&mut conn, &key).await {
            // Rung (the wait was interrupted) or waited an hour.
            Ok(None) | Ok(Some(0)) => {}
            // The anchor session is gone and the doorbell got its lock:
            // give it back and anchor again.
            Ok(Some(_)) => {
                let _ = sqlx::query("SELECT RELEASE_LOCK(?)")
                    .bind(&key)
                    .execute(&mut conn)
                    .await;
                anchor = None;
            }
            Err(e) => {
                tracing::debug!(error = %e, "MySQL doorbell lost its connection");
                wakeups.bump_all();
                conn = reconnect(&opts).await;
                match doorbell_id(&mut conn).await {
                    Ok(id) => bell.store(id, Ordering::Release),
                    Err(_) => continue,
                }
            }
        }
        wakeups.bump_all();
    }
}

/// A session holding the doorbell's lock, or `None` if none could open.
async fn anchored(opts: &MySqlConnectOptions, key: &str) -> Option<MySqlConnection> {
    let mut c = MySqlConnection::connect_with(opts).await.ok()?;
    let got = sqlx::query("SELECT CAST(GET_LOCK(?, 0) AS SIGNED) AS got")
        .bind(key)
        .fetch_one(&mut c)
        .await
        .and_then(|r| r.try_get::<Option<i64>, _>("got"));
    matches!(got, Ok(Some(1))).then_some(c)
}

/// Waits for a ring: `Ok(None)` when rung, `Ok(Some(1))` when the anchor
/// is gone, `Ok(Some(0))` after an hour, `Err` if the connection failed.
async fn wait_for_ring(
    conn: &mut MySqlConnection,
    key: &str,
) -> std::result::Result<Option<i64>, sqlx::Error> {
    let got = sqlx::query("SELECT CAST(GET_LOCK(?, 3600) AS SIGNED) AS got")
        .bind(key)
        .fetch_one(&mut *conn)
        .await
        .and_then(|r| r.try_get::<Option<i64>, _>("got"));
    match got {
        Ok(g) => Ok(g),
        // MariaDB reports a ring as "query execution was interrupted";
        // the connection is fine then.
        Err(e) => match sqlx::query("SELECT 1").execute(&mut *conn).await {
            Ok(_) => Ok(None),
            Err(_) => Err(e),
        },
    }
}

/// Marks `conn` as a doorbell (see the module docs); its connection id.
async fn doorbell_id(conn: &mut MySqlConnection) -> std::result::Result<i64, sqlx::Error> {
    sqlx::query(DOORBELL_MARK).execute(&mut *conn).await?;
    sqlx::query("SELECT CAST(CONNECTION_ID() AS SIGNED) AS id")
        .fetch_one(conn)
        .await
        .and_then(|r| r.try_get::<i64, _>("id"))
}

async fn reconnect(opts: &MySqlConnectOptions) -> MySqlConnection {
    let mut pause = Duration::from_millis(100);
    loop {
        match MySqlConnection::connect_with(opts).await {
            Ok(c) => return c,
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

struct HoldRow {
    hold_id: String,
    owner: String,
    mode: Mode,
    token: i64,
    left_ms: i64,
}

fn hold_row(r: &MySqlRow, now: i64) -> std::result::Result<HoldRow, sqlx::Error> {
    let code: i16 = r.try_get("mode")?;
    let take: i32 = r.try_get("take")?;
    let max: i32 = r.try_get("max")?;
    let mode = Mode::from_code(i64::from(code), take as u32, max as u32).ok_or_else(|| {
        sqlx::Error::Decode(format!("fenced_holds has an unknown mode {code}").into())
    })?;
    Ok(HoldRow {
        hold_id: r.try_get("hold_id")?,
        owner: r.try_get("owner")?,
        mode,
        token: r.try_get("token")?,
        left_ms: r.try_get::<i64, _>("expires_ms")? - now,
    })
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

impl LockBackend for MySqlBackend {
    fn scheme(&self) -> &'static str {
        "mysql"
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> BoxFuture<'a, Result<Outcome>> {
        Box::pin(self.attempt_inner(req))
    }

    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> BoxFuture<'a, Result<Vec<Renewal>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(holds.len());
            // One statement per lease length (usually one), each over a
            // batch of ids; then which of them are live.
            for chunk in holds.chunks(500) {
                let marks = vec!["?"; chunk.len()].join(", ");
                let mut leases: Vec<i64> = chunk.iter().map(|h| ms(h.lease)).collect();
                leases.sort_unstable();
                leases.dedup();
                for lease in leases {
                    let ids: Vec<&str> = chunk
                        .iter()
                        .filter(|h| ms(h.lease) == lease)
                        .map(|h| h.hold_id.as_str())
                        .collect();
                    let sql = format!(
                        "UPDATE fenced_holds SET expires_ms = {NOW_MS} + ? \
                         WHERE expires_ms > {NOW_MS} AND hold_id IN ({})",
                        vec!["?"; ids.len()].join(", ")
                    );
                    let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(lease);
                    for id in ids {
                        q = q.bind(id);
                    }
                    q.execute(&self.pool).await.map_err(|e| self.db(e))?;
                }
                let sql = format!(
                    "SELECT hold_id FROM fenced_holds WHERE expires_ms > {NOW_MS} \
                     AND hold_id IN ({marks})"
                );
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for h in chunk {
                    q = q.bind(h.hold_id.as_str());
                }
                let rows = q.fetch_all(&self.pool).await.map_err(|e| self.db(e))?;
                let live: std::collections::HashSet<String> = rows
                    .iter()
                    .filter_map(|r| r.try_get::<String, _>("hold_id").ok())
                    .collect();
                out.extend(
                    chunk
                        .iter()
                        .map(|h| Renewal::from(live.contains(&h.hold_id))),
                );
            }
            Ok(out)
        })
    }

    fn request_timeout(&self) -> Duration {
        self.timeout
    }

    fn identity(&self) -> String {
        self.identity.clone()
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            // Read the whole reply: MariaDB sends a RETURNING row before the
            // statement has finished, and a deadlock after it rolls the
            // delete back. fetch_optional would stop at the row and report
            // a release that did not happen (the error then surfaced only
            // when the pool tested the connection).
            let mut tries = 0;
            let rows = loop {
                match sqlx::query(RELEASE)
                    .bind(&hold.hold_id)
                    .fetch_all(&self.pool)
                    .await
                {
                    Err(e) if is_conflict(&e) && tries < 10 => tries += 1,
                    r => break r.map_err(|e| self.db(e))?,
                }
            };
            let Some(row) = rows.into_iter().next() else {
                return Ok(false);
            };
            self.ring(hold.name.as_str()).await;
            Ok(row.try_get::<i64, _>("live").map_err(|e| self.db(e))? == 1)
        })
    }

    fn abandon<'a>(
        &'a self,
        name: &'a LockName,
        ticket: Option<Ticket>,
        hold_id: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut changed = false;
            if let Some(t) = ticket {
                let r = sqlx::query(ABANDON_TICKET)
                    .bind(t)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.db(e))?;
                changed |= r.rows_affected() > 0;
            }
            let r = sqlx::query(ABANDON_HOLD)
                .bind(hold_id)
                .execute(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            changed |= r.rows_affected() > 0;
            if changed {
                self.ring(name.as_str()).await;
            }
            Ok(())
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<LockStatus>> {
        Box::pin(async move {
            let rows = sqlx::query(STATUS_HOLDS)
                .bind(name.as_str())
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            let mut holders = Vec::new();
            for r in &rows {
                let now: i64 = r.try_get("now_ms").map_err(|e| self.db(e))?;
                let h = hold_row(r, now).map_err(|e| self.db(e))?;
                if h.left_ms > 0 {
                    holders.push(HolderInfo {
                        owner: h.owner,
                        mode: h.mode,
                        token: h.token as u64,
                        lease_left: Duration::from_millis(h.left_ms as u64),
                    });
                }
            }
            let row = sqlx::query(STATUS_REST)
                .bind(name.as_str())
                .bind(name.as_str())
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            Ok(LockStatus {
                holders,
                waiters: row.try_get::<i64, _>("waiters").map_err(|e| self.db(e))? as usize,
                last_token: row.try_get::<i64, _>("token").map_err(|e| self.db(e))? as u64,
            })
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<usize>> {
        Box::pin(async move {
            let r = sqlx::query(FORCE)
                .bind(name.as_str())
                .execute(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            self.ring(name.as_str()).await;
            Ok(r.rows_affected() as usize)
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(d) = &self.doorbell {
                d.abort();
            }
            self.pool.close().await;
        })
    }
}

impl Store for MySqlBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<RegisterValue>> {
        Box::pin(async move {
            let row = sqlx::query(REGISTER_READ)
                .bind(name.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            row.map(|r| {
                let v: Vec<u8> = r.try_get("value")?;
                let f: i64 = r.try_get("fence")?;
                Ok((v, f as u64))
            })
            .transpose()
            .map_err(|e| self.db(e))
        })
    }

    fn register_write<'a>(
        &'a self,
        name: &'a LockName,
        fence: Option<u64>,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let fence = fence.map(crate::spi::codec::fence_i64).transpose()?;
            let mut tx = self.pool.begin().await.map_err(|e| self.db(e))?;
            let row = sqlx::query(REGISTER_LOCK)
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| self.db(e))?;
            let seen: i64 = match &row {
                Some(r) => r.try_get("fence").map_err(|e| self.db(e))?,
                None => 0,
            };
            let new_fence = match fence {
                Some(f) if f < seen => return Ok(false),
                Some(f) => f,
                None => seen,
            };
            sqlx::query(REGISTER_UPSERT)
                .bind(name.as_str())
                .bind(value)
                .bind(new_fence)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.db(e))?;
            tx.commit().await.map_err(|e| self.db(e))?;
            Ok(true)
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
            // The fence always changes, so a matched row is an affected row.
            let r = sqlx::query(REGISTER_SWAP)
                .bind(value)
                .bind(name.as_str())
                .bind(expected)
                .execute(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            if r.rows_affected() == 1 || expected != 0 {
                return Ok(r.rows_affected() == 1);
            }
            // Never written: of racing creators, one insert wins.
            let r = sqlx::query(REGISTER_CREATE)
                .bind(name.as_str())
                .bind(value)
                .execute(&self.pool)
                .await
                .map_err(|e| self.db(e))?;
            Ok(r.rows_affected() == 1)
        })
    }

    fn register_decrement<'a>(
        &'a self,
        name: &'a LockName,
        by: i64,
    ) -> BoxFuture<'a, Result<Option<i64>>> {
        Box::pin(async move {
            let mut tx = self.pool.begin().await.map_err(|e| self.db(e))?;
            let row = sqlx::query(REGISTER_LOCK)
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| self.db(e))?;
            let Some(row) = row else {
                return Ok(None);
            };
            let v: Vec<u8> = row.try_get("value").map_err(|e| self.db(e))?;
            let f: i64 = row.try_get("fence").map_err(|e| self.db(e))?;
            let n = crate::spi::codec::parse_i64(name, &v)?;
            if n < by {
                return Ok(None);
            }
            sqlx::query(REGISTER_UPSERT)
                .bind(name.as_str())
                .bind((n - by).to_string().into_bytes())
                .bind(f)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.db(e))?;
            tx.commit().await.map_err(|e| self.db(e))?;
            Ok(Some(n - by))
        })
    }
}

impl Backend for MySqlBackend {}
