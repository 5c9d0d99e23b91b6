//! `redlock://h1:p1,h2:p2,h3:p3`: RedLock over independent masters.
//!
//! An attempt runs the single-server acquire script on every master at
//! once. The lock is held only if a majority granted it and time is left
//! of the lease after the round (lease − elapsed − a clock-drift allowance
//! of 1 % + 2 ms); otherwise every grant is given back and, after a split
//! vote, the caller retries after a random pause.
//!
//! **Fencing across masters.** Each master issues a token from its own
//! counter; the hold's token is the largest of the majority, and every
//! master that granted is then raised to it before the grant counts (a
//! majority must confirm). Any later majority shares a master with this
//! one, whose counter is at least this token, so later tokens are larger.
//! This assumes a master does not forget its counter: run masters with
//! `appendfsync always`, or keep a restarted master out for one maximum
//! lease (RedLock's delayed restart). Every counter also never issues less
//! than its server's clock in microseconds, which covers a restart without
//! persistence as long as the clocks are sane.
//!
//! The fenced register (`FencedRegister`) of a `redlock://` client lives on
//! the first master: it is a convenience beside the lock, not part of the
//! quorum.

use super::{PARAMS, RedisBackend};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::endpoints::Endpoints;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, Blocked, HoldRef, HolderInfo, LockBackend, LockStatus, Mode, Outcome,
    RegisterValue, RegisterWrite, Renewal, Reply, Store, Withdrawal,
};
use futures_util::future::join_all;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Per-master timeout unless the URL says otherwise: small against a lease,
/// so one dead master does not eat the validity of a grant.
const NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// Takes the per-master `timeout=` from a `redlock://` URL (else
/// [`NODE_TIMEOUT`]); refuses what does not apply to RedLock's masters,
/// which have no replicas to wait for.
fn node_timeout(ep: &mut Endpoints) -> Result<Duration> {
    for key in ["min_replicas", "wait_timeout"] {
        if ep.take(key).is_some() {
            return Err(Error::invalid(format!(
                "{key} does not apply to redlock:// (its masters have no replicas in \
                 RedLock's model)"
            )));
        }
    }
    match ep.take("timeout") {
        None => Ok(NODE_TIMEOUT),
        Some(v) => crate::spi::endpoints::parse_timeout(&v, "a redlock:// URL"),
    }
}

pub(crate) struct RedLockBackend {
    nodes: Vec<RedisBackend>,
    /// Each master's request timeout.
    node_timeout: Duration,
    identity: String,
}

