//! A leased work queue (Redisson's `RReliableQueue`, Curator's
//! `DistributedQueue` consumed with a lock): items kept in registers,
//! each taken under the taker's lease and given back when it ends.
//!
//! The layout, all in the lock backend beside the locks:
//!
//! | name | what |
//! |---|---|
//! | register `<name>:tail` | a counter: the last item id handed out (ids start at 1) |
//! | register `<name>:item:<id>` | the item: `p<deliveries>:<payload>` while waiting, `t<deliveries>:<slot>:<taker token>:<nonce>:<payload>` while taken, `x` once acknowledged; `w<ms>` for a hole watched since then, `h` for a hole given up (below) |
//! | register `<name>:wake` | written after each push and give-back: waiting takers watch it |
//! | register `<name>:head` | every id below it is done |
//! | register `<name>:swept` | every acknowledged item's register below it is deleted |
//! | lock `<name>:taker:<slot>` | held (with the watchdog) by each handle that takes, slots 0 to [`MAX_TAKERS`] − 1 |
//!
//! An item is taken by a versioned compare-and-set of its register, so of
//! two takers exactly one gets it; the register's version after that
//! write is the delivery's fencing token, which rises with every
//! delivery. A taken item names its taker's slot and that slot lock's
//! token: while the lock is held with that token the item is someone's,
//! and once the lock is gone (its holder died, or was cut off past its
//! lease) the next taker takes the item again. Within one process, an
//! item marked with its own taker is its own only while an [`Item`] (or a
//! take) for it lives there: one whose take was cancelled after the write
//! landed is given back, or taken again by that taker's next take. Items
//! are found by reading from `head`, so a take reads the items in flight
//! before the first waiting one.
//!
//! A push takes an id from the tail counter and then creates the item's
//! register. Between the two the id is a *hole*, and a pusher that died
//! there would leave it open for ever. So the first taker to see a hole
//! marks it `w<its wall clock in ms>` (create-only), and a taker that
//! finds a mark older than two request timeouts by its own clock writes
//! `h` over it (by version). The pusher writes its item over a mark the
//! same way, so exactly one of them wins: a pusher that was only slow
//! then finds its id given up, and pushes again under a new one. Clocks
//! that disagree change only how soon a hole is given up, never what
//! becomes of an item. A given-up hole's register is never deleted, so
//! that no late push lands in it below the head: a push that died
//! between its two steps leaves those few bytes behind.

