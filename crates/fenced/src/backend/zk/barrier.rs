//! Double barriers in Curator's `DistributedDoubleBarrier` layout, so that
//! Curator's members and fenced's count each other: under the barrier's
//! node `N`, one ephemeral node per member named by a UUID (fenced's is
//! its hold's protected id), and `N/ready`, created by the member that
//! finds them all in and deleted by each leaver once the barrier is
//! empty. The protocol itself is `DoubleBarrier`'s (`barrier.rs` above).

use super::*;
use crate::spi::BarrierLayout;
use crate::spi::wake::register_key;

/// The node that says every member is in.
const READY: &str = "ready";

/// Whether `child` is a member's node: a UUID, as Curator names them.
pub(super) fn is_member(child: &str) -> bool {
    child.len() == 36 && uuid::Uuid::parse_str(child).is_ok()
}

impl OwnNode {
    /// The name of its node as a double barrier's member: the UUID of its
    /// protected id (`_c_<uuid>-`).
    fn member_name(&self) -> &str {
        self.protect
            .strip_prefix("_c_")
            .and_then(|p| p.strip_suffix('-'))
            .unwrap_or(&self.protect)
    }
}

impl ZkShared {
    /// Makes `req`'s member node, unless it is there already: a member is
    /// in as soon as its node is.
    pub(super) async fn attempt_member(self: &Arc<Self>, req: &Attempt) -> Result<Outcome> {
        let dir = Self::path_of(&req.name)?;
        let z = self.client();
        let own = self.own_node(req);
        if unpoisoned(&own.child).is_none() && own.create_sent.load(Ordering::Acquire) {
            self.adopt_member(&own).await?;
        }
        if unpoisoned(&own.child).is_none() {
            own.create_sent.store(true, Ordering::Release);
            let path = format!("{dir}/{}", own.member_name());
            let opts = zk::CreateMode::Ephemeral.with_acls(self.acls());
            for _ in 0..10 {
                match z.create(&path, req.holder.as_bytes(), &opts).await {
                    Ok((stat, _)) => {
                        *unpoisoned(&own.czxid) = stat.czxid;
                        *unpoisoned(&own.child) = Some(own.member_name().to_owned());
                        break;
                    }
                    Err(zk::Error::NoNode) => self.make_containers(&z, &dir).await?,
                    // The name is this try's own: a node there is ours,
                    // from a create whose answer was lost.
                    Err(zk::Error::NodeExists | zk::Error::ConnectionLoss) => {
                        self.adopt_member(&own).await?;
                        if unpoisoned(&own.child).is_some() {
                            break;
                        }
                    }
                    Err(e) => return Err(self.err(e)),
                }
            }
            if unpoisoned(&own.child).is_none() {
                return Err(Error::unavailable(format!(
                    "ZooKeeper at {}: could not create a member node under {dir}",
                    self.label
                )));
            }
        }
        unpoisoned(&own.deadline).get_or_insert(Instant::now() + req.lease);
        Ok(Outcome::Granted {
            token: *unpoisoned(&own.czxid) as u64,
            session: Some(self.clock.bound_of(own.session)),
        })
    }

    /// Adopts `own`'s member node if a create of it went through.
    pub(super) async fn adopt_member(&self, own: &OwnNode) -> Result<()> {
        if unpoisoned(&own.child).is_some() || !own.create_sent.load(Ordering::Acquire) {
            return Ok(());
        }
        let path = format!("{}/{}", Self::path_of(&own.name)?, own.member_name());
        if let Some(stat) = self
            .client()
            .check_stat(&path)
            .await
            .map_err(|e| self.err(e))?
        {
            *unpoisoned(&own.czxid) = stat.czxid;
            *unpoisoned(&own.child) = Some(own.member_name().to_owned());
        }
        Ok(())
    }

    async fn barrier_members(&self, name: &LockName) -> Result<(Vec<String>, bool)> {
        let dir = Self::path_of(name)?;
        let mut children = self.children(&dir).await?;
        let ready = children.iter().any(|c| c == READY);
        // Curator's view: every child but `ready`, sorted by name.
        children.retain(|c| c != READY);
        children.sort();
        Ok((children, ready))
    }

    async fn watch_ready(&self, name: &LockName) -> Result<()> {
        let key = register_key(name.as_str());
        let path = format!("{}/{READY}", Self::path_of(name)?);
        self.watch_exists(&path, format!("ready:{key}"), key).await
    }