impl RedLockBackend {
    pub(crate) async fn open(url: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
        let mut ep = Endpoints::parse(url, super::DEFAULT_PORT)?;
        if !ep.path.is_empty() {
            return Err(Error::invalid(format!(
                "{:?}: a redlock:// URL has no path (every master uses database 0)",
                ep.redacted()
            )));
        }
        let node_timeout = node_timeout(&mut ep)?;
        let creds = ep
            .userinfo
            .as_ref()
            .map_or(String::new(), |u| format!("{u}@"));
        // What is left of the query applies to every master (`layout=`).
        let rest = ep.rest_query();
        let mut nodes = Vec::new();
        for i in 0..ep.hosts.len() {
            let one = format!(
                "redis://{creds}{}?timeout={}ms&{rest}",
                ep.addr(i),
                node_timeout.as_millis(),
            );
            let mut node_ep = Endpoints::parse(&one, super::DEFAULT_PORT)?;
            let mut node = RedisBackend::from_endpoints(&mut node_ep, wakeups.clone())?;
            node.queue_waiters = false;
            node_ep.finish(PARAMS)?;
            nodes.push(node);
        }
        let identity = super::identity_of("redlock", &ep);
        let backend = RedLockBackend {
            nodes,
            node_timeout,
            identity,
        };
        // Every master must answer at start: a typo in one address should
        // not hide behind the quorum.
        for r in join_all(backend.nodes.iter().map(|n| n.check())).await {
            r?;
        }
        Ok(Arc::new(backend))
    }

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    async fn attempt_inner(&self, req: &Attempt) -> Result<Outcome> {
        if let Mode::Permits { .. } = req.mode {
            // k permits granted by a majority each are not k permits: with
            // 3 masters and 3 permits, holders on {1,2}, {2,3}, {1,3} and
            // {1,2} fit every master's count, and make 4.
            return Err(Error::invalid(
                "redlock:// has no semaphores: a majority of masters cannot bound a count of \
                 permits (only exclusion survives quorum intersection); use a semaphore on \
                 redis://, redis+sentinel:// or redis+cluster://",
            ));
        }
        let started = Instant::now();
        let replies = join_all(self.nodes.iter().map(|n| n.attempt_inner(req))).await;
        let elapsed = started.elapsed();
        let drift = req.lease / 100 + Duration::from_millis(2);
        let valid = req.lease.checked_sub(elapsed + drift).is_some();
        let mut granted = Vec::new();
        let mut refused = None;
        let mut errors = Vec::new();
        let mut soonest: Option<Duration> = None;
        for (i, r) in replies.into_iter().enumerate() {
            match r {
                Ok(Outcome::Granted { token, .. }) => granted.push((i, token)),
                Ok(Outcome::Refused(why)) => refused = Some(why),
                Ok(Outcome::Busy(b)) => {
                    soonest = match (soonest, b.retry_after) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        if let Some(why) = refused {
            self.give_back(req, &granted).await;
            return Ok(Outcome::Refused(why));
        }
        if granted.len() >= self.quorum() && valid {
            let token = granted.iter().map(|(_, t)| *t).max().unwrap_or(0);
            let raised = join_all(
                granted
                    .iter()
                    .map(|(i, _)| self.nodes[*i].raise(&req.name, token)),
            )
            .await;
            if raised.iter().filter(|r| r.is_ok()).count() >= self.quorum() {
                return Ok(Outcome::granted(token));
            }
            self.give_back(req, &granted).await;
            return Err(Error::unavailable(format!(
                "RedLock on {:?}: a majority granted but could not agree on the fencing token",
                req.name.as_str()
            )));
        }
        self.give_back(req, &granted).await;
        if errors.len() > self.nodes.len() - self.quorum() {
            let first = errors.swap_remove(0);
            return Err(Error::unavailable(format!(
                "RedLock on {:?}: {} of {} masters failed, no majority is possible: {first}",
                req.name.as_str(),
                errors.len() + 1,
                self.nodes.len()
            ))
            .with_source(first));
        }
        let retry_after = if granted.is_empty() {
            soonest
        } else {
            // A split vote: contenders back off for a random while so one
            // of them can win the next round.
            Some(Duration::from_millis(fastrand::u64(5..=50)))
        };
        Ok(Outcome::Busy(Blocked {
            ticket: None,
            retry_after,
        }))
    }

    async fn give_back(&self, req: &Attempt, granted: &[(usize, u64)]) {
        let r = req.hold_ref();
        join_all(
            granted
                .iter()
                .map(|(i, _)| self.nodes[*i].release_inner(&r)),
        )
        .await;
    }

    /// Runs `f` on every master; fails only if no master answered.
    async fn on_all<'a, T, F, Fut>(&'a self, f: F) -> Result<Vec<T>>
    where
        F: Fn(&'a RedisBackend) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut ok = Vec::new();
        let mut last = None;
        for r in join_all(self.nodes.iter().map(f)).await {
            match r {
                Ok(v) => ok.push(v),
                Err(e) => last = Some(e),
            }
        }
        match (ok.is_empty(), last) {
            (true, Some(e)) => Err(e),
            _ => Ok(ok),
        }
    }
}

impl LockBackend for RedLockBackend {
    fn doctor(&self) -> Reply<'_, Vec<crate::doctor::Check>> {
        Box::pin(async move {
            // Each master on its own: RedLock's safety assumes every one
            // keeps its keys and its counter through a restart.
            // All at once, each within its own timeout: a master that is
            // down is a finding, not the end of the report.
            let per = join_all(
                self.nodes
                    .iter()
                    .map(|n| tokio::time::timeout(self.node_timeout * 8, n.checks())),
            )
            .await;
            let mut out = Vec::new();
            let down = per.iter().filter(|r| !matches!(r, Ok(Ok(_)))).count();
            for (i, r) in per.into_iter().enumerate() {
                match r {
                    Ok(Ok(checks)) => {
                        for mut c in checks {
                            c.name = format!("master {}: {}", i + 1, c.name);
                            out.push(c);
                        }
                    }
                    Ok(Err(e)) => out.push(unreachable(i, &e.to_string(), down, self.nodes.len())),
                    Err(_) => out.push(unreachable(i, "no answer in time", down, self.nodes.len())),
                }
            }
            Ok(out)
        })
    }

    fn scheme(&self) -> &'static str {
        "redlock"
    }

