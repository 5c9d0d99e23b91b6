//! Registers and token records under `/fenced.meta`.

use super::*;
use crate::spi::NodeLayout;
use crate::spi::wake::register_key;

impl ZkShared {
    /// Keeps the largest released token of `name`.
    pub(super) async fn record_token(&self, name: &LockName, token: u64) -> Result<()> {
        self.meta_cas(TOKENS, name, |old| {
            let seen = old.map_or(0, |(_, f)| f);
            Ok((token > seen).then(|| (Vec::new(), token)))
        })
        .await
        .map(drop)
    }

    /// Reads `dir/N` as a register: value, fence, node version.
    pub(super) async fn meta_get(
        &self,
        dir: &str,
        name: &LockName,
    ) -> Result<Option<(Vec<u8>, u64, i32)>> {
        let path = format!("{dir}/{}", name.as_str());
        let Some((raw, stat)) = self.synced_get(&path).await? else {
            return Ok(None);
        };
        let (value, fence) = decode_register(name, &raw)?;
        Ok(Some((value, fence, stat.version)))
    }

    /// The data and stat of the node at `path`; `None` when there is no
    /// such node. A server answers reads from its own copy, which may lag
    /// the leader: a client would not see another's write that had been
    /// answered (a counter's compare-and-set refusing the value just
    /// written elsewhere). A sync through the leader first, sent ahead of
    /// the read on the same session (so no extra round trip to this
    /// server), makes the read see every write answered before it.
    pub(super) async fn synced_get(&self, path: &str) -> Result<Option<(Vec<u8>, zk::Stat)>> {
        let z = self.client();
        let (synced, got) = tokio::join!(z.sync("/"), z.get_data(path));
        synced.map_err(|e| self.err(e))?;
        match got {
            Ok(got) => Ok(Some(got)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// An exists watch on `path`, known as `id` among the client's watches
    /// (armed once while it has not fired), that wakes `key`: it fires
    /// when the node is created, changed or deleted, and when the session
    /// ends (a change may then have gone unseen: the waiters look again
    /// all the same).
    pub(super) async fn watch_exists(&self, path: &str, id: String, key: String) -> Result<()> {
        if self.register_watches.armed(&id) {
            return Ok(());
        }
        let (_, watcher) = self
            .client()
            .check_and_watch_stat(path)
            .await
            .map_err(|e| self.err(e))?;
        self.register_watches
            .keep_as(&self.wakeups, id, key, async move {
                watcher.changed().await;
            });
        Ok(())
    }

    /// Changes `dir/N` by compare-and-set on its version.
    pub(super) async fn meta_cas<F>(&self, dir: &str, name: &LockName, decide: F) -> Result<bool>
    where
        F: FnMut(Option<(&[u8], u64)>) -> Result<Option<(Vec<u8>, u64)>>,
    {
        let path = format!("{dir}/{}", name.as_str());
        let write = |seen: Option<i32>, raw: Vec<u8>| {
            let path = path.clone();
            async move {
                let z = self.client();
                let r = match seen {
                    Some(v) => z.set_data(&path, &raw, Some(v)).await.map(drop),
                    None => {
                        let opts = zk::CreateMode::Persistent.with_acls(self.acls());
                        z.create(&path, &raw, &opts).await.map(drop)
                    }
                };
                match r {
                    Ok(()) => Ok(true),
                    Err(zk::Error::BadVersion | zk::Error::NodeExists | zk::Error::NoNode) => {
                        Ok(false)
                    }
                    Err(e) => Err(self.err(e)),
                }
            }
        };
        register_cas(name, || self.meta_get(dir, name), write, decide).await
    }
}

impl Store for ZkBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        Box::pin(async move {
            Ok(self
                .inner
                .meta_get(REGISTERS, name)
                .await?
                .map(|(v, f, _)| (v, f)))
        })
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        Box::pin(
            self.inner
                .meta_cas(REGISTERS, write.name, move |old| write.over(old)),
        )
    }

    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>> {
        Box::pin(async move {
            let mut change = Decrement::new(name, by);
            let written = self
                .inner
                .meta_cas(REGISTERS, name, |old| change.over(old))
                .await?;
            Ok(change.result(written))
        })
    }

    fn register_delete<'a>(&'a self, name: &'a LockName) -> Reply<'a, bool> {
        Box::pin(async move {
            let inner = &self.inner;
            let path = format!("{REGISTERS}/{}", name.as_str());
            match inner.client().delete(&path, None).await {
                Ok(()) => Ok(true),
                Err(zk::Error::NoNode) => Ok(false),
                Err(e) => Err(inner.err(e)),
            }
        })
    }

    fn watch_register<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()> {
        Box::pin(async move {
            let key = register_key(name.as_str());
            let path = format!("{REGISTERS}/{}", name.as_str());
            self.inner.watch_exists(&path, key.clone(), key).await
        })
    }

    fn has_rate_limiters(&self) -> bool {
        // ZooKeeper tells a client its time only in the stat of a write.
        false
    }
}

impl Backend for ZkBackend {
    fn election(&self) -> Option<&dyn crate::spi::ElectionLayout> {
        Some(self)
    }

    fn nodes(&self) -> Option<&dyn NodeLayout> {
        Some(self)
    }

    fn barriers(&self) -> Option<&dyn crate::spi::BarrierLayout> {
        Some(self)
    }
}
