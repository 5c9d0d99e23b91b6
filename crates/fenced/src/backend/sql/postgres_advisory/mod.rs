//! `postgres://…?mode=advisory`: PostgreSQL session-level advisory locks.
//!
//! For users who want a lock tied to a database session: each hold owns
//! one dedicated connection (not a pooled one, which would go back to the
//! pool still holding the lock) and holds `pg_advisory_lock` (exclusive)
//! or `pg_advisory_lock_shared` (read) on the name's key. If the holder's
//! process dies, or its session is killed (`pg_terminate_backend`), the
//! server frees the lock at once; the watchdog's renewal notices a dead
//! session and fires the lost signal.
//!
//! **Waiting** is in the server's own queue, as a session lock waits: a
//! caller that waits takes `pg_advisory_lock` on a session of its own, up
//! to 2 s at a time (a `lock_timeout` for that statement, inside the
//! function `fenced_advisory_wait`, created if missing, which catches the
//! timeout so that the server does not log an error for each wait that
//! runs out; a role that may not create it waits unwrapped, and logged),
//! and the server grants it the moment the lock comes free. Of one
//! client's writers of a lock, one at a time waits there (and keeps that
//! place while it holds); readers wait there together; at most 8 waits
//! per client in all. The client's other waiters wait to be woken when a
//! place comes free (one whose lock may be free tries once first). Waits too short
//! to be worth a session (under 10 ms) try once and wait for a release's
//! `NOTIFY`, as every waiter of older versions does; a release notifies
//! only when a probe in its statement finds that a waiter could get in,
//! since a hand-over inside the server needs no wake-up. Such waiters find the lock taken while others wait
//! in the server (a try fails behind a queued request), so under steady
//! contention they get it only when the queue empties.
//!
//! A waiter is granted the lock even if its process is stopped or its
//! link has gone dark, as a holder keeps it: until it resumes (and gives
//! back a grant whose lease has run out), or the server ends the session.
//!
//! **A dark link ends the session after the lease**: a holder's machine
//! that loses power, or a network that drops everything, sends the
//! server no close and no reset, and with the kernel's defaults the
//! server would keep the session, and the lock, for over two hours (or
//! about 15 minutes when it has a reply to deliver). Each lock statement
//! therefore sets its session's `tcp_user_timeout` to the hold's lease
//! plus a second, with keepalives that probe a quiet link, so that the
//! server ends a session it has not heard from for that long. That is no
//! earlier than the holder stops believing in its hold (its last
//! confirmed statement's sending plus the lease), and a live holder is
//! never cut: its kernel answers the probes, even while its process is
//! stopped. A server whose sockets lack the option (not on Linux) gets
//! the keepalives alone; one without the settings (before PostgreSQL 12)
//! keeps the kernel's defaults.
//!
//! **Leases** still hold: a hold whose lease ends without a renewal (a
//! fixed lease, or a guard leaked by a live process) closes its session,
//! which frees the lock, so the lease contract is the same in both modes.
//!
//! **The session bounds the hold**: a server with `idle_session_timeout`
//! set ends a session idle that long, and the lock with it. The hold is
//! then believed only until its last confirmed statement plus that
//! timeout, and the session is kept busy (a `SELECT 1` every third of the
//! timeout) so that a live holder keeps it. With the default (0: off) only
//! the hold's own lease bounds it.
//!
//! **Key derivation**: the key of a name is the 64-bit FNV-1a hash of its
//! UTF-8 bytes, as a signed `bigint` (`pg_locks` shows its high and low 32
//! bits as `classid` and `objid`, `objsubid = 1`). Two names collide with
//! probability 2⁻⁶⁴; other libraries derive keys differently (sqlx's
//! `PgAdvisoryLock` uses an HKDF), so they do not share locks with fenced.
//!
//! **Tokens** come from the same `fenced_locks` table as the lease-table
//! mode, raised after each grant; registers are the same table too.
//! There is no fair mode and no semaphore (an advisory lock counts no
//! permits). A transaction-pooling proxy (PgBouncer `pool_mode =
//! transaction`) would hand our session to others; it is detected at
//! connect (the backend pid changes between statements) and refused.

use crate::backend::sql::IdleSessions;
use crate::backend::sql::postgres::queries::SCHEMA_LOCK;
use crate::backend::sql::postgres::{PgBackend, has_state};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::lease::believed_until;
use crate::spi::sync::{Watch, unpoisoned};
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, HoldRef, HolderInfo, LockBackend, LockStatus, Mode,
    Outcome, RegisterValue, RegisterWrite, Renewal, Reply, Store, Withdrawal,
};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, Row};
use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

mod holds;

