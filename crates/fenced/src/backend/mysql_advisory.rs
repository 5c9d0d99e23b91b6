//! `mysql://…?mode=advisory`: MySQL/MariaDB `GET_LOCK` session locks.
//!
//! For users who want a lock tied to a database session, or who share
//! locks with code that calls `GET_LOCK` itself: each hold owns one
//! session and holds `GET_LOCK(<key>)` in it. If the holder's process
//! dies or its session is killed (`KILL`), the server frees the lock at
//! once; the watchdog's renewal asks the server whether the session still
//! holds the lock and fires the lost signal when it does not.
//!
//! **Leases** still hold: a hold whose lease ends without a renewal gives
//! the lock back, so the lease contract is the same in both modes.
//!
//! **The session bounds the hold**: the server ends a session idle for
//! its `wait_timeout` (8 hours by default, often minutes on managed
//! servers), and the lock with it. The hold is believed only until its
//! last confirmed statement plus that timeout, and the session is kept
//! busy (a `SELECT 1` every third of it) so that a live holder keeps it.
//!
//! **Keys**: the `GET_LOCK` name is the lock name itself when it has at
//! most 64 characters (MySQL's limit), so `GET_LOCK('orders:1001', …)` in
//! other code is the same lock as fenced's `orders:1001`. A longer name
//! becomes its first 47 characters, `#`, and the 16 hex digits of the
//! 64-bit FNV-1a hash of its UTF-8 bytes. MariaDB compares these names
//! byte for byte; MySQL 8 folds case, so there `A` and `a` are one lock.
//!
//! **Waiting without polling**: a blocked acquirer hands its session to a
//! *prober* task that waits inside the server in `GET_LOCK(<key>, 3600)`.
//! When the server grants it, the prober wakes the acquirer, which adopts
//! the session and its lock. A waiter that gives up has its prober's
//! session killed, which ends the server-side wait and frees whatever it
//! won. The server wakes its waiters itself, whoever releases.
//!
//! **Tokens** come from the lease table's `fenced_locks` row of the name,
//! raised after each grant; registers are the same table too. `GET_LOCK`
//! has no shared mode and counts no permits, so this mode has mutexes
//! only, and no fair mode (the server does not promise FIFO).
//!
//! Sessions are reused: a session whose `RELEASE_LOCK` confirmed the
//! release goes back to a small idle stack instead of being closed.

use super::IdleSessions;
use super::mysql::MySqlBackend;
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::lease::QUEUE_TTL;
use crate::spi::lease::believed_until;
use crate::spi::lease::lease_runs_out;
use crate::spi::sync::unpoisoned;
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, HoldRef, HolderInfo, LockBackend, LockStatus, Mode,
    Outcome, RegisterValue, Renewal, Store, Ticket,
};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{Connection, MySqlConnection, Row};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::Hasher;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

const TRY_LOCK: &str = "SELECT CAST(GET_LOCK(?, 0) AS SIGNED) AS got";
const WAIT_LOCK: &str = "SELECT CAST(GET_LOCK(?, 3600) AS SIGNED) AS got";
const UNLOCK: &str = "SELECT CAST(RELEASE_LOCK(?) AS SIGNED) AS was";
const STILL_MINE: &str =
    "SELECT CAST(COALESCE(IS_USED_LOCK(?) = CONNECTION_ID(), 0) AS SIGNED) AS mine";
const HOLDER: &str = "SELECT CAST(IS_USED_LOCK(?) AS SIGNED) AS id";

/// The `GET_LOCK` name of a lock name (see the module docs).
pub(crate) fn key(name: &str) -> String {
    if name.chars().count() <= 64 {
        return name.to_owned();
    }
    let mut h = crate::spi::codec::Fnv1a::default();
    h.write(name.as_bytes());
    let mut k: String = name.chars().take(47).collect();
    let _ = write!(k, "#{:016x}", h.finish());
    k
}

/// A server session and its connection id.
struct Session {
    conn: MySqlConnection,
    id: i64,
}

/// One hold: its session, and the deadline a renewal moves.
struct SessionHold {
    session: tokio::sync::Mutex<Option<Session>>,
    key: String,
    name: LockName,
    owner: String,
    deadline: watch::Sender<Instant>,
    /// Until when the server keeps the session (its `wait_timeout`).
    alive: watch::Sender<Instant>,
}

