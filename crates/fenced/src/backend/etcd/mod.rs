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
//!   session expired must not take the lock on a stale view). A waiter
//!   with one key ahead is granted by that key's delete alone, with no
//!   look: keys made later queue behind it. Its watch is then a key range
//!   that covers its own key too (and ignores the deletes of keys between
//!   the two names), and a delete of its own key first means no grant but
//!   a look. The hold is believed only while its session lease is, as
//!   after a look.
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

use crate::backend::queue::{Wait, decode_register, grants, register_cas, waits_for};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::endpoints::Endpoints;
use crate::spi::lease::{SessionClock, believed_until};
use crate::spi::sync::unpoisoned;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, Decrement, ElectionLayout, HoldRef, HolderInfo,
    LockBackend, LockStatus, Mode, Outcome, RegisterValue, RegisterWrite, Renewal, Reply, Store,
    Withdrawal,
};
use etcd_client::{
    Client as Etcd, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

mod attempt;
mod holds;
mod keys;
mod session;
mod store;
use keys::*;
use session::*;

const DEFAULT_PORT: u16 = 2379;
const DEFAULT_TTL: Duration = Duration::from_secs(10);
const PARAMS: &[&str] = &["lease_ttl", "timeout", "ca"];
const TOKEN_PREFIX: &str = "fenced.token/";
/// What no lock name may start with on etcd: fenced's own records.
const RESERVED: &str = "fenced.";
const REGISTER_PREFIX: &str = "fenced.register/";

/// How a key holds, from its value.
fn mode_of(v: &[u8]) -> Mode {
    // The mode is the first line; the holder's record follows it.
    let v = v.split(|&b| b == b'\n').next().unwrap_or_default();
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

/// A key's value: its mode on the first line (empty for exclusive, as
/// `etcdctl lock` leaves it), the holder's record on the second.
fn value_of(mode: Mode, holder: &str) -> Vec<u8> {
    let mode = match mode {
        Mode::Exclusive => String::new(),
        Mode::Shared => "fenced:r".to_owned(),
        Mode::Permits { take, max } => format!("fenced:p:{take}:{max}"),
    };
    format!("{mode}\n{holder}").into_bytes()
}

/// The holder's record in a key's value, if fenced wrote it.
fn holder_of(v: &[u8]) -> Option<crate::Holder> {
    let at = v.iter().position(|&b| b == b'\n')?;
    crate::Holder::decode(&v[at + 1..])
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
    /// Set when granted: until when its lease runs (moved by renewals),
    /// for status. The core ends a hold whose lease runs out.
    deadline: Mutex<Option<Instant>>,
    /// The watch that wakes this waiter.
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Set by the watch when the one key that was ahead of this one in a
    /// listing is deleted. Keys made later queue behind, so nothing is
    /// ahead any more: the next attempt is granted without reading the
    /// queue again. Once set, it stays true for this key.
    freed: Arc<AtomicBool>,
    /// When its first attempt went out: about when its value (the holder
    /// record) was written.
    born: Instant,
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
    inner: Arc<EtcdShared>,
    keeper: tokio::task::JoinHandle<()>,
}

struct EtcdShared {
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
    /// The watches on registers (see `Store::watch_register`).
    register_watches: crate::spi::wake::RegisterWatches,
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
        let tls = ep.scheme == "etcds";
        let ca = ep.take_ca(tls, "etcds:")?;
        ep.finish(PARAMS)?;
        if !ep.path.is_empty() {
            return Err(Error::invalid(format!(
                "{label:?}: an etcd URL has no path (lock names are etcd key prefixes)"
            )));
        }
        let http = if tls { "https://" } else { "http://" };
        let endpoints: Vec<String> = (0..ep.hosts.len())
            .map(|i| format!("{http}{}", ep.addr(i)))
            .collect();
        let mut opts = ConnectOptions::new()
            .with_timeout(timeout)
            .with_connect_timeout(timeout);
        // `ca=`: the members' certificates are checked against that
        // authority alone; without it, against the webpki roots. Each
        // endpoint's host is the name checked.
        #[cfg(feature = "tls")]
        if tls {
            let roots = etcd_client::TlsOptions::new();
            opts = opts.with_tls(match ca {
                Some(pem) => roots.ca_certificate(etcd_client::Certificate::from_pem(pem)),
                None => roots.with_webpki_roots(),
            });
        }
        #[cfg(not(feature = "tls"))]
        debug_assert!(ca.is_none(), "etcds:// is refused without TLS");
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
            .map(|e| e.trim_start_matches(http).to_ascii_lowercase())
            .collect();
        hosts.sort();
        hosts.dedup();
        let inner = Arc::new(EtcdShared {
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
            register_watches: Default::default(),
        });
        let keeper = tokio::spawn(keep_alive(inner.clone(), granted));
        Ok(Arc::new(EtcdBackend { inner, keeper }))
    }
}

impl EtcdBackend {
    /// `fenced doctor` on etcd: the cluster's size and health, and the
    /// session that keeps the holds.
    pub(crate) async fn checks(&self) -> Result<Vec<crate::doctor::Check>> {
        use crate::doctor::{Check, Verdict};
        let inner = &self.inner;
        let mut etcd = inner.etcd.clone();
        let voters = etcd
            .member_list()
            .await
            .map(|m| m.members().iter().filter(|m| !m.is_learner()).count());
        let mut out = vec![match voters {
            Err(e) => Check::new("cluster", Verdict::Unknown, format!("member list: {e}")),
            Ok(0) => Check::new("cluster", Verdict::Unknown, "no voting member listed"),
            Ok(1) => Check::new(
                "cluster",
                Verdict::Warn,
                "one member: no fault tolerance, and its loss stops every lock until it is \
                 back; three or five members survive one or two",
            ),
            Ok(n) if n % 2 == 0 => Check::new(
                "cluster",
                Verdict::Warn,
                format!(
                    "{n} voting members: an even count tolerates no more failures than {} \
                     members do, and needs a larger quorum",
                    n - 1
                ),
            ),
            Ok(n) => Check::new(
                "cluster",
                Verdict::Pass,
                format!("{n} voting members: survives {} down", (n - 1) / 2),
            ),
        }];
        out.push(match etcd.status().await {
            Err(e) => Check::new("leader", Verdict::Unknown, format!("status: {e}")),
            Ok(st) if st.leader() == 0 => Check::new(
                "leader",
                Verdict::Fail,
                "the member answering has no leader: no lock can be granted until one is elected",
            ),
            Ok(st) => Check::new(
                "leader",
                Verdict::Pass,
                format!("leader {:x}, raft term {}", st.leader(), st.raft_term()),
            ),
        });
        out.push(Check::new(
            "session",
            Verdict::Pass,
            format!(
                "holds live on a {} s lease, kept alive every {} s: a holder cut off is told \
                 before the server can give its lock away",
                inner.session.ttl,
                (inner.session.ttl / 3).max(1)
            ),
        ));
        Ok(out)
    }
}
