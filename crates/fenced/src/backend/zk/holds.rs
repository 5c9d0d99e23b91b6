//! The lock backend: attempts, renewals, releases and status.

use super::*;

impl LockBackend for ZkBackend {
    fn doctor(&self) -> Reply<'_, Vec<crate::doctor::Check>> {
        Box::pin(self.checks())
    }

    /// Holds live on the session, not on a lease the server counts: the
    /// core ends one whose lease runs out unrenewed.
    fn ends_holds(&self) -> bool {
        false
    }

    /// Queue places are nodes on the session too.
    fn places_expire(&self) -> bool {
        false
    }

    fn scheme(&self) -> &'static str {
        "zk"
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome> {
        Box::pin(self.inner.attempt(req))
    }

    fn renew<'a>(&'a self, refs: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>> {
        Box::pin(async move {
            let inner = &self.inner;
            let session = inner.session();
            let z = inner.client();
            let checks = refs.iter().map(|r| {
                let z = z.clone();
                async move {
                    let Some(own) = unpoisoned(&inner.nodes).get(&r.hold_id).cloned() else {
                        return Renewal::Gone;
                    };
                    let child = unpoisoned(&own.child).clone();
                    let (Some(child), true) = (child, own.session == session) else {
                        return Renewal::Gone;
                    };
                    let Ok(dir) = ZkShared::path_of(&own.name) else {
                        return Renewal::Gone;
                    };
                    // One hold's failed look says nothing of the others'.
                    let Ok(stat) = z.check_stat(&format!("{dir}/{child}")).await else {
                        return Renewal::Unknown;
                    };
                    let here = stat.is_some_and(|s| s.czxid == *unpoisoned(&own.czxid));
                    if here && let Some(d) = unpoisoned(&own.deadline).as_mut() {
                        *d = Instant::now() + r.lease;
                    }
                    Renewal::from(here)
                }
            });
            Ok(futures_util::future::join_all(checks).await)
        })
    }

    fn request_timeout(&self) -> Duration {
        self.inner.timeout
    }

    fn identity(&self) -> String {
        self.inner.identity.clone()
    }

    fn ownership(&self, hold: &HoldRef) -> Option<crate::spi::Ownership> {
        let own = unpoisoned(&self.inner.nodes).get(&hold.hold_id).cloned()?;
        let child = unpoisoned(&own.child).clone()?;
        let dir = ZkShared::path_of(&own.name).ok()?;
        Some(crate::spi::Ownership {
            key: format!("{dir}/{child}").into_bytes(),
            revision: *unpoisoned(&own.czxid) as u64,
        })
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> Reply<'a, bool> {
        Box::pin(self.inner.end(&hold.hold_id))
    }

    fn release_later(&self, hold: HoldRef) {
        crate::backend::queue::end_in_background(self.inner.clone(), hold.hold_id);
    }

    fn abandon<'a>(&'a self, gone: &'a Withdrawal) -> Reply<'a, ()> {
        Box::pin(async move {
            crate::backend::queue::withdraw(&self.inner, &gone.hold_id).await;
            Ok(())
        })
    }

    /// A lock is a node under the URL's path, as Curator's are: the names
    /// are its children (ZooKeeper filters nothing by prefix; fenced's
    /// records and the server's own node are passed over).
    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>> {
        Box::pin(async move {
            let inner = &self.inner;
            let children = inner
                .client()
                .list_children("/")
                .await
                .map_err(|e| inner.err(e))?;
            Ok(children
                .into_iter()
                .filter(|c| c.starts_with(prefix) && c != "fenced.meta" && c != "zookeeper")
                .filter_map(|c| LockName::new(&c).ok())
                .collect())
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus> {
        Box::pin(async move {
            let inner = &self.inner;
            let (z, queue) = (inner.client(), inner.queue_of(name).await?);
            let Queue {
                dir,
                q,
                owners,
                gated,
            } = queue;
            let mut last_token = inner.meta_get(TOKENS, name).await?.map_or(0, |(_, f, _)| f);
            let mut holders = Vec::new();
            let mut waiters = gated.unwrap_or(0);
            for ((i, (child, mode)), granted) in q.iter().enumerate().zip(grants_in(&q, &owners)) {
                if !granted {
                    // A semaphore's acquirers are counted at its gate.
                    waiters += usize::from(gated.is_none());
                    continue;
                }
                if matches!(mode, Mode::Permits { take: 0, .. }) {
                    // A further lease of a hold of several permits.
                    continue;
                }
                let (data, stat) = match z.get_data(&format!("{dir}/{child}")).await {
                    Ok(got) => got,
                    // Released since the listing.
                    Err(zk::Error::NoNode) => continue,
                    Err(e) => return Err(inner.err(e)),
                };
                let token = stat.czxid as u64;
                last_token = last_token.max(token);
                let lease_left = unpoisoned(&inner.nodes)
                    .values()
                    .find(|o| unpoisoned(&o.child).as_deref() == Some(child.as_str()))
                    .and_then(|o| {
                        unpoisoned(&o.deadline).map(|d| d.saturating_duration_since(Instant::now()))
                    })
                    .unwrap_or(inner.session_timeout);
                holders.push(HolderInfo {
                    owner: owners[i]
                        .clone()
                        .unwrap_or_else(|| format!("zk session {:x}", stat.ephemeral_owner)),
                    mode: *mode,
                    token,
                    lease_left,
                    holder: crate::Holder::decode(&data),
                });
            }
            Ok(LockStatus::new(holders, waiters, last_token))
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> Reply<'a, usize> {
        Box::pin(async move {
            let inner = &self.inner;
            let (z, Queue { dir, q, owners, .. }) = (inner.client(), inner.queue_of(name).await?);
            let mut dropped = 0;
            let mut top = 0;
            // The holders only: waiters keep their places.
            for ((child, mode), granted) in q.iter().zip(grants_in(&q, &owners)) {
                if !granted {
                    continue;
                }
                // A further lease of a hold of several permits goes with
                // it, uncounted.
                let counted = usize::from(!matches!(mode, Mode::Permits { take: 0, .. }));
                let path = format!("{dir}/{child}");
                if let Ok(Some(stat)) = z.check_stat(&path).await {
                    top = top.max(stat.czxid as u64);
                }
                match z.delete(&path, None).await {
                    Ok(()) => dropped += counted,
                    Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(inner.err(e)),
                }
            }
            if top > 0 {
                inner.record_token(name, top).await?;
            }
            inner.wakeups.wake(name.as_str());
            Ok(dropped)
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.monitor.abort();
            let ids: Vec<String> = unpoisoned(&self.inner.nodes).keys().cloned().collect();
            for id in ids {
                let _ = self.inner.end(&id).await;
            }
        })
    }
}

/// A lock's queue as status and force-release see it: its directory,
/// its nodes in sequence order, and their owners where this client knows
/// them.
struct Queue {
    dir: String,
    q: Vec<(String, Mode)>,
    owners: Vec<Option<String>>,
    /// For a semaphore (Curator's layout: leases and a gate, see
    /// `semaphore.rs`), how many wait at its gate: every acquirer that
    /// does not hold yet, the one counting the leases included. Its
    /// queue `q` is the leases, `leases/<child>`.
    gated: Option<usize>,
}

impl ZkShared {
    pub(super) async fn children(&self, dir: &str) -> Result<Vec<String>> {
        match self.client().list_children(dir).await {
            Ok(c) => Ok(c),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(self.err(e)),
        }
    }

    async fn queue_of(&self, name: &LockName) -> Result<Queue> {
        use super::semaphore::{GATE, LEASES, leases, size_of};
        let dir = ZkShared::path_of(name)?;
        let children = self.children(&dir).await?;
        let (q, gated) = if children.iter().any(|c| c == LEASES || c == GATE) {
            let (held, gate) = (format!("{dir}/{LEASES}"), format!("{dir}/{GATE}"));
            let (held, gate) = tokio::try_join!(self.children(&held), self.children(&gate))?;
            // A Curator semaphore's size is its own: where no fenced lease
            // says it, every lease holds.
            let max = size_of(&held).unwrap_or(u32::MAX);
            let q = leases(held, max)
                .into_iter()
                .map(|(c, m)| (format!("{LEASES}/{c}"), m))
                .collect();
            (q, Some(queue(gate).len()))
        } else if children.iter().any(|c| super::barrier::is_member(c)) {
            // A double barrier's members: each in, as long as its node is.
            let mut q: Vec<(String, Mode)> = children
                .into_iter()
                .filter(|c| super::barrier::is_member(c))
                .map(|c| {
                    (
                        c,
                        Mode::Permits {
                            take: 1,
                            max: u32::MAX,
                        },
                    )
                })
                .collect();
            q.sort_by(|a, b| a.0.cmp(&b.0));
            (q, None)
        } else {
            (queue(children), None)
        };
        let owners = q.iter().map(|(c, _)| self.owner_of(name, c)).collect();
        Ok(Queue {
            dir,
            q,
            owners,
            gated,
        })
    }
}

/// Which nodes of the queue `q` hold the lock.
fn grants_in(q: &[(String, Mode)], owners: &[Option<String>]) -> Vec<bool> {
    let view: Vec<(&[u8], Mode)> = q.iter().map(|(c, m)| (c.as_bytes(), *m)).collect();
    grants(&view, owners)
}
