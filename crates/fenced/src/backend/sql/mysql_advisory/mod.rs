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
//! its `wait_timeout`, and the lock with it. A session sets it to the
//! hold's lease plus a second (the server's
//! default, 8 hours, would keep the lock of a holder whose machine or
//! link went dark, which sends no close, that long). So a holder gone
//! dark or stopped loses the lock about a lease after its last statement,
//! as a lease-table holder does, and the lease contract is the same in
//! both modes. The hold is believed only until its last confirmed
//! statement plus that timeout, and the session is kept busy (a
//! statement every third of it, besides the renewals) so that a live
//! holder keeps it. A new session sets it when it opens; one reused
//! from the idle stack keeps its last hold's (that lease and a second)
//! until the set beside the new grant's token. An idle session is reused
//! only within half of it, and closed, with a goodbye, once it turns
//! stale. (The server's own TCP retransmission limit, which no session
//! setting changes, may still end a session sooner when the link goes
//! dark with a reply in flight: about 15 minutes on Linux, 20 s on
//! Windows, so with longer leases that is a partition's overlap, which
//! the fence answers, as before.)
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
//! A client has one prober per lock name at a time, whatever the number
//! of its tasks waiting: each prober is a session, and a thousand waiting
//! tasks with a session each filled MariaDB's default 151 connections
//! ("Too many connections"). The others wait in the client; a release
//! here, a prober's grant and a prober withdrawn each call one of them to
//! look again (see `spi::wake`).
//!
//! **Tokens** come from the lease table's `fenced_locks` row of the name,
//! raised after each grant; registers are the same table too. `GET_LOCK`
//! has no shared mode and counts no permits, so this mode has mutexes
//! only, and no fair mode (the server does not promise FIFO).
//!
//! Sessions are reused: a session whose `RELEASE_LOCK` confirmed the
//! release goes back to a small idle stack instead of being closed.

use crate::backend::sql::IdleSessions;
use crate::backend::sql::mysql::MySqlBackend;
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::lease::QUEUE_TTL;
use crate::spi::lease::believed_until;
use crate::spi::sync::{Watch, unpoisoned};
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, HoldRef, HolderInfo, LockBackend, LockStatus, Mode,
    Outcome, RegisterValue, RegisterWrite, Renewal, Reply, Store, Ticket, Withdrawal,
};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{Connection, MySqlConnection, Row};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::Hasher;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

mod holds;
mod sessions;

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
    /// Its `wait_timeout`: the server ends it after that long without a
    /// statement, and frees the lock it holds.
    wait: Duration,
    /// When it last finished a statement, as far as an idle session's
    /// reuse needs to know.
    since: Instant,
}

impl Session {
    /// Idle for half its `wait_timeout`: closed, not reused (the server
    /// would end it soon).
    fn stale(&self) -> bool {
        self.since.elapsed() >= self.wait / 2
    }

    /// Says goodbye (`COM_QUIT`), within 5 s: a session dropped without
    /// one, or ended by the server for its `wait_timeout`, is an "Aborted
    /// connection" in the server's log and count.
    async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.conn.close()).await;
    }

    /// [`close`](Self::close) in the background.
    fn close_quietly(self) {
        tokio::spawn(self.close());
    }
}

/// Closes idle sessions before the server ends them for their
/// `wait_timeout` (see [`Session::close`]), each when it turns stale;
/// `changed` tells of a session put back, and of the backend's drop, at
/// which this ends.
async fn sweep_idle(shared: std::sync::Weak<Shared>, changed: Arc<tokio::sync::Notify>) {
    loop {
        let next = {
            let Some(sh) = shared.upgrade() else {
                return;
            };
            sh.idle
                .take_where(Session::stale)
                .into_iter()
                .for_each(Session::close_quietly);
            sh.idle.min_of(|s| s.since + s.wait / 2)
        };
        match next {
            Some(at) => {
                let _ = tokio::time::timeout_at(at, changed.notified()).await;
            }
            None => changed.notified().await,
        }
    }
}

/// The `wait_timeout` of a session that takes a hold of `lease`: the
/// lease and a second, whole seconds (the server's unit), within the
/// server's range (1 s to a year). A holder's machine or link gone dark
/// sends the server no close; the server then ends the session, and
/// frees the lock, once it has heard no statement for this long, where
/// its default (8 hours) would keep the lock that long. It is no
/// earlier than the holder stops believing in its hold: the hold is
/// believed until its last confirmed statement's sending plus this (and
/// its lease), and the server's clock starts after that statement.
fn wait_for(lease: Duration) -> Duration {
    let secs = (lease + Duration::from_secs(1)).as_secs_f64().ceil();
    // 2147483 s (about 24.8 days) is the most every server takes (Windows
    // builds clamp there, Linux ones at a year): a clamped value would be
    // shorter than the one the hold's belief counts on. Leases end sooner.
    Duration::from_secs(secs.clamp(1.0, 2_147_483.0) as u64)
}

/// One hold: its session, and whether it has ended.
struct SessionHold {
    session: tokio::sync::Mutex<Option<Session>>,
    key: String,
    name: LockName,
    owner: String,
    /// Set when the hold ends: its session keeper stops.
    ended: Watch<bool>,
    /// Until when the server keeps the session (its `wait_timeout`).
    alive: Watch<Instant>,
    /// The session's `wait_timeout`.
    wait: Duration,
}

/// A waiter's session, waiting inside the server for the lock.
struct Prober {
    conn_id: i64,
    key: String,
    name: LockName,
    /// When it began to wait.
    since: Instant,
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

impl Drop for Shared {
    fn drop(&mut self) {
        // The sweeper ends, and sessions still idle (a client dropped
        // without its close) say goodbye where a runtime can send it.
        self.idle_changed.notify_one();
        if tokio::runtime::Handle::try_current().is_ok() {
            self.idle
                .take_where(|_| true)
                .into_iter()
                .for_each(Session::close_quietly);
        }
    }
}

/// What the hold and prober tasks need too.
struct Shared {
    table: Arc<MySqlBackend>,
    opts: MySqlConnectOptions,
    holds: Holds,
    probers: Mutex<HashMap<Ticket, Arc<Prober>>>,
    idle: IdleSessions<Session>,
    /// Told when a session goes back to `idle` (see [`sweep_idle`]).
    idle_changed: Arc<tokio::sync::Notify>,
    next_ticket: AtomicI64,
}

impl MySqlAdvisory {
    pub(crate) async fn open(
        table: Arc<MySqlBackend>,
        opts: MySqlConnectOptions,
    ) -> Result<Arc<dyn Backend>> {
        // Sessions wait in GET_LOCK by design: no slow-statement warnings.
        let opts = sqlx::ConnectOptions::disable_statement_logging(opts);
        let shared = Shared {
            table,
            opts,
            holds: Default::default(),
            probers: Default::default(),
            idle: IdleSessions::new(),
            idle_changed: Default::default(),
            next_ticket: AtomicI64::new(1),
        };
        // Fail at connect, not at the first lock, if sessions cannot open.
        // (Not kept: it has the server's `wait_timeout`, not a lease's.)
        shared.session(None).await?.close().await;
        let shared = Arc::new(shared);
        tokio::spawn(sweep_idle(
            Arc::downgrade(&shared),
            shared.idle_changed.clone(),
        ));
        Ok(Arc::new(MySqlAdvisory { shared }))
    }
}

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