/// The server's side of the hold's link, from `$p`, the text of
/// [`link_text`] (empty: leave them, a server without
/// `tcp_user_timeout`): how long sent data may go unacknowledged, and
/// the keepalives that probe a quiet link, so that the server ends the
/// session, and frees the lock, once the client's machine or its link
/// has been dark for the hold's lease (plus a second), where it would
/// otherwise wait for the kernel's defaults (about 15 minutes with data
/// unacknowledged, over two hours on a quiet link). `$pick` is `raise`
/// to only raise the session's values, or `set`.
macro_rules! link_bounds {
    ($p:literal, $pick:tt) => {
        concat!(
            "CASE WHEN ",
            $p,
            " <> '' THEN ",
            link_bound!($p, $pick, "tcp_user_timeout", 1),
            " || ",
            link_bound!($p, $pick, "tcp_keepalives_idle", 2),
            " || ",
            link_bound!($p, $pick, "tcp_keepalives_interval", 3),
            " || ",
            link_bound!($p, $pick, "tcp_keepalives_count", 4),
            " END"
        )
    };
}
/// One setting of [`link_bounds!`]: field `$i` of `$p` (`set`), or the
/// greater of it and the session's value (`raise`).
macro_rules! link_bound {
    ($p:literal, raise, $name:literal, $i:literal) => {
        concat!(
            "set_config('",
            $name,
            "', GREATEST(split_part(",
            $p,
            ", ' ', ",
            $i,
            ")::int, (SELECT setting::int FROM pg_settings WHERE name = '",
            $name,
            "'))::text, false)"
        )
    };
    ($p:literal, set, $name:literal, $i:literal) => {
        concat!(
            "set_config('",
            $name,
            "', split_part(",
            $p,
            ", ' ', ",
            $i,
            "), false)"
        )
    };
}
/// The lock on a session that holds it already, in one mode or the other
/// (a writer that takes read beside its write): such a request is granted
/// at once, ahead of the waiters in the server's queue, where a `try`
/// would fail for any waiter queued (and wait for the owner itself).
/// The session's link bounds ($3, see [`link_bounds!`]) only grow: the
/// other hold's lease may be the longer.
macro_rules! own_lock {
    ($lock:literal) => {
        concat!(
            "WITH l AS (SELECT count(*) > 0 AS got FROM (SELECT ",
            $lock,
            "($2)) AS x)
    SELECT set_config('application_name', $1, false) AS app, ",
            link_bounds!("$3", raise),
            " AS link, l.got FROM l"
        )
    };
}
const OWN_LOCK: &str = own_lock!("pg_advisory_lock");
/// [`OWN_LOCK`] for a read hold.
const OWN_LOCK_SHARED: &str = own_lock!("pg_advisory_lock_shared");
/// The rest of a lock statement after its CTE `l` (`got`): the name's
/// token ($3) raised as `NEXT_TOKEN` (see the lease table's queries)
/// when `l.got`, reading `$from` (which includes `l`, so the lock comes
/// first; a CTE read twice is computed once).
macro_rules! lock_and_token {
    ($from:literal) => {
        concat!(
            "
    t AS (INSERT INTO fenced_locks AS f (name, token)
        SELECT $3, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM ",
            $from,
            " WHERE l.got
        ON CONFLICT (name) DO UPDATE SET token = GREATEST(f.token + 1, EXCLUDED.token)
        RETURNING f.token)
    SELECT l.got, (SELECT token FROM t) AS token FROM l"
        )
    };
}
/// A try by `$lock` on a session of its own, with the name's token ($3)
/// raised in the same statement when the lock is got: one round trip, not
/// two. The session's link bounds are set from $4. A failure leaves the lock (session-level, it outlives the aborted
/// statement) or not: the caller closes the session, which frees it
/// either way.
macro_rules! try_lock_and_token {
    ($lock:literal) => {
        concat!(
            "WITH l AS (SELECT set_config('application_name', $1, false) AS app, ",
            link_bounds!("$4", set),
            " AS link, ",
            $lock,
            "($2) AS got),",
            lock_and_token!("l")
        )
    };
}
const LOCK_AND_TOKEN: &str = try_lock_and_token!("pg_try_advisory_lock");
const LOCK_SHARED_AND_TOKEN: &str = try_lock_and_token!("pg_try_advisory_lock_shared");
/// [`LOCK_AND_TOKEN`] that waits in the server's queue for the lock (by
/// `$lock`), up to $4 ms (a `lock_timeout` for this statement), as a
/// session lock waits: the server grants it the moment it comes free,
/// with no notification's hop and no herd of tries. The token's insert
/// then waits as any statement does ($5 ms, the request timeout). The
/// session's link bounds are set from $6. Past $4
/// the statement fails with `lock_not_available` (55P03), which a grant
/// can race: the caller then unlocks.
macro_rules! wait_lock_and_token {
    ($got:literal) => {
        concat!(
            "WITH c AS (SELECT set_config('application_name', $1, false) AS app,
        set_config('lock_timeout', $4, true) AS wait, ",
            link_bounds!("$6", set),
            " AS link),
    l AS (SELECT ",
            $got,
            "),
    b AS (SELECT set_config('lock_timeout', $5, true) AS back FROM l),",
            lock_and_token!("l, b")
        )
    };
}
const WAIT_LOCK_AND_TOKEN: &str =
    wait_lock_and_token!("count(*) > 0 AS got FROM (SELECT pg_advisory_lock($2) FROM c) AS x");
const WAIT_LOCK_SHARED_AND_TOKEN: &str = wait_lock_and_token!(
    "count(*) > 0 AS got FROM (SELECT pg_advisory_lock_shared($2) FROM c) AS x"
);
/// [`WAIT_LOCK_AND_TOKEN`] through [`QUIET_WAIT_DDL`]'s function: a wait
/// that runs out answers `got = false` instead of failing.
const QUIET_WAIT_LOCK_AND_TOKEN: &str =
    wait_lock_and_token!("fenced_advisory_wait($2, false) AS got FROM c");
const QUIET_WAIT_LOCK_SHARED_AND_TOKEN: &str =
    wait_lock_and_token!("fenced_advisory_wait($2, true) AS got FROM c");
/// A wait in the server that runs out is an error, and at the defaults
/// the server logs every error with its statement: two lines every 2 s
/// ([`SERVER_WAIT`]) for each waiting lock of each client. The function
/// catches that one error (`lock_not_available`, which only the
/// `lock_timeout` raises here), and an error a PL/pgSQL block catches is
/// not logged. It is created if missing, under the schema's lock; a role
/// that may not create functions waits with the bare call, logged.
const QUIET_WAIT_DDL: &str = "
DO $do$
BEGIN
IF to_regprocedure('fenced_advisory_wait(bigint, boolean)') IS NULL THEN
CREATE FUNCTION fenced_advisory_wait(p_key BIGINT, p_shared BOOLEAN)
    RETURNS BOOLEAN LANGUAGE plpgsql AS $fn$
BEGIN
    IF p_shared THEN
        PERFORM pg_advisory_lock_shared(p_key);
    ELSE
        PERFORM pg_advisory_lock(p_key);
    END IF;
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END $fn$;
END IF;
END $do$;
";
/// Whether [`QUIET_WAIT_DDL`]'s function is there, and whether this role
/// could create it.
const QUIET_WAIT_PRESENT: &str = "SELECT
    to_regprocedure('fenced_advisory_wait(bigint, boolean)') IS NOT NULL,
    coalesce(has_schema_privilege(current_schema(), 'CREATE'), false)";
/// Whether this role can call it.
const QUIET_WAIT_CALLABLE: &str = "SELECT coalesce(has_function_privilege(
    to_regprocedure('fenced_advisory_wait(bigint, boolean)'), 'EXECUTE'), false)";
