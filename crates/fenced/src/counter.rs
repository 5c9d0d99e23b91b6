//! Shared counters and ID sequences: a 64-bit integer in the lock backend
//! that every client changes atomically (Curator's `SharedCount` and
//! `DistributedAtomicLong`, Redisson's `RAtomicLong` and `RIdGenerator`),
//! written once over the store every backend has: a versioned
//! compare-and-set, promoted to a lock when writers keep colliding.

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};
use crate::mutex::Mutex;
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

/// A shared 64-bit counter.
///
/// Stored as the decimal text of the value in the register named like the
/// counter (so a [`VersionedValue`] or [`FencedRegister`](crate::FencedRegister)
/// of that name reads it), 0 until first changed. Every change is a
/// compare-and-set of that register; when writers keep colliding, a
/// change waits for the mutex named `<name>:counter` and tries again
/// holding it, so many writers take turns rather than race for ever.
///
/// A change whose reply was lost (an error of kind
/// [`Unavailable`](ErrorKind::Unavailable) or [`TimedOut`](ErrorKind::TimedOut))
/// may have been made: as with Redis's `INCR`, only a read tells.
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
}

impl Counter {
    pub(crate) fn new(client: &Client, name: &str) -> Result<Counter> {
        Ok(Counter {
            value: client.versioned(name)?,
            lock: client.mutex(&format!("{name}:counter"))?,
        })
    }

    /// The counter's name.
    pub fn name(&self) -> &str {
        self.value.name()
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
        for _ in 0..=MAX_CONFLICTS {
            let (n, version) = self.read().await?;
            if n != expected {
                return Ok(false);
            }
            if self.value.compare_and_set(version, new.to_string()).await? {
                return Ok(true);
            }
            // Another writer changed it: it may be `expected` again.
        }
        Err(self.too_contended())
    }

    /// The value and the register's version.
    async fn read(&self) -> Result<(i64, u64)> {
        let Some(v) = self.value.read().await? else {
            return Ok((0, 0));
        };
        let n = std::str::from_utf8(&v.value)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "counter {:?} holds {:?}, not an integer: the name is used by \
                     another kind of value",
                    self.name(),
                    String::from_utf8_lossy(&v.value)
                ))
            })?;
        Ok((n, v.version))
    }

    /// One compare-and-set of `f(value)`; `None` when another writer won.
    async fn try_change(&self, f: &impl Fn(i64) -> Result<i64>) -> Result<Option<i64>> {
        let (n, version) = self.read().await?;
        let next = f(n)?;
        let won = self
            .value
            .compare_and_set(version, next.to_string())
            .await?;
        Ok(won.then_some(next))
    }

    /// Applies `f` by compare-and-set, optimistically a few times, then
    /// holding the counter's lock.
    async fn change(&self, f: impl Fn(i64) -> Result<i64>) -> Result<i64> {
        for lost in 0..OPTIMISTIC_TRIES {
            if let Some(v) = self.try_change(&f).await? {
                return Ok(v);
            }
            // Spread the losers out: up to 1, 2, 4 ms.
            let cap = 1000u64 << lost;
            tokio::time::sleep(Duration::from_micros(fastrand::u64(0..cap))).await;
        }
        let guard = self.lock.acquire().await?;
        let mut outcome = Err(self.too_contended());
        for _ in 0..MAX_CONFLICTS {
            match self.try_change(&f).await {
                Ok(None) => continue,
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
                "counter {:?}: other writers won {MAX_CONFLICTS} races in a row",
                self.name()
            ),
        )
    }
}

/// Unique, increasing 64-bit IDs across processes and clients (Redisson's
/// `RIdGenerator`), from a [`Counter`]: the first is 1, and an ID once
/// handed out is never handed out again, also after a restart of a server
/// that keeps its data. IDs are not gap-free: a block taken and not used,
/// or a change whose reply was lost, leaves a gap.
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
        let last = self.counter.add(i64::from(n)).await?;
        let first = last - i64::from(n) + 1;
        if first < 1 {
            return Err(Error::invalid(format!(
                "sequence {:?}: its counter was set to a negative value; IDs start at 1",
                self.name()
            )));
        }
        Ok(first as u64..last as u64 + 1)
    }
}
