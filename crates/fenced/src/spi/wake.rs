//! Wake-ups for blocked acquirers.
//!
//! Each backend turns its engine's notification (a release in the same
//! process, a datagram from another process, Redis pub/sub, a ZooKeeper
//! watch, PostgreSQL NOTIFY) into [`Wakeups::wake`] for the lock name.
//! Waiters read the name's version before they attempt and wait for it to
//! change, so a wake-up that lands between the attempt and the wait is never
//! missed. Each waiter has its own version, so a backend that knows who
//! is next in a wait queue (Redis publishes the head's ticket) wakes that
//! waiter alone with [`Wakeups::wake_ticket`]. A waiter whose attempt is
//! still on its way when such a message comes does not know its ticket
//! yet: the slot remembers the tickets it heard, and the waiter wakes when
//! it learns its ticket only if that ticket was among them.

use crate::spi::Ticket;
use crate::spi::sync::{Seen, Watch, unpoisoned};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub(crate) struct Wakeups {
    /// Ordered, so that waking every name goes the same way every time
    /// (the simulation replays a seed only if it does).
    names: Mutex<BTreeMap<Arc<str>, Vec<Arc<Slot>>>>,
}

/// One waiter: its own version, and the queue ticket it waits with
/// (tickets are positive; 0 until its first attempt comes back, -1 if
/// that attempt gave it none).
struct Slot {
    tx: Watch<u64>,
    ticket: AtomicI64,
    /// Head tickets announced while `ticket` was 0. Both are changed under
    /// this lock, so a message is either heard here or matched against
    /// the ticket, never neither.
    heard: Mutex<Heard>,
}

/// What a waiter without a ticket heard (bounded: past [`HEARD_MAX`]
/// tickets it just wakes).
#[derive(Default)]
struct Heard {
    tickets: Vec<Ticket>,
    overflow: bool,
}

const HEARD_MAX: usize = 16;

impl Slot {
    fn wake(&self) {
        self.tx.send_modify(|v| *v += 1);
    }

    fn heard(&self) -> std::sync::MutexGuard<'_, Heard> {
        unpoisoned(&self.heard)
    }
}

impl Wakeups {
    /// Tells the waiters of `name` to look again. Cheap when nobody waits.
    pub(crate) fn wake(&self, name: &str) {
        let names = unpoisoned(&self.names);
        for slot in names.get(name).into_iter().flatten() {
            slot.wake();
        }
    }

    /// Tells the waiter of `name` holding queue `ticket` to look again
    /// (it is now at the head), and every waiter that waits without one.
    /// A waiter whose first attempt is on its way remembers `ticket`, and
    /// wakes if its attempt comes back with it ([`Interest::set_ticket`]).
    /// The others stay asleep: a release that only the head can use wakes
    /// only the head.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn wake_ticket(&self, name: &str, ticket: Ticket) {
        let names = unpoisoned(&self.names);
        for slot in names.get(name).into_iter().flatten() {
            let mut heard = slot.heard();
            let t = slot.ticket.load(Ordering::Acquire);
            if t == ticket || t < 0 {
                slot.wake();
            } else if t == 0 {
                if heard.tickets.len() < HEARD_MAX {
                    heard.tickets.push(ticket);
                } else {
                    heard.overflow = true;
                }
            }
        }
    }

    /// Declares interest in `name` until the returned handle drops.
    pub(crate) fn interest(self: &Arc<Self>, name: &str) -> Interest {
        let slot = Arc::new(Slot {
            tx: Watch::new(0),
            ticket: AtomicI64::new(0),
            heard: Mutex::default(),
        });
        let mut names = unpoisoned(&self.names);
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
    pub(crate) fn wake_all(&self) {
        let names = unpoisoned(&self.names);
        for slot in names.values().flatten() {
            slot.wake();
        }
    }

    /// Whether anyone waits on `name` now.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn has_interest(&self, name: &str) -> bool {
        let names = unpoisoned(&self.names);
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
    rx: Seen<u64>,
    slot: Arc<Slot>,
    name: Arc<str>,
    owner: Arc<Wakeups>,
}

