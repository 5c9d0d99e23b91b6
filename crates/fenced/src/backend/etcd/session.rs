//! The client's one session lease: kept alive, confirmed, and dropped when etcd says it is gone.

use super::*;

/// Keeps the session lease alive every TTL/3; grants a new one when it is
/// gone, and wakes every waiter then (their places went with it). The
/// session counts as lost once the server may have let it run out: the TTL
/// it last granted, from when that keep-alive was sent, less the drift
/// holds allow for. That reckoning spans re-opened streams, so a stream
/// that keeps breaking cannot keep a dead session believed.
pub(super) async fn keep_alive(inner: Arc<EtcdShared>, granted: Instant) {
    let ttl = Duration::from_secs(inner.session.ttl as u64);
    let period = ttl / 3;
    let mut etcd = inner.etcd.clone();
    let mut lives_until = believed_until(granted, ttl);
    loop {
        let id = inner.session.lease.load(Ordering::Acquire);
        if id == 0 {
            let sent = Instant::now();
            match etcd.lease_grant(inner.session.ttl, None).await {
                Ok(r) => {
                    lives_until = believed_until(sent, Duration::from_secs(r.ttl().max(1) as u64));
                    inner.session.clock.start(r.id(), lives_until);
                    inner.session.lease.store(r.id(), Ordering::Release);
                    inner.session.epoch.fetch_add(1, Ordering::AcqRel);
                    inner.wakeups.wake_all();
                }
                Err(e) => {
                    tracing::debug!(error = %e, "etcd: no new session lease yet");
                    tokio::time::sleep(period.min(Duration::from_secs(1))).await;
                }
            }
            continue;
        }
        let stream = etcd.lease_keep_alive(id).await;
        let Ok((mut keeper, mut replies)) = stream else {
            tracing::debug!(lease = id, "etcd: keep-alive stream not opened");
            tokio::time::sleep(Duration::from_millis(200)).await;
            if Instant::now() >= lives_until {
                drop_session(&inner, id);
            }
            continue;
        };
        loop {
            let sent = Instant::now();
            let ok = async {
                keeper.keep_alive().await.ok()?;
                let reply = tokio::time::timeout(period, replies.message()).await;
                reply.ok()?.ok()?.map(|r| r.ttl())
            }
            .await;
            match ok {
                Some(secs) if secs > 0 => {
                    lives_until = believed_until(sent, Duration::from_secs(secs as u64));
                    inner.session.clock.confirm(id, lives_until);
                }
                // The server says the lease is gone.
                Some(_) => {
                    drop_session(&inner, id);
                    break;
                }
                None => {
                    tracing::debug!(lease = id, "etcd: keep-alive unanswered");
                    if Instant::now() >= lives_until {
                        drop_session(&inner, id);
                    }
                    break;
                }
            }
            tokio::time::sleep(period).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(super) fn drop_session(inner: &EtcdShared, id: i64) {
    if inner
        .session
        .lease
        .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        tracing::warn!(lease = id, "etcd session lease lost; its holds are lost");
        inner.session.clock.end(id);
        inner.session.epoch.fetch_add(1, Ordering::AcqRel);
        inner.wakeups.wake_all();
        // A lease we stopped hearing about may still live on the server,
        // keeping our keys in every queue; each leader election resets its
        // TTL, so under a string of elections it never runs out (the
        // torture suite's leader fault blocked a lock for 20 s). Revoke
        // it until the server answers.
        let (etcd, label) = (inner.etcd.clone(), inner.label.clone());
        tokio::spawn(async move {
            let revoke = || {
                let (mut etcd, label) = (etcd.clone(), label.clone());
                async move { etcd.lease_revoke(id).await.map_err(|e| map_err(&label, e)) }
            };
            crate::backend::queue::retry_transient(
                revoke,
                crate::backend::queue::TRIES_IN_BACKGROUND,
                || true,
            )
            .await;
        });
    }
}

/// Whether etcd refused a request because its lease no longer exists.
pub(super) fn lease_gone(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::NotFound && s.message().contains("lease not found"))
}

pub(super) fn map_err(label: &str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    if lease_gone(&e) {
        return Error::unavailable(format!(
            "etcd at {label}: this client's session lease ran out; a new one is on its way"
        ))
        .with_source(e);
    }
    match &e {
        E::GRpcStatus(s) => {
            use tonic::Code as C;
            match s.code() {
                C::Unauthenticated | C::PermissionDenied | C::InvalidArgument
                    if s.message().contains("auth")
                        || s.message().contains("password")
                        || s.message().contains("permission") =>
                {
                    Error::invalid(format!("etcd at {label} refused us: {}", s.message()))
                        .with_source(e)
                }
                C::Unavailable
                | C::DeadlineExceeded
                | C::Aborted
                | C::Cancelled
                | C::ResourceExhausted
                | C::Unknown => Error::unavailable(format!(
                    "etcd at {label} cannot serve us now: {}",
                    s.message()
                ))
                .with_source(e),
                _ => Error::protocol(format!("etcd at {label} answered: {}", s.message()))
                    .with_source(e),
            }
        }
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) => {
            Error::invalid(format!("etcd at {label}: {e}")).with_source(e)
        }
        _ => Error::unavailable(format!("etcd at {label} is unreachable: {e}")).with_source(e),
    }
}
