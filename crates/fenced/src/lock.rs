//! The lock machine's handle, [`Lock`]: one lock in one [`Mode`]. The
//! primitives are thin types over it, as tokio's `Mutex` is a semaphore
//! of one permit: a [`Mutex`](crate::Mutex) is a `Lock` in exclusive
//! mode, a [`RwLock`]'s two sides are `Lock`s that share a name, and a
//! [`Semaphore`](crate::Semaphore) is a `Lock` with permits. Each has only
//! the methods that mean something for it; what takes any lock (a
//! [`MultiLock`](crate::MultiLock)) takes a `Lock`.

use crate::client::Client;
use crate::core::acquire::{self, Wait};
use crate::core::retry::RetryPolicy;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::Guard;
use crate::name::LockName;
use crate::options::{Lease, LockOptions};
use crate::owner::Owner;
use crate::spi::{LockStatus, Mode};
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

/// A handle on one lock in one [`Mode`]; acquiring it yields a [`Guard`].
///
/// The sides of a [`RwLock`] are `Lock`s, and a [`Mutex`](crate::Mutex)
/// or a [`Semaphore`](crate::Semaphore) turns into one (`Lock::from`) for
/// what takes any lock. Cheap to clone. The builder methods set options
/// for the acquisitions made through this handle:
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::time::Duration;
/// let client = fenced::Client::connect("memory://").await?;
/// let read = client.rwlock("config")?.read().lease(Duration::from_secs(10));
/// let guard = read.acquire().await?;
/// assert_eq!(read.mode(), fenced::Mode::Shared);
/// # drop(guard);
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct Lock {
    pub(crate) client: Client,
    pub(crate) name: LockName,
    pub(crate) mode: Mode,
    pub(crate) opts: LockOptions,
    /// What it is for: a read-write lock's side or an election's
    /// candidacy rather than a mutex or semaphore (backends with distinct
    /// layouts for them, like Curator's, name their nodes apart).
    pub(crate) kind: crate::spi::Kind,
}

impl Lock {
    pub(crate) fn new(client: Client, name: LockName, mode: Mode) -> Self {
        Lock {
            client,
            name,
            mode,
            opts: LockOptions::default(),
            kind: crate::spi::Kind::Lock,
        }
    }

