//! The traits a backend implements, split by concern in the manner of
//! sqlx's driver traits: [`LockBackend`] for holds, [`Store`] for the
//! small values beside them, and [`ElectionLayout`] for the few engines
//! with an election layout of their own. [`Backend`] is what the client
//! keeps: a lock backend that is also a store, with election optional.
//!
//! # What every backend promises
//!
//! - **One atomic try.** [`LockBackend::attempt`] decides a grant in one
//!   step that no other client's step can interleave with (a transaction,
//!   a script, a compare-and-set), and issues a fencing token above every
//!   token the name had.
//! - **Owner-only release.** [`LockBackend::release`] and
//!   [`LockBackend::renew`] touch only the hold named by its `hold_id`:
//!   another owner's hold, or a later hold of the same owner, is never
//!   released or extended by it. Both are idempotent.
//! - **Wake-ups.** The client hands the backend its
//!   [`Wakeups`](crate::spi::wake::Wakeups) when it opens it. A `Busy`
//!   answer to an attempt with `will_wait` means the backend has already
//!   arranged to wake that name when it changes (a release, an expiry the
//!   backend notices, a queue place freed); a waiter also re-attempts at
//!   `retry_after`, so a lost notification costs latency, never progress.
//! - **Queue places expire.** A place in a fair queue (a [`Ticket`]) that
//!   is not attempted again within
//!   [`QUEUE_TTL`](crate::spi::lease::QUEUE_TTL) is dropped by the
//!   backend, so a dead waiter blocks others for at most that long.
//! - **Leases end holds.** A hold whose lease runs out unrenewed is
//!   ended: by the server where it counts leases, else by the core, which
//!   releases it ([`LockBackend::ends_holds`]).
//! - **Renewal is measured from its send time.** A `Held` renewal means
//!   the server kept the hold at least a full lease from the moment the
//!   request was sent; the core derives the deadline it believes from
//!   that moment ([`believed_until`](crate::spi::lease::believed_until)).
//!   A backend whose holds live on a session (etcd, ZooKeeper, advisory
//!   locks) also hands out the session's
//!   [`Bound`](crate::spi::lease::Bound) with each grant: until when the
//!   server is known to keep the session.
//! - **Bounded calls.** Every call answers or fails within
//!   [`LockBackend::request_timeout`]; the core retries transient errors
//!   within the caller's deadline.

use super::rate::RateCost;
use super::types::{
    Attempt, BoxFuture, HoldRef, LeaderValue, LockStatus, Outcome, Ownership, RegisterValue,
    RegisterWrite, Renewal, Reply, Withdrawal,
};
use crate::name::LockName;
use std::time::Duration;

/// How long one request to a backend may take unless its URL says
/// otherwise (`timeout=`): an attempt, a renewal or a release that takes
/// longer counts as failed (and is retried where the caller's deadline
/// allows), so no call waits on a server that does not answer.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Holds: try, extend, drop, and tell what is held.
pub(crate) trait LockBackend: Send + Sync + 'static {
    /// The URL scheme, for logs and status.
    fn scheme(&self) -> &'static str;

    /// Whether `fair` is honoured.
    fn supports_fair(&self) -> bool {
        true
    }

    /// One atomic try. On `Busy` with `will_wait`, the backend must already
    /// have arranged to wake this name when it changes.
    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome>;

    /// Whether the server ends a hold when its lease runs out (a Redis
    /// key's TTL, a lease table's expiry). `false` where a hold lives as
    /// long as the client's session (an etcd key on the session lease, a
    /// ZooKeeper ephemeral node, an advisory lock): the core then ends a
    /// hold whose lease ran out unrenewed, by releasing it, so no backend
    /// keeps lease timers of its own.
    fn ends_holds(&self) -> bool {
        true
    }

    /// Whether a waiter's queue place (its ticket) ends unless the waiter
    /// attempts again within [`QUEUE_TTL`](crate::spi::lease::QUEUE_TTL)
    /// (a lease table's queue, Redis's); `false` where places live as long
    /// as the client's session (a ZooKeeper node, an etcd key). The core
    /// keeps a waiter's place by attempting before it ends.
    fn places_expire(&self) -> bool {
        true
    }

    /// Extends each hold's lease; one [`Renewal`] per hold, in order.
    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>>;

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
    fn release<'a>(&'a self, hold: &'a HoldRef) -> Reply<'a, bool>;

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
    fn abandon<'a>(&'a self, gone: &'a Withdrawal) -> Reply<'a, ()>;

    /// What the backend knows of `name`.
    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus>;

    /// The names starting with `prefix` that may be held or waited for
    /// now, each once, for `fenced list`: the client asks
    /// [`status`](Self::status) of each and keeps those held or queued, so
    /// a name that is neither may be among them.
    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>>;

    /// Drops every hold of `name` whoever holds it (an operator's "break
    /// lock"); returns how many holds were dropped.
    fn force_release<'a>(&'a self, name: &'a LockName) -> Reply<'a, usize>;

    /// The backend's own record of a hold, for guarding writes in the
    /// user's own transactions (see [`Guard::ownership`](crate::Guard::ownership)).
    fn ownership(&self, _hold: &HoldRef) -> Option<Ownership> {
        None
    }

    /// The settings of the server (or the host) the guarantees rest on
    /// (see [`Client::doctor`](crate::Client::doctor)); none by default.
    fn doctor(&self) -> Reply<'_, Vec<crate::doctor::Check>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Lets go of connections; called once by `Client::close`.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Small values kept beside the locks: the fenced register, which is also
