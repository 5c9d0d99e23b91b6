//! `sqlite:///path/to/locks.db`: the embedded default.
//!
//! A lease table in one SQLite file (WAL mode), shared by every process on
//! the host that opens the same path. No server to run. In a directory
//! every user may write (the host's default, `/run/lock/fenced`), the file
//! is made writable by every user, so all users' processes share it.
//!
//! # Layout
//!
//! [`SCHEMA`] below: `fenced_holds` has one row per grant (a mutex or write
//! hold, a read hold, or a semaphore's permits) with its owner
//! `<client id>:<owner id>`, mode, token and expiry; `fenced_tokens` keeps
//! the last fencing token of every name, after release too, so tokens only
//! rise (a name free for a day is forgotten, and the row `''` keeps the
//! highest token forgotten, which every grant exceeds); `fenced_waiters` holds blocked acquirers (the FIFO queue in fair
//! mode, and where to wake them); `fenced_registers` holds fenced registers.
//!
//! Every grant is decided inside one `BEGIN IMMEDIATE` transaction (SQLite
//! serialises writers, so two acquirers can never both win) by the same
//! rule as every other backend ([`grantable`]).
//!
//! # Waking waiters without polling
//!
//! Each client binds a Unix datagram socket (in Linux's abstract namespace:
//! no file to clean up; elsewhere a file in the temporary directory). A blocked acquirer records that address in
//! `fenced_waiters` in the same transaction that found the lock busy; a
//! release (or an expiry noticed by anyone) sends the lock name to the
//! oldest waiting address after it commits. A crashed holder sends nothing, so a
//! waiter also re-checks when the holder's lease runs out, and at least
//! every couple of seconds. Only the oldest waiter is woken per change (see
//! `wake_waiters`), so a release costs one re-attempt, not one per waiting process.
//!
//! # Guarantee and known holes
//!
//! Exact exclusion among processes on this host. Lease expiry is by the
//! host's wall clock (all processes share it); a clock stepped forward by
//! more than a lease can free a lock early, and the local lost signal, on
//! the monotonic clock, does not see that. Fencing tokens are persisted in
//! the file and never fall below the wall clock in microseconds.

use crate::backend::sql::{hold_row, ms};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::grant::{Decision, decide, next_token, stands};
use crate::spi::lease::QUEUE_TTL;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, Blocked, BoxFuture, DEFAULT_TIMEOUT, HoldRef, LockBackend, LockStatus,
    Outcome, RegisterValue, RegisterWrite, Renewal, Reply, Store, Ticket, Withdrawal,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Row, SqliteConnection};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod attempt;
mod holds;
mod queries;
mod store;
use queries::*;

pub(crate) struct SqliteBackend {
    pool: SqlitePool,
    path: PathBuf,
    wakeups: Arc<Wakeups>,
    wake: Arc<wake::Endpoint>,
    /// When this process last refreshed its watcher row of each
    /// register key (see `Store::watch_register`).
    watching: crate::backend::sql::Watching,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl SqliteBackend {
    pub(crate) async fn open(path: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
        let path = path.split('?').next().unwrap_or_default();
        if path.is_empty() {
            return Err(Error::invalid(
                "sqlite URL has no file path; write sqlite:///absolute/path/locks.db",
            ));
        }
        let path = PathBuf::from(path);
        let shared = open_to_all_users(&path);
        if shared {
            precreate_for_all_users(&path)?;
        }
        let opts = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            // The WAL kept small: checkpointed every 256 pages (1 MB, not
            // SQLite's 4 MB) and cut back to 1 MB after, since the host's
            // lock directory is a 5 MB tmpfs on Debian and Ubuntu.
            .pragma("wal_autocheckpoint", "256")
            .pragma("journal_size_limit", "1048576")
            // No longer than a request may take: a writer that holds the
            // file longer makes the attempt fail (and retry while the
            // caller's deadline allows) rather than wait on.
            .busy_timeout(DEFAULT_TIMEOUT);
        let cannot = |e: sqlx::Error| {
            let hint = if shared {
                "; this is the host's lock file, for every user: it, its -wal and -shm files \
                 and its directory must be writable by all (remove the directory to have it \
                 made again)"
            } else {
                ""
            };
            Error::unavailable(format!(
                "cannot open the SQLite lock file {}: {e}{hint}",
                path.display()
            ))
            .with_source(e)
        };
        // Switching a new file into WAL mode takes an exclusive lock that
        // SQLite's busy timeout does not wait for (see sqlx's notes on
        // `journal_mode`), so processes that open a fresh file together can
        // be told "database is locked": retry that, briefly, with backoff.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut pause = Duration::from_millis(5);
        let pool = loop {
            match open_pool(opts.clone()).await {
                Ok(pool) => break pool,
                Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(crate::spi::lease::jitter(pause)).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(e) => return Err(cannot(e)),
            }
        };
        // Still the regular file it was before SQLite opened it: a link
        // swapped in meanwhile would have been followed.
        if shared && !std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file()) {
            pool.close().await;
            return Err(not_a_file(&path));
        }
        let wake = Arc::new(wake::Endpoint::bind(wakeups.clone())?);
        Ok(Arc::new(SqliteBackend {
            pool,
            path,
            wakeups,
            wake,
            watching: Default::default(),
        }))
    }
}

