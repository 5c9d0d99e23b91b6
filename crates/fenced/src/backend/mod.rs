//! The backend SPI: what a storage engine must do, and nothing more.
//!
//! Reentrancy, the watchdog, timeouts, retries, the lost signal and
//! cancellation cleanup are written once in `core/`; a backend only knows
//! how to try one grant atomically, extend and drop holds, and tell waiters
//! that a name changed (through [`Wakeups`](crate::core::wake::Wakeups)).
//!
//! Mutex, read-write lock and semaphore are one machine with three modes
//! ([`Mode`]); the grant rule for all of them is
//! [`core::machine::grantable`](crate::core::machine::grantable).

use crate::core::wake::Wakeups;
use crate::error::Result;
use crate::name::LockName;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "mysql")]
pub(crate) mod mysql_advisory;
#[cfg(feature = "postgres")]
pub(crate) mod pg_advisory;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) mod queue;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
#[cfg(feature = "zookeeper")]
pub(crate) mod zk;

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Locks a std mutex, carrying on past a panic elsewhere (the data it
/// guards stays consistent between statements).
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "postgres",
        feature = "mysql",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Returns when the deadline in `rx` has passed: renewals move it forward,
/// and a sender set to now (or dropped) ends the wait at once. The lease
/// of a session-held lock, which the server does not time out itself.
#[cfg_attr(
    not(any(
        feature = "postgres",
        feature = "mysql",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]
pub(crate) async fn lease_runs_out(mut rx: tokio::sync::watch::Receiver<tokio::time::Instant>) {
    loop {
        let until = *rx.borrow_and_update();
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {
                if *rx.borrow() <= tokio::time::Instant::now() {
                    return;
                }
            }
            changed = rx.changed() => if changed.is_err() { return },
        }
    }
}

/// Starts a hold's lease timer, the first time only: `end` runs when the
/// lease in `slot` runs out (or its sender is dropped). A second answer
/// for one hold (a try that outlived its caller's patience, answered
/// after the next) keeps the first grant's lease: a second timer would
/// orphan the first, which would end the hold early.
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
pub(crate) fn arm_lease_once<F>(
    slot: &std::sync::Mutex<Option<tokio::sync::watch::Sender<tokio::time::Instant>>>,
    lease: Duration,
    end: F,
) where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let mut slot = lock(slot);
    if slot.is_none() {
        let (tx, rx) = tokio::sync::watch::channel(tokio::time::Instant::now() + lease);
        *slot = Some(tx);
        tokio::spawn(async move {
            lease_runs_out(rx).await;
            end.await;
        });
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
        lock(&self.0).pop()
    }

    /// Keeps `s` if there is room; otherwise it is dropped, which closes it.
    pub(crate) fn put(&self, s: T) {
        let mut idle = lock(&self.0);
        if idle.len() < Self::MAX {
            idle.push(s);
        }
    }

    pub(crate) fn clear(&self) {
        lock(&self.0).clear();
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

/// A backend's own election layout's answer: `None` when it has none,
/// `Some(None)` when nobody leads, else the leader's value and token.
pub(crate) type NativeLeader = Option<Option<(Vec<u8>, u64)>>;

/// A fenced register's value and the highest fence it has seen.
pub(crate) type RegisterValue = Option<(Vec<u8>, u64)>;

/// A fence as SQL's signed 64-bit integer.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn fence_i64(f: u64) -> crate::error::Result<i64> {
    i64::try_from(f).map_err(|_| {
        crate::error::Error::invalid(format!(
            "fencing token {f} is beyond what this backend issues"
        ))
    })
}

/// The version after `v` for a versioned compare-and-set, refused when it
/// would not fit (a version read from somewhere else than this backend).
pub(crate) fn next_version(name: &LockName, v: u64) -> crate::error::Result<u64> {
    v.checked_add(1).ok_or_else(|| {
        crate::error::Error::invalid(format!(
            "version {v} of {:?} has no successor: versions count writes from 0",
            name.as_str()
        ))
    })
}

/// How a hold shares its lock with others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One owner at a time (a mutex, or the write side of a read-write lock).
    Exclusive,
    /// Any number of owners at once, but no exclusive holder (the read side).
    Shared,
    /// `take` of the semaphore's `max` permits.
    Permits {
        /// Permits this hold takes.
        take: u32,
        /// Permits the semaphore has in all.
        max: u32,
    },
}

impl Mode {
    /// Whether one owner's repeated acquisitions nest into one hold.
    /// Semaphore permits do not: each acquisition takes more permits.
    pub(crate) fn is_reentrant(self) -> bool {
        !matches!(self, Mode::Permits { .. })
    }

    /// A stable small number for storage.
    pub(crate) fn code(self) -> i64 {
        match self {
            Mode::Exclusive => 0,
            Mode::Shared => 1,
            Mode::Permits { .. } => 2,
        }
    }

