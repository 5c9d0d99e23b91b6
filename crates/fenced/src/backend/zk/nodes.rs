//! Creating a lock node in Curator's protected form, and finding it again after a lost reply.

use super::*;

impl ZkShared {
    /// The child of `dir` whose name starts with `prefix` (a protected
    /// id), and its czxid, if a create of it went through.
    pub(super) async fn find_protected(
        &self,
        z: &zk::Client,
        dir: &str,
        prefix: &str,
    ) -> Result<Option<(String, i64)>> {
        let children = match z.list_children(dir).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        let Some(c) = children.into_iter().find(|c| c.starts_with(prefix)) else {
            return Ok(None);
        };
        let stat = z
            .check_stat(&format!("{dir}/{c}"))
            .await
            .map_err(|e| self.err(e))?;
        Ok(stat.map(|s| (c, s.czxid)))
    }

    /// [`find_protected`](Self::find_protected) for `own`'s node in its
    /// lock's directory `dir`, adopted as `own`'s child if found.
    pub(super) async fn adopt_protected(
        &self,
        z: &zk::Client,
        dir: &str,
        own: &OwnNode,
    ) -> Result<()> {
        // As after a lost reply in `create`: a create that reached the
        // leader through a server we lost shows after a sync.
        let _ = z.sync(dir).await;
        if let Some((child, czxid)) = self.find_protected(z, dir, &own.protect).await? {
            *unpoisoned(&own.czxid) = czxid;
            *unpoisoned(&own.child) = Some(child);
        }
        Ok(())
    }

    /// `children` of `name`'s directory `dir` without the strays of this
    /// client's nodes there (a node of a protected id whose create lost
    /// its reply, but not the node that id's record names: that create
    /// landed after the look for it, beside the second), which are
    /// deleted in the background. Each would head the queue, owned by
    /// nobody, until the session ends; any waiter's listing finds it,
    /// and this client's leading waiter lists at least every fallback
    /// period.
    pub(super) fn without_strays(
        &self,
        z: &zk::Client,
        dir: &str,
        name: &LockName,
        mut children: Vec<String>,
    ) -> Vec<String> {
        let doubtful: Vec<(String, Option<String>)> = unpoisoned(&self.nodes)
            .values()
            .filter(|o| {
                o.name == *name
                    && !o.semaphore
                    && !o.member
                    && o.create_lost.load(Ordering::Acquire)
            })
            .map(|o| (o.protect.clone(), unpoisoned(&o.child).clone()))
            .collect();
        if doubtful.is_empty() {
            return children;
        }
        let (strays, kept): (Vec<String>, Vec<String>) = children.drain(..).partition(|c| {
            doubtful.iter().any(|(protect, child)| {
                c.starts_with(protect.as_str()) && child.as_ref() != Some(c)
            })
        });
        for stray in strays {
            tracing::debug!(node = %stray, "deleting a stray node of a create whose reply was lost");
            let (z, path, limit) = (z.clone(), format!("{dir}/{stray}"), self.timeout);
            tokio::spawn(async move {
                let _ = tokio::time::timeout(limit, z.delete(&path, None)).await;
            });
        }
        kept
    }

    /// Deletes every node of `own`'s protected id in `dir` (after a
    /// `sync`, so that a create that reached the leader shows), once its
    /// own is gone: a create whose reply was lost may have landed late.
    pub(super) async fn delete_strays(&self, z: &zk::Client, dir: &str, own: &OwnNode) {
        let _ = z.sync(dir).await;
        let Ok(children) = z.list_children(dir).await else {
            return;
        };
        for stray in children.iter().filter(|c| c.starts_with(&own.protect)) {
            tracing::debug!(node = %stray, "deleting a stray node of a create whose reply was lost");
            let _ = z.delete(&format!("{dir}/{stray}"), None).await;
        }
    }

    /// Whether this client has, on `name` in this session, a node queued
    /// or held in the lock's own queue (not a semaphore's, not a barrier
    /// member's): a new waiter's node will most likely come right after
    /// one of them.
    pub(super) fn queues_on(&self, name: &LockName) -> bool {
        let session = self.session();
        unpoisoned(&self.nodes).values().any(|o| {
            o.name == *name
                && o.session == session
                && !o.semaphore
                && !o.member
                && unpoisoned(&o.child).is_some()
        })
    }

    /// The node of this client right before `mine` in `name`'s queue, by
    /// sequence (`mine`'s less one: no node can come between), if it is
    /// one of this session's and another owner's than `owner`: the node an
    /// exclusive request waits on, known without listing the queue.
    pub(super) fn own_predecessor(
        &self,
        name: &LockName,
        mine: &str,
        owner: &str,
    ) -> Option<String> {
        let before = sequence_of(mine).checked_sub(1)?;
        let session = self.session();
        let nodes = unpoisoned(&self.nodes);
        let (o, child) = nodes.values().find_map(|o| {
            let lock_queue = o.name == *name && o.session == session && !o.semaphore && !o.member;
            let child = unpoisoned(&o.child).clone().filter(|_| lock_queue)?;
            (sequence_of(&child) == before).then_some((o, child))
        })?;
        (o.owner != owner).then_some(child)
    }

