//! Holds: what a client believes it holds, with reentrancy counts and the
//! lost signal.
//!
//! A hold's *deadline* is the instant, on this process's monotonic clock,
//! until which the backend is known to keep it: the send time of the last
//! confirmed grant or renewal plus the lease. Measuring from the send time
//! (not the reply) errs on the safe side: the backend's own expiry is later.
//! Past the deadline the hold counts as lost at once, with no round trip,
//! so a process that wakes from a long pause never works on as a holder.
//!
//! The deadline is also short of the lease by a drift (RedLock's: 1 % of
//! the lease + 2 ms, at most half of it): timers fire up to a millisecond
//! late and clocks run at slightly different rates, and the lost signal
//! must fire before the backend can give the lock to another, not just
//! after. The torture suite's partition fault measured a 1 ms overlap
//! without it.
//!
//! A hold on a session (an etcd lease, a ZooKeeper session, a database
//! connection holding an advisory lock) is bounded by a second clock: the
//! server keeps the key, node or lock only as long as the session lives,
//! and the session may end long before the hold's own lease (a 10 s
//! session under a 30 s lease, the defaults). Such a hold carries the
//! session's [`Bound`], which the backend moves forward with each
//! keep-alive the server confirms; the hold is believed only until the
//! earlier of the two.

