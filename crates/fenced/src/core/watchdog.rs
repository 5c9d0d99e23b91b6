//! The watchdog: ONE renewal task per client for all its renewed holds.
//!
//! Holds wait in a schedule ordered by their next renewal time. When the
//! earliest is due, the task takes every hold due within a quarter of its
//! own interval and renews them in one backend call per 1,000 holds (one
//! transaction, pipeline or script), so 100,000 leases cost a few calls per
//! tick, not 100,000 timers. The calls run concurrently, each in a task of
//! its own and bounded by the request timeout, so a slow one never keeps
//! the schedule from the next: a short-lease hold due meanwhile is renewed
//! on time. The task exits when nothing is scheduled and is started again
//! by the next hold.

use crate::core::hold::{Hold, LostReason};
use crate::spi::sync::unpoisoned;
use crate::spi::{Backend, Renewal};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

const BATCH: usize = 1000;

pub(crate) struct Watchdog {
    backend: Arc<dyn Backend>,
    sched: Mutex<Sched>,
    notify: Notify,
}

#[derive(Default)]
struct Sched {
    queue: BTreeMap<(Instant, u64), Arc<Hold>>,
    seq: u64,
    running: bool,
}

impl Watchdog {
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Arc<Self> {
        Arc::new(Watchdog {
            backend,
            sched: Mutex::default(),
            notify: Notify::new(),
        })
    }

    fn sched(&self) -> std::sync::MutexGuard<'_, Sched> {
        unpoisoned(&self.sched)
    }

    /// Starts renewing `hold` one interval from now.
    pub(crate) fn watch(self: &Arc<Self>, hold: Arc<Hold>) {
        let at = Instant::now() + hold.renew_interval();
        self.schedule(hold, at);
    }

    /// Has the task look at its queue now: it drops released and lost
    /// holds, and ends (letting go of the backend) if none is left.
    pub(crate) fn wake(&self) {
        self.notify.notify_one();
    }

    /// Renews `hold` at `at`, starting the task if it is not running.
    fn schedule(self: &Arc<Self>, hold: Arc<Hold>, at: Instant) {
        let (spawn, wake) = {
            let mut s = self.sched();
            let earliest = s.queue.keys().next().map(|k| k.0);
            s.seq += 1;
            let seq = s.seq;
            s.queue.insert((at, seq), hold);
            if s.running {
                (false, earliest.is_none_or(|e| at < e))
            } else {
                s.running = true;
                (true, false)
            }
        };
        if spawn {
            tokio::spawn(self.clone().run());
        } else if wake {
            self.notify.notify_one();
        }
    }

    /// Takes the due batch, or says how long to sleep; `None` = nothing left.
    fn due(&self) -> Option<Result<Vec<Arc<Hold>>, Instant>> {
        let mut s = self.sched();
        let now = Instant::now();
        // Drop holds that were released or already lost.
        s.queue
            .retain(|_, h| !h.is_released() && h.state().lost.is_none());
        let Some((&(first, _), _)) = s.queue.iter().next() else {
            s.running = false;
            return None;
        };
        if first > now {
            return Some(Err(first));
        }
        let mut batch = Vec::new();
        let keys: Vec<_> = s
            .queue
            .iter()
            .filter(|((at, _), h)| *at <= now + h.renew_interval() / 4)
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(h) = s.queue.remove(&k) {
                batch.push(h);
            }
        }
        Some(Ok(batch))
    }

    async fn run(self: Arc<Self>) {
        loop {
            let batch = match self.due() {
                None => return,
                Some(Err(next)) => {
                    tokio::select! {
                        // Biased: one order of branches, so a seed replays the same.
                        biased;
                        _ = tokio::time::sleep_until(next) => {}
                        _ = self.notify.notified() => {}
                    }
                    continue;
                }
                Some(Ok(batch)) => batch,
            };
            let (live, expired): (Vec<_>, Vec<_>) = batch.into_iter().partition(|h| h.is_held());
            for h in expired {
                h.mark_lost(h.ran_out().unwrap_or(LostReason::Expired));
            }
            for chunk in live.chunks(BATCH) {
                let (me, chunk) = (self.clone(), chunk.to_vec());
                tokio::spawn(async move { me.renew(&chunk).await });
            }
        }
    }

    async fn renew(self: &Arc<Self>, holds: &[Arc<Hold>]) {
        let refs: Vec<_> = holds.iter().map(|h| h.r.clone()).collect();
        let sent = Instant::now();
        // A renewal that takes longer than the shortest lease is useless,
        // and one past the request timeout is given up and tried again.
        let limit = holds
            .iter()
            .map(|h| h.lease_left())
            .min()
            .unwrap_or(Duration::ZERO)
            .min(self.backend.request_timeout())
            .max(Duration::from_millis(1));
        let mut answered = true;
        let results = match tokio::time::timeout(limit, self.backend.renew(&refs)).await {
            Ok(Ok(results)) if results.len() == holds.len() => results,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(r)) => format!("{} answers for {} holds", r.len(), holds.len()),
                    Err(_) => format!("no answer within {limit:?}"),
                };
                tracing::warn!(holds = holds.len(), error = %why, "lease renewal failed; retrying");
                answered = false;
                vec![Renewal::Unknown; holds.len()]
            }
        };
        let scheme = self.backend.scheme();
        crate::core::metrics::request(scheme, "renew", sent.elapsed(), answered);
        for (h, renewal) in holds.iter().zip(results) {
            match renewal {
                Renewal::Held => {
                    // What the hold had left as the confirmation came; a
                    // confirmation past the deadline renews nothing.
                    let margin = h.lease_left();
                    h.confirm(sent);
                    if h.is_held() {
                        crate::core::metrics::renewal(scheme, "renewed", Some(margin));
                    } else {
                        crate::core::metrics::renewal(scheme, "late", None);
                    }
                    tracing::trace!(parent: &h.span(), lock = %h.r.name, token = h.token, "renewed");
                    self.schedule(h.clone(), sent + h.renew_interval());
                }
                Renewal::Gone => {
                    crate::core::metrics::renewal(scheme, "gone", None);
                    h.mark_lost(LostReason::Taken);
                }
                Renewal::Unknown if h.is_held() => {
                    crate::core::metrics::renewal(scheme, "unknown", None);
                    let retry = (h.renew_interval() / 3).min(h.lease_left());
                    self.schedule(h.clone(), Instant::now() + retry);
                }
                Renewal::Unknown => {
                    crate::core::metrics::renewal(scheme, "unknown", None);
                    h.mark_lost(h.ran_out().unwrap_or(LostReason::Expired));
                }
            }
        }
    }
}
