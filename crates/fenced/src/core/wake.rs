//! Wake-ups for blocked acquirers.
//!
//! Each backend turns its engine's notification (a release in the same
//! process, a datagram from another process, Redis pub/sub, a ZooKeeper
//! watch, PostgreSQL NOTIFY) into [`Wakeups::bump`] for the lock name.
//! Waiters read the name's version before they attempt and wait for it to
//! change, so a bump that lands between the attempt and the wait is never
//! missed. Each waiter has its own version, so a backend that knows who
//! is next in a wait queue (Redis publishes the head's ticket) wakes that
//! waiter alone with [`Wakeups::bump_ticket`].

use crate::backend::Ticket;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

#[derive(Default)]
pub(crate) struct Wakeups {
    names: Mutex<HashMap<Arc<str>, Vec<Arc<Slot>>>>,
}

/// One waiter: its own version, and the queue ticket it waits with
/// (0 while it has none; tickets are positive).
struct Slot {
    tx: watch::Sender<u64>,
    ticket: AtomicI64,
}

impl Slot {
    fn wake(&self) {
        self.tx.send_modify(|v| *v += 1);
    }
}

impl Wakeups {
    /// Tells the waiters of `name` to look again. Cheap when nobody waits.
    pub(crate) fn bump(&self, name: &str) {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        for slot in names.get(name).into_iter().flatten() {
            slot.wake();
        }
    }

    /// Tells the waiter of `name` holding queue `ticket` to look again
    /// (it is now at the head), and every waiter of `name` that has no
    /// ticket yet, since one may be on its way to it. The others stay
    /// asleep: a release that only the head can use wakes only the head.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn bump_ticket(&self, name: &str, ticket: Ticket) {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        for slot in names.get(name).into_iter().flatten() {
            let t = slot.ticket.load(Ordering::Acquire);
            if t == 0 || t == ticket {
                slot.wake();
            }
        }
    }

    /// Declares interest in `name` until the returned handle drops.
    pub(crate) fn interest(self: &Arc<Self>, name: &str) -> Interest {
        let slot = Arc::new(Slot {
            tx: watch::Sender::new(0),
            ticket: AtomicI64::new(0),
        });
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        names.entry(name.into()).or_default().push(slot.clone());
        Interest {
            rx: slot.tx.subscribe(),
            slot,
            name: name.into(),
            owner: self.clone(),
        }
    }

    /// Tells every waiter to look again (after a lost notification channel).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn bump_all(&self) {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        for slot in names.values().flatten() {
            slot.wake();
        }
    }

    /// Whether anyone waits on `name` now.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn has_interest(&self, name: &str) -> bool {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        names.contains_key(name)
    }

    /// How many names have waiters (for tests and status).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.names.lock().unwrap().len()
    }
}

/// A waiter's interest in one name.
pub(crate) struct Interest {
    rx: watch::Receiver<u64>,
    slot: Arc<Slot>,
    name: Arc<str>,
    owner: Arc<Wakeups>,
}

impl Interest {
    /// The version to compare against after an attempt.
    pub(crate) fn version(&self) -> u64 {
        *self.rx.borrow()
    }

    /// The queue ticket this waiter now waits with, if any: from then
    /// on a wake-up aimed at another ticket passes it by.
    pub(crate) fn set_ticket(&self, ticket: Option<Ticket>) {
        let t = ticket.filter(|t| *t > 0).unwrap_or(0);
        self.slot.ticket.store(t, Ordering::Release);
    }

    /// Resolves once the version differs from `seen`.
    pub(crate) async fn changed_since(&mut self, seen: u64) {
        // The sender lives in the slot this handle owns, so this cannot
        // err; were it to, treat it as a change.
        let _ = self.rx.wait_for(|v| *v != seen).await;
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut names = self.owner.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slots) = names.get_mut(&self.name) {
            slots.retain(|s| !Arc::ptr_eq(s, &self.slot));
            if slots.is_empty() {
                names.remove(&self.name);
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bump_between_attempt_and_wait_is_seen() {
        let w = Arc::new(Wakeups::default());
        let mut i = w.interest("a");
        let seen = i.version();
        w.bump("a");
        w.bump("b"); // nobody listens: no entry is made
        tokio::time::timeout(std::time::Duration::from_secs(5), i.changed_since(seen))
            .await
            .expect("woken");
        assert_eq!(w.len(), 1);
        drop(i);
        assert_eq!(w.len(), 0);
    }

    #[tokio::test]
    async fn a_ticketed_wake_up_passes_other_tickets_by() {
        let w = Arc::new(Wakeups::default());
        let (mut head, mut next, mut fresh) = (w.interest("a"), w.interest("a"), w.interest("a"));
        head.set_ticket(Some(7));
        next.set_ticket(Some(8));
        let seen = (head.version(), next.version(), fresh.version());
        w.bump_ticket("a", 7);
        let soon = std::time::Duration::from_secs(5);
        tokio::time::timeout(soon, head.changed_since(seen.0))
            .await
            .expect("the head is woken");
        tokio::time::timeout(soon, fresh.changed_since(seen.2))
            .await
            .expect("a waiter with no ticket yet is woken");
        assert_eq!(next.version(), seen.1, "the second in line sleeps on");
        w.bump("a");
        tokio::time::timeout(soon, next.changed_since(seen.1))
            .await
            .expect("a plain bump wakes everyone");
        drop((head, next));
        assert_eq!(w.len(), 1);
        drop(fresh);
        assert_eq!(w.len(), 0);
    }
}
