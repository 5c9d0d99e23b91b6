//! The values of the recipes Curator shares, kept where Curator keeps
//! them: a counter in the data of the node at its path (8 bytes
//! big-endian as `DistributedAtomicLong` writes it, 4 as `SharedCount`
//! does), a barrier as the existence of that node (`DistributedBarrier`).
//!
//! An election is a `LeaderLatch`: candidates' nodes are named
//! `…latch-<seq>` (see `marker`), the leader is the first, and its value
//! is its node's data, as a latch's participant id is; until the leader
//! proclaims, its node holds its holder record, and it has no value.
//!
//! Versions are opaque to the recipes. A counter's is the node's data
//! version plus one, shifted left two bits, with the width found in the
//! low bits (1: four bytes, 2: eight, 0: no data), so a write keeps the
//! width a Curator client chose. A barrier's is the node's `czxid`,
//! which tells a barrier removed and set again from one never removed.

use super::*;
use crate::spi::wake::register_key;
use crate::spi::{Codec, ElectionLayout, LeaderValue, NodeLayout};

/// Whether the node of `stat` is a lock's directory: it has had children
/// and holds no data. Such nodes are containers (fenced's and Curator's
/// alike), which the server deletes once empty, taking a value written
/// there with them; a stat does not tell a container apart, so this is
/// how it is told. (A counter or barrier node that a lock of the same
/// name has used as its directory looks the same, and is refused too.)
fn is_directory(stat: &zk::Stat) -> bool {
    stat.data_length == 0 && stat.cversion > 0
}

/// What a counter's node data says: the value and the width it was in
/// (0 for no data).
fn decode_count(name: &LockName, raw: &[u8]) -> Result<(i64, u64)> {
    match raw.len() {
        0 => Ok((0, 0)),
        4 => Ok((
            i64::from(i32::from_be_bytes(raw.try_into().unwrap_or_default())),
            1,
        )),
        8 => Ok((i64::from_be_bytes(raw.try_into().unwrap_or_default()), 2)),
        n => Err(Error::invalid(format!(
            "counter {:?}: its ZooKeeper node holds {n} bytes, not a 4-byte (SharedCount) or \
             8-byte (DistributedAtomicLong) integer: the path is used by something else",
            name.as_str()
        ))),
    }
}

/// `value` (decimal text) in `width` bytes.
fn encode_count(name: &LockName, value: &[u8], width: u64) -> Result<Vec<u8>> {
    let n: i64 = std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            Error::invalid(format!(
                "counter {:?}: {:?} is not an integer",
                name.as_str(),
                String::from_utf8_lossy(value)
            ))
        })?;
    if width != 1 {
        return Ok(n.to_be_bytes().to_vec());
    }
    let n = i32::try_from(n).map_err(|_| {
        Error::invalid(format!(
            "counter {:?} is kept in 4 bytes on ZooKeeper (a SharedCount's layout); {n} \
             does not fit, so nothing was written",
            name.as_str()
        ))
    })?;
    Ok(n.to_be_bytes().to_vec())
}

/// A counter's value in register form, and its version, from its node.
fn count_value(name: &LockName, raw: &[u8], stat: &zk::Stat) -> Result<RegisterValue> {
    let (n, width) = decode_count(name, raw)?;
    let version = (u64::from(stat.version as u32) + 1) << 2 | width;
    Ok(Some((n.to_string().into_bytes(), version)))
}