    #[cfg_attr(
        not(any(feature = "sqlite", feature = "redis", feature = "postgres")),
        allow(dead_code)
    )]
    pub(crate) fn from_code(code: i64, take: u32, max: u32) -> Option<Mode> {
        match code {
            0 => Some(Mode::Exclusive),
            1 => Some(Mode::Shared),
            2 => Some(Mode::Permits { take, max }),
            _ => None,
        }
    }

    #[cfg_attr(
        not(any(feature = "sqlite", feature = "redis", feature = "postgres")),
        allow(dead_code)
    )]
    pub(crate) fn permits(self) -> (u32, u32) {
        match self {
            Mode::Permits { take, max } => (take, max),
            _ => (0, 0),
        }
    }
}

/// A place in a fair queue, kept across attempts.
pub(crate) type Ticket = i64;

/// One try at a grant.
#[derive(Clone, Debug)]
pub(crate) struct Attempt {
    pub(crate) name: LockName,
    /// `<client id>:<owner id>`: who holds, for reentrancy and status.
    pub(crate) owner_key: String,
    /// Unique per grant: what release and renew name.
    pub(crate) hold_id: String,
    pub(crate) mode: Mode,
    /// A side of a read-write lock rather than a mutex or semaphore.
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
    pub(crate) rw: bool,
    pub(crate) lease: Duration,
    pub(crate) fair: bool,
    /// Whether the caller will wait if busy: backends that need to register
    /// a waiter (for wake-ups or a queue place) do so only then.
    pub(crate) will_wait: bool,
    /// The queue place from an earlier busy attempt.
    pub(crate) ticket: Option<Ticket>,
}

/// The answer to an attempt.
#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    Granted {
        token: u64,
        /// The session that keeps the grant on the server, on backends
        /// whose holds live only as long as a session (etcd, ZooKeeper,
        /// advisory locks): the hold is believed no longer than it.
        session: Option<crate::core::hold::Bound>,
    },
    Busy(Blocked),
    /// The request can never be granted as asked (a semaphore held with
    /// another count of permits): the caller gets `InvalidInput` with this
    /// message, and nothing of the attempt is left behind.
    Refused(String),
}

impl Outcome {
    /// A grant that no session bounds (the server keeps it for its lease).
    pub(crate) fn granted(token: u64) -> Outcome {
        Outcome::Granted {
            token,
            session: None,
        }
    }
}

/// What a renewal learned of one hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Still ours: extended (or, on a session backend, still there) as of
    /// the moment the renewal was sent.
    Held,
    /// The backend no longer names it.
    Gone,
    /// No answer for this one (RedLock: too few masters answered to tell):
    /// try again; the hold stays believed until its lease says otherwise.
    Unknown,
}

impl Renewal {
    /// `Held` or `Gone`.
    pub(crate) fn from(held: bool) -> Renewal {
        if held { Renewal::Held } else { Renewal::Gone }
    }
}

/// How long one request to a backend may take unless its URL says
/// otherwise (`timeout=`): an attempt, a renewal or a release that takes
/// longer counts as failed (and is retried where the caller's deadline
/// allows), so no call waits on a server that does not answer.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an attempt did not succeed, and when to look again.
#[derive(Clone, Debug)]
pub(crate) struct Blocked {
    /// The queue place (fair mode, or a waiter registration).
    pub(crate) ticket: Option<Ticket>,
    /// When a holder's lease runs out, as far as the backend knows: the
    /// fallback re-check time if no notification comes.
    pub(crate) retry_after: Option<Duration>,
}

/// A hold as the backend sees it.
#[derive(Clone, Debug)]
pub(crate) struct HoldRef {
    pub(crate) name: LockName,
    pub(crate) hold_id: String,
    /// `<client id>:<owner id>`, as in the attempt that won it.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) owner_key: String,
    pub(crate) lease: Duration,
}

impl Attempt {
    /// The id of the client making the attempt (`owner_key`'s first part).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn client_id(&self) -> &str {
        self.owner_key
            .split_once(':')
            .map_or(self.owner_key.as_str(), |(client, _)| client)
    }

    /// The hold this attempt makes when granted.
    pub(crate) fn hold_ref(&self) -> HoldRef {
        HoldRef {
            name: self.name.clone(),
            hold_id: self.hold_id.clone(),
            owner_key: self.owner_key.clone(),
            lease: self.lease,
        }
    }
}

/// What the backend knows of one lock name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockStatus {
    /// The current holders (empty when free).
    pub holders: Vec<HolderInfo>,
    /// Waiters registered with the backend (queued in fair mode, or
    /// registered for wake-ups).
    pub waiters: usize,
    /// The highest fencing token issued for this name, 0 if none.
    pub last_token: u64,
}

impl LockStatus {
    /// True when nobody holds the lock.
    pub fn is_free(&self) -> bool {
        self.holders.is_empty()
    }
}