    async fn set_ready(&self, name: &LockName, ready: bool) -> Result<()> {
        let dir = Self::path_of(name)?;
        let path = format!("{dir}/{READY}");
        let z = self.client();
        if !ready {
            return match z.delete(&path, None).await {
                Ok(()) | Err(zk::Error::NoNode) => Ok(()),
                Err(e) => Err(self.err(e)),
            };
        }
        let opts = zk::CreateMode::Persistent.with_acls(self.acls());
        for _ in 0..5 {
            match z.create(&path, b"", &opts).await {
                Ok(_) => return Ok(()),
                Err(zk::Error::NoNode) => self.make_containers(&z, &dir).await?,
                Err(zk::Error::NodeExists) => {
                    // One there, perhaps left from a round that is over:
                    // replaced in one step, so it is newer than every
                    // member of this round (a member filling the round
                    // at the same time replaces it too: one is there).
                    let mut w = z.new_multi_writer();
                    if w.add_delete(&path, None).is_err()
                        || w.add_create(&path, b"", &opts).is_err()
                    {
                        return Err(Error::invalid(format!("ZooKeeper path {path} refused")));
                    }
                    match w.commit().await {
                        Ok(_) => return Ok(()),
                        // Gone meanwhile: make it again.
                        Err(zk::MultiWriteError::OperationFailed { .. }) => {}
                        Err(zk::MultiWriteError::RequestFailed { source }) => {
                            return Err(self.err(source));
                        }
                    }
                }
                Err(e) => return Err(self.err(e)),
            }
        }
        Err(Error::unavailable(format!(
            "ZooKeeper at {}: could not create {path}",
            self.label
        )))
    }

    async fn ready_is_stale(&self, name: &LockName, members: &[String]) -> Result<bool> {
        let dir = Self::path_of(name)?;
        let z = self.client();
        // Every stat in one round trip (the client pipelines them), `ready`
        // first.
        let stats = std::iter::once(READY)
            .chain(members.iter().map(String::as_str))
            .map(|c| {
                let (z, path) = (z.clone(), format!("{dir}/{c}"));
                async move { z.check_stat(&path).await }
            });
        let mut stats = futures_util::future::join_all(stats).await.into_iter();
        let ready = match stats.next() {
            Some(stat) => stat.map_err(|e| self.err(e))?,
            None => None,
        };
        let Some(ready) = ready else {
            return Ok(false);
        };
        for stat in stats {
            // A member gone since the listing is not in.
            if stat
                .map_err(|e| self.err(e))?
                .is_some_and(|s| s.czxid < ready.czxid)
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    async fn watch_member(&self, name: &LockName, member: &str) -> Result<bool> {
        let key = register_key(name.as_str());
        let id = format!("member:{key}:{member}");
        if self.register_watches.armed(&id) {
            return Ok(true);
        }
        // `getData`: no watch is left behind on a node already gone.
        let path = format!("{}/{member}", Self::path_of(name)?);
        match self.client().get_and_watch_data(&path).await {
            Ok((_, _, watcher)) => {
                self.register_watches
                    .keep_as(&self.wakeups, id, key, async move {
                        watcher.changed().await;
                    });
                Ok(true)
            }
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(self.err(e)),
        }
    }
}

impl BarrierLayout for ZkBackend {
    fn barrier_members<'a>(&'a self, name: &'a LockName) -> Reply<'a, (Vec<String>, bool)> {
        Box::pin(self.inner.barrier_members(name))
    }

    fn watch_ready<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()> {
        Box::pin(self.inner.watch_ready(name))
    }

    fn set_ready<'a>(&'a self, name: &'a LockName, ready: bool) -> Reply<'a, ()> {
        Box::pin(self.inner.set_ready(name, ready))
    }

    fn watch_member<'a>(&'a self, name: &'a LockName, member: &'a str) -> Reply<'a, bool> {
        Box::pin(self.inner.watch_member(name, member))
    }

    fn ready_is_stale<'a>(&'a self, name: &'a LockName, members: &'a [String]) -> Reply<'a, bool> {
        Box::pin(self.inner.ready_is_stale(name, members))
    }

    fn member_of(&self, hold: &HoldRef) -> Option<String> {
        unpoisoned(&self.inner.nodes)
            .get(&hold.hold_id)
            .and_then(|own| unpoisoned(&own.child).clone())
    }
}
