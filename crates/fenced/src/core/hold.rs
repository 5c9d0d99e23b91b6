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

use crate::backend::{HoldRef, Mode};
use crate::name::LockName;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::watch;
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
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "lease expired without a confirmed renewal",
            LostReason::Taken => "the backend no longer holds it for us",
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct HoldState {
    pub(crate) deadline: Instant,
    pub(crate) lost: Option<LostReason>,
}

/// One grant from the backend, shared by its nested guards.
pub(crate) struct Hold {
    pub(crate) r: HoldRef,
    pub(crate) owner_key: String,
    pub(crate) mode: Mode,
    pub(crate) token: u64,
    count: AtomicU32,
    released: AtomicBool,
    state: watch::Sender<HoldState>,
}

/// Until when a grant or renewal sent at `sent` for `lease` is believed:
/// the lease less the drift.
pub(crate) fn believed_until(sent: Instant, lease: Duration) -> Instant {
    let drift = (lease / 100 + Duration::from_millis(2)).min(lease / 2);
    sent + (lease - drift)
}

impl Hold {
    pub(crate) fn new(
        r: HoldRef,
        owner_key: String,
        mode: Mode,
        token: u64,
        sent: Instant,
    ) -> Arc<Hold> {
        let deadline = believed_until(sent, r.lease);
        Arc::new(Hold {
            r,
            owner_key,
            mode,
            token,
            count: AtomicU32::new(1),
            released: AtomicBool::new(false),
            state: watch::Sender::new(HoldState {
                deadline,
                lost: None,
            }),
        })
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
        self.released.store(true, Ordering::Release);
    }

    pub(crate) fn state(&self) -> HoldState {
        *self.state.borrow()
    }

    /// Believed held: not released, not lost, deadline not passed.
    pub(crate) fn is_held(&self) -> bool {
        let s = self.state();
        !self.is_released() && s.lost.is_none() && Instant::now() < s.deadline
    }

    /// The renewal sent at `sent` was confirmed.
    pub(crate) fn confirm(&self, sent: Instant) {
        let lease = self.r.lease;
        self.state.send_if_modified(|s| {
            // A confirmation that arrives after the deadline passed cannot
            // revive the hold: someone may have taken it in between.
            if s.lost.is_some() || Instant::now() >= s.deadline {
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
            if s.lost.is_some() {
                return false;
            }
            s.lost = Some(reason);
            true
        });
        if fired && !self.is_released() {
            tracing::warn!(lock = %self.r.name, token = self.token, %reason, "lock lost");
        }
    }

    /// Resolves when the hold is lost; never, once it is released.
    pub(crate) async fn lost(self: Arc<Self>) -> LostReason {
        let mut rx = self.state.subscribe();
        loop {
            let s = *rx.borrow_and_update();
            if let Some(reason) = s.lost {
                return reason;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(s.deadline) => {
                    if self.is_released() {
                        std::future::pending::<()>().await;
                    }
                    if self.state().deadline <= Instant::now() {
                        self.mark_lost(LostReason::Expired);
                    }
                }
                changed = rx.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }

    pub(crate) fn lease_left(&self) -> Duration {
        let s = self.state();
        if s.lost.is_some() {
            return Duration::ZERO;
        }
        s.deadline.saturating_duration_since(Instant::now())
    }

    /// The renewal period: a third of the lease (Redisson's 30 s / 10 s).
    pub(crate) fn renew_interval(&self) -> Duration {
        (self.r.lease / 3).max(Duration::from_micros(300))
    }
}

type Key = (LockName, String, i64);

/// The per-client table of reentrant holds, keyed by (name, owner, mode).
#[derive(Default)]
pub(crate) struct HoldTable {
    map: Mutex<HashMap<Key, Arc<Hold>>>,
}

fn key(name: &LockName, owner_key: &str, mode: Mode) -> Key {
    (name.clone(), owner_key.to_owned(), mode.code())
}

impl HoldTable {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Hold>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Records a new grant. If a live hold of the same key appeared
    /// meanwhile (two tasks of one owner acquired at once), nests into it
    /// and returns it as `Err`: the caller must give the new grant back.
    pub(crate) fn insert(&self, hold: Arc<Hold>) -> Result<Arc<Hold>, Arc<Hold>> {
        if !hold.mode.is_reentrant() {
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
        let mut map = self.map();
        let left = hold.count.fetch_sub(1, Ordering::AcqRel) - 1;
        if left > 0 {
            return false;
        }
        if hold.mode.is_reentrant() {
            let k = key(&hold.r.name, &hold.owner_key, hold.mode);
            if map.get(&k).is_some_and(|h| Arc::ptr_eq(h, hold)) {
                map.remove(&k);
            }
        }
        true
    }
}