/// A waiter's session, waiting inside the server for the lock.
struct Prober {
    conn_id: i64,
    key: String,
    state: Mutex<Probe>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

enum Probe {
    Waiting,
    /// The server granted the lock to this session: the waiter adopts it.
    Won(Session),
    /// The session failed, or the waiter withdrew.
    Over,
}

type Holds = Arc<Mutex<HashMap<String, Arc<SessionHold>>>>;

pub(crate) struct MySqlAdvisory {
    shared: Arc<Shared>,
}

/// What the hold and prober tasks need too.
struct Shared {
    table: Arc<MySqlBackend>,
    opts: MySqlConnectOptions,
    holds: Holds,
    probers: Mutex<HashMap<Ticket, Arc<Prober>>>,
    idle: IdleSessions<Session>,
    next_ticket: AtomicI64,
    /// The server's `wait_timeout`: how long it keeps an idle session.
    idle_timeout: Duration,
}

impl MySqlAdvisory {
    pub(crate) async fn open(
        table: Arc<MySqlBackend>,
        opts: MySqlConnectOptions,
    ) -> Result<Arc<dyn Backend>> {
        // Sessions wait in GET_LOCK by design: no slow-statement warnings.
        let opts = sqlx::ConnectOptions::disable_statement_logging(opts);
        let mut shared = Shared {
            table,
            opts,
            holds: Default::default(),
            probers: Default::default(),
            idle: IdleSessions::new(),
            next_ticket: AtomicI64::new(1),
            idle_timeout: Duration::from_secs(28_800),
        };
        // Fail at connect, not at the first lock, if sessions cannot open.
        let mut s = shared.session().await?;
        let secs: i64 = sqlx::query_scalar("SELECT CAST(@@SESSION.wait_timeout AS SIGNED)")
            .fetch_one(&mut s.conn)
            .await
            .map_err(|e| shared.db(e))?;
        shared.idle_timeout = Duration::from_secs(secs.max(1) as u64);
        shared.idle.put(s);
        Ok(Arc::new(MySqlAdvisory {
            shared: Arc::new(shared),
        }))
    }
}

impl Shared {
    fn db(&self, e: sqlx::Error) -> Error {
        self.table.db(e)
    }

    /// An idle session, or a new one.
    async fn session(&self) -> Result<Session> {
        if let Some(s) = self.idle.take() {
            return Ok(s);
        }
        let mut conn = MySqlConnection::connect_with(&self.opts)
            .await
            .map_err(|e| self.db(e))?;
        let id = sqlx::query("SELECT CAST(CONNECTION_ID() AS SIGNED) AS id")
            .fetch_one(&mut conn)
            .await
            .and_then(|r| r.try_get::<i64, _>("id"))
            .map_err(|e| self.db(e))?;
        Ok(Session { conn, id })
    }

    /// Gives the lock back and keeps or closes the session; whether the
    /// session still held the lock.
    /// Whether the lock was still held; `None` if the session failed
    /// (closing it freed the lock, but whether it was held then is unknown).
    async fn unlock(&self, mut s: Session, key: &str) -> Option<bool> {
        let was = sqlx::query(UNLOCK)
            .bind(key)
            .fetch_one(&mut s.conn)
            .await
            .and_then(|r| r.try_get::<Option<i64>, _>("was"));
        if let Ok(Some(1)) = was {
            self.idle.put(s);
            return Some(true);
        }
        // Not ours any more, or the session failed: closing it frees
        // whatever it may still hold.
        let _ = s.conn.close().await;
        was.ok().map(|_| false)
    }

