//! A blocking API for callers without an async runtime, in the manner of
//! `reqwest::blocking`: each [`Client`] runs the async [`crate::Client`]
//! on a runtime of its own (one worker thread, which also renews leases
//! while the caller's thread works), and each call waits for its answer.
//!
//! ```
//! use std::time::Duration;
//! let client = fenced::blocking::Client::connect("memory://")?;
//! let lock = client.mutex("nightly-report")?.lease(Duration::from_secs(60));
//! if let Some(guard) = lock.try_acquire()? {
//!     // ... the work, writing with guard.fencing_token() ...
//!     assert!(guard.is_held());
//!     guard.release()?;
//! }
//! # Ok::<_, fenced::Error>(())
//! ```
//!
//! The same guarantees hold as in the async API: a dropped [`Guard`]
//! queues its release, and when the last handle of a client goes (the
//! client, its locks and guards), the client is closed, which sends those
//! releases before the runtime stops (bounded by three request timeouts).
//! Handles of the async client taken from [`Client::as_async`] do not keep
//! the runtime alive.
//!
//! Calls may be made from any thread but the client's own runtime thread,
//! also from inside another async runtime (they block that thread, as any
//! blocking call does there; an async caller should use [`crate::Client`]).
//! On the client's own thread (inside a future given to
//! [`Client::block_on`]) a call would wait for itself: it fails with
//! [`InvalidInput`](crate::ErrorKind::InvalidInput) instead. Anything the
//! typed methods do not cover runs through [`Client::block_on`] with the
//! async API; such a future shares the thread that renews leases, so it
//! must not block.
//!
//! Dropping the last handle of a client (itself, or its last guard) waits
//! for the client to close: up to three request timeouts (15 s by
//! default) when the server does not answer.

use crate::error::{Error, Result};
use crate::spi::LockStatus;
use crate::{LostReason, Mode};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

