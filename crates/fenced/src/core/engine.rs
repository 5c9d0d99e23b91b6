//! The engine of one client: its backend, its holds, its watchdog and its
//! release worker, and the calls every handle makes through them. The
//! public `Client` is a handle on one.

use crate::core::acquire::MAX_FALLBACK;
use crate::core::hold::{Hold, HoldTable};
use crate::core::retry::RetryPolicy;
use crate::core::watchdog::Watchdog;
use crate::core::worker::Job;
use crate::error::Result;
use crate::name::LockName;
use crate::spi::wake::{Wake, Wakeups, register_key};
use crate::spi::{Backend, HoldRef, RegisterValue};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What a client is made of, shared by its handles, locks and guards.
pub(crate) struct Engine {
    pub(crate) id: String,
    pub(crate) url: String,
    /// The backend's canonical identity (see `Backend::identity`).
    pub(crate) identity: String,
    /// What this client's holds record of their process.
    pub(crate) whoami: crate::holder::Whoami,
    pub(crate) backend: Arc<dyn Backend>,
    /// Where the backend wakes this client's waiters.
    pub(crate) wakeups: Arc<Wakeups>,
    pub(crate) holds: HoldTable,
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) worker: mpsc::UnboundedSender<Job>,
    /// Slots for server calls in the background: acquisition tries and the
    /// worker's jobs (see `worker::MAX_CALLS`).
    pub(crate) calls: Arc<tokio::sync::Semaphore>,
    /// What recipes remember per client between calls, by key (a work
    /// queue's done items): dropped with the client.
    pub(crate) memos:
        std::sync::Mutex<std::collections::HashMap<String, Arc<dyn std::any::Any + Send + Sync>>>,
}

/// Sends a release to the worker unless disarmed: what makes an
/// interrupted `release().await` still release.
struct PendingRelease<'a> {
    worker: &'a mpsc::UnboundedSender<Job>,
    hold: Option<HoldRef>,
}

impl Drop for PendingRelease<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.hold.take() {
            let _ = self.worker.send(Job::Release(r));
        }
    }
}

