//! Creating a lock node in Curator's protected form, and finding it again after a lost reply.

use super::*;

impl ZkShared {
    /// The node of `own` among `dir`'s children by its protected id, if
    /// a create of it went through; adopted as `own`'s child.
    pub(super) async fn find_protected(
        &self,
        z: &zk::Client,
        dir: &str,
        own: &OwnNode,
    ) -> Result<bool> {
        let children = match z.list_children(dir).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(self.err(e)),
        };
        let Some(c) = children.into_iter().find(|c| c.starts_with(&own.protect)) else {
            return Ok(false);
        };
        if let Some(stat) = z
            .check_stat(&format!("{dir}/{c}"))
            .await
            .map_err(|e| self.err(e))?
        {
            *unpoisoned(&own.czxid) = stat.czxid;
        }
        *unpoisoned(&own.child) = Some(c);
        Ok(true)
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
    /// `None` when the create needed another try (then list again).
    pub(super) async fn create_and_list(
        &self,
        z: &zk::Client,
        dir: &str,
        own: &OwnNode,
        req: &Attempt,
    ) -> Result<Option<Vec<String>>> {
        let prefix = format!("{dir}/{}{}", own.protect, marker(req.mode, req.kind));
        let opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        own.create_sent.store(true, Ordering::Release);
        // The node's data is the holder's record: Curator reads none of
        // its lock nodes' data (its own default is the client's address).
        let data = req.holder.as_bytes();
        let created = z.create(&prefix, data, &opts);
        let listed = z.list_children(dir);
        let (created, listed) = tokio::join!(created, listed);
        let first_went_through = created.is_ok();
        self.create(z, dir, (&prefix, data), &opts, own, created)
            .await?;
        Ok(listed.ok().filter(|_| first_went_through))
    }

    /// Creates the node of `own` as `prefix` with `data` (and the lock's
    /// container `dir` if missing), finding it again by its protected id
    /// if a reply was lost; `first` is the reply to the create already sent.
    pub(super) async fn create(
        &self,
        z: &zk::Client,
        dir: &str,
        (prefix, data): (&str, &[u8]),
        opts: &zk::CreateOptions<'_>,
        own: &OwnNode,
        first: std::result::Result<(zk::Stat, zk::CreateSequence), zk::Error>,
    ) -> Result<()> {
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
                    *unpoisoned(&own.child) = Some(child);
                    *unpoisoned(&own.czxid) = stat.czxid;
                    return Ok(());
                }
                Err(zk::Error::NoNode) => {
                    let parent = zk::CreateMode::Container.with_acls(self.acls());
                    match z.create(dir, b"", &parent).await {
                        Ok(_) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(self.err(e)),
                    }
                }
                Err(zk::Error::ConnectionLoss) => {
                    // Did the create happen? Curator's protected mode: look
                    // for our id among the children.
                    if self.find_protected(z, dir, own).await.unwrap_or(false) {
                        return Ok(());
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
}
