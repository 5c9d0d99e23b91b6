//! `etcd://h1:2379,h2:2379,h3:2379?lease_ttl=10s`: etcd v3, in the layout
//! of etcd's `concurrency.Mutex` (what `etcdctl lock NAME` uses).
//!
//! # Layout
//!
//! - **Session**: one etcd lease per client (`lease_ttl`, default 10 s),
//!   kept alive every TTL/3. Every key of the client is attached to it, so
//!   a client that dies, or is cut off past the TTL, loses its keys on the
//!   server and its waiters' places too. A new session lease is granted
//!   when the old one is gone; holds of the old one fire their lost signal.
//! - **Lock `N`**: the keys under the prefix `N/`, one per hold or waiter:
//!   `N/<session lease id in lowercase hex>` (a second concurrent hold of
//!   the same client on `N` adds `_<k>`), attached to the session lease.
//!   The value is empty for an exclusive hold (as `etcdctl lock` writes
//!   it), `fenced:r` for a read hold and `fenced:p:<take>:<max>` for
//!   semaphore permits; a key fenced does not know counts as exclusive.
//! - **Order**: keys queue by create revision, and a key is granted when
//!   nothing ahead of it conflicts: for an exclusive key, no key ahead;
//!   for a read key, no exclusive key ahead; for permits, only permit keys
//!   ahead, taking with it no more than the permits. Every lock is thus
//!   FIFO, and `fair` changes nothing. A try (no wait) that is not granted
//!   deletes its key at once.
//! - **Waiting**: a waiter watches only the key it waits for (the key just
//!   before it, or the last exclusive key before a reader) for deletion,
//!   from the revision it read, so a release between the read and the
//!   watch is not missed; a semaphore waiter watches the prefix for
//!   deletions. Each look at the queue checks that the waiter's own key
//!   still exists (the bug Jepsen found in etcd 3.4.3: a waiter whose
//!   session expired must not take the lock on a stale view).
//! - **Fencing token**: the create revision of the hold's key, which etcd
//!   raises on every write to the cluster. The highest token of a released
//!   hold is kept at `fenced.token/N` (20 decimal digits) for `status`.
//! - **Elections** are `concurrency.Election`'s layout, which is the
//!   mutex's: the leader is the key with the lowest create revision under
//!   `N/`, and it proclaims by writing its value into that key, guarded by
//!   its create revision (`etcdctl elect` campaigns and observes it). The
//!   values `fenced:r` and `fenced:p:…` are reserved for read and permit
//!   keys.
//! - **Fenced registers** are `fenced.register/N`: 20 digits of fence, `:`,
//!   the value; written by compare-and-set on the key's mod revision.
//!
//! Per-hold leases shorter than the session are kept by this client (a
//! hold whose lease ends without a renewal deletes its key); a client that
//! dies frees its holds when its session lease ends.

