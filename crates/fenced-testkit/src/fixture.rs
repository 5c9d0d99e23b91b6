//! Backends under test, and what a test can do to them.
//!
//! A [`Fixture`] is one backend (its own servers, started for the test) and
//! its fault hooks, in the manner of DistributedLock's per-backend test
//! strategies: a client whose traffic passes proxies the test controls (cut
//! its connections, or partition it: bytes held back, sockets left open),
//! the holder's session killed by the engine itself, the server restarted.
//! So "lost" is produced by the engine failing, not only by `force_unlock`.
//! A hook the engine has no use for says why (the test shows it skipped).

use crate::servers::{
    etcd::EtcdCluster,
    mariadb::MariaDb,
    postgres::PgServer,
    redis::{RedisCluster, RedisMasters, RedisSentinel, RedisServer},
    zookeeper::ZkEnsemble,
};
use crate::torture::proxy::Proxy;
use fenced::Client;
use std::any::Any;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// One backend under test: its URL, its servers and fault hooks, and
/// whatever must stay alive while the test runs (a temp dir).
pub struct Fixture {
    /// The backend URL tests connect to.
    pub url: String,
    /// The `fenced` binary, for backends shared between processes.
    pub fenced_bin: Option<PathBuf>,
    servers: Mutex<Servers>,
    _keep: Vec<Box<dyn Any + Send + Sync>>,
}