    /// The lease, kept as renewed or fixed as it was (renewed by default).
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.opts.lease = match self.opts.lease {
            Lease::Renewed(_) => Lease::Renewed(lease),
            Lease::Fixed(_) => Lease::Fixed(lease),
        };
        self
    }

    /// Turns watchdog renewal on (the default) or off.
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn watchdog(mut self, on: bool) -> Self {
        let d = self.opts.lease.duration();
        self.opts.lease = if on {
            Lease::Renewed(d)
        } else {
            Lease::Fixed(d)
        };
        self
    }

    /// A lease that is never renewed: the hold ends after `lease` and the
    /// guard's lost signal fires then.
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn fixed_lease(self, lease: Duration) -> Self {
        self.lease(lease).watchdog(false)
    }

    /// First come, first served among fair waiters. Waiters that are not
    /// fair may still barge in: that is quicker when a lock is rarely
    /// contended, but under steady contention the process that just let
    /// go, already running, would win again and again. So on Redis a
    /// release that wakes a queued waiter keeps the lock for it against
    /// unfair requests for a moment (10 ms), as Go's `sync.Mutex` hands
    /// over to a starving waiter.
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn fair(mut self, fair: bool) -> Self {
        self.opts.fair = fair;
        self
    }

    /// How long [`acquire`](Lock::acquire) waits before it fails with
    /// [`TimedOut`](ErrorKind::TimedOut); `Duration::ZERO` makes it fail
    /// at once with [`WouldBlock`](ErrorKind::WouldBlock). Unset: for ever.
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn wait_timeout(mut self, wait: Duration) -> Self {
        self.opts.wait_timeout = Some(wait);
        self
    }

    /// The policy for retrying transient backend errors while acquiring.
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.opts.retry = policy;
        self
    }

    /// Acquire on behalf of `owner`, for reentrancy: acquisitions of one
    /// owner nest into one hold (the hold count rises; the lock is
    /// released when it falls back to zero), and a writer of a read-write
    /// lock may take read. Without an owner (the default) every
    /// acquisition is its own owner, unless it runs inside
    /// [`Owner::scope`].
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn owner(mut self, owner: &Owner) -> Self {
        self.opts.owner = Some(owner.clone());
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// How this handle holds the lock.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The options set on this handle.
    pub fn options(&self) -> &LockOptions {
        &self.opts
    }

    /// The client this handle was made from.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Acquires through the core, checked first; the hold becomes a guard.
    async fn run(&self, wait: Wait) -> Result<Option<Guard>> {
        self.check()?;
        let engine = &self.client.inner;
        let req = acquire::Request {
            name: &self.name,
            mode: self.mode,
            kind: self.kind,
            lease: self.opts.lease.duration(),
            renewed: self.opts.lease.is_renewed(),
            fair: self.opts.fair,
            retry: &self.opts.retry,
            owner: self
                .opts
                .owner
                .clone()
                .or_else(crate::Owner::current)
                .map(|o| o.id().to_owned()),
        };
        let started = Instant::now();
        let hold = acquire::run(engine, req, wait).await;
        let outcome = match &hold {
            Ok(Some(_)) => "granted",
            Ok(None) => "busy",
            Err(_) => "error",
        };
        crate::core::metrics::acquired(engine.backend.scheme(), outcome, started.elapsed());
        Ok(hold?.map(|h| Guard::new(h, engine.clone())))
    }

    pub(crate) fn check(&self) -> Result<()> {
        if let Mode::Permits { take, max } = self.mode
            && (take == 0 || take > max)
        {
            return Err(Error::invalid(format!(
                "semaphore {:?} has {max} permits; cannot take {take}",
                self.name.as_str()
            )));
        }
        self.opts.validate()?;
        if self.opts.fair && !self.client.inner.backend.supports_fair() {
            return Err(Error::invalid(format!(
                "the {} backend has no fair mode",
                self.client.inner.backend.scheme()
            )));
        }
        Ok(())
    }

    /// Waits until the lock is held (or the [`wait_timeout`](Lock::wait_timeout) passes).
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind: a queue place or a grant
    /// that raced with the drop is withdrawn in the background.
    pub async fn acquire(&self) -> Result<Guard> {
        let wait = match self.opts.wait_timeout {
            None => Wait::Until(None),
            Some(d) if d.is_zero() => Wait::No,
            // A wait too long for the clock to reach is a wait for ever.
            Some(d) => Wait::Until(Instant::now().checked_add(d)),
        };
        match self.run(wait).await? {
            Some(guard) => Ok(guard),
            None => Err(match self.opts.wait_timeout {
                Some(d) if !d.is_zero() => Error::new(
                    ErrorKind::TimedOut,
                    format!("lock {:?} was not acquired within {d:?}", self.name()),
                ),
                _ => Error::new(
                    ErrorKind::WouldBlock,
                    format!("lock {:?} is held", self.name()),
                ),
            }),
        }
    }

    /// Takes the lock if it is free now; `Ok(None)` if it is not. Never waits.
    ///
    /// # Cancel safety
    /// As for [`acquire`](Lock::acquire).
    pub async fn try_acquire(&self) -> Result<Option<Guard>> {
        self.run(Wait::No).await
    }

    /// Waits up to `wait` for the lock; `Ok(None)` if it was not had in time.
    ///
    /// # Cancel safety
    /// As for [`acquire`](Lock::acquire).
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<Guard>> {
        let w = if wait.is_zero() {
            Wait::No
        } else {
            Wait::Until(Instant::now().checked_add(wait))
        };
        self.run(w).await
    }

    /// What the backend knows of this lock.
    pub async fn status(&self) -> Result<LockStatus> {
        self.client
            .inner
            .read("status", |b| b.status(&self.name))
            .await
    }

    /// Drops every hold of this lock, whoever holds it: an operator's
    /// "break lock" (Redisson's `forceUnlock`). The holders' lost signals
    /// fire at their next renewal. Returns how many holds were dropped.
    pub async fn force_unlock(&self) -> Result<usize> {
        let inner = &self.client.inner;
        inner
            .write("force_release", inner.backend.force_release(&self.name))
            .await
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("mode", &self.mode)
            .field("options", &self.opts)
            .finish()
    }
}

