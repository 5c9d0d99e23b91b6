//! Registers and token records under `/fenced.meta`.

use super::*;

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
        match self.client().get_data(&path).await {
            Ok((raw, stat)) => {
                let (value, fence) = decode_register(name, &raw)?;
                Ok(Some((value, fence, stat.version)))
            }
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
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
    fn register_read<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<RegisterValue>> {
        Box::pin(async move {
            Ok(self
                .inner
                .meta_get(REGISTERS, name)
                .await?
                .map(|(v, f, _)| (v, f)))
        })
    }

    fn register_write<'a>(
        &'a self,
        name: &'a LockName,
        fence: Option<u64>,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.inner.meta_cas(REGISTERS, name, move |old| {
            let seen = old.map_or(0, |(_, f)| f);
            match fence {
                Some(f) if f < seen => Ok(None),
                Some(f) => Ok(Some((value.to_vec(), f))),
                None => Ok(Some((value.to_vec(), seen))),
            }
        }))
    }

    fn register_swap<'a>(
        &'a self,
        name: &'a LockName,
        expected: u64,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.inner.meta_cas(REGISTERS, name, move |old| {
            let seen = old.map_or(0, |(_, f)| f);
            if seen != expected {
                return Ok(None);
            }
            Ok(Some((
                value.to_vec(),
                crate::spi::codec::next_version(name, expected)?,
            )))
        }))
    }

    fn register_decrement<'a>(
        &'a self,
        name: &'a LockName,
        by: i64,
    ) -> BoxFuture<'a, Result<Option<i64>>> {
        Box::pin(async move {
            let mut after = None;
            let changed = self
                .inner
                .meta_cas(REGISTERS, name, |old| {
                    after = None;
                    let Some((v, f)) = old else { return Ok(None) };
                    let n = crate::spi::codec::parse_i64(name, v)?;
                    if n < by {
                        return Ok(None);
                    }
                    after = Some(n - by);
                    Ok(Some(((n - by).to_string().into_bytes(), f)))
                })
                .await?;
            Ok(if changed { after } else { None })
        })
    }
}

impl Backend for ZkBackend {}