/// Whether the file is in the host's lock directory (that of
/// [`default_sqlite_path`](crate::default_sqlite_path)), where every user's
/// processes share it. A file elsewhere, even in a directory every user may
/// write such as `/tmp`, is made as any other file is.
fn open_to_all_users(path: &Path) -> bool {
    let host = crate::url::default_sqlite_path();
    path.parent().is_some_and(|d| Some(d) == host.parent())
}

/// Makes the lock file, where missing, readable and writable by every user,
/// so that one user's processes can take a lock that another user's hold;
/// SQLite gives its `-wal` and `-shm` files the same mode. The file is made
/// under a name of its own, given its mode, and only then linked into
/// place, so no user ever sees it with the umask's narrower mode. What is
/// at the path must be a regular file: SQLite resolves a link in the
/// database's own path before it opens it, so a link planted there by
/// another user would redirect this user's writes.
fn precreate_for_all_users(path: &Path) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |what: &str, e: std::io::Error| {
        Error::unavailable(format!(
            "cannot {what} the SQLite lock file {}: {e}",
            path.display()
        ))
        .with_source(e)
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => return Ok(()),
        Ok(_) => return Err(not_a_file(path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail("inspect", e)),
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let draft = dir.join(format!(
        ".{}.{}.{}",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("locks.db"),
        std::process::id(),
        fastrand::u64(..)
    ));
    // `create_new` is O_EXCL: it follows no link and touches no file.
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .open(&draft)
        .and_then(|f| f.set_permissions(std::fs::Permissions::from_mode(0o666)));
    if let Err(e) = made {
        let _ = std::fs::remove_file(&draft);
        return Err(fail("make", e));
    }
    // link(2) never replaces: whoever links first made the file.
    let linked = std::fs::hard_link(&draft, path);
    let _ = std::fs::remove_file(&draft);
    match linked {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_file() => Ok(()),
                _ => Err(not_a_file(path)),
            }
        }
        Err(e) => Err(fail("make", e)),
    }
}

fn not_a_file(path: &Path) -> Error {
    Error::unavailable(format!(
        "{} is not a regular file (a link, or something else): fenced will not open it as \
         the host's lock file; remove it to have it made again",
        path.display()
    ))
}

async fn open_pool(opts: SqliteConnectOptions) -> Result<SqlitePool, sqlx::Error> {
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .min_connections(1)
        // SQLite ends a transaction by itself when a write fails for a
        // full disk or an I/O error; sqlx's ROLLBACK then fails, its count
        // of open transactions stays above zero, and every later BEGIN on
        // that connection fails ("non-zero transaction depth"): one full
        // disk poisoned the pool for good. A connection still in a
        // transaction once its queued rollback has run (the ping waits for
        // it) is closed, not pooled again.
        .after_release(|conn, _| {
            Box::pin(async move {
                use sqlx::Connection;
                // The common case costs nothing: no transaction counted.
                if !conn.is_in_transaction() {
                    return Ok(true);
                }
                conn.ping().await?;
                Ok(!conn.is_in_transaction())
            })
        })
        .connect_with(opts)
        .await?;
    sqlx::raw_sql(SCHEMA).execute(&pool).await?;
    // A file an older fenced made: one process adds the column, in a
    // transaction that the others wait behind; older binaries name their
    // columns and leave it empty.
    let has: bool = sqlx::query_scalar(HAS_HOLDER).fetch_one(&pool).await?;
    if !has {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        let has: bool = sqlx::query_scalar(HAS_HOLDER).fetch_one(&mut *tx).await?;
        if !has {
            sqlx::query(ADD_HOLDER).execute(&mut *tx).await?;
        }
        tx.commit().await?;
    }
    // Best effort: a file another process holds busy is pruned next time.
    let _ = forget_old_tokens(&pool, 10_000).await;
    Ok(pool)
}

/// SQLITE_BUSY or SQLITE_LOCKED, with any extended code.
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}

/// The first column of an optional row.
fn scalar<T>(row: Option<sqlx::sqlite::SqliteRow>) -> Result<Option<T>>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.map(|r| r.try_get(0)).transpose().map_err(db)
}

fn q(
    sql: &'static str,
) -> sqlx::query::Query<'static, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    sqlx::query(sql)
}