use crate::core::worker::Job;
use crate::name::LockName;
use crate::spi::lease::{Bound, believed_until};
use crate::spi::sync::{Watch, unpoisoned};
use crate::spi::{HoldRef, Mode};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Why a hold was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out on the local clock with no confirmed renewal (a
    /// fixed lease ended, renewals failed, or the process was paused).
    Expired,
    /// The backend no longer names this holder: a renewal found the hold
    /// gone (expired and taken, or broken by an operator).
    Taken,
    /// The session that keeps the hold on the server (an etcd lease, a
    /// ZooKeeper session, the database connection of an advisory lock)
    /// may have ended: no keep-alive was confirmed within its timeout, so
    /// the server may already have given the lock to another.
    SessionExpired,
    /// The client was closed while the hold was live: its lock was given
    /// back with the client's connections.
    Closed,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "lease expired without a confirmed renewal",
            LostReason::Taken => "the backend no longer holds it for us",
            LostReason::SessionExpired => {
                "the session holding it went unconfirmed past its timeout"
            }
            LostReason::Closed => "the client was closed while it was held",
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct HoldState {
    pub(crate) deadline: Instant,
    pub(crate) lost: Option<LostReason>,
}

/// What the acquire loop knows of a grant when it makes a [`Hold`].
pub(crate) struct Grant {
    pub(crate) r: HoldRef,
    pub(crate) owner_key: String,
    pub(crate) mode: Mode,
    pub(crate) token: u64,
    /// When the attempt that won it was sent.
    pub(crate) sent: Instant,
    /// The session that keeps it, if any.
    pub(crate) session: Option<Bound>,
    /// Whether other acquisitions of its owner may nest into it.
    pub(crate) reentrant: bool,
    /// Where a lost hold's release goes: once lost, the hold is not ours
    /// by our own reckoning, and what is left of it on the server would
    /// only keep others waiting.
    pub(crate) worker: mpsc::UnboundedSender<Job>,
    /// The backend's scheme, for metrics and the hold's span.
    pub(crate) scheme: &'static str,
}

/// One grant from the backend, shared by its nested guards.
pub(crate) struct Hold {
    pub(crate) r: HoldRef,
    pub(crate) owner_key: String,
    pub(crate) mode: Mode,
    pub(crate) token: u64,
    /// Whether other acquisitions may nest into it (an owner was named).
    pub(crate) reentrant: bool,
    count: AtomicU32,
    released: AtomicBool,
    state: Watch<HoldState>,
    session: Option<Bound>,
    worker: mpsc::UnboundedSender<Job>,
    scheme: &'static str,
    /// When the reply that granted it arrived, for its hold time.
    granted: Instant,
    /// The hold's tracing span, from grant to release or loss; taken (and
    /// so closed) at the end, which is said once.
    span: Mutex<Option<tracing::Span>>,
}

impl Hold {
    pub(crate) fn new(g: Grant) -> Arc<Hold> {
        let deadline = believed_until(g.sent, g.r.lease);
        let span = tracing::debug_span!(
            "hold",
            lock = %g.r.name,
            token = g.token,
            mode = %g.mode,
            backend = g.scheme
        );
        Arc::new(Hold {
            reentrant: g.reentrant && g.mode.is_reentrant(),
            r: g.r,
            owner_key: g.owner_key,
            mode: g.mode,
            token: g.token,
            count: AtomicU32::new(1),
            released: AtomicBool::new(false),
            state: Watch::new(HoldState {
                deadline,
                lost: None,
            }),
            session: g.session,
            worker: g.worker,
            scheme: g.scheme,
            granted: Instant::now(),
            span: Mutex::new(Some(span)),
        })
    }

    /// Gives back a grant no caller was handed (another task of its owner
    /// won the same lock at once): released, with no hold time recorded.
    pub(crate) fn set_unused(&self) {
        unpoisoned(&self.span).take();
        self.set_released();
    }

    /// The hold's span while it lasts (a disabled one after), for the
    /// events of its life.
    pub(crate) fn span(&self) -> tracing::Span {
        unpoisoned(&self.span)
            .clone()
            .unwrap_or_else(tracing::Span::none)
    }

    /// The hold ended, released (a drop is too) or lost for `lost`: its
    /// hold time (and loss) is recorded and its span closes. Once.
    fn end(&self, lost: Option<LostReason>) {
        if unpoisoned(&self.span).take().is_some() {
            if let Some(reason) = lost {
                crate::core::metrics::lost(self.scheme, reason);
            }
            let how = if lost.is_some() { "lost" } else { "released" };
            crate::core::metrics::hold_ended(self.scheme, how, self.granted.elapsed());
        }
    }

    pub(crate) fn name(&self) -> &LockName {
        &self.r.name
    }

    pub(crate) fn count(&self) -> u32 {
        self.count.load(Ordering::Acquire)
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    pub(crate) fn set_released(&self) {
        // A hold whose lease or session ran out before anyone noticed (a
        // fixed lease, a renewal not due yet) ends lost, not released.
        self.end(self.ran_out());
        self.released.store(true, Ordering::Release);
        // Wakes the lease timer of a backend that does not end holds
        // itself (see `end_unrenewed`), which then has nothing left to do.
        self.state.send_modify(|_| {});
    }

    pub(crate) fn state(&self) -> HoldState {
        self.state.get()
    }

    /// Until when the session keeps the hold, if it is on one.
    fn session_until(&self) -> Option<Instant> {
        self.session.as_ref().map(|s| s.get())
    }

    /// The earliest moment the server could give the hold away: its
    /// lease, or its session's end if that comes first.
    pub(crate) fn believed_until(&self) -> Instant {
        let d = self.state().deadline;
        self.session_until().map_or(d, |s| s.min(d))
    }

    /// Believed held: not released, not lost, and neither the lease nor
    /// the session has run out.
    pub(crate) fn is_held(&self) -> bool {
        !self.is_released() && self.state().lost.is_none() && Instant::now() < self.believed_until()
    }

    /// Why the hold counts as lost by the clock alone, if it does: its
    /// session ran out, or its lease did.
    pub(crate) fn ran_out(&self) -> Option<LostReason> {
        let now = Instant::now();
        if self.session_until().is_some_and(|s| s <= now) {
            Some(LostReason::SessionExpired)
        } else if self.state().deadline <= now {
            Some(LostReason::Expired)
        } else {
            None
        }
    }

    /// The renewal sent at `sent` was confirmed.
    pub(crate) fn confirm(&self, sent: Instant) {
        let lease = self.r.lease;
        let session_over = self.session_until().is_some_and(|u| u <= Instant::now());
        self.state.send_if_modified(|s| {
            // A confirmation that arrives after the deadline passed cannot
            // revive the hold: someone may have taken it in between.
            if s.lost.is_some() || Instant::now() >= s.deadline || session_over {
                return false;
            }
            let d = believed_until(sent, lease);
            if d > s.deadline {
                s.deadline = d;
                true
            } else {
                false
            }
        });
    }

    /// Fires the lost signal (once).
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        let fired = self.state.send_if_modified(|s| {
            // A renewal in flight when the holder released may answer
            // "gone" or fail: the hold ended cleanly, nobody is told.
            if s.lost.is_some() || self.is_released() {
                return false;
            }
            s.lost = Some(reason);
            true
        });
        // Fired while not released: the holder's release (if it comes
        // now) sees the loss and leaves the giving back to this job.
        if fired {
            tracing::warn!(parent: &self.span(), lock = %self.r.name, token = self.token, %reason, "lock lost");
            self.end(Some(reason));
            let _ = self.worker.send(Job::Release(self.r.clone()));
        }
    }

    /// Resolves when the hold is lost; never, once it is released.
    pub(crate) async fn lost(self: Arc<Self>) -> LostReason {
        let mut rx = self.state.subscribe();
        let mut session = self.session.clone();
        loop {
            let s = rx.get_and_update();
            if let Some(reason) = s.lost {
                return reason;
            }
            let until = match session.as_mut() {
                Some(b) => s.deadline.min(b.get_and_update()),
                None => s.deadline,
            };
            let session_moved = async {
                match session.as_mut() {
                    Some(b) => {
                        if b.changed().await.is_err() {
                            // The backend dropped the session's clock: it
                            // will move no more, so its last word stands.
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // Biased: one order of branches, so a seed replays the same.
                biased;
                _ = tokio::time::sleep_until(until) => {
                    if self.is_released() {
                        std::future::pending::<()>().await;
                    }
                    if let Some(reason) = self.ran_out() {
                        self.mark_lost(reason);
                    }
                }
                changed = rx.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                _ = session_moved => {}
            }
        }
    }

    /// The lease timer of a hold whose backend does not end it when its
    /// lease runs out (a key, node or advisory lock that lives as long as
    /// the client's session): once the hold is no longer believed, by its
    /// lease or its session, it counts as lost and its release goes to the
    /// worker, so the lock is freed for others as a lease would free it.
    /// Renewals move the deadline; a release ends the timer. One mechanism
    /// for every such backend, run by the core.
    pub(crate) async fn end_unrenewed(self: Arc<Self>) {
        let mut rx = self.state.subscribe();
        let mut session = self.session.clone();
        loop {
            let s = rx.get_and_update();
            if s.lost.is_some() || self.is_released() {
                return;
            }
            let until = match session.as_mut() {
                Some(b) => s.deadline.min(b.get_and_update()),
                None => s.deadline,
            };
            let session_moved = async {
                let moved = match session.as_mut() {
                    Some(b) => b.changed().await.is_ok(),
                    None => false,
                };
                if !moved {
                    // The session's clock will move no more: its last
                    // word stands, and the sleep below reaches it.
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                // Biased: one order of branches, so a seed replays the same.
                biased;
                _ = tokio::time::sleep_until(until) => {
                    if let Some(reason) = self.ran_out() {
                        // Not if a release came first: mark_lost checks.
                        self.mark_lost(reason);
                        return;
                    }
                }
                changed = rx.changed() => if changed.is_err() { return },
                _ = session_moved => {}
            }
        }
    }

    pub(crate) fn lease_left(&self) -> Duration {
        if self.state().lost.is_some() {
            return Duration::ZERO;
        }
        self.believed_until()
            .saturating_duration_since(Instant::now())
    }

    /// The renewal period: a third of the lease (Redisson's 30 s / 10 s).
    pub(crate) fn renew_interval(&self) -> Duration {
        (self.r.lease / 3).max(Duration::from_micros(300))
    }
}

type Key = (LockName, String, i64);

/// The per-client table of reentrant holds, keyed by (name, owner, mode),
/// and a list of every hold the client has granted, to tell them when the
/// client closes.
#[derive(Default)]
pub(crate) struct HoldTable {
    map: Mutex<HashMap<Key, Arc<Hold>>>,
    /// Every hold handed out, and whether the client has closed (then no
    /// more are).
    every: Mutex<(Vec<Weak<Hold>>, bool)>,
}

fn key(name: &LockName, owner_key: &str, mode: Mode) -> Key {
    (name.clone(), owner_key.to_owned(), mode.code())
}

impl HoldTable {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Hold>>> {
        unpoisoned(&self.map)
    }

    /// Nests into a live hold of the same (name, owner, mode), if any.
    pub(crate) fn join(&self, name: &LockName, owner_key: &str, mode: Mode) -> Option<Arc<Hold>> {
        let map = self.map();
        let hold = map.get(&key(name, owner_key, mode))?;
        if !hold.is_held() {
            return None;
        }
        hold.count.fetch_add(1, Ordering::AcqRel);
        Some(hold.clone())
    }

    /// Whether the owner holds `name` in `mode` (and believes it live).
    pub(crate) fn holds(&self, name: &LockName, owner_key: &str, mode: Mode) -> bool {
        self.map()
            .get(&key(name, owner_key, mode))
            .is_some_and(|h| h.is_held())
    }

    /// Keeps `hold` on the list [`lose_all`](Self::lose_all) tells; false
    /// (and not kept) once the client has closed: the grant must not be
    /// handed out, since nothing would tell its guard that it went.
    pub(crate) fn track(&self, hold: &Arc<Hold>) -> bool {
        let mut every = unpoisoned(&self.every);
        let (list, closed) = &mut *every;
        if *closed {
            return false;
        }
        // Before the list would grow, drop the holds gone since: the list
        // stays within twice the live holds, at amortised constant cost.
        if list.len() == list.capacity() {
            list.retain(|w| w.strong_count() > 0);
        }
        list.push(Arc::downgrade(hold));
        true
    }

    /// Whether the client has closed.
    pub(crate) fn is_closed(&self) -> bool {
        unpoisoned(&self.every).1
    }

    /// Fires the lost signal of every hold still believed (the client
    /// closes: its connections, and the holds on them, go), and tracks no
    /// more.
    pub(crate) fn lose_all(&self, reason: LostReason) {
        let every = {
            let mut every = unpoisoned(&self.every);
            every.1 = true;
            std::mem::take(&mut every.0)
        };
        for hold in every.iter().filter_map(Weak::upgrade) {
            if hold.is_held() {
                hold.mark_lost(reason);
            }
        }
    }

    /// Records a new grant. If a live hold of the same key appeared
    /// meanwhile (two tasks of one owner acquired at once), nests into it
    /// and returns it as `Err`: the caller must give the new grant back.
    pub(crate) fn insert(&self, hold: Arc<Hold>) -> Result<Arc<Hold>, Arc<Hold>> {
        if !hold.reentrant {
            return Ok(hold);
        }
        let mut map = self.map();
        let k = key(&hold.r.name, &hold.owner_key, hold.mode);
        if let Some(existing) = map.get(&k).filter(|h| h.is_held()) {
            existing.count.fetch_add(1, Ordering::AcqRel);
            return Err(existing.clone());
        }
        map.insert(k, hold.clone());
        Ok(hold)
    }

    /// One guard of `hold` goes away; true when it was the last.
    pub(crate) fn leave(&self, hold: &Arc<Hold>) -> bool {
        if !hold.reentrant {
            return hold.count.fetch_sub(1, Ordering::AcqRel) == 1;
        }
        let mut map = self.map();
        let left = hold.count.fetch_sub(1, Ordering::AcqRel) - 1;
        if left > 0 {
            return false;
        }
        let k = key(&hold.r.name, &hold.owner_key, hold.mode);
        if map.get(&k).is_some_and(|h| Arc::ptr_eq(h, hold)) {
            map.remove(&k);
        }
        true
    }
}
