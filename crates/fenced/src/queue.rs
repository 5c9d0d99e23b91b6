//! A leased work queue (Redisson's `RReliableQueue`, Curator's
//! `DistributedQueue` consumed with a lock): items kept in registers,
//! each taken under the taker's lease and given back when it ends.
//!
//! The layout, all in the lock backend beside the locks:
//!
//! | name | what |
//! |---|---|
//! | register `<name>:tail` | a counter: the last item id handed out (ids start at 1) |
//! | register `<name>:item:<id>` | the item: `p<deliveries>:<payload>` while waiting, `t<deliveries>:<slot>:<taker token>:<payload>` while taken, `x` once acknowledged, `h` for a hole given up (below) |
//! | register `<name>:head` | every id below it is done |
//! | register `<name>:swept` | every acknowledged item's register below it is deleted |
//! | lock `<name>:taker:<slot>` | held (with the watchdog) by each handle that takes, slots 0 to [`MAX_TAKERS`] − 1 |
//!
//! An item is taken by a versioned compare-and-set of its register, so of
//! two takers exactly one gets it; the register's version after that
//! write is the item's fencing token, which rises with every delivery. A
//! taken item names its taker's slot and that slot lock's token: while
//! the lock is held with that token the item is someone's, and once the
//! lock is gone (its holder died, or was cut off past its lease) the next
//! taker takes the item again. Items are found by reading from `head`, so
//! a take reads the items in flight before the first waiting one. Within
//! one taker, an item marked with its own slot and token is its own only
//! while an [`Item`] for it exists in this process: one whose take was
//! cancelled after the write, or whose reply was lost, is taken again.
//!
//! A push takes an id from the tail counter and then creates the item's
//! register (create-only). Between the two the id is a *hole*. A pusher
//! that died there would leave it open for ever, so a taker that has seen
//! a hole for longer than two request timeouts (timed per client and
//! queue) writes it `h` itself, create-only too, unless the head has
//! passed it: a pusher that was only slow then finds its id taken, and
//! pushes again under a new one. A given-up hole's register is never
//! deleted, so that no late push can land in it below the head: a push
//! that died between its two steps leaves those few bytes behind. How
//! long a pusher pauses never decides anything: the compare-and-sets do,
//! and the waiting only sets how soon.

use crate::client::Client;
use crate::core::hold::LostReason;
use crate::error::{Error, ErrorKind, Result};
use crate::name::LockName;
use crate::spi::{RegisterWrite, WriteRule};
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

/// The longest suffix a queue adds to its name: `:item:` and 20 digits.
const LONGEST_SUFFIX: usize = ":item:".len() + 20;

/// What an acknowledged item's register holds.
const DONE: &[u8] = b"x";

/// What a hole's register holds once given up.
const GIVEN_UP: &[u8] = b"h";

/// How long a waiting take sleeps at most before it reads again: a taker
/// that died writes nothing, so only a look finds its items.
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// An item's register, read.
#[derive(Debug, PartialEq, Eq)]
enum State {
    /// Not there: a hole, or deleted below the head.
    Missing,
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

    fn taken(deliveries: u32, slot: u32, taker: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = format!("t{deliveries}:{slot}:{taker}:").into_bytes();
        v.extend_from_slice(payload);
        v
    }