std::thread_local! {
    /// The blocking runtime this thread belongs to (0: none).
    static RUNTIME: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Ids of blocking runtimes, from 1.
static NEXT_RUNTIME: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A blocking client's runtime: one worker thread, which knows it is one.
struct Rt {
    rt: tokio::runtime::Runtime,
    id: u64,
}

impl Rt {
    fn start() -> Result<Rt> {
        let id = NEXT_RUNTIME.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fenced-blocking")
            .on_thread_start(move || RUNTIME.with(|r| r.set(id)))
            .enable_all()
            .build()
            .map_err(|e| {
                Error::unavailable(format!("cannot start the blocking client's runtime: {e}"))
                    .with_source(e)
            })?;
        Ok(Rt { rt, id })
    }

    /// Whether this thread is one of the runtime's own.
    fn is_own_thread(&self) -> bool {
        RUNTIME.with(|r| r.get()) == self.id
    }

    /// Runs `f` on the runtime and waits for its output on this thread. A
    /// std channel, not `Runtime::block_on`: that refuses to run inside
    /// another runtime's context, which a blocking caller may well be in.
    fn run<F>(&self, f: F) -> Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        if self.is_own_thread() {
            return Err(Error::invalid(
                "a blocking call on the blocking client's own runtime thread (inside \
                 Client::block_on) would wait for itself; use the async API there",
            ));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.rt.spawn(async move {
            let _ = tx.send(f.await);
        });
        // The sender goes without a value only when the future panicked.
        rx.recv()
            .map_err(|_| Error::unavailable("a blocking call's future panicked"))
    }
}

/// The runtime and the async client on it; closes the client when the
/// last handle goes.
struct Shared {
    client: crate::Client,
    rt: Option<Rt>,
}

impl Shared {
    fn run<F>(&self, f: F) -> Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.rt {
            Some(rt) => rt.run(f),
            None => Err(Error::unavailable("the blocking client is closed")),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let Some(rt) = self.rt.take() else {
            return;
        };
        // Releases queued by dropped guards go out before the runtime
        // stops; `close` is bounded by two request timeouts.
        let client = self.client.clone();
        let limit = client.request_timeout() * 3;
        let own_thread = rt.is_own_thread();
        let close = move || {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            rt.rt.spawn(async move {
                client.close().await;
                let _ = tx.send(());
            });
            let _ = rx.recv_timeout(limit);
            // Not `drop(rt)`, which panics inside another runtime's context.
            rt.rt.shutdown_background();
        };
        if own_thread {
            // The last handle went on the runtime's only worker (a guard
            // dropped inside `block_on`): waiting here would keep `close`
            // from running, so another thread waits for it.
            std::thread::spawn(close);
        } else {
            close();
        }
    }
}

/// A blocking handle on a backend: the async [`crate::Client`] on a
/// runtime of its own. Cheap to clone; clones share the runtime and the
/// backend's connections.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

impl Client {
    /// Connects to the backend `url` names (see [`crate::Client::connect`]).
    ///
    /// # Errors
    /// As [`crate::Client::connect`]; [`Unavailable`](crate::ErrorKind::Unavailable)
    /// also when the runtime cannot be started.
    pub fn connect(url: &str) -> Result<Client> {
        let url = url.to_owned();
        Client::start(async move { crate::Client::connect(&url).await })
    }

    /// Connects to the backend in `FENCED_BACKEND`, else the host's
    /// SQLite file (see [`crate::Client::from_env`]).
    ///
    /// # Errors
    /// As [`crate::Client::from_env`].
    pub fn from_env() -> Result<Client> {
        Client::start(crate::Client::from_env())
    }

    fn start(
        connect: impl Future<Output = Result<crate::Client>> + Send + 'static,
    ) -> Result<Client> {
        let rt = Rt::start()?;
        let client = rt.run(connect);
        match client {
            Ok(Ok(client)) => Ok(Client {
                shared: Arc::new(Shared {
                    client,
                    rt: Some(rt),
                }),
            }),
            Ok(Err(e)) | Err(e) => {
                rt.rt.shutdown_background();
                Err(e)
            }
        }
    }

    /// The async client underneath, for what this API does not wrap
    /// (with [`block_on`](Self::block_on)).
    pub fn as_async(&self) -> &crate::Client {
        &self.shared.client
    }

    /// Runs a future of the async API on this client's runtime and waits
    /// for it.
    ///
    /// ```
    /// let client = fenced::blocking::Client::connect("memory://")?;
    /// let register = client.as_async().register("config")?;
    /// let value = client.block_on(async move { register.read().await })??;
    /// assert!(value.is_none());
    /// # Ok::<_, fenced::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Unavailable`](crate::ErrorKind::Unavailable) if the future
    /// panicked; [`InvalidInput`](crate::ErrorKind::InvalidInput) when
    /// called on the client's own runtime thread (from inside another
    /// `block_on`'s future).
    pub fn block_on<F>(&self, f: F) -> Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.shared.run(f)
    }

    /// A mutex (see [`crate::Client::mutex`]).
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name.
    pub fn mutex(&self, name: &str) -> Result<Lock> {
        Ok(self.lock(self.shared.client.mutex(name)?))
    }

    /// The read side of read-write lock `name` (see [`crate::Client::rwlock`]).
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name.
    pub fn read_lock(&self, name: &str) -> Result<Lock> {
        Ok(self.lock(self.shared.client.rwlock(name)?.read()))
    }

    /// The write side of read-write lock `name`.
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name.
    pub fn write_lock(&self, name: &str) -> Result<Lock> {
        Ok(self.lock(self.shared.client.rwlock(name)?.write()))
    }

    /// A semaphore of `permits`, each acquisition taking one (see
    /// [`crate::Client::semaphore`]; for more at once, wrap
    /// `client.as_async().semaphore(name, permits)?.permits(n)` with
    /// [`lock`](Self::lock)).
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a bad name or count.
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Lock> {
        Ok(self.lock(self.shared.client.semaphore(name, permits)?))
    }

    /// Any lock of the async API, made blocking.
    pub fn lock(&self, lock: impl Into<crate::Lock>) -> Lock {
        Lock {
            inner: lock.into(),
            shared: self.shared.clone(),
        }
    }

    /// What the backend knows of lock `name` (see [`crate::Client::status`]).
    ///
    /// # Errors
    /// As [`crate::Client::status`].
    pub fn status(&self, name: &str) -> Result<LockStatus> {
        let (client, name) = (self.shared.client.clone(), name.to_owned());
        self.shared
            .run(async move { client.status(&name).await })
            .and_then(|r| r)
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Client")
            .field(&self.shared.client)
            .finish()
    }
}

/// One lock in one mode, blocking: [`crate::Lock`]'s options and
/// acquisitions.
#[derive(Clone)]
pub struct Lock {
    inner: crate::Lock,
    shared: Arc<Shared>,
}