impl Interest {
    /// The version to compare against after an attempt.
    pub(crate) fn version(&self) -> u64 {
        self.rx.get()
    }

    /// The queue ticket this waiter now waits with, if any: from then
    /// on a wake-up aimed at another ticket passes it by. If a wake-up for
    /// this ticket (or, with no ticket, for any) came while the attempt
    /// was on its way, the waiter is woken now.
    pub(crate) fn set_ticket(&self, ticket: Option<Ticket>) {
        let t = ticket.filter(|t| *t > 0).unwrap_or(-1);
        let mut heard = self.slot.heard();
        self.slot.ticket.store(t, Ordering::Release);
        let missed = heard.overflow
            || if t < 0 {
                !heard.tickets.is_empty()
            } else {
                heard.tickets.contains(&t)
            };
        *heard = Heard::default();
        if missed {
            self.slot.wake();
        }
    }

    /// Resolves once the version differs from `seen`.
    pub(crate) async fn changed_since(&mut self, seen: u64) {
        // The sender lives in the slot this handle owns, so this cannot
        // err; were it to, treat it as a change.
        while self.rx.get_and_update() == seen {
            if self.rx.changed().await.is_err() {
                return;
            }
        }
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut names = unpoisoned(&self.owner.names);
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
    async fn wake_between_attempt_and_wait_is_seen() {
        let w = Arc::new(Wakeups::default());
        let mut i = w.interest("a");
        let seen = i.version();
        w.wake("a");
        w.wake("b"); // nobody listens: no entry is made
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
        let (mut head, mut next, fresh) = (w.interest("a"), w.interest("a"), w.interest("a"));
        head.set_ticket(Some(7));
        next.set_ticket(Some(8));
        let seen = (head.version(), next.version(), fresh.version());
        w.wake_ticket("a", 7);
        let soon = std::time::Duration::from_secs(5);
        tokio::time::timeout(soon, head.changed_since(seen.0))
            .await
            .expect("the head is woken");
        assert_eq!(next.version(), seen.1, "the second in line sleeps on");
        assert_eq!(
            fresh.version(),
            seen.2,
            "a waiter with no ticket yet waits to learn it"
        );
        fresh.set_ticket(Some(9));
        assert_eq!(fresh.version(), seen.2, "ticket 9 was not called");
        w.wake("a");
        tokio::time::timeout(soon, next.changed_since(seen.1))
            .await
            .expect("a plain wake-up wakes everyone");
        drop((head, next));
        assert_eq!(w.len(), 1);
        drop(fresh);
        assert_eq!(w.len(), 0);
    }

    #[tokio::test]
    async fn a_waiter_learning_its_ticket_late_still_hears_its_call() {
        let w = Arc::new(Wakeups::default());
        let (called, other, plain, flooded) = (
            w.interest("a"),
            w.interest("a"),
            w.interest("a"),
            w.interest("a"),
        );
        let seen = [&called, &other, &plain, &flooded].map(|i| i.version());
        // Every attempt is on its way when the release names ticket 5.
        w.wake_ticket("a", 5);
        called.set_ticket(Some(5));
        other.set_ticket(Some(6));
        plain.set_ticket(None);
        assert_ne!(called.version(), seen[0], "its own ticket was called");
        assert_eq!(other.version(), seen[1], "another ticket was called");
        assert_ne!(plain.version(), seen[2], "no ticket: any call may be ours");
        // Only what was heard before the ticket was known counts.
        w.wake_ticket("a", 100);
        for t in 0..HEARD_MAX as i64 + 1 {
            w.wake_ticket("a", 200 + t);
        }
        flooded.set_ticket(Some(1));
        assert_ne!(flooded.version(), seen[3], "past the bound, it wakes");
        let before = other.version();
        other.set_ticket(Some(100));
        assert_eq!(other.version(), before, "100 was called after 6 was known");
        let before = plain.version();
        w.wake_ticket("a", 300);
        assert_ne!(
            plain.version(),
            before,
            "a waiter without a ticket wakes at every call"
        );
    }
}