/// a versioned value and a counter.
pub(crate) trait Store: Send + Sync + 'static {
    /// The fenced register: its value and the highest fence it has seen.
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue>;

    /// Writes the register if its rule allows; `false` when refused.
    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool>;

    /// Atomically subtracts `by` from the register's integer value if the
    /// result stays ≥ 0; the new value, or `None` if it would go negative.
    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>>;

    /// Arranges that a change of register `name` by any client, made
    /// after this call returns, wakes
    /// [`register_key`](crate::spi::wake::register_key)`(name)` in this
    /// client's [`Wakeups`](crate::spi::wake::Wakeups) at least once. A
    /// waiter calls it before each read it then waits on, while it has
    /// an [`Interest`](crate::spi::wake::Interest) in that key; the
    /// arrangement may end once it has woken, or once nobody in this
    /// client has that interest. Every successful write and decrement
    /// notifies the watchers. As with locks, a lost notification costs
    /// latency, never progress: waiters also look again on their own.
    fn watch_register<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()>;

    /// Deletes the register; whether it was there. Its watchers are told.
    fn register_delete<'a>(&'a self, name: &'a LockName) -> Reply<'a, bool>;

    /// One decision of the rate limiter `name` by the server's clock (see
    /// [`gcra`](crate::spi::rate::gcra)): `None` when granted (the state
    /// moved on), else how long until it would be (nothing changed). In
    /// one atomic step, as an attempt is. Refused by default (see
    /// [`has_rate_limiters`](Self::has_rate_limiters)).
    fn rate_acquire<'a>(
        &'a self,
        _name: &'a LockName,
        _cost: RateCost,
    ) -> Reply<'a, Option<Duration>> {
        crate::spi::rate::refused("this backend")
    }

    /// Adds `delta` to the register's decimal integer (0 if never
    /// written) and moves its version on, in one step on the server: the
    /// new value, or `None` where the backend has no such step or refused
    /// this one (not an integer, out of range), and the caller changes it
    /// by compare-and-set instead, which says why.
    fn register_add<'a>(&'a self, _name: &'a LockName, _delta: i64) -> Reply<'a, Option<i64>> {
        Box::pin(async { Ok(None) })
    }

    /// Whether [`rate_acquire`](Self::rate_acquire) is there: one server
    /// whose clock every client reads. Where not, it is never called.
    fn has_rate_limiters(&self) -> bool {
        true
    }
}

/// An engine's own election layout (etcd's `concurrency.Election`): the
/// leader's value lives in the leader's key, where other clients of that
/// layout read it. Backends without one keep the value in a fenced
/// register beside the lock.
pub(crate) trait ElectionLayout: Send + Sync {
    /// Publishes the value of the leader whose hold is `hold` with `token`,
    /// if that hold still leads; `false` if it does not.
    fn proclaim<'a>(&'a self, hold: &'a HoldRef, token: u64, value: &'a [u8]) -> Reply<'a, bool>;

    /// The leader's value and token, `None` when nobody leads.
    fn leader<'a>(&'a self, name: &'a LockName) -> Reply<'a, LeaderValue>;

    /// Arranges that a change of who leads `name`, or of the value it
    /// proclaimed, made after this call returns, wakes `wake` in this
    /// client's wake-ups at least once (as
    /// [`Store::watch_register`] does for a register).
    fn watch_leader<'a>(&'a self, name: &'a LockName, wake: &'a str) -> Reply<'a, ()>;
}

