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
//!   (`InterProcessReadWriteLock`), and fenced's own
//!   `_c_<uuid>-permit-<take>-<max>-<seq>` for semaphore permits. The `_c_`
//!   prefix (Curator's *protected* mode) lets a client whose create reply
//!   was lost find its node again instead of creating a second one.
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

use super::queue::{Wait, decode_register, encode_register, grants, register_cas, waits_for};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::endpoints::Endpoints;
use crate::spi::grant::permits_differ;
use crate::spi::lease::arm_lease_once;
use crate::spi::lease::{SessionClock, believed_until};
use crate::spi::sync::unpoisoned;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, HoldRef, HolderInfo, LockBackend, LockStatus, Mode,
    Outcome, RegisterValue, Renewal, Store, Ticket,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use zookeeper_client as zk;

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
    } else if stem.ends_with("lock-") || stem.ends_with("__WRIT__") {
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

fn marker(mode: Mode, rw: bool) -> String {
    match mode {
        Mode::Exclusive if rw => "__WRIT__".to_owned(),
        Mode::Exclusive => "lock-".to_owned(),
        Mode::Shared => "__READ__".to_owned(),
        Mode::Permits { take, max } => format!("permit-{take}-{max}-"),
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
    /// The child's name once created.
    child: Mutex<Option<String>>,
    /// Its czxid (the token once granted).
    czxid: Mutex<i64>,
    /// The session the node belongs to.
    session: u64,
    deadline: Mutex<Option<watch::Sender<Instant>>>,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Set before its create goes out: from then on a node may exist that
    /// `child` does not name yet (the reply was lost, or its future was
    /// dropped), found again by its protected id.
    create_sent: AtomicBool,
    /// A later hold of this client on the same name was granted while
    /// this one held exclusively (one owner taking read beside its
    /// write): its token is higher, so this release must not overwrite
    /// the last-token record blindly.
    later_sibling: AtomicBool,
}

impl Drop for OwnNode {
    fn drop(&mut self) {
        if let Some(w) = unpoisoned(&self.watcher).take() {
            w.abort();
        }
    }
}

pub(crate) struct ZkBackend {
    inner: Arc<Inner>,
    monitor: tokio::task::JoinHandle<()>,
}

impl Drop for ZkBackend {
    fn drop(&mut self) {
        self.monitor.abort();
    }
}

struct Inner {
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
        let dialed = Instant::now();
        let first = Inner::dial(&connect, session_timeout, &digest, &label).await?;
        let bound = believed_until(dialed, first.session_timeout());
        let inner = Inner {
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

/// Opens a new session when the current one ends, and wakes every waiter;
/// keeps each session's bound while it lives (see [`heartbeat`]).
async fn monitor(inner: Arc<Inner>) {
    loop {
        let (z, number) = unpoisoned(&inner.zk).clone();
        let mut states = z.state_watcher();
        let ended = async {
            loop {
                let s = states.changed().await;
                if s.is_terminated() {
                    break;
                }
                inner.wakeups.bump_all();
            }
        };
        // The heartbeat runs inside this task (never spawned apart), so
        // it stops with the session, and with the monitor when the
        // backend closes: a beat left running would keep the session,
        // and its connection, open for good.
        tokio::select! {
            () = ended => {}
            () = heartbeat(&inner, &z, number) => {}
        }
        drop(z);
        inner.clock.end(number);
        tracing::warn!(
            session = number,
            "ZooKeeper session ended; its holds are lost, opening a new one"
        );
        inner.wakeups.bump_all();
        let mut pause = Duration::from_millis(100);
        let (fresh, dialed) = loop {
            let dialed = Instant::now();
            match Inner::dial(
                &inner.connect,
                inner.session_timeout,
                &inner.digest,
                &inner.label,
            )
            .await
            {
                Ok(c) => break (c, dialed),
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        };
        let n = inner.sessions.fetch_add(1, Ordering::AcqRel) + 1;
        let until = believed_until(dialed, fresh.session_timeout());
        inner.clock.start(n, until);
        *unpoisoned(&inner.zk) = (fresh, n);
        inner.wakeups.bump_all();
    }
}

/// Sends a `sync` every quarter of the negotiated session timeout, and
/// moves the session's bound to the send time of each answered one plus
/// three quarters of that timeout. The leader expires a session it has not
/// heard of for the timeout; a `sync` is answered only through the leader,
/// so a server cut off from it (which still answers reads until it gives
/// up on the leader) confirms nothing. The server we talk to touched the
/// session when our request came in, but tells the leader only at its next
/// ping, up to half a tick later; the server holds the timeout to at least
/// two ticks, so a quarter of it covers that lag. (The client's own pings
/// would not do: they stop at the server we talk to, and the client does
/// not say when it last heard one.)
///
/// A sync goes out every period whether or not the last one has come
/// back: the server answers a session's requests in order, so a sync
/// queued behind a burst of this client's own requests must not hold up
/// the next one's confirmation (and every hold of the session with it).
async fn heartbeat(inner: &Inner, z: &zk::Client, number: u64) {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let timeout = z.session_timeout();
    let period = (timeout / 4).max(Duration::from_millis(50));
    let mut beats = FuturesUnordered::new();
    let mut next = Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {
                let sent = Instant::now();
                next = sent + period;
                beats.push(async move {
                    let answered = tokio::time::timeout(timeout, z.sync("/")).await;
                    (sent, matches!(answered, Ok(Ok(()))))
                });
            }
            Some((sent, answered)) = beats.next() => {
                if answered {
                    inner.clock.confirm(number, believed_until(sent, timeout - timeout / 4));
                }
            }
        }
    }
}

impl Inner {
    async fn dial(
        connect: &str,
        session_timeout: Duration,
        digest: &Option<String>,
        label: &str,
    ) -> Result<zk::Client> {
        let mut c = zk::Client::connector()
            .with_session_timeout(session_timeout)
            .with_connection_timeout(session_timeout.min(Duration::from_secs(5)));
        if let Some(d) = digest {
            c = c.with_auth("digest", d.as_bytes());
        }
        let attempt = tokio::time::timeout(session_timeout, c.connect(connect)).await;
        match attempt {
            Ok(r) => r.map_err(|e| map_err(label, e)),
            Err(_) => Err(Error::unavailable(format!(
                "ZooKeeper at {label} is unreachable: no session within {session_timeout:?}"
            ))),
        }
    }

    fn err(&self, e: zk::Error) -> Error {
        map_err(&self.label, e)
    }

    fn client(&self) -> zk::Client {
        unpoisoned(&self.zk).0.clone()
    }

    fn session(&self) -> u64 {
        unpoisoned(&self.zk).1
    }

    fn acls(&self) -> zk::Acls<'static> {
        if self.digest.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    fn path_of(name: &LockName) -> Result<String> {
        let n = name.as_str();
        if n.contains('/') || n.contains('\0') {
            return Err(Error::invalid(format!(
                "lock name {n:?} has a '/' or NUL: on ZooKeeper a lock is one node under \
                 the URL's path"
            )));
        }
        if n == "fenced.meta" || n == "zookeeper" {
            return Err(Error::invalid(format!(
                "lock name {n:?} is reserved on ZooKeeper"
            )));
        }
        Ok(format!("/{n}"))
    }

    fn own_node(&self, req: &Attempt) -> Arc<OwnNode> {
        let session = self.session();
        let mut nodes = unpoisoned(&self.nodes);
        if let Some(n) = nodes.get(&req.hold_id)
            && n.session == session
        {
            return n.clone();
        }
        let own = Arc::new(OwnNode {
            name: req.name.clone(),
            owner: req.owner_key.clone(),
            protect: format!("_c_{}-", uuid::Uuid::new_v4()),
            exclusive: req.mode == Mode::Exclusive,
            child: Mutex::new(None),
            czxid: Mutex::new(0),
            session,
            deadline: Mutex::new(None),
            watcher: Mutex::new(None),
            create_sent: AtomicBool::new(false),
            later_sibling: AtomicBool::new(false),
        });
        nodes.insert(req.hold_id.clone(), own.clone());
        own
    }

    /// The node of `own` among `dir`'s children by its protected id, if
    /// a create of it went through; adopted as `own`'s child.
    async fn find_protected(&self, z: &zk::Client, dir: &str, own: &OwnNode) -> Result<bool> {
        let children = match z.list_children(dir).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(self.err(e)),
        };
        let Some(c) = children.into_iter().find(|c| c.starts_with(&own.protect)) else {
            return Ok(false);
        };
        if let Some(stat) = z
            .check_stat(&format!("{dir}/{c}"))
            .await
            .map_err(|e| self.err(e))?
        {
            *unpoisoned(&own.czxid) = stat.czxid;
        }
        *unpoisoned(&own.child) = Some(c);
        Ok(true)
    }

    fn owner_of(&self, name: &LockName, child: &str) -> Option<String> {
        unpoisoned(&self.nodes)
            .values()
            .find(|o| o.name == *name && unpoisoned(&o.child).as_deref() == Some(child))
            .map(|o| o.owner.clone())
    }

    /// Creates the node of `own` and lists the lock's children in one round
    /// trip: the client sends both requests at once (it orders requests
    /// when their futures are made, not when polled), and ZooKeeper answers
    /// a session's requests in order, so the listing includes the new node.
    /// Curator's recipe waits for the create before it lists. The listing is
    /// `None` when the create needed another try (then list again).
    async fn create_and_list(
        &self,
        z: &zk::Client,
        dir: &str,
        own: &OwnNode,
        req: &Attempt,
    ) -> Result<Option<Vec<String>>> {
        let prefix = format!("{dir}/{}{}", own.protect, marker(req.mode, req.rw));
        let opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        own.create_sent.store(true, Ordering::Release);
        let created = z.create(&prefix, b"", &opts);
        let listed = z.list_children(dir);
        let (created, listed) = tokio::join!(created, listed);
        let first_went_through = created.is_ok();
        self.create(z, dir, &prefix, &opts, own, created).await?;
        Ok(listed.ok().filter(|_| first_went_through))
    }

    /// Creates the node of `own` as `prefix` (and the lock's container
    /// `dir` if missing), finding it again by its protected id if a reply
    /// was lost; `first` is the reply to the create already sent.
    async fn create(
        &self,
        z: &zk::Client,
        dir: &str,
        prefix: &str,
        opts: &zk::CreateOptions<'_>,
        own: &OwnNode,
        first: std::result::Result<(zk::Stat, zk::CreateSequence), zk::Error>,
    ) -> Result<()> {
        let mut first = Some(first);
        for _ in 0..10 {
            let created = match first.take() {
                Some(r) => r,
                None => z.create(prefix, b"", opts).await,
            };
            match created {
                Ok((stat, seq)) => {
                    let full = format!("{prefix}{seq}");
                    let child = full.rsplit('/').next().unwrap_or_default().to_owned();
                    *unpoisoned(&own.child) = Some(child);
                    *unpoisoned(&own.czxid) = stat.czxid;
                    return Ok(());
                }
                Err(zk::Error::NoNode) => {
                    let parent = zk::CreateMode::Container.with_acls(self.acls());
                    match z.create(dir, b"", &parent).await {
                        Ok(_) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(self.err(e)),
                    }
                }
                Err(zk::Error::ConnectionLoss) => {
                    // Did the create happen? Curator's protected mode: look
                    // for our id among the children.
                    if self.find_protected(z, dir, own).await.unwrap_or(false) {
                        return Ok(());
                    }
                }
                Err(e) => return Err(self.err(e)),
            }
        }
        Err(Error::unavailable(format!(
            "ZooKeeper at {}: could not create a lock node under {dir}",
            self.label
        )))
    }

    async fn attempt(self: &Arc<Self>, req: &Attempt) -> Result<Outcome> {
        let dir = Self::path_of(&req.name)?;
        let z = self.client();
        let own = self.own_node(req);
        // An earlier try's create may have gone through with its answer
        // lost (it timed out, or its future was dropped): adopt that node
        // rather than queue a second one behind it.
        if unpoisoned(&own.child).is_none() && own.create_sent.load(Ordering::Acquire) {
            self.find_protected(&z, &dir, &own).await?;
        }
        let listed = if unpoisoned(&own.child).is_none() {
            self.create_and_list(&z, &dir, &own, req).await?
        } else {
            None
        };
        let mine = unpoisoned(&own.child).clone().unwrap_or_default();
        let children = match listed {
            Some(c) => c,
            None => match z.list_children(&dir).await {
                Ok(c) => c,
                Err(zk::Error::NoNode) => Vec::new(),
                Err(e) => return Err(self.err(e)),
            },
        };
        let q = queue(children);
        let Some(me) = q.iter().position(|(c, _)| *c == mine) else {
            // Our node is gone (the session ended, or it was deleted):
            // never act on a queue we are not in.
            unpoisoned(&self.nodes).remove(&req.hold_id);
            return Ok(Outcome::Busy(Blocked {
                ticket: None,
                retry_after: Some(Duration::from_millis(1)),
            }));
        };
        let owners: Vec<Option<String>> =
            q.iter().map(|(c, _)| self.owner_of(&req.name, c)).collect();
        let view: Vec<(&[u8], Mode)> = q.iter().map(|(c, m)| (c.as_bytes(), *m)).collect();
        let wait = waits_for(&view, me, |i| {
            i != me && owners[i].as_deref() == Some(req.owner_key.as_str())
        });
        let token = *unpoisoned(&own.czxid);
        match wait {
            Wait::Granted => {
                if let Some(w) = unpoisoned(&own.watcher).take() {
                    w.abort();
                }
                self.mark_earlier_holds(&own, token);
                let (me, id) = (self.clone(), req.hold_id.clone());
                arm_lease_once(&own.deadline, req.lease, async move {
                    me.end_patiently(&id, super::queue::TRIES_WAITED_ON).await;
                });
                Ok(Outcome::Granted {
                    token: token as u64,
                    session: Some(self.clock.bound_of(own.session)),
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
                let wakeups = self.wakeups.clone();
                let name = req.name.clone();
                let task = match w {
                    Wait::Key(k) => {
                        let path = format!("{dir}/{}", String::from_utf8_lossy(&k));
                        match z.get_and_watch_data(&path).await {
                            Ok((_, _, watcher)) => tokio::spawn(async move {
                                watcher.changed().await;
                                wakeups.bump(name.as_str());
                            }),
                            // Gone already: look again at once.
                            Err(zk::Error::NoNode) => {
                                return Ok(Outcome::Busy(Blocked {
                                    ticket: Some(token),
                                    retry_after: Some(Duration::from_millis(1)),
                                }));
                            }
                            Err(e) => return Err(self.err(e)),
                        }
                    }
                    _ => match z.list_and_watch_children(&dir).await {
                        Ok((_, watcher)) => tokio::spawn(async move {
                            watcher.changed().await;
                            wakeups.bump(name.as_str());
                        }),
                        Err(e) => return Err(self.err(e)),
                    },
                };
                if let Some(old) = unpoisoned(&own.watcher).replace(task) {
                    old.abort();
                }
                Ok(Outcome::Busy(Blocked {
                    ticket: Some(token),
                    retry_after: None,
                }))
            }
        }
    }

    /// Exclusive holds of this client on `own`'s name granted before it
    /// (lower tokens) learn that a later hold exists, so their releases
    /// do not overwrite its token in the last-token record.
    fn mark_earlier_holds(&self, own: &OwnNode, token: i64) {
        for o in unpoisoned(&self.nodes).values() {
            if o.name == own.name
                && o.exclusive
                && unpoisoned(&o.deadline).is_some()
                && *unpoisoned(&o.czxid) < token
            {
                o.later_sibling.store(true, Ordering::Release);
            }
        }
    }

    /// Deletes the node of `hold_id` and forgets it; whether it was still
    /// there. On an error the node is kept, to try again.
    async fn end(&self, hold_id: &str) -> Result<bool> {
        let Some(own) = unpoisoned(&self.nodes).get(hold_id).cloned() else {
            return Ok(false);
        };
        // A create that went out without its answer (dropped, timed out,
        // failed oddly) may have made a node: find it by its protected id,
        // or it would head the queue, unnamed, until the session ends.
        if unpoisoned(&own.child).is_none()
            && own.create_sent.load(Ordering::Acquire)
            && own.session == self.session()
        {
            let dir = Self::path_of(&own.name)?;
            self.find_protected(&self.client(), &dir, &own).await?;
        }
        let child = unpoisoned(&own.child).clone();
        let granted = unpoisoned(&own.deadline).is_some();
        let mut was = false;
        if let Some(child) = child
            && own.session == self.session()
        {
            let path = format!("{}/{child}", Self::path_of(&own.name)?);
            let token = *unpoisoned(&own.czxid) as u64;
            let z = self.client();
            let mut recorded = false;
            if granted && own.exclusive && !own.later_sibling.load(Ordering::Acquire) {
                // Exclusive holders of a name release in token order (but
                // for a later hold of this client's own, marked above), so
                // one multi deletes the node and overwrites the record:
                // a release in one round trip. If either op fails (the
                // node is gone, the record is not there yet) nothing is
                // applied and the steps below run one by one.
                let tokens = format!("{TOKENS}/{}", own.name.as_str());
                let record = encode_register(token, b"");
                let mut w = z.new_multi_writer();
                if w.add_delete(&path, None).is_ok()
                    && w.add_set_data(&tokens, &record, None).is_ok()
                {
                    match w.commit().await {
                        Ok(_) => {
                            was = true;
                            recorded = true;
                        }
                        Err(zk::MultiWriteError::OperationFailed { .. }) => {}
                        // The request itself failed: it may have been
                        // applied (a lost reply), so a delete now finding
                        // no node would prove nothing. Let the caller try
                        // again.
                        Err(zk::MultiWriteError::RequestFailed { source }) => {
                            return Err(self.err(source));
                        }
                    }
                }
            }
            if !recorded {
                match z.delete(&path, None).await {
                    Ok(()) => was = true,
                    Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(self.err(e)),
                }
                if was
                    && granted
                    && let Err(e) = self.record_token(&own.name, token).await
                {
                    // The hold is released; only `status`'s last token lags.
                    tracing::warn!(lock = %own.name.as_str(), error = %e, "could not record the last token");
                }
            }
        }
        unpoisoned(&self.nodes).remove(hold_id);
        if let Some(d) = unpoisoned(&own.deadline).take() {
            d.send_replace(Instant::now());
        }
        self.wakeups.bump(own.name.as_str());
        Ok(was)
    }

    /// [`end`](Self::end), trying transient errors again for a while.
    async fn end_patiently(&self, hold_id: &str, tries: u32) {
        // A session that ends takes its nodes with it; a terminal session
        // error is not transient and stops the retries.
        super::queue::retry_transient(|| self.end(hold_id), tries, || true).await
    }

    /// Keeps the largest released token of `name`.
    async fn record_token(&self, name: &LockName, token: u64) -> Result<()> {
        self.meta_cas(TOKENS, name, |old| {
            let seen = old.map_or(0, |(_, f)| f);
            Ok((token > seen).then(|| (Vec::new(), token)))
        })
        .await
        .map(drop)
    }

    /// Reads `dir/N` as a register: value, fence, node version.
    async fn meta_get(&self, dir: &str, name: &LockName) -> Result<Option<(Vec<u8>, u64, i32)>> {
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
    async fn meta_cas<F>(&self, dir: &str, name: &LockName, decide: F) -> Result<bool>
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

impl LockBackend for ZkBackend {
    fn scheme(&self) -> &'static str {
        "zk"
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> BoxFuture<'a, Result<Outcome>> {
        Box::pin(self.inner.attempt(req))
    }

    fn renew<'a>(&'a self, refs: &'a [HoldRef]) -> BoxFuture<'a, Result<Vec<Renewal>>> {
        Box::pin(async move {
            let inner = &self.inner;
            let session = inner.session();
            let z = inner.client();
            let checks = refs.iter().map(|r| {
                let z = z.clone();
                async move {
                    let Some(own) = unpoisoned(&inner.nodes).get(&r.hold_id).cloned() else {
                        return Renewal::Gone;
                    };
                    let child = unpoisoned(&own.child).clone();
                    let (Some(child), true) = (child, own.session == session) else {
                        return Renewal::Gone;
                    };
                    let Ok(dir) = Inner::path_of(&own.name) else {
                        return Renewal::Gone;
                    };
                    // One hold's failed look says nothing of the others'.
                    let Ok(stat) = z.check_stat(&format!("{dir}/{child}")).await else {
                        return Renewal::Unknown;
                    };
                    let here = stat.is_some_and(|s| s.czxid == *unpoisoned(&own.czxid));
                    if here && let Some(d) = unpoisoned(&own.deadline).as_ref() {
                        d.send_replace(Instant::now() + r.lease);
                    }
                    Renewal::from(here)
                }
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

    fn ownership(&self, hold: &HoldRef) -> Option<crate::spi::Ownership> {
        let own = unpoisoned(&self.inner.nodes).get(&hold.hold_id).cloned()?;
        let child = unpoisoned(&own.child).clone()?;
        let dir = Inner::path_of(&own.name).ok()?;
        Some(crate::spi::Ownership {
            key: format!("{dir}/{child}").into_bytes(),
            revision: *unpoisoned(&own.czxid) as u64,
        })
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
            let dir = Inner::path_of(name)?;
            let z = inner.client();
            let children = match z.list_children(&dir).await {
                Ok(c) => c,
                Err(zk::Error::NoNode) => Vec::new(),
                Err(e) => return Err(inner.err(e)),
            };
            let q = queue(children);
            let owners: Vec<Option<String>> =
                q.iter().map(|(c, _)| inner.owner_of(name, c)).collect();
            let view: Vec<(&[u8], Mode)> = q.iter().map(|(c, m)| (c.as_bytes(), *m)).collect();
            let mut last_token = inner.meta_get(TOKENS, name).await?.map_or(0, |(_, f, _)| f);
            let mut holders = Vec::new();
            let mut waiters = 0;
            for ((i, (child, mode)), granted) in q.iter().enumerate().zip(grants(&view, &owners)) {
                if !granted {
                    waiters += 1;
                    continue;
                }
                let Some(stat) = z
                    .check_stat(&format!("{dir}/{child}"))
                    .await
                    .map_err(|e| inner.err(e))?
                else {
                    continue;
                };
                let token = stat.czxid as u64;
                last_token = last_token.max(token);
                let lease_left = unpoisoned(&inner.nodes)
                    .values()
                    .find(|o| unpoisoned(&o.child).as_deref() == Some(child.as_str()))
                    .and_then(|o| {
                        unpoisoned(&o.deadline)
                            .as_ref()
                            .map(|d| d.borrow().saturating_duration_since(Instant::now()))
                    })
                    .unwrap_or(inner.session_timeout);
                holders.push(HolderInfo {
                    owner: owners[i]
                        .clone()
                        .unwrap_or_else(|| format!("zk session {:x}", stat.ephemeral_owner)),
                    mode: *mode,
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
            let dir = Inner::path_of(name)?;
            let z = inner.client();
            let children = match z.list_children(&dir).await {
                Ok(c) => c,
                Err(zk::Error::NoNode) => return Ok(0),
                Err(e) => return Err(inner.err(e)),
            };
            let q = queue(children);
            let owners: Vec<Option<String>> =
                q.iter().map(|(c, _)| inner.owner_of(name, c)).collect();
            let view: Vec<(&[u8], Mode)> = q.iter().map(|(c, m)| (c.as_bytes(), *m)).collect();
            let mut dropped = 0;
            let mut top = 0;
            // The holders only: waiters keep their places.
            for ((child, _), granted) in q.iter().zip(grants(&view, &owners)) {
                if !granted {
                    continue;
                }
                let path = format!("{dir}/{child}");
                if let Ok(Some(stat)) = z.check_stat(&path).await {
                    top = top.max(stat.czxid as u64);
                }
                match z.delete(&path, None).await {
                    Ok(()) => dropped += 1,
                    Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(inner.err(e)),
                }
            }
            if top > 0 {
                inner.record_token(name, top).await?;
            }
            inner.wakeups.bump(name.as_str());
            Ok(dropped)
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.monitor.abort();
            let ids: Vec<String> = unpoisoned(&self.inner.nodes).keys().cloned().collect();
            for id in ids {
                let _ = self.inner.end(&id).await;
            }
        })
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
