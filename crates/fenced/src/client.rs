//! The client: one connection to one backend, shared by every lock made
//! from it. Cheap to clone.

use crate::core::engine::Engine;
use crate::core::hold::HoldTable;
use crate::core::watchdog::Watchdog;
use crate::core::worker::{self, Job};
use crate::error::{Error, Result};
use crate::fence::FencedRegister;
use crate::lock::{Lock, RwLock};
use crate::name::LockName;
use crate::options::MAX_PERMITS;
use crate::spi::wake::Wakeups;
use crate::spi::{Backend, LockStatus, Mode};
use crate::striped::StripedLock;
use std::fmt;
use std::sync::Arc;
use tokio::sync::oneshot;

/// The environment variable [`Client::from_env`] reads.
pub const BACKEND_ENV: &str = "FENCED_BACKEND";

/// A connection to one lock backend.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use fenced::Client;
/// let client = Client::connect("memory://").await?;
/// let orders = client.mutex("orders:1001")?;
/// let guard = orders.acquire().await?;
/// assert!(guard.is_held());
/// assert!(guard.release().await?);
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Engine>,
}

/// How long [`Client::list`] may take to find the names: a scan of every
/// key of a large Redis or etcd is many requests.
pub const LIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How many statuses [`Client::list`] asks at a time.
pub const LIST_CONCURRENCY: usize = 32;

/// A lock that [`Client::list`] found held or waited for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockEntry {
    /// The lock's name.
    pub name: String,
    /// Its holders, waiters and last token.
    pub status: LockStatus,
}

impl Client {
    /// Connects to the backend named by `url`:
    ///
    /// | URL | backend |
    /// |---|---|
    /// | `sqlite:///path/to/locks.db` | a lease table in a local SQLite file, shared by every process on the host (feature `sqlite`, on by default) |
    /// | `memory://` or `memory://NAMESPACE` | this process only; clients with the same namespace share locks |
    /// | `redis://host:6379[/db]`, `rediss://…` | one Redis server (feature `redis`; `rediss` with `tls`) |
    /// | `redis+sentinel://h1,h2,h3/SERVICE[/db]` | the master a group of Sentinels names (feature `redis`) |
    /// | `redis+cluster://h1,h2,h3` | Redis Cluster (feature `redis`) |
    /// | `redlock://h1,h2,h3` | RedLock over independent masters (feature `redis`) |
    /// | `postgres://user@host/db[?mode=advisory]` | a lease table, or session advisory locks (feature `postgres`) |
    /// | `mysql://user@host/db[?mode=advisory]`, `mariadb://…` | a lease table, or `GET_LOCK` (feature `mysql`) |
    /// | `etcd://h1,h2,h3`, `etcds://…` | etcd v3, `concurrency.Mutex`'s layout (feature `etcd`; `etcds` with `tls`) |
    /// | `zk://h1,h2,h3[/chroot]` | ZooKeeper, Curator's layouts (feature `zookeeper`) |
    ///
    /// Every URL takes `timeout=` (5 s by default): how long one request
    /// may take before it counts as failed.
    ///
    /// With the feature `tls`, `rediss://` and `etcds://` check the
    /// server's certificate and name against the webpki roots, or against
    /// the CA in `ca=/path/ca.pem`; PostgreSQL URLs take `sslmode=` (up to
    /// `verify-full`) and `sslrootcert=`, MySQL URLs `ssl-mode=` (up to
    /// `VERIFY_IDENTITY`) and `ssl-ca=`. A server whose certificate the
    /// client does not trust is refused at connect, with the reason.
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a URL fenced
    /// cannot parse or a backend not built in;
    /// [`Unavailable`](crate::ErrorKind::Unavailable) when the backend
    /// cannot be reached or opened.
    pub async fn connect(url: &str) -> Result<Client> {
        let wakeups = Arc::new(Wakeups::default());
        let backend = crate::url::open(url, wakeups.clone()).await?;
        Ok(Client::with_backend(
            backend,
            wakeups,
            crate::spi::endpoints::redact(url),
        ))
    }