/// A read-write lock: many readers, or one writer. With a named
/// [`Owner`] it is reentrant per owner, and a writer may also take read
/// (and keeps it after releasing write: the downgrade); a reader asking
/// for write is refused with [`InvalidInput`](ErrorKind::InvalidInput):
/// two readers upgrading at once would wait on each other for ever.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://").await?;
/// let rw = client.rwlock("config")?;
/// let a = rw.read().acquire().await?;
/// let b = rw.read().acquire().await?;                       // readers share
/// assert!(rw.write().try_acquire().await?.is_none());       // no writer beside them
/// // A reader asking for write is refused: it could deadlock.
/// let reader = fenced::Owner::new();
/// let c = rw.read().owner(&reader).acquire().await?;
/// let err = rw.write().owner(&reader).try_acquire().await.unwrap_err();
/// assert_eq!(err.kind(), fenced::ErrorKind::InvalidInput);
/// # drop((a, b, c));
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct RwLock {
    client: Client,
    name: LockName,
}

impl RwLock {
    pub(crate) fn new(client: Client, name: LockName) -> Self {
        RwLock { client, name }
    }

    /// The read side: shared with other readers.
    pub fn read(&self) -> Lock {
        Lock {
            kind: crate::spi::Kind::ReadWrite,
            ..Lock::new(self.client.clone(), self.name.clone(), Mode::Shared)
        }
    }

    /// The write side: exclusive.
    pub fn write(&self) -> Lock {
        Lock {
            kind: crate::spi::Kind::ReadWrite,
            ..Lock::new(self.client.clone(), self.name.clone(), Mode::Exclusive)
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }
}

/// The methods a thin primitive type (a struct with a `lock: Lock` field)
/// passes to the [`Lock`] under it: the builder options, acquiring,
/// status, and the way back to a `Lock`. `$what` names the primitive in
/// the docs, `$held` what an acquisition holds, with its verb.
macro_rules! thin_lock {
    ($what:literal, $held:literal) => {
        crate::lock::thin_lock!(@options
            lease(lease: std::time::Duration),
            watchdog(on: bool),
            fixed_lease(lease: std::time::Duration),
            fair(fair: bool),
            wait_timeout(wait: std::time::Duration),
            retry(policy: crate::RetryPolicy),
            owner(owner: &crate::Owner),
        );

        #[doc = concat!("Waits until ", $held, " held (see [`Lock::acquire`](crate::Lock::acquire)).")]
        ///
        /// # Cancel safety
        /// Dropping the future leaves nothing behind (see [`Lock::acquire`](crate::Lock::acquire)).
        pub async fn acquire(&self) -> crate::Result<crate::Guard> {
            self.lock.acquire().await
        }

        #[doc = concat!("Acquires if ", $held, " free now; `Ok(None)` if not (see [`Lock::try_acquire`](crate::Lock::try_acquire)).")]
        pub async fn try_acquire(&self) -> crate::Result<Option<crate::Guard>> {
            self.lock.try_acquire().await
        }

        #[doc = concat!("Waits up to `wait` until ", $held, " held; `Ok(None)` if not in time (see [`Lock::acquire_timeout`](crate::Lock::acquire_timeout)).")]
        pub async fn acquire_timeout(
            &self,
            wait: std::time::Duration,
        ) -> crate::Result<Option<crate::Guard>> {
            self.lock.acquire_timeout(wait).await
        }

        #[doc = concat!("What the backend knows of this ", $what, ".")]
        pub async fn status(&self) -> crate::Result<crate::LockStatus> {
            self.lock.status().await
        }

        #[doc = concat!("Drops every hold of this ", $what, ", whoever holds it (see [`Lock::force_unlock`](crate::Lock::force_unlock)).")]
        pub async fn force_unlock(&self) -> crate::Result<usize> {
            self.lock.force_unlock().await
        }

        #[doc = concat!("The ", $what, "'s name.")]
        pub fn name(&self) -> &str {
            self.lock.name()
        }

        /// The options acquisitions use.
        pub fn options(&self) -> &crate::LockOptions {
            self.lock.options()
        }

        /// The client it belongs to.
        pub fn client(&self) -> &crate::Client {
            self.lock.client()
        }

        /// The lock machine under it, for what takes any lock (a
        /// [`MultiLock`](crate::MultiLock)).
        pub fn as_lock(&self) -> &crate::Lock {
            &self.lock
        }
    };
    (@options $($name:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {$(
        #[doc = concat!("As [`Lock::", stringify!($name), "`](crate::Lock::", stringify!($name), ").")]
        #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
        pub fn $name(mut self, $($arg: $ty),*) -> Self {
            self.lock = self.lock.$name($($arg),*);
            self
        }
    )*};
}
pub(crate) use thin_lock;
