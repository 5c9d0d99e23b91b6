//! The one acquire loop every backend shares: attempt → wait → attempt,
//! with reentrancy, timeouts, transient-error retries and cleanup when the
//! caller goes away.

use crate::backend::{Attempt, BoxFuture, Mode, Outcome};
use crate::client::ClientInner;
use crate::core::hold::Hold;
use crate::core::worker::Job;
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::lock::Lock;
use crate::retry::RetryPolicy;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

/// The longest a waiter sleeps between attempts when no notification
/// comes: a bound on how late a missed wake-up (a crashed releaser, a
/// foreign client that publishes nothing) can be noticed.
pub(crate) const MAX_FALLBACK: Duration = Duration::from_secs(2);

pub(crate) enum Wait {
    /// Try once.
    No,
    /// Wait until the instant, or for ever.
    Until(Option<Instant>),
}

/// Withdraws an attempt whose caller went away: its queue place, and the
/// grant it may have won while the caller was no longer listening.
struct Cleanup<'a> {
    inner: &'a Arc<ClientInner>,
    attempt: Option<Attempt>,
}

impl Cleanup<'_> {
    fn disarm(&mut self) {
        self.attempt = None;
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Some(a) = self.attempt.take() {
            self.inner.send(Job::Abandon {
                name: a.name,
                ticket: a.ticket,
                hold_id: a.hold_id,
            });
        }
    }
}

pub(crate) async fn run(lock: &Lock, wait: Wait) -> Result<Option<Guard>> {
    lock.check()?;
    let span = tracing::debug_span!("fenced.acquire", lock = %lock.name, mode = ?lock.mode);
    run_inner(lock, wait).instrument(span).await
}

async fn run_inner(lock: &Lock, wait: Wait) -> Result<Option<Guard>> {
    let inner = &lock.client.inner;
    let owner = lock.opts.owner.as_ref().unwrap_or(&inner.owner);
    let owner_key = inner.owner_key(owner);
    if lock.mode.is_reentrant() {
        if let Some(hold) = inner.holds.join(&lock.name, &owner_key, lock.mode) {
            tracing::debug!(token = hold.token, count = hold.count(), "re-entered");
            return Ok(Some(Guard::new(hold, inner.clone())));
        }
        if lock.mode == Mode::Exclusive && inner.holds.holds(&lock.name, &owner_key, Mode::Shared) {
            return Err(Error::invalid(format!(
                "owner {owner} holds read on {:?}; upgrading to write could deadlock with \
                 another upgrading reader: release the read hold first",
                lock.name.as_str()
            )));
        }
    }
    let backend = &inner.backend;
    let deadline = match wait {
        Wait::No => Some(Instant::now()),
        Wait::Until(d) => d,
    };
    let mut attempt = Attempt {
        name: lock.name.clone(),
        owner_key: owner_key.clone(),
        hold_id: uuid::Uuid::new_v4().simple().to_string(),
        mode: lock.mode,
        rw: lock.rw,
        lease: lock.opts.lease.duration(),
        fair: lock.opts.fair,
        will_wait: !matches!(wait, Wait::No),
        ticket: None,
    };
    let mut interest = attempt
        .will_wait
        .then(|| backend.wakeups().interest(lock.name.as_str()));
    let mut cleanup = Cleanup {
        inner,
        attempt: None,
    };
    let mut waiting_since = None;
    loop {
        // Another task of this owner may have won the lock while we
        // waited (a backend that does not grant one owner twice, like
        // Redis's simple layout, keeps us waiting on it): nest into its
        // hold at the next wake-up. Our queue place, if any, is withdrawn
        // by the cleanup.
        if waiting_since.is_some()
            && lock.mode.is_reentrant()
            && let Some(hold) = inner.holds.join(&lock.name, &owner_key, lock.mode)
        {
            tracing::debug!(
                token = hold.token,
                count = hold.count(),
                "re-entered after waiting"
            );
            return Ok(Some(Guard::new(hold, inner.clone())));
        }
        let seen = interest.as_ref().map(|i| i.version());
        cleanup.attempt = Some(attempt.clone());
        let sent = Instant::now();
        let outcome = with_retry(&lock.opts.retry, deadline, || backend.attempt(&attempt)).await?;
        match outcome {
            Outcome::Granted { token } => {
                cleanup.disarm();
                let r = attempt.hold_ref();
                let renewed = lock.opts.lease.is_renewed();
                let hold = Hold::new(r, owner_key, lock.mode, token, sent);
                let waited = waiting_since.map(|t: Instant| t.elapsed());
                return Ok(Some(match inner.holds.insert(hold.clone()) {
                    Ok(hold) => {
                        if renewed {
                            inner.watchdog.watch(hold.clone());
                        }
                        tracing::debug!(token, ?waited, "acquired");
                        Guard::new(hold, inner.clone())
                    }
                    Err(existing) => {
                        // Another task of this owner won the same lock at
                        // the same time: nest into its hold, give ours back.
                        inner.send(Job::Release(hold.r.clone()));
                        Guard::new(existing, inner.clone())
                    }
                }));
            }
            Outcome::Busy(blocked) => {
                attempt.ticket = blocked.ticket;
                cleanup.attempt = blocked.ticket.map(|_| attempt.clone());
                let (Some(interest), Some(seen)) = (interest.as_mut(), seen) else {
                    return Ok(None);
                };
                interest.set_ticket(blocked.ticket);
                let now = Instant::now();
                if deadline.is_some_and(|d| d <= now) {
                    // Withdraw now rather than in the background, so that
                    // what this caller does next finds no trace of the wait.
                    if let Some(a) = cleanup.attempt.take() {
                        let _ = backend.abandon(&a.name, a.ticket, &a.hold_id).await;
                    }
                    return Ok(None);
                }
                if waiting_since.is_none() {
                    tracing::debug!(ticket = ?blocked.ticket, "waiting");
                    waiting_since = Some(now);
                }
                let fallback = blocked
                    .retry_after
                    .unwrap_or(MAX_FALLBACK)
                    .clamp(Duration::from_millis(1), MAX_FALLBACK);
                let until = deadline.map_or(now + fallback, |d| d.min(now + fallback));
                tokio::select! {
                    _ = interest.changed_since(seen) => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
        }
    }
}

/// Runs `f`, retrying transient errors under `policy` but never past `deadline`.
pub(crate) async fn with_retry<'a, T>(
    policy: &RetryPolicy,
    deadline: Option<Instant>,
    mut f: impl FnMut() -> BoxFuture<'a, Result<T>>,
) -> Result<T> {
    let started = Instant::now();
    let mut retry = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() => {
                let Some(delay) = policy.delay(retry, started.elapsed()) else {
                    return Err(e);
                };
                if deadline.is_some_and(|d| Instant::now() + delay >= d) {
                    return Err(e);
                }
                tracing::warn!(error = %e, retry, ?delay, "backend unavailable; retrying");
                tokio::time::sleep(delay).await;
                retry += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long a fair waiter's queue place outlives its last attempt. Waiters
/// attempt at least every [`MAX_FALLBACK`], so a live waiter never loses its
/// place; a dead one (killed, paused) stops blocking the queue after this.
pub(crate) const QUEUE_TTL: Duration = Duration::from_secs(10);