/// The longest one try waits in the server ([`WAIT_LOCK_AND_TOKEN`]);
/// a waiter not granted by then asks again at once (at the back of the
/// server's queue). It bounds how long a try whose caller went away (or
/// whose process is stopping) stays queued. Each wait that runs out is
/// one "canceling statement due to lock timeout" error in the server's
/// log unless [`QUIET_WAIT_DDL`]'s function catches it; a try must answer
/// within the core's patience (a request timeout, 5 s by default).
const SERVER_WAIT: Duration = Duration::from_secs(2);
/// How many of one client's tries wait in the server at once (one per
/// lock), each on a session of its own; the rest queue for their turn.
const SERVER_WAITERS: usize = 8;
/// A wait shorter than this is not worth a session: the try asks once,
/// and waits for a release's notification.
const MIN_SERVER_WAIT: Duration = Duration::from_millis(10);
/// What a session that waited in vain runs before it is kept: a grant
/// that raced the wait's end is given back (a session waits only on a
/// session of its own, which holds nothing else).
const UNLOCK_ALL: &str = "SELECT count(*) AS n FROM (SELECT pg_advisory_unlock_all()) AS u";
const UNLOCK: &str = "SELECT pg_advisory_unlock($1) AS was";
const UNLOCK_SHARED: &str = "SELECT pg_advisory_unlock_shared($1) AS was";
/// A release in one round trip: the unlock of key $1 by `$unlock`
/// (`was`: whether the session held it); probes whether a waiter could
/// now get in (an exclusive try, else a shared one, either given
/// straight back); when $3 says the session goes back to the idle stack,
/// whatever else it holds (a lock an acquisition dropped between its
/// lock and its record left, a failed unlock's); and, if a probe got in,
/// the waiters of name $2 woken (the lease table's `NOTIFY`, sent at the
/// statement's commit). A CTE runs only if read, and a filter the planner
/// knows is false reads nothing: each reads the one it must follow, and
/// the final select reads every one (each gives one row, so a join of
/// them reads them all).
///
/// A lock neither probe gets into went to a try waiting in the server
/// (which the unlock grants at once), or to one that came first: a waiter
/// that was told would find it taken, and its holder's release probes
/// again. Without the probes every release woke every listening process,
/// for nothing while the waiters wait in the server: with 8 processes on
/// one lock that halved the acquisitions per second.
macro_rules! unlock_and_wake {
    ($unlock:literal) => {
        concat!(
            "WITH u AS (SELECT ",
            $unlock,
            "($1) AS was),
    p AS (SELECT pg_try_advisory_lock($1) AS free FROM u),
    q AS (SELECT p.free, CASE WHEN p.free THEN false ELSE pg_try_advisory_lock_shared($1) END AS room
        FROM p),
    r AS (SELECT count(*) AS n FROM (SELECT CASE WHEN q.free THEN pg_advisory_unlock($1)
        ELSE pg_advisory_unlock_shared($1) END FROM q WHERE q.free OR q.room) AS z),
    a AS (SELECT count(*) AS n FROM (SELECT pg_advisory_unlock_all() FROM r WHERE $3) AS x),
    w AS (SELECT count(*) AS n FROM (SELECT pg_notify('fenced_wake', $2) FROM q
        WHERE q.free OR q.room) AS y)
    SELECT u.was FROM u, r, a, w"
        )
    };
}
const UNLOCK_AND_WAKE: &str = unlock_and_wake!("pg_advisory_unlock");
const UNLOCK_SHARED_AND_WAKE: &str = unlock_and_wake!("pg_advisory_unlock_shared");
/// The server's idle-session timeout in ms (PostgreSQL ≥ 14; no row before).
const IDLE_TIMEOUT: &str =
    "SELECT setting::bigint AS ms FROM pg_settings WHERE name = 'idle_session_timeout'";
/// Whether the server has `tcp_user_timeout` (PostgreSQL ≥ 12).
const USER_TIMEOUT_KNOWN: &str =
    "SELECT count(*) > 0 FROM pg_settings WHERE name = 'tcp_user_timeout'";
/// `tcp_user_timeout` as the session's socket took it, after
/// [`USER_TIMEOUT_TRY`].
const USER_TIMEOUT_TAKEN: &str = "SELECT current_setting('tcp_user_timeout')";
const USER_TIMEOUT_TRY: &str = "SELECT set_config('tcp_user_timeout', '1000', false)";
const HOLDERS: &str = "SELECT a.application_name AS owner, l.mode AS lmode, l.granted AS granted
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.classid::bigint = $1 AND l.objid::bigint = $2
      AND l.objsubid = 1";
/// The advisory keys held or waited for now, as `pg_locks` shows them.
const KEYS: &str = "SELECT DISTINCT l.classid::bigint AS hi, l.objid::bigint AS lo FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.objsubid = 1";
const TERMINATE: &str = "SELECT count(pg_terminate_backend(l.pid)) AS n FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.classid::bigint = $1 AND l.objid::bigint = $2
      AND l.objsubid = 1 AND l.granted";

