//! `zk://h1:2181,h2:2181,h3:2181/optional/chroot?session_timeout=10s`:
//! ZooKeeper, in Apache Curator's lock layouts.
//!
//! # Layout
//!
//! - **Session**: one ZooKeeper session per client (`session_timeout`,
//!   default 10 s). Every lock node is ephemeral: a client that dies, or is
//!   cut off past the session timeout, loses its nodes on the server. When
//!   the session expires a new one is opened, and the holds of the old one
//!   fire their lost signal.
//! - **Lock `N`** (on `zk://hosts/base`: the path `/base/N`, so Curator's
//!   `InterProcessMutex` on `/base/N` is the same lock): a container node
//!   with one ephemeral-sequential child per hold or waiter, named as
//!   Curator names them: `_c_<uuid>-lock-<10-digit sequence>` for an
//!   mutex (`InterProcessMutex`), `_c_<uuid>-__WRIT__<seq>` and
//!   `_c_<uuid>-__READ__<seq>` for the sides of a read-write lock
//!   (`InterProcessReadWriteLock`), and `_c_<uuid>-latch-<seq>` for an
//!   election's candidates (`LeaderLatch`). The `_c_` prefix (Curator's
//!   *protected* mode) lets a client whose create reply was lost find its
//!   node again instead of creating a second one.
//! - **Semaphore `N`**: `InterProcessSemaphoreV2`'s `N/locks` and
//!   `N/leases` (see `semaphore.rs`).
//! - **Recipes** Curator has keep its layouts: counters and the barrier
//!   in the node `N` (`curator.rs`), double barriers as its children
//!   (`barrier.rs`).
//! - **Order**: children queue by sequence, with the grant rule every
//!   queue-based backend shares (an exclusive node holds when first, a read
//!   node when no exclusive node is ahead); every lock is FIFO.
//! - **Waiting**: a waiter watches only the node it waits for, with
//!   `getData` (an `exists` watch on a node already gone would leak), and
//!   lists the children again when it fires.
//! - **Fencing token**: the node's `czxid`, which rises across the whole
//!   ensemble even when an emptied container is reaped and sequences
//!   restart. The highest token of a released hold is kept in
//!   `/fenced.meta/tokens/N`; registers live in `/fenced.meta/registers/N`
//!   (20 digits of fence, `:`, value), changed by compare-and-set on the
//!   node's version.
//! - **Timeouts**: `timeout=` bounds each request (default 5 s).
//! - **Security**: with `?digest=user:password` the session authenticates
//!   and every node fenced creates gets the ACL `auth` (creator only).
//!
//! Curator counts reentrancy in the client, as fenced does; a lease shorter
//! than the session is kept by this client (its node is deleted when the
//! lease ends without a renewal).

use crate::backend::queue::{
    Wait, decode_register, encode_register, grants, register_cas, waits_for,
};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::endpoints::Endpoints;
use crate::spi::lease::{SessionClock, believed_until};
use crate::spi::sync::unpoisoned;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, Decrement, HoldRef, HolderInfo, Kind, LockBackend,
    LockStatus, Mode, Outcome, RegisterValue, RegisterWrite, Renewal, Reply, Store, Withdrawal,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use zookeeper_client as zk;

mod attempt;
mod barrier;
mod curator;
mod holds;
mod nodes;
mod semaphore;
mod session;
mod store;
use session::*;

const DEFAULT_PORT: u16 = 2181;
const DEFAULT_SESSION: Duration = Duration::from_secs(10);
const PARAMS: &[&str] = &["session_timeout", "digest", "timeout"];
const TOKENS: &str = "/fenced.meta/tokens";
const REGISTERS: &str = "/fenced.meta/registers";

/// How a child holds, from its name; `None` for a node that is not a lock
/// node (fenced's and Curator's all end in a sequence after a marker).
fn mode_of(child: &str) -> Option<Mode> {
    let digits = child.bytes().rev().take_while(u8::is_ascii_digit).count();
    if digits < 10 {
        return None;
    }
    let stem = &child[..child.len() - digits];
    if stem.ends_with("__READ__") {
        Some(Mode::Shared)
    } else if stem.ends_with("lock-") || stem.ends_with("__WRIT__") || stem.ends_with("latch-") {
        Some(Mode::Exclusive)
    } else if let Some(i) = stem.rfind("permit-") {
        let mut parts = stem[i + 7..].trim_end_matches('-').split('-');
        let take = parts.next()?.parse().ok()?;
        let max = parts.next()?.parse().ok()?;
        Some(Mode::Permits { take, max })
    } else {
        None
    }
}

