//! Lease arithmetic: until when a grant, a renewal or a session is
//! believed, how long a queue place lives, and how long leases may be.

use crate::spi::sync::{Seen, Watch, unpoisoned};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// The longest lease fenced accepts. A lock that must outlive a week
/// without renewal is a configuration mistake, not a lock.
pub const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);

/// `d` scaled by a random factor in [0.75, 1.25].
pub(crate) fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.75 + fastrand::f64() * 0.5)
}

/// How long a fair waiter's queue place outlives its last attempt. A waiter
/// with a place attempts at least every third of this (core), so a live
/// waiter never loses its place; a dead one (killed, paused) stops
/// blocking the queue after this.
pub(crate) const QUEUE_TTL: Duration = Duration::from_secs(10);

/// Until when a grant or renewal sent at `sent` for `lease` is believed:
/// the lease less the drift.
pub(crate) fn believed_until(sent: Instant, lease: Duration) -> Instant {
    let drift = (lease / 100 + Duration::from_millis(2)).min(lease / 2);
    sent + (lease - drift)
}

/// Until when a session is believed to live on the server (see the module
/// docs): the backend moves it forward with each confirmed keep-alive, and
/// back to the present when it knows the session is gone.
pub(crate) type Bound = Seen<Instant>;

/// The clock of a backend's session (an etcd lease, a ZooKeeper session),
/// for the [`Bound`]s of its holds: which session is live (`K`, its id),
/// and until when the server is known to keep it. Each hold takes the
/// bound of the session its key or node was made in; a session that ends
/// ends its holds' bounds at once, and the next one starts a clock of its
/// own.
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
pub(crate) struct SessionClock<K> {
    live: Mutex<Live<K>>,
}

struct Live<K> {
    id: K,
    bound: Watch<Instant>,
    /// Known gone: no later word moves the bound again.
    ended: bool,
}

#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
impl<K: Copy + PartialEq> SessionClock<K> {
    /// Session `id`, kept by the server until `until`.
    pub(crate) fn new(id: K, until: Instant) -> Self {
        SessionClock {
            live: Mutex::new(Live {
                id,
                bound: Watch::new(until),
                ended: false,
            }),
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Live<K>> {
        unpoisoned(&self.live)
    }

    /// The bound of session `id`: the live one's, or one already run out
    /// if `id` is not the live session any more.
    pub(crate) fn bound_of(&self, id: K) -> Bound {
        let live = self.live();
        if live.id == id && !live.ended {
            live.bound.subscribe()
        } else {
            Seen::fixed(Instant::now())
        }
    }

    /// A new session `id` is live, kept until `until`: a clock of its own,
    /// so the bounds of the old session's holds stay where they ended.
    pub(crate) fn start(&self, id: K, until: Instant) {
        *self.live() = Live {
            id,
            bound: Watch::new(until),
            ended: false,
        };
    }

    /// Session `id` is confirmed until `until`; a late word of a session
    /// that is no longer live, or known gone, changes nothing. The bound
    /// only moves forward, even past a moment it had already reached: the
    /// server kept the session at least that long, as a session that ends
    /// never comes back.
    pub(crate) fn confirm(&self, id: K, until: Instant) {
        let live = self.live();
        if live.id == id && !live.ended {
            live.bound.send_if_modified(|b| {
                let later = until > *b;
                if later {
                    *b = until;
                }
                later
            });
        }
    }

    /// Session `id` may be gone: its holds' bounds run out now, for good.
    pub(crate) fn end(&self, id: K) {
        let mut live = self.live();
        if live.id == id {
            live.ended = true;
            live.bound.send_replace(Instant::now());
        }
    }
}