    /// Connects to the URL in `FENCED_BACKEND`, or else to the host's SQLite
    /// file at [`default_sqlite_path`](crate::default_sqlite_path), which
    /// every user's processes on the host share (its directory is made if
    /// missing).
    pub async fn from_env() -> Result<Client> {
        match std::env::var(BACKEND_ENV) {
            Ok(url) if !url.trim().is_empty() => Client::connect(url.trim()).await,
            _ => Client::connect(&crate::url::default_url()?).await,
        }
    }

    pub(crate) fn with_backend(
        backend: Arc<dyn Backend>,
        wakeups: Arc<Wakeups>,
        url: String,
    ) -> Client {
        let calls = Arc::new(tokio::sync::Semaphore::new(worker::MAX_CALLS));
        let worker = worker::spawn(backend.clone(), calls.clone());
        Client {
            inner: Arc::new(Engine {
                id: uuid::Uuid::new_v4().simple().to_string(),
                url,
                identity: backend.identity(),
                whoami: Default::default(),
                watchdog: Watchdog::new(backend.clone()),
                backend,
                wakeups,
                holds: HoldTable::default(),
                worker,
                calls,
                memos: Default::default(),
            }),
        }
    }

    /// Sets the command that this client's holds record from now on (shown
    /// by `fenced status`, `list` and `top` beside the host and process
    /// id): a name for the job, say. It starts as the program's name (not
    /// its arguments, which may carry secrets: the record is readable by
    /// whoever can read the locks); `fenced run` sets the command it runs.
    /// Cut to [`MAX_COMMAND_LEN`](crate::MAX_COMMAND_LEN) bytes, on one
    /// line.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let client = fenced::Client::connect("memory://").await?;
    /// client.set_command("invoice-batch 2026-11");
    /// # Ok::<_, fenced::Error>(()) }).unwrap();
    /// ```
    pub fn set_command(&self, command: &str) {
        self.inner.whoami.set_command(command);
    }

    /// This client's id: the first half of every `<client id>:<owner id>`
    /// it records in the backend.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The backend URL, with any password replaced by `***`.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// How long one request to the backend may take before it counts as
    /// failed: the URL's `timeout=`, 5 s by default (SQLite waits as long
    /// on a locked database file).
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let client = fenced::Client::connect("memory://").await?;
    /// assert_eq!(client.request_timeout(), std::time::Duration::from_secs(5));
    /// # Ok::<_, fenced::Error>(()) }).unwrap();
    /// ```
    pub fn request_timeout(&self) -> std::time::Duration {
        self.inner.backend.request_timeout()
    }

    /// A mutex: one holder at a time. Every acquisition is its own owner,
    /// so tasks that share this client exclude each other; name an
    /// [`Owner`](crate::Owner) for reentrancy.
    pub fn mutex(&self, name: &str) -> Result<crate::Mutex> {
        Ok(crate::Mutex::new(Lock::new(
            self.clone(),
            LockName::new(name)?,
            Mode::Exclusive,
        )))
    }

