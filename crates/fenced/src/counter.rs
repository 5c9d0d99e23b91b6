//! Shared counters and ID sequences: a 64-bit integer in the lock backend
//! that every client changes atomically (Curator's `SharedCount` and
//! `DistributedAtomicLong`, Redisson's `RAtomicLong` and `RIdGenerator`),
//! written once over the store every backend has: a versioned
//! compare-and-set, promoted to a lock when writers keep colliding.

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};
use crate::mutex::Mutex;
use crate::spi::Codec;
use crate::versioned::VersionedValue;
use std::time::Duration;

/// Lost races before a change takes the counter's lock, as Curator's
/// `DistributedAtomicLong` with `PromotedToLock` does: past this, every
/// loser of a race waits its turn instead of racing again.
const OPTIMISTIC_TRIES: u32 = 3;

/// Lost races, holding the lock, before a change gives up: only writers
/// still racing optimistically can beat one that holds it, and each of
/// them takes the lock after a few losses.
const MAX_CONFLICTS: u32 = 100;

/// How long a change waits for the counter's lock by default (see
/// [`Counter::wait_timeout`]).
pub const COUNTER_WAIT: Duration = Duration::from_secs(30);

/// What the counter's lock adds to its name.
const LOCK_SUFFIX: &str = ":counter";

/// A shared 64-bit counter.
///
/// Stored as the decimal text of the value in the register named like the
/// counter, 0 until first changed: a [`VersionedValue`] or
/// [`FencedRegister`](crate::FencedRegister) of that name reads it, but
/// only a counter or a versioned value may write it (a fenced register's
/// writes do not move the version every change is checked against).
///
/// On ZooKeeper it lives where Curator keeps its counters instead: in the
/// data of the node at the counter's path (`/N` under the URL's path),
/// 8 bytes big-endian as `DistributedAtomicLong` writes it, or 4 as
/// `SharedCount` does (see [`int32`](Self::int32)), changed by
/// compare-and-set on the node's version. A Curator counter on that path
/// is the same counter; a register of that name is another value.
/// `add` is one step on the server where the engine has one (a script on
/// Redis, one statement on PostgreSQL); every other change is a
/// compare-and-set of that register; when writers keep colliding, a change waits (up to [`wait_timeout`](Self::wait_timeout))
/// for the mutex named `<name>:counter` and tries again holding it, so
/// many writers take turns rather than race for ever.
///
/// A change whose call failed on the way (an [`Unavailable`](ErrorKind::Unavailable)
/// error, or a future dropped while its write was out) may have been
/// made: as with Redis's `INCR`, only a read tells. A change refused
/// (`InvalidInput`) or given up on (`TimedOut`: the lock not had in time,
/// or other writers winning every race) was not made.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://counter-doc").await?;
/// let sold = client.counter("sold:42")?;
/// assert_eq!(sold.get().await?, 0);
/// assert_eq!(sold.add(3).await?, 3);
/// assert!(sold.compare_and_set(3, 10).await?);
/// assert!(!sold.compare_and_set(3, 11).await?);
/// assert_eq!(sold.increment().await?, 11);
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Counter {
    value: VersionedValue,
    lock: Mutex,
    wait: Duration,
    int32: bool,
}

impl Counter {
    pub(crate) fn new(client: &Client, name: &str) -> Result<Counter> {
        let value = client.versioned(name)?.native(Codec::Long);
        if name.len() + LOCK_SUFFIX.len() > crate::MAX_NAME_LEN {
            return Err(Error::invalid(format!(
                "counter name is {} bytes long; counters take at most {} (their lock's \
                 name adds {LOCK_SUFFIX:?})",
                name.len(),
                crate::MAX_NAME_LEN - LOCK_SUFFIX.len()
            )));
        }
        Ok(Counter {
            value,
            lock: client.mutex(&format!("{name}{LOCK_SUFFIX}"))?,
            wait: COUNTER_WAIT,
            int32: false,
        })
    }

    /// Keeps the value within 32 bits, as Curator's `SharedCount` does: a
    /// change that would leave the range of `i32` is refused
    /// ([`InvalidInput`](ErrorKind::InvalidInput), nothing written), and
    /// on ZooKeeper a counter this handle creates is written in 4 bytes,
    /// where a `SharedCount` on the same path reads it. (Without it a new
    /// ZooKeeper counter is written in 8 bytes, as `DistributedAtomicLong`
    /// keeps it; a counter found in 4 bytes stays in 4 either way.)
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let client = fenced::Client::connect("memory://counter-int32-doc").await?;
    /// let seats = client.counter("seats")?.int32();
    /// seats.set(i32::MAX.into()).await?;
    /// assert!(seats.add(1).await.is_err()); // refused, nothing written
    /// assert_eq!(seats.get().await?, i64::from(i32::MAX));
    /// # Ok::<_, fenced::Error>(()) }).unwrap();
    /// ```
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn int32(mut self) -> Self {
        self.value = self.value.native(Codec::Int);
        self.int32 = true;
        self
    }