    async fn attempt(self: &Arc<Self>, req: &Attempt) -> Result<Outcome> {
        if req.mode != Mode::Exclusive {
            return Err(Error::invalid(
                "mode=advisory on MySQL has mutexes only (GET_LOCK has no shared mode and \
                 counts no permits); use the default lease-table mode for read-write locks \
                 and semaphores",
            ));
        }
        let key = key(req.name.as_str());
        if let Some(t) = req.ticket {
            let prober = unpoisoned(&self.probers).get(&t).cloned();
            if let Some(p) = prober {
                let won = {
                    let mut st = unpoisoned(&p.state);
                    match &*st {
                        Probe::Waiting => {
                            return Ok(Outcome::Busy(Blocked {
                                ticket: Some(t),
                                retry_after: None,
                            }));
                        }
                        Probe::Won(_) => match std::mem::replace(&mut *st, Probe::Over) {
                            Probe::Won(s) => Some(s),
                            _ => None,
                        },
                        Probe::Over => None,
                    }
                };
                unpoisoned(&self.probers).remove(&t);
                if let Some(mut s) = won {
                    // The session may have waited in the server for longer
                    // than its idle timeout: count its life from a statement
                    // sent now, not from when the wait began.
                    let sent = Instant::now();
                    match sqlx::query("SELECT 1").execute(&mut s.conn).await {
                        Ok(_) => return self.granted(req, s, key, sent).await,
                        Err(e) => {
                            let _ = s.conn.close().await;
                            return Err(self.db(e));
                        }
                    }
                }
                // The prober failed: start over below.
            }
        }
        let mut s = self.session().await?;
        let sent = Instant::now();
        let got = sqlx::query(TRY_LOCK)
            .bind(&key)
            .fetch_one(&mut s.conn)
            .await
            .and_then(|r| r.try_get::<Option<i64>, _>("got"));
        match got {
            Ok(Some(1)) => self.granted(req, s, key, sent).await,
            Ok(Some(_)) if req.will_wait => Ok(Outcome::Busy(Blocked {
                ticket: Some(self.probe(s, key, req.name.clone())),
                retry_after: None,
            })),
            Ok(Some(_)) => {
                self.idle.put(s);
                Ok(Outcome::Busy(Blocked {
                    ticket: None,
                    retry_after: None,
                }))
            }
            Ok(None) => {
                let _ = s.conn.close().await;
                Err(Error::protocol(format!(
                    "{}: GET_LOCK({key:?}) answered NULL (an error in the server)",
                    self.table.label()
                )))
            }
            Err(e) => Err(self.db(e)),
        }
    }

    /// Records a hold whose session holds the lock, with a fresh token;
    /// `sent` is when the session last answered before the grant.
    async fn granted(
        self: &Arc<Self>,
        req: &Attempt,
        s: Session,
        key: String,
        sent: Instant,
    ) -> Result<Outcome> {
        let token = match self.table.next_token(req.name.as_str()).await {
            Ok(t) => t,
            Err(e) => {
                self.unlock(s, &key).await;
                return Err(e);
            }
        };
        let hold = Arc::new(SessionHold {
            session: tokio::sync::Mutex::new(Some(s)),
            key,
            name: req.name.clone(),
            owner: req.owner_key.clone(),
            deadline: watch::Sender::new(Instant::now() + req.lease),
            alive: watch::Sender::new(believed_until(sent, self.idle_timeout)),
        });
        let bound = hold.alive.subscribe();
        unpoisoned(&self.holds).insert(req.hold_id.clone(), hold.clone());
        let me = self.clone();
        let id = req.hold_id.clone();
        tokio::spawn(async move {
            // Keep the session from the server's idle timeout until the
            // lease ends.
            let ends = lease_runs_out(hold.deadline.subscribe());
            tokio::pin!(ends);
            loop {
                tokio::select! {
                    _ = &mut ends => break,
                    _ = tokio::time::sleep(me.idle_timeout / 3) => {
                        me.touch(&hold).await;
                    }
                }
            }
            me.end(&id).await;
        });
        Ok(Outcome::Granted {
            token,
            session: Some(bound),
        })
    }

    /// Asks the hold's session whether it still holds the lock (which also
    /// shows the server the session is in use); moves the session's bound
    /// when it answers yes.
    async fn touch(&self, hold: &SessionHold) -> bool {
        let mut s = hold.session.lock().await;
        let Some(s) = s.as_mut() else {
            return false;
        };
        let sent = Instant::now();
        let mine = sqlx::query(STILL_MINE)
            .bind(&hold.key)
            .fetch_one(&mut s.conn)
            .await
            .and_then(|row| row.try_get::<i64, _>("mine"))
            .is_ok_and(|m| m == 1);
        if mine {
            hold.alive
                .send_replace(believed_until(sent, self.idle_timeout));
        }
        mine
    }