/// The advisory key of a name (see the module docs).
pub(crate) fn key(name: &str) -> i64 {
    let mut h = crate::spi::codec::Fnv1a::default();
    h.write(name.as_bytes());
    h.finish() as i64
}

/// The link bounds of a hold's session for a hold of `lease` (see
/// [`link_bounds!`]): `tcp_user_timeout` (ms; 0 where the server's
/// sockets lack the option, which it would log at each statement), then
/// the keepalives' idle time, interval (s) and count.
///
/// Safe on a Linux server: it cannot end the session before the client's
/// belief in the hold ends. That belief runs to a confirmed statement's
/// sending plus the lease; the server's clock for either bound starts no
/// earlier than its receipt of that statement (the last segment it
/// heard, or the first it sent unacknowledged, after it), Linux ends a
/// session on keepalives only once `tcp_user_timeout` has passed too, and
/// that option also replaces its retransmission limit. A live client is
/// never cut: its kernel answers the probes, stopped process or not, and
/// its renewals go over the session.
///
/// Elsewhere only the keepalives are set. They start probing after the
/// lease and a second (up to the kernel's 32767 s limit, past which ten
/// probes reach it, up to about four days), whatever count the system
/// takes (Windows always sends ten). But that system's retransmission
/// limit, which no session setting changes, may end the session sooner
/// when the link goes dark with a reply in flight (about 20 s on
/// Windows), as it did before these bounds: a partition's overlap, which
/// the fence answers.
fn link_text(lease: Duration, user_timeout: bool) -> String {
    /// The kernel's limit for the keepalive idle time and interval (s).
    const MAX_KEEP: u64 = 32_767;
    /// Probes before the end: Windows' fixed count, within Linux's 127.
    const PROBES: u64 = 10;
    let bound_ms = (lease.as_millis() + 1000).min(i32::MAX as u128) as u64;
    let secs = bound_ms.div_ceil(1000);
    let idle = secs.min(MAX_KEEP);
    let every = (secs - idle).div_ceil(PROBES).clamp(1, MAX_KEEP);
    let user_ms = if user_timeout { bound_ms } else { 0 };
    format!("{user_ms} {idle} {every} {PROBES}")
}

/// `classid` and `objid` of a key as `pg_locks` shows them.
fn halves(key: i64) -> (i64, i64) {
    let k = key as u64;
    ((k >> 32) as i64, (k & 0xffff_ffff) as i64)
}

/// One hold: its session, and whether it has ended.
struct SessionHold {
    /// Shared by the holds of one owner on one key (a writer taking read
    /// must use its own session, or its write lock would block it).
    conn: Session,
    owner: String,
    shared: bool,
    key: i64,
    name: LockName,
    /// Set when the hold ends: its session keeper stops.
    ended: Watch<bool>,
    /// Until when the server keeps the session (with an idle timeout).
    alive: Option<Watch<Instant>>,
    /// A writer's turn, given back at the release (see [`WriterTurn`]).
    turn: Mutex<Option<WriterTurn>>,
}

/// A busy answer, to be asked again after `retry_after` (`None`: when
/// told, or at the core's fallback).
fn busy(retry_after: Option<Duration>) -> Outcome {
    Outcome::Busy(Blocked {
        ticket: None,
        retry_after,
    })
}

/// The error of a statement that had no answer within `limit`.
fn no_answer(limit: Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {limit:?}"),
    ))
}

/// This client's turns to wait in the server: one writer of each lock at
/// a time (only one can be granted next: the client's others wait behind
/// it), any number of readers, and at most [`SERVER_WAITERS`] waits in
/// all, each on a session of its own. A try without a turn waits outside
/// the backend, for the wake-up a turn's end sends (waiting for it inside
/// would keep one of the client's call slots).
struct Turns(Arc<TurnsInner>);

struct TurnsInner {
    /// The keys a writer of this client waits on in the server.
    writers: Mutex<std::collections::HashSet<i64>>,
    /// Locks whose waiters found every turn taken, oldest first: a turn's
    /// end wakes the first too.
    starved: Mutex<std::collections::VecDeque<LockName>>,
    all: Arc<tokio::sync::Semaphore>,
    wakeups: Arc<crate::spi::wake::Wakeups>,
}

/// A turn to wait in the server (see [`Turns`]). Its end wakes the
/// waiters of the lock that has waited longest for a turn.
struct Turn {
    all: Option<tokio::sync::OwnedSemaphorePermit>,
    /// A writer's place, which a grant keeps until its release.
    writer: Option<WriterTurn>,
    turns: Arc<TurnsInner>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        // Given back before the wake-ups, so that the woken can take it.
        drop(self.all.take());
        drop(self.writer.take());
        let starved = unpoisoned(&self.turns.starved).pop_front();
        if let Some(n) = starved {
            self.turns.wakeups.wake(n.as_str());
        }
    }
}

/// The place of the one writer of a lock that waits in the server (or
/// holds the lock) for this client. Its end wakes the client's other
/// waiters of the lock, one of which takes it next. A grant keeps it until
/// its release: the next waiter is then woken by a task that has stopped
/// waiting, not by one still in its try, which would take the call for
/// itself.
struct WriterTurn {
    k: i64,
    name: LockName,
    turns: Arc<TurnsInner>,
}

impl Drop for WriterTurn {
    fn drop(&mut self) {
        unpoisoned(&self.turns.writers).remove(&self.k);
        self.turns.wakeups.wake(self.name.as_str());
    }
}

impl Turns {
    fn new(wakeups: Arc<crate::spi::wake::Wakeups>) -> Self {
        Turns(Arc::new(TurnsInner {
            writers: Mutex::new(std::collections::HashSet::new()),
            starved: Mutex::new(std::collections::VecDeque::new()),
            all: Arc::new(tokio::sync::Semaphore::new(SERVER_WAITERS)),
            wakeups,
        }))
    }

