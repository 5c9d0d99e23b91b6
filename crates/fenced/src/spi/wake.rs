//! Wake-ups for blocked acquirers.
//!
//! Each backend turns its engine's notification (a release in the same
//! process, a datagram from another process, Redis pub/sub, a ZooKeeper
//! watch, PostgreSQL NOTIFY) into [`Wakeups::wake`] for the lock name.
//! Waiters read the name's version before they attempt and wait for it to
//! change, so a wake-up that lands between the attempt and the wait is never
//! missed. Each waiter has its own version, so a backend that knows who
//! is next in a wait queue (Redis publishes the head's ticket, a ZooKeeper
//! or etcd waiter watches its own predecessor) wakes that waiter alone with
//! [`Wakeups::wake_ticket`]. A waiter whose attempt is still on its way
//! when such a message comes does not know its ticket yet (its first, or
//! a new one if its place ended meanwhile): the slot remembers the tickets
//! it heard, and the waiter wakes when it learns its ticket only if that
//! ticket was among them.
//!
//! A release that only one waiter can use (a mutex's, a write lock's, a
//! permit's) wakes one of a client's waiters, not all: a thousand tasks of
//! one client waiting for one lock otherwise all asked the server at each
//! release, and hand-overs slowed with the crowd (MariaDB's lease table
//! did not serve a thousand in 300 s). The one woken is *called*: until
//! it begins its next attempt, later wake-ups need no one else, since
//! that attempt already comes after them; if it goes away first, the call
//! passes to the next. Only the waiter that [leads](Interest::leads) (the
//! lowest ticket, else the longest waiting) looks again on its own when
//! no notification comes. A waiter whose task has not been polled for
//! [`UNHEARD`] (its future parked in a `select!` that serves something
//! else, its thread blocked) neither leads nor keeps a call: the next
//! one does. Readers, and tasks of a named owner that may nest into its
//! hold, are woken at every wake-up.

use crate::spi::Ticket;
use crate::spi::sync::{Seen, Watch, unpoisoned};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How long a waiter may go unpolled and still lead or keep a call: three
/// of the acquire loop's fallback periods (a polled waiter shows itself at
/// least once a period).
pub(crate) const UNHEARD: Duration = Duration::from_secs(3 * 2);

/// The key under which a register's watchers wait in [`Wakeups`]: the
/// name behind a control character, which no lock name has, so that a
/// lock and a register of one name do not wake each other's waiters.
pub(crate) fn register_key(name: &str) -> String {
    format!("\u{1}{name}")
}

/// The engine watches a client keeps on registers, where the engine's
/// watch is a request of its own (an etcd watch, a ZooKeeper watch): one
/// per watched register, shared by every waiter of the client, ended
/// once it has fired or nobody watches that register any more.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
#[derive(Default)]
pub(crate) struct RegisterWatches {
    /// Per watch, its tasks: one, unless two callers armed it at once.
    tasks: Mutex<std::collections::HashMap<String, Vec<tokio::task::JoinHandle<()>>>>,
}

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
impl RegisterWatches {
    /// How often a watch that has not fired asks whether anyone still
    /// watches its register.
    const IDLE_CHECK: Duration = Duration::from_secs(10);

    /// Whether the watch `id` is in place and has not fired yet.
    pub(crate) fn armed(&self, id: &str) -> bool {
        unpoisoned(&self.tasks)
            .get(id)
            .is_some_and(|ts| ts.iter().any(|t| !t.is_finished()))
    }

    /// Keeps the engine's watch `fired`, known as `id` (set up already,
    /// resolving when what it watches changes or the watch breaks) until
    /// it resolves, then wakes `key`'s waiters; or drops it once nobody in
    /// this client waits on `key`.
    pub(crate) fn keep_as(
        &self,
        wakeups: &Arc<Wakeups>,
        id: String,
        key: String,
        fired: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let wakeups = wakeups.clone();
        let k = key;
        let task = tokio::spawn(async move {
            tokio::pin!(fired);
            loop {
                tokio::select! {
                    () = &mut fired => break,
                    () = tokio::time::sleep(Self::IDLE_CHECK) => {
                        if !wakeups.has_interest(&k) {
                            return;
                        }
                    }
                }
            }
            wakeups.wake(&k);
        });
        let mut tasks = unpoisoned(&self.tasks);
        tasks.retain(|_, ts| {
            ts.retain(|t| !t.is_finished());
            !ts.is_empty()
        });
        tasks.entry(id).or_default().push(task);
    }
}