    /// Reads `raw`, the register of item `name`.
    fn parse(name: &LockName, raw: Option<&[u8]>) -> Result<State> {
        let Some(raw) = raw else {
            return Ok(State::Missing);
        };
        let bad = || {
            Error::invalid(format!(
                "{:?} does not hold a queue item (written as another kind of value?)",
                name.as_str()
            ))
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

/// A take of item `id` under way: it counts as held by its taker until
/// the take ends, and stays so only if it [`keep`](Self::keep)s it.
struct Taking<'a> {
    taker: &'a Taker,
    id: u64,
}

impl<'a> Taking<'a> {
    fn new(taker: &'a Taker, id: u64) -> Self {
        taker.hold(id);
        Taking { taker, id }
    }

    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        self.taker.let_go(self.id);
    }
}

/// What a client remembers of a queue between takes, shared by its
/// handles: it saves reads, and times holes.
#[derive(Debug, Default)]
struct Memory {
    /// Ids seen done: done stays done (until swept below the head).
    done: BTreeSet<u64>,
    /// Holes seen, and since when.
    holes: HashMap<u64, Instant>,
    /// The highest tail seen: one lower means the server lost writes
    /// (a restart without persistence), and all of this is forgotten.
    tail: u64,
}

impl Memory {
    /// Forgets what lies below `head`, or everything if `tail` went back.
    fn update(&mut self, head: u64, tail: u64) {
        if tail < self.tail {
            *self = Memory::default();
        }
        self.tail = tail;
        self.done = self.done.split_off(&head);
        self.holes.retain(|&id, _| id >= head);
    }
}

/// Each client's memory of each queue, by client id and queue name.
#[allow(clippy::type_complexity)]
static MEMORIES: std::sync::LazyLock<
    std::sync::Mutex<HashMap<(String, String), Arc<std::sync::Mutex<Memory>>>>,
> = std::sync::LazyLock::new(Default::default);

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
/// rather than making one per take: each takes a slot lock of its own.
/// Queues suit light load (the seeds' advice for queues on ZooKeeper
/// holds on every engine here): a take reads every item in flight before
/// the first waiting one.
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
    lease: Option<Duration>,
    taker: Arc<tokio::sync::Mutex<Option<Arc<Taker>>>>,
    memory: Arc<std::sync::Mutex<Memory>>,
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
            tail: client.counter(&format!("{name}:tail"))?,
            lease: None,
            taker: Arc::default(),
            memory: MEMORIES
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry((client.id().to_owned(), name.to_owned()))
                .or_default()
                .clone(),
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
    /// # Errors
    /// [`InvalidInput`](ErrorKind::InvalidInput), with nothing pushed, for
    /// a payload longer than [`MAX_ITEM_LEN`].
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
        for _ in 0..MAX_PUSH_RACES {
            let id = self.tail.add(1).await?;
            let id = u64::try_from(id).map_err(|_| {
                Error::invalid(format!(
                    "queue {:?}: its tail counter holds {id}, not an id",
                    self.name
                ))
            })?;
            let name = self.item_name(id)?;
            // Create-only, so refused where a taker gave this id up as
            // a hole: then take another.
            if self.write(&name, 0, &value).await? {
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

    /// Waits for the oldest item nobody holds and takes it.
    pub async fn take(&self) -> Result<Item> {
        self.take_until(None)
            .await?
            .ok_or_else(|| Error::protocol("a take without a deadline ended without an item"))
    }

    /// Takes the oldest item nobody holds, if there is one now.
    pub async fn try_take(&self) -> Result<Option<Item>> {
        self.take_until(Some(Instant::now())).await
    }

    /// Waits up to `timeout` for an item; `None` if none came.
    pub async fn take_timeout(&self, timeout: Duration) -> Result<Option<Item>> {
        self.take_until(Instant::now().checked_add(timeout)).await
    }

    /// How many items are waiting or taken: one read per item.
    pub async fn len(&self) -> Result<u64> {
        let (head, _) = self.read_head().await?;
        let tail = self.read_tail().await?.0;
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
        loop {
            let taker = self.taker().await?;
            let (hole, tail_version) = match self.scan(&taker).await? {
                Scan::Took(item) => return Ok(Some(*item)),
                Scan::Nothing { hole, tail_version } => (hole, tail_version),
            };
            let now = Instant::now();
            if until.is_some_and(|u| u <= now) {
                return Ok(None);
            }
            let look = Some(until.map_or(now + LOOK_EVERY, |u| u.min(now + LOOK_EVERY)));
            let inner = &self.client.inner;
            let moved = |seen: u64| {
                move |raw: crate::spi::RegisterValue| {
                    Ok((raw.map_or(0, |(_, v)| v) != seen).then_some(()))
                }
            };
            // A push or a give-back moves the tail; the pusher of a hole
            // writes the hole.
            let tail = inner.wait_register(self.tail_name(), look, moved(tail_version));
            match hole {
                None => drop(tail.await?),
                Some(id) => {
                    let name = self.item_name(id)?;
                    let written = inner.wait_register(&name, look, moved(0));
                    tokio::select! {
                        r = tail => drop(r?),
                        r = written => drop(r?),
                    }
                }
            }
        }
    }

    fn tail_name(&self) -> &LockName {
        self.tail.lock_name()
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
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

    /// One pass from the head: takes the first item nobody holds, gives
    /// up old holes, and moves the head over the done items before them.
    async fn scan(&self, taker: &Arc<Taker>) -> Result<Scan> {
        let (head, head_version) = self.read_head().await?;
        let (tail, tail_version) = self.read_tail().await?;
        self.memory().update(head, tail);
        let mut live = Live::default();
        // The first id not read done in this pass: the head may move to it.
        let mut first_open = head;
        let mut hole = None;
        let mut took = None;
        for id in head..=tail {
            // What this client saw done is done, but the head moves only
            // over what this pass read.
            let done = if id != first_open && self.memory().done.contains(&id) {
                true
            } else {
                let name = self.item_name(id)?;
                let (state, version) = self.read_item(&name).await?;
                if state != State::Missing {
                    self.memory().holes.remove(&id);
                }
                match state {
                    State::Done | State::GivenUp => true,
                    State::Missing => {
                        let done = self.give_up_hole(id, &name).await?;
                        if !done {
                            hole.get_or_insert(id);
                        }
                        done
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
                self.memory().done.insert(id);
                if first_open == id {
                    first_open = id + 1;
                }
            }
            if took.is_some() {
                break;
            }
        }
        if first_open > head {
            // Housekeeping: a take that got its item has it, whatever
            // happens here.
            if let Err(e) = self.advance(head, head_version, first_open).await {
                tracing::debug!(queue = %self.name, error = %e, "moving the head on failed; the next take will");
            }
        }
        Ok(match took {
            Some(item) => Scan::Took(Box::new(item)),
            None => Scan::Nothing { hole, tail_version },
        })
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
        // A status read before `held_by` was issued cannot tell: read
        // again. One read after it can: a hold that is gone never comes
        // back.
        if let Some((tokens, last)) = live.0.get(&slot)
            && held_by <= *last
        {
            return Ok(tokens.contains(&held_by));
        }
        let status = self.slot_lock(slot)?.status().await?;
        let tokens: Vec<u64> = status.holders.iter().map(|h| h.token).collect();
        let is = tokens.contains(&held_by);
        let last = tokens.iter().copied().fold(status.last_token, u64::max);
        live.0.insert(slot, (tokens, last));
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
        let deliveries = deliveries.saturating_add(1);
        let value = State::taken(deliveries, taker.slot, taker.token(), &payload);
        // Held from before the write: a take of this handle that reads the
        // item meanwhile must not take it as an orphan. Let go again if
        // this write is refused, fails, or is dropped.
        let taking = Taking::new(taker, id);
        if !self.write(&name, version, &value).await? {
            return Ok(None);
        }
        taking.keep();
        Ok(Some(Item {
            queue: self.clone(),
            id,
            token: crate::spi::codec::next_version(&name, version)?,
            name,
            deliveries,
            payload,
            taker: taker.clone(),
            settled: false,
        }))
    }

    /// Gives up the hole `id` if it has been one for long enough: whether
    /// it is done now.
    async fn give_up_hole(&self, id: u64, name: &LockName) -> Result<bool> {
        let grace = self.client.request_timeout() * 2;
        let since = *self.memory().holes.entry(id).or_insert_with(Instant::now);
        if since.elapsed() < grace {
            return Ok(false);
        }
        if id < self.read_head().await?.0 {
            // The head passed it while this client was not looking: it
            // was done, and swept.
            return Ok(true);
        }
        // Not passed, so never written: give it up, unless its pusher
        // writes it first.
        let given_up = self.write(name, 0, GIVEN_UP).await?;
        self.memory().holes.remove(&id);
        Ok(given_up)
    }

    /// Moves the head from `head` to `to`, if nobody moved it since the
    /// read at `version`, and then sweeps.
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

    /// Deletes the acknowledged items' registers below `head` (given-up
    /// holes stay: see the module's notes).
    async fn sweep(&self, head: u64) -> Result<()> {
        let (from, version) = match self.swept.read().await? {
            None => (1, 0),
            Some(v) => (self.parse_id(&v.value, "swept")?, v.version),
        };
        if from >= head {
            return Ok(());
        }
        for id in from..head {
            // Done is final, so a read then a delete is safe.
            let name = self.item_name(id)?;
            if self.read_item(&name).await?.0 == State::Done {
                self.delete(&name).await?;
            }
        }
        // Lost to another sweeper: it swept as far, or the next one will.
        self.swept
            .compare_and_set(version, head.to_string())
            .await?;
        Ok(())
    }

    fn parse_id(&self, raw: &[u8], what: &str) -> Result<u64> {
        std::str::from_utf8(raw)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "queue {:?}: its {what} register does not hold an id",
                    self.name
                ))
            })
    }

    /// The head (1 before the first move) and its register's version.
    async fn read_head(&self) -> Result<(u64, u64)> {
        match self.head.read().await? {
            None => Ok((1, 0)),
            Some(v) => Ok((self.parse_id(&v.value, "head")?, v.version)),
        }
    }

    /// The last id handed out and the tail register's version.
    async fn read_tail(&self) -> Result<(u64, u64)> {
        let name = self.tail_name();
        let got = self
            .client
            .inner
            .read("register_read", |b| b.register_read(name))
            .await?;
        let Some((raw, version)) = got else {
            return Ok((0, 0));
        };
        let n = crate::spi::codec::parse_i64(name, &raw)?;
        Ok((u64::try_from(n).unwrap_or(0), version))
    }

    async fn read_item(&self, name: &LockName) -> Result<(State, u64)> {
        let got = self
            .client
            .inner
            .read("register_read", |b| b.register_read(name))
            .await?;
        let version = got.as_ref().map_or(0, |(_, v)| *v);
        Ok((
            State::parse(name, got.as_ref().map(|(v, _)| &v[..]))?,
            version,
        ))
    }

    async fn write(&self, name: &LockName, version: u64, value: &[u8]) -> Result<bool> {
        let inner = &self.client.inner;
        inner
            .write(
                "register_write",
                inner.backend.register_write(RegisterWrite {
                    name,
                    value,
                    rule: WriteRule::Version(version),
                }),
            )
            .await
    }

    async fn delete(&self, name: &LockName) -> Result<bool> {
        let inner = &self.client.inner;
        inner
            .write("register_delete", inner.backend.register_delete(name))
            .await
    }

    /// Wakes waiting takers: the tail's version moves on.
    async fn poke(&self) -> Result<()> {
        self.tail.add(0).await.map(drop)
    }
}

/// The taker slots a pass has looked at: the tokens holding each, and
/// the highest token issued for it by then.
#[derive(Default)]
struct Live(HashMap<u32, (Vec<u64>, u64)>);

/// What a pass from the head found.
enum Scan {
    Took(Box<Item>),
    /// Nothing to take: wait for the tail to move on from this version,
    /// or for the hole, if any, to be written.
    Nothing {
        hole: Option<u64>,
        tail_version: u64,
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
    /// than 1 after a taker gave it back or died holding it.
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
    /// until they finish it. Any other error leaves the item unfinished
    /// (or finished, if the write landed and its reply was lost), and
    /// given back when the `Item` is dropped.
    pub async fn ack(mut self) -> Result<()> {
        let finished = self.queue.write(&self.name, self.token, DONE).await?;
        self.settled = true;
        if !finished {
            return Err(self.taken_over());
        }
        self.queue.memory().done.insert(self.id);
        // Housekeeping: the item is finished, whatever happens here.
        if let Err(e) = self.move_head().await {
            tracing::debug!(queue = %self.queue.name, error = %e, "moving the head on failed; the next take will");
        }
        Ok(())
    }

    /// Moves the head over this item and the done ones after it, if it
    /// was the head.
    async fn move_head(&self) -> Result<()> {
        let (head, version) = self.queue.read_head().await?;
        if head != self.id {
            return Ok(());
        }
        let mut to = head;
        while let (State::Done | State::GivenUp, _) =
            self.queue.read_item(&self.queue.item_name(to)?).await?
        {
            to += 1;
        }
        self.queue.advance(head, version, to).await
    }

    /// Gives the item back to the queue now, for the next take; `false` if
    /// another taker had taken it already (after this taker's lease ended).
    pub async fn release(mut self) -> Result<bool> {
        let value = State::waiting(self.deliveries, &self.payload);
        let given = self.queue.write(&self.name, self.token, &value).await?;
        self.settled = true;
        if given {
            self.queue.poke_quietly().await;
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
    /// [`poke`](Self::poke), whose failure only costs waiting takers a
    /// look of their own.
    async fn poke_quietly(&self) {
        if let Err(e) = self.poke().await {
            tracing::debug!(queue = %self.name, error = %e, "waking takers failed; they look on their own");
        }
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
        let queue = self.queue.clone();
        let name = self.name.clone();
        let value = State::waiting(self.deliveries, &self.payload);
        let token = self.token;
        rt.spawn(async move {
            match queue.write(&name, token, &value).await {
                Ok(true) => queue.poke_quietly().await,
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(queue = %queue.name, error = %e, "an item dropped unfinished was not given back; the next take of its handle takes it again");
                }
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
        let t = State::taken(4, 7, 99, b"");
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
        assert_eq!(State::parse(&name, None).unwrap(), State::Missing);
        for bad in [&b""[..], b"x1", b"h:", b"p", b"pq:", b"t1:2:", b"17"] {
            assert!(State::parse(&name, Some(bad)).is_err(), "{bad:?}");
        }
    }
}