    /// A turn for a waiter of lock `name` (key `k`), if one is free: none
    /// while another of the client's writers of the lock waits or holds,
    /// or every turn is taken.
    fn take(&self, name: &LockName, k: i64, shared: bool) -> Option<Turn> {
        let t = &self.0;
        if !shared && !unpoisoned(&t.writers).insert(k) {
            return None;
        }
        // Counted as starved before it looks, so that a turn that ends
        // between its look and its record still wakes it.
        let mut first = false;
        {
            let mut starved = unpoisoned(&t.starved);
            if !starved.contains(name) {
                starved.push_back(name.clone());
                first = true;
            }
        }
        let got = t.all.clone().try_acquire_owned();
        if got.is_ok() && first {
            unpoisoned(&t.starved).retain(|n| n != name);
        }
        match got {
            Ok(all) => Some(Turn {
                all: Some(all),
                writer: (!shared).then(|| WriterTurn {
                    k,
                    name: name.clone(),
                    turns: t.clone(),
                }),
                turns: t.clone(),
            }),
            Err(_) => {
                if !shared {
                    unpoisoned(&t.writers).remove(&k);
                }
                None
            }
        }
    }
}

type Holds = Arc<Mutex<HashMap<String, Arc<SessionHold>>>>;
type Session = Arc<tokio::sync::Mutex<Option<PgConnection>>>;

pub(crate) struct PgAdvisory {
    table: Arc<PgBackend>,
    opts: PgConnectOptions,
    holds: Holds,
    idle: Arc<IdleSessions<PgConnection>>,
    /// The server's `idle_session_timeout`, when it ends idle sessions.
    idle_timeout: Option<Duration>,
    /// Whether the server takes `tcp_user_timeout` and the keepalives
    /// per session (PostgreSQL ≥ 12), which bound a hold's session over a
    /// dark link (see [`link_text`]).
    link_bounded: bool,
    /// Whether its sockets have `TCP_USER_TIMEOUT` (Linux; not a Unix
    /// socket).
    user_timeout: bool,
    /// Whether waits go through `fenced_advisory_wait`, unlogged: until
    /// a call finds it gone or not ours to call.
    quiet: AtomicBool,
    /// This client's turns to wait in the server.
    turns: Turns,
}

impl PgAdvisory {
    pub(crate) async fn open(
        table: Arc<PgBackend>,
        opts: PgConnectOptions,
        wakeups: Arc<crate::spi::wake::Wakeups>,
    ) -> Result<Arc<dyn Backend>> {
        let mut me = PgAdvisory {
            table,
            opts,
            holds: Default::default(),
            idle: Arc::new(IdleSessions::new()),
            idle_timeout: None,
            link_bounded: false,
            user_timeout: false,
            quiet: AtomicBool::new(false),
            turns: Turns::new(wakeups),
        };
        (me.idle_timeout, me.link_bounded, me.user_timeout) = me.check_session_pinning().await?;
        me.quiet = AtomicBool::new(me.make_quiet_wait().await?);
        Ok(Arc::new(me))
    }

    /// Creates [`QUIET_WAIT_DDL`]'s function if missing and this role may
    /// (asked first, so that a role without CREATE logs no error at each
    /// open); whether this role can call it. Its session is kept for the
    /// first lock.
    async fn make_quiet_wait(&self) -> Result<bool> {
        let mut c = self.session().await?;
        let made = async {
            let mut tx = c.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(SCHEMA_LOCK)
                .execute(&mut *tx)
                .await?;
            let (present, can_create): (bool, bool) = sqlx::query_as(QUIET_WAIT_PRESENT)
                .fetch_one(&mut *tx)
                .await?;
            if !present && can_create {
                sqlx::raw_sql(QUIET_WAIT_DDL).execute(&mut *tx).await?;
            }
            let callable: bool = sqlx::query_scalar(QUIET_WAIT_CALLABLE)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(callable)
        };
        let timeout = self.request_timeout();
        let failed = match tokio::time::timeout(timeout, made).await {
            Ok(Ok(true)) => {
                self.idle.put(c);
                return Ok(true);
            }
            Ok(Ok(false)) => {
                self.idle.put(c);
                "missing, and this role may not create it (CREATE on the schema), or may not \
                 execute it"
                    .to_owned()
            }
            Ok(Err(e)) => {
                let _ = tokio::time::timeout(timeout, c.close()).await;
                e.to_string()
            }
            Err(_) => no_answer(timeout).to_string(),
        };
        tracing::warn!(
            server = %self.table.label(),
            error = %failed,
            "cannot use the function fenced_advisory_wait: each wait in the server that runs \
             out (every 2 s) is logged there as an error"
        );
        Ok(false)
    }

    fn db(&self, e: sqlx::Error) -> Error {
        self.table.db(e)
    }

    async fn session(&self) -> Result<PgConnection> {
        if let Some(c) = self.idle.take() {
            return Ok(c);
        }
        let timeout = self.table.request_timeout();
        let mut c = tokio::time::timeout(timeout, PgConnection::connect_with(&self.opts))
            .await
            .unwrap_or_else(|_| Err(no_answer(timeout)))
            .map_err(|e| self.db(e))?;
        // Tokens are raised over this session: they must survive a crash.
        crate::backend::sql::postgres::queries::prepare(&mut c, self.table.request_timeout())
            .await
            .map_err(|e| self.db(e))?;
        Ok(c)
    }