#[cfg(any(feature = "etcd", feature = "zookeeper"))]
impl Drop for RegisterWatches {
    fn drop(&mut self) {
        for t in unpoisoned(&self.tasks).values().flatten() {
            t.abort();
        }
    }
}

#[derive(Default)]
pub(crate) struct Wakeups {
    /// Ordered, so that waking every name goes the same way every time
    /// (the simulation replays a seed only if it does). Each name's
    /// waiters in the order they began to wait.
    names: Mutex<BTreeMap<Arc<str>, Vec<Arc<Slot>>>>,
}

/// Who can use a release, and so which waiters it wakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Any number may get in at once (readers after a writer), or the
    /// waiter may nest into a hold its named owner won: woken every time.
    Every,
    /// One gets in (an exclusive hold), or a few (permits): woken one at
    /// a time. With `chain`, one that gets in passes the call on, since
    /// more permits may be free.
    One { chain: bool },
}

/// One waiter: its own version, and the queue ticket it waits with
/// (tickets are positive; 0 until its first attempt comes back, -1 if
/// that attempt gave it none).
struct Slot {
    tx: Watch<u64>,
    ticket: AtomicI64,
    wake: Wake,
    /// Woken as the one to look (see [`Wake::One`]) and not yet begun its
    /// next attempt. Changed under the names lock.
    called: AtomicBool,
    /// When its task last showed it was polled (an attempt begun, a
    /// fallback period over). Changed under the names lock.
    heard_from: Mutex<Instant>,
    /// Head tickets announced while `ticket` was 0 or an attempt was on
    /// its way. Both are changed under this lock, so a message is either
    /// heard here or matched against the ticket, never neither.
    heard: Mutex<Heard>,
}

/// What a waiter heard while it did not know its ticket (bounded: past
/// [`HEARD_MAX`] tickets it just wakes).
#[derive(Default)]
struct Heard {
    tickets: Vec<Ticket>,
    overflow: bool,
    /// An attempt is on its way ([`Interest::begin`] to
    /// [`Interest::set_ticket`]): it may come back with another ticket
    /// than the one the slot has, so the tickets announced meanwhile are
    /// kept.
    in_flight: bool,
}

const HEARD_MAX: usize = 16;

impl Slot {
    fn wake(&self) {
        self.tx.send_modify(|v| *v += 1);
    }

    fn heard(&self) -> std::sync::MutexGuard<'_, Heard> {
        unpoisoned(&self.heard)
    }

    fn is_one(&self) -> bool {
        matches!(self.wake, Wake::One { .. })
    }

    /// Its place among the one-at-a-time waiters: the lowest queue ticket
    /// first (the client's head of a fair queue), then the longest waiting.
    fn rank(&self, i: usize) -> (i64, usize) {
        let t = self.ticket.load(Ordering::Acquire);
        (if t > 0 { t } else { i64::MAX }, i)
    }

    fn call(&self) {
        self.called.store(true, Ordering::Release);
        self.wake();
    }

    /// Its task is being polled now.
    fn polled(&self, now: Instant) {
        *unpoisoned(&self.heard_from) = now;
    }

    /// Whether its task was polled lately (see [`UNHEARD`]).
    fn live(&self, now: Instant) -> bool {
        now.saturating_duration_since(*unpoisoned(&self.heard_from)) <= UNHEARD
    }
}

/// The one-at-a-time waiter among `slots` that leads: the one called when
/// a release comes, and the one that looks again when none does. Live
/// waiters first: one whose task is not polled would hold up the rest.
fn leader(slots: &[Arc<Slot>]) -> Option<&Arc<Slot>> {
    let now = Instant::now();
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_one())
        .min_by_key(|(i, s)| (!s.live(now), s.rank(*i)))
        .map(|(_, s)| s)
}