/// One holder of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderInfo {
    /// `<client id>:<owner id>`.
    pub owner: String,
    /// How it holds.
    pub mode: Mode,
    /// The token of its grant.
    pub token: u64,
    /// Lease left as the backend counts it.
    pub lease_left: Duration,
}

pub(crate) trait Backend: Send + Sync + 'static {
    /// The URL scheme, for logs and status.
    fn scheme(&self) -> &'static str;

    /// Whether `fair` is honoured.
    fn supports_fair(&self) -> bool {
        true
    }

    /// Where waiters of this backend are woken.
    fn wakeups(&self) -> &std::sync::Arc<Wakeups>;

    /// One atomic try. On `Busy` with `will_wait`, the backend must already
    /// have arranged to bump [`Wakeups`] for this name when it changes.
    fn attempt<'a>(&'a self, req: &'a Attempt) -> BoxFuture<'a, Result<Outcome>>;

    /// Extends each hold's lease; one [`Renewal`] per hold, in order.
    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> BoxFuture<'a, Result<Vec<Renewal>>>;

    /// How long one request may take (the URL's `timeout=`, else
    /// [`DEFAULT_TIMEOUT`]).
    fn request_timeout(&self) -> Duration {
        DEFAULT_TIMEOUT
    }

    /// Who the backend is, spelled the same way whatever URL named it
    /// (scheme aliases resolved, hosts sorted, default ports and
    /// databases written out, credentials and tuning left out): what
    /// MultiLock orders locks of different backends by, so that two
    /// processes that spell one backend differently still take locks in
    /// one order.
    fn identity(&self) -> String;

    /// Drops a hold; `true` when it was still there. Idempotent. One try:
    /// the caller retries transient errors.
    fn release<'a>(&'a self, hold: &'a HoldRef) -> BoxFuture<'a, Result<bool>>;

    /// Called once every retry of a release has failed on a transient
    /// error and nobody waits on it any more. Where a lease frees the lock
    /// (the default) there is nothing left to do; where the key lives as
    /// long as the client's session (etcd, ZooKeeper), the backend keeps
    /// trying in the background while that session lives, or the lock
    /// stays blocked for as long as the client runs (the torture suite's
    /// leader fault left an etcd lock blocked for 20 s).
    fn release_later(&self, _hold: HoldRef) {}

    /// Forgets a queue place (and a hold granted to an attempt whose caller
    /// went away, if any). Idempotent.
    fn abandon<'a>(
        &'a self,
        name: &'a LockName,
        ticket: Option<Ticket>,
        hold_id: &'a str,
    ) -> BoxFuture<'a, Result<()>>;

    /// What the backend knows of `name`.
    fn status<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<LockStatus>>;

    /// Drops every hold of `name` whoever holds it (an operator's "break
    /// lock"); returns how many holds were dropped.
    fn force_release<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<usize>>;

    /// The fenced register: its value and the highest fence it has seen.
    fn register_read<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<RegisterValue>>;

    /// Writes the register if `fence` is at least the highest it has seen
    /// (or unconditionally when `fence` is `None`); `false` when refused.
    fn register_write<'a>(
        &'a self,
        name: &'a LockName,
        fence: Option<u64>,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>>;

    /// Writes the register and sets its fence to `expected + 1` only if its
    /// fence is exactly `expected` (0 when it was never written): a
    /// versioned compare-and-set, the fence counting writes. `false` when
    /// the fence had moved on.
    fn register_swap<'a>(
        &'a self,
        name: &'a LockName,
        expected: u64,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>>;

    /// The backend's own record of a hold, for guarding writes in the
    /// user's own transactions (see [`Guard::ownership`](crate::Guard::ownership)).
    fn ownership(&self, _hold: &HoldRef) -> Option<crate::guard::Ownership> {
        None
    }

    /// Publishes an election leader's value where the backend's own
    /// election layout keeps it (etcd: in the leader's key), if the hold
    /// with `token` still holds: `Some(false)` if it does not, `None` if
    /// the backend has no such layout (the value then goes to a fenced
    /// register beside the lock).
    fn proclaim<'a>(
        &'a self,
        _hold: &'a HoldRef,
        _token: u64,
        _value: &'a [u8],
    ) -> BoxFuture<'a, Result<Option<bool>>> {
        Box::pin(async { Ok(None) })
    }

    /// The leader's value and token in the backend's own election layout:
    /// `Some(None)` when nobody leads, `None` if the backend has none.
    fn leader<'a>(&'a self, _name: &'a LockName) -> BoxFuture<'a, Result<NativeLeader>> {
        Box::pin(async { Ok(None) })
    }

    /// Atomically subtracts `by` from the register's integer value if the
    /// result stays ≥ 0; the new value, or `None` if it would go negative.
    fn register_decrement<'a>(
        &'a self,
        name: &'a LockName,
        by: i64,
    ) -> BoxFuture<'a, Result<Option<i64>>>;

    /// Lets go of connections; called once by `Client::close`.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}