    /// Hands a session to a prober that waits in the server; its ticket.
    fn probe(self: &Arc<Self>, mut s: Session, key: String, name: LockName) -> Ticket {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let p = Arc::new(Prober {
            conn_id: s.id,
            key: key.clone(),
            state: Mutex::new(Probe::Waiting),
            task: Mutex::new(None),
        });
        unpoisoned(&self.probers).insert(ticket, p.clone());
        let me = self.clone();
        let p2 = p.clone();
        let task = tokio::spawn(async move {
            let p = p2;
            let won = loop {
                let got = sqlx::query(WAIT_LOCK)
                    .bind(&key)
                    .fetch_one(&mut s.conn)
                    .await
                    .and_then(|r| r.try_get::<Option<i64>, _>("got"));
                match got {
                    Ok(Some(1)) => break true,
                    // Waited an hour: wait again, unless withdrawn.
                    Ok(Some(_)) if matches!(*unpoisoned(&p.state), Probe::Waiting) => continue,
                    _ => break false,
                }
            };
            let withdrawn = {
                let mut st = unpoisoned(&p.state);
                if won && matches!(*st, Probe::Waiting) {
                    *st = Probe::Won(s);
                    None
                } else {
                    *st = Probe::Over;
                    Some(s)
                }
            };
            if let Some(s) = withdrawn {
                // Withdrawn (its wait interrupted), or failed. A grant that
                // came just before the withdrawal goes back now, before
                // `withdraw` returns; a failed session is closed.
                if won {
                    me.unlock(s, &key).await;
                } else {
                    let _ = s.conn.close().await;
                }
                return;
            }
            me.table.wakeups().bump(name.as_str());
            if !won {
                return;
            }
            // A live waiter adopts the lock within moments; one that went
            // away without withdrawing must not keep it.
            tokio::time::sleep(QUEUE_TTL).await;
            let left = match std::mem::replace(&mut *unpoisoned(&p.state), Probe::Over) {
                Probe::Won(s) => Some(s),
                _ => None,
            };
            if let Some(s) = left {
                unpoisoned(&me.probers).remove(&ticket);
                me.unlock(s, &key).await;
                me.table.wakeups().bump(name.as_str());
            }
        });
        *unpoisoned(&p.task) = Some(task);
        ticket
    }

    /// Withdraws a waiter: interrupts its prober's server-side wait and
    /// returns once the prober's session holds nothing, so a timed-out
    /// acquire leaves no grant behind it.
    async fn withdraw(&self, ticket: Ticket) {
        let Some(p) = unpoisoned(&self.probers).remove(&ticket) else {
            return;
        };
        let was = std::mem::replace(&mut *unpoisoned(&p.state), Probe::Over);
        let task = unpoisoned(&p.task).take();
        match was {
            Probe::Won(s) => {
                if let Some(t) = task {
                    t.abort();
                }
                self.unlock(s, &p.key).await;
            }
            Probe::Waiting => {
                // KILL QUERY of one's own user's session needs no privilege.
                let kill = format!("KILL QUERY {}", p.conn_id);
                let _ = sqlx::query(sqlx::AssertSqlSafe(kill))
                    .execute(self.table.pool())
                    .await;
                let Some(mut t) = task else { return };
                if tokio::time::timeout(Duration::from_secs(5), &mut t)
                    .await
                    .is_err()
                {
                    // The server did not answer: end the session itself.
                    t.abort();
                    let kill = format!("KILL {}", p.conn_id);
                    let _ = sqlx::query(sqlx::AssertSqlSafe(kill))
                        .execute(self.table.pool())
                        .await;
                }
            }
            Probe::Over => {}
        }
    }

    /// Ends a hold: unlocks and recycles its session; whether it still held.
    async fn end(&self, hold_id: &str) -> Option<bool> {
        let Some(hold) = unpoisoned(&self.holds).remove(hold_id) else {
            return Some(false);
        };
        // Let its lease task end now.
        hold.deadline.send_replace(Instant::now());
        let Some(s) = hold.session.lock().await.take() else {
            return Some(false);
        };
        self.unlock(s, &hold.key).await
    }
}

impl LockBackend for MySqlAdvisory {
    fn scheme(&self) -> &'static str {
        "mysql"
    }

    fn supports_fair(&self) -> bool {
        false
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> BoxFuture<'a, Result<Outcome>> {
        Box::pin(self.shared.attempt(req))
    }

    fn renew<'a>(&'a self, refs: &'a [HoldRef]) -> BoxFuture<'a, Result<Vec<Renewal>>> {
        Box::pin(async move {
            let checks = refs.iter().map(|r| async move {
                let Some(hold) = unpoisoned(&self.shared.holds).get(&r.hold_id).cloned() else {
                    return Renewal::Gone;
                };
                let mine = self.shared.touch(&hold).await;
                if mine {
                    hold.deadline.send_replace(Instant::now() + r.lease);
                }
                Renewal::from(mine)
            });
            Ok(futures_util::future::join_all(checks).await)
        })
    }