/// Maps a driver error: a busy or locked database and I/O trouble are
/// transient; a row that does not decode is a protocol error.
/// How long a free name's last token is kept: a day (see
/// [`FORGET_OLD_TOKENS`](queries::FORGET_OLD_TOKENS)).
const TOKEN_MEMORY: Duration = Duration::from_secs(24 * 3600);

/// Forgets up to `most` tokens of names free for [`TOKEN_MEMORY`], the
/// floor raised first in the same transaction.
async fn forget_old_tokens(pool: &SqlitePool, most: i64) -> Result<(), sqlx::Error> {
    let cutoff = SystemTime::now()
        .checked_sub(TOKEN_MEMORY)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_micros() as i64);
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query(queries::RAISE_FLOOR)
        .bind(cutoff)
        .execute(&mut *tx)
        .await?;
    sqlx::query(queries::FORGET_OLD_TOKENS)
        .bind(cutoff)
        .bind(most)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// Maps a database error to fenced's kinds.
fn db(e: sqlx::Error) -> Error {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::TypeNotFound { .. } => {
            Error::protocol(format!("unexpected data in the SQLite lock file: {e}")).with_source(e)
        }
        // SQLITE_FULL: say where the space ran out.
        _ if e
            .as_database_error()
            .and_then(|d| d.code())
            .is_some_and(|c| c == "13") =>
        {
            Error::unavailable(format!(
                "SQLite: {e}: the lock file's file system has no space left (the host's \
                 lock directory, /run/lock, is a small tmpfs on many systems)"
            ))
            .with_source(e)
        }
        _ => Error::unavailable(format!("SQLite: {e}")).with_source(e),
    }
}

impl std::fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SqliteBackend({})", self.path.display())
    }
}

/// Datagram wake-ups between processes (see the module docs). Written by
/// hand: no crate offers cross-process notification for SQLite.
///
/// On Linux the sockets live in the abstract namespace (no file to clean
/// up, and every user of the host can reach them); elsewhere (macOS, the
/// BSDs) they are files in the temporary directory, removed when the
/// client closes, and a process of another user may not be able to reach
/// them: its waiters then find the lock free by their timed re-check.
mod wake {
    use crate::error::{Error, Result};
    use crate::spi::wake::Wakeups;
    use std::os::unix::net::UnixDatagram;
    use std::sync::Arc;

    pub(super) struct Endpoint {
        addr: String,
        sender: UnixDatagram,
        task: tokio::task::JoinHandle<()>,
    }

    fn fail(e: std::io::Error) -> Error {
        Error::unavailable(format!("cannot bind a wake-up socket: {e}")).with_source(e)
    }

    #[cfg(target_os = "linux")]
    fn socket_addr(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
    }

    #[cfg(not(target_os = "linux"))]
    fn socket_addr(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
        std::os::unix::net::SocketAddr::from_pathname(name)
    }

    /// A fresh address, and the socket bound to it.
    #[cfg(target_os = "linux")]
    fn bind() -> Result<(String, UnixDatagram)> {
        let addr = format!("fenced/{}", uuid::Uuid::new_v4().simple());
        let sock = UnixDatagram::bind_addr(&socket_addr(&addr).map_err(fail)?).map_err(fail)?;
        Ok((addr, sock))
    }

    #[cfg(not(target_os = "linux"))]
    fn bind() -> Result<(String, UnixDatagram)> {
        // Short: a socket path has room for about 100 bytes on macOS.
        let id = &uuid::Uuid::new_v4().simple().to_string()[..16];
        let path = std::env::temp_dir().join(format!("fenced-{id}.sock"));
        let sock = UnixDatagram::bind(&path).map_err(fail)?;
        Ok((path.display().to_string(), sock))
    }

    impl Endpoint {
        pub(super) fn bind(wakeups: Arc<Wakeups>) -> Result<Self> {
            let (addr, sock) = bind()?;
            sock.set_nonblocking(true).map_err(fail)?;
            let sock = tokio::net::UnixDatagram::from_std(sock).map_err(fail)?;
            let sender = UnixDatagram::unbound().map_err(fail)?;
            sender.set_nonblocking(true).map_err(fail)?;
            let task = tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    match sock.recv(&mut buf).await {
                        Ok(n) => {
                            if let Ok(name) = std::str::from_utf8(&buf[..n]) {
                                wakeups.wake(name);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "wake-up socket failed; waiters fall back to timed re-checks");
                            return;
                        }
                    }
                }
            });
            Ok(Endpoint { addr, sender, task })
        }

        pub(super) fn addr(&self) -> &str {
            &self.addr
        }

        /// Sends `name` to `addr`; false when nobody listens there any more.
        /// A full receive queue counts as delivered: that process already has
        /// wake-ups pending.
        pub(super) fn send(&self, addr: &str, name: &str) -> bool {
            let Ok(to) = socket_addr(addr) else {
                return false;
            };
            match self.sender.send_to_addr(name.as_bytes(), &to) {
                Ok(_) => true,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ),
            }
        }
    }

    impl Drop for Endpoint {
        fn drop(&mut self) {
            self.task.abort();
            #[cfg(not(target_os = "linux"))]
            let _ = std::fs::remove_file(&self.addr);
        }
    }
}