fn sequence_of(child: &str) -> u64 {
    let digits = child.bytes().rev().take_while(u8::is_ascii_digit).count();
    child[child.len() - digits..].parse().unwrap_or(u64::MAX)
}

fn marker(mode: Mode, kind: Kind) -> String {
    match mode {
        Mode::Exclusive if kind == Kind::ReadWrite => "__WRIT__".to_owned(),
        Mode::Exclusive if kind == Kind::Election => "latch-".to_owned(),
        Mode::Exclusive => "lock-".to_owned(),
        Mode::Shared => "__READ__".to_owned(),
        Mode::Permits { take, max } => format!("permit-{take}-{max}-lease-"),
    }
}

/// The lock nodes among `children`, in queue order, with their modes.
fn queue(mut children: Vec<String>) -> Vec<(String, Mode)> {
    let mut q: Vec<(String, Mode)> = children
        .drain(..)
        .filter_map(|c| mode_of(&c).map(|m| (c, m)))
        .collect();
    q.sort_by_key(|(c, _)| sequence_of(c));
    q
}

/// One node of this client: a hold, or a waiter's place.
struct OwnNode {
    name: LockName,
    owner: String,
    /// Curator's protected id: `_c_<uuid>-`.
    protect: String,
    /// An exclusive hold: holders of one name release in token order.
    exclusive: bool,
    /// A semaphore's: its nodes are at the gate and among the leases
    /// (see `semaphore.rs`).
    semaphore: bool,
    /// A double barrier member's: its node is named by its protected
    /// id's UUID alone (see `barrier.rs`).
    member: bool,
    /// The child's name once created (for a semaphore, its lease: the
    /// path below the lock's node, `leases/<child>`).
    child: Mutex<Option<String>>,
    /// A semaphore's place at its gate, `locks/<child>`, while it has one
    /// (see `semaphore.rs`).
    gate: Mutex<Option<String>>,
    /// Set before the gate's create goes out (as `create_sent`).
    gate_sent: AtomicBool,
    /// The further leases of a hold of several permits, as `child`.
    extra: Mutex<Vec<String>>,
    /// Its czxid (the token once granted).
    czxid: Mutex<i64>,
    /// The session the node belongs to.
    session: u64,
    /// Set when granted: until when its lease runs (moved by renewals),
    /// for status. The core ends a hold whose lease runs out.
    deadline: Mutex<Option<Instant>>,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Set before its create goes out: from then on a node may exist that
    /// `child` does not name yet (the reply was lost, or its future was
    /// dropped), found again by its protected id.
    create_sent: AtomicBool,
    /// A create of its node lost its reply: the create may land late, after
    /// a look that did not find it and a second create, and leave a stray
    /// node of its protected id (see `ZkShared::delete_strays`).
    create_lost: AtomicBool,
    /// A later hold of this client on the same name was granted while
    /// this one held exclusively (one owner taking read beside its
    /// write): its token is higher, so this release must not overwrite
    /// the last-token record blindly.
    later_sibling: AtomicBool,
    /// When its first attempt went out: about when its node's data (the
    /// holder record) was written.
    born: Instant,
}

impl Drop for OwnNode {
    fn drop(&mut self) {
        if let Some(w) = unpoisoned(&self.watcher).take() {
            w.abort();
        }
    }
}

pub(crate) struct ZkBackend {
    inner: Arc<ZkShared>,
    monitor: tokio::task::JoinHandle<()>,
}

impl Drop for ZkBackend {
    fn drop(&mut self) {
        self.monitor.abort();
    }
}

struct ZkShared {
    /// The live session's client, and its number (bumped per session).
    zk: Mutex<(zk::Client, u64)>,
    /// Until when the server is known to keep the session (by number): the
    /// send time of the last request it answered, plus the negotiated
    /// session timeout, less the drift holds allow for. Every node of the
    /// session is believed no longer than this.
    clock: SessionClock<u64>,
    /// `zk://` and the hosts, sorted, and the chroot.
    identity: String,
    connect: String,
    session_timeout: Duration,
    /// How long one request may take (`timeout=`).
    timeout: Duration,
    digest: Option<String>,
    label: String,
    wakeups: Arc<Wakeups>,
    nodes: Mutex<HashMap<String, Arc<OwnNode>>>,
    sessions: AtomicU64,
    /// The watches on registers (see `Store::watch_register`).
    register_watches: crate::spi::wake::RegisterWatches,
}

