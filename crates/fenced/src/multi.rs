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
        let got = self.take_all(Until::Forever).await?;
        Ok(got.expect("a wait for ever ends with the locks or an error"))
    }

    /// Takes every lock if all are free now; `Ok(None)` (holding nothing) if not.
    pub async fn try_acquire(&self) -> Result<Option<MultiGuard>> {
        self.take_all(Until::Now).await
    }

    /// Waits up to `wait` in all; `Ok(None)` (holding nothing) if not all were had.
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<MultiGuard>> {
        match Instant::now().checked_add(wait) {
            Some(d) => self.take_all(Until::At(d)).await,
            // Beyond any clock: the same as waiting for ever.
            None => self.acquire().await.map(Some),
        }
    }

    /// Takes the locks in order. A lock taken first can be lost while the
    /// others are awaited (its session ended, a partition): a guard never
    /// starts out lost, so then every lock is given back and the round
    /// starts again, while the wait allows.
    async fn take_all(&self, until: Until) -> Result<Option<MultiGuard>> {
        loop {
            let mut guards = Vec::with_capacity(self.locks.len());
            for lock in &self.locks {
                let got = match until {
                    Until::Now => lock.try_acquire().await,
                    Until::At(d) => {
                        lock.acquire_timeout(d.saturating_duration_since(Instant::now()))
                            .await
                    }
                    Until::Forever => lock.acquire().await.map(Some),
                };
                match got {
                    Ok(Some(g)) => guards.push(g),
                    Ok(None) => {
                        rollback(guards).await;
                        return Ok(None);
                    }
                    Err(e) => {
                        rollback(guards).await;
                        return Err(e);
                    }
                }
            }
            if guards.iter().all(Guard::is_held) {
                return Ok(Some(MultiGuard { guards }));
            }
            tracing::debug!("a lock was lost while the others were awaited; taking them again");
            rollback(guards).await;
            let over = match until {
                Until::Now => true,
                Until::At(d) => Instant::now() >= d,
                Until::Forever => false,
            };
            if over {
                return Ok(None);
            }
        }
    }

    /// The locks, in the order they are taken.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }
}

/// How long a [`MultiLock`] acquisition waits.
#[derive(Clone, Copy)]
enum Until {
    Now,
    At(Instant),
    Forever,
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
