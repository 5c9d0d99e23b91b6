//! The one table of backends: every scheme fenced knows, the cargo feature
//! that builds it, its default port, what it can do, and how to open it.
//! URL parsing, the error that lists known schemes, the CLI's help, the
//! torture topologies and the docs read from here; a test checks that
//! every scheme named in `Cargo.toml` and the README is in it.

use crate::error::Result;
use crate::spi::wake::Wakeups;
use crate::spi::{Backend, BoxFuture};
use std::sync::Arc;

/// Opens a backend from its whole URL, waking waiters through the
/// client's [`Wakeups`].
pub(crate) type Opener = fn(String, Arc<Wakeups>) -> BoxFuture<'static, Result<Arc<dyn Backend>>>;

/// What a backend can do, in its default mode (a URL option such as
/// `mode=advisory` may take some away; the conformance suite says which).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Fair (FIFO) acquisition is honoured.
    pub fair: bool,
    /// Read-write locks (shared holds).
    pub shared: bool,
    /// Counting semaphores.
    pub permits: bool,
    /// Holds live on a client session (an etcd lease, a ZooKeeper session,
    /// a database connection) as well as their own lease.
    pub session: bool,
    /// Servers on other hosts can share the locks (not `memory://` or
    /// `sqlite://`).
    pub networked: bool,
    /// Rate limiters: one server whose clock every client reads (not
    /// etcd, ZooKeeper or RedLock).
    pub rate_limiters: bool,
}

/// One backend fenced knows, built into this binary or not.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct BackendInfo {
    /// Its name in logs and tables (the first scheme).
    pub name: &'static str,
    /// The URL schemes that open it.
    pub schemes: &'static [&'static str],
    /// The cargo feature that builds it (`None`: always built).
    pub feature: Option<&'static str>,
    /// The port a host without one gets.
    pub default_port: Option<u16>,
    /// A URL to show in help texts.
    pub example: &'static str,
    /// One line on what it is.
    pub summary: &'static str,
    /// What it can do.
    pub capabilities: Capabilities,
    open: Option<Opener>,
}

impl BackendInfo {
    /// Whether this binary was built with it.
    pub fn is_built(&self) -> bool {
        self.open.is_some()
    }

    pub(crate) fn opener(&self) -> Option<Opener> {
        self.open
    }
}

/// Every backend fenced knows, in the order help texts list them.
///
/// ```
/// let sqlite = fenced::backends().iter().find(|b| b.name == "sqlite").unwrap();
/// assert!(sqlite.schemes.contains(&"sqlite"));
/// ```
pub fn backends() -> &'static [BackendInfo] {
    &TABLE
}

/// The backend a URL scheme opens, built or not.
pub fn backend_for_scheme(scheme: &str) -> Option<&'static BackendInfo> {
    TABLE.iter().find(|b| b.schemes.contains(&scheme))
}

/// Makes an [`Opener`] from an `async fn(&str, Arc<Wakeups>)`, or `None`
/// when `feature` is not built.
macro_rules! opener {
    ($feature:literal, $open:path) => {{
        #[cfg(feature = $feature)]
        let open: Option<Opener> =
            Some(|url, wakeups| Box::pin(async move { $open(&url, wakeups).await }));
        #[cfg(not(feature = $feature))]
        let open: Option<Opener> = None;
        open
    }};
}

const LEASED: Capabilities = Capabilities {
    fair: true,
    shared: true,
    permits: true,
    session: false,
    networked: true,
    rate_limiters: true,
};

