//! The lock backend: attempts, renewals, releases and status.

use super::*;

impl LockBackend for EtcdBackend {
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
        "etcd"
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome> {
        Box::pin(self.inner.attempt(req))
    }

    fn renew<'a>(&'a self, refs: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>> {
        Box::pin(async move {
            let live = self.inner.session.lease.load(Ordering::Acquire);
            let checks = refs.iter().map(|r| async move {
                let Some(own) = unpoisoned(&self.inner.keys).get(&r.hold_id).cloned() else {
                    return Renewal::Gone;
                };
                if own.lease != live {
                    return Renewal::Gone;
                }
                let mut etcd = self.inner.etcd.clone();
                let got = etcd
                    .get(own.key.clone(), Some(GetOptions::new().with_keys_only()))
                    .await;
                // One hold's failed look says nothing of the others'.
                let Ok(got) = got else {
                    return Renewal::Unknown;
                };
                let rev = own.rev.load(Ordering::Acquire);
                let here = got
                    .kvs()
                    .first()
                    .is_some_and(|kv| kv.create_revision() == rev);
                if here && let Some(d) = unpoisoned(&own.deadline).as_mut() {
                    *d = Instant::now() + r.lease;
                }
                Renewal::from(here)
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

    /// Lock `N`'s keys are `N/<lease in hex>` (and `_<k>` for a client's
    /// second hold), as `etcdctl lock` writes them too: the names come
    /// back from a keys-only scan of the prefix, a page at a time.
    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>> {
        Box::pin(async move {
            const PAGE: i64 = 1000;
            let inner = &self.inner;
            let mut etcd = inner.etcd.clone();
            // The empty prefix: every key, from "\0" on ("\0" as the end).
            let (mut from, end) = if prefix.is_empty() {
                (vec![0], vec![0])
            } else {
                (prefix.as_bytes().to_vec(), range_end(prefix.as_bytes()))
            };
            let mut names = std::collections::BTreeSet::new();
            loop {
                let options = GetOptions::new()
                    .with_keys_only()
                    .with_limit(PAGE)
                    .with_range(end.clone());
                let r = etcd
                    .get(from.clone(), Some(options))
                    .await
                    .map_err(|e| inner.err(e))?;
                names.extend(r.kvs().iter().filter_map(lock_of_key));
                match r.kvs().last() {
                    Some(last) if r.more() => {
                        from = last.key().to_vec();
                        from.push(0);
                    }
                    _ => break,
                }
            }
            Ok(names.into_iter().collect())
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus> {
        Box::pin(async move {
            let inner = &self.inner;
            let prefix = prefix_of(name)?;
            let txn = Txn::new().and_then([queue_get(&prefix), TxnOp::get(token_key(name), None)]);
            let mut etcd = inner.etcd.clone();
            let r = etcd.txn(txn).await.map_err(|e| inner.err(e))?;
            let mut got = gets(&r);
            let tok = got.pop().unwrap_or_default();
            let kvs = own_level(&prefix, got.pop().unwrap_or_default());
            let mut last_token: u64 = tok
                .first()
                .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok())
                .unwrap_or(0);
            let owners: Vec<Option<String>> =
                kvs.iter().map(|kv| inner.owner_of(kv.key())).collect();
            let mut holders = Vec::new();
            let mut waiters = 0;
            for ((i, kv), granted) in kvs.iter().enumerate().zip(inner.grants(&kvs)) {
                if !granted {
                    waiters += 1;
                    continue;
                }
                let token = kv.create_revision() as u64;
                last_token = last_token.max(token);
                let lease_left = unpoisoned(&inner.keys)
                    .values()
                    .find(|o| o.key == kv.key())
                    .and_then(|o| {
                        unpoisoned(&o.deadline).map(|d| d.saturating_duration_since(Instant::now()))
                    })
                    .unwrap_or(Duration::from_secs(inner.session.ttl as u64));
                holders.push(HolderInfo {
                    owner: owners[i]
                        .clone()
                        .unwrap_or_else(|| format!("etcd lease {:x}", kv.lease())),
                    mode: mode_of(kv.value()),
                    token,
                    lease_left,
                    holder: holder_of(kv.value()),
                });
            }
            Ok(LockStatus::new(holders, waiters, last_token))
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> Reply<'a, usize> {
        Box::pin(async move {
            let inner = &self.inner;
            let kvs = inner.queue_of(name).await?;
            // The holders only: waiters keep their places.
            let holders: Vec<&KeyValue> = kvs
                .iter()
                .zip(inner.grants(&kvs))
                .filter_map(|(kv, granted)| granted.then_some(kv))
                .collect();
            let Some(top) = holders.iter().map(|kv| kv.create_revision()).max() else {
                return Ok(0);
            };
            let mut ops: Vec<TxnOp> = holders
                .iter()
                .map(|kv| TxnOp::delete(kv.key().to_vec(), None))
                .collect();
            ops.push(record_token(name, top));
            let mut etcd = inner.etcd.clone();
            etcd.txn(Txn::new().and_then(ops))
                .await
                .map_err(|e| inner.err(e))?;
            inner.wakeups.wake(name.as_str());
            Ok(holders.len())
        })
    }

    fn ownership(&self, hold: &HoldRef) -> Option<crate::spi::Ownership> {
        let own = unpoisoned(&self.inner.keys).get(&hold.hold_id).cloned()?;
        Some(crate::spi::Ownership {
            key: own.key.clone(),
            revision: own.rev.load(Ordering::Acquire) as u64,
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.keeper.abort();
            let ids: Vec<String> = unpoisoned(&self.inner.keys).keys().cloned().collect();
            for id in ids {
                let _ = self.inner.end(&id).await;
            }
            let lease = self.inner.session.lease.swap(0, Ordering::AcqRel);
            if lease != 0 {
                let mut etcd = self.inner.etcd.clone();
                let _ = etcd.lease_revoke(lease).await;
            }
        })
    }
}
