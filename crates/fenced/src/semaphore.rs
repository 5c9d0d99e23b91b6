//! Counting semaphores: the lock machine with permits, as tokio's `Mutex`
//! is a semaphore of one permit.

use crate::lock::Lock;
use crate::spi::Mode;

/// A counting semaphore: at most its number of permits are held at once,
/// across every client of the backend. Each acquisition takes one permit,
/// or [`permits`](Semaphore::permits) of them; the permits of a holder
/// that dies come back when its lease runs out. Made by
/// [`Client::semaphore`](crate::Client::semaphore); cheap to clone. The options are those of
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

impl Semaphore {
    pub(crate) fn new(lock: Lock) -> Self {
        Semaphore { lock }
    }

    /// The same semaphore as a double barrier's membership: where the
    /// engine has a layout of its own for double barriers (Curator's on
    /// ZooKeeper), a permit is a member's node there.
    pub(crate) fn for_barrier(mut self) -> Self {
        self.lock.kind = crate::spi::Kind::Member;
        self
    }

    /// How many permits each acquisition takes (1 by default). A count of
    /// 0, or more than the semaphore has, is refused with
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) when acquiring.
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
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

    crate::lock::thin_lock!("semaphore", "the permits are");
}

impl From<Semaphore> for Lock {
    fn from(s: Semaphore) -> Lock {
        s.lock
    }
}
