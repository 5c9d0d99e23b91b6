//! Barriers and count-down latches: a small value in the lock backend
//! that waiters watch, woken by the engine when it is written (Curator's
//! `DistributedBarrier`, Redisson's `RCountDownLatch`).

use crate::client::Client;
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::{RegisterWrite, WriteRule};
use std::time::Duration;
use tokio::time::Instant;

/// What a set barrier's register holds.
const SET: &[u8] = b"1";
/// What a removed barrier's register holds.
const REMOVED: &[u8] = b"0";

/// Lost races after which setting a latch's count gives up.
const MAX_SET_RACES: u32 = 100;

/// A barrier that holds every waiter back while it is set (Curator's
/// `DistributedBarrier`): one process sets it, any number
/// [`wait`](Self::wait), and all go on once it is removed.
///
/// It lives in the register named like the barrier, written `1` while
/// set, and stays set when the process that set it dies (as Curator's
/// persistent node does): remove it by hand (`fenced barrier NAME
/// remove`) if that process is gone for good. Waiters are woken by the
/// engine when the barrier is written, and look again on their own
/// every two seconds in case a notification was lost.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://barrier-doc").await?;
/// let gate = client.barrier("deploy-gate")?;
/// gate.set().await?;
/// let waiter = {
///     let gate = client.barrier("deploy-gate")?;
///     tokio::spawn(async move { gate.wait().await })
/// };
/// assert!(gate.is_set().await?);
/// gate.remove().await?;
/// waiter.await.unwrap()?;
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Barrier {
    client: Client,
    name: LockName,
}

impl Barrier {
    pub(crate) fn new(client: &Client, name: &str) -> Result<Barrier> {
        Ok(Barrier {
            client: client.clone(),
            name: LockName::new(name)?,
        })
    }

    /// The barrier's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// Sets the barrier (again, if set already): waiters wait from now on.
    pub async fn set(&self) -> Result<()> {
        self.write(SET).await
    }

    /// Removes the barrier (if set): every waiter goes on.
    pub async fn remove(&self) -> Result<()> {
        self.write(REMOVED).await
    }

    /// Whether the barrier is set now.
    pub async fn is_set(&self) -> Result<bool> {
        let inner = &self.client.inner;
        let got = inner
            .read("register_read", |b| b.register_read(&self.name))
            .await?;
        self.is_set_in(got)
    }

    /// Waits while the barrier is set; at once if it is not.
    pub async fn wait(&self) -> Result<()> {
        self.wait_until(None).await.map(drop)
    }

    /// Waits while the barrier is set, for at most `timeout`: `true` if it
    /// was removed (or never set), `false` if it was still set then.
    pub async fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        self.wait_until(Some(Instant::now() + timeout)).await
    }

    async fn wait_until(&self, until: Option<Instant>) -> Result<bool> {
        let got = self
            .client
            .inner
            .wait_register(&self.name, until, |raw| {
                Ok((!self.is_set_in(raw)?).then_some(()))
            })
            .await?;
        Ok(got.is_some())
    }

    fn is_set_in(&self, raw: crate::spi::RegisterValue) -> Result<bool> {
        match raw {
            None => Ok(false),
            Some((v, _)) if v == SET => Ok(true),
            Some((v, _)) if v == REMOVED => Ok(false),
            Some((v, _)) => Err(Error::invalid(format!(
                "barrier {:?} holds {:?}, not 1 or 0: the name is used by another kind of value",
                self.name(),
                String::from_utf8_lossy(&v)
            ))),
        }
    }

    async fn write(&self, value: &[u8]) -> Result<()> {
        let inner = &self.client.inner;
        inner
            .write(
                "register_write",
                inner.backend.register_write(RegisterWrite {
                    name: &self.name,
                    value,
                    rule: WriteRule::Always,
                }),
            )
            .await
            .map(drop)
    }
}

