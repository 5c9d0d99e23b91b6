//! The one acquire loop every backend shares: attempt → wait → attempt,
//! with reentrancy, timeouts, transient-error retries and cleanup when the
//! caller goes away.

use crate::core::engine::Engine;
use crate::core::hold::{Grant, Hold};
use crate::core::retry::RetryPolicy;
use crate::core::worker::Job;
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::lease::QUEUE_TTL;
use crate::spi::wake::Wake;
use crate::spi::{Attempt, Backend, Mode, Outcome, Reply};
use std::future::Future;
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

/// Transient failures of an attempt tried again at once, before the retry
/// policy's pauses (and its deadline) apply.
const QUICK_RETRIES: u32 = 2;

/// A try at a grant, running in a task of its own: a caller that goes away
/// while it is on its way drops only its wait for the answer, never the
/// request half-sent, and the withdrawal learns what it did (a grant, a
/// queue place) before undoing it. Without this a withdrawal could reach
/// the server before the grant it withdraws (the two go on different
/// connections, or gRPC streams), and the grant would stay.
pub(crate) type InFlight = tokio::task::JoinHandle<Result<Outcome>>;

/// Withdraws an attempt whose caller went away: its queue place, and the
/// grant it may have won while the caller was no longer listening.
struct Cleanup<'a> {
    inner: &'a Arc<Engine>,
    attempt: Option<Attempt>,
    /// Tries still on their way (one, or more after a timeout).
    in_flight: Vec<InFlight>,
    /// A try failed with no answer: it may still reach the server later.
    doubtful: bool,
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
                gone: a.withdrawal(),
                after: std::mem::take(&mut self.in_flight),
                doubtful: self.doubtful,
            });
        }
    }
}

/// One try of `attempt`, in a task of its own (see [`InFlight`]), tried
/// again on transient errors under `policy` but never past `deadline`;
/// a try with no answer within `limit` is given up (it goes on, and the
/// cleanup waits for it if the caller goes away). With the outcome, when
/// the first try went out: a grant's lease counts from then, since a later
/// try may find the grant of an earlier one whose reply was lost. The
/// wait for a call slot comes before it: a request not yet sent cannot
/// have been granted, and counting that wait (a thousand waiters of one
/// client queue for the slots) gave grants that arrived spent.
async fn attempt_with_retry(
    policy: &RetryPolicy,
    deadline: Option<Instant>,
    limit: Duration,
    backend: &Arc<dyn Backend>,
    attempt: &Attempt,
    cleanup: &mut Cleanup<'_>,
) -> Result<(Outcome, Instant)> {
    let started = Instant::now();
    let mut first_sent = None;
    let (mut retry, mut quick) = (0, 0);
    // A caller with a deadline hears back within a request timeout of it,
    // whatever the server does.
    let hard = deadline.and_then(|d| d.checked_add(limit));
    loop {
        // One try at a time: a try that outlived `limit` is waited on
        // again rather than raced by a second one for the same hold id
        // (two answers for one hold would each set it up). Every backend
        // bounds its own calls, so a pending try ends.
        if cleanup.in_flight.is_empty() {
            // A slot first, held by the try until it ends, even once its
            // caller has gone (see `worker::MAX_CALLS`). Waiting for it
            // sends nothing, so a caller dropped here leaves nothing.
            let calls = cleanup.inner.calls.clone();
            let waited = match hard {
                Some(h) => tokio::time::timeout_at(h, calls.acquire_owned()).await,
                None => Ok(calls.acquire_owned().await),
            };
            let slot = match waited {
                Ok(Ok(slot)) => slot,
                Ok(Err(_)) => return Err(closed_error(&attempt.name)),
                Err(_) => {
                    return Err(Error::unavailable(format!(
                        "{} of this client's calls to the {} backend are still on their way, \
                         and none ended before the wait did",
                        crate::core::worker::MAX_CALLS,
                        backend.scheme()
                    )));
                }
            };
            // Armed as the try goes out, not before: a caller that went
            // away while it waited for a slot left no trace on the server.
            cleanup.attempt = Some(attempt.clone());
            first_sent.get_or_insert_with(Instant::now);
            let (b, a) = (backend.clone(), attempt.clone());
            cleanup.in_flight.push(tokio::spawn(async move {
                let _slot = slot;
                let sent = Instant::now();
                let r = b.attempt(&a).await;
                crate::core::metrics::request(b.scheme(), "attempt", sent.elapsed(), r.is_ok());
                r
            }));
        }
        let handle = cleanup.in_flight.last_mut().expect("one try in flight");
        let tried = Instant::now();
        let patience = hard.map_or(limit, |h| limit.min(h.saturating_duration_since(tried)));
        let (result, answered) = match tokio::time::timeout(patience, handle).await {
            Ok(joined) => {
                cleanup.in_flight.pop();
                let r = joined.unwrap_or_else(|e| {
                    Err(Error::unavailable(format!(
                        "an attempt did not finish: {e}"
                    )))
                });
                (r, tried.elapsed())
            }
            Err(_) => {
                let e = Error::unavailable(format!(
                    "the {} backend did not answer within {patience:?}",
                    backend.scheme()
                ));
                (Err(e), limit)
            }
        };
        if result.as_ref().is_err_and(|e| e.is_transient()) {
            cleanup.doubtful = true;
        }
        match result {
            Ok(outcome) => return Ok((outcome, first_sent.unwrap_or(started))),
            // A connection that broke (a pooled one the server closed, a
            // reset) is tried again at once on a fresh one, even by a try
            // whose deadline is now: the attempt is idempotent by hold id,
            // and the caller asked whether the lock is free, not whether a
            // stale connection still works. A server that was slow to
            // fail, or did not answer at all, is not asked again at once.
            Err(e)
                if e.is_transient()
                    && answered < limit / 4
                    && quick < QUICK_RETRIES
                    && hard.is_none_or(|h| Instant::now() < h) =>
            {
                tracing::debug!(error = %e, "attempt failed; trying again at once");
                quick += 1;
            }
            Err(e) => {
                pause_before_retry(policy, &mut retry, started, deadline, e).await?;
            }
        }
    }
}