impl ZkShared {
    async fn node_read(&self, name: &LockName, codec: Codec) -> Result<RegisterValue> {
        let path = Self::path_of(name)?;
        let Some((raw, stat)) = self.synced_get(&path).await? else {
            if codec == Codec::Presence {
                return Ok(None);
            }
            // Older fenced kept counters in their register: a counter not
            // yet at its path is moved there at its first read, so an
            // upgrade reissues no ID. (A register that holds no integer is
            // another kind of value: not moved.)
            let Some((old, _, _)) = self.meta_get(REGISTERS, name).await? else {
                return Ok(None);
            };
            if std::str::from_utf8(&old).map_or(true, |t| t.parse::<i64>().is_err()) {
                return Ok(None);
            }
            let width = if codec == Codec::Int { 1 } else { 2 };
            let data = encode_count(name, &old, width)?;
            let opts = zk::CreateMode::Persistent.with_acls(self.acls());
            return match self.client().create(&path, &data, &opts).await {
                // Moved, by this client or another first: read it there.
                Ok(_) | Err(zk::Error::NodeExists) => match self.synced_get(&path).await? {
                    Some((raw, stat)) => count_value(name, &raw, &stat),
                    None => Ok(None),
                },
                Err(e) => Err(self.err(e)),
            };
        };
        if is_directory(&stat) {
            return Err(Error::invalid(format!(
                "{path} on ZooKeeper is the node of a lock, semaphore, election or double \
                 barrier named {:?} (it has had children and holds no value: a container, \
                 which the server deletes once empty): a counter or barrier of the same name \
                 would go with it; name them apart",
                name.as_str()
            )));
        }
        if codec == Codec::Presence {
            return Ok(Some((b"1".to_vec(), stat.czxid.max(1) as u64)));
        }
        count_value(name, &raw, &stat)
    }

    async fn node_write(
        &self,
        name: &LockName,
        codec: Codec,
        version: u64,
        value: &[u8],
    ) -> Result<bool> {
        let path = Self::path_of(name)?;
        let z = self.client();
        let refused = |e: zk::Error| match e {
            zk::Error::BadVersion | zk::Error::NodeExists | zk::Error::NoNode => Ok(false),
            e => Err(self.err(e)),
        };
        let create = |data: Vec<u8>| {
            let (z, path) = (z.clone(), path.clone());
            async move {
                let opts = zk::CreateMode::Persistent.with_acls(self.acls());
                z.create(&path, &data, &opts).await.map(drop)
            }
        };
        if codec == Codec::Presence {
            return match value {
                // Set: Curator's `setBarrier` creates the node.
                b"1" if version == 0 => {
                    create(Vec::new()).await.map_or_else(refused, |()| Ok(true))
                }
                // Removed: delete the node this version names, not one
                // set again since.
                b"0" if version != 0 => match self.synced_get(&path).await? {
                    Some((_, stat)) if stat.czxid.max(1) as u64 == version => z
                        .delete(&path, Some(stat.version))
                        .await
                        .map_or_else(refused, |()| Ok(true)),
                    _ => Ok(false),
                },
                _ => Ok(false),
            };
        }
        let width = match version & 3 {
            0 if codec == Codec::Int => 1,
            0 => 2,
            w => w,
        };
        let data = encode_count(name, value, width)?;
        if version == 0 {
            return create(data).await.map_or_else(refused, |()| Ok(true));
        }
        let Ok(seen) = i32::try_from((version >> 2) - 1) else {
            return Ok(false);
        };
        z.set_data(&path, &data, Some(seen))
            .await
            .map_or_else(refused, |_| Ok(true))
    }

    async fn watch_node(&self, name: &LockName) -> Result<()> {
        let key = register_key(name.as_str());
        let path = Self::path_of(name)?;
        self.watch_exists(&path, format!("node:{key}"), key).await
    }
}

impl NodeLayout for ZkBackend {
    fn node_read<'a>(&'a self, name: &'a LockName, codec: Codec) -> Reply<'a, RegisterValue> {
        Box::pin(self.inner.node_read(name, codec))
    }

    fn node_write<'a>(
        &'a self,
        name: &'a LockName,
        codec: Codec,
        version: u64,
        value: &'a [u8],
    ) -> Reply<'a, bool> {
        Box::pin(self.inner.node_write(name, codec, version, value))
    }

    fn watch_node<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()> {
        Box::pin(self.inner.watch_node(name))
    }
}