fn map_err(label: &str, e: zk::Error) -> Error {
    use zk::Error as E;
    match e {
        E::NoAuth | E::AuthFailed | E::InvalidAcl => {
            Error::invalid(format!("ZooKeeper at {label} refused us: {e}")).with_source(e)
        }
        E::BadArguments(_) => Error::invalid(format!("ZooKeeper at {label}: {e}")).with_source(e),
        E::ConnectionLoss
        | E::Timeout
        | E::NoHosts
        | E::SessionExpired
        | E::SessionMoved
        | E::Throttled
        | E::ClientClosed
        | E::NotReadOnly => {
            Error::unavailable(format!("ZooKeeper at {label} cannot serve us now: {e}"))
                .with_source(e)
        }
        // The client's own connection-level failures (an I/O error, a
        // server silent past the connection timeout): it reconnects.
        E::Custom(_) => {
            Error::unavailable(format!("ZooKeeper at {label} is unreachable: {e}")).with_source(e)
        }
        _ => Error::protocol(format!("ZooKeeper at {label} answered: {e}")).with_source(e),
    }
}

impl ZkBackend {
    pub(crate) async fn open(url: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
        let mut ep = Endpoints::parse(url, DEFAULT_PORT)?;
        let label = redact_digest(ep.redacted());
        let session_timeout = ep
            .take_duration("session_timeout")?
            .unwrap_or(DEFAULT_SESSION);
        if session_timeout < Duration::from_millis(500)
            || session_timeout > Duration::from_secs(600)
        {
            return Err(Error::invalid(format!(
                "session_timeout={session_timeout:?} in {label:?}: from 500ms to 10m (the \
                 server bounds it further by its tickTime)"
            )));
        }
        let timeout = ep.take_timeout()?;
        if ep.user.is_some() || ep.password.is_some() {
            return Err(Error::invalid(format!(
                "{label:?}: ZooKeeper takes credentials as ?digest=user:password, not in the host part"
            )));
        }
        let digest = ep.take("digest");
        if let Some(d) = &digest
            && !d.contains(':')
        {
            return Err(Error::invalid(format!(
                "digest in {label:?}: write it as user:password"
            )));
        }
        ep.finish(PARAMS)?;
        let hosts: Vec<String> = (0..ep.hosts.len()).map(|i| ep.addr(i)).collect();
        let chroot = if ep.path.is_empty() {
            String::new()
        } else {
            format!("/{}", ep.path.trim_end_matches('/'))
        };
        let connect = format!("{}{chroot}", hosts.join(","));
        let mut sorted: Vec<String> = hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
        sorted.sort();
        sorted.dedup();
        let identity = format!("zk://{}{chroot}", sorted.join(","));
        reachable(&hosts, timeout, &label).await?;
        let dialed = Instant::now();
        let first = ZkShared::dial(&connect, session_timeout, &digest, &label).await?;
        let bound = believed_until(dialed, first.session_timeout());
        let inner = ZkShared {
            zk: Mutex::new((first, 1)),
            clock: SessionClock::new(1, bound),
            identity,
            connect,
            session_timeout,
            timeout,
            digest,
            label,
            wakeups,
            nodes: Mutex::new(HashMap::new()),
            sessions: AtomicU64::new(1),
            register_watches: Default::default(),
        };
        let z = inner.client();
        if !chroot.is_empty() && z.check_stat("/").await.map_err(|e| inner.err(e))?.is_none() {
            return Err(Error::invalid(format!(
                "{:?}: the chroot {chroot} does not exist on the ensemble; create it first",
                inner.label
            )));
        }
        for dir in [TOKENS, REGISTERS] {
            z.mkdir(dir, &zk::CreateMode::Persistent.with_acls(inner.acls()))
                .await
                .map_err(|e| inner.err(e))?;
        }
        let inner = Arc::new(inner);
        let monitor = tokio::spawn(monitor(inner.clone()));
        Ok(Arc::new(ZkBackend { inner, monitor }))
    }
}