/// One acquisition as the core needs it: what the public `Lock` asks for.
pub(crate) struct Request<'a> {
    pub(crate) name: &'a LockName,
    pub(crate) mode: Mode,
    /// What the lock is for (a mutex, a read-write lock's side, an
    /// election), where the engine names that apart.
    pub(crate) kind: crate::spi::Kind,
    pub(crate) lease: Duration,
    /// Whether the watchdog renews the lease.
    pub(crate) renewed: bool,
    pub(crate) fair: bool,
    pub(crate) retry: &'a RetryPolicy,
    /// The id of the named owner whose acquisitions nest, if any.
    pub(crate) owner: Option<String>,
}

/// Acquires as `req` says, waiting as `wait` says: the hold, or `None` when
/// the wait ended first.
pub(crate) async fn run(
    engine: &Arc<Engine>,
    req: Request<'_>,
    wait: Wait,
) -> Result<Option<Arc<Hold>>> {
    let span = tracing::debug_span!("fenced.acquire", lock = %req.name, mode = ?req.mode);
    run_inner(engine, req, wait).instrument(span).await
}

/// A fresh identity for one acquisition: its hold id, and its owner key
/// (the named owner's, or, by default, one of its own).
fn identity(inner: &Engine, named: Option<&str>) -> (String, String) {
    let hold_id = uuid::Uuid::new_v4().simple().to_string();
    let owner_key = match named {
        Some(o) => inner.owner_key(o),
        // Every acquisition its own owner: the hold id is unique already.
        None => format!("{}:{hold_id}", inner.id),
    };
    (hold_id, owner_key)
}

fn closed_error(name: &crate::name::LockName) -> Error {
    Error::unavailable(format!(
        "cannot acquire {:?}: the client was closed",
        name.as_str()
    ))
}