/// The servers behind a fixture.
enum Servers {
    /// In-process (`memory://`), or a file (`sqlite://`): no network.
    Local(&'static str),
    Redis(RedisServer),
    RedLock(RedisMasters),
    Sentinel(RedisSentinel),
    Cluster(RedisCluster),
    Postgres(PgServer, bool),
    Mariadb(MariaDb, bool),
    Etcd(EtcdCluster),
    Zk(ZkEnsemble),
    /// A URL the test kit did not start.
    Foreign,
}

/// A name no other test uses: tests share backends, never names.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Two clients of `url`.
pub async fn two_clients(url: &str) -> (fenced::Client, fenced::Client) {
    let a = fenced::Client::connect(url).await.unwrap();
    let b = fenced::Client::connect(url).await.unwrap();
    (a, b)
}

/// `client`'s mutex `name`, acquired (waiting as long as it takes) with
/// `lease`: renewed by the watchdog, or fixed, as a holder that stops
/// renewing has it.
pub async fn hold(client: &fenced::Client, name: &str, lease: fenced::Lease) -> fenced::Guard {
    let mutex = client.mutex(name).unwrap();
    let mutex = if lease.is_renewed() {
        mutex.lease(lease.duration())
    } else {
        mutex.fixed_lease(lease.duration())
    };
    mutex.acquire().await.unwrap()
}

/// `client.list(name)` shows `name` alone, with the holders (owners and
/// tokens) `status` showed: for a lock a foreign client holds in
/// fenced's layout (Curator's nodes, `etcdctl lock`'s keys).
pub async fn assert_listed(client: &fenced::Client, name: &str, status: &fenced::LockStatus) {
    let listed = client.list(name).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let who = |s: &fenced::LockStatus| -> Vec<(String, u64)> {
        s.holders
            .iter()
            .map(|h| (h.owner.clone(), h.token))
            .collect()
    };
    assert_eq!(listed[0].name, name);
    assert_eq!(who(&listed[0].status), who(status));
}

/// Each of `suffixes` after `base` makes a URL that `Client::connect`
/// refuses as bad input.
pub async fn refuses_urls(base: &str, suffixes: &[&str]) {
    for bad in suffixes {
        let e = fenced::Client::connect(&format!("{base}{bad}"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), fenced::ErrorKind::InvalidInput, "{bad}: {e}");
    }
}

/// Each of `names` is a lock and a register of its own, whatever quotes,
/// SQL or script it holds: held (and shown held), written, read back and
/// released, byte for byte.
pub async fn names_stay_data(c: &fenced::Client, names: &[&str]) {
    for name in names {
        let g = c.mutex(name).unwrap().try_acquire().await.unwrap().unwrap();
        assert_eq!(c.status(name).await.unwrap().holders.len(), 1, "{name}");
        let r = c.register(name).unwrap();
        r.write(&g, name).await.unwrap();
        assert_eq!(r.read().await.unwrap().unwrap().0, name.as_bytes());
        assert!(g.release().await.unwrap(), "{name}");
    }
}

/// The error of one try at a fresh name (`prefix`) through `c` that may
/// not retry: what a caller meets when the backend cannot answer.
pub async fn fails_at_once(c: &fenced::Client, prefix: &str) -> fenced::Error {
    c.mutex(&unique(prefix))
        .unwrap()
        .retry(fenced::RetryPolicy::Never)
        .try_acquire()
        .await
        .unwrap_err()
}

/// What the fault tests of a server topology start from: two clients of
/// `url`, and the first holding a fresh name (`prefix`) at the default
/// lease (30 s, renewed), as a user's would: a hold that must survive a
/// leader election has the lease a user's has, not a shorter one that an
/// election at the engine's default timing could outlast.
pub async fn one_holds(
    url: &str,
    prefix: &str,
) -> (fenced::Client, fenced::Client, String, fenced::Guard) {
    let (a, b) = two_clients(url).await;
    let name = unique(prefix);
    let g = a.mutex(&name).unwrap().acquire().await.unwrap();
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

/// A client whose every connection to the backend passes proxies the test
/// controls.
pub struct Isolated {
    /// The client.
    pub client: Client,
    /// Its URL, through the proxies (for `fenced` processes).
    pub url: String,
    proxies: Vec<Proxy>,
}

impl Isolated {
    /// Holds back every byte both ways (and new connections), sockets left
    /// open, until called again with `false`: a partition.
    pub fn partition(&self, on: bool) {
        for p in &self.proxies {
            p.blackhole(on);
        }
    }

    /// Resets every open connection; new ones go through.
    pub fn cut(&self) {
        for p in &self.proxies {
            p.cut();
        }
    }

    /// Lets requests through to the servers but holds back their answers
    /// until called again with `false`: requests that happen, replies
    /// that come late (or, if the client gives up first, never).
    pub fn hold_replies(&self, on: bool) {
        for p in &self.proxies {
            p.hold_replies(on);
        }
    }
}

/// The default session of the session backends (etcd's `lease_ttl`,
/// ZooKeeper's `session_timeout`): how long the keys of a client that died
/// outlive it.
const DEFAULT_SESSION: Duration = Duration::from_secs(10);

impl Fixture {
    fn with(url: String, fenced_bin: Option<PathBuf>, servers: Servers) -> Fixture {
        Fixture {
            url,
            fenced_bin,
            servers: Mutex::new(servers),
            _keep: Vec::new(),
        }
    }

    /// A SQL server's fixture: `query` (`?mode=advisory` or none) on its
    /// `url`; `servers` keeps the server, told whether the mode is advisory.
    fn with_query(
        url: String,
        query: &str,
        fenced_bin: impl Into<PathBuf>,
        servers: impl FnOnce(bool) -> Servers,
    ) -> Fixture {
        let advisory = query.contains("mode=advisory");
        Fixture::with(
            format!("{url}{query}"),
            Some(fenced_bin.into()),
            servers(advisory),
        )
    }

    /// A fresh `memory://` namespace.
    pub fn memory() -> Self {
        Fixture::with(
            format!("memory://{}", unique("t")),
            None,
            Servers::Local("memory:// lives in this process: no network, no session, no server"),
        )
    }

    /// A fresh SQLite file in a temp dir; processes tests run `fenced_bin`.
    pub fn sqlite(fenced_bin: impl Into<PathBuf>) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir for the SQLite file");
        let mut f = Fixture::with(
            format!("sqlite://{}", dir.path().join("locks.db").display()),
            Some(fenced_bin.into()),
            Servers::Local("sqlite:// is a file on this host: no network, no session, no server"),
        );
        f._keep.push(Box::new(dir));
        f
    }

    /// A fresh SQLite file in the host's lock directory, beside the default
    /// lock file (`/run/lock/fenced`, or `/var/tmp/fenced`): made as the
    /// default one is, for every user. Its files are removed when the
    /// fixture goes.
    pub fn sqlite_shared(fenced_bin: impl Into<PathBuf>) -> Self {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let default = fenced::default_sqlite_path();
        let dir = default.parent().expect("the host's lock directory");
        if !dir.exists() {
            // As `Client::from_env` makes it.
            let _ = std::fs::DirBuilder::new().mode(0o777).create(dir);
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777));
        }
        let file = dir.join(format!("{}.db", unique("test")));
        let mut f = Fixture::with(
            format!("sqlite://{}", file.display()),
            Some(fenced_bin.into()),
            Servers::Local("sqlite:// is a file on this host: no network, no session, no server"),
        );
        f._keep.push(Box::new(RemoveOnDrop(file)));
        f
    }

    /// A fresh `redis-server`.
    pub fn redis(fenced_bin: impl Into<PathBuf>) -> Self {
        Fixture::redis_with(fenced_bin, "")
    }

    /// A fresh `redis-server`, with `query` (e.g. `?layout=simple`) on the URL.
    pub fn redis_with(fenced_bin: impl Into<PathBuf>, query: &str) -> Self {
        let s = RedisServer::start();
        Fixture::with(
            format!("{}{query}", s.url()),
            Some(fenced_bin.into()),
            Servers::Redis(s),
        )
    }

    /// Three fresh independent masters behind `redlock://`.
    pub fn redlock(fenced_bin: impl Into<PathBuf>) -> Self {
        let m = RedisMasters::start(3);
        Fixture::with(m.url(), Some(fenced_bin.into()), Servers::RedLock(m))
    }

    /// A fresh Sentinel group (master, two replicas, three sentinels).
    pub fn redis_sentinel(fenced_bin: impl Into<PathBuf>) -> Self {
        let g = RedisSentinel::start();
        Fixture::with(g.url(), Some(fenced_bin.into()), Servers::Sentinel(g))
    }

    /// A fresh three-master Redis Cluster.
    pub fn redis_cluster(fenced_bin: impl Into<PathBuf>) -> Self {
        let c = RedisCluster::start(3);
        Fixture::with(c.url(), Some(fenced_bin.into()), Servers::Cluster(c))
    }

    /// A fresh PostgreSQL server.
    pub fn postgres(fenced_bin: impl Into<PathBuf>) -> Self {
        Fixture::postgres_with(fenced_bin, "")
    }

    /// A fresh PostgreSQL server, with `query` (e.g. `?mode=advisory`) on the URL.
    pub fn postgres_with(fenced_bin: impl Into<PathBuf>, query: &str) -> Self {
        let s = PgServer::start();
        Fixture::with_query(s.url(), query, fenced_bin, |advisory| {
            Servers::Postgres(s, advisory)
        })
    }

    /// A fresh MariaDB server.
    pub fn mariadb(fenced_bin: impl Into<PathBuf>) -> Self {
        Self::mariadb_with(fenced_bin, "")
    }

    /// A fresh MariaDB server, with URL options (`?mode=advisory`).
    pub fn mariadb_with(fenced_bin: impl Into<PathBuf>, query: &str) -> Self {
        let s = MariaDb::start();
        Fixture::with_query(s.url(), query, fenced_bin, |advisory| {
            Servers::Mariadb(s, advisory)
        })
    }

    /// A fresh etcd of `members` members, at the client's default
    /// settings (a 10 s session lease).
    pub fn etcd(fenced_bin: impl Into<PathBuf>, members: usize) -> Self {
        let c = EtcdCluster::start_n(members);
        Fixture::with(c.url(), Some(fenced_bin.into()), Servers::Etcd(c))
    }

    /// A fresh ZooKeeper of `nodes` nodes (1: standalone), at the client's
    /// default settings (a 10 s session).
    pub fn zookeeper(fenced_bin: impl Into<PathBuf>, nodes: usize) -> Self {
        let z = ZkEnsemble::start_n(nodes);
        Fixture::with(z.url(), Some(fenced_bin.into()), Servers::Zk(z))
    }

    /// Any URL, keeping `keep` alive as long as the fixture. It has no
    /// fault hooks.
    pub fn new(
        url: String,
        fenced_bin: Option<PathBuf>,
        keep: Vec<Box<dyn Any + Send + Sync>>,
    ) -> Self {
        Fixture {
            url,
            fenced_bin,
            servers: Mutex::new(Servers::Foreign),
            _keep: keep,
        }
    }

    /// Whether the recipes keep their values where Curator keeps them
    /// (ZooKeeper): a counter in the data of the node at its path, a
    /// barrier as that node's existence.
    pub fn curator_layout(&self) -> bool {
        self.url.starts_with("zk://")
    }

    /// Writes `text` where a counter named `name` keeps its value, as
    /// another program could have: the register of that name, or, in
    /// Curator's layout, the data of the node at its path (written by
    /// Curator itself).
    pub async fn plant(&self, name: &str, text: &str) {
        // Curator's connect string: the hosts and the chroot, no options.
        let connect = self
            .url
            .strip_prefix("zk://")
            .map(|rest| rest.split('?').next().unwrap_or_default().to_owned());
        let Some(connect) = connect else {
            let v = self.client().await.versioned(name).unwrap();
            assert!(
                v.compare_and_set(0, text).await.unwrap(),
                "{name} was written already"
            );
            return;
        };
        let path = format!("/{name}");
        let text = text.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut curator = crate::interop::CuratorRecipes::start(&connect);
            assert_eq!(curator.ask(&format!("set-data {path} {text}")), "ok");
        })
        .await
        .unwrap();
    }

    /// A new client of the backend (a new client id, as another process would have).
    pub async fn client(&self) -> Client {
        Client::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }

    /// Two new clients of the backend.
    pub async fn two_clients(&self) -> (Client, Client) {
        (self.client().await, self.client().await)
    }

    fn servers(&self) -> std::sync::MutexGuard<'_, Servers> {
        self.servers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long the keys of a client that died outlive it on this backend
    /// beyond their leases: its session (etcd, ZooKeeper), else nothing.
    pub fn session_timeout(&self) -> Duration {
        match &*self.servers() {
            Servers::Etcd(_) | Servers::Zk(_) => DEFAULT_SESSION,
            _ => Duration::ZERO,
        }
    }

    /// A client whose every connection to the backend (and every node the
    /// backend announces: Sentinel's master and replicas, Cluster's
    /// masters) passes proxies the test controls; `Err` with the reason
    /// where the backend has no network.
    pub async fn isolated(&self) -> Result<Isolated, &'static str> {
        self.isolated_with("").await
    }

    /// [`isolated`](Self::isolated), for tests that hold replies back:
    /// where the client pools connections (the SQL lease tables), it keeps
    /// one, so that once warmed up its next request goes out at once, not
    /// after a statement's preparation whose answer the test holds back.
    pub async fn isolated_for_replies(&self) -> Result<Isolated, &'static str> {
        let pooled = matches!(
            &*self.servers(),
            Servers::Postgres(_, false) | Servers::Mariadb(_, false)
        );
        self.isolated_with(if pooled { "pool=1" } else { "" }).await
    }

    async fn isolated_with(&self, param: &str) -> Result<Isolated, &'static str> {
        let announced: Vec<u16> = match &*self.servers() {
            Servers::Local(why) => return Err(why),
            Servers::Foreign => return Err("a backend the test kit did not start"),
            Servers::Sentinel(g) => g.nodes.iter().map(|n| n.port).collect(),
            Servers::Cluster(c) => c.nodes.iter().map(|n| n.port).collect(),
            _ => Vec::new(),
        };
        let (mut url, proxies) = through_proxies(&self.url, &announced);
        if !param.is_empty() {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(param);
        }
        let client = Client::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        Ok(Isolated {
            client,
            url,
            proxies,
        })
    }

    /// Ends, in the engine itself, the session that holds lock `name`:
    /// revokes its etcd lease, or terminates the database session of an
    /// advisory lock. `Err` with the reason where holds live on no session
    /// a test can end (leases; ZooKeeper, which ends a session only when
    /// it stops hearing from the client: use [`Isolated::partition`]).
    pub fn kill_session(&self, name: &str) -> Result<(), &'static str> {
        match &*self.servers() {
            Servers::Etcd(c) => {
                let out = crate::servers::etcd::etcdctl(
                    &c.endpoints(),
                    &["get", "--prefix", "--keys-only", &format!("{name}/")],
                )
                .expect("etcdctl get");
                let mut killed = 0;
                for key in out.lines().filter(|l| !l.trim().is_empty()) {
                    let lease = key.rsplit('/').next().unwrap_or("");
                    let lease = lease.split('_').next().unwrap_or(lease);
                    if crate::servers::etcd::etcdctl(&c.endpoints(), &["lease", "revoke", lease])
                        .is_some()
                    {
                        killed += 1;
                    }
                }
                assert!(killed > 0, "no session holds {name:?} on etcd: {out:?}");
                Ok(())
            }
            Servers::Postgres(s, true) => {
                let n = s.sql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_locks \
                     WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()",
                );
                assert_ne!(n.trim(), "0", "no session holds an advisory lock");
                Ok(())
            }
            Servers::Mariadb(s, true) => {
                // fenced's GET_LOCK name is the lock name (up to 64 characters).
                assert!(name.chars().count() <= 64, "a short name: {name:?}");
                let quoted = name.replace('\\', "\\\\").replace('\'', "\\'");
                let id = s.sql(&format!("SELECT IS_USED_LOCK('{quoted}')"));
                assert!(
                    id.trim().parse::<u64>().is_ok(),
                    "no session holds {name:?}: {id:?}"
                );
                s.sql(&format!("KILL {}", id.trim()));
                Ok(())
            }
            Servers::Zk(_) => Err(
                "ZooKeeper ends a session only when it stops hearing from its client \
                 (the partition test covers that)",
            ),
            Servers::Local(why) => Err(why),
            Servers::Foreign => Err("a backend the test kit did not start"),
            _ => Err("holds live on a lease here, not on a session a test can end"),
        }
    }

    /// Kills the leader of an ensemble or cluster (SIGKILL) and leaves it
    /// down; `Err` with the reason where there is no leader to kill.
    pub fn kill_leader(&self) -> Result<(), &'static str> {
        match &mut *self.servers() {
            Servers::Etcd(c) if c.members.len() >= 3 => {
                let leader = c.leader().expect("the cluster has a leader");
                c.kill(leader);
                Ok(())
            }
            Servers::Zk(z) if z.nodes.len() >= 3 => {
                let leader = z.leader().expect("the ensemble has a leader");
                z.kill(leader);
                Ok(())
            }
            Servers::Local(why) => Err(why),
            Servers::Foreign => Err("a backend the test kit did not start"),
            _ => Err("no ensemble here: one server, or independent ones, elect no leader"),
        }
    }

    /// Kills the server (SIGKILL) and starts it again on its data; `Err`
    /// with the reason where the fixture has no single server to restart.
    pub fn restart(&self) -> Result<(), &'static str> {
        match &mut *self.servers() {
            Servers::Redis(s) => {
                s.kill();
                s.restart();
            }
            Servers::Postgres(s, _) => {
                s.kill();
                s.restart();
            }
            Servers::Mariadb(s, _) => {
                s.kill();
                s.restart();
            }
            Servers::Etcd(c) if c.members.len() == 1 => {
                c.kill(0);
                c.restart(0);
            }
            Servers::Zk(z) if z.nodes.len() == 1 => {
                z.kill(0);
                z.restart(0);
            }
            Servers::RedLock(m) => {
                for s in &mut m.servers {
                    s.kill();
                    s.restart();
                }
            }
            Servers::Local(why) => return Err(why),
            Servers::Foreign => return Err("a backend the test kit did not start"),
            _ => {
                return Err(
                    "several servers: restarts of one of them are the torture suite's \
                     (restart, leader, failover faults)",
                );
            }
        }
        Ok(())
    }
}