impl ZkShared {
    /// The first node of election `name` (the leader's), if any.
    async fn leader_node(&self, dir: &str) -> Result<Option<String>> {
        Ok(queue(self.children(dir).await?)
            .into_iter()
            .next()
            .map(|(c, _)| c))
    }

    async fn proclaim(&self, hold: &HoldRef, token: u64, value: &[u8]) -> Result<bool> {
        let Some(own) = unpoisoned(&self.nodes).get(&hold.hold_id).cloned() else {
            return Ok(false);
        };
        let child = unpoisoned(&own.child).clone();
        let Some(child) = child.filter(|_| *unpoisoned(&own.czxid) as u64 == token) else {
            return Ok(false);
        };
        // The node is there only while the hold is: set while it leads.
        let path = format!("{}/{child}", Self::path_of(&own.name)?);
        match self.client().set_data(&path, value, None).await {
            Ok(_) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(self.err(e)),
        }
    }

    async fn leader(&self, name: &LockName) -> Result<LeaderValue> {
        let dir = Self::path_of(name)?;
        let Some(first) = self.leader_node(&dir).await? else {
            return Ok(None);
        };
        let Some((data, stat)) = self.synced_get(&format!("{dir}/{first}")).await? else {
            // Gone since the listing: nobody leads as far as this read knows.
            return Ok(None);
        };
        // A holder record: a fenced leader that has not proclaimed yet.
        if crate::Holder::decode(&data).is_some() {
            return Ok(None);
        }
        Ok(Some((data, stat.czxid as u64)))
    }

    /// A watch on the election's children (a candidate joining or
    /// leaving) and on the leader's data (a proclamation).
    async fn watch_leader(&self, name: &LockName, wake: &str) -> Result<()> {
        let id = format!("leader:{wake}");
        if self.register_watches.armed(&id) {
            return Ok(());
        }
        let dir = Self::path_of(name)?;
        let z = self.client();
        let children = match z.list_and_watch_children(&dir).await {
            Ok(got) => got,
            Err(zk::Error::NoNode) => {
                // No candidate yet: the directory's creation is the change.
                let (_, w) = z
                    .check_and_watch_stat(&dir)
                    .await
                    .map_err(|e| self.err(e))?;
                self.register_watches
                    .keep_as(&self.wakeups, id, wake.to_owned(), async move {
                        w.changed().await;
                    });
                return Ok(());
            }
            Err(e) => return Err(self.err(e)),
        };
        let (children, joined) = children;
        let leader = match queue(children).into_iter().next() {
            Some((first, _)) => match z.get_and_watch_data(&format!("{dir}/{first}")).await {
                Ok((_, _, w)) => Some(w),
                // Gone: the children's watch has fired or is about to.
                Err(zk::Error::NoNode) => None,
                Err(e) => return Err(self.err(e)),
            },
            None => None,
        };
        self.register_watches
            .keep_as(&self.wakeups, id, wake.to_owned(), async move {
                match leader {
                    Some(proclaimed) => {
                        tokio::select! {
                            _ = joined.changed() => {}
                            _ = proclaimed.changed() => {}
                        }
                    }
                    None => {
                        joined.changed().await;
                    }
                }
            });
        Ok(())
    }
}

impl ElectionLayout for ZkBackend {
    fn proclaim<'a>(&'a self, hold: &'a HoldRef, token: u64, value: &'a [u8]) -> Reply<'a, bool> {
        Box::pin(self.inner.proclaim(hold, token, value))
    }

    fn leader<'a>(&'a self, name: &'a LockName) -> Reply<'a, LeaderValue> {
        Box::pin(self.inner.leader(name))
    }

    fn watch_leader<'a>(&'a self, name: &'a LockName, wake: &'a str) -> Reply<'a, ()> {
        Box::pin(self.inner.watch_leader(name, wake))
    }
}