async fn run_inner(
    engine: &Arc<Engine>,
    req: Request<'_>,
    wait: Wait,
) -> Result<Option<Arc<Hold>>> {
    let inner = engine;
    let named = req.owner.as_deref();
    let reentrant = named.is_some() && req.mode.is_reentrant();
    let (hold_id, owner_key) = identity(inner, named);
    if reentrant {
        if let Some(hold) = inner.holds.join(req.name, &owner_key, req.mode) {
            tracing::debug!(token = hold.token, count = hold.count(), "re-entered");
            return Ok(Some(hold));
        }
        if req.mode == Mode::Exclusive && inner.holds.holds(req.name, &owner_key, Mode::Shared) {
            return Err(Error::invalid(format!(
                "owner {} holds read on {:?}; upgrading to write could deadlock with \
                 another upgrading reader: release the read hold first",
                named.unwrap_or(""),
                req.name.as_str()
            )));
        }
    }
    let backend = &inner.backend;
    let timeout = backend.request_timeout();
    let deadline = match wait {
        Wait::No => Some(Instant::now()),
        Wait::Until(d) => d,
    };
    let mut attempt = Attempt {
        name: req.name.clone(),
        owner_key,
        hold_id,
        mode: req.mode,
        kind: req.kind,
        lease: req.lease,
        fair: req.fair,
        will_wait: !matches!(wait, Wait::No),
        until: deadline,
        ticket: None,
        holder: String::new(),
    };
    // Who can use a release decides who is woken for it (see `spi::wake`).
    let wake = match req.mode {
        Mode::Shared => Wake::Every,
        _ if reentrant => Wake::Every,
        Mode::Exclusive => Wake::One { chain: false },
        // One permit fits wherever one came free; a larger take may not,
        // and must not keep the call from one that would.
        Mode::Permits { take: 1, .. } => Wake::One { chain: true },
        Mode::Permits { .. } => Wake::Every,
    };
    let mut interest = attempt
        .will_wait
        .then(|| inner.wakeups.interest(req.name.as_str(), wake));
    let mut cleanup = Cleanup {
        inner,
        attempt: None,
        in_flight: Vec::new(),
        doubtful: false,
    };
    let mut waiting_since = None;
    let mut late_grants = 0u32;
    loop {
        if inner.holds.is_closed() {
            return Err(closed_error(req.name));
        }
        // Another task of this owner may have won the lock while we
        // waited (a backend that does not grant one owner twice, like
        // Redis's simple layout, keeps us waiting on it): nest into its
        // hold at the next wake-up. Our queue place, if any, is withdrawn
        // by the cleanup.
        if waiting_since.is_some()
            && reentrant
            && let Some(hold) = inner.holds.join(req.name, &attempt.owner_key, req.mode)
        {
            tracing::debug!(
                token = hold.token,
                count = hold.count(),
                "re-entered after waiting"
            );
            return Ok(Some(hold));
        }
        let seen = interest.as_ref().map(|i| i.begin());
        attempt.holder = inner.whoami.record();
        // The lease counts from when the first try went out (see
        // `attempt_with_retry`).
        let (outcome, sent) = match attempt_with_retry(
            req.retry,
            deadline,
            timeout,
            backend,
            &attempt,
            &mut cleanup,
        )
        .await
        {
            Ok(outcome) => outcome,
            Err(e) => {
                // The server failing this waiter fails the others too; its
                // own deadline passing says nothing of them (a thousand
                // timed waiters on a slow server would each wake the rest).
                if let Some(i) = interest.take()
                    && deadline.is_none_or(|d| Instant::now() < d)
                {
                    i.failed();
                }
                return Err(e);
            }
        };
        match outcome {
            Outcome::Granted { token, session } => {
                let hold = Hold::new(Grant {
                    r: attempt.hold_ref(),
                    owner_key: attempt.owner_key.clone(),
                    mode: req.mode,
                    token,
                    sent,
                    session,
                    reentrant,
                    worker: inner.worker(),
                    scheme: backend.scheme(),
                });
                if !hold.is_held() {
                    // The reply came after the lease (or the session) it
                    // granted had run out: a slow round, a busy server. A
                    // guard must never start out lost: give it back, and
                    // try again while the caller's deadline allows.
                    inner.send(Job::Release(hold.r.clone()));
                    cleanup.disarm();
                    let took = sent.elapsed();
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Error::unavailable(format!(
                            "lock {:?} was granted, but the answer took {took:?}, past the \
                             lease of {:?} it granted; give the lock a longer lease",
                            req.name.as_str(),
                            attempt.lease
                        )));
                    }
                    tracing::debug!(?took, "granted past its own lease; trying again");
                    // Not at once: what slowed the answer (a busy server,
                    // a session no longer confirmed) is likely still there.
                    late_grants += 1;
                    let pause = req
                        .retry
                        .delay(late_grants - 1, Duration::ZERO)
                        .unwrap_or(timeout)
                        .min(timeout);
                    let wake = Instant::now() + pause;
                    tokio::time::sleep_until(deadline.map_or(wake, |d| d.min(wake))).await;
                    (attempt.hold_id, attempt.owner_key) = identity(inner, named);
                    attempt.ticket = None;
                    continue;
                }
                if !inner.holds.track(&hold) {
                    // The client closed while this try was out: its guard
                    // would never be told its lock went with the client.
                    // The cleanup gives the grant back.
                    return Err(closed_error(req.name));
                }
                cleanup.disarm();
                if let Some(i) = interest.take() {
                    i.granted();
                }
                let renewed = req.renewed;
                let waited = waiting_since.map(|t: Instant| t.elapsed());
                return Ok(Some(match inner.holds.insert(hold.clone()) {
                    Ok(hold) => {
                        if renewed {
                            inner.watchdog.watch(hold.clone());
                        }
                        if !backend.ends_holds() {
                            tokio::spawn(hold.clone().end_unrenewed());
                        }
                        tracing::debug!(token, ?waited, "acquired");
                        hold
                    }
                    Err(existing) => {
                        // Another task of this owner won the same lock at
                        // the same time: nest into its hold, give ours back.
                        hold.set_unused();
                        inner.send(Job::Release(hold.r.clone()));
                        existing
                    }
                }));
            }
            Outcome::Refused(why) => {
                // An earlier queue place, if any, is withdrawn by the cleanup.
                if attempt.ticket.is_none() {
                    cleanup.disarm();
                }
                // Refused for what it asked (a semaphore of another size):
                // a release it was called for may serve another.
                if let Some(i) = interest.take() {
                    i.pass();
                }
                return Err(Error::invalid(why));
            }
            Outcome::Busy(blocked) => {
                attempt.ticket = blocked.ticket;
                // Nothing to withdraw without a queue place, unless an
                // earlier try failed without an answer: it may still land
                // and grant the lock to nobody.
                cleanup.attempt =
                    (blocked.ticket.is_some() || cleanup.doubtful).then(|| attempt.clone());
                let (Some(interest), Some(seen)) = (interest.as_mut(), seen) else {
                    return Ok(None);
                };
                interest.set_ticket(blocked.ticket);
                let now = Instant::now();
                if let Some(d) = deadline.filter(|d| *d <= now) {
                    // Withdraw now rather than in the background, so that
                    // what this caller does next finds no trace of the wait;
                    // but within a request timeout of the deadline, as
                    // every call: past that the background does it. The
                    // cleanup stays armed meanwhile: a caller that goes
                    // away during the withdrawal still has it done.
                    let patience = d
                        .checked_add(timeout)
                        .map_or(timeout, |h| h.saturating_duration_since(now));
                    if let Some(a) = cleanup.attempt.as_ref()
                        && !patience.is_zero()
                    {
                        let gone = a.withdrawal();
                        // A try that may yet land is withdrawn once more
                        // by the cleanup, later (see `Job::Abandon`).
                        if bounded(
                            patience,
                            backend.scheme(),
                            "abandon",
                            backend.abandon(&gone),
                        )
                        .await
                        .is_ok()
                            && !cleanup.doubtful
                        {
                            cleanup.disarm();
                        }
                    }
                    return Ok(None);
                }
                if waiting_since.is_none() {
                    tracing::debug!(ticket = ?blocked.ticket, "waiting");
                    waiting_since = Some(now);
                }
                // A backend that says "at once" saw this waiter's own place
                // change (its queue entry gone): it looks again whether it
                // leads or not.
                let own = blocked.retry_after == Some(Duration::ZERO);
                // A queue place that ends unless its waiter attempts again
                // is kept by attempting, leader or not.
                let keep_place = attempt.ticket.is_some() && backend.places_expire();
                let fallback = blocked
                    .retry_after
                    .unwrap_or(MAX_FALLBACK)
                    .clamp(Duration::from_millis(1), MAX_FALLBACK);
                let mut until = now + fallback;
                loop {
                    let wake = deadline.map_or(until, |d| d.min(until));
                    tokio::select! {
                        // Biased: one order of branches, so a seed replays the same.
                        biased;
                        _ = interest.changed_since(seen) => break,
                        _ = tokio::time::sleep_until(wake) => {}
                    }
                    // With no notification, only the leader of this
                    // client's waiters asks the server again (the others
                    // would ask what it just asked), and each at its own
                    // deadline.
                    if own
                        || deadline.is_some_and(|d| d <= wake)
                        || (keep_place && wake >= sent + QUEUE_TTL / 3)
                        || interest.leads()
                    {
                        break;
                    }
                    until = wake + MAX_FALLBACK;
                }
            }
        }
    }
}

