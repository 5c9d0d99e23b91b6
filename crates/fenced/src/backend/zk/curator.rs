//! The values of the recipes Curator shares, kept where Curator keeps
//! them: a counter in the data of the node at its path (8 bytes
//! big-endian as `DistributedAtomicLong` writes it, 4 as `SharedCount`
//! does), a barrier as the existence of that node (`DistributedBarrier`).
//!
//! Versions are opaque to the recipes. A counter's is the node's data
//! version plus one, shifted left two bits, with the width found in the
//! low bits (1: four bytes, 2: eight, 0: no data), so a write keeps the
//! width a Curator client chose. A barrier's is the node's `czxid`,
//! which tells a barrier removed and set again from one never removed.

use super::*;
use crate::spi::wake::register_key;
use crate::spi::{Codec, NodeLayout};

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
    if width == 1 {
        let n = i32::try_from(n).map_err(|_| {
            Error::invalid(format!(
                "counter {:?} is kept in 4 bytes on ZooKeeper (a SharedCount's layout); {n} \
                 does not fit, so nothing was written",
                name.as_str()
            ))
        })?;
        return Ok(n.to_be_bytes().to_vec());
    }
    Ok(n.to_be_bytes().to_vec())
}

impl ZkShared {
    /// The data and stat of the node at `path`, read after a sync through
    /// the leader (see `meta_get`); `None` when there is no such node.
    async fn synced_get(&self, path: &str) -> Result<Option<(Vec<u8>, zk::Stat)>> {
        let z = self.client();
        let (synced, got) = tokio::join!(z.sync("/"), z.get_data(path));
        synced.map_err(|e| self.err(e))?;
        match got {
            Ok(got) => Ok(Some(got)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    async fn node_read(&self, name: &LockName, codec: Codec) -> Result<RegisterValue> {
        let path = Self::path_of(name)?;
        let Some((raw, stat)) = self.synced_get(&path).await? else {
            return Ok(None);
        };
        if codec == Codec::Presence {
            return Ok(Some((b"1".to_vec(), stat.czxid.max(1) as u64)));
        }
        let (n, width) = decode_count(name, &raw)?;
        let version = (u64::from(stat.version as u32) + 1) << 2 | width;
        Ok(Some((n.to_string().into_bytes(), version)))
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
        let id = format!("node:{key}");
        if self.register_watches.armed(&id) {
            return Ok(());
        }
        // An exists watch fires on create, change and delete alike.
        let path = Self::path_of(name)?;
        let (_, watcher) = self
            .client()
            .check_and_watch_stat(&path)
            .await
            .map_err(|e| self.err(e))?;
        self.register_watches
            .keep_as(&self.wakeups, id, key, async move {
                watcher.changed().await;
            });
        Ok(())
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