use crate::client::Client;
use crate::core::acquire::Retries;
use crate::core::hold::LostReason;
use crate::error::{Error, ErrorKind, Result};
use crate::name::LockName;
use crate::spi::WriteRule;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The largest payload an item may have, in bytes (the engines' value
/// limits are larger: 1 MB on ZooKeeper, 1.5 MiB on etcd).
pub const MAX_ITEM_LEN: usize = 256 * 1024;

/// How many handles may take from one queue at once: the taker slots.
pub const MAX_TAKERS: u32 = 1024;

/// Lost races after which a push gives up.
const MAX_PUSH_RACES: u32 = 100;

/// The most registers one sweep deletes; the next move of the head
/// sweeps on.
const MAX_SWEEP: u64 = 1000;

/// The longest suffix a queue adds to its name: `:item:` and 20 digits.
const LONGEST_SUFFIX: usize = ":item:".len() + 20;

/// How many times the background give-back of an item (a dropped
/// [`Item`], a take whose answer was lost) tries, a request timeout apart,
/// while its taker holds its lease; after that, the next take of its
/// handle takes the item again, or its lease ends.
const GIVE_BACK_TRIES: u32 = 3;

/// What an acknowledged item's register holds.
const DONE: &[u8] = b"x";

/// What a hole's register holds once given up.
const GIVEN_UP: &[u8] = b"h";

/// How long a waiting take sleeps at most before it reads again: a taker
/// that died writes nothing, so only a look finds its items.
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// The wall clock in ms since 1970, for hole marks (only how soon a hole
/// is given up depends on it).
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// An item's register, read.
#[derive(Debug, PartialEq, Eq)]
enum State {
    /// Not there: a hole nobody marked yet, or deleted below the head.
    Missing,
    /// A hole marked at this wall-clock time (ms since 1970).
    Watched(u64),
    /// Acknowledged.
    Done,
    /// A hole given up: done too, but never deleted.
    GivenUp,
    Waiting {
        deliveries: u32,
        payload: Vec<u8>,
    },
    Taken {
        deliveries: u32,
        slot: u32,
        taker: u64,
        payload: Vec<u8>,
    },
}

impl State {
    fn waiting(deliveries: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = format!("p{deliveries}:").into_bytes();
        v.extend_from_slice(payload);
        v
    }

    /// A taken item; `nonce` tells this take's write from any other's.
    fn taken(deliveries: u32, slot: u32, taker: u64, nonce: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = format!("t{deliveries}:{slot}:{taker}:{nonce}:").into_bytes();
        v.extend_from_slice(payload);
        v
    }

    /// Reads `raw`, the register of item `name`.
    fn parse(name: &LockName, raw: Option<&[u8]>) -> Result<State> {
        let Some(raw) = raw else {
            return Ok(State::Missing);
        };
        let bad = || {
            Error::new(
                ErrorKind::Protocol,
                format!(
                    "{:?} does not hold a queue item (written as another kind of value?)",
                    name.as_str()
                ),
            )
        };
        let (&kind, mut rest) = raw.split_first().ok_or_else(bad)?;
        let field = |rest: &mut &[u8]| -> Result<u64> {
            let end = rest.iter().position(|&b| b == b':').ok_or_else(bad)?;
            let n = std::str::from_utf8(&rest[..end])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(bad)?;
            *rest = &rest[end + 1..];
            Ok(n)
        };
        match kind {
            b'x' if rest.is_empty() => Ok(State::Done),
            b'h' if rest.is_empty() => Ok(State::GivenUp),
            b'w' => std::str::from_utf8(rest)
                .ok()
                .and_then(|t| t.parse().ok())
                .map(State::Watched)
                .ok_or_else(bad),
            b'p' => {
                let deliveries = u32::try_from(field(&mut rest)?).map_err(|_| bad())?;
                Ok(State::Waiting {
                    deliveries,
                    payload: rest.to_vec(),
                })
            }
            b't' => {
                let deliveries = u32::try_from(field(&mut rest)?).map_err(|_| bad())?;
                let slot = u32::try_from(field(&mut rest)?).map_err(|_| bad())?;
                let taker = field(&mut rest)?;
                field(&mut rest)?; // the nonce
                Ok(State::Taken {
                    deliveries,
                    slot,
                    taker,
                    payload: rest.to_vec(),
                })
            }
            _ => Err(bad()),
        }
    }
}

/// A handle's hold on a taker slot.
#[derive(Debug)]
struct Taker {
    guard: crate::Guard,
    slot: u32,
    /// The items this taker holds in this process ([`Item`]s alive, and
    /// takes under way), by id: how many.
    holding: std::sync::Mutex<HashMap<u64, u32>>,
}

impl Taker {
    fn token(&self) -> u64 {
        self.guard.fencing_token()
    }

    fn holding(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u32>> {
        self.holding.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hold(&self, id: u64) {
        *self.holding().entry(id).or_default() += 1;
    }

    fn let_go(&self, id: u64) {
        let mut holding = self.holding();
        if let Some(n) = holding.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                holding.remove(&id);
            }
        }
    }

    fn holds(&self, id: u64) -> bool {
        self.holding().contains_key(&id)
    }
}

/// A take's write under way: the item counts as held by its taker until
/// the write's answer is known. If the write is dropped or fails, it may
/// still have landed: then the item is given back in the background
/// (exactly: only over this very write, by version and bytes).
struct Taking {
    queue: Queue,
    taker: Arc<Taker>,
    id: u64,
    name: LockName,
    /// The version the item is taken over; the write makes it one more.
    version: u64,
    taken: Vec<u8>,
    waiting: Vec<u8>,
    /// Whether the write's answer is known (and the caller has it).
    answered: bool,
}

impl Drop for Taking {
    fn drop(&mut self) {
        self.taker.let_go(self.id);
        if self.answered {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let queue = self.queue.detached();
        let name = self.name.clone();
        let (taken, waiting) = (
            std::mem::take(&mut self.taken),
            std::mem::take(&mut self.waiting),
        );
        let (before, landed) = (self.version, self.version + 1);
        let id = self.id;
        let taker = self.taker.clone();
        rt.spawn(async move {
            // A write still in flight may land up to a request timeout
            // later: look until it has, or cannot any more.
            for _ in 0..GIVE_BACK_TRIES {
                // Taken again by this taker meanwhile: it is that take's now.
                if taker.holds(id) || !taker.guard.is_held() {
                    return;
                }
                match queue.read_raw(&name).await {
                    Ok(Some((value, version))) if version == landed && value == taken => {
                        if !taker.holds(id)
                            && matches!(queue.write(&name, version, &waiting).await, Ok(true))
                        {
                            queue.wake_quietly().await;
                        }
                        return;
                    }
                    Ok(Some((_, version))) if version != before => return,
                    Ok(None) if before != 0 => return,
                    _ => {}
                }
                tokio::time::sleep(queue.client.request_timeout()).await;
            }
        });
    }
}

/// What a client remembers of a queue between takes, shared by its
/// handles: the ids it saw done (done stays done until swept below the
/// head), to read them again only where the head may move over them.
#[derive(Debug, Default)]
struct Memory {
    done: std::sync::Mutex<BTreeSet<u64>>,
}

/// A work queue: FIFO, at least once, every item leased to its taker
/// (Redisson's `RReliableQueue`, SQS's visibility timeout kept by a lock
/// lease instead of a clock).
///
/// [`push`](Self::push) adds an item; [`take`](Self::take) waits for the
/// oldest one nobody holds and leases it to this handle's *taker*, a lock
/// held with the watchdog while the handle (or an item it took) lives.
/// [`Item::ack`] finishes an item; [`Item::release`] gives it back at
/// once, and so does dropping it (in the background: if that fails, the
/// next take of this handle takes it again). A taker that dies, or is cut
/// off past its lease, gives back every item it held when its lease ends,
/// and the next take gets them (with [`Item::deliveries`] counting on).
/// Takers are woken by the engine when an item is pushed or given back,
/// and look on their own every two seconds for items whose taker's lease
/// ended.
///
/// Every delivery of an item carries a fencing token
/// ([`Item::fencing_token`]) greater than the item's earlier deliveries'.
/// Tokens count each item's own writes, so fence on the pair (item id,
/// token): a resource that keeps the highest token per item refuses a
/// taker paused past its lease once the next taker of that item wrote.
///
/// One handle's tasks share its taker; clones share it too. Keep a handle
/// rather than making one per take: each takes a slot lock of its own,
/// held until the handle and its items are dropped. Queues suit light
/// load (the seeds' advice for queues on ZooKeeper holds on every engine
/// here): a take reads every item from the oldest unfinished one (less
/// those this client saw finished) to the first waiting one.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://queue-doc").await?;
/// let jobs = client.queue("jobs")?;
/// jobs.push(b"resize 1.png").await?;
/// jobs.push(b"resize 2.png").await?;
/// let item = jobs.take().await?;
/// assert_eq!(item.payload(), b"resize 1.png");
/// item.ack().await?;
/// let item = jobs.take().await?;
/// item.release().await?;                    // back to the queue
/// let again = jobs.take().await?;
/// assert_eq!((again.payload(), again.deliveries()), (&b"resize 2.png"[..], 2));
/// again.ack().await?;
/// assert_eq!(jobs.len().await?, 0);
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Queue {
    client: Client,
    name: String,
    head: crate::VersionedValue,
    swept: crate::VersionedValue,
    tail: crate::Counter,
    wake: LockName,
    /// Whether this handle does work in the background: its reads are
    /// tried once (see [`detached`](Self::detached)).
    background: bool,
    lease: Option<Duration>,
    taker: Arc<tokio::sync::Mutex<Option<Arc<Taker>>>>,
    memory: Arc<Memory>,
}

impl Queue {
    pub(crate) fn new(client: &Client, name: &str) -> Result<Queue> {
        LockName::new(name)?;
        if name.len() + LONGEST_SUFFIX > crate::MAX_NAME_LEN {
            return Err(Error::invalid(format!(
                "queue name is {} bytes long; queues take at most {} (their items' names \
                 add up to {LONGEST_SUFFIX})",
                name.len(),
                crate::MAX_NAME_LEN - LONGEST_SUFFIX
            )));
        }
        Ok(Queue {
            client: client.clone(),
            name: name.to_owned(),
            head: client.versioned(&format!("{name}:head"))?,
            swept: client.versioned(&format!("{name}:swept"))?,
            tail: client.counter(&format!("{name}:tail"))?.in_register(),
            wake: LockName::new(&format!("{name}:wake"))?,
            background: false,
            lease: None,
            taker: Arc::default(),
            memory: client.inner.memo(&format!("queue:{name}")),
        })
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease of this handle's taker (the client's default lease
    /// otherwise): how long after this process dies, or is cut off, its
    /// items go back to the queue. Renewed by the watchdog while it lives.
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self.taker = Arc::default();
        self
    }

    /// Lets go of this handle's taker slot now, rather than when the
    /// handle's last clone is dropped: items it holds that are not
    /// finished or given back by then go to other takers once their
    /// [`Item`]s are dropped too. The next take takes a slot again.
    pub async fn release_taker(&self) -> Result<()> {
        let taker = self.taker.lock().await.take();
        if let Some(taker) = taker.and_then(|t| Arc::try_unwrap(t).ok()) {
            taker.guard.release().await?;
        }
        Ok(())
    }

    /// A handle for work in the background: the same queue, without this
    /// handle's taker (which that work must not keep held), reading once
    /// per read (it has its own tries, and must stop once the client has
    /// closed).
    fn detached(&self) -> Queue {
        Queue {
            taker: Arc::default(),
            background: true,
            ..self.clone()
        }
    }

    fn item_name(&self, id: u64) -> Result<LockName> {
        LockName::new(&format!("{}:item:{id}", self.name))
    }

    fn slot_lock(&self, slot: u32) -> Result<crate::Mutex> {
        let m = self.client.mutex(&format!("{}:taker:{slot}", self.name))?;
        Ok(match self.lease {
            Some(d) => m.lease(d),
            None => m,
        })
    }

    /// Adds an item at the tail; its id (ids rise in the order pushes
    /// were given them, from 1).
    ///
    /// A backend that does not answer is tried again, every step under
    /// one budget of an acquisition's default
    /// [`RetryPolicy`](crate::RetryPolicy) (a minute or more), without
    /// pushing the item twice: a lost reply of the id's counter leaves a
    /// hole that takers pass over, and a write of the item whose reply
    /// was lost is looked for at its id before anything else is written
    /// there.
    ///
    /// # Errors
    /// [`InvalidInput`](ErrorKind::InvalidInput), with nothing pushed, for
    /// a payload longer than [`MAX_ITEM_LEN`]. Another error (the backend
    /// still unanswering once the retries are spent) may come after the
    /// item was pushed: pushing it again then delivers it twice, as
    /// at-least-once allows.
    ///
    /// # Cancel safety
    /// A push dropped before it finished either pushed the item or left a
    /// hole that takers give up after two request timeouts.
    pub async fn push(&self, payload: impl AsRef<[u8]>) -> Result<u64> {
        let payload = payload.as_ref();
        if payload.len() > MAX_ITEM_LEN {
            return Err(Error::invalid(format!(
                "queue {:?}: an item of {} bytes; items take at most {MAX_ITEM_LEN}",
                self.name,
                payload.len()
            )));
        }
        let value = State::waiting(0, payload);
        // One budget for every step, as an acquisition's default policy.
        let policy = crate::RetryPolicy::default();
        let mut budget = Retries::new(&policy, None);
        for _ in 0..MAX_PUSH_RACES {
            // Tried again on a lost reply: an id taken twice leaves a hole.
            let id = budget.run(|| self.tail.add(1)).await?;
            let id = u64::try_from(id).map_err(|_| {
                Error::new(
                    ErrorKind::Protocol,
                    format!(
                        "queue {:?}: its tail counter holds {id}, not an id",
                        self.name
                    ),
                )
            })?;
            if self.push_at(id, &value, &mut budget).await? {
                self.wake_quietly().await;
                return Ok(id);
            }
        }
        Err(Error::new(
            ErrorKind::TimedOut,
            format!(
                "queue {:?}: takers gave up {MAX_PUSH_RACES} ids of this push in a row as \
                 holes (is every request slower than the request timeout?)",
                self.name
            ),
        ))
    }

    /// Writes the item `value` at `id`, the push's own: `true` once it is
    /// there (or was, and has been taken since), `false` when the id was
    /// given up as a hole, by a taker or by this push.
    ///
    /// The item is created, or written over a taker's mark of the hole by
    /// version: of this and a taker giving the hole up, exactly one wins.
    /// A write whose reply was lost may have landed, or may land later (a
    /// request the server has yet to read), even after its register was
    /// swept. So once a write is in doubt the item is never written at
    /// that id again: the head is read, then what is at the id. Below
    /// that head every id is done, and `h` is never deleted, so a mark
    /// or nothing there means the item landed and was taken (a mark after
    /// the sweep is a slow taker's). Above it, the push gives the id up
    /// itself (create-only where nothing is, by version over a mark), and
    /// the write in doubt then loses for good. (Only a stall of this push
    /// of several round trips, between reading the head and giving the id
    /// up, in which the write in doubt lands and is taken, acknowledged
    /// and swept, delivers the item twice, as at-least-once allows.)
    async fn push_at(&self, id: u64, value: &[u8], budget: &mut Retries<'_>) -> Result<bool> {
        let name = self.item_name(id)?;
        let (mut version, mut races, mut doubtful) = (0, 0, false);
        loop {
            match self.write(&name, version, value).await {
                Ok(true) => return Ok(true),
                Ok(false) => races += 1,
                Err(e) => {
                    budget.pause(e).await?;
                    doubtful = true;
                }
            }
            loop {
                // The head before the item: it only rises.
                let passed = doubtful && id < budget.run(|| self.read_head()).await?.0;
                let (state, v) = budget.run(|| self.read_item(&name)).await?;
                match state {
                    State::Waiting { .. } | State::Taken { .. } | State::Done => return Ok(true),
                    State::GivenUp => return Ok(false),
                    State::Watched(_) | State::Missing if passed => return Ok(true),
                    // Every write answered, and the last found something
                    // there: this item, taken and swept since.
                    State::Missing if !doubtful => return Ok(true),
                    // Every write answered: over the mark, by version.
                    State::Watched(_) if !doubtful && races < 3 => {
                        version = v;
                        break;
                    }
                    // Every write answered: the taker gives its hole up.
                    State::Watched(_) if !doubtful => return Ok(false),
                    State::Watched(_) | State::Missing => {
                        let at = if matches!(state, State::Missing) {
                            0
                        } else {
                            v
                        };
                        match self.write(&name, at, GIVEN_UP).await {
                            Ok(true) => return Ok(false),
                            // Something came first: look again.
                            Ok(false) => {}
                            Err(e) => budget.pause(e).await?,
                        }
                    }
                }
            }
        }
    }

    /// Waits for the oldest item nobody holds and takes it. A backend
    /// that does not answer is tried again until it does.
    pub async fn take(&self) -> Result<Item> {
        self.take_until(None)
            .await?
            .ok_or_else(|| Error::protocol("a take without a deadline ended without an item"))
    }

    /// Takes the oldest item nobody holds, if there is one now.
    pub async fn try_take(&self) -> Result<Option<Item>> {
        self.take_until(Some(Instant::now())).await
    }

    /// Waits up to `timeout` for an item; `None` if none came. The last
    /// look may run past `timeout` by its own reads.
    pub async fn take_timeout(&self, timeout: Duration) -> Result<Option<Item>> {
        self.take_until(Instant::now().checked_add(timeout)).await
    }

    /// How many items are waiting or taken: one read per item.
    pub async fn len(&self) -> Result<u64> {
        let (head, _) = self.read_head().await?;
        let tail = self.read_tail().await?;
        let mut n = 0;
        for id in head..=tail {
            let name = self.item_name(id)?;
            let (state, _) = self.read_item(&name).await?;
            if matches!(state, State::Waiting { .. } | State::Taken { .. }) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Whether no item is waiting or taken.
    pub async fn is_empty(&self) -> Result<bool> {
        Ok(self.len().await? == 0)
    }

    async fn take_until(&self, until: Option<Instant>) -> Result<Option<Item>> {
        let mut pause = Duration::from_millis(50);
        loop {
            match self.take_once(until).await {
                Ok(Some(Some(item))) => return Ok(Some(item)),
                Ok(Some(None)) => pause = Duration::from_millis(50),
                Ok(None) => return Ok(None),
                // A backend that does not answer: again, as acquisitions
                // do, while the caller's wait lasts (from when the look
                // failed: a look can take a request timeout to fail).
                Err(e) if e.is_transient() && until.is_none_or(|u| Instant::now() + pause < u) => {
                    tracing::debug!(queue = %self.name, error = %e, "a take failed; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LOOK_EVERY);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One look, and one wait if it found nothing: `Some(Some(item))`,
    /// `Some(None)` to look again, `None` once `until` has passed.
    async fn take_once(&self, until: Option<Instant>) -> Result<Option<Option<Item>>> {
        let taker = self.taker().await?;
        // The wake register is read before the look, and answered before
        // the tail is read: a push raises the tail, writes its item, then
        // the wake register, so one that the tail read missed changes the
        // wake register after it was read, and wakes this taker. Sent
        // together, the reads could be served in any order on a pooled
        // or multiplexed connection, and a push between them waited for
        // the next look.
        let seen = self.read_raw(&self.wake).await?;
        let (head, tail) = tokio::try_join!(self.read_head(), self.read_tail())?;
        let seen = seen.map(|(v, _)| v);
        let hole = match self.scan(&taker, head, tail).await? {
            Scan::Took(item) if item.is_held() => return Ok(Some(Some(*item))),
            // Its taker's lease ended during the look: give it back, and
            // look again with a taker that holds.
            Scan::Took(item) => {
                let _ = (*item).release().await;
                return Ok(Some(None));
            }
            Scan::Nothing { hole } => hole,
        };
        let now = Instant::now();
        if until.is_some_and(|u| u <= now) {
            return Ok(None);
        }
        let look = Some(until.map_or(now + LOOK_EVERY, |u| u.min(now + LOOK_EVERY)));
        let inner = &self.client.inner;
        let woken = inner.wait_register(&self.wake, look, |raw| {
            Ok((raw.map(|(v, _)| v) != seen).then_some(()))
        });
        match hole {
            None => drop(woken.await?),
            // Its pusher writes the hole, and wakes nobody until then.
            Some((id, version)) => {
                let name = self.item_name(id)?;
                let written = inner.wait_register(&name, look, |raw| {
                    Ok((raw.map_or(0, |(_, v)| v) != version).then_some(()))
                });
                tokio::select! {
                    r = woken => drop(r?),
                    r = written => drop(r?),
                }
            }
        }
        Ok(Some(None))
    }

    /// This handle's taker, taking a free slot if it has none (or lost it).
    async fn taker(&self) -> Result<Arc<Taker>> {
        let mut current = self.taker.lock().await;
        if let Some(t) = current.as_ref().filter(|t| t.guard.is_held()) {
            return Ok(t.clone());
        }
        *current = None;
        for slot in 0..MAX_TAKERS {
            if let Some(guard) = self.slot_lock(slot)?.try_acquire().await? {
                let t = Arc::new(Taker {
                    guard,
                    slot,
                    holding: Default::default(),
                });
                *current = Some(t.clone());
                return Ok(t);
            }
        }
        Err(Error::new(
            ErrorKind::TimedOut,
            format!(
                "queue {:?}: all {MAX_TAKERS} taker slots are held; share a handle between \
                 tasks",
                self.name
            ),
        ))
    }

    fn done(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        self.memory.done.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One pass from the head: takes the first item nobody holds, marks
    /// and gives up holes, and moves the head over the done items before
    /// them (in the background).
    /// `head` is the head and its version, `tail` the last id, both read
    /// before the pass.
    async fn scan(&self, taker: &Arc<Taker>, head: (u64, u64), tail: u64) -> Result<Scan> {
        let (head, head_version) = head;
        {
            let mut done = self.done();
            *done = done.split_off(&head);
        }
        let mut live = Live::default();
        // The first id not read done in this pass: the head may move to it.
        let mut first_open = head;
        let mut hole = None;
        let mut took = None;
        for id in head..=tail {
            // What this client saw done is done, but the head moves only
            // over what this pass read.
            let done = if id != first_open && self.done().contains(&id) {
                true
            } else {
                let name = self.item_name(id)?;
                let (state, version) = self.read_item(&name).await?;
                match state {
                    State::Done | State::GivenUp => true,
                    State::Missing | State::Watched(_) => {
                        match self.watch_hole(id, &name, state, version).await? {
                            Hole::Done => true,
                            Hole::Open(v) => {
                                hole.get_or_insert((id, v));
                                false
                            }
                        }
                    }
                    State::Waiting {
                        deliveries,
                        payload,
                    } => {
                        took = self
                            .take_item(taker, id, name, version, deliveries, payload)
                            .await?;
                        false
                    }
                    State::Taken {
                        deliveries,
                        slot,
                        taker: held_by,
                        payload,
                    } => {
                        if !self.is_live(taker, &mut live, id, slot, held_by).await? {
                            took = self
                                .take_item(taker, id, name, version, deliveries, payload)
                                .await?;
                        }
                        false
                    }
                }
            };
            if done {
                self.done().insert(id);
                if first_open == id {
                    first_open = id + 1;
                }
            }
            if took.is_some() {
                break;
            }
        }
        if first_open > head {
            self.advance_later(head, head_version, first_open);
        }
        Ok(match took {
            Some(item) => Scan::Took(Box::new(item)),
            None => Scan::Nothing { hole },
        })
    }

    /// A hole at `id` (its register read as `state` at `version`): marks
    /// it if unmarked, gives it up if marked long enough ago.
    async fn watch_hole(
        &self,
        id: u64,
        name: &LockName,
        state: State,
        version: u64,
    ) -> Result<Hole> {
        let grace = self.client.request_timeout() * 2;
        match state {
            State::Missing => {
                if id < self.read_head().await?.0 {
                    // Passed and swept while this pass went on.
                    return Ok(Hole::Done);
                }
                let mark = format!("w{}", wall_ms());
                // Refused: its pusher (or another taker) wrote it first.
                let marked = self.write(name, 0, mark.as_bytes()).await?;
                Ok(Hole::Open(u64::from(marked)))
            }
            // Old by this taker's clock, or dated beyond it by more than
            // the grace (a marker whose clock runs ahead).
            State::Watched(since)
                if wall_ms().abs_diff(since)
                    >= u64::try_from(grace.as_millis()).unwrap_or(u64::MAX) =>
            {
                if id < self.read_head().await?.0 {
                    // Passed already: a slow taker's mark, made after the
                    // sweep deleted the item. Given up, it would tell the
                    // item's pusher, if it looked, that its item never
                    // landed.
                    return Ok(Hole::Done);
                }
                if self.write(name, version, GIVEN_UP).await? {
                    Ok(Hole::Done)
                } else {
                    // Its pusher wrote it after all.
                    Ok(Hole::Open(version + 1))
                }
            }
            _ => Ok(Hole::Open(version)),
        }
    }

    /// Whether the taker in `slot` that held it with token `held_by`
    /// holds it still, and holds item `id` (which it does, if it is this
    /// process's, only while an [`Item`] or a take of it lives here).
    async fn is_live(
        &self,
        me: &Taker,
        live: &mut Live,
        id: u64,
        slot: u32,
        held_by: u64,
    ) -> Result<bool> {
        if slot == me.slot && held_by == me.token() {
            return Ok(me.holds(id));
        }
        // Only a live answer is kept for the rest of the look. A hold a
        // status read did not name may have been on its way: RedLock
        // names a hold once a quorum of its servers have it, while the
        // token it will get already counts in the last token read (the
        // highest of any server's). Its taker may take this item after
        // that read, so "gone" is read again, not remembered.
        if live
            .0
            .get(&slot)
            .is_some_and(|tokens| tokens.contains(&held_by))
        {
            return Ok(true);
        }
        let status = self.slot_lock(slot)?.status().await?;
        let tokens: Vec<u64> = status.holders.iter().map(|h| h.token).collect();
        let is = tokens.contains(&held_by);
        live.0.insert(slot, tokens);
        Ok(is)
    }

    /// Takes item `id` (read at `version`) for `taker`, unless another
    /// taker got there first.
    async fn take_item(
        &self,
        taker: &Arc<Taker>,
        id: u64,
        name: LockName,
        version: u64,
        deliveries: u32,
        payload: Vec<u8>,
    ) -> Result<Option<Item>> {
        let token = crate::spi::codec::next_version(&name, version)?;
        let delivery = deliveries.saturating_add(1);
        // Held from before the write: a take of this handle that reads the
        // item meanwhile must not take it as an orphan.
        taker.hold(id);
        let mut taking = Taking {
            queue: self.clone(),
            taker: taker.clone(),
            id,
            taken: State::taken(
                delivery,
                taker.slot,
                taker.token(),
                fastrand::u64(..),
                &payload,
            ),
            waiting: State::waiting(deliveries, &payload),
            name,
            version,
            answered: false,
        };
        let took = self.write(&taking.name, version, &taking.taken).await?;
        taking.answered = true;
        if !took {
            return Ok(None);
        }
        // The item's hold passes from the take to the Item.
        taker.hold(id);
        Ok(Some(Item {
            queue: self.clone(),
            id,
            name: taking.name.clone(),
            token,
            deliveries: delivery,
            payload,
            taker: taker.clone(),
            settled: false,
        }))
    }

    /// Moves the head from `head` to `to` in the background, if nobody
    /// moved it since the read at `version`, and then sweeps: work that no
    /// take or acknowledgement waits for.
    fn advance_later(&self, head: u64, version: u64, to: u64) {
        let queue = self.detached();
        tokio::spawn(async move {
            if let Err(e) = queue.advance(head, version, to).await {
                tracing::debug!(queue = %queue.name, error = %e, "moving the head on failed; the next take will");
            }
        });
    }

    async fn advance(&self, head: u64, version: u64, to: u64) -> Result<()> {
        // Nothing to pass (another handle passed and swept it meanwhile).
        if to <= head {
            return Ok(());
        }
        if self.head.compare_and_set(version, to.to_string()).await? {
            self.sweep(to).await?;
        }
        Ok(())
    }

    /// Deletes the acknowledged items' registers below `head`, at most
    /// [`MAX_SWEEP`] of them (given-up holes stay: see the module's notes).
    async fn sweep(&self, head: u64) -> Result<()> {
        let (from, version) = match self.read_raw(self.swept.lock_name()).await? {
            None => (1, 0),
            Some((v, version)) => (self.parse_id(&v, "swept")?, version),
        };
        let to = head.min(from.saturating_add(MAX_SWEEP));
        if from >= to {
            return Ok(());
        }
        for id in from..to {
            // Done is final, so a read then a delete is safe; a hole's
            // mark below the head is one a look left after the head had
            // passed (its pusher long done).
            let name = self.item_name(id)?;
            if matches!(
                self.read_item(&name).await?.0,
                State::Done | State::Watched(_)
            ) {
                self.delete(&name).await?;
            }
        }
        // Lost to another sweeper: it swept as far, or the next one will.
        self.swept.compare_and_set(version, to.to_string()).await?;
        Ok(())
    }

    fn parse_id(&self, raw: &[u8], what: &str) -> Result<u64> {
        std::str::from_utf8(raw)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Protocol,
                    format!(
                        "queue {:?}: its {what} register does not hold an id",
                        self.name
                    ),
                )
            })
    }

    /// The head (1 before the first move) and its register's version.
    async fn read_head(&self) -> Result<(u64, u64)> {
        match self.read_raw(self.head.lock_name()).await? {
            None => Ok((1, 0)),
            Some((v, version)) => Ok((self.parse_id(&v, "head")?, version)),
        }
    }

    /// The last id handed out.
    async fn read_tail(&self) -> Result<u64> {
        let name = self.tail.lock_name();
        let Some((raw, _)) = self.read_raw(name).await? else {
            return Ok(0);
        };
        let n = crate::spi::codec::parse_i64(name, &raw)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn read_raw(&self, name: &LockName) -> Result<crate::spi::RegisterValue> {
        let inner = &self.client.inner;
        if self.background {
            inner
                .read_once("register_read", |b| b.register_read(name))
                .await
        } else {
            inner.read("register_read", |b| b.register_read(name)).await
        }
    }

    async fn read_item(&self, name: &LockName) -> Result<(State, u64)> {
        let got = self.read_raw(name).await?;
        let version = got.as_ref().map_or(0, |(_, v)| *v);
        Ok((
            State::parse(name, got.as_ref().map(|(v, _)| &v[..]))?,
            version,
        ))
    }

    async fn write(&self, name: &LockName, version: u64, value: &[u8]) -> Result<bool> {
        (self.client.inner)
            .write_register(name, value, WriteRule::Version(version))
            .await
    }

    async fn delete(&self, name: &LockName) -> Result<bool> {
        let inner = &self.client.inner;
        inner
            .write("register_delete", inner.backend.register_delete(name))
            .await
    }

    /// Wakes waiting takers: a new value in the wake register. Its failure
    /// only costs them a look of their own.
    async fn wake_quietly(&self) {
        let nonce = fastrand::u64(..).to_string();
        let wrote = (self.client.inner)
            .write_register(&self.wake, nonce.as_bytes(), WriteRule::Always)
            .await;
        if let Err(e) = wrote {
            tracing::debug!(queue = %self.name, error = %e, "waking takers failed; they look on their own");
        }
    }
}

/// The taker slots a pass has looked at: the tokens holding each when
/// last read.
#[derive(Default)]
struct Live(HashMap<u32, Vec<u64>>);

/// What became of a hole: done (given up, or passed), or still open at
/// this version of its register.
enum Hole {
    Done,
    Open(u64),
}

/// What a pass from the head found.
enum Scan {
    Took(Box<Item>),
    /// Nothing to take: wait for a wake, or for the first hole, if any,
    /// to be written past this version.
    Nothing {
        hole: Option<(u64, u64)>,
    },
}

/// An item taken from a [`Queue`], leased to the handle that took it until
/// [`ack`](Self::ack)ed or given back. Dropping it gives it back (in the
/// background; should that fail, the next take of its handle takes it
/// again, and if the process is gone, its lease gives it back).
#[derive(Debug)]
#[must_use = "an item dropped at once goes back to the queue"]
pub struct Item {
    queue: Queue,
    id: u64,
    name: LockName,
    token: u64,
    deliveries: u32,
    payload: Vec<u8>,
    taker: Arc<Taker>,
    settled: bool,
}

impl Item {
    /// The item's id, as [`Queue::push`] returned it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// What was pushed.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// How many times the item has been taken, this time included: more
    /// than 1 after a taker gave it back or died holding it. (A take
    /// cancelled after its write landed gives the item back as it was: it
    /// reached nobody, and does not count.)
    pub fn deliveries(&self) -> u32 {
        self.deliveries
    }

    /// This delivery's fencing token: greater than every earlier
    /// delivery's of this item (fence on the item's id and this).
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Whether this handle's taker still holds its lease (no round trip).
    /// Once it does not, another taker may take the item.
    pub fn is_held(&self) -> bool {
        self.taker.guard.is_held()
    }

    /// Resolves when this handle's taker loses its lease, after which
    /// another taker may take the item.
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        self.taker.guard.lost()
    }

    /// Finishes the item: nobody takes it again.
    ///
    /// # Errors
    /// [`Lost`](ErrorKind::Lost) if another taker took the item after this
    /// taker's lease ended: the item is theirs, and stays in the queue
    /// until they finish it. Any other error means the finish is in
    /// doubt: a write whose reply was lost is read back and counts if it
    /// landed, but one whose read-back failed too may have landed all the
    /// same. The item is then finished or given back when the `Item` is
    /// dropped, and a handler that must not run twice checks its own
    /// records, as at-least-once delivery asks of it anyway.
    pub async fn ack(mut self) -> Result<()> {
        let finished = match self.queue.write(&self.name, self.token, DONE).await {
            Ok(f) => f,
            Err(e) if self.finish_landed().await => {
                tracing::debug!(queue = %self.queue.name, error = %e, "an acknowledgement's reply was lost, but it landed");
                true
            }
            Err(e) => return Err(e),
        };
        self.settled = true;
        if !finished {
            return Err(self.taken_over());
        }
        self.queue.done().insert(self.id);
        // If it was the head, move the head on (in the background).
        let queue = self.queue.detached();
        let id = self.id;
        tokio::spawn(async move {
            if let Err(e) = queue.move_head_from(id).await {
                tracing::debug!(queue = %queue.name, error = %e, "moving the head on failed; the next take will");
            }
        });
        Ok(())
    }

    /// Whether this delivery's acknowledgement is in the register (or was,
    /// and has been swept since), read after its write's reply was lost.
    async fn finish_landed(&self) -> bool {
        match self.queue.read_item(&self.name).await {
            Ok((State::Done, version)) => version == self.token + 1,
            // Finished and swept since: by this taker only if its lease
            // never lapsed (else another may have finished it).
            Ok((State::Missing, _)) if self.is_held() => {
                matches!(self.queue.read_head().await, Ok((head, _)) if self.id < head)
            }
            _ => false,
        }
    }

    /// Gives the item back to the queue now, for the next take; `false` if
    /// another taker had taken it already (after this taker's lease ended).
    /// A write whose reply was lost is read back, and counts if it landed.
    pub async fn release(mut self) -> Result<bool> {
        let value = State::waiting(self.deliveries, &self.payload);
        let given = match self.queue.write(&self.name, self.token, &value).await {
            Ok(g) => g,
            Err(e) => match self.queue.read_raw(&self.name).await {
                Ok(Some((v, version))) if v == value && version == self.token + 1 => true,
                _ => return Err(e),
            },
        };
        self.settled = true;
        if given {
            self.queue.wake_quietly().await;
        }
        Ok(given)
    }

    fn taken_over(&self) -> Error {
        Error::new(
            ErrorKind::Lost,
            format!(
                "queue {:?}: item {} was taken by another taker after this one's lease ended",
                self.queue.name, self.id
            ),
        )
    }
}

impl Queue {
    /// Moves the head over item `id` and the done ones after it, if `id`
    /// is the head.
    async fn move_head_from(&self, id: u64) -> Result<()> {
        let (head, version) = self.read_head().await?;
        if head != id {
            return Ok(());
        }
        let mut to = head;
        while let (State::Done | State::GivenUp, _) = self.read_item(&self.item_name(to)?).await? {
            to += 1;
        }
        self.advance(head, version, to).await
    }
}

impl Drop for Item {
    fn drop(&mut self) {
        self.taker.let_go(self.id);
        if self.settled {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime to give it back on: its lease gives it back.
            return;
        };
        let queue = self.queue.detached();
        let name = self.name.clone();
        let value = State::waiting(self.deliveries, &self.payload);
        let token = self.token;
        let taker = self.taker.clone();
        rt.spawn(async move {
            for _ in 0..GIVE_BACK_TRIES {
                match queue.write(&name, token, &value).await {
                    Ok(true) => return queue.wake_quietly().await,
                    Ok(false) => return,
                    Err(e) => {
                        tracing::debug!(queue = %queue.name, error = %e, "giving back an item dropped unfinished failed");
                    }
                }
                if !taker.guard.is_held() {
                    return;
                }
                tokio::time::sleep(queue.client.request_timeout()).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_read_back_as_written() {
        let name = LockName::new("q:item:1").unwrap();
        let p = State::waiting(3, b"a:b");
        assert_eq!(
            State::parse(&name, Some(&p)).unwrap(),
            State::Waiting {
                deliveries: 3,
                payload: b"a:b".to_vec()
            }
        );
        let t = State::taken(4, 7, 99, 5, b"");
        assert_eq!(
            State::parse(&name, Some(&t)).unwrap(),
            State::Taken {
                deliveries: 4,
                slot: 7,
                taker: 99,
                payload: vec![]
            }
        );
        assert_eq!(State::parse(&name, Some(DONE)).unwrap(), State::Done);
        assert_eq!(State::parse(&name, Some(GIVEN_UP)).unwrap(), State::GivenUp);
        assert_eq!(
            State::parse(&name, Some(b"w17")).unwrap(),
            State::Watched(17)
        );
        assert_eq!(State::parse(&name, None).unwrap(), State::Missing);
        for bad in [
            &b""[..],
            b"x1",
            b"h:",
            b"w",
            b"wq",
            b"t1:2:3:",
            b"p",
            b"pq:",
            b"t1:2:",
            b"17",
        ] {
            assert!(State::parse(&name, Some(bad)).is_err(), "{bad:?}");
        }
    }
}