macro_rules! option {
    ($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*)) => {
        $(#[$doc])*
        #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
        pub fn $name(self, $($arg: $ty),*) -> Self {
            Lock {
                inner: self.inner.$name($($arg),*),
                shared: self.shared,
            }
        }
    };
}

impl Lock {
    option!(
        /// The lease of each hold (see [`crate::Lock::lease`]).
        lease(lease: Duration)
    );
    option!(
        /// Whether the watchdog renews the lease (see [`crate::Lock::watchdog`]).
        watchdog(on: bool)
    );
    option!(
        /// A lease that is never renewed (see [`crate::Lock::fixed_lease`]).
        fixed_lease(lease: Duration)
    );
    option!(
        /// First come, first served (see [`crate::Lock::fair`]).
        fair(fair: bool)
    );
    option!(
        /// How long [`acquire`](Self::acquire) waits at most (see
        /// [`crate::Lock::wait_timeout`]).
        wait_timeout(wait: Duration)
    );

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// How it is held.
    pub fn mode(&self) -> Mode {
        self.inner.mode()
    }

    fn guard(&self, g: crate::Guard) -> Guard {
        Guard {
            inner: g,
            shared: self.shared.clone(),
        }
    }

    /// Waits until the lock is had (see [`crate::Lock::acquire`]).
    ///
    /// # Errors
    /// As [`crate::Lock::acquire`].
    pub fn acquire(&self) -> Result<Guard> {
        let lock = self.inner.clone();
        let g = self.shared.run(async move { lock.acquire().await })??;
        Ok(self.guard(g))
    }

    /// One try: the guard, or `None` when the lock is busy.
    ///
    /// # Errors
    /// As [`crate::Lock::try_acquire`].
    pub fn try_acquire(&self) -> Result<Option<Guard>> {
        let lock = self.inner.clone();
        let g = self.shared.run(async move { lock.try_acquire().await })??;
        Ok(g.map(|g| self.guard(g)))
    }

    /// Waits up to `wait`: the guard, or `None` when the lock was not had.
    ///
    /// # Errors
    /// As [`crate::Lock::acquire_timeout`].
    pub fn acquire_timeout(&self, wait: Duration) -> Result<Option<Guard>> {
        let lock = self.inner.clone();
        let g = self
            .shared
            .run(async move { lock.acquire_timeout(wait).await })??;
        Ok(g.map(|g| self.guard(g)))
    }

    /// What the backend knows of this lock.
    ///
    /// # Errors
    /// As [`crate::Lock::status`].
    pub fn status(&self) -> Result<LockStatus> {
        let lock = self.inner.clone();
        self.shared.run(async move { lock.status().await })?
    }
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Lock").field(&self.inner).finish()
    }
}

/// A hold, blocking: [`crate::Guard`]. Dropping it queues its release, as
/// the async guard's drop does.
#[must_use = "dropping a guard releases the lock at once"]
pub struct Guard {
    // Dropped first: its release is queued before the runtime may stop.
    inner: crate::Guard,
    shared: Arc<Shared>,
}

