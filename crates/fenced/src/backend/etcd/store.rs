//! Registers, and `concurrency.Election`'s layout.

use super::*;
use crate::spi::wake::register_key;

impl Store for EtcdBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        Box::pin(async move { Ok(self.inner.register_get(name).await?.map(|(v, f, _)| (v, f))) })
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        Box::pin(
            self.inner
                .register_change(write.name, move |old| write.over(old)),
        )
    }

    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>> {
        Box::pin(async move {
            let mut change = Decrement::new(name, by);
            let written = self
                .inner
                .register_change(name, |old| change.over(old))
                .await?;
            Ok(change.result(written))
        })
    }

    fn register_delete<'a>(&'a self, name: &'a LockName) -> Reply<'a, bool> {
        Box::pin(async move {
            let inner = &self.inner;
            let mut etcd = inner.etcd.clone();
            let r = etcd
                .delete(EtcdShared::register_key(name), None)
                .await
                .map_err(|e| inner.err(e))?;
            Ok(r.deleted() > 0)
        })
    }

    fn watch_register<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()> {
        let key = register_key(name.as_str());
        let what = format!("register {:?}", name.as_str());
        Box::pin(self.watch_keys(EtcdShared::register_key(name), None, key.clone(), key, what))
    }

    fn has_rate_limiters(&self) -> bool {
        // etcd's API tells a client no time of the server's.
        false
    }
}

impl ElectionLayout for EtcdBackend {
    fn proclaim<'a>(&'a self, hold: &'a HoldRef, token: u64, value: &'a [u8]) -> Reply<'a, bool> {
        Box::pin(async move {
            let inner = &self.inner;
            let Some(own) = unpoisoned(&inner.keys).get(&hold.hold_id).cloned() else {
                return Ok(false);
            };
            // concurrency.Election's proclaim: the leader's own key, while
            // its create revision is still the leadership's.
            let txn = Txn::new()
                .when([Compare::create_revision(
                    own.key.clone(),
                    CompareOp::Equal,
                    token as i64,
                )])
                .and_then([TxnOp::put(
                    own.key.clone(),
                    value.to_vec(),
                    Some(PutOptions::new().with_lease(own.lease)),
                )]);
            let mut etcd = inner.etcd.clone();
            let r = etcd.txn(txn).await.map_err(|e| inner.err(e))?;
            Ok(r.succeeded())
        })
    }

    fn watch_leader<'a>(&'a self, name: &'a LockName, wake: &'a str) -> Reply<'a, ()> {
        Box::pin(self.watch_election(name, wake))
    }

    fn leader<'a>(&'a self, name: &'a LockName) -> Reply<'a, crate::spi::LeaderValue> {
        Box::pin(async move {
            // No limit: a nested lock's keys may come first, and are not this one's.
            let kvs = self.inner.queue_of(name).await?;
            // Until the leader proclaims, its key holds its holder record
            // (see `value_of`): no leader value yet, as `Election::leader`
            // says and the register-based backends answer.
            Ok(kvs.first().and_then(|kv| {
                let v = kv.value();
                let unproclaimed = v.first() == Some(&b'\n') && holder_of(v).is_some();
                (!unproclaimed).then(|| (v.to_vec(), kv.create_revision() as u64))
            }))
        })
    }
}

impl EtcdBackend {
    /// Watches `key` (with `options`: a prefix, say) from now, once the
    /// server has said the watch exists (every write after that has a
    /// later revision, and comes to it), and wakes `wake` at the first
    /// change; known as `id` among the client's watches, and kept only
    /// while nobody else's watch of that id waits.
    async fn watch_keys(
        &self,
        key: Vec<u8>,
        options: Option<WatchOptions>,
        id: String,
        wake: String,
        what: String,
    ) -> Result<()> {
        let inner = &self.inner;
        if inner.register_watches.armed(&id) {
            return Ok(());
        }
        let mut etcd = inner.etcd.clone();
        let mut stream = etcd.watch(key, options).await.map_err(|e| inner.err(e))?;
        match stream.message().await {
            Ok(Some(m)) if m.created() && !m.canceled() => {}
            Ok(_) => {
                return Err(Error::unavailable(format!(
                    "etcd at {} did not create a watch on {what}",
                    inner.label
                )));
            }
            Err(e) => return Err(inner.err(e)),
        }
        inner
            .register_watches
            .keep_as(&inner.wakeups, id, wake, async move {
                // A message with events is a change; an error, the end of
                // the stream or a cancel may have lost one: wake all the same.
                while let Ok(Some(m)) = stream.message().await {
                    if m.canceled() || !m.events().is_empty() {
                        break;
                    }
                }
            });
        Ok(())
    }

    /// [`ElectionLayout::watch_leader`]: a watch on the election's keys,
    /// whose every put or delete may change the leader or its value.
    async fn watch_election(&self, name: &LockName, wake: &str) -> Result<()> {
        let prefix = prefix_of(name)?;
        let options = Some(WatchOptions::new().with_prefix());
        let id = format!("{wake}\u{1}election");
        let what = format!("election {:?}", name.as_str());
        self.watch_keys(prefix, options, id, wake.to_owned(), what)
            .await
    }
}

impl Backend for EtcdBackend {
    fn election(&self) -> Option<&dyn ElectionLayout> {
        Some(self)
    }
}

impl EtcdShared {
    pub(super) fn register_key(name: &LockName) -> Vec<u8> {
        format!("{REGISTER_PREFIX}{}", name.as_str()).into_bytes()
    }

    /// The register's value, fence and mod revision.
    pub(super) async fn register_get(
        &self,
        name: &LockName,
    ) -> Result<Option<(Vec<u8>, u64, i64)>> {
        let mut etcd = self.etcd.clone();
        let got = etcd
            .get(Self::register_key(name), None)
            .await
            .map_err(|e| self.err(e))?;
        let Some(kv) = got.kvs().first() else {
            return Ok(None);
        };
        let (value, fence) = decode_register(name, kv.value())?;
        Ok(Some((value, fence, kv.mod_revision())))
    }

    /// Changes the register by compare-and-set on its mod revision.
    pub(super) async fn register_change<F>(&self, name: &LockName, decide: F) -> Result<bool>
    where
        F: FnMut(Option<(&[u8], u64)>) -> Result<Option<(Vec<u8>, u64)>>,
    {
        let key = Self::register_key(name);
        let write = |seen: Option<i64>, raw: Vec<u8>| {
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    seen.unwrap_or(0),
                )])
                .and_then([TxnOp::put(key.clone(), raw, None)]);
            let mut etcd = self.etcd.clone();
            async move { Ok(etcd.txn(txn).await.map_err(|e| self.err(e))?.succeeded()) }
        };
        register_cas(name, || self.register_get(name), write, decide).await
    }
}