/// How a recipe's value is spelled where a foreign client of the same
/// engine keeps it (see [`NodeLayout`]). Through the layout the recipe
/// reads and writes fenced's own register form (decimal text; `1` or `0`
/// for a barrier) and the backend translates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Codec {
    /// A 64-bit integer, as Curator's `DistributedAtomicLong` keeps it
    /// (8 bytes big-endian, no data counting 0). A value found in 4
    /// bytes (a `SharedCount`'s) is written back in 4.
    Long,
    /// A 32-bit integer, as Curator's `SharedCount` keeps it (4 bytes
    /// big-endian): what a new value is written as.
    Int,
    /// Set (`1`) while the node exists, as Curator's `DistributedBarrier`.
    Presence,
}

/// The engine's own layout for the values of recipes that a foreign client
/// shares (Curator's counters and barrier on ZooKeeper): the value lives
/// at the recipe's path in the foreign form, not in a fenced register.
/// Versions are the backend's own: they move on with every change and
/// mean nothing else.
pub(crate) trait NodeLayout: Send + Sync {
    /// The value of recipe `name` in register form and its version;
    /// `None` where there is none.
    fn node_read<'a>(&'a self, name: &'a LockName, codec: Codec) -> Reply<'a, RegisterValue>;

    /// Writes `value` (register form) if the version is still `version`
    /// (0: none there); `false` when another writer got there first.
    fn node_write<'a>(
        &'a self,
        name: &'a LockName,
        codec: Codec,
        version: u64,
        value: &'a [u8],
    ) -> Reply<'a, bool>;

    /// As [`Store::watch_register`], for the value of recipe `name`: a
    /// change wakes [`register_key`](crate::spi::wake::register_key)`(name)`.
    fn watch_node<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()>;
}

/// The engine's own layout of double barriers (Curator's
/// `DistributedDoubleBarrier` on ZooKeeper): each member a node of the
/// client's session under the barrier's (a hold of a lock of
/// [`Kind::Member`](crate::spi::Kind)), and a `ready` node set by the
/// member that finds them all in. Every wake-up here wakes
/// [`register_key`](crate::spi::wake::register_key)`(name)`.
pub(crate) trait BarrierLayout: Send + Sync {
    /// The members' nodes, sorted by name, and whether `ready` is set.
    fn barrier_members<'a>(&'a self, name: &'a LockName) -> Reply<'a, (Vec<String>, bool)>;

    /// Arranges that `ready` being set or removed wakes the waiters.
    fn watch_ready<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()>;

    /// Sets `ready` anew (`true`: made, or replaced in one step if one
    /// is there, so it is newer than every member node), or removes it;
    /// idempotent.
    fn set_ready<'a>(&'a self, name: &'a LockName, ready: bool) -> Reply<'a, ()>;

    /// Whether `ready` is left from a round none of whose members is in
    /// any more: every one of `members` (as
    /// [`barrier_members`](Self::barrier_members) listed them) still there
    /// came after it. Such a `ready` opens nothing; the member that fills
    /// the next round replaces it.
    fn ready_is_stale<'a>(&'a self, name: &'a LockName, members: &'a [String]) -> Reply<'a, bool>;

    /// Arranges that member node `member`'s going wakes the waiters;
    /// `false` if it is gone already.
    fn watch_member<'a>(&'a self, name: &'a LockName, member: &'a str) -> Reply<'a, bool>;

    /// The member node of `hold`, while this client knows it.
    fn member_of(&self, hold: &HoldRef) -> Option<String>;
}

/// What a client keeps: a lock backend that is also a store, with an
/// election layout and layouts of recipes where the engine has them.
pub(crate) trait Backend: LockBackend + Store {
    /// The engine's own election layout, if it has one.
    fn election(&self) -> Option<&dyn ElectionLayout> {
        None
    }

    /// The engine's own layout of recipe values, if it has one.
    fn nodes(&self) -> Option<&dyn NodeLayout> {
        None
    }

    /// The engine's own layout of double barriers, if it has one.
    fn barriers(&self) -> Option<&dyn BarrierLayout> {
        None
    }
}
