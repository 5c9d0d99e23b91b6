//! The background queue that guards' `Drop` and cancelled acquisitions
//! feed: `Drop` never blocks and never does I/O; it hands the release here.

use crate::backend::{Backend, HoldRef, Ticket};
use crate::name::LockName;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

pub(crate) enum Job {
    Release(HoldRef),
    Abandon {
        name: LockName,
        ticket: Option<Ticket>,
        hold_id: String,
    },
    /// Answers once every job sent before it is done.
    Flush(oneshot::Sender<()>),
}

/// Starts the worker for one client; it ends when the client's sender drops.
pub(crate) fn spawn(backend: Arc<dyn Backend>) -> mpsc::UnboundedSender<Job> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
    tokio::spawn(async move {
        while let Some(job) = rx.recv().await {
            match job {
                Job::Release(r) => {
                    let res = retry_a_little(|| backend.release(&r)).await;
                    match res {
                        Ok(_) => tracing::debug!(lock = %r.name, "released in background"),
                        Err(e) if e.is_transient() => {
                            tracing::warn!(lock = %r.name, error = %e,
                                "background release failed; trying on while the session lives");
                            backend.release_later(r);
                        }
                        Err(e) => tracing::warn!(lock = %r.name, error = %e,
                            "background release failed; the lease will free the lock"),
                    }
                }
                Job::Abandon {
                    name,
                    ticket,
                    hold_id,
                } => {
                    if let Err(e) =
                        retry_a_little(|| backend.abandon(&name, ticket, &hold_id)).await
                    {
                        tracing::warn!(lock = %name, error = %e,
                            "could not withdraw a cancelled acquisition; its lease will");
                    }
                }
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    });
    tx
}

/// A few quick retries for background clean-up: it must not hang on a dead
/// backend, since the lease frees the lock anyway.
async fn retry_a_little<'a, T, F>(mut f: F) -> crate::Result<T>
where
    F: FnMut() -> crate::backend::BoxFuture<'a, crate::Result<T>>,
{
    let mut delay = Duration::from_millis(20);
    for _ in 0..4 {
        match tokio::time::timeout(Duration::from_secs(5), f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !e.is_transient() => return Err(e),
            _ => {}
        }
        tokio::time::sleep(delay).await;
        delay *= 4;
    }
    f().await
}