/// Fails at once, naming each host's error, when no host of the ensemble
/// takes a TCP connection: the ZooKeeper client retries a refused
/// connection until the session timeout ends and then says only "timeout".
async fn reachable(hosts: &[String], timeout: Duration, label: &str) -> Result<()> {
    let mut tries = tokio::task::JoinSet::new();
    for h in hosts {
        let h = h.clone();
        tries.spawn(async move {
            match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(h.as_str())).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("{h}: {e}")),
                Err(_) => Err(format!("{h}: no answer within {timeout:?}")),
            }
        });
    }
    let mut why = Vec::new();
    while let Some(r) = tries.join_next().await {
        match r {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => why.push(e),
            Err(e) => why.push(format!("a connection attempt failed: {e}")),
        }
    }
    Err(Error::unavailable(format!(
        "ZooKeeper at {label} is unreachable: {}",
        why.join("; ")
    )))
}

/// The URL for messages: the digest's password replaced by `***`.
fn redact_digest(url: &str) -> String {
    let Some(at) = url.find("digest=") else {
        return url.to_owned();
    };
    let value_end = url[at..].find('&').map_or(url.len(), |e| at + e);
    let user_end = url[at..value_end]
        .find(':')
        .map_or(value_end, |c| at + c + 1);
    format!("{}***{}", &url[..user_end], &url[value_end..])
}

impl ZkBackend {
    /// `fenced doctor` on ZooKeeper: the ensemble's size, and the session
    /// the server granted against the one asked for.
    pub(crate) async fn checks(&self) -> Result<Vec<crate::doctor::Check>> {
        use crate::doctor::{Check, Verdict};
        let inner = &self.inner;
        let hosts = inner
            .connect
            .split('/')
            .next()
            .unwrap_or("")
            .split(',')
            .count();
        // Counted from the URL: one address may front a whole ensemble
        // (a load balancer, a DNS name), which the client cannot tell.
        let mut out = vec![match hosts {
            1 => Check::new(
                "ensemble",
                Verdict::Warn,
                "one address in the URL: unless it fronts an ensemble, the loss of that \
                 server stops every lock until it is back; name three or five",
            ),
            n if n % 2 == 0 => Check::new(
                "ensemble",
                Verdict::Warn,
                format!(
                    "{n} addresses: an even ensemble tolerates no more failures than {} \
                     servers do",
                    n - 1
                ),
            ),
            n => Check::new(
                "ensemble",
                Verdict::Pass,
                format!("{n} addresses: survives {} down", (n - 1) / 2),
            ),
        }];
        let granted = unpoisoned(&inner.zk).0.session_timeout();
        out.push(if granted == inner.session_timeout {
            Check::new(
                "session",
                Verdict::Pass,
                format!(
                    "{granted:?} as asked: a holder cut off is told before the server can give \
                     its lock away"
                ),
            )
        } else {
            Check::new(
                "session",
                Verdict::Warn,
                format!(
                    "asked for {:?}, the server granted {granted:?} (its minSessionTimeout and \
                     maxSessionTimeout bound it, from 2 to 20 ticks by default): a dead \
                     holder's lock is freed after that long",
                    inner.session_timeout
                ),
            )
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_redacted() {
        assert_eq!(
            redact_digest("zk://h?digest=al:pw&x=1"),
            "zk://h?digest=al:***&x=1"
        );
        assert_eq!(redact_digest("zk://h?digest=al:pw"), "zk://h?digest=al:***");
        assert_eq!(redact_digest("zk://h"), "zk://h");
    }

    #[test]
    fn child_names_are_curators() {
        assert_eq!(
            mode_of("_c_0b5e3a4c-8f1d-4a3e-9d2b-1c2d3e4f5a6b-lock-0000000007"),
            Some(Mode::Exclusive)
        );
        assert_eq!(mode_of("lock-0000000001"), Some(Mode::Exclusive));
        assert_eq!(mode_of("_c_x-__READ__0000000002"), Some(Mode::Shared));
        assert_eq!(mode_of("_c_x-__WRIT__0000000003"), Some(Mode::Exclusive));
        assert_eq!(
            mode_of("_c_x-permit-2-5-0000000004"),
            Some(Mode::Permits { take: 2, max: 5 })
        );
        assert_eq!(mode_of("leases"), None);
        assert_eq!(mode_of("lock-12"), None);
        let q = queue(vec![
            "_c_b-lock-0000000010".into(),
            "_c_a-lock-0000000002".into(),
            "junk".into(),
        ]);
        assert_eq!(q[0].0, "_c_a-lock-0000000002");
        assert_eq!(q.len(), 2);
    }
}