impl Engine {
    /// The memo of this client under `key`, made empty on first use.
    pub(crate) fn memo<T: Default + Send + Sync + 'static>(&self, key: &str) -> Arc<T> {
        let mut memos = self.memos.lock().unwrap_or_else(|p| p.into_inner());
        let any = memos
            .entry(key.to_owned())
            .or_insert_with(|| Arc::new(T::default()));
        match any.clone().downcast::<T>() {
            Ok(t) => t,
            // Another kind under the same key: a new one for this caller
            // (keys name their kind, so only a bug gets here).
            Err(_) => Arc::new(T::default()),
        }
    }

    pub(crate) fn owner_key(&self, owner_id: &str) -> String {
        format!("{}:{owner_id}", self.id)
    }

    /// A read (`status`, a register, the leader): bounded by the request
    /// timeout, and tried again on a transient error (a connection that
    /// died in the pool, a failover) within that time.
    pub(crate) async fn read<'a, T: Send + 'a>(
        &'a self,
        op: &'static str,
        f: impl FnMut(&'a dyn Backend) -> crate::spi::Reply<'a, T>,
    ) -> Result<T> {
        self.read_within(self.backend.request_timeout(), op, f)
            .await
    }

    /// [`read`](Self::read) bounded by `limit` instead: a read made of
    /// many requests (a scan of the keys), each bounded by the request
    /// timeout in the backend.
    pub(crate) async fn read_within<'a, T: Send + 'a>(
        &'a self,
        limit: std::time::Duration,
        op: &'static str,
        mut f: impl FnMut(&'a dyn Backend) -> crate::spi::Reply<'a, T>,
    ) -> Result<T> {
        let scheme = self.backend.scheme();
        let until = tokio::time::Instant::now() + limit;
        let backend = &*self.backend;
        crate::core::acquire::with_retry(&RetryPolicy::default(), Some(until), || {
            crate::core::acquire::bounded(limit, scheme, op, f(backend))
        })
        .await
    }

    /// Reads register `name` until `done` takes what it read (`Some`);
    /// `None` once `until` has passed. See [`wait_on`](Self::wait_on).
    pub(crate) async fn wait_register<T>(
        &self,
        name: &LockName,
        until: Option<Instant>,
        done: impl Fn(RegisterValue) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let done = &done;
        self.wait_on(name, until, || async move {
            let got = self
                .read("register_read", |b| b.register_read(name))
                .await?;
            done(got)
        })
        .await
    }

    /// Runs `check` until it answers `Some`, again after each write of
    /// register `name`, woken by the engine's notification of it (see
    /// `Store::watch_register`), and on its own every [`MAX_FALLBACK`] in
    /// case one was lost or what `check` looks at changed without a write
    /// (a lease that ran out); `None` once `until` has passed. Cancel
    /// safe: a dropped wait leaves only the engine's watch, which ends at
    /// the next write or once nobody in this client watches.
    pub(crate) async fn wait_on<T, F>(
        &self,
        name: &LockName,
        until: Option<Instant>,
        check: impl FnMut() -> F,
    ) -> Result<Option<T>>
    where
        F: std::future::Future<Output = Result<Option<T>>>,
    {
        self.wait_armed(name, until, |b| b.watch_register(name), check)
            .await
    }

    /// [`wait_on`](Self::wait_on), with the engine's notification asked
    /// for by `arm` (a watch on a recipe's own node, say) instead of a
    /// watch on register `name`; either wakes `register_key(name)`.
    pub(crate) async fn wait_armed<'a, T, F>(
        &'a self,
        name: &LockName,
        until: Option<Instant>,
        mut arm: impl FnMut(&'a dyn crate::spi::Backend) -> crate::spi::Reply<'a, ()>,
        mut check: impl FnMut() -> F,
    ) -> Result<Option<T>>
    where
        F: std::future::Future<Output = Result<Option<T>>>,
    {
        let key = register_key(name.as_str());
        let mut interest = self.wakeups.interest(&key, Wake::Every);
        loop {
            let seen = interest.begin();
            self.read("watch_register", &mut arm).await?;
            if let Some(t) = check().await? {
                return Ok(Some(t));
            }
            let now = Instant::now();
            if until.is_some_and(|u| u <= now) {
                return Ok(None);
            }
            let look = now + MAX_FALLBACK;
            let look = until.map_or(look, |u| u.min(look));
            tokio::select! {
                () = interest.changed_since(seen) => {}
                () = tokio::time::sleep_until(look) => {}
            }
        }
    }

    /// A change (a register write, a force unlock): bounded by the request
    /// timeout, tried once (a retry after a lost reply could apply it twice).
    pub(crate) async fn write<'a, T: Send + 'a>(
        &'a self,
        op: &'static str,
        f: crate::spi::Reply<'a, T>,
    ) -> Result<T> {
        let limit = self.backend.request_timeout();
        crate::core::acquire::bounded(limit, self.backend.scheme(), op, f).await
    }

    /// A read tried once, bounded by the request timeout: for work in the
    /// background, which must not go on trying (and warning) once the
    /// client has closed.
    pub(crate) async fn read_once<'a, T: Send + 'a>(
        &'a self,
        op: &'static str,
        f: impl FnOnce(&'a dyn Backend) -> crate::spi::Reply<'a, T>,
    ) -> Result<T> {
        let limit = self.backend.request_timeout();
        crate::core::acquire::bounded(limit, self.backend.scheme(), op, f(&*self.backend)).await
    }

    /// A write of register `name` by `rule`, bounded as
    /// [`write`](Self::write) is; `false` when the rule refused it.
    pub(crate) async fn write_register(
        &self,
        name: &LockName,
        value: &[u8],
        rule: crate::spi::WriteRule,
    ) -> Result<bool> {
        let write = crate::spi::RegisterWrite { name, value, rule };
        self.write("register_write", self.backend.register_write(write))
            .await
    }

    /// Where background jobs go.
    pub(crate) fn worker(&self) -> mpsc::UnboundedSender<Job> {
        self.worker.clone()
    }

    pub(crate) fn send(&self, job: Job) {
        // Fails only when the runtime that ran the worker is gone; the
        // lease then frees the lock.
        let _ = self.worker.send(job);
    }

    /// A guard went away without `release()`.
    pub(crate) fn drop_hold(&self, hold: &Arc<Hold>) {
        if self.holds.leave(hold) {
            hold.set_released();
            tracing::debug!(lock = %hold.name(), token = hold.token, "release queued by drop");
            self.send(Job::Release(hold.r.clone()));
        }
    }

    pub(crate) async fn release_hold(&self, hold: Arc<Hold>) -> Result<bool> {
        if !self.holds.leave(&hold) {
            return Ok(hold.is_held());
        }
        let believed = hold.is_held();
        hold.set_released();
        if hold.state().lost.is_some() {
            // Its lost signal fired, which queued its release already.
            return Ok(false);
        }
        let mut pending = PendingRelease {
            worker: &self.worker,
            hold: Some(hold.r.clone()),
        };
        // A failover or a dropped connection should not turn a release
        // into an error: retry transient failures a little (two request
        // timeouts at most: the caller does not wait on a server that has
        // stopped answering), then leave the hold to the background worker
        // (and, at worst, its lease). Past the lease, or the session, the
        // release is moot, so retries stop there.
        let limit = self.backend.request_timeout();
        let until = Some(
            hold.believed_until()
                .min(tokio::time::Instant::now() + limit * 2),
        );
        let scheme = self.backend.scheme();
        // A try that failed may have released the hold without saying so
        // (its reply lost): a later try that finds nothing to release
        // then says nothing about a loss.
        let tried = std::sync::atomic::AtomicBool::new(false);
        let was_ours = crate::core::acquire::with_retry(&RetryPolicy::default(), until, || {
            let again = tried.swap(true, std::sync::atomic::Ordering::Relaxed);
            let release = self.backend.release(&hold.r);
            crate::core::acquire::bounded(limit, scheme, "release", async move {
                Ok(release.await? || (again && believed))
            })
        })
        .await?;
        pending.hold = None;
        tracing::debug!(lock = %hold.name(), token = hold.token, was_ours, "released");
        Ok(was_ours && believed)
    }
}