/// `url` with every `host:port` it names replaced by a proxy's, and the
/// `announced` ports mapped to proxies with `nat=` (a port both named and
/// announced shares one proxy).
fn through_proxies(url: &str, announced: &[u16]) -> (String, Vec<Proxy>) {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let mut proxies: Vec<(u16, Proxy)> = Vec::new();
    let mut proxy_for = |port: u16| -> u16 {
        if let Some((_, p)) = proxies.iter().find(|(t, _)| *t == port) {
            return p.port();
        }
        let p = Proxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .expect("start a proxy");
        let mine = p.port();
        proxies.push((port, p));
        mine
    };
    let hosts: Vec<String> = hosts
        .split(',')
        .map(|h| {
            let (host, port) = h.rsplit_once(':').expect("host:port");
            let port: u16 = port.parse().expect("a port");
            format!("{host}:{}", proxy_for(port))
        })
        .collect();
    let nat: Vec<String> = announced
        .iter()
        .map(|&port| format!("nat=127.0.0.1:{port}=127.0.0.1:{}", proxy_for(port)))
        .collect();
    let mut out = format!("{scheme}://{userinfo}{}{tail}", hosts.join(","));
    if !nat.is_empty() {
        out.push(if tail.contains('?') { '&' } else { '?' });
        out.push_str(&nat.join("&"));
    }
    (out, proxies.into_iter().map(|(_, p)| p).collect())
}

/// Removes an SQLite file and its `-wal` and `-shm` files when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.0.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_go_through_proxies() {
        let (url, proxies) = through_proxies(
            "redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster?timeout=1s",
            &[3],
        );
        assert_eq!(proxies.len(), 3);
        let p: Vec<u16> = proxies.iter().map(Proxy::port).collect();
        assert_eq!(
            url,
            format!(
                "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/mymaster?timeout=1s\
                 &nat=127.0.0.1:3=127.0.0.1:{}",
                p[0], p[1], p[2]
            )
        );
        let (url, proxies) = through_proxies("postgres://postgres@127.0.0.1:5/db", &[]);
        assert_eq!(
            url,
            format!("postgres://postgres@127.0.0.1:{}/db", proxies[0].port())
        );
    }
}