/// `f`, failing as [`Unavailable`](crate::ErrorKind::Unavailable) if the
/// backend does not answer within `limit`: no request waits for ever on a
/// server that stopped answering.
pub(crate) fn bounded<'a, T: Send + 'a>(
    limit: Duration,
    scheme: &'static str,
    op: &'static str,
    f: impl Future<Output = Result<T>> + Send + 'a,
) -> Reply<'a, T> {
    Box::pin(async move {
        let sent = Instant::now();
        let r = match tokio::time::timeout(limit, f).await {
            Ok(r) => r,
            Err(_) => Err(Error::unavailable(format!(
                "the {scheme} backend did not answer within {limit:?}"
            ))),
        };
        crate::core::metrics::request(scheme, op, sent.elapsed(), r.is_ok());
        r
    })
}

/// After a failed try: waits out the pause `policy` sets before retry
/// number `retry` and counts it, when the error is transient and the pause
/// ends before `deadline`; else gives the error back.
async fn pause_before_retry(
    policy: &RetryPolicy,
    retry: &mut u32,
    started: Instant,
    deadline: Option<Instant>,
    e: Error,
) -> Result<()> {
    if !e.is_transient() {
        return Err(e);
    }
    let Some(delay) = policy.delay(*retry, started.elapsed()) else {
        return Err(e);
    };
    let resume = Instant::now().checked_add(delay);
    if deadline.is_some_and(|d| resume.is_none_or(|r| r >= d)) {
        return Err(e);
    }
    tracing::warn!(error = %e, retry = *retry, ?delay, "backend unavailable; retrying");
    tokio::time::sleep(delay).await;
    *retry += 1;
    Ok(())
}