    fn supports_fair(&self) -> bool {
        false
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome> {
        Box::pin(self.attempt_inner(req))
    }

    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>> {
        Box::pin(async move {
            let per_node = join_all(self.nodes.iter().map(|n| n.renew_inner(holds))).await;
            Ok((0..holds.len())
                .map(|i| {
                    let said = |r: Renewal| {
                        per_node
                            .iter()
                            .filter(|v| v.as_ref().is_ok_and(|v| v.get(i) == Some(&r)))
                            .count()
                    };
                    let held = said(Renewal::Held);
                    // Masters that did not answer might still hold it: the
                    // hold is gone only when a majority says so.
                    let gone = said(Renewal::Gone);
                    if held >= self.quorum() {
                        Renewal::Held
                    } else if gone > self.nodes.len() - self.quorum() {
                        Renewal::Gone
                    } else {
                        Renewal::Unknown
                    }
                })
                .collect())
        })
    }

    fn request_timeout(&self) -> Duration {
        // A round: every master at once, then the token raised on the
        // majority, with room for both.
        self.node_timeout * 4
    }

    fn identity(&self) -> String {
        self.identity.clone()
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> Reply<'a, bool> {
        Box::pin(async move {
            let (mut had, mut unknown, mut last) = (0, 0, None);
            for r in join_all(self.nodes.iter().map(|n| n.release_inner(hold))).await {
                match r {
                    Ok(h) => had += usize::from(h),
                    Err(e) => {
                        unknown += 1;
                        last = Some(e);
                    }
                }
            }
            match last {
                // Masters that did not answer may have released it: with
                // them a majority may have, so the answer is not yet known.
                Some(e) if had < self.quorum() && had + unknown >= self.quorum() => Err(e),
                _ => Ok(had >= self.quorum()),
            }
        })
    }

    fn abandon<'a>(&'a self, gone: &'a Withdrawal) -> Reply<'a, ()> {
        Box::pin(async move {
            self.on_all(|n| n.abandon_inner(gone)).await?;
            Ok(())
        })
    }

    /// The names any master knows: `status` then counts a majority.
    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>> {
        Box::pin(async move {
            let all = self.on_all(|n| n.names_inner(prefix)).await?;
            Ok(all.into_iter().flatten().collect())
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus> {
        Box::pin(async move {
            let all = self.on_all(|n| n.status_inner(name)).await?;
            // A holder counts where a majority names it; and when no
            // majority is free (holds a minority each, such as a dropped
            // acquisition's still being withdrawn), every named holder
            // does: the lock is not to be had until they go.
            let free = all.iter().filter(|s| s.holders.is_empty()).count();
            let named_by = if free >= self.quorum() {
                self.quorum()
            } else {
                1
            };
            let mut merged: Vec<(HolderInfo, usize)> = Vec::new();
            for h in all.iter().flat_map(|s| &s.holders) {
                match merged
                    .iter_mut()
                    .find(|(m, _)| m.owner == h.owner && m.mode == h.mode)
                {
                    Some((m, n)) => {
                        m.token = m.token.max(h.token);
                        m.lease_left = m.lease_left.min(h.lease_left);
                        *n += 1;
                    }
                    None => merged.push((h.clone(), 1)),
                }
            }
            Ok(LockStatus {
                holders: merged
                    .into_iter()
                    .filter(|(_, n)| *n >= named_by)
                    .map(|(h, _)| h)
                    .collect(),
                waiters: all.iter().map(|s| s.waiters).max().unwrap_or(0),
                last_token: all.iter().map(|s| s.last_token).max().unwrap_or(0),
            })
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> Reply<'a, usize> {
        Box::pin(async move {
            let n = self.on_all(|n| n.force_inner(name)).await?;
            Ok(n.into_iter().max().unwrap_or(0))
        })
    }
}

impl Store for RedLockBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        Box::pin(self.nodes[0].register_read_inner(name))
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        Box::pin(self.nodes[0].register_write_inner(write))
    }

    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>> {
        Box::pin(self.nodes[0].register_decrement_inner(name, by))
    }

    fn watch_register<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()> {
        Box::pin(self.nodes[0].watch_register_inner(name))
    }

    fn register_delete<'a>(&'a self, name: &'a LockName) -> Reply<'a, bool> {
        Box::pin(self.nodes[0].register_delete_inner(name))
    }

    fn register_add<'a>(&'a self, name: &'a LockName, delta: i64) -> Reply<'a, Option<i64>> {
        Box::pin(self.nodes[0].register_add_inner(name, delta))
    }

    fn has_rate_limiters(&self) -> bool {
        // No one server: each master keeps its own clock and state.
        false
    }
}

impl Backend for RedLockBackend {}

/// The check of a master that could not be read: a warning while a
/// majority answers (RedLock goes on without it), a failure once not.
fn unreachable(i: usize, why: &str, down: usize, n: usize) -> crate::doctor::Check {
    use crate::doctor::{Check, Verdict};
    let verdict = if n - down > n / 2 {
        Verdict::Warn
    } else {
        Verdict::Fail
    };
    Check::new(
        &format!("master {}: reachable", i + 1),
        verdict,
        format!("{why} ({down} of {n} masters unreadable; a majority must answer to grant)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout_of(url: &str) -> Result<Duration> {
        node_timeout(&mut Endpoints::parse(url, 6379)?)
    }

    /// `timeout=` sets the per-master timeout; a `wait_timeout=` (which
    /// has "timeout=" in it) neither sets it nor passes unnoticed.
    #[test]
    fn timeouts_are_parsed_by_name() {
        assert_eq!(timeout_of("redlock://a,b,c").unwrap(), NODE_TIMEOUT);
        assert_eq!(
            timeout_of("redlock://a,b,c?timeout=2s").unwrap(),
            Duration::from_secs(2)
        );
        let e = timeout_of("redlock://a,b,c?wait_timeout=2s").unwrap_err();
        assert!(e.to_string().contains("wait_timeout"), "{e}");
        assert!(timeout_of("redlock://a,b,c?min_replicas=1").is_err());
        assert!(timeout_of("redlock://a,b,c?timeout=0").is_err());
        // Past an hour, the arithmetic on instants could overflow.
        assert!(timeout_of("redlock://a,b,c?timeout=10000000000000000000s").is_err());
        assert!(timeout_of("redlock://a,b,c?timeout=2h").is_err());
    }
}
