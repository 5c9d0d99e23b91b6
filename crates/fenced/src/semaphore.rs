//! Counting semaphores: the lock machine with permits, as tokio's `Mutex`
//! is a semaphore of one permit.

use crate::client::Client;
use crate::core::retry::RetryPolicy;
use crate::error::Result;
use crate::guard::Guard;
use crate::lock::Lock;
use crate::options::LockOptions;
use crate::owner::Owner;
use crate::spi::{LockStatus, Mode};
use std::time::Duration;

/// A counting semaphore: at most its number of permits are held at once,
/// across every client of the backend. Each acquisition takes one permit,
/// or [`permits`](Semaphore::permits) of them; the permits of a holder
/// that dies come back when its lease runs out. Made by
/// [`Client::semaphore`]; cheap to clone. The options are those of
/// [`Lock`].
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://").await?;
/// let pool = client.semaphore("db-connections", 3)?;
/// let one = pool.acquire().await?;
/// let two = pool.clone().permits(2).acquire().await?;
/// assert!(pool.try_acquire().await?.is_none());   // all 3 are out
/// drop((one, two));
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    lock: Lock,
}

/// Builder methods that set an option of the underlying [`Lock`].
macro_rules! lock_option {
    ($($name:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {$(
        #[doc = concat!("As [`Lock::", stringify!($name), "`].")]
        pub fn $name(mut self, $($arg: $ty),*) -> Self {
            self.lock = self.lock.$name($($arg),*);
            self
        }
    )*};
}

impl Semaphore {
    pub(crate) fn new(lock: Lock) -> Self {
        Semaphore { lock }
    }

    /// How many permits each acquisition takes (1 by default). A count of
    /// 0, or more than the semaphore has, is refused with
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) when acquiring.
    pub fn permits(mut self, take: u32) -> Self {
        if let Mode::Permits { take: t, .. } = &mut self.lock.mode {
            *t = take;
        }
        self
    }

    /// How many permits the semaphore has in all.
    pub fn max_permits(&self) -> u32 {
        self.lock.mode.permits().1
    }

    lock_option!(
        lease(lease: Duration),
        watchdog(on: bool),
        fixed_lease(lease: Duration),
        fair(fair: bool),
        wait_timeout(wait: Duration),
        retry(policy: RetryPolicy),
        owner(owner: &Owner),
    );

    /// Waits until the permits are held (see [`Lock::acquire`]).
    pub async fn acquire(&self) -> Result<Guard> {
        self.lock.acquire().await
    }

    /// Takes the permits if they are free now (see [`Lock::try_acquire`]).
    pub async fn try_acquire(&self) -> Result<Option<Guard>> {
        self.lock.try_acquire().await
    }

    /// Waits up to `wait` for the permits (see [`Lock::acquire_timeout`]).
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<Guard>> {
        self.lock.acquire_timeout(wait).await
    }

    /// What the backend knows of this semaphore.
    pub async fn status(&self) -> Result<LockStatus> {
        self.lock.status().await
    }

    /// Drops every hold of this semaphore (see [`Lock::force_unlock`]).
    pub async fn force_unlock(&self) -> Result<usize> {
        self.lock.force_unlock().await
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The options acquisitions use.
    pub fn options(&self) -> &LockOptions {
        self.lock.options()
    }

    /// The client it belongs to.
    pub fn client(&self) -> &Client {
        self.lock.client()
    }

    /// The lock machine under it, for what takes any lock (a
    /// [`MultiLock`](crate::MultiLock)).
    pub fn as_lock(&self) -> &Lock {
        &self.lock
    }
}

impl From<Semaphore> for Lock {
    fn from(s: Semaphore) -> Lock {
        s.lock
    }
}