    /// A read-write lock: many readers or one writer.
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        Ok(RwLock::new(self.clone(), LockName::new(name)?))
    }

    /// A counting semaphore with `permits` permits; each acquisition takes
    /// one (see [`Semaphore::permits`](crate::Semaphore::permits) for
    /// more), and permits of a holder that dies come back when its lease
    /// runs out.
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<crate::Semaphore> {
        if permits == 0 || permits > MAX_PERMITS {
            return Err(Error::invalid(format!(
                "semaphore {name:?} needs 1 to {MAX_PERMITS} permits, not {permits}"
            )));
        }
        let mode = Mode::Permits {
            take: 1,
            max: permits,
        };
        Ok(crate::Semaphore::new(Lock::new(
            self.clone(),
            LockName::new(name)?,
            mode,
        )))
    }

    /// A fenced register: a value that accepts writes only with a fencing
    /// token at least as high as any it has seen.
    pub fn register(&self, name: &str) -> Result<FencedRegister> {
        Ok(FencedRegister::new(self.clone(), LockName::new(name)?))
    }

    /// A value changed by versioned compare-and-set (optimistic
    /// concurrency, see [`VersionedValue`](crate::VersionedValue)).
    pub fn versioned(&self, name: &str) -> Result<crate::VersionedValue> {
        Ok(crate::VersionedValue::new(
            self.clone(),
            LockName::new(name)?,
        ))
    }

    /// A shared 64-bit counter (see [`Counter`](crate::Counter)).
    pub fn counter(&self, name: &str) -> Result<crate::Counter> {
        crate::Counter::new(self, name)
    }

    /// Unique, increasing IDs (see [`Sequence`](crate::Sequence)).
    pub fn sequence(&self, name: &str) -> Result<crate::Sequence> {
        crate::Sequence::new(self, name)
    }

    /// A barrier that holds waiters back while set (see
    /// [`Barrier`](crate::Barrier)).
    pub fn barrier(&self, name: &str) -> Result<crate::Barrier> {
        crate::Barrier::new(self, name)
    }

    /// A double barrier for `members` processes (see
    /// [`DoubleBarrier`](crate::DoubleBarrier)).
    pub fn double_barrier(&self, name: &str, members: u32) -> Result<crate::DoubleBarrier> {
        crate::DoubleBarrier::new(self, name, members)
    }

    /// A count-down latch (see [`CountDownLatch`](crate::CountDownLatch)).
    pub fn latch(&self, name: &str) -> Result<crate::CountDownLatch> {
        crate::CountDownLatch::new(self, name)
    }

    /// A rate limiter of `rate` permits a second and bursts of up to
    /// `burst`, by the server's clock (see [`RateLimiter`](crate::RateLimiter)).
    pub fn rate_limiter(&self, name: &str, rate: f64, burst: u32) -> Result<crate::RateLimiter> {
        crate::RateLimiter::new(self, name, rate, burst)
    }

    /// A leased work queue (see [`Queue`](crate::Queue)).
    pub fn queue(&self, name: &str) -> Result<crate::Queue> {
        crate::Queue::new(self, name)
    }

    /// A leader election on `name` (see [`Election`](crate::Election)).
    pub fn election(&self, name: &str) -> Result<crate::Election> {
        crate::Election::new(self, name)
    }

    /// `segments` mutexes over one hot resource (see [`StripedLock`]).
    pub fn striped(&self, name: &str, segments: u32) -> Result<StripedLock> {
        StripedLock::new(self.clone(), name, segments)
    }

    /// What the backend knows of the lock `name`: holders, waiters, last token.
    pub async fn status(&self, name: &str) -> Result<LockStatus> {
        let name = LockName::new(name)?;
        self.inner.read("status", |b| b.status(&name)).await
    }

    /// Every lock whose name starts with `prefix` (`""`: every lock) that
    /// is held or waited for now, in name order, with what
    /// [`status`](Self::status) says of it: what `fenced list` prints.
    ///
    /// Each backend finds the names where it keeps them (a lease table's
    /// rows, the keys or nodes of a lock's layout); the advisory modes,
    /// whose servers show no names, find those whose tokens fenced
    /// recorded. A lock taken by a foreign client (Curator, `etcdctl
    /// lock`, redis-py, Redisson) shows where its layout is fenced's own:
    /// on ZooKeeper, etcd and the SQL lease tables, not on Redis.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let client = fenced::Client::connect("memory://").await?;
    /// let g = client.mutex("orders:1001")?.acquire().await?;
    /// let held = client.list("orders:").await?;
    /// assert_eq!(held.len(), 1);
    /// assert_eq!(held[0].name, "orders:1001");
    /// assert_eq!(held[0].status.holders[0].token, g.fencing_token());
    /// # Ok::<_, fenced::Error>(()) }).unwrap();
    /// ```
    ///
    /// The names are found within [`LIST_TIMEOUT`] (a scan may take many
    /// requests, each within the request timeout), and their statuses
    /// asked [`LIST_CONCURRENCY`] at a time; any error fails the list (a
    /// user allowed to scan but not to run fenced's scripts is told so,
    /// not shown an empty list).
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockEntry>> {
        let mut names = self
            .inner
            .read_within(LIST_TIMEOUT, "names", |b| b.names(prefix))
            .await?;
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        let mut asked = tokio::task::JoinSet::new();
        let mut out = Vec::new();
        let mut names = names.into_iter().enumerate();
        loop {
            while asked.len() < LIST_CONCURRENCY {
                let Some((i, name)) = names.next() else { break };
                let inner = self.inner.clone();
                asked.spawn(async move {
                    let status = inner.read("status", |b| b.status(&name)).await;
                    (i, name, status)
                });
            }
            let Some(done) = asked.join_next().await else {
                break;
            };
            let (i, name, status) = match done {
                Ok(done) => done,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => return Err(Error::unavailable(format!("a status call ended: {e}"))),
            };
            match status {
                Ok(status) if !status.is_free() || status.waiters > 0 => out.push((
                    i,
                    LockEntry {
                        name: name.as_str().to_owned(),
                        status,
                    },
                )),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_unstable_by_key(|(i, _)| *i);
        Ok(out.into_iter().map(|(_, e)| e).collect())
    }

    /// Checks the settings of the server (or, for SQLite, the host) that
    /// fenced's guarantees rest on: persistence and eviction on Redis,
    /// commit durability on PostgreSQL and MariaDB, the file system under
    /// SQLite's file, the size of an etcd or ZooKeeper ensemble, and the
    /// clock's offset; one [`Check`](crate::Check) each, with a
    /// [`Verdict`](crate::Verdict). `fenced doctor` prints them and fails
    /// on a [`Verdict::Fail`](crate::Verdict::Fail).
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let client = fenced::Client::connect("memory://").await?;
    /// for c in client.doctor().await? {
    ///     println!("{} {}: {}", c.verdict, c.name, c.detail);
    /// }
    /// # Ok::<_, fenced::Error>(()) }).unwrap();
    /// ```
    pub async fn doctor(&self) -> Result<Vec<crate::Check>> {
        let b = &self.inner.backend;
        // A handful of reads, each bounded by the backend.
        let limit = b.request_timeout() * 3;
        crate::core::acquire::bounded(limit, b.scheme(), "doctor", b.doctor()).await
    }

    /// Gives back every lock this client holds and lets go of the
    /// backend's connections. Guards still alive are told first: their
    /// lost signal fires with [`LostReason::Closed`](crate::LostReason),
    /// before their locks go, so no holder works on after another client
    /// may have been granted its lock. Release or drop guards first to
    /// end holds in order; then `close` waits for those releases.
    ///
    /// Bounded in time whatever the backend does: the releases get a
    /// request timeout (the URL's `timeout=`, 5 s by default) to finish,
    /// closing the connections one more; what is left then is left to the
    /// leases.
    pub async fn close(&self) {
        let limit = self.inner.backend.request_timeout();
        self.inner.holds.lose_all(crate::LostReason::Closed);
        // Its task would keep the backend (and its connections) until the
        // next renewal was due.
        self.inner.watchdog.wake();
        let (tx, rx) = oneshot::channel();
        if self.inner.worker.send(Job::Flush(tx)).is_ok()
            && tokio::time::timeout(limit, rx).await.is_err()
        {
            tracing::warn!("releases still pending at close; their leases will free the locks");
        }
        if tokio::time::timeout(limit, self.inner.backend.close())
            .await
            .is_err()
        {
            tracing::warn!("the backend's connections did not close in time");
        }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.inner.url)
            .field("id", &self.inner.id)
            .finish()
    }
}
