//! MultiLock: several locks taken all or nothing.

use crate::core::hold::LostReason;
use crate::error::Result;
use crate::guard::Guard;
use crate::lock::Lock;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// Several locks acquired as one, all or nothing (Redisson's `MultiLock`),
/// over any mix of backends and modes.
///
/// Locks are taken one by one in a canonical order (the backend's
/// identity, then name), whatever order they were given in, so two
/// MultiLocks over overlapping sets cannot deadlock each other. The
/// identity is the backend's own, not its URL's spelling: two processes
/// that name one server differently (`postgresql://` or `postgres://`, a
/// default port written out or not, hosts in another order) still take
/// its locks in the same order. If one cannot be had in
/// time, the ones already taken are released before the call returns.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://").await?;
/// let from = client.mutex("account:17")?;
/// let to = client.mutex("account:4")?;
/// let both = fenced::MultiLock::new([from, to]).acquire().await?;
/// assert_eq!(both.guards().len(), 2);
/// both.release().await?;
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct MultiLock {
    locks: Vec<Lock>,
}

impl MultiLock {
    /// A MultiLock over `locks`. Duplicates (same backend, name and mode)
    /// are taken once.
    pub fn new(locks: impl IntoIterator<Item = impl Into<Lock>>) -> Self {
        let mut locks: Vec<Lock> = locks.into_iter().map(Into::into).collect();
        locks.sort_by(|a, b| key(a).cmp(&key(b)));
        locks.dedup_by(|a, b| key(a) == key(b));
        MultiLock { locks }
    }

    /// Waits until every lock is held.
    ///
    /// # Cancel safety
    /// Dropping the future releases whatever it had taken.
    pub async fn acquire(&self) -> Result<MultiGuard> {
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            guards.push(lock.acquire().await?);
        }
        Ok(MultiGuard { guards })
    }

    /// Takes every lock if all are free now; `Ok(None)` (holding nothing) if not.
    pub async fn try_acquire(&self) -> Result<Option<MultiGuard>> {
        self.acquire_by(None).await
    }

    /// Waits up to `wait` in all; `Ok(None)` (holding nothing) if not all were had.
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<MultiGuard>> {
        match Instant::now().checked_add(wait) {
            Some(d) => self.acquire_by(Some(d)).await,
            // Beyond any clock: the same as waiting for ever.
            None => self.acquire().await.map(Some),
        }
    }

    async fn acquire_by(&self, deadline: Option<Instant>) -> Result<Option<MultiGuard>> {
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let got = match deadline {
                None => lock.try_acquire().await,
                Some(d) => {
                    lock.acquire_timeout(d.saturating_duration_since(Instant::now()))
                        .await
                }
            };
            let got = match got {
                Ok(got) => got,
                Err(e) => {
                    rollback(guards).await;
                    return Err(e);
                }
            };
            match got {
                Some(g) => guards.push(g),
                None => {
                    rollback(guards).await;
                    return Ok(None);
                }
            }
        }
        Ok(Some(MultiGuard { guards }))
    }

    /// The locks, in the order they are taken.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }
}

fn key(l: &Lock) -> (&str, &str, i64) {
    (&l.client.inner.identity, l.name(), l.mode.code())
}

/// Gives back what was taken: all at once, for one request timeout at
/// most (one after the other, a silent server would keep a caller whose
/// deadline has passed waiting up to two request timeouts a lock); what
/// is not done by then goes on in the background, as a dropped guard's
/// release does.
async fn rollback(guards: Vec<Guard>) {
    let limit = guards
        .iter()
        .map(|g| g.client().backend.request_timeout())
        .max()
        .unwrap_or_default();
    let mut releases = tokio::task::JoinSet::new();
    for g in guards {
        releases.spawn(g.release());
    }
    let _ = tokio::time::timeout(limit, releases.join_all()).await;
}

/// All the guards of a [`MultiLock`].
#[must_use = "dropping a guard releases the locks at once"]
#[derive(Debug)]
pub struct MultiGuard {
    guards: Vec<Guard>,
}

impl MultiGuard {
    /// The guards, in acquisition order.
    pub fn guards(&self) -> &[Guard] {
        &self.guards
    }

    /// True while every lock is held.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(Guard::is_held)
    }

    /// Resolves when any of the locks is lost.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let futs: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        async move {
            if futs.is_empty() {
                return std::future::pending().await;
            }
            let mut futs = futs;
            std::future::poll_fn(move |cx| {
                for f in futs.iter_mut() {
                    if let std::task::Poll::Ready(r) = f.as_mut().poll(cx) {
                        return std::task::Poll::Ready(r);
                    }
                }
                std::task::Poll::Pending
            })
            .await
        }
    }

    /// Releases every lock (in reverse order); true when all were still held.
    pub async fn release(self) -> Result<bool> {
        let mut all = true;
        let mut first_err = None;
        for g in self.guards.into_iter().rev() {
            match g.release().await {
                Ok(held) => all &= held,
                Err(e) => {
                    all = false;
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(all),
        }
    }
}