impl Guard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The fencing token of this hold (see [`crate::Guard::fencing_token`]).
    pub fn fencing_token(&self) -> u64 {
        self.inner.fencing_token()
    }

    /// Whether the hold is still believed, with no round trip (see
    /// [`crate::Guard::is_held`]).
    pub fn is_held(&self) -> bool {
        self.inner.is_held()
    }

    /// Lease left as last confirmed by the backend.
    pub fn lease_left(&self) -> Duration {
        self.inner.lease_left()
    }

    /// Waits up to `wait` for the hold to be lost: why, or `None` if it is
    /// still held (see [`crate::Guard::lost`]).
    ///
    /// # Errors
    /// [`Unavailable`](crate::ErrorKind::Unavailable) if the client's
    /// runtime stopped.
    pub fn lost_within(&self, wait: Duration) -> Result<Option<LostReason>> {
        let lost = self.inner.lost();
        self.shared
            .run(async move { tokio::time::timeout(wait, lost).await.ok() })
    }

    /// Releases the hold; `true` if it was still held (see
    /// [`crate::Guard::release`]).
    ///
    /// # Errors
    /// As [`crate::Guard::release`].
    pub fn release(self) -> Result<bool> {
        let Guard { inner, shared } = self;
        shared.run(async move { inner.release().await })?
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::Guard").field(&self.inner).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// Threads sharing one blocking client exclude each other, as tasks
    /// sharing one async client do.
    #[test]
    fn threads_sharing_one_client_exclude_each_other() {
        let client = Client::connect("memory://blocking-threads").unwrap();
        let (inside, count) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (client, inside, count) = (client.clone(), inside.clone(), count.clone());
                std::thread::spawn(move || {
                    let lock = client.mutex("counter").unwrap();
                    for _ in 0..50 {
                        let g = lock.acquire().unwrap();
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        // A read-modify-write that only the lock keeps whole.
                        let n = count.load(Ordering::SeqCst);
                        std::thread::yield_now();
                        count.store(n + 1, Ordering::SeqCst);
                        inside.store(false, Ordering::SeqCst);
                        assert!(g.release().unwrap());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 400);
    }

    /// A guard dropped just before its client goes is released at once,
    /// not when its lease (30 s) runs out: the last handle closes the
    /// client, which sends the queued release before the runtime stops.
    #[cfg(feature = "sqlite")]
    #[test]
    fn the_last_handle_sends_the_releases_of_dropped_guards() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        let other = Client::connect(&url).unwrap();
        for _ in 0..3 {
            let client = Client::connect(&url).unwrap();
            let guard = client.mutex("job").unwrap().acquire().unwrap();
            assert!(other.mutex("job").unwrap().try_acquire().unwrap().is_none());
            drop(client);
            assert!(guard.is_held(), "the guard keeps its client alive");
            drop(guard);
            let next = other.mutex("job").unwrap().try_acquire().unwrap();
            assert!(next.is_some(), "released when the last handle went");
        }
    }

    /// Blocking calls work from inside an async runtime too (on its
    /// thread, which they block) and in `spawn_blocking`, and dropping the
    /// client there does not panic.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn blocking_calls_work_inside_an_async_runtime() {
        let client = Client::connect("memory://blocking-async").unwrap();
        let g = client.mutex("x").unwrap().acquire().unwrap();
        let c2 = client.clone();
        let busy = tokio::task::spawn_blocking(move || {
            c2.mutex("x").unwrap().try_acquire().unwrap().is_none()
        })
        .await
        .unwrap();
        assert!(busy);
        assert!(g.release().unwrap());
        drop(client);
    }

    /// On the client's own runtime thread a blocking call would wait for
    /// itself: it is refused instead; and the last handle dropped there
    /// still sends its release.
    #[cfg(feature = "sqlite")]
    #[test]
    fn the_runtime_thread_is_refused_blocking_calls_and_still_closes() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("locks.db").display());
        let client = Client::connect(&url).unwrap();
        let inner = client.clone();
        let refused = client
            .block_on(async move { inner.mutex("x").unwrap().try_acquire().map(|g| g.is_some()) })
            .unwrap();
        let e = refused.expect_err("a blocking call on the runtime's own thread");
        assert_eq!(e.kind(), crate::ErrorKind::InvalidInput, "{e}");
        // The last handle, a guard, dropped on the runtime's thread.
        let guard = client.mutex("y").unwrap().acquire().unwrap();
        let runner = client.clone();
        drop(client);
        // A task on the runtime keeps the guard a little and drops it
        // after the runner's handle went: the last handle, on the
        // runtime's own thread.
        runner
            .block_on(async move {
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    drop(guard);
                });
            })
            .unwrap();
        drop(runner);
        let other = Client::connect(&url).unwrap();
        let lock = other.mutex("y").unwrap();
        // Released by the client's close on another thread, not by the
        // lease (30 s): well within the wait.
        assert!(
            lock.acquire_timeout(Duration::from_secs(10))
                .unwrap()
                .is_some()
        );
    }

    /// A fixed lease runs out and the guard says why.
    #[test]
    fn a_guard_hears_its_hold_lost() {
        let client = Client::connect("memory://blocking-lost").unwrap();
        let lock = client.mutex("short").unwrap().fixed_lease(crate::MIN_LEASE);
        let g = lock.acquire().unwrap();
        let why = g.lost_within(Duration::from_secs(60)).unwrap();
        assert_eq!(why, Some(LostReason::Expired));
        assert!(!g.is_held());
        assert!(!g.release().unwrap(), "nothing left to release");
    }
}