use super::queue::{Wait, decode_register, grants, register_cas, waits_for};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::endpoints::Endpoints;
use crate::spi::grant::permits_differ;
use crate::spi::lease::arm_lease_once;
use crate::spi::lease::{SessionClock, believed_until};
use crate::spi::sync::unpoisoned;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, ElectionLayout, HoldRef, HolderInfo, LockBackend,
    LockStatus, Mode, Outcome, RegisterValue, Renewal, Store, Ticket,
};
use etcd_client::{
    Client as Etcd, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

const DEFAULT_PORT: u16 = 2379;
const DEFAULT_TTL: Duration = Duration::from_secs(10);
const PARAMS: &[&str] = &["lease_ttl", "timeout"];
const TOKEN_PREFIX: &str = "fenced.token/";
/// What no lock name may start with on etcd: fenced's own records.
const RESERVED: &str = "fenced.";
const REGISTER_PREFIX: &str = "fenced.register/";

/// How a key holds, from its value.
fn mode_of(v: &[u8]) -> Mode {
    if v == b"fenced:r" {
        return Mode::Shared;
    }
    if let Some(rest) = v.strip_prefix(b"fenced:p:")
        && let Ok(rest) = std::str::from_utf8(rest)
        && let Some((take, max)) = rest.split_once(':')
        && let (Ok(take), Ok(max)) = (take.parse(), max.parse())
    {
        return Mode::Permits { take, max };
    }
    Mode::Exclusive
}

fn value_of(mode: Mode) -> Vec<u8> {
    match mode {
        Mode::Exclusive => Vec::new(),
        Mode::Shared => b"fenced:r".to_vec(),
        Mode::Permits { take, max } => format!("fenced:p:{take}:{max}").into_bytes(),
    }
}

/// The queue of a prefix listing: each key and how it holds.
fn queue(kvs: &[KeyValue]) -> Vec<(&[u8], Mode)> {
    kvs.iter()
        .map(|kv| (kv.key(), mode_of(kv.value())))
        .collect()
}

/// One key of this client: a hold, or a waiter's place.
struct OwnKey {
    key: Vec<u8>,
    name: LockName,
    owner: String,
    /// The session lease the key is attached to.
    lease: i64,
    /// Its create revision once known (the token when granted).
    rev: AtomicI64,
    /// Set when granted: the lease deadline renewals move.
    deadline: Mutex<Option<watch::Sender<Instant>>>,
    /// The watch that wakes this waiter.
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for OwnKey {
    fn drop(&mut self) {
        if let Some(w) = unpoisoned(&self.watcher).take() {
            w.abort();
        }
    }
}

/// The client's session lease.
struct Session {
    /// The live lease id, 0 while there is none.
    lease: AtomicI64,
    ttl: i64,
    /// Bumped when the lease changes.
    epoch: AtomicU64,
    /// Until when the server is known to keep the lease: the send time
    /// of the last keep-alive it answered, plus the TTL it granted, less
    /// the drift holds allow for. Every hold of the lease is believed no
    /// longer than this (see `core::hold`).
    clock: SessionClock<i64>,
}

pub(crate) struct EtcdBackend {
    inner: Arc<Inner>,
    keeper: tokio::task::JoinHandle<()>,
}

struct Inner {
    etcd: Etcd,
    label: String,
    /// `etcd://` and the endpoints, sorted.
    identity: String,
    /// How long one request may take (`timeout=`).
    timeout: Duration,
    wakeups: Arc<Wakeups>,
    session: Session,
    /// hold id → key.
    keys: Mutex<HashMap<String, Arc<OwnKey>>>,
    /// Keys whose create went out unanswered and was then given up: the
    /// server may yet apply it (a proposal that outlived its request), so
    /// the name stays out of use while it is watched for (see `haunt`).
    ghosts: Arc<Mutex<HashSet<Vec<u8>>>>,
    next_suffix: AtomicU64,
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

impl EtcdBackend {
    pub(crate) async fn open(url: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
        let mut ep = Endpoints::parse(url, DEFAULT_PORT)?;
        let label = ep.redacted().to_owned();
        let ttl = ep.take_duration("lease_ttl")?.unwrap_or(DEFAULT_TTL);
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(3600) {
            return Err(Error::invalid(format!(
                "lease_ttl={ttl:?} in {label:?}: etcd leases count whole seconds, from 1 s to 1 h"
            )));
        }
        let timeout = ep.take_timeout()?;
        ep.finish(PARAMS)?;
        if !ep.path.is_empty() {
            return Err(Error::invalid(format!(
                "{label:?}: an etcd URL has no path (lock names are etcd key prefixes)"
            )));
        }
        let endpoints: Vec<String> = (0..ep.hosts.len())
            .map(|i| format!("http://{}", ep.addr(i)))
            .collect();
        let mut opts = ConnectOptions::new()
            .with_timeout(timeout)
            .with_connect_timeout(timeout);
        if let Some(user) = &ep.user {
            opts = opts.with_user(user.clone(), ep.password.clone().unwrap_or_default());
        }
        let mut etcd = Etcd::connect(&endpoints, Some(opts))
            .await
            .map_err(|e| map_err(&label, e))?;
        let ttl_s = ttl.as_secs_f64().ceil() as i64;
        let granted = Instant::now();
        let first = etcd
            .lease_grant(ttl_s, None)
            .await
            .map_err(|e| map_err(&label, e))?;
        let mut hosts: Vec<String> = endpoints
            .iter()
            .map(|e| e.trim_start_matches("http://").to_ascii_lowercase())
            .collect();
        hosts.sort();
        hosts.dedup();
        let inner = Arc::new(Inner {
            etcd,
            label,
            identity: format!("etcd://{}", hosts.join(",")),
            timeout,
            wakeups,
            session: Session {
                lease: AtomicI64::new(first.id()),
                ttl: first.ttl().max(ttl_s),
                epoch: AtomicU64::new(0),
                clock: SessionClock::new(
                    first.id(),
                    believed_until(granted, Duration::from_secs(first.ttl().max(1) as u64)),
                ),
            },
            keys: Mutex::new(HashMap::new()),
            ghosts: Arc::default(),
            next_suffix: AtomicU64::new(1),
        });
        let keeper = tokio::spawn(keep_alive(inner.clone(), granted));
        Ok(Arc::new(EtcdBackend { inner, keeper }))
    }
}

/// Keeps the session lease alive every TTL/3; grants a new one when it is
/// gone, and wakes every waiter then (their places went with it). The
/// session counts as lost once the server may have let it run out: the TTL
/// it last granted, from when that keep-alive was sent, less the drift
/// holds allow for. That reckoning spans re-opened streams, so a stream
/// that keeps breaking cannot keep a dead session believed.
async fn keep_alive(inner: Arc<Inner>, granted: Instant) {
    let ttl = Duration::from_secs(inner.session.ttl as u64);
    let period = ttl / 3;
    let mut etcd = inner.etcd.clone();
    let mut lives_until = believed_until(granted, ttl);
    loop {
        let id = inner.session.lease.load(Ordering::Acquire);
        if id == 0 {
            let sent = Instant::now();
            match etcd.lease_grant(inner.session.ttl, None).await {
                Ok(r) => {
                    lives_until = believed_until(sent, Duration::from_secs(r.ttl().max(1) as u64));
                    inner.session.clock.start(r.id(), lives_until);
                    inner.session.lease.store(r.id(), Ordering::Release);
                    inner.session.epoch.fetch_add(1, Ordering::AcqRel);
                    inner.wakeups.bump_all();
                }
                Err(e) => {
                    tracing::debug!(error = %e, "etcd: no new session lease yet");
                    tokio::time::sleep(period.min(Duration::from_secs(1))).await;
                }
            }
            continue;
        }
        let stream = etcd.lease_keep_alive(id).await;
        let Ok((mut keeper, mut replies)) = stream else {
            tracing::debug!(lease = id, "etcd: keep-alive stream not opened");
            tokio::time::sleep(Duration::from_millis(200)).await;
            if Instant::now() >= lives_until {
                drop_session(&inner, id);
            }
            continue;
        };
        loop {
            let sent = Instant::now();
            let ok = async {
                keeper.keep_alive().await.ok()?;
                let reply = tokio::time::timeout(period, replies.message()).await;
                reply.ok()?.ok()?.map(|r| r.ttl())
            }
            .await;
            match ok {
                Some(secs) if secs > 0 => {
                    lives_until = believed_until(sent, Duration::from_secs(secs as u64));
                    inner.session.clock.confirm(id, lives_until);
                }
                // The server says the lease is gone.
                Some(_) => {
                    drop_session(&inner, id);
                    break;
                }
                None => {
                    tracing::debug!(lease = id, "etcd: keep-alive unanswered");
                    if Instant::now() >= lives_until {
                        drop_session(&inner, id);
                    }
                    break;
                }
            }
            tokio::time::sleep(period).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn drop_session(inner: &Inner, id: i64) {
    if inner
        .session
        .lease
        .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        tracing::warn!(lease = id, "etcd session lease lost; its holds are lost");
        inner.session.clock.end(id);
        inner.session.epoch.fetch_add(1, Ordering::AcqRel);
        inner.wakeups.bump_all();
        // A lease we stopped hearing about may still live on the server,
        // keeping our keys in every queue; each leader election resets its
        // TTL, so under a string of elections it never runs out (the
        // torture suite's leader fault blocked a lock for 20 s). Revoke
        // it until the server answers.
        let (etcd, label) = (inner.etcd.clone(), inner.label.clone());
        tokio::spawn(async move {
            let revoke = || {
                let (mut etcd, label) = (etcd.clone(), label.clone());
                async move { etcd.lease_revoke(id).await.map_err(|e| map_err(&label, e)) }
            };
            super::queue::retry_transient(revoke, super::queue::TRIES_IN_BACKGROUND, || true).await;
        });
    }
}

/// Whether etcd refused a request because its lease no longer exists.
fn lease_gone(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::NotFound && s.message().contains("lease not found"))
}

fn map_err(label: &str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    if lease_gone(&e) {
        return Error::unavailable(format!(
            "etcd at {label}: this client's session lease ran out; a new one is on its way"
        ))
        .with_source(e);
    }
    match &e {
        E::GRpcStatus(s) => {
            use tonic::Code as C;
            match s.code() {
                C::Unauthenticated | C::PermissionDenied | C::InvalidArgument
                    if s.message().contains("auth")
                        || s.message().contains("password")
                        || s.message().contains("permission") =>
                {
                    Error::invalid(format!("etcd at {label} refused us: {}", s.message()))
                        .with_source(e)
                }
                C::Unavailable
                | C::DeadlineExceeded
                | C::Aborted
                | C::Cancelled
                | C::ResourceExhausted
                | C::Unknown => Error::unavailable(format!(
                    "etcd at {label} cannot serve us now: {}",
                    s.message()
                ))
                .with_source(e),
                _ => Error::protocol(format!("etcd at {label} answered: {}", s.message()))
                    .with_source(e),
            }
        }
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) => {
            Error::invalid(format!("etcd at {label}: {e}")).with_source(e)
        }
        _ => Error::unavailable(format!("etcd at {label} is unreachable: {e}")).with_source(e),
    }
}

fn prefix_of(name: &LockName) -> Result<Vec<u8>> {
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

/// The keys of a prefix listing that belong to the lock itself: `N/x`, not
/// `N/b/x`, which is lock `N/b`'s (its prefix `N/b/` starts with `N/`).
fn own_level(prefix: &[u8], mut kvs: Vec<KeyValue>) -> Vec<KeyValue> {
    kvs.retain(|kv| {
        kv.key()
            .get(prefix.len()..)
            .is_some_and(|rest| !rest.contains(&b'/'))
    });
    kvs
}

fn queue_get(prefix: &[u8]) -> TxnOp {
    TxnOp::get(
        prefix.to_vec(),
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend),
        ),
    )
}

fn token_key(name: &LockName) -> Vec<u8> {
    format!("{TOKEN_PREFIX}{}", name.as_str()).into_bytes()
}

/// Keeps the largest released token at `fenced.token/N` (nested in a
/// release's transaction).
fn record_token(name: &LockName, token: i64) -> TxnOp {
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

fn gets(r: &etcd_client::TxnResponse) -> Vec<Vec<KeyValue>> {
    r.op_responses()
        .into_iter()
        .filter_map(|o| match o {
            TxnOpResponse::Get(g) => Some(g.kvs().to_vec()),
            _ => None,
        })
        .collect()
}

fn revision(r: &etcd_client::TxnResponse) -> i64 {
    r.header().map_or(0, |h| h.revision())
}

impl Inner {
    fn err(&self, e: etcd_client::Error) -> Error {
        map_err(&self.label, e)
    }

    fn lease(&self) -> Result<i64> {
        match self.session.lease.load(Ordering::Acquire) {
            0 => Err(Error::unavailable(format!(
                "etcd at {}: this client's session lease is gone and no new one is granted yet",
                self.label
            ))),
            id => Ok(id),
        }
    }

    /// This client's key for an attempt, made on its first try.
    fn own_key(&self, req: &Attempt, prefix: &[u8], lease: i64) -> Arc<OwnKey> {
        let mut keys = unpoisoned(&self.keys);
        if let Some(k) = keys.get(&req.hold_id)
            && k.lease == lease
        {
            return k.clone();
        }
        let base = format!("{}{lease:x}", String::from_utf8_lossy(prefix));
        let ghosts = unpoisoned(&self.ghosts);
        let taken =
            |k: &str| keys.values().any(|o| o.key == k.as_bytes()) || ghosts.contains(k.as_bytes());
        let key = if taken(&base) {
            loop {
                let n = self.next_suffix.fetch_add(1, Ordering::Relaxed);
                let k = format!("{base}_{n}");
                if !taken(&k) {
                    break k;
                }
            }
        } else {
            base
        };
        let own = Arc::new(OwnKey {
            key: key.into_bytes(),
            name: req.name.clone(),
            owner: req.owner_key.clone(),
            lease,
            rev: AtomicI64::new(0),
            deadline: Mutex::new(None),
            watcher: Mutex::new(None),
        });
        keys.insert(req.hold_id.clone(), own.clone());
        own
    }

    /// Which keys of a prefix listing (sorted by create revision) hold.
    fn grants(&self, kvs: &[KeyValue]) -> Vec<bool> {
        let owners: Vec<Option<String>> = kvs.iter().map(|kv| self.owner_of(kv.key())).collect();
        grants(&queue(kvs), &owners)
    }

    fn owner_of(&self, key: &[u8]) -> Option<String> {
        unpoisoned(&self.keys)
            .values()
            .find(|o| o.key == key)
            .map(|o| o.owner.clone())
    }

    async fn attempt(self: &Arc<Self>, req: &Attempt) -> Result<Outcome> {
        let prefix = prefix_of(&req.name)?;
        let lease = self.lease()?;
        let own = self.own_key(req, &prefix, lease);
        let mut etcd = self.etcd.clone();
        // A waiter's key exists already: a read-only transaction looks at
        // the queue without a write through consensus (etcd sends a
        // transaction through Raft if either branch writes, taken or not).
        let known = own.rev.load(Ordering::Acquire) > 0;
        let txn = if known {
            Txn::new().and_then([queue_get(&prefix)])
        } else {
            Txn::new()
                .when([Compare::create_revision(
                    own.key.clone(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([
                    TxnOp::put(
                        own.key.clone(),
                        value_of(req.mode),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    queue_get(&prefix),
                ])
                .or_else([queue_get(&prefix)])
        };
        let r = match etcd.txn(txn).await {
            Ok(r) => r,
            Err(e) => {
                // The server let our session lease run out before the
                // keep-alive noticed: start a new session, then try again.
                if lease_gone(&e) {
                    drop_session(self, lease);
                }
                return Err(self.err(e));
            }
        };
        let created = !known && r.succeeded();
        let at = revision(&r);
        let kvs = own_level(&prefix, gets(&r).pop().unwrap_or_default());
        let Some(me) = kvs.iter().position(|kv| kv.key() == own.key.as_slice()) else {
            // Our key is gone (our session ended while we waited, or it
            // was force-deleted): never act on a queue we are not in.
            unpoisoned(&self.keys).remove(&req.hold_id);
            if created {
                return Err(Error::protocol(format!(
                    "etcd at {}: a key we just created is missing from its prefix",
                    self.label
                )));
            }
            return Ok(Outcome::Busy(Blocked {
                ticket: None,
                retry_after: Some(Duration::from_millis(1)),
            }));
        };
        let rev = kvs[me].create_revision();
        own.rev.store(rev, Ordering::Release);
        let owners: Vec<Option<String>> = kvs.iter().map(|kv| self.owner_of(kv.key())).collect();
        let wait = waits_for(&queue(&kvs), me, |i| {
            i != me && owners[i].as_deref() == Some(req.owner_key.as_str())
        });
        match wait {
            Wait::Granted => {
                if let Some(w) = unpoisoned(&own.watcher).take() {
                    w.abort();
                }
                let (me, id) = (self.clone(), req.hold_id.clone());
                arm_lease_once(&own.deadline, req.lease, async move {
                    me.end_patiently(&id, super::queue::TRIES_WAITED_ON).await;
                });
                Ok(Outcome::Granted {
                    token: rev as u64,
                    session: Some(self.session.clock.bound_of(own.lease)),
                })
            }
            Wait::Refused(theirs) => {
                self.end_patiently(&req.hold_id, super::queue::TRIES_WAITED_ON)
                    .await;
                let ours = req.mode.permits().1;
                Ok(Outcome::Refused(permits_differ(
                    req.name.as_str(),
                    theirs,
                    ours,
                )))
            }
            _ if !req.will_wait => {
                self.end_patiently(&req.hold_id, super::queue::TRIES_WAITED_ON)
                    .await;
                Ok(Outcome::Busy(Blocked {
                    ticket: None,
                    retry_after: None,
                }))
            }
            w => {
                let (key, options) = match w {
                    Wait::Key(k) => (k, WatchOptions::new()),
                    _ => (prefix.clone(), WatchOptions::new().with_prefix()),
                };
                let options = options
                    .with_start_revision(at + 1)
                    .with_filters([WatchFilterType::NoPut]);
                let wakeups = self.wakeups.clone();
                let name = req.name.clone();
                let mut etcd = self.etcd.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut stream) = etcd.watch(key, Some(options)).await {
                        while let Ok(Some(msg)) = stream.message().await {
                            if msg.canceled()
                                || msg
                                    .events()
                                    .iter()
                                    .any(|e| e.event_type() == EventType::Delete)
                            {
                                break;
                            }
                        }
                    }
                    wakeups.bump(name.as_str());
                });
                if let Some(old) = unpoisoned(&own.watcher).replace(task) {
                    old.abort();
                }
                Ok(Outcome::Busy(Blocked {
                    ticket: Some(rev),
                    retry_after: None,
                }))
            }
        }
    }

    /// Deletes the key of `hold_id` (hold or place) and forgets it; whether
    /// the key was still there. On an error the key is kept, to try again.
    async fn end(&self, hold_id: &str) -> Result<bool> {
        let Some(own) = unpoisoned(&self.keys).get(hold_id).cloned() else {
            return Ok(false);
        };
        let rev = own.rev.load(Ordering::Acquire);
        let granted = unpoisoned(&own.deadline).is_some();
        let mut ops = vec![TxnOp::delete(own.key.clone(), None)];
        if granted {
            ops.push(record_token(&own.name, rev));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                own.key.clone(),
                if rev > 0 {
                    CompareOp::Equal
                } else {
                    CompareOp::Greater
                },
                rev,
            )])
            .and_then(ops);
        let mut etcd = self.etcd.clone();
        let done = etcd.txn(txn).await.map_err(|e| self.err(e))?.succeeded();
        if rev == 0 && !done {
            self.haunt(own.key.clone());
        }
        unpoisoned(&self.keys).remove(hold_id);
        if let Some(d) = unpoisoned(&own.deadline).take() {
            d.send_replace(Instant::now());
        }
        self.wakeups.bump(own.name.as_str());
        Ok(done)
    }

    /// Watches for a key whose create was given up unanswered: the put
    /// may still be applied (a proposal the cluster commits after the
    /// request timed out), and would then sit in its lock's queue on our
    /// live session, unknown to us, until the client closes. Looked for
    /// after 1, 3, 9 and 27 request timeouts and deleted if there; the
    /// name is not reused meanwhile, so what is found is the ghost.
    fn haunt(&self, key: Vec<u8>) {
        unpoisoned(&self.ghosts).insert(key.clone());
        let (ghosts, mut etcd, timeout) = (self.ghosts.clone(), self.etcd.clone(), self.timeout);
        tokio::spawn(async move {
            let mut wait = timeout;
            for _ in 0..4 {
                tokio::time::sleep(wait).await;
                let delete = Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Greater, 0)])
                    .and_then([TxnOp::delete(key.clone(), None)]);
                if let Ok(r) = etcd.txn(delete).await
                    && r.succeeded()
                {
                    tracing::warn!(key = %String::from_utf8_lossy(&key),
                        "etcd applied a create after it was given up; deleted it");
                }
                wait *= 3;
            }
            unpoisoned(&ghosts).remove(&key);
        });
    }

    /// [`end`](Self::end) in the background's way: transient errors are
    /// tried again for a while (a leader election), then left to the
    /// session lease.
    async fn end_patiently(&self, hold_id: &str, tries: u32) {
        let epoch = self.session.epoch.load(Ordering::Acquire);
        let same_session = || self.session.epoch.load(Ordering::Acquire) == epoch;
        super::queue::retry_transient(|| self.end(hold_id), tries, same_session).await
    }
}