/// A count-down latch (Redisson's `RCountDownLatch`): its count is set
/// once, each [`count_down`](Self::count_down) takes one off, and
/// [`wait`](Self::wait) returns once it is zero.
///
/// The count lives in the register named like the latch. Setting it
/// succeeds only while it is zero, so that a latch in use is not set
/// again under its waiters; once it reaches zero it may be set again for
/// another round. A count-down at zero changes nothing. A latch never
/// set counts zero: waiting on it returns at once, as Redisson's does.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://latch-doc").await?;
/// let loaded = client.latch("caches-loaded")?;
/// assert!(loaded.try_set_count(2).await?);
/// assert!(!loaded.try_set_count(5).await?); // in use: not set again
/// loaded.count_down().await?;
/// assert!(!loaded.wait_timeout(std::time::Duration::from_millis(10)).await?);
/// loaded.count_down().await?;
/// loaded.wait().await?;
/// assert_eq!(loaded.count().await?, 0);
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct CountDownLatch {
    value: crate::VersionedValue,
}

impl CountDownLatch {
    pub(crate) fn new(client: &Client, name: &str) -> Result<CountDownLatch> {
        Ok(CountDownLatch {
            value: client.versioned(name)?,
        })
    }

    /// The latch's name.
    pub fn name(&self) -> &str {
        self.value.name()
    }

    /// Sets the count to `count` if it is zero now; whether it did.
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a count of 0
    /// or above 2^53 (what every engine counts exactly).
    pub async fn try_set_count(&self, count: u64) -> Result<bool> {
        if count == 0 || count > 1 << 53 {
            return Err(Error::invalid(format!(
                "latch {:?}: a count of {count}; it takes 1 to 2^53",
                self.name()
            )));
        }
        for _ in 0..MAX_SET_RACES {
            let (n, version) = self.read().await?;
            if n > 0 {
                return Ok(false);
            }
            // A count-down at zero writes nothing, so only another set
            // can change the version under us: then look again.
            if self
                .value
                .compare_and_set(version, count.to_string())
                .await?
            {
                return Ok(true);
            }
        }
        Err(Error::new(
            crate::ErrorKind::TimedOut,
            format!(
                "latch {:?}: other clients set it and it went back to zero \
                 {MAX_SET_RACES} times while this one tried; nothing was set",
                self.name()
            ),
        ))
    }

    /// Takes one off the count, unless it is zero; the count after it.
    pub async fn count_down(&self) -> Result<u64> {
        let inner = &self.value.client().inner;
        let name = self.value.lock_name();
        let after = inner
            .write(
                "register_decrement",
                inner.backend.register_decrement(name, 1),
            )
            .await?;
        Ok(after.map_or(0, |n| n.max(0) as u64))
    }

    /// The count now.
    pub async fn count(&self) -> Result<u64> {
        Ok(self.read().await?.0)
    }

    /// Waits until the count is zero; at once if it is.
    pub async fn wait(&self) -> Result<()> {
        self.wait_until(None).await.map(drop)
    }

    /// Waits until the count is zero, for at most `timeout`: whether it
    /// reached zero.
    pub async fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        self.wait_until(Some(Instant::now() + timeout)).await
    }

    async fn wait_until(&self, until: Option<Instant>) -> Result<bool> {
        let got = self
            .value
            .client()
            .inner
            .wait_register(self.value.lock_name(), until, |raw| {
                Ok((self.parse(raw)?.0 == 0).then_some(()))
            })
            .await?;
        Ok(got.is_some())
    }

    async fn read(&self) -> Result<(u64, u64)> {
        let inner = &self.value.client().inner;
        let name = self.value.lock_name();
        let got = inner
            .read("register_read", |b| b.register_read(name))
            .await?;
        self.parse(got)
    }

    /// The count and the register's version.
    fn parse(&self, raw: crate::spi::RegisterValue) -> Result<(u64, u64)> {
        let Some((v, version)) = raw else {
            return Ok((0, 0));
        };
        let n = std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "latch {:?} holds {:?}, not a count: the name is used by another kind of value",
                    self.name(),
                    String::from_utf8_lossy(&v)
                ))
            })?;
        Ok((n, version))
    }
}
