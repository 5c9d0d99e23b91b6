//! Mutexes: the lock machine in its exclusive mode, as tokio's `Mutex` is
//! a semaphore of one permit.

use crate::lock::Lock;

/// A distributed mutex: one holder at a time across every client of the
/// backend. Made by [`Client::mutex`](crate::Client::mutex); cheap to
/// clone. The builder methods set options for the acquisitions made
/// through this handle:
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::time::Duration;
/// let client = fenced::Client::connect("memory://").await?;
/// let mutex = client
///     .mutex("reports:nightly")?
///     .lease(Duration::from_secs(10))   // renewed every ~3.3 s while held
///     .fair(true)                       // first come, first served
///     .wait_timeout(Duration::from_secs(5));
/// let guard = mutex.acquire().await?;   // TimedOut after 5 s of waiting
/// // Every acquisition is its own owner: another one, even through this
/// // very handle, waits (here: gives up at once) ...
/// assert!(mutex.try_acquire().await?.is_none());
/// drop(guard);
/// // ... unless one owner is named for both (reentrancy).
/// let me = fenced::Owner::new();
/// let outer = mutex.clone().owner(&me).acquire().await?;
/// let nested = mutex.clone().owner(&me).acquire().await?;
/// assert_eq!(nested.fencing_token(), outer.fencing_token());
/// assert_eq!(nested.hold_count(), 2);
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Mutex {
    lock: Lock,
}

impl Mutex {
    pub(crate) fn new(lock: Lock) -> Self {
        Mutex { lock }
    }

    /// The same mutex as an election's candidacy (Curator's leader latch
    /// on ZooKeeper names its nodes apart from a mutex's).
    pub(crate) fn for_election(mut self) -> Self {
        self.lock.kind = crate::spi::Kind::Election;
        self
    }

    crate::lock::thin_lock!("mutex", "the lock is");
}

impl From<Mutex> for Lock {
    fn from(m: Mutex) -> Lock {
        m.lock
    }
}