/// Retries under one policy, counted across every call it serves: one
/// operation of several steps (a queue push) spends a single budget.
pub(crate) struct Retries<'p> {
    policy: &'p RetryPolicy,
    deadline: Option<Instant>,
    started: Instant,
    retry: u32,
}

impl<'p> Retries<'p> {
    pub(crate) fn new(policy: &'p RetryPolicy, deadline: Option<Instant>) -> Self {
        Retries {
            policy,
            deadline,
            started: Instant::now(),
            retry: 0,
        }
    }

    /// Waits before the next retry after `e`; `e` back when it is not
    /// transient, the retries are spent or the deadline would pass.
    pub(crate) async fn pause(&mut self, e: Error) -> Result<()> {
        pause_before_retry(self.policy, &mut self.retry, self.started, self.deadline, e).await
    }

    /// `f` until it answers, retried while the budget lasts.
    pub(crate) async fn run<T, Fut>(&mut self, mut f: impl FnMut() -> Fut) -> Result<T>
    where
        Fut: Future<Output = Result<T>>,
    {
        loop {
            match f().await {
                Ok(v) => return Ok(v),
                Err(e) => self.pause(e).await?,
            }
        }
    }
}

/// Runs `f`, retrying transient errors under `policy` but never past `deadline`.
pub(crate) async fn with_retry<'a, T>(
    policy: &RetryPolicy,
    deadline: Option<Instant>,
    f: impl FnMut() -> Reply<'a, T>,
) -> Result<T> {
    Retries::new(policy, deadline).run(f).await
}
