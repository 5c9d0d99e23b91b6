//! Key layout: a lock's prefix, its queue, its token record.

use super::*;

pub(super) fn prefix_of(name: &LockName) -> Result<Vec<u8>> {
    let n = name.as_str();
    if n.ends_with('/') {
        return Err(Error::invalid(format!(
            "lock name {n:?} ends with '/': on etcd the lock is the prefix `{n}/`, which \
             would nest inside another lock's keys"
        )));
    }
    if n.starts_with(RESERVED) {
        return Err(Error::invalid(format!(
            "lock name {n:?} starts with {RESERVED:?}, which fenced keeps for its own \
             records on etcd ({TOKEN_PREFIX}…, {REGISTER_PREFIX}…)"
        )));
    }
    Ok(format!("{n}/").into_bytes())
}

/// The end of the range of keys that start with `prefix`.
pub(super) fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xFF: to the end of the keys.
    vec![0]
}

/// The lock a key is a hold or queue place of: `N` for `N/<lease in hex>`
/// or `N/<lease in hex>_<k>` on a lease (a hold lives on its session);
/// `None` for fenced's own records and for keys of other shapes or with
/// no lease (the application's data).
pub(super) fn lock_of_key(kv: &KeyValue) -> Option<LockName> {
    if kv.lease() == 0 {
        return None;
    }
    let (name, last) = std::str::from_utf8(kv.key()).ok()?.rsplit_once('/')?;
    if name.is_empty() || name.ends_with('/') {
        return None;
    }
    let (lease, nth) = last.split_once('_').unwrap_or((last, "0"));
    let shaped = !lease.is_empty()
        && lease
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        && !nth.is_empty()
        && nth.bytes().all(|b| b.is_ascii_digit());
    if !shaped || name.starts_with(RESERVED) {
        return None;
    }
    LockName::new(name).ok()
}

/// The keys of a prefix listing that belong to the lock itself: `N/x`, not
/// `N/b/x`, which is lock `N/b`'s (its prefix `N/b/` starts with `N/`).
pub(super) fn own_level(prefix: &[u8], mut kvs: Vec<KeyValue>) -> Vec<KeyValue> {
    kvs.retain(|kv| {
        kv.key()
            .get(prefix.len()..)
            .is_some_and(|rest| !rest.contains(&b'/'))
    });
    kvs
}

/// Every key under a prefix, oldest first: a lock's queue.
fn in_creation_order() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

pub(super) fn queue_get(prefix: &[u8]) -> TxnOp {
    TxnOp::get(prefix.to_vec(), Some(in_creation_order()))
}

impl EtcdShared {
    /// The queue of `name` (its own level: not a nested lock's keys),
    /// oldest first.
    pub(super) async fn queue_of(&self, name: &LockName) -> Result<Vec<KeyValue>> {
        let prefix = prefix_of(name)?;
        let mut etcd = self.etcd.clone();
        let got = etcd
            .get(prefix.clone(), Some(in_creation_order()))
            .await
            .map_err(|e| self.err(e))?;
        Ok(own_level(&prefix, got.kvs().to_vec()))
    }
}

pub(super) fn token_key(name: &LockName) -> Vec<u8> {
    format!("{TOKEN_PREFIX}{}", name.as_str()).into_bytes()
}

/// Keeps the largest released token at `fenced.token/N` (nested in a
/// release's transaction).
pub(super) fn record_token(name: &LockName, token: i64) -> TxnOp {
    let k = token_key(name);
    let v = format!("{token:020}");
    TxnOp::txn(
        Txn::new()
            .when([Compare::version(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(k.clone(), v.clone(), None)])
            .or_else([TxnOp::txn(
                Txn::new()
                    .when([Compare::value(k.clone(), CompareOp::Less, v.clone())])
                    .and_then([TxnOp::put(k, v, None)]),
            )]),
    )
}

pub(super) fn gets(r: &etcd_client::TxnResponse) -> Vec<Vec<KeyValue>> {
    r.op_responses()
        .into_iter()
        .filter_map(|o| match o {
            TxnOpResponse::Get(g) => Some(g.kvs().to_vec()),
            _ => None,
        })
        .collect()
}

pub(super) fn revision(r: &etcd_client::TxnResponse) -> i64 {
    r.header().map_or(0, |h| h.revision())
}