    fn request_timeout(&self) -> Duration {
        self.shared.table.request_timeout()
    }

    fn identity(&self) -> String {
        format!("{}?mode=advisory", self.shared.table.identity())
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            self.shared.end(&hold.hold_id).await.ok_or_else(|| {
                Error::unavailable(
                    "MySQL: the session failed under the unlock; closing it freed the lock",
                )
            })
        })
    }

    fn abandon<'a>(
        &'a self,
        _name: &'a LockName,
        ticket: Option<Ticket>,
        hold_id: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if let Some(t) = ticket {
                self.shared.withdraw(t).await;
            }
            self.shared.end(hold_id).await;
            Ok(())
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<LockStatus>> {
        Box::pin(async move {
            let sh = &self.shared;
            let row = sqlx::query(HOLDER)
                .bind(key(name.as_str()))
                .fetch_one(sh.table.pool())
                .await
                .map_err(|e| sh.db(e))?;
            let holder: Option<i64> = row.try_get("id").map_err(|e| sh.db(e))?;
            let last_token = sh.table.last_token(name.as_str()).await?;
            let mut holders = Vec::new();
            if let Some(id) = holder {
                // The owner is known for this client's holds; the server
                // records none for other sessions.
                let mut owner = format!("mysql session {id}");
                for h in unpoisoned(&sh.holds).values() {
                    if h.name == *name {
                        owner = h.owner.clone();
                    }
                }
                holders.push(HolderInfo {
                    owner,
                    mode: Mode::Exclusive,
                    // A session lock records no token: the last one issued.
                    token: last_token,
                    // and has no lease on the server while its session lives.
                    lease_left: Duration::MAX,
                });
            }
            let waiters = unpoisoned(&sh.probers)
                .values()
                .filter(|p| matches!(*unpoisoned(&p.state), Probe::Waiting))
                .count();
            Ok(LockStatus {
                holders,
                waiters,
                last_token,
            })
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<usize>> {
        Box::pin(async move {
            let sh = &self.shared;
            let row = sqlx::query(HOLDER)
                .bind(key(name.as_str()))
                .fetch_one(sh.table.pool())
                .await
                .map_err(|e| sh.db(e))?;
            let Some(id) = row.try_get::<Option<i64>, _>("id").map_err(|e| sh.db(e))? else {
                return Ok(0);
            };
            sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                .execute(sh.table.pool())
                .await
                .map_err(|e| sh.db(e))?;
            Ok(1)
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let sh = &self.shared;
            let tickets: Vec<Ticket> = unpoisoned(&sh.probers).keys().copied().collect();
            for t in tickets {
                sh.withdraw(t).await;
            }
            let ids: Vec<String> = unpoisoned(&sh.holds).keys().cloned().collect();
            for id in ids {
                sh.end(&id).await;
            }
            sh.idle.clear();
            sh.table.close().await;
        })
    }
}

impl Store for MySqlAdvisory {
    fn register_read<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<RegisterValue>> {
        self.shared.table.register_read(name)
    }

    fn register_write<'a>(
        &'a self,
        name: &'a LockName,
        fence: Option<u64>,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>> {
        self.shared.table.register_write(name, fence, value)
    }

    fn register_swap<'a>(
        &'a self,
        name: &'a LockName,
        expected: u64,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>> {
        self.shared.table.register_swap(name, expected, value)
    }

    fn register_decrement<'a>(
        &'a self,
        name: &'a LockName,
        by: i64,
    ) -> BoxFuture<'a, Result<Option<i64>>> {
        self.shared.table.register_decrement(name, by)
    }
}

impl Backend for MySqlAdvisory {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_short_names_and_hash_long_ones() {
        assert_eq!(key("orders:1001"), "orders:1001");
        let exact: String = "é".repeat(64);
        assert_eq!(key(&exact), exact);
        let long = "x".repeat(65);
        let k = key(&long);
        assert_eq!(k.chars().count(), 64);
        assert!(k.starts_with(&"x".repeat(47)) && k.as_bytes()[47] == b'#');
        assert_ne!(key(&"x".repeat(66)), k);
    }
}
