//! # fenced: distributed locks that tell you when you lost them
//!
//! fenced gives services on many machines mutexes, read-write locks,
//! semaphores, MultiLocks and segmented locks over the engines they already
//! run, with a lease renewed by a watchdog, a **fencing token** on every
//! acquisition and a **lost signal** on every guard. Backends, each behind
//! a cargo feature: the embedded SQLite default (no server: every process
//! on the host shares the lock file), Redis (one server, Sentinel, Cluster,
//! RedLock), PostgreSQL and MySQL/MariaDB (a lease table, or session
//! advisory locks), etcd, ZooKeeper, and an in-process `memory://`.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::time::Duration;
//! # let dir = tempfile_dir();
//! # let url = format!("sqlite://{}/locks.db", dir);
//! let client = fenced::Client::connect(&url).await?;  // e.g. sqlite:///var/lib/app/locks.db
//! let lock = client.mutex("cron:send-invoices")?;
//! match lock.acquire_timeout(Duration::from_secs(1)).await? {
//!     Some(guard) => {
//!         // Pass the token to whatever you write, so a stale holder is refused:
//!         let ledger = client.register("invoices:last-run")?;
//!         ledger.write(&guard, b"2026-11-22").await?;
//!         tokio::select! {
//!             _ = async { /* the job */ } => {}
//!             reason = guard.lost() => eprintln!("lost the lock: {reason}; stopping"),
//!         }
//!         guard.release().await?;
//!     }
//!     None => println!("another instance is sending invoices"),
//! }
//! # Ok::<_, fenced::Error>(()) }).unwrap();
//! # fn tempfile_dir() -> String {
//! #     let d = std::env::temp_dir().join(format!("fenced-doc-{}", std::process::id()));
//! #     std::fs::create_dir_all(&d).unwrap();
//! #     d.display().to_string()
//! # }
//! ```
//!
//! ## Backends
//!
//! [`Client::connect`] takes a URL; its scheme picks the backend from one
//! table, [`backends()`], which says for each its schemes, cargo feature,
//! default port and what it can do:
//!
//! ```
//! for b in fenced::backends() {
//!     println!("{:<16} {:<40} built: {}", b.name, b.example, b.is_built());
//! }
//! assert!(fenced::backend_for_scheme("memory").unwrap().is_built());
//! ```
//!
//! | URL | backend | feature |
//! |---|---|---|
//! | `sqlite:///path/locks.db` | a lease table in one SQLite file, for every process on one host | `sqlite` (default) |
//! | `memory://[NAMESPACE]` | this process only | always |
//! | `redis://`, `rediss://` | one Redis server | `redis` (`rediss` with `tls`) |
//! | `redis+sentinel://h1,h2/SERVICE` | the master a group of Sentinels names | `redis` |
//! | `redis+cluster://h1,h2,h3` | Redis Cluster | `redis` |
//! | `redlock://h1,h2,h3` | RedLock over independent masters | `redis` |
//! | `postgres://user@host/db[?mode=advisory]` | a lease table, or session advisory locks | `postgres` |
//! | `mysql://…`, `mariadb://…[?mode=advisory]` | a lease table, or `GET_LOCK` | `mysql` |
//! | `etcd://h1,h2,h3`, `etcds://…` | etcd v3, `concurrency.Mutex`'s layout | `etcd` (`etcds` with `tls`) |
//! | `zk://h1,h2,h3[/chroot]` | ZooKeeper, Curator's layouts | `zookeeper` |
//!
//! **TLS** (feature `tls`, rustls): `rediss://` and `etcds://` check the
//! server's certificate and name against the webpki roots, or against the
//! CA in `ca=/path/ca.pem`; PostgreSQL URLs take `sslmode=` (up to
//! `verify-full`) and `sslrootcert=`, MySQL URLs `ssl-mode=` (up to
//! `VERIFY_IDENTITY`) and `ssl-ca=`, as their own clients do.
//!
//! ## The contract, on every backend
//!
//! - **Lease**: every hold has one; by default 30 s renewed every 10 s by
//!   one watchdog task per client, or a fixed lease with no renewal.
//! - **Fencing token**: strictly greater than every token issued before for
//!   the same name on that backend.
//! - **Lost signal**: [`Guard::is_held`] answers without a round trip and
//!   turns false the moment the lease confirmed by the backend has run out
//!   on the local clock; [`Guard::lost`] resolves then, or when a renewal
//!   finds the hold gone.
//! - **Every acquisition is its own owner**: tasks sharing a client
//!   exclude each other; reentrancy is opt-in, per [`Owner`].
//! - **A hold on a session** (etcd, ZooKeeper, advisory locks) is believed
//!   no longer than the session's last confirmed keep-alive plus its
//!   timeout, so a cut-off holder is told before the server can give the
//!   lock away.
//! - **Owner-only release**, **blocking, try and timed acquisition**,
//!   **fair mode**, **cancellation safety**, and **no call that waits on a
//!   silent server** past the request timeout (`timeout=` in every URL).
//! - **Blocking API**: [`blocking`] wraps the client for callers without
//!   an async runtime.
//! - **Errors** have a [`kind`](Error::kind); bad input is refused before any I/O.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod barrier;
pub mod blocking;
mod client;
pub(crate) mod core;
mod counter;
mod doctor;
mod election;
mod error;
mod fence;
mod guard;
mod holder;
mod lock;
mod multi;
mod mutex;
mod name;
mod options;
mod owner;
mod queue;
mod rate;
mod semaphore;
#[cfg(test)]
mod sim;
pub(crate) mod spi;
mod striped;
mod url;
mod versioned;