    /// A transaction-pooling proxy gives each statement whichever server
    /// session is free: a session lock taken through it is not ours.
    /// Returns the server's idle-session timeout, if it has one, whether
    /// it takes `tcp_user_timeout`, and whether its sockets have it.
    async fn check_session_pinning(&self) -> Result<(Option<Duration>, bool, bool)> {
        let mut c = self.session().await?;
        let idle: Option<i64> = sqlx::query_scalar(IDLE_TIMEOUT)
            .fetch_optional(&mut c)
            .await
            .map_err(|e| self.db(e))?;
        let link_bounded: bool = sqlx::query_scalar(USER_TIMEOUT_KNOWN)
            .fetch_one(&mut c)
            .await
            .map_err(|e| self.db(e))?;
        // Without the socket option (a server not on Linux) the setting
        // reads back 0, and every statement that set it would log that it
        // is not supported; over a Unix socket it reads back 0 too, and
        // means nothing there.
        let user_timeout = link_bounded && {
            sqlx::query(USER_TIMEOUT_TRY)
                .execute(&mut c)
                .await
                .map_err(|e| self.db(e))?;
            let shown: String = sqlx::query_scalar(USER_TIMEOUT_TAKEN)
                .fetch_one(&mut c)
                .await
                .map_err(|e| self.db(e))?;
            shown != "0"
        };
        let mut pids = Vec::new();
        for _ in 0..3 {
            let row = sqlx::query("SELECT pg_backend_pid() AS pid")
                .fetch_one(&mut c)
                .await
                .map_err(|e| self.db(e))?;
            pids.push(row.try_get::<i32, _>("pid").map_err(|e| self.db(e))?);
        }
        let _ = c.close().await;
        if pids.windows(2).any(|w| w[0] != w[1]) {
            return Err(Error::invalid(format!(
                "{}: consecutive statements ran in different server sessions (pids {pids:?}), \
                 as behind a transaction-pooling proxy (PgBouncer pool_mode=transaction); \
                 session advisory locks would be released or shared by the proxy. Connect to \
                 PostgreSQL directly, or drop mode=advisory for the lease-table mode",
                self.table.label()
            )));
        }
        let idle = idle
            .filter(|ms| *ms > 0)
            .map(|ms| Duration::from_millis(ms as u64));
        Ok((idle, link_bounded, user_timeout))
    }

    async fn attempt_inner(&self, req: &Attempt) -> Result<Outcome> {
        let shared = match req.mode {
            Mode::Exclusive => false,
            Mode::Shared => true,
            Mode::Permits { .. } => {
                return Err(Error::invalid(
                    "mode=advisory has no semaphores (an advisory lock counts no permits); \
                     use the default lease-table mode",
                ));
            }
        };
        let k = key(req.name.as_str());
        let mine = unpoisoned(&self.holds)
            .values()
            .find(|h| h.key == k && h.owner == req.owner_key)
            .map(|h| h.conn.clone());
        let window = match (&mine, self.window(req)) {
            (None, Some(window)) => window,
            // A session this owner's other hold uses, or a caller that does
            // not wait (or not long enough to be worth a session): one try.
            _ => return self.take(req, shared, k, mine, None).await,
        };
        match self.turns.take(&req.name, k, shared) {
            Some(turn) => self.take(req, shared, k, None, Some((window, turn))).await,
            // Another of this client's writers of this lock waits in the
            // server or holds it, or every turn is taken by other locks'
            // waiters. The lock may be free all the same (that hold's
            // session may have died): one try, then it waits to be told,
            // when a turn ends or a release notifies.
            None => self.take(req, shared, k, None, None).await,
        }
    }

    /// How long `req`'s try may wait in the server, if at all: a caller
    /// that waits, never past its deadline, [`SERVER_WAIT`], half a
    /// request timeout (the core hears from a try within one), a quarter
    /// of the lease or of the server's idle-session timeout (both count
    /// from the try's start, so that a grant at the end of the wait does
    /// not arrive spent); not under [`MIN_SERVER_WAIT`].
    fn window(&self, req: &Attempt) -> Option<Duration> {
        if !req.will_wait {
            return None;
        }
        let left = req
            .until
            .map_or(SERVER_WAIT, |d| d.saturating_duration_since(Instant::now()));
        let mut wait = left
            .min(SERVER_WAIT)
            .min(self.request_timeout() / 2)
            .min(req.lease / 4);
        if let Some(t) = self.idle_timeout {
            wait = wait.min(t / 4);
        }
        (wait >= MIN_SERVER_WAIT).then_some(wait)
    }

