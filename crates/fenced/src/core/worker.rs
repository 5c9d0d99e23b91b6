//! The background queue that guards' `Drop` and cancelled acquisitions
//! feed: `Drop` never blocks and never does I/O; it hands the release here.
//!
//! Jobs run concurrently, each try bounded by the backend's request
//! timeout, so one release stuck on a server that does not answer never
//! holds up the others. Withdrawals share the client's [`MAX_CALLS`] slots
//! with the tries of acquisitions (first come, first served); releases of
//! held guards, at most one per guard, take none. An application
//! that drops acquisitions faster than the server can withdraw them (a
//! `timeout` around `acquire` in a tight loop) has its new tries wait for
//! the withdrawals, rather than piling both up without bound.

use crate::core::acquire::InFlight;
use crate::error::Result;
use crate::spi::{Backend, HoldRef, Outcome, Withdrawal};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;

/// Withdrawals and acquisition tries in flight at once, per client; more
/// wait their turn. Renewals and releases do not count: they never wait
/// behind this.
pub(crate) const MAX_CALLS: usize = 128;

/// How many request timeouts a withdrawal waits for the try it follows.
const TRY_PATIENCE: u32 = 12;

pub(crate) enum Job {
    Release(HoldRef),
    /// Withdraw an attempt whose caller went away, once the tries it had
    /// on their way (`after`) are done: what they won or queued goes too.
    Abandon {
        gone: Withdrawal,
        after: Vec<InFlight>,
        /// An earlier try failed without an answer: it may yet land.
        doubtful: bool,
    },
    /// Answers once every job sent before it is done.
    Flush(oneshot::Sender<()>),
}

/// Starts the worker for one client; it ends when the client's sender drops.
pub(crate) fn spawn(
    backend: Arc<dyn Backend>,
    slots: Arc<Semaphore>,
) -> mpsc::UnboundedSender<Job> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
    tokio::spawn(async move {
        let mut running = JoinSet::new();
        loop {
            tokio::select! {
                // Biased: one order of branches, so a seed replays the
                // same; finished jobs are reaped first, so a steady stream
                // of new ones cannot grow the set without end.
                biased;
                Some(_) = running.join_next(), if !running.is_empty() => {}
                job = rx.recv() => match job {
                    None => break,
                    Some(Job::Flush(done)) => {
                        // The jobs sent before the flush are the ones running.
                        let before = std::mem::take(&mut running);
                        tokio::spawn(async move {
                            before.join_all().await;
                            let _ = done.send(());
                        });
                    }
                    Some(job) => {
                        let (backend, slots) = (backend.clone(), slots.clone());
                        // A release frees a hold someone was given: at most
                        // one per guard, never queued behind tries.
                        let slotted = matches!(job, Job::Abandon { .. });
                        running.spawn(async move {
                            let _slot = if slotted { slots.acquire_owned().await.ok() } else { None };
                            run(&backend, job).await;
                        });
                    }
                },
            }
        }
        while running.join_next().await.is_some() {}
    });
    tx
}

/// Who frees a lock whose release the worker could not make.
fn who_frees(backend: &dyn Backend) -> &'static str {
    if backend.ends_holds() {
        "its lease will free the lock"
    } else {
        "the end of the client's session will free the lock"
    }
}

async fn run(backend: &Arc<dyn Backend>, job: Job) {
    let limit = backend.request_timeout();
    let scheme = backend.scheme();
    match job {
        Job::Release(r) => {
            let res = retry_a_little(|| {
                crate::core::acquire::bounded(limit, scheme, "release", backend.release(&r))
            })
            .await;
            match res {
                Ok(_) => tracing::debug!(lock = %r.name, "released in background"),
                Err(e) if e.is_transient() => {
                    tracing::warn!(lock = %r.name, error = %e,
                        "background release failed; trying on while the session lives");
                    backend.release_later(r);
                }
                Err(e) => tracing::warn!(lock = %r.name, error = %e,
                    "background release failed; {}", who_frees(&**backend)),
            }
        }
        Job::Abandon {
            mut gone,
            after,
            doubtful,
        } => {
            let mut late = Vec::new();
            // A try that failed (no answer in time, a broken connection)
            // may still be on its way to the server, or waiting in it (a
            // server stopped with requests in its sockets), and land after
            // a withdrawal sent on another connection: it is withdrawn
            // once more, a request timeout later.
            let mut unknown = doubtful;
            for mut try_ in after {
                // Its answer tells the queue place it may have taken. Every
                // backend bounds its own calls, so this wait ends; it is
                // generous, since withdrawing before a late create lands
                // (a ZooKeeper request resent after a reconnect) would
                // leave its node behind for the rest of the session.
                let patience = limit * TRY_PATIENCE;
                match tokio::time::timeout(patience, &mut try_).await {
                    Ok(Ok(Ok(Outcome::Busy(b)))) => gone.ticket = b.ticket.or(gone.ticket),
                    Ok(Ok(Ok(_))) => {}
                    Ok(_) => unknown = true,
                    Err(_) => late.push(try_),
                }
            }
            // A try still on its way past that patience may yet win the
            // lock for nobody: whenever it answers, what it won or queued
            // is withdrawn too.
            for try_ in late {
                let (backend, mut gone) = (backend.clone(), gone.clone());
                tokio::spawn(async move {
                    gone.ticket = match try_.await {
                        Ok(Ok(Outcome::Granted { .. })) => None,
                        Ok(Ok(Outcome::Busy(b))) => b.ticket,
                        _ => return,
                    };
                    let _ = withdraw(&*backend, limit, &gone).await;
                });
            }
            if let Err(e) = withdraw(&**backend, limit, &gone).await {
                tracing::warn!(lock = %gone.name, error = %e,
                    "could not withdraw a cancelled acquisition; {}", who_frees(&**backend));
            }
            if unknown {
                // In a task of its own, outside the worker's slots and
                // its flush: `Client::close` does not wait for it.
                let backend = backend.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(limit).await;
                    let _ = withdraw(&*backend, limit, &gone).await;
                });
            }
        }
        Job::Flush(done) => {
            let _ = done.send(());
        }
    }
}

/// Withdraws `gone`, with a few quick retries.
async fn withdraw(backend: &dyn Backend, limit: Duration, gone: &Withdrawal) -> Result<()> {
    let scheme = backend.scheme();
    retry_a_little(|| {
        crate::core::acquire::bounded(limit, scheme, "abandon", backend.abandon(gone))
    })
    .await
}

/// A few quick retries for background clean-up: it must not hang on a dead
/// backend, since the lease frees the lock anyway.
async fn retry_a_little<'a, T, F>(mut f: F) -> Result<T>
where
    F: FnMut() -> crate::spi::Reply<'a, T>,
{
    let mut delay = Duration::from_millis(20);
    for _ in 0..4 {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if !e.is_transient() => return Err(e),
            Err(_) => {}
        }
        tokio::time::sleep(delay).await;
        delay *= 4;
    }
    f().await
}
