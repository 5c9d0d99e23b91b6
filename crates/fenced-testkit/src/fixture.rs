//! Backends under test.

use fenced::Client;
use std::any::Any;
use std::path::PathBuf;

/// One backend under test: its URL, what it can do, and whatever must stay
/// alive while the test runs (a temp dir, a server process).
pub struct Fixture {
    /// The backend URL tests connect to.
    pub url: String,
    /// The `fenced` binary, for backends shared between processes.
    pub fenced_bin: Option<PathBuf>,
    _keep: Vec<Box<dyn Any + Send + Sync>>,
}

/// A name no other test uses: tests share backends, never names.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// What the fault tests of a server topology start from: two clients of
/// `url`, and the first holding a fresh name (`prefix`) with a renewed
/// lease of 2 s (scaled by `t`).
pub async fn one_holds(
    url: &str,
    prefix: &str,
    t: &crate::Timing,
) -> (fenced::Client, fenced::Client, String, fenced::Guard) {
    let a = fenced::Client::connect(url).await.unwrap();
    let b = fenced::Client::connect(url).await.unwrap();
    let name = unique(prefix);
    let g = a
        .mutex(&name)
        .unwrap()
        .lease(t.ms(2000))
        .acquire()
        .await
        .unwrap();
    (a, b, name, g)
}

/// Takes and releases a fresh name (`prefix`) twice through `c`: both
/// releases find their hold, and the second token is above the first.
pub async fn two_holds_in_turn(c: &fenced::Client, prefix: &str) {
    let name = unique(prefix);
    let g = c.mutex(&name).unwrap().acquire().await.unwrap();
    let token = g.fencing_token();
    assert!(g.release().await.unwrap());
    let g = c.mutex(&name).unwrap().acquire().await.unwrap();
    assert!(
        g.fencing_token() > token,
        "{} after {token}",
        g.fencing_token()
    );
    assert!(g.release().await.unwrap());
}

impl Fixture {
    /// A fresh `memory://` namespace.
    pub fn memory() -> Self {
        Fixture {
            url: format!("memory://{}", unique("t")),
            fenced_bin: None,
            _keep: Vec::new(),
        }
    }

    /// A fresh SQLite file in a temp dir; processes tests run `fenced_bin`.
    pub fn sqlite(fenced_bin: impl Into<PathBuf>) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir for the SQLite file");
        Fixture {
            url: format!("sqlite://{}", dir.path().join("locks.db").display()),
            fenced_bin: Some(fenced_bin.into()),
            _keep: vec![Box::new(dir)],
        }
    }

    /// A fresh `redis-server`.
    pub fn redis(fenced_bin: impl Into<PathBuf>) -> Self {
        Fixture::redis_with(fenced_bin, "")
    }

    /// A fresh `redis-server`, with `query` (e.g. `?layout=simple`) on the URL.
    pub fn redis_with(fenced_bin: impl Into<PathBuf>, query: &str) -> Self {
        let s = crate::servers::redis::RedisServer::start();
        Fixture::new(
            format!("{}{query}", s.url()),
            Some(fenced_bin.into()),
            vec![Box::new(s)],
        )
    }

    /// Three fresh independent masters behind `redlock://`.
    pub fn redlock(fenced_bin: impl Into<PathBuf>) -> Self {
        let m = crate::servers::redis::RedisMasters::start(3);
        Fixture::new(m.url(), Some(fenced_bin.into()), vec![Box::new(m)])
    }

    /// A fresh Sentinel group (master, two replicas, three sentinels).
    pub fn redis_sentinel(fenced_bin: impl Into<PathBuf>) -> Self {
        let g = crate::servers::redis::RedisSentinel::start();
        Fixture::new(g.url(), Some(fenced_bin.into()), vec![Box::new(g)])
    }

    /// A fresh three-master Redis Cluster.
    pub fn redis_cluster(fenced_bin: impl Into<PathBuf>) -> Self {
        let c = crate::servers::redis::RedisCluster::start(3);
        Fixture::new(c.url(), Some(fenced_bin.into()), vec![Box::new(c)])
    }

    /// A fresh PostgreSQL server.
    pub fn postgres(fenced_bin: impl Into<PathBuf>) -> Self {
        Fixture::postgres_with(fenced_bin, "")
    }

    /// A fresh PostgreSQL server, with `query` (e.g. `?mode=advisory`) on the URL.
    pub fn postgres_with(fenced_bin: impl Into<PathBuf>, query: &str) -> Self {
        let s = crate::servers::postgres::PgServer::start();
        Fixture::new(
            format!("{}{query}", s.url()),
            Some(fenced_bin.into()),
            vec![Box::new(s)],
        )
    }

    /// A fresh MariaDB server.
    pub fn mariadb(fenced_bin: impl Into<PathBuf>) -> Self {
        Self::mariadb_with(fenced_bin, "")
    }

    /// A fresh MariaDB server, with URL options (`?mode=advisory`).
    pub fn mariadb_with(fenced_bin: impl Into<PathBuf>, query: &str) -> Self {
        let s = crate::servers::mariadb::MariaDb::start();
        Fixture::new(
            format!("{}{query}", s.url()),
            Some(fenced_bin.into()),
            vec![Box::new(s)],
        )
    }

    /// A fresh etcd of `members` members, with a short session lease so a
    /// killed holder's keys go within the suite's patience.
    pub fn etcd(fenced_bin: impl Into<PathBuf>, members: usize) -> Self {
        let c = crate::servers::etcd::EtcdCluster::start_n(members);
        Fixture::new(
            format!("{}?lease_ttl=3s", c.url()),
            Some(fenced_bin.into()),
            vec![Box::new(c)],
        )
    }

    /// A fresh ZooKeeper of `nodes` nodes (1: standalone), with a short
    /// session timeout so a killed holder's nodes go within the suite's
    /// patience.
    pub fn zookeeper(fenced_bin: impl Into<PathBuf>, nodes: usize) -> Self {
        let z = crate::servers::zookeeper::ZkEnsemble::start_n(nodes);
        Fixture::new(
            format!("{}?session_timeout=3s", z.url()),
            Some(fenced_bin.into()),
            vec![Box::new(z)],
        )
    }

    /// Any URL, keeping `keep` alive as long as the fixture.
    pub fn new(
        url: String,
        fenced_bin: Option<PathBuf>,
        keep: Vec<Box<dyn Any + Send + Sync>>,
    ) -> Self {
        Fixture {
            url,
            fenced_bin,
            _keep: keep,
        }
    }

    /// A new client of the backend (a new client id, as another process would have).
    pub async fn client(&self) -> Client {
        Client::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }
}
