//! What a backend and the core say to each other: one attempt, its
//! outcome, a renewal's answer, a hold's reference, and what status shows.

use crate::error::Result;
use crate::name::LockName;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// The future every backend method returns.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a backend call answers: a boxed future of a result.
pub(crate) type Reply<'a, T> = BoxFuture<'a, Result<T>>;

/// An election's leader: its value and token, `None` when nobody leads.
pub(crate) type LeaderValue = Option<(Vec<u8>, u64)>;

/// A fenced register's value and the highest fence it has seen.
pub(crate) type RegisterValue = Option<(Vec<u8>, u64)>;

/// How a hold shares its lock with others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
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

/// `exclusive`, `shared`, or `2 of 5 permits`, as `fenced status` prints it.
///
/// ```
/// assert_eq!(fenced::Mode::Shared.to_string(), "shared");
/// ```
impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Exclusive => f.write_str("exclusive"),
            Mode::Shared => f.write_str("shared"),
            Mode::Permits { take, max } => write!(f, "{take} of {max} permits"),
        }
    }
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

/// A queue place to forget, and the hold that an attempt whose caller went
/// away may have been granted.
#[derive(Clone, Debug)]
pub(crate) struct Withdrawal {
    pub(crate) name: LockName,
    pub(crate) ticket: Option<Ticket>,
    pub(crate) hold_id: String,
}

/// When a register write is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteRule {
    /// Always; the fence stays as it was.
    Always,
    /// If this fence is at least the highest the register has seen; the
    /// register's fence becomes it.
    Fence(u64),
    /// If the register's fence is exactly this version (0 when it was
    /// never written); the fence becomes the next version: a versioned
    /// compare-and-set, the fence counting writes.
    Version(u64),
}

impl WriteRule {
    /// The register's fence after the write, given the fence it has now
    /// (`seen`, 0 when never written), or `None` when the rule refuses the
    /// write: the one decision that every backend reading before it writes
    /// makes the same way.
    pub(crate) fn fence_after(self, name: &LockName, seen: u64) -> Result<Option<u64>> {
        Ok(match self {
            WriteRule::Always => Some(seen),
            WriteRule::Fence(f) => (f >= seen).then_some(f),
            WriteRule::Version(v) if v == seen => Some(crate::spi::codec::next_version(name, v)?),
            WriteRule::Version(_) => None,
        })
    }
}

/// One conditional write of a fenced register.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegisterWrite<'a> {
    pub(crate) name: &'a LockName,
    pub(crate) value: &'a [u8],
    pub(crate) rule: WriteRule,
}

impl RegisterWrite<'_> {
    /// For a backend that writes by compare-and-set: the value and fence
    /// to put over `old` (the value and fence read), or `None` when the
    /// rule refuses the write.
    pub(crate) fn over(&self, old: Option<(&[u8], u64)>) -> Result<Option<(Vec<u8>, u64)>> {
        let seen = old.map_or(0, |(_, f)| f);
        let fence = self.rule.fence_after(self.name, seen)?;
        Ok(fence.map(|f| (self.value.to_vec(), f)))
    }
}

/// A decrement of a register's integer value, for a backend that writes
/// by compare-and-set: what to put over the value read, and what the
/// value came to.
pub(crate) struct Decrement<'a> {
    name: &'a LockName,
    by: i64,
    after: Option<i64>,
}

impl<'a> Decrement<'a> {
    pub(crate) fn new(name: &'a LockName, by: i64) -> Self {
        Decrement {
            name,
            by,
            after: None,
        }
    }

    /// The value and fence (kept) to put over `old`, or `None` when the
    /// register was never written or would go negative.
    pub(crate) fn over(&mut self, old: Option<(&[u8], u64)>) -> Result<Option<(Vec<u8>, u64)>> {
        self.after = None;
        let Some((v, f)) = old else { return Ok(None) };
        let n = crate::spi::codec::parse_i64(self.name, v)?;
        if n < self.by {
            return Ok(None);
        }
        self.after = Some(n - self.by);
        Ok(Some(((n - self.by).to_string().into_bytes(), f)))
    }