impl LockBackend for EtcdBackend {
    fn scheme(&self) -> &'static str {
        "etcd"
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> BoxFuture<'a, Result<Outcome>> {
        Box::pin(self.inner.attempt(req))
    }

    fn renew<'a>(&'a self, refs: &'a [HoldRef]) -> BoxFuture<'a, Result<Vec<Renewal>>> {
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
                if here && let Some(d) = unpoisoned(&own.deadline).as_ref() {
                    d.send_replace(Instant::now() + r.lease);
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

    fn release<'a>(&'a self, hold: &'a HoldRef) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.inner.end(&hold.hold_id))
    }

    fn release_later(&self, hold: HoldRef) {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            inner
                .end_patiently(&hold.hold_id, super::queue::TRIES_IN_BACKGROUND)
                .await
        });
    }

    fn abandon<'a>(
        &'a self,
        _name: &'a LockName,
        _ticket: Option<Ticket>,
        hold_id: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.inner
                .end_patiently(hold_id, super::queue::TRIES_WAITED_ON)
                .await;
            Ok(())
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<LockStatus>> {
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
                        unpoisoned(&o.deadline)
                            .as_ref()
                            .map(|d| d.borrow().saturating_duration_since(Instant::now()))
                    })
                    .unwrap_or(Duration::from_secs(inner.session.ttl as u64));
                holders.push(HolderInfo {
                    owner: owners[i]
                        .clone()
                        .unwrap_or_else(|| format!("etcd lease {:x}", kv.lease())),
                    mode: mode_of(kv.value()),
                    token,
                    lease_left,
                });
            }
            Ok(LockStatus {
                holders,
                waiters,
                last_token,
            })
        })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<usize>> {
        Box::pin(async move {
            let inner = &self.inner;
            let prefix = prefix_of(name)?;
            let mut etcd = inner.etcd.clone();
            let got = etcd
                .get(
                    prefix,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Ascend),
                    ),
                )
                .await
                .map_err(|e| inner.err(e))?;
            let kvs = own_level(&prefix_of(name)?, got.kvs().to_vec());
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
            etcd.txn(Txn::new().and_then(ops))
                .await
                .map_err(|e| inner.err(e))?;
            inner.wakeups.bump(name.as_str());
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

impl Store for EtcdBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<RegisterValue>> {
        Box::pin(async move { Ok(self.inner.register_get(name).await?.map(|(v, f, _)| (v, f))) })
    }

    fn register_write<'a>(
        &'a self,
        name: &'a LockName,
        fence: Option<u64>,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.inner.register_change(name, move |old| {
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
        Box::pin(self.inner.register_change(name, move |old| {
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
                .register_change(name, |old| {
                    let Some((v, f)) = old else { return Ok(None) };
                    let n = crate::spi::codec::parse_i64(name, v)?;
                    if n < by {
                        after = None;
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

impl ElectionLayout for EtcdBackend {
    fn proclaim<'a>(
        &'a self,
        hold: &'a HoldRef,
        token: u64,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<bool>> {
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

    fn leader<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<crate::spi::LeaderValue>> {
        Box::pin(async move {
            let inner = &self.inner;
            let mut etcd = inner.etcd.clone();
            let prefix = prefix_of(name)?;
            // No limit: a nested lock's keys may come first, and are not this one's.
            let got = etcd
                .get(
                    prefix.clone(),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Ascend),
                    ),
                )
                .await
                .map_err(|e| inner.err(e))?;
            let kvs = own_level(&prefix, got.kvs().to_vec());
            Ok(kvs
                .first()
                .map(|kv| (kv.value().to_vec(), kv.create_revision() as u64)))
        })
    }
}

impl Backend for EtcdBackend {
    fn election(&self) -> Option<&dyn ElectionLayout> {
        Some(self)
    }
}

impl Inner {
    fn register_key(name: &LockName) -> Vec<u8> {
        format!("{REGISTER_PREFIX}{}", name.as_str()).into_bytes()
    }

    /// The register's value, fence and mod revision.
    async fn register_get(&self, name: &LockName) -> Result<Option<(Vec<u8>, u64, i64)>> {
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
    async fn register_change<F>(&self, name: &LockName, decide: F) -> Result<bool>
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