static TABLE: std::sync::LazyLock<Vec<BackendInfo>> = std::sync::LazyLock::new(|| {
    vec![
        BackendInfo {
            name: "sqlite",
            schemes: &["sqlite"],
            feature: Some("sqlite"),
            default_port: None,
            example: "sqlite:///path/locks.db",
            summary: "a lease table in one SQLite file, for every process on one host",
            capabilities: Capabilities {
                networked: false,
                ..LEASED
            },
            open: opener!("sqlite", open_sqlite),
        },
        BackendInfo {
            name: "memory",
            schemes: &["memory"],
            feature: None,
            default_port: None,
            example: "memory://",
            summary: "this process only; clients of one namespace share locks",
            capabilities: Capabilities {
                networked: false,
                ..LEASED
            },
            open: Some(|url, wakeups| {
                Box::pin(async move {
                    let ns = url.strip_prefix("memory:").unwrap_or("");
                    let ns = ns.strip_prefix("//").unwrap_or(ns);
                    super::memory::MemoryBackend::open(ns, wakeups)
                })
            }),
        },
        BackendInfo {
            name: "redis",
            schemes: &["redis", "rediss"],
            feature: Some("redis"),
            default_port: Some(6379),
            example: "redis://host:6379[?layout=simple] or rediss://host:6379[?ca=FILE]",
            summary: "one Redis server (rediss://: TLS, with the feature `tls`)",
            capabilities: LEASED,
            open: opener!("redis", open_redis),
        },
        BackendInfo {
            name: "redis+sentinel",
            schemes: &["redis+sentinel"],
            feature: Some("redis"),
            default_port: Some(26379),
            example: "redis+sentinel://h1,h2/SERVICE",
            summary: "the master a group of Redis Sentinels names",
            capabilities: LEASED,
            open: opener!("redis", open_redis),
        },
        BackendInfo {
            name: "redis+cluster",
            schemes: &["redis+cluster"],
            feature: Some("redis"),
            default_port: Some(6379),
            example: "redis+cluster://h1,h2,h3",
            summary: "Redis Cluster, every key of a lock in the name's slot",
            capabilities: LEASED,
            open: opener!("redis", open_redis),
        },
        BackendInfo {
            name: "redlock",
            schemes: &["redlock"],
            feature: Some("redis"),
            default_port: Some(6379),
            example: "redlock://h1,h2,h3",
            summary: "RedLock over independent Redis masters",
            capabilities: Capabilities {
                fair: false,
                permits: false,
                rate_limiters: false,
                ..LEASED
            },
            open: opener!("redis", super::redis::redlock::RedLockBackend::open),
        },
        BackendInfo {
            name: "postgres",
            schemes: &["postgres", "postgresql"],
            feature: Some("postgres"),
            default_port: Some(5432),
            example: "postgres://user@host/db[?mode=advisory]",
            summary: "a lease table in PostgreSQL, or session advisory locks",
            capabilities: LEASED,
            open: opener!("postgres", super::sql::postgres::PgBackend::open),
        },
        BackendInfo {
            name: "mysql",
            schemes: &["mysql", "mariadb"],
            feature: Some("mysql"),
            default_port: Some(3306),
            example: "mysql://user@host/db[?mode=advisory]",
            summary: "a lease table in MariaDB, or GET_LOCK session locks",
            capabilities: LEASED,
            open: opener!("mysql", super::sql::mysql::MySqlBackend::open),
        },
        BackendInfo {
            name: "etcd",
            schemes: &["etcd", "etcds"],
            feature: Some("etcd"),
            default_port: Some(2379),
            example: "etcd://h1,h2,h3 or etcds://h1,h2,h3[?ca=FILE]",
            summary: "etcd v3 in concurrency.Mutex's layout (etcds://: TLS, with the feature `tls`)",
            capabilities: Capabilities {
                session: true,
                rate_limiters: false,
                ..LEASED
            },
            open: opener!("etcd", open_etcd),
        },
        BackendInfo {
            name: "zk",
            schemes: &["zk"],
            feature: Some("zookeeper"),
            default_port: Some(2181),
            example: "zk://h1,h2,h3[/chroot]",
            summary: "ZooKeeper in Curator's layouts",
            capabilities: Capabilities {
                session: true,
                rate_limiters: false,
                ..LEASED
            },
            open: opener!("zookeeper", super::zk::ZkBackend::open),
        },
    ]
});

#[cfg(feature = "sqlite")]
async fn open_sqlite(url: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
    let rest = url.strip_prefix("sqlite:").unwrap_or(url);
    let path = rest.strip_prefix("//").unwrap_or(rest);
    super::sql::sqlite::SqliteBackend::open(path, wakeups).await
}

#[cfg(feature = "redis")]
async fn open_redis(url: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
    needs_tls(url, "rediss:")?;
    super::redis::RedisBackend::open(url, wakeups).await
}

#[cfg(feature = "etcd")]
async fn open_etcd(url: &str, wakeups: Arc<Wakeups>) -> Result<Arc<dyn Backend>> {
    needs_tls(url, "etcds:")?;
    super::etcd::EtcdBackend::open(url, wakeups).await
}

/// Refuses a TLS scheme (`tls_scheme`, with its colon) in a build without
/// the feature `tls`, rather than letting a client speak plain text to a
/// TLS port.
#[cfg(any(feature = "redis", feature = "etcd"))]
fn needs_tls(url: &str, tls_scheme: &str) -> Result<()> {
    if url.starts_with(tls_scheme) && !cfg!(feature = "tls") {
        return Err(crate::error::Error::invalid(format!(
            "{tls_scheme}// needs TLS, which is not in this build of fenced (cargo feature `tls`)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `scheme://` the manifest, the README, the crate docs, the test
    /// kit's servers and the torture topologies name is in the table.
    #[test]
    fn every_documented_scheme_is_in_the_table() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        for file in [
            "crates/fenced/Cargo.toml",
            "README.md",
            "docs/backends.md",
            "docs/cli.md",
            "docs/ARCHITECTURE.md",
            "crates/fenced/src/lib.rs",
            "crates/fenced/src/client.rs",
            "crates/fenced-testkit/src/torture/topology.rs",
            "crates/fenced-testkit/src/torture/expect.rs",
            "crates/fenced-testkit/src/servers/redis.rs",
            "crates/fenced-testkit/src/servers/etcd.rs",
            "crates/fenced-testkit/src/servers/zookeeper.rs",
            "crates/fenced-testkit/src/servers/postgres.rs",
            "crates/fenced-testkit/src/servers/mariadb.rs",
        ] {
            let text = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
            for (i, _) in text.match_indices("://") {
                let scheme: String = text[..i]
                    .chars()
                    .rev()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '+')
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                if scheme.is_empty() || ["http", "https", "file"].contains(&scheme.as_str()) {
                    continue;
                }
                assert!(
                    backend_for_scheme(&scheme).is_some(),
                    "{file} names {scheme}://, which the backend table does not know"
                );
            }
        }
    }

    #[test]
    fn schemes_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for b in backends() {
            for s in b.schemes {
                assert!(seen.insert(*s), "{s} is in the table twice");
            }
        }
    }
}