/// Makes sure one of the one-at-a-time waiters among `slots` attempts
/// after now: a live one already called and not yet begun does; else the
/// leader is called.
fn call_one(slots: &[Arc<Slot>]) {
    let now = Instant::now();
    if slots
        .iter()
        .any(|s| s.is_one() && s.called.load(Ordering::Acquire) && s.live(now))
    {
        return;
    }
    if let Some(s) = leader(slots) {
        s.call();
    }
}

/// One name's wake-up: each of [`Wake::Every`], and one of the others.
fn wake_slots(slots: &[Arc<Slot>]) {
    for slot in slots.iter().filter(|s| !s.is_one()) {
        slot.wake();
    }
    call_one(slots);
}

impl Wakeups {
    /// Tells the waiters of `name` to look again: every one that
    /// [`Wake::Every`] says, and one of the others. Cheap when nobody waits.
    pub(crate) fn wake(&self, name: &str) {
        let names = unpoisoned(&self.names);
        if let Some(slots) = names.get(name) {
            wake_slots(slots);
        }
    }

    /// [`wake`](Self::wake) for every name: a notification that names no
    /// lock (MySQL's doorbell), or notifications that may have been
    /// missed (a listener reconnected).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn wake_each(&self) {
        let names = unpoisoned(&self.names);
        names.values().for_each(|slots| wake_slots(slots));
    }

    /// Tells the waiter of `name` holding queue `ticket` to look again
    /// (it is now at the head), and those that wait without one as
    /// [`wake`](Self::wake) does. A waiter whose first attempt is on its
    /// way remembers `ticket`, and wakes if its attempt comes back with it
    /// ([`Interest::set_ticket`]). The others stay asleep: a release that
    /// only the head can use wakes only the head.
    #[cfg_attr(
        not(any(
            feature = "redis",
            feature = "zookeeper",
            feature = "etcd",
            feature = "postgres",
            feature = "mysql"
        )),
        allow(dead_code)
    )]
    pub(crate) fn wake_ticket(&self, name: &str, ticket: Ticket) {
        let names = unpoisoned(&self.names);
        let Some(slots) = names.get(name) else {
            return;
        };
        let mut unticketed = Vec::new();
        for slot in slots {
            let mut heard = slot.heard();
            let t = slot.ticket.load(Ordering::Acquire);
            if t == ticket {
                slot.call();
            } else if t < 0 {
                if slot.is_one() {
                    unticketed.push(slot.clone());
                } else {
                    slot.wake();
                }
            } else if t == 0 || heard.in_flight {
                if heard.tickets.len() < HEARD_MAX {
                    heard.tickets.push(ticket);
                } else {
                    heard.overflow = true;
                }
            }
        }
        call_one(&unticketed);
    }

    /// Declares interest in `name` until the returned handle drops.
    pub(crate) fn interest(self: &Arc<Self>, name: &str, wake: Wake) -> Interest {
        let slot = Arc::new(Slot {
            tx: Watch::new(0),
            ticket: AtomicI64::new(0),
            wake,
            called: AtomicBool::new(false),
            heard_from: Mutex::new(Instant::now()),
            heard: Mutex::default(),
        });
        let mut names = unpoisoned(&self.names);
        names.entry(name.into()).or_default().push(slot.clone());
        Interest {
            rx: slot.tx.subscribe(),
            slot,
            name: name.into(),
            owner: self.clone(),
            outcome: Outcome::Waiting,
        }
    }

    /// Tells every waiter to look again: the session their places lived
    /// on ended, so each has its own to find out about.
    #[cfg_attr(
        not(any(feature = "zookeeper", feature = "etcd", test)),
        allow(dead_code)
    )]
    pub(crate) fn wake_all(&self) {
        let names = unpoisoned(&self.names);
        for slot in names.values().flatten() {
            slot.wake();
        }
    }

    /// How many of this client's tasks wait on `name` now.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn waiting(&self, name: &str) -> usize {
        unpoisoned(&self.names).get(name).map_or(0, Vec::len)
    }

    /// Whether anyone waits on `name` now.
    #[cfg_attr(
        not(any(feature = "redis", feature = "etcd", feature = "zookeeper")),
        allow(dead_code)
    )]
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

/// How a waiter's wait ended, for what its going tells the others.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Still waiting, or gone without an answer (cancelled, timed out).
    Waiting,
    Granted,
    Failed,
    /// Answered for itself alone: a call passes on.
    Passed,
}