    /// The same counter, kept in its register on every engine (not where
    /// Curator keeps counters on ZooKeeper): for a recipe's own state that
    /// it reads beside its other registers.
    pub(crate) fn in_register(mut self) -> Self {
        self.value = self.value.in_register();
        self
    }

    /// `n`, if this counter may hold it.
    fn in_range(&self, n: i64) -> Result<i64> {
        if self.int32 && i32::try_from(n).is_err() {
            return Err(Error::invalid(format!(
                "counter {:?} is kept in 32 bits; {n} leaves the range of i32, so nothing \
                 was written",
                self.name()
            )));
        }
        Ok(n)
    }

    /// How long a change waits for the counter's lock when writers keep
    /// colliding ([`COUNTER_WAIT`] by default), before it gives up with
    /// [`TimedOut`](ErrorKind::TimedOut), unmade.
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn wait_timeout(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The counter's name.
    pub fn name(&self) -> &str {
        self.value.name()
    }

    /// The counter's register, checked.
    pub(crate) fn lock_name(&self) -> &crate::name::LockName {
        self.value.lock_name()
    }

    /// The value; 0 if never changed.
    ///
    /// # Errors
    /// [`InvalidInput`](ErrorKind::InvalidInput) if the register holds
    /// something other than an integer (written as another kind of value).
    pub async fn get(&self) -> Result<i64> {
        Ok(self.read().await?.0)
    }

    /// Adds `delta` (negative to subtract); the value after it.
    ///
    /// # Errors
    /// [`InvalidInput`](ErrorKind::InvalidInput), with nothing written, if
    /// the sum leaves the range of `i64`.
    pub async fn add(&self, delta: i64) -> Result<i64> {
        // One step on the server where the engine has one (a Redis script,
        // one PostgreSQL statement); else, or when it refuses (not an
        // integer, out of range), by compare-and-set, which says why.
        let inner = &self.value.client().inner;
        let name = self.value.lock_name();
        // Not where the value lives in the engine's own layout (Curator's
        // nodes on ZooKeeper), nor past a range the server does not know.
        if !self.int32 && inner.backend.nodes().is_none() {
            let native = inner
                .write("register_add", inner.backend.register_add(name, delta))
                .await?;
            if let Some(n) = native {
                return Ok(n);
            }
        }
        self.change(|n| {
            n.checked_add(delta).ok_or_else(|| {
                Error::invalid(format!(
                    "counter {:?}: {n} + {delta} leaves the range of a 64-bit integer",
                    self.name()
                ))
            })
        })
        .await
    }

    /// Adds 1; the value after it.
    pub async fn increment(&self) -> Result<i64> {
        self.add(1).await
    }

    /// Subtracts 1; the value after it.
    pub async fn decrement(&self) -> Result<i64> {
        self.add(-1).await
    }

    /// Sets the value, whatever it was.
    pub async fn set(&self, value: i64) -> Result<()> {
        self.change(|_| Ok(value)).await.map(drop)
    }

    /// Sets `new` if the value is `expected`; whether it did.
    pub async fn compare_and_set(&self, expected: i64, new: i64) -> Result<bool> {
        self.in_range(new)?;
        for lost in 0..MAX_CONFLICTS {
            let (n, version) = self.read().await?;
            if n != expected {
                return Ok(false);
            }
            if self.value.compare_and_set(version, new.to_string()).await? {
                return Ok(true);
            }
            // Another writer changed it: it may be `expected` again.
            pause(lost).await;
        }
        Err(self.too_contended())
    }

    /// A watch on the counter from its value now: each
    /// [`changed`](CounterWatch::changed) waits for the next change,
    /// woken by the engine (Redis pub/sub, PostgreSQL `NOTIFY`, an etcd or
    /// ZooKeeper watch, a datagram or doorbell from the writer), as
    /// Curator's `SharedCount` listener is.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let client = fenced::Client::connect("memory://counter-watch-doc").await?;
    /// let stock = client.counter("stock:42")?;
    /// let mut watch = stock.watch().await?;
    /// assert_eq!(watch.value(), 0);
    /// stock.add(5).await?;
    /// assert_eq!(watch.changed().await?, 5);
    /// # Ok::<_, fenced::Error>(()) }).unwrap();
    /// ```
    pub async fn watch(&self) -> Result<CounterWatch> {
        let (last, version) = self.read().await?;
        Ok(CounterWatch {
            value: self.value.clone(),
            last,
            version,
        })
    }

    /// The value and the register's version.
    async fn read(&self) -> Result<(i64, u64)> {
        parse(
            self.name(),
            self.value.read().await?.map(|v| (v.value, v.version)),
        )
    }

    /// One compare-and-set of `f(value)`; `None` when another writer won.
    async fn try_change(&self, f: &impl Fn(i64) -> Result<i64>) -> Result<Option<i64>> {
        let (n, version) = self.read().await?;
        let next = self.in_range(f(n)?)?;
        let won = self
            .value
            .compare_and_set(version, next.to_string())
            .await?;
        Ok(won.then_some(next))
    }

    /// Applies `f` by compare-and-set, optimistically a few times, then
    /// holding the counter's lock.
    pub(crate) async fn change(&self, f: impl Fn(i64) -> Result<i64>) -> Result<i64> {
        for lost in 0..OPTIMISTIC_TRIES {
            if let Some(v) = self.try_change(&f).await? {
                return Ok(v);
            }
            pause(lost).await;
        }
        let Some(guard) = self.lock.acquire_timeout(self.wait).await? else {
            return Err(Error::new(
                ErrorKind::TimedOut,
                format!(
                    "counter {:?}: writers kept colliding, and its lock ({:?}) was not had \
                     within {:?}; nothing was changed",
                    self.name(),
                    self.lock.name(),
                    self.wait
                ),
            ));
        };
        let mut outcome = Err(self.too_contended());
        for lost in 0..MAX_CONFLICTS {
            match self.try_change(&f).await {
                Ok(None) => pause(lost).await,
                Ok(Some(v)) => {
                    outcome = Ok(v);
                    break;
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        // The value is written (or not) whatever the release says.
        let _ = guard.release().await;
        outcome
    }

    fn too_contended(&self) -> Error {
        Error::new(
            ErrorKind::TimedOut,
            format!(
                "counter {:?}: other writers won {MAX_CONFLICTS} races in a row; nothing \
                 was changed",
                self.name()
            ),
        )
    }
}

/// The counter's value and version in what its register holds.
fn parse(name: &str, raw: Option<(Vec<u8>, u64)>) -> Result<(i64, u64)> {
    let Some((value, version)) = raw else {
        return Ok((0, 0));
    };
    let n = std::str::from_utf8(&value)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| {
            Error::invalid(format!(
                "counter {name:?} holds {:?}, not an integer: the name is used by \
                 another kind of value",
                String::from_utf8_lossy(&value)
            ))
        })?;
    Ok((n, version))
}

/// The changes of a [`Counter`], from [`Counter::watch`]: like a
/// `tokio::sync::watch` receiver, it sees the latest value, so changes
/// that come faster than it is asked may be seen as one.
#[derive(Debug)]
pub struct CounterWatch {
    value: VersionedValue,
    last: i64,
    version: u64,
}

impl CounterWatch {
    /// The value last seen.
    pub fn value(&self) -> i64 {
        self.last
    }

    /// Waits until the counter has changed since last seen; the value
    /// then. Cancel safe: dropped, it loses no change (the next call sees
    /// it). Waits for ever where nothing changes: bound it with
    /// `tokio::time::timeout` where that matters.
    pub async fn changed(&mut self) -> Result<i64> {
        let seen = self.version;
        let name = self.value.name().to_owned();
        let got = self
            .value
            .wait(None, |raw| {
                let (n, version) = parse(&name, raw)?;
                Ok((version != seen).then_some((n, version)))
            })
            .await?;
        let (n, version) =
            got.ok_or_else(|| Error::protocol("a wait without a deadline ended without a value"))?;
        self.last = n;
        self.version = version;
        Ok(n)
    }
}

/// A short random pause after the `lost`-th lost race, to spread the
/// losers out: up to 1, 2, 4 ms, then 8.
async fn pause(lost: u32) {
    let cap = 1000u64 << lost.min(3);
    tokio::time::sleep(Duration::from_micros(fastrand::u64(0..cap))).await;
}

/// Unique, increasing 64-bit IDs across processes and clients (Redisson's
/// `RIdGenerator`), from a [`Counter`]: the first is 1, and an ID once
/// handed out is never handed out again, also after a restart of a server
/// that keeps its data, as long as nothing but sequences changes that
/// counter (a `set` or `compare_and_set` back would reissue IDs). IDs are
/// not gap-free: a block taken and not used, or a change whose reply was
/// lost, leaves a gap.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://sequence-doc").await?;
/// let orders = client.sequence("order-ids")?;
/// assert_eq!(orders.next().await?, 1);
/// assert_eq!(orders.next_block(100).await?, 2..102);
/// assert_eq!(orders.next().await?, 102);
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Sequence {
    counter: Counter,
}

impl Sequence {
    pub(crate) fn new(client: &Client, name: &str) -> Result<Sequence> {
        Ok(Sequence {
            counter: Counter::new(client, name)?,
        })
    }

    /// The sequence's name (its counter's).
    pub fn name(&self) -> &str {
        self.counter.name()
    }

    /// The next ID.
    pub async fn next(&self) -> Result<u64> {
        Ok(self.next_block(1).await?.start)
    }

    /// `n` IDs in a row, for a process to hand out on its own: one round
    /// of the counter for many IDs.
    ///
    /// # Errors
    /// [`InvalidInput`](ErrorKind::InvalidInput) for `n` = 0, or when the
    /// counter holds a negative value (set by hand) or would overflow.
    pub async fn next_block(&self, n: u32) -> Result<std::ops::Range<u64>> {
        if n == 0 {
            return Err(Error::invalid(format!(
                "sequence {:?}: a block of 0 IDs",
                self.name()
            )));
        }
        let n = i64::from(n);
        let last = self
            .counter
            .change(|c| {
                if c < 0 {
                    return Err(Error::invalid(format!(
                        "sequence {:?}: its counter was set to {c}; IDs start at 1",
                        self.name()
                    )));
                }
                c.checked_add(n).ok_or_else(|| {
                    Error::invalid(format!("sequence {:?}: no IDs left", self.name()))
                })
            })
            .await?;
        // `last - n` is the value before, at least 0.
        Ok((last - n + 1) as u64..last as u64 + 1)
    }
}

#[cfg(test)]
mod tests {
    /// A write wakes a watcher of another client at once: on the paused
    /// clock, before the first look of its own (two seconds on), which a
    /// watcher that missed the notification would need.
    #[tokio::test(start_paused = true)]
    async fn a_write_wakes_watchers_before_their_own_look() {
        let ns = format!("memory://watch-{}", uuid::Uuid::new_v4().simple());
        let (a, b) = (
            crate::Client::connect(&ns).await.unwrap(),
            crate::Client::connect(&ns).await.unwrap(),
        );
        let mut watch = b.counter("watched").unwrap().watch().await.unwrap();
        let waiting = tokio::spawn(async move { watch.changed().await });
        tokio::task::yield_now().await;
        a.counter("watched").unwrap().add(2).await.unwrap();
        let got = tokio::time::timeout(crate::core::acquire::MAX_FALLBACK / 2, waiting)
            .await
            .expect("woken by the write, not by a look of its own")
            .unwrap()
            .unwrap();
        assert_eq!(got, 2);
        let gate = a.barrier("gate").unwrap();
        gate.set().await.unwrap();
        let waiter = b.barrier("gate").unwrap();
        let waiting = tokio::spawn(async move { waiter.wait().await });
        tokio::task::yield_now().await;
        gate.remove().await.unwrap();
        tokio::time::timeout(crate::core::acquire::MAX_FALLBACK / 2, waiting)
            .await
            .expect("woken by the removal")
            .unwrap()
            .unwrap();
    }

    /// Many tasks at once go past their optimistic tries and take turns
    /// on the counter's lock: every increment lands, each seeing a value
    /// of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn colliding_writers_take_turns_and_lose_nothing() {
        const TASKS: usize = 50;
        const ADDS: usize = 5;
        let ns = format!("memory://counter-{}", uuid::Uuid::new_v4().simple());
        let client = crate::Client::connect(&ns).await.unwrap();
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let c = client.counter("hot").unwrap();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    for _ in 0..ADDS {
                        seen.push(c.increment().await.unwrap());
                    }
                    seen
                })
            })
            .collect();
        let mut seen = Vec::new();
        for t in tasks {
            seen.extend(t.await.unwrap());
        }
        seen.sort_unstable();
        assert_eq!(seen, (1..=(TASKS * ADDS) as i64).collect::<Vec<_>>());
    }
}
