//! One try, a release, a renewal, status: each one script call.

use super::*;

impl RedisBackend {
    /// Connects once, so that a wrong address or password fails at
    /// `Client::connect`, and warns if the server may evict lock keys.
    pub(super) async fn check(&self) -> Result<()> {
        self.node
            .run(|mut c| async move { redis::cmd("PING").query_async::<()>(&mut c).await })
            .await?;
        let policy = self
            .node
            .run(|mut c| async move {
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("maxmemory-policy")
                    .query_async::<Vec<String>>(&mut c)
                    .await
            })
            .await;
        // CONFIG is often disabled on managed Redis: then we cannot tell.
        if let Ok(p) = policy
            && let Some(p) = p.get(1)
            && p != "noeviction"
        {
            tracing::warn!(
                server = %self.node.label,
                policy = %p,
                "Redis may evict keys under memory pressure (maxmemory-policy is not \
                 noeviction): an evicted lock key frees the lock early"
            );
        }
        Ok(())
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.node.target, Target::Cluster(..))
    }

    /// One acquire script run. With `min_replicas`, a grant counts only
    /// once that many replicas have it (`WAIT`, on the same connection as
    /// the script: see [`Lane::Wait`]); otherwise it is given back.
    pub(super) async fn acquire_once(&self, req: &Attempt, k: &Keys) -> Result<Outcome> {
        let field = match self.layout {
            Layout::Redisson => &req.owner_key,
            // redis-py's value is the holder's token: ours is the hold id.
            Layout::Simple => &req.hold_id,
        };
        let (take, max) = req.mode.permits();
        let ticket = req.ticket.map(|t| t.to_string()).unwrap_or_default();
        let lease = ms(req.lease);
        let want = self.min_replicas;
        let lane = if want > 0 { Lane::Wait } else { Lane::Main };
        let wait_ms = ms(self.wait_timeout);
        let (reply, replicas): (Vec<i64>, Option<i64>) = self
            .node
            .run_on(lane, |mut c| async move {
                let mut inv = self.scripts.acquire.prepare_invoke();
                for key in k.lock_keys() {
                    inv.key(key);
                }
                inv.arg(field)
                    .arg(&req.hold_id)
                    .arg(req.mode.code())
                    .arg(take)
                    .arg(max)
                    .arg(lease)
                    .arg(u8::from(req.fair))
                    .arg(u8::from(req.will_wait))
                    .arg(ticket)
                    .arg(&k.channel)
                    .arg(ms(QUEUE_TTL))
                    .arg(u8::from(self.queue_waiters))
                    // Each client waits on one channel of its own per
                    // lock, whichever of its acquisitions waits: the
                    // published ticket says which (every acquisition is
                    // its own owner, so a channel per owner would be a
                    // subscription per wait).
                    .arg(req.client_id())
                    .arg(&req.holder);
                let reply: Vec<i64> = inv.invoke_async(&mut c).await?;
                let replicas = if want > 0 && reply.first() == Some(&1) {
                    Some(c.wait_replicas(&k.lock, want, wait_ms).await?)
                } else {
                    None
                };
                Ok((reply, replicas))
            })
            .await?;
        match reply.as_slice() {
            [1, token] => {
                if let Some(got) = replicas
                    && got < i64::from(want)
                {
                    let r = req.hold_ref();
                    let _ = self.release_inner(&r).await;
                    return Err(Error::unavailable(format!(
                        "only {got} of the {want} replicas asked for (min_replicas) confirmed \
                         the grant of {:?} within {:?}; it was given back",
                        req.name.as_str(),
                        self.wait_timeout
                    )));
                }
                Ok(Outcome::granted(*token as u64))
            }
            [-2, theirs] => Ok(Outcome::Refused(permits_differ(
                req.name.as_str(),
                *theirs as u32,
                max,
            ))),
            [0, ticket, soonest] => Ok(Outcome::Busy(Blocked {
                ticket: (*ticket >= 0).then_some(*ticket as Ticket),
                retry_after: (*soonest >= 0).then(|| Duration::from_millis(*soonest as u64)),
            })),
            other => Err(Error::protocol(format!(
                "unexpected reply {other:?} from the acquire script at {}",
                self.node.label
            ))),
        }
    }

    /// The attempt as a single-server lock: the script, and a subscription
    /// before waiting.
    pub(super) async fn attempt_inner(&self, req: &Attempt) -> Result<Outcome> {
        let k = self.checked_keys(req)?;
        let mut outcome = self.acquire_once(req, &k).await?;
        if matches!(outcome, Outcome::Busy(_))
            && req.will_wait
            && self
                .subscriber
                .ensure(
                    &self.node,
                    &[k.channel.clone(), k.wake_channel(req.client_id())],
                    req.name.as_str(),
                )
                .await?
        {
            // Subscribed just now: a release may have come before it.
            let mut again = req.clone();
            if let Outcome::Busy(b) = &outcome {
                again.ticket = b.ticket.or(req.ticket);
            }
            outcome = self.acquire_once(&again, &k).await?;
        }
        Ok(outcome)
    }

    pub(super) fn checked_keys(&self, req: &Attempt) -> Result<Keys> {
        if self.layout == Layout::Simple && req.mode != Mode::Exclusive {
            return Err(Error::invalid(format!(
                "layout=simple (redis-py's Lock) has mutexes only; {:?} needs the default \
                 layout=redisson",
                req.mode
            )));
        }
        Keys::of(&req.name)
    }

    pub(super) async fn release_inner(&self, hold: &HoldRef) -> Result<bool> {
        let k = Keys::of(&hold.name)?;
        let cluster = self.is_cluster();
        // Past the last time the cluster driver could send it again.
        let remember = ms(self.timeout * 2).max(1000);
        let n: i64 = self
            .node
            .run(|mut c| async move {
                let script = if cluster {
                    &self.scripts.release_cluster
                } else {
                    &self.scripts.release
                };
                let mut inv = script.prepare_invoke();
                for key in k.lock_keys() {
                    inv.key(key);
                }
                inv.arg(&hold.hold_id).arg(&k.channel).arg(&hold.owner_key);
                if cluster {
                    inv.key(&k.released).arg(remember);
                }
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    pub(super) async fn renew_inner(&self, holds: &[HoldRef]) -> Result<Vec<Renewal>> {
        let keys = holds
            .iter()
            .map(|h| Keys::of(&h.name))
            .collect::<Result<Vec<_>>>()?;
        let batch = if self.is_cluster() { 1 } else { RENEW_BATCH };
        let calls = holds.chunks(batch).zip(keys.chunks(batch)).map(|(hs, ks)| {
            self.node.run(move |mut c: Conn| async move {
                let mut inv = self.scripts.renew.prepare_invoke();
                for (h, k) in hs.iter().zip(ks) {
                    inv.key(&k.lock).key(&k.holds);
                    inv.arg(&h.hold_id).arg(ms(h.lease));
                }
                inv.invoke_async::<Vec<i64>>(&mut c).await
            })
        });
        // Concurrent calls on one multiplexed connection go out together:
        // one round trip per tick.
        let mut replies = futures_util::future::join_all(calls).await;
        if replies.iter().all(|r| r.is_err())
            && let Some(Err(e)) = replies.pop()
        {
            return Err(e);
        }
        // One failed call (a Cluster slot moving) leaves its own holds
        // unknown, not the others of the tick.
        let mut out = Vec::with_capacity(holds.len());
        for (r, hs) in replies.into_iter().zip(holds.chunks(batch)) {
            match r {
                Ok(v) => out.extend(v.into_iter().map(|v| Renewal::from(v == 1))),
                Err(_) => out.extend(hs.iter().map(|_| Renewal::Unknown)),
            }
        }
        Ok(out)
    }

    pub(super) async fn abandon_inner(&self, gone: &Withdrawal) -> Result<()> {
        let (k, hold_id) = (Keys::of(&gone.name)?, &gone.hold_id);
        let ticket = gone.ticket.map(|t| t.to_string()).unwrap_or_default();
        self.node
            .run(|mut c| async move {
                let mut inv = self.scripts.abandon.prepare_invoke();
                for key in k.lock_keys() {
                    inv.key(key);
                }
                inv.arg(ticket).arg(hold_id).arg(&k.channel);
                inv.invoke_async::<()>(&mut c).await
            })
            .await
    }

    pub(super) async fn status_inner(&self, name: &LockName) -> Result<LockStatus> {
        let k = Keys::of(name)?;
        let reply: Vec<Value> = self
            .node
            .run(|mut c| async move {
                let mut inv = self.scripts.status.prepare_invoke();
                for key in k.lock_keys() {
                    inv.key(key);
                }
                inv.invoke_async(&mut c).await
            })
            .await?;
        let bad = |what: &str| {
            Error::protocol(format!(
                "unexpected status reply from {} ({what})",
                self.node.label
            ))
        };
        let mut it = reply.into_iter();
        let last: i64 = it
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .ok_or_else(|| bad("last token"))?;
        let waiters: i64 = it
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .ok_or_else(|| bad("waiters"))?;
        let mut holders = Vec::new();
        for v in it {
            #[allow(clippy::type_complexity)]
            let (owner, mode, take, max, token, left, holder): (
                String,
                i64,
                u32,
                u32,
                i64,
                i64,
                Option<Vec<u8>>,
            ) = redis::from_redis_value(v).map_err(|_| bad("holder"))?;
            holders.push(HolderInfo {
                owner,
                mode: Mode::from_code(mode, take, max).ok_or_else(|| bad("mode"))?,
                // A foreign holder (Redisson, redis-py) has no token of ours.
                token: if token > 0 { token as u64 } else { last as u64 },
                lease_left: Duration::from_millis(left.max(0) as u64),
                holder: holder.and_then(|h| crate::Holder::decode(&h)),
            });
        }
        Ok(LockStatus::new(holders, waiters as usize, last as u64))
    }

    pub(super) async fn force_inner(&self, name: &LockName) -> Result<usize> {
        let k = Keys::of(name)?;
        let n: i64 = self
            .node
            .run(|mut c| async move {
                let mut inv = self.scripts.force.prepare_invoke();
                for key in k.lock_keys() {
                    inv.key(key);
                }
                inv.arg(&k.channel);
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok(n as usize)
    }
}