/// A waiter's interest in one name.
pub(crate) struct Interest {
    rx: Seen<u64>,
    slot: Arc<Slot>,
    name: Arc<str>,
    owner: Arc<Wakeups>,
    outcome: Outcome,
}

impl Interest {
    /// The version to compare against after the attempt about to begin:
    /// a call this waiter had is answered by that attempt.
    pub(crate) fn begin(&self) -> u64 {
        let _names = unpoisoned(&self.owner.names);
        self.slot.heard().in_flight = true;
        self.slot.called.store(false, Ordering::Release);
        self.slot.polled(Instant::now());
        self.rx.get()
    }

    /// Whether this waiter looks again on its own when no notification
    /// comes: each of [`Wake::Every`], and the leader of the others (the
    /// rest would only ask the server what the leader just asked).
    pub(crate) fn leads(&self) -> bool {
        if !self.slot.is_one() {
            return true;
        }
        let names = unpoisoned(&self.owner.names);
        self.slot.polled(Instant::now());
        names
            .get(&self.name)
            .and_then(|slots| leader(slots))
            .is_some_and(|l| Arc::ptr_eq(l, &self.slot))
    }

    /// The queue ticket this waiter now waits with, if any: from then
    /// on a wake-up aimed at another ticket passes it by. If a wake-up for
    /// this ticket (or, with no ticket, for any) came while the attempt
    /// was on its way, the waiter is woken now.
    pub(crate) fn set_ticket(&self, ticket: Option<Ticket>) {
        let t = ticket.filter(|t| *t > 0).unwrap_or(-1);
        let mut heard = self.slot.heard();
        // A call for a ticket it kept found it by that ticket already.
        let before = self.slot.ticket.swap(t, Ordering::AcqRel);
        let kept = t > 0 && before == t;
        let missed = !kept
            && (heard.overflow
                || if t < 0 {
                    !heard.tickets.is_empty()
                } else {
                    heard.tickets.contains(&t)
                });
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

    /// Ends the wait with the lock won: the others sleep on (it is held),
    /// unless [`Wake::One`]'s `chain` says more may get in.
    pub(crate) fn granted(mut self) {
        self.outcome = Outcome::Granted;
    }

    /// Ends the wait with an answer that said nothing of the lock (the
    /// request itself refused): the call, if it had one, goes on to the
    /// next.
    pub(crate) fn pass(mut self) {
        self.outcome = Outcome::Passed;
    }

    /// Ends the wait with an error (the server unreachable, most likely):
    /// every other waiter of the name looks for itself, as each would
    /// have had it been woken, rather than one after another.
    pub(crate) fn failed(mut self) {
        self.outcome = Outcome::Failed;
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut names = unpoisoned(&self.owner.names);
        let Some(slots) = names.get_mut(&self.name) else {
            return;
        };
        slots.retain(|s| !Arc::ptr_eq(s, &self.slot));
        let called = self.slot.called.load(Ordering::Acquire);
        match self.outcome {
            Outcome::Failed => slots.iter().for_each(|s| s.wake()),
            Outcome::Passed => call_one(slots),
            Outcome::Granted if self.slot.wake == (Wake::One { chain: true }) => call_one(slots),
            Outcome::Granted => {}
            // A call it had and never answered goes to the next.
            Outcome::Waiting if called => call_one(slots),
            Outcome::Waiting => {}
        }
        if slots.is_empty() {
            names.remove(&self.name);
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wake_between_attempt_and_wait_is_seen() {
        let w = Arc::new(Wakeups::default());
        let mut i = w.interest("a", Wake::Every);
        let seen = i.rx.get();
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
        let (mut head, mut next, fresh) = (
            w.interest("a", Wake::Every),
            w.interest("a", Wake::Every),
            w.interest("a", Wake::Every),
        );
        head.set_ticket(Some(7));
        next.set_ticket(Some(8));
        let seen = (head.rx.get(), next.rx.get(), fresh.rx.get());
        w.wake_ticket("a", 7);
        let soon = std::time::Duration::from_secs(5);
        tokio::time::timeout(soon, head.changed_since(seen.0))
            .await
            .expect("the head is woken");
        assert_eq!(next.rx.get(), seen.1, "the second in line sleeps on");
        assert_eq!(
            fresh.rx.get(),
            seen.2,
            "a waiter with no ticket yet waits to learn it"
        );
        fresh.set_ticket(Some(9));
        assert_eq!(fresh.rx.get(), seen.2, "ticket 9 was not called");
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
            w.interest("a", Wake::Every),
            w.interest("a", Wake::Every),
            w.interest("a", Wake::Every),
            w.interest("a", Wake::Every),
        );
        let seen = [&called, &other, &plain, &flooded].map(|i| i.rx.get());
        // Every attempt is on its way when the release names ticket 5.
        w.wake_ticket("a", 5);
        called.set_ticket(Some(5));
        other.set_ticket(Some(6));
        plain.set_ticket(None);
        assert_ne!(called.rx.get(), seen[0], "its own ticket was called");
        assert_eq!(other.rx.get(), seen[1], "another ticket was called");
        assert_ne!(plain.rx.get(), seen[2], "no ticket: any call may be ours");
        // Only what was heard before the ticket was known counts.
        w.wake_ticket("a", 100);
        for t in 0..HEARD_MAX as i64 + 1 {
            w.wake_ticket("a", 200 + t);
        }
        flooded.set_ticket(Some(1));
        assert_ne!(flooded.rx.get(), seen[3], "past the bound, it wakes");
        let before = other.rx.get();
        other.set_ticket(Some(100));
        assert_eq!(other.rx.get(), before, "100 was called after 6 was known");
        let before = plain.rx.get();
        w.wake_ticket("a", 300);
        assert_ne!(
            plain.rx.get(),
            before,
            "a waiter without a ticket wakes at every call"
        );
    }

    /// A waiter whose place ended while it slept comes back from its
    /// next attempt with a new ticket; a call for that ticket that came
    /// while the attempt was on its way still wakes it.
    #[test]
    fn a_waiter_whose_ticket_changes_in_flight_hears_its_new_call() {
        let w = Arc::new(Wakeups::default());
        let i = w.interest("a", Wake::Every);
        i.begin();
        i.set_ticket(Some(7));
        let seen = i.begin();
        w.wake_ticket("a", 9);
        assert!(!woken(&i, seen), "9 is not its ticket yet");
        i.set_ticket(Some(9));
        assert!(woken(&i, seen), "its new ticket was called on the way");
        // Past the bound of calls heard on the way, it wakes, unless it
        // kept its ticket (a call for that found it directly).
        let seen = i.begin();
        for t in 0..HEARD_MAX as i64 + 1 {
            w.wake_ticket("a", 100 + t);
        }
        i.set_ticket(Some(9));
        assert!(!woken(&i, seen), "its ticket was never called");
        // Once it is back, calls for other tickets pass it by again.
        let seen = i.rx.get();
        w.wake_ticket("a", 11);
        i.set_ticket(Some(11));
        assert!(!woken(&i, seen), "11 was called after 9 was known");
    }

    /// Whether `i` was woken since `seen`, without waiting.
    fn woken(i: &Interest, seen: u64) -> bool {
        i.rx.get() != seen
    }

    const MUTEX: Wake = Wake::One { chain: false };

    #[test]
    fn a_release_only_one_can_use_calls_one_waiter() {
        let w = Arc::new(Wakeups::default());
        let (a, b, reader) = (
            w.interest("a", MUTEX),
            w.interest("a", MUTEX),
            w.interest("a", Wake::Every),
        );
        let seen = [&a, &b, &reader].map(|i| i.begin());
        w.wake("a");
        assert!(woken(&a, seen[0]), "the longest waiting is called");
        assert!(!woken(&b, seen[1]), "the next sleeps on");
        assert!(woken(&reader, seen[2]), "a reader wakes every time");
        // Called and not yet begun: its attempt comes after this release
        // too, so no one else need look.
        w.wake("a");
        assert!(!woken(&b, seen[1]));
        // It looked (and found the lock taken again): the next release
        // calls it again, as the leader.
        let seen_a = a.begin();
        assert!(a.leads() && !b.leads() && reader.leads());
        w.wake("a");
        assert!(woken(&a, seen_a) && !woken(&b, seen[1]));
        // Gone before it looked (cancelled, timed out): the call passes on.
        drop(a);
        assert!(woken(&b, seen[1]), "the call went to the next");
        assert!(b.leads());
    }

    #[test]
    fn a_waiter_that_wins_keeps_the_others_asleep_unless_permits_may_remain() {
        let w = Arc::new(Wakeups::default());
        let (a, b) = (w.interest("a", MUTEX), w.interest("a", MUTEX));
        let seen_b = b.begin();
        w.wake("a");
        a.granted();
        assert!(!woken(&b, seen_b), "the lock is held: nothing to look for");

        let permits = Wake::One { chain: true };
        let (a, b) = (w.interest("p", permits), w.interest("p", permits));
        let seen_b = b.begin();
        a.begin();
        a.granted();
        assert!(woken(&b, seen_b), "another permit may be free");
        drop(b);

        // An error (the server unreachable): everyone looks for itself.
        let (a, b, c) = (
            w.interest("e", MUTEX),
            w.interest("e", MUTEX),
            w.interest("e", MUTEX),
        );
        let seen = [&b, &c].map(|i| i.begin());
        a.failed();
        assert!(woken(&b, seen[0]) && woken(&c, seen[1]));
        drop((b, c));
        assert_eq!(w.len(), 1, "the mutex waiter b above");
    }

    #[test]
    fn the_lowest_ticket_leads_and_a_ticket_call_counts_as_the_one() {
        let w = Arc::new(Wakeups::default());
        let (a, b, c) = (
            w.interest("a", MUTEX),
            w.interest("a", MUTEX),
            w.interest("a", MUTEX),
        );
        a.set_ticket(Some(9));
        b.set_ticket(Some(4));
        c.set_ticket(None);
        let seen = [&a, &b, &c].map(|i| i.begin());
        assert!(
            b.leads() && !a.leads() && !c.leads(),
            "the head of the queue leads"
        );
        w.wake("a");
        assert!(woken(&b, seen[1]) && !woken(&a, seen[0]) && !woken(&c, seen[2]));
        let seen_b = b.begin();
        // The head's own call (its predecessor went): it is the one, and
        // the waiter without a ticket is called beside it.
        w.wake_ticket("a", 9);
        assert!(woken(&a, seen[0]));
        assert!(woken(&c, seen[2]), "no ticket: one of those is called too");
        assert!(!woken(&b, seen_b));
        let seen_c = c.begin();
        w.wake("a");
        assert!(!woken(&c, seen_c), "a was called and has not looked yet");
    }

    #[test]
    fn a_call_by_ticket_passes_on_if_unanswered_and_each_name_gets_one() {
        let w = Arc::new(Wakeups::default());
        let (a, b) = (w.interest("a", MUTEX), w.interest("a", MUTEX));
        a.set_ticket(Some(3));
        b.set_ticket(Some(4));
        let seen_b = b.begin();
        w.wake_ticket("a", 3);
        drop(a);
        assert!(woken(&b, seen_b), "a's call went to b");
        let seen_b = b.begin();
        // A ticket no waiter here holds: nobody of this client is next.
        w.wake_ticket("a", 99);
        assert!(!woken(&b, seen_b));

        let (c, d, e) = (
            w.interest("c", MUTEX),
            w.interest("c", MUTEX),
            w.interest("e", MUTEX),
        );
        let seen = [&c, &d, &e].map(|i| i.begin());
        w.wake_each();
        assert!(woken(&c, seen[0]) && !woken(&d, seen[1]) && woken(&e, seen[2]));
        assert!(woken(&b, seen_b), "one per name");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_task_is_not_polled_neither_leads_nor_keeps_a_call() {
        let w = Arc::new(Wakeups::default());
        let (parked, b) = (w.interest("a", MUTEX), w.interest("a", MUTEX));
        assert!(parked.leads() && !b.leads());
        let seen_b = b.begin();
        w.wake("a");
        assert!(!woken(&b, seen_b), "the leader is called");
        // The leader's task is not polled again (its future parked);
        // the other's goes on through its fallback periods.
        for _ in 0..4 {
            tokio::time::advance(std::time::Duration::from_secs(2)).await;
            b.leads();
        }
        assert!(b.leads(), "the next leads once the first is unheard of");
        w.wake("a");
        assert!(woken(&b, seen_b), "and a call no longer waits on the first");
        drop(parked);
    }
}