    /// One try of `req` on key `k`, on `mine` (the session of this owner's
    /// other hold) or a session of its own, waiting in the server for up
    /// to the time `waits` gives, in its turn.
    async fn take(
        &self,
        req: &Attempt,
        shared: bool,
        k: i64,
        mine: Option<Session>,
        waits: Option<(Duration, Turn)>,
    ) -> Result<Outcome> {
        let fresh = mine.is_none();
        let session: Session = match mine {
            Some(s) => s,
            None => Arc::new(tokio::sync::Mutex::new(Some(self.session().await?))),
        };
        // application_name is at most 63 bytes: keep the owner's end.
        let o = req.owner_key.as_str();
        let mut start = o.len().saturating_sub(63);
        while !o.is_char_boundary(start) {
            start += 1;
        }
        let timeout = self.request_timeout();
        let link = match self.link_bounded {
            true => link_text(req.lease, self.user_timeout),
            false => String::new(),
        };
        let sent = Instant::now();
        let token = {
            let mut guard = session.lock().await;
            let Some(conn) = guard.as_mut() else {
                return Err(Error::unavailable(format!(
                    "{}: the session of this owner's other hold has just ended; try again",
                    self.table.label()
                )));
            };
            // A session of its own takes the lock and its token in one
            // statement. One this owner's other hold uses (a writer taking
            // read) takes them in two, so that a failure between them
            // unlocks its own level of the lock alone, leaving the other
            // hold's.
            let statement = async {
                if fresh {
                    let quiet = self.quiet.load(Ordering::Relaxed);
                    let sql = match (&waits, shared, quiet) {
                        (Some(_), false, true) => QUIET_WAIT_LOCK_AND_TOKEN,
                        (Some(_), true, true) => QUIET_WAIT_LOCK_SHARED_AND_TOKEN,
                        (Some(_), false, false) => WAIT_LOCK_AND_TOKEN,
                        (Some(_), true, false) => WAIT_LOCK_SHARED_AND_TOKEN,
                        (None, false, _) => LOCK_AND_TOKEN,
                        (None, true, _) => LOCK_SHARED_AND_TOKEN,
                    };
                    let q = sqlx::query(sql)
                        .bind(&o[start..])
                        .bind(k)
                        .bind(req.name.as_str());
                    match &waits {
                        Some((wait, _)) => q
                            .bind(wait.as_millis().max(1).to_string())
                            .bind(timeout.as_millis().max(1).to_string()),
                        None => q,
                    }
                    .bind(&link)
                    .fetch_one(&mut *conn)
                    .await
                    .and_then(|r| Ok((r.try_get("got")?, r.try_get::<Option<i64>, _>("token")?)))
                } else {
                    sqlx::query(if shared { OWN_LOCK_SHARED } else { OWN_LOCK })
                        .bind(&o[start..])
                        .bind(k)
                        .bind(&link)
                        .fetch_one(&mut *conn)
                        .await
                        .and_then(|r| Ok((r.try_get("got")?, None)))
                }
            };
            // Bounded here, not only by the server: over a link gone dark
            // the answer may never come, and the try would keep its turn
            // (and its call slot) for ever.
            let limit = waits.as_ref().map_or(timeout, |(w, _)| *w + timeout / 2);
            let got = tokio::time::timeout(limit, statement)
                .await
                .unwrap_or_else(|_| Err(no_answer(limit)));
            // Not granted within the wait (on a session of its own: a
            // session shared with another hold only ever tries): the
            // quiet wait answers so, the bare one fails with
            // `lock_not_available`.
            let ran_out = fresh
                && waits.is_some()
                && match &got {
                    Ok((got, _)) => !got,
                    Err(e) => has_state(e, &["55P03"]),
                };
            // The function was dropped, or is not ours to call, since the
            // client opened: wait with the bare call from now on (the
            // statement failed before it locked anything).
            let unquiet = fresh
                && waits.is_some()
                && matches!(&got, Err(e) if has_state(e, &["42883", "42501"]))
                && self.quiet.swap(false, Ordering::Relaxed);
            if unquiet {
                tracing::warn!(
                    server = %self.table.label(),
                    "the function fenced_advisory_wait is gone or may not be called: \
                     waits that run out are logged as errors from now on"
                );
            }
            let ran_out = ran_out || unquiet;
            match got {
                Ok((true, Some(token))) => token as u64,
                Ok((true, None)) => match self.table.next_token(conn, req.name.as_str()).await {
                    Ok(t) => t,
                    Err(e) => {
                        let _ = sqlx::query(if shared { UNLOCK_SHARED } else { UNLOCK })
                            .bind(k)
                            .execute(&mut *conn)
                            .await;
                        if fresh && let Some(c) = guard.take() {
                            self.discard(c, req.name.as_str()).await;
                        }
                        return Err(e);
                    }
                },
                // The server may have granted it as the wait ran out, and
                // a session lock outlives the failed statement: the
                // session (its own) gives back whatever it holds before
                // it is kept.
                _ if ran_out => {
                    if let Some(mut c) = guard.take() {
                        let cleared =
                            tokio::time::timeout(timeout, sqlx::query(UNLOCK_ALL).execute(&mut c))
                                .await;
                        if matches!(cleared, Ok(Ok(_))) {
                            self.idle.put(c);
                        } else {
                            self.discard(c, req.name.as_str()).await;
                        }
                    }
                    // It asks again at once: nothing else tells it to.
                    return Ok(busy(Some(Duration::ZERO)));
                }
                other => {
                    let other = other.map_err(|e| self.db(e));
                    if fresh && let Some(c) = guard.take() {
                        match other {
                            // It holds nothing: keep it for the next try.
                            Ok((false, _)) => self.idle.put(c),
                            // It may hold the lock: closing frees it.
                            _ => self.discard(c, req.name.as_str()).await,
                        }
                    }
                    other?;
                    return Ok(busy(None));
                }
            }
        };
        let turn = waits.and_then(|(_, mut t)| t.writer.take());
        let alive = self
            .idle_timeout
            .map(|t| Watch::new(believed_until(sent, t)));
        let bound = alive.as_ref().map(Watch::subscribe);
        let hold = Arc::new(SessionHold {
            conn: session,
            owner: req.owner_key.clone(),
            shared,
            key: k,
            name: req.name.clone(),
            ended: Watch::new(false),
            alive,
            turn: Mutex::new(turn),
        });
        unpoisoned(&self.holds).insert(req.hold_id.clone(), hold.clone());
        if let Some(t) = self.idle_timeout {
            tokio::spawn(keep_busy(hold, t));
        }
        Ok(Outcome::Granted {
            token,
            session: bound,
        })
    }

    /// Closes a session that may hold the lock of `name` (which frees it),
    /// within a request timeout, and wakes the lock's waiters.
    async fn discard(&self, c: PgConnection, name: &str) {
        let _ = tokio::time::timeout(self.request_timeout(), c.close()).await;
        // In the background: with the server gone, the pool's wait for a
        // connection would hold up the try's answer.
        let (table, name) = (self.table.clone(), name.to_owned());
        tokio::spawn(async move { table.wake_waiters(&name).await });
    }