    /// The new value, if the write was made.
    pub(crate) fn result(&self, written: bool) -> Option<i64> {
        self.after.filter(|_| written)
    }
}

/// One try at a grant.
#[derive(Clone, Debug)]
pub(crate) struct Attempt {
    pub(crate) name: LockName,
    /// `<client id>:<owner id>`: who holds, for reentrancy and status.
    pub(crate) owner_key: String,
    /// Unique per grant: what release and renew name.
    pub(crate) hold_id: String,
    pub(crate) mode: Mode,
    /// What the lock is for, where the engine names that apart.
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
    pub(crate) kind: Kind,
    pub(crate) lease: Duration,
    pub(crate) fair: bool,
    /// Whether the caller will wait if busy: backends that need to register
    /// a waiter (for wake-ups or a queue place) do so only then.
    pub(crate) will_wait: bool,
    /// When a caller that waits gives up (`None`: never), for a backend
    /// whose try can wait in the server for the lock (advisory locks):
    /// such a try ends by then.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) until: Option<tokio::time::Instant>,
    /// The queue place from an earlier busy attempt.
    pub(crate) ticket: Option<Ticket>,
    /// What the hold records of its holder (see `holder`): host, process,
    /// command and the time this try was sent.
    pub(crate) holder: String,
}

impl Attempt {
    /// What withdrawing this attempt forgets.
    pub(crate) fn withdrawal(&self) -> Withdrawal {
        Withdrawal {
            name: self.name.clone(),
            ticket: self.ticket,
            hold_id: self.hold_id.clone(),
        }
    }
}

/// What a lock is for, beyond its [`Mode`], where an engine's other
/// clients name that apart: Curator names a mutex's nodes `lock-`, a
/// read-write lock's `__WRIT__` and `__READ__`, and a leader latch's
/// `latch-`. Other backends do not tell them apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A mutex or a semaphore.
    #[default]
    Lock,
    /// A side of a read-write lock.
    ReadWrite,
    /// A candidate in an election.
    Election,
    /// A member of a double barrier (its semaphore's permit elsewhere).
    Member,
}

/// The answer to an attempt.
#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    Granted {
        token: u64,
        /// The session that keeps the grant on the server, on backends
        /// whose holds live only as long as a session (etcd, ZooKeeper,
        /// advisory locks): the hold is believed no longer than it.
        session: Option<crate::spi::lease::Bound>,
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
#[non_exhaustive]
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
    #[cfg_attr(
        not(any(
            feature = "sqlite",
            feature = "redis",
            feature = "postgres",
            feature = "mysql",
            feature = "etcd",
            feature = "zookeeper"
        )),
        allow(dead_code)
    )]
    pub(crate) fn new(holders: Vec<HolderInfo>, waiters: usize, last_token: u64) -> Self {
        LockStatus {
            holders,
            waiters,
            last_token,
        }
    }

    /// True when nobody holds the lock.
    pub fn is_free(&self) -> bool {
        self.holders.is_empty()
    }
}

/// One holder of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// `<client id>:<owner id>`.
    pub owner: String,
    /// How it holds.
    pub mode: Mode,
    /// The token of its grant.
    pub token: u64,
    /// Lease left as the backend counts it.
    pub lease_left: Duration,
    /// The host, process and command that took the hold, and when; `None`
    /// for a foreign client's hold (Curator, `etcdctl lock`, Redisson) and
    /// on the advisory modes, which keep nothing beside the lock.
    pub holder: Option<crate::Holder>,
}

/// Where a backend records a hold (see [`Guard::ownership`](crate::Guard::ownership)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ownership {
    /// The key (etcd) or node path (ZooKeeper) of the hold.
    pub key: Vec<u8>,
    /// Its create revision (etcd) or `czxid` (ZooKeeper): the hold's
    /// fencing token.
    pub revision: u64,
}