impl SqliteBackend {
    /// `fenced doctor` on SQLite: the file system under the lock file,
    /// its free space, the journal, and whose clock the leases follow.
    pub(crate) async fn checks(&self) -> Result<Vec<crate::doctor::Check>> {
        use crate::doctor::{Check, Verdict};
        let mut out = Vec::new();
        // The file system's calls may block (a hung network mount): off
        // the runtime's threads.
        let path = self.path.clone();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        let (kind, space) = {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || {
                (mount_type(&path), nix::sys::statvfs::statvfs(&dir))
            })
            .await
            .map_err(|e| Error::unavailable(format!("the file system checks failed: {e}")))?
        };
        out.push(match kind {
            Some(t) if (t.starts_with("fuse.") || t == "fuse") && !is_network_fs(&t) => Check::new(
                "file system",
                Verdict::Unknown,
                format!(
                    "{} is on {t}, a FUSE file system: SQLite's locks hold only if it keeps \
                     POSIX locks faithfully, and only for processes of one host",
                    self.path.display()
                ),
            ),
            Some(t) if is_network_fs(&t) => Check::new(
                "file system",
                Verdict::Fail,
                format!(
                    "{} is on {t}, a network file system: SQLite's file locks do not hold \
                     across hosts there, and not always on one; put the lock file on a local \
                     disk, or use a server backend",
                    self.path.display()
                ),
            ),
            Some(t) => Check::new(
                "file system",
                Verdict::Pass,
                format!("{} is on {t}, local to this host", self.path.display()),
            ),
            None => Check::new(
                "file system",
                Verdict::Unknown,
                "the file system's type is not known here (no /proc/self/mounts)",
            ),
        });
        out.push(match space {
            // The counts are u32 on some systems (macOS), u64 on Linux.
            #[allow(clippy::unnecessary_cast)]
            Ok(v) => {
                let unit = v.fragment_size() as u64;
                let free = v.blocks_available() as u64 * unit;
                let size = v.blocks() as u64 * unit;
                let mb = |b: u64| b as f64 / 1_048_576.0;
                let said = format!("{:.1} MB free of {:.1} MB", mb(free), mb(size));
                if free < 1 << 20 {
                    Check::new(
                        "space",
                        Verdict::Fail,
                        format!("{said}: writes to the lock file will fail for want of space"),
                    )
                } else if free < 4 << 20 {
                    Check::new(
                        "space",
                        Verdict::Warn,
                        format!("{said}: the lock file's log alone may take 1 MB"),
                    )
                } else {
                    Check::new("space", Verdict::Pass, said)
                }
            }
            Err(e) => Check::new(
                "space",
                Verdict::Unknown,
                format!("statvfs({}): {e}", dir.display()),
            ),
        });
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&self.pool)
            .await
            .map_err(db)?;
        out.push(if journal.eq_ignore_ascii_case("wal") {
            Check::new("journal", Verdict::Pass, "write-ahead log")
        } else {
            Check::new(
                "journal",
                Verdict::Warn,
                format!(
                    "journal_mode {journal}: another program switched the file out of WAL, \
                     so readers and writers block each other"
                ),
            )
        });
        out.push(Check::new(
            "clock",
            Verdict::Pass,
            "leases end by this host's wall clock, shared by every process here: keep it \
             slewed by NTP, not stepped (a step forward ends leases early); tokens rise \
             whatever it does",
        ));
        Ok(out)
    }
}

/// The type of the file system `path` is on, from the longest mount
/// point above it in `/proc/self/mounts` (Linux).
fn mount_type(path: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, kind) = (f.next()?, f.next()?, f.next()?);
            // Spaces in mount points are written as \040.
            let at = PathBuf::from(at.replace("\\040", " "));
            path.starts_with(&at).then(|| (at, kind.to_owned()))
        })
        .max_by_key(|(at, _)| at.as_os_str().len())
        .map(|(_, kind)| kind)
}

/// Whether a mount type is a network (or host-shared) file system, where
/// POSIX locks are not to be trusted.
fn is_network_fs(kind: &str) -> bool {
    // nfs, nfs4, smb3 and the like by their prefix.
    [
        "nfs",
        "cifs",
        "smb",
        "9p",
        "ceph",
        "glusterfs",
        "afs",
        "lustre",
        "virtiofs",
        "vboxsf",
        "gpfs",
        "beegfs",
        "ocfs2",
        "gfs2",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.ceph",
    ]
    .iter()
    .any(|n| kind.starts_with(n))
}