    pub(super) fn owner_of(&self, name: &LockName, child: &str) -> Option<String> {
        unpoisoned(&self.nodes)
            .values()
            .find(|o| o.name == *name && unpoisoned(&o.child).as_deref() == Some(child))
            .map(|o| o.owner.clone())
    }

    /// Creates the node of `own` and lists the lock's children in one round
    /// trip: the client sends both requests at once (it orders requests
    /// when their futures are made, not when polled), and ZooKeeper answers
    /// a session's requests in order, so the listing includes the new node.
    /// Curator's recipe waits for the create before it lists. The listing is
    /// `None` when the create needed another try (then list again). The
    /// node is `own`'s child from then on.
    ///
    /// Without `list`, the create goes alone and the listing is `None`.
    pub(super) async fn create_and_list(
        &self,
        z: &zk::Client,
        dir: &str,
        own: &OwnNode,
        req: &Attempt,
        list: bool,
    ) -> Result<Option<Vec<String>>> {
        if own.create_sent.swap(true, Ordering::AcqRel) {
            // An earlier create went out and no look found its node: it
            // may still land beside this one.
            own.create_lost.store(true, Ordering::Release);
        }
        let name = format!("{}{}", own.protect, marker(req.mode, req.kind));
        let (created, listed) = self
            .create_listed(z, dir, &name, req, &own.create_lost, list)
            .await?;
        *unpoisoned(&own.child) = Some(created.0);
        *unpoisoned(&own.czxid) = created.1;
        Ok(listed)
    }

    /// Creates an ephemeral-sequential child of `dir` named `name` then a
    /// sequence (`name` starting with a protected id), with the holder
    /// record as its data, and with `list` lists `dir` in the same round
    /// trip (see [`create_and_list`](Self::create_and_list)): the child
    /// and its czxid, and the listing unless the create needed another
    /// try (or none was asked for).
    pub(super) async fn create_listed(
        &self,
        z: &zk::Client,
        dir: &str,
        name: &str,
        req: &Attempt,
        lost: &AtomicBool,
        list: bool,
    ) -> Result<((String, i64), Option<Vec<String>>)> {
        let prefix = format!("{dir}/{name}");
        let opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        // The node's data is the holder's record: Curator reads none of
        // its lock nodes' data (its own default is the client's address).
        let data = req.holder.as_bytes();
        let created = z.create(&prefix, data, &opts);
        let (created, listed) = if list {
            let (c, l) = tokio::join!(created, z.list_children(dir));
            (c, l.ok())
        } else {
            (created.await, None)
        };
        let first_went_through = created.is_ok();
        let node = self
            .create(z, dir, (&prefix, data), &opts, (name, lost), created)
            .await?;
        Ok((node, listed.filter(|_| first_went_through)))
    }

    /// Creates a child of `dir` as `prefix` with `data` (and `dir` and
    /// its parents as containers where missing), finding it again by its
    /// protected id `protect` (the child's name up to its sequence) if a
    /// reply was lost (and then setting `lost`); `first` is the reply to
    /// the create already sent. The child and its czxid.
    pub(super) async fn create(
        &self,
        z: &zk::Client,
        dir: &str,
        (prefix, data): (&str, &[u8]),
        opts: &zk::CreateOptions<'_>,
        (protect, lost): (&str, &AtomicBool),
        first: std::result::Result<(zk::Stat, zk::CreateSequence), zk::Error>,
    ) -> Result<(String, i64)> {
        let mut first = Some(first);
        for _ in 0..10 {
            let created = match first.take() {
                Some(r) => r,
                None => z.create(prefix, data, opts).await,
            };
            match created {
                Ok((stat, seq)) => {
                    let full = format!("{prefix}{seq}");
                    let child = full.rsplit('/').next().unwrap_or_default().to_owned();
                    return Ok((child, stat.czxid));
                }
                Err(zk::Error::NoNode) => self.make_containers(z, dir).await?,
                Err(zk::Error::ConnectionLoss) => {
                    // Did the create happen? Curator's protected mode: look
                    // for our id among the children. A look that fails
                    // says nothing: fail rather than create a second
                    // node, and the next try or the withdrawal looks again
                    // (the caller marked the create as sent). The look
                    // follows a `sync`, so that it sees a create that
                    // reached the leader through the server we lost; one
                    // still on its way there can land after the look, so
                    // the caller learns the reply was lost, and deletes
                    // such a stray when it finds one.
                    lost.store(true, Ordering::Release);
                    let _ = z.sync(dir).await;
                    if let Some(found) = self.find_protected(z, dir, protect).await? {
                        return Ok(found);
                    }
                }
                Err(e) => return Err(self.err(e)),
            }
        }
        Err(Error::unavailable(format!(
            "ZooKeeper at {}: could not create a lock node under {dir}",
            self.label
        )))
    }

    /// Creates `dir` and each of its parents that is missing as a
    /// container node (reaped by the server once empty), as Curator's
    /// `creatingParentContainersIfNeeded` does.
    pub(super) async fn make_containers(&self, z: &zk::Client, dir: &str) -> Result<()> {
        let parent = zk::CreateMode::Container.with_acls(self.acls());
        let ends = dir.match_indices('/').map(|(i, _)| i).skip(1);
        for end in ends.chain([dir.len()]) {
            match z.create(&dir[..end], b"", &parent).await {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(())
    }
}