    /// Unlocks and closes the session of `hold_id`; whether it still held.
    /// Ends the hold; whether it was still held, `None` when its session
    /// failed under the unlock (closing it freed the lock, but whether it
    /// was still held then is unknown).
    async fn end(&self, hold_id: &str) -> Option<bool> {
        let Some(hold) = unpoisoned(&self.holds).remove(hold_id) else {
            return Some(false);
        };
        // Out before the first await: a release cut short still gives the
        // client's next writer of the lock its turn.
        let turn = unpoisoned(&hold.turn).take();
        // Let its session keeper end now, dropping its share of the session.
        hold.ended.send_replace(true);
        let was = unlock(&hold, &self.idle, &self.table).await;
        // The client's next writer of the lock may wait in the server now.
        drop(turn);
        was
    }
}

/// Unlocks the hold and wakes the name's waiters, and gives its session
/// back (to the idle stack when the unlock was confirmed, else closed)
/// unless another hold of the owner uses it; whether the lock was still
/// held, `None` if the session failed (closing it freed the lock). When
/// the statement did not run, the waiters are woken over the pool.
async fn unlock(
    hold: &SessionHold,
    idle: &IdleSessions<PgConnection>,
    table: &PgBackend,
) -> Option<bool> {
    let mut guard = hold.conn.lock().await;
    let Some(c) = guard.as_mut() else {
        table.wake_waiters(hold.name.as_str()).await;
        return Some(false);
    };
    // The map and this hold are gone: only other holds keep the session,
    // and no new one can find it.
    let last = Arc::strong_count(&hold.conn) == 1;
    let was = sqlx::query(if hold.shared {
        UNLOCK_SHARED_AND_WAKE
    } else {
        UNLOCK_AND_WAKE
    })
    .bind(hold.key)
    .bind(hold.name.as_str())
    .bind(last)
    .fetch_one(&mut *c)
    .await
    .and_then(|r| r.try_get::<bool, _>("was"));
    // A statement that did not run sent no wake-up for the lock its
    // session's end freed.
    let woke = was.is_ok();
    let was = match was {
        Ok(was) => Some(was),
        // The server ended the session before it ran the unlock (an
        // operator's pg_terminate_backend, a shutdown): the lock went
        // with the session, before this release.
        Err(sqlx::Error::Database(e)) if ended_by_server(e.as_ref()) => Some(false),
        Err(_) => None,
    };
    if last && let Some(c) = guard.take() {
        if was == Some(true) {
            idle.put(c);
        } else {
            // Closing the session frees the lock even if the unlock failed.
            let _ = c.close().await;
        }
    }
    drop(guard);
    if !woke {
        table.wake_waiters(hold.name.as_str()).await;
    }
    was
}

/// Whether a statement's error is the server's word that it ended the
/// session (a `FATAL` or `PANIC` error) before running the statement.
/// (A crash or immediate shutdown on PostgreSQL 14+ only warns, then
/// closes: that reads as a failed session, whose answer is unknown.)
fn ended_by_server(e: &dyn sqlx::error::DatabaseError) -> bool {
    use sqlx::postgres::{PgDatabaseError, PgSeverity};
    e.try_downcast_ref::<PgDatabaseError>()
        .is_some_and(|e| matches!(e.severity(), PgSeverity::Fatal | PgSeverity::Panic))
}

/// A statement on the hold's session, to tell (and show the server) it
/// lives; moves the session's bound when it answers.
async fn touch(hold: &SessionHold, idle_timeout: Option<Duration>) -> bool {
    let mut c = hold.conn.lock().await;
    let Some(conn) = c.as_mut() else {
        return false;
    };
    let sent = Instant::now();
    let alive = sqlx::query("SELECT 1").execute(conn).await.is_ok();
    if alive && let (Some(b), Some(t)) = (&hold.alive, idle_timeout) {
        b.send_replace(believed_until(sent, t));
    }
    alive
}

/// Keeps a hold's session from the server's idle timeout `t` until the
/// hold ends. (A hold whose lease runs out unrenewed is ended by the core,
/// which releases it: this backend keeps no lease timer.)
async fn keep_busy(hold: Arc<SessionHold>, t: Duration) {
    let mut ended = hold.ended.subscribe();
    loop {
        if ended.get_and_update() {
            return;
        }
        tokio::select! {
            changed = ended.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(t / 3) => {
                touch(&hold, Some(t)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_bounds_outlast_the_lease_on_either_clock() {
        assert_eq!(link_text(Duration::from_secs(30), true), "31000 31 1 10");
        assert_eq!(link_text(Duration::from_secs(30), false), "0 31 1 10");
        let day = 86_400_000;
        for ms in [0, 1, 999, 1500, 2000, 9_999, 30_000, 600_000, day, 4 * day] {
            let lease = Duration::from_millis(ms);
            let f: Vec<u64> = link_text(lease, true)
                .split(' ')
                .map(|n| n.parse().unwrap())
                .collect();
            let [user_ms, idle, every, count] = f[..] else {
                panic!("four fields")
            };
            assert!(user_ms as u128 > lease.as_millis(), "{ms}: {f:?}");
            // The keepalives alone: whatever count the system takes.
            assert!(
                (idle + every * count.min(10)) * 1000 >= user_ms,
                "{ms}: {f:?}"
            );
            assert!((1..=32_767).contains(&idle), "{ms}: {f:?}");
            assert!((1..=32_767).contains(&every), "{ms}: {f:?}");
            assert!((1..=127).contains(&count), "{ms}: {f:?}");
        }
        // The option's range: no lease overflows it.
        let long = link_text(Duration::from_secs(u64::MAX / 4), true);
        assert!(long.starts_with(&i32::MAX.to_string()), "{long}");
    }

    #[test]
    fn keys_are_stable() {
        // FNV-1a 64 of "orders:1001": a change here breaks every deployed lock.
        assert_eq!(key("orders:1001"), key("orders:1001"));
        assert_ne!(key("a"), key("b"));
        assert_eq!(key(""), 0xcbf2_9ce4_8422_2325_u64 as i64);
        let (hi, lo) = halves(-1);
        assert_eq!((hi, lo), (0xffff_ffff, 0xffff_ffff));
    }
}