pub use crate::spi::types::{HolderInfo, LockStatus, Mode, Ownership};

/// Metrics: what fenced reports through the [`metrics`](https://docs.rs/metrics)
/// facade (feature `metrics`, on by default), and counters for benchmarks.
///
/// Install any recorder (`metrics-exporter-prometheus`, as in the
/// `prometheus` example, or another) and fenced reports:
///
/// | name | kind | labels | what |
/// |---|---|---|---|
/// | `fenced_acquire_wait_seconds` | histogram | `backend`, `outcome` (`granted`, `busy`, `error`) | from an acquisition's call to its result |
/// | `fenced_hold_seconds` | histogram | `backend`, `end` (`released`, `lost`) | from a grant to its release (or drop) or its lost signal |
/// | `fenced_lost_total` | counter | `backend`, `reason` (`expired`, `taken`, `session_expired`, `closed`) | lost signals |
/// | `fenced_renewals_total` | counter | `backend`, `result` (`renewed`, `gone`, `late`, `unknown`) | one per hold per renewal |
/// | `fenced_renewal_margin_seconds` | histogram | `backend` | the lease a hold had left when its renewal was confirmed: renewal lag seen from the other side; near zero, holds are about to be lost |
/// | `fenced_requests_total` | counter | `backend`, `op`, `result` (`ok`, `error`) | calls to the server: `attempt`, `renew`, `release`, `abandon`, `status`, `force_release`, `register_read`, `register_write`, … |
/// | `fenced_request_seconds` | histogram | `backend`, `op` | their round trips |
///
/// `backend` is the URL's scheme (`redis`, `postgres`, …); lock names are
/// never labels. Without a recorder, a report builds its labels (a few
/// small allocations per acquisition) and records nothing; build without
/// the feature to drop even that.
///
/// Tracing: each hold has a span at DEBUG level, `hold` (fields `lock`,
/// `token`, `mode`, `backend`), from its grant to its release or loss; its
/// renewals and its lost signal are events in it.
pub mod metrics {
    /// Requests this process has sent to Redis servers on command
    /// connections, all clients together (a pipeline or a script call is
    /// one round trip; pub/sub traffic is not counted). 0 without the
    /// `redis` feature.
    ///
    /// ```
    /// let before = fenced::metrics::redis_round_trips();
    /// // ... lock and unlock on a redis:// client ...
    /// assert!(fenced::metrics::redis_round_trips() >= before);
    /// ```
    pub fn redis_round_trips() -> u64 {
        #[cfg(feature = "redis")]
        return crate::backend::redis::ROUND_TRIPS.load(std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(feature = "redis"))]
        0
    }
}
pub use crate::backend::table::{BackendInfo, Capabilities, backend_for_scheme, backends};
pub use crate::barrier::{Barrier, CountDownLatch, DoubleBarrier, MAX_MEMBERS, Member};
pub use crate::client::{BACKEND_ENV, Client, LIST_CONCURRENCY, LIST_TIMEOUT, LockEntry};
pub use crate::core::hold::LostReason;
pub use crate::core::retry::{MAX_RETRY_PAUSE, MIN_RETRY_PAUSE, RetryPolicy};
pub use crate::counter::{COUNTER_WAIT, Counter, CounterWatch, Sequence};
pub use crate::doctor::{Check, Verdict};
pub use crate::election::{Election, Leader, LeaderWatch, Leadership, Participants};
pub use crate::error::{Error, ErrorKind, Result};
pub use crate::fence::FencedRegister;
pub use crate::guard::Guard;
pub use crate::holder::{Holder, MAX_COMMAND_LEN};
pub use crate::lock::{Lock, RwLock};
pub use crate::multi::{MultiGuard, MultiLock};
pub use crate::mutex::Mutex;
pub use crate::name::{LockName, MAX_NAME_LEN};
pub use crate::options::{DEFAULT_LEASE, Lease, LockOptions, MAX_LEASE, MAX_PERMITS, MIN_LEASE};
pub use crate::owner::{MAX_OWNER_LEN, Owner};
pub use crate::queue::{Item, MAX_ITEM_LEN, MAX_TAKERS, Queue};
pub use crate::rate::{MAX_BURST, RateDecision, RateLimiter};
pub use crate::semaphore::Semaphore;
pub use crate::striped::{MAX_SEGMENTS, StripedLock};
pub use crate::url::default_sqlite_path;
pub use crate::versioned::{Versioned, VersionedValue};

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
