//! The topologies `fenced torture --spawn` starts (RELIABILITY.md), and
//! the server faults each can take.

use super::{Family, Fault};
use crate::servers::{
    etcd::EtcdCluster,
    mariadb::MariaDb,
    postgres::PgServer,
    redis::{RedisCluster, RedisMasters, RedisSentinel, RedisServer},
    zookeeper::ZkEnsemble,
};

/// A topology by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// An SQLite file in a temp dir.
    Sqlite,
    /// One redis-server, no persistence.
    Redis,
    /// One redis-server with AOF `everysec`.
    RedisAof,
    /// A master, two replicas and three sentinels.
    Sentinel,
    /// A three-master Redis Cluster.
    Cluster,
    /// Five independent masters.
    RedLock,
    /// PostgreSQL, lease table.
    Postgres,
    /// PostgreSQL, advisory locks.
    PostgresAdvisory,
    /// MariaDB, lease table.
    Mariadb,
    /// MariaDB, `GET_LOCK`.
    MariadbAdvisory,
    /// A standalone ZooKeeper.
    Zookeeper,
    /// A three-node ZooKeeper ensemble.
    Zookeeper3,
    /// One etcd member.
    Etcd,
    /// Three etcd members.
    Etcd3,
}

impl Topology {
    /// Every topology.
    pub const ALL: [Topology; 14] = [
        Topology::Sqlite,
        Topology::Redis,
        Topology::RedisAof,
        Topology::Sentinel,
        Topology::Cluster,
        Topology::RedLock,
        Topology::Postgres,
        Topology::PostgresAdvisory,
        Topology::Mariadb,
        Topology::MariadbAdvisory,
        Topology::Zookeeper,
        Topology::Zookeeper3,
        Topology::Etcd,
        Topology::Etcd3,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Sqlite => "sqlite",
            Topology::Redis => "redis",
            Topology::RedisAof => "redis-aof",
            Topology::Sentinel => "sentinel",
            Topology::Cluster => "cluster",
            Topology::RedLock => "redlock",
            Topology::Postgres => "postgres",
            Topology::PostgresAdvisory => "postgres-advisory",
            Topology::Mariadb => "mariadb",
            Topology::MariadbAdvisory => "mariadb-advisory",
            Topology::Zookeeper => "zookeeper",
            Topology::Zookeeper3 => "zookeeper3",
            Topology::Etcd => "etcd",
            Topology::Etcd3 => "etcd3",
        }
    }

    /// Parses a name from [`Topology::name`].
    pub fn parse(s: &str) -> Result<Topology, String> {
        Topology::ALL
            .into_iter()
            .find(|t| t.name() == s.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = Topology::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "unknown topology {s:?}; the topologies are {}",
                    names.join(", ")
                )
            })
    }

    /// Whether the run can inject `fault` into this topology's servers.
    pub fn takes(self, fault: Fault) -> bool {
        use Topology as T;
        match fault {
            Fault::Restart => !matches!(self, T::Sqlite | T::Sentinel | T::Zookeeper3 | T::Etcd3),
            Fault::Leader | Fault::Quorum => matches!(self, T::Zookeeper3 | T::Etcd3),
            Fault::Stall => self != T::Sqlite,
            Fault::Failover => self == T::Sentinel,
            // Only where a small file system can be mounted to fill (as
            // root, with the right to mount: not in every container).
            Fault::Disk => self == T::Sqlite && can_mount_tmpfs(),
            // A limit to fill behind one proxied address: etcd has none.
            Fault::Exhaust => self.one_endpoint() && self != T::Etcd,
            _ => true,
        }
    }

    /// The family of backends it belongs to.
    pub fn family(self) -> Family {
        use Topology as T;
        match self {
            T::Sqlite => Family::Sqlite,
            T::Redis | T::RedisAof => Family::Redis,
            T::Sentinel => Family::Sentinel,
            T::Cluster => Family::Cluster,
            T::RedLock => Family::RedLock,
            T::Postgres | T::Mariadb => Family::SqlLease,
            T::PostgresAdvisory | T::MariadbAdvisory => Family::SqlAdvisory,
            T::Zookeeper | T::Zookeeper3 => Family::ZooKeeper,
            T::Etcd | T::Etcd3 => Family::Etcd,
        }
    }

    /// Whether its clients reach it on one host:port, so a proxy can
    /// stand in front of it.
    pub fn one_endpoint(self) -> bool {
        use Topology as T;
        matches!(
            self,
            T::Redis
                | T::RedisAof
                | T::Postgres
                | T::PostgresAdvisory
                | T::Mariadb
                | T::MariadbAdvisory
                | T::Zookeeper
                | T::Etcd
        )
    }

    /// Every fault a run on this topology can inject.
    pub fn faults(self) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|&f| {
                self.takes(f)
                    && super::expect(self.family(), Some(f)).is_some()
                    && (!f.needs_proxy() || self.one_endpoint())
            })
            .collect()
    }

    /// Starts it: servers on random loopback ports in temp dirs, stopped
    /// by PID when the value drops. Short session timeouts (3 s) so a
    /// run sees several faults heal.
    ///
    /// # Panics
    /// When a server will not start (the message says why); callers that
    /// must not panic catch it.
    pub fn start(self) -> Running {
        self.start_with(false)
    }

    /// [`start`](Topology::start), or with `defaults` the URL a user
    /// writes: the client's default session (10 s on etcd and ZooKeeper)
    /// rather than the short one.
    pub fn start_with(self, defaults: bool) -> Running {
        // A short session, for faults that wait one out: 3 s on etcd, 4 s
        // on ZooKeeper (the least its default tickTime of 2 s grants).
        let short = |param: &str| match (defaults, param) {
            (true, _) => String::new(),
            (false, "session_timeout") => format!("?{param}=4s"),
            (false, _) => format!("?{param}=3s"),
        };
        use Topology as T;
        let (servers, url) = match self {
            T::Sqlite => {
                let dir = tempfile::tempdir().expect("a temp dir for SQLite");
                // On a file system of its own, for the disk fault.
                let mounted = can_mount_tmpfs() && mount_tmpfs(dir.path(), "64m");
                let url = format!("sqlite://{}", dir.path().join("locks.db").display());
                (Servers::Sqlite(LockDir { dir, mounted }), url)
            }
            T::Redis | T::RedisAof => {
                let s = if self == T::RedisAof {
                    RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "everysec"])
                } else {
                    RedisServer::start()
                };
                let url = s.url();
                (Servers::Redis(s), url)
            }
            T::Sentinel => {
                let g = RedisSentinel::start();
                let url = g.url();
                (Servers::Sentinel(g), url)
            }
            T::Cluster => {
                let c = RedisCluster::start(3);
                let url = c.url();
                (Servers::Cluster(c), url)
            }
            T::RedLock => {
                let m = RedisMasters::start(5);
                let url = m.url();
                (Servers::RedLock(m), url)
            }
            T::Postgres | T::PostgresAdvisory => {
                let s = PgServer::start();
                let q = if self == T::PostgresAdvisory {
                    "?mode=advisory"
                } else {
                    ""
                };
                let url = format!("{}{q}", s.url());
                (Servers::Postgres(s), url)
            }
            T::Mariadb | T::MariadbAdvisory => {
                let s = MariaDb::start();
                let q = if self == T::MariadbAdvisory {
                    "?mode=advisory"
                } else {
                    ""
                };
                let url = format!("{}{q}", s.url());
                (Servers::Mariadb(s), url)
            }
            T::Zookeeper | T::Zookeeper3 => {
                let z = ZkEnsemble::start_n(if self == T::Zookeeper { 1 } else { 3 });
                let url = format!("{}{}", z.url(), short("session_timeout"));
                (Servers::Zk(z), url)
            }
            T::Etcd | T::Etcd3 => {
                let c = EtcdCluster::start_n(if self == T::Etcd { 1 } else { 3 });
                let url = format!("{}{}", c.url(), short("lease_ttl"));
                (Servers::Etcd(c), url)
            }
        };
        Running {
            topology: self,
            url,
            servers,
            down: Down::None,
        }
    }
}

enum Servers {
    /// The lock file's directory, a tmpfs of its own when `mounted`.
    Sqlite(LockDir),
    Redis(RedisServer),
    Sentinel(RedisSentinel),
    Cluster(RedisCluster),
    RedLock(RedisMasters),
    Postgres(PgServer),
    Mariadb(MariaDb),
    Zk(ZkEnsemble),
    Etcd(EtcdCluster),
}

/// SQLite's directory: gone (unmounted first) with the run.
struct LockDir {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl LockDir {
    fn filler(&self) -> std::path::PathBuf {
        self.dir.path().join("filler")
    }
}

impl Drop for LockDir {
    fn drop(&mut self) {
        if self.mounted {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}

/// A started topology.
pub struct Running {
    /// What it is.
    pub topology: Topology,
    /// The backend URL its clients use.
    pub url: String,
    servers: Servers,
    /// What the fault in effect did, for `heal` to undo.
    down: Down,
}

/// A server fault in effect.
enum Down {
    None,
    /// These servers were killed.
    Killed(Vec<usize>),
    /// Every server is stopped (SIGSTOP).
    Stopped,
    /// The server's connection limit is filled.
    Full(super::exhaust::Hoard),
    /// The lock file's file system is full.
    DiskFull,
}

impl Running {
    /// Every server process of the topology that runs.
    fn processes(&self) -> Vec<&crate::servers::Server> {
        fn redis(v: &[RedisServer]) -> Vec<&crate::servers::Server> {
            v.iter().filter_map(|s| s.process()).collect()
        }
        match &self.servers {
            Servers::Sqlite(_) => Vec::new(),
            Servers::Redis(s) => s.process().into_iter().collect(),
            Servers::Sentinel(g) => [redis(&g.nodes), redis(&g.sentinels)].concat(),
            Servers::Cluster(c) => redis(&c.nodes),
            Servers::RedLock(m) => redis(&m.servers),
            Servers::Postgres(s) => s.process().into_iter().collect(),
            Servers::Mariadb(s) => s.process().into_iter().collect(),
            Servers::Zk(z) => (0..z.nodes.len()).filter_map(|i| z.process(i)).collect(),
            Servers::Etcd(c) => (0..c.members.len()).filter_map(|i| c.process(i)).collect(),
        }
    }

    /// Puts a server fault into effect: SIGKILL the server (restart), the
    /// leader (leader), the master (failover) or a majority (quorum), or
    /// SIGSTOP every server (stall). Returns what it did.
    pub fn fault(&mut self, fault: Fault) -> Result<String, String> {
        if !self.topology.takes(fault) {
            return Err(format!(
                "{} cannot take the fault {}",
                self.topology.name(),
                fault.name()
            ));
        }
        if fault == Fault::Stall {
            let stopped = self.processes();
            for p in &stopped {
                p.signal_group(nix::sys::signal::Signal::SIGSTOP);
            }
            let n = stopped.len();
            self.down = Down::Stopped;
            return Ok(format!("SIGSTOP {n} server(s)"));
        }
        if fault == Fault::Exhaust {
            let at = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
            use super::exhaust::Engine;
            let engine = match &self.servers {
                Servers::Redis(s) => Engine::Redis(at(s.port)),
                Servers::Postgres(s) => Engine::Postgres(s.url()),
                Servers::Mariadb(s) => Engine::Mariadb(s.url()),
                Servers::Zk(z) if z.nodes.len() == 1 => Engine::ZooKeeper(at(z.nodes[0].port)),
                _ => return Err(format!("{} has no limit to fill", self.topology.name())),
            };
            let (hoard, n) = super::exhaust::Hoard::fill(engine)?;
            self.down = Down::Full(hoard);
            return Ok(format!("{n} idle connections fill the server's limit"));
        }
        if fault == Fault::Disk {
            let Servers::Sqlite(d) = &self.servers else {
                return Err(format!("{} has no lock file", self.topology.name()));
            };
            if !d.mounted {
                return Err(
                    "the lock file is not on a file system of its own (mount failed)".into(),
                );
            }
            // The WAL emptied first: SQLite writes it again from its start
            // after a checkpoint, into space it already has, and a full
            // file system would change nothing; from empty, its next pages
            // need space the filler leaves none of.
            checkpoint(&d.dir.path().join("locks.db"))?;
            let n = fill(&d.filler())?;
            self.down = Down::DiskFull;
            return Ok(format!(
                "the lock file's file system filled ({n} bytes of filler)"
            ));
        }
        if fault == Fault::Quorum {
            // An election may be under way (the last fault healed a
            // moment ago): ask again for a few seconds.
            let ask = |servers: &Servers| match servers {
                Servers::Zk(z) => (z.leader(), z.nodes.len()),
                Servers::Etcd(c) => (c.leader(), c.members.len()),
                _ => (None, 0),
            };
            let mut asked = 0;
            let (leader, size) = loop {
                match ask(&self.servers) {
                    (Some(l), n) => break (l, n),
                    _ if asked < 25 => {
                        asked += 1;
                        std::thread::sleep(std::time::Duration::from_millis(200));
                    }
                    _ => return Err("no member says it leads".into()),
                }
            };
            let victims = vec![leader, (leader + 1) % size];
            for &i in &victims {
                match &mut self.servers {
                    Servers::Zk(z) => z.kill(i),
                    Servers::Etcd(c) => c.kill(i),
                    _ => {}
                }
            }
            self.down = Down::Killed(victims.clone());
            return Ok(format!(
                "SIGKILL members {victims:?} of {size} (the leader first)"
            ));
        }
        let (i, what) = match (&mut self.servers, fault) {
            (Servers::Redis(s), Fault::Restart) => {
                s.kill();
                (0, format!("redis-server :{}", s.port))
            }
            (Servers::Cluster(c), Fault::Restart) => {
                c.nodes[0].kill();
                (0, format!("cluster master :{}", c.nodes[0].port))
            }
            (Servers::RedLock(m), Fault::Restart) => {
                m.servers[0].kill();
                (0, format!("RedLock master :{}", m.servers[0].port))
            }
            (Servers::Postgres(s), Fault::Restart) => {
                s.kill();
                (0, "postgres".to_owned())
            }
            (Servers::Mariadb(s), Fault::Restart) => {
                s.kill();
                (0, format!("mariadbd :{}", s.port))
            }
            (Servers::Zk(z), f) => {
                let i = if f == Fault::Leader {
                    z.leader().ok_or("no ZooKeeper node says it leads")?
                } else {
                    0
                };
                z.kill(i);
                (i, format!("ZooKeeper node :{}", z.nodes[i].port))
            }
            (Servers::Etcd(c), f) => {
                let i = if f == Fault::Leader {
                    c.leader().ok_or("no etcd member says it leads")?
                } else {
                    0
                };
                c.kill(i);
                (i, format!("etcd member {i}"))
            }
            (Servers::Sentinel(g), Fault::Failover) => {
                let port = g.master_port().ok_or("the sentinels name no master")?;
                let i = g
                    .nodes
                    .iter()
                    .position(|n| n.port == port)
                    .ok_or("the master is not one of the group's nodes")?;
                g.nodes[i].kill();
                (i, format!("master :{port}"))
            }
            _ => {
                return Err(format!(
                    "{} cannot take {}",
                    self.topology.name(),
                    fault.name()
                ));
            }
        };
        self.down = Down::Killed(vec![i]);
        Ok(format!("SIGKILL {what}"))
    }

    /// How many connections fill the server's limit now, while
    /// [`Fault::Exhaust`] is in effect.
    pub fn hoarded(&self) -> Option<usize> {
        match &self.down {
            Down::Full(h) => Some(h.held()),
            _ => None,
        }
    }

    /// Heals the fault: starts the killed servers again on their data, or
    /// lets the stopped ones go on (SIGCONT).
    pub fn heal(&mut self) {
        let killed = match std::mem::replace(&mut self.down, Down::None) {
            Down::None => return,
            Down::Stopped => {
                for p in self.processes() {
                    p.signal_group(nix::sys::signal::Signal::SIGCONT);
                }
                return;
            }
            Down::Killed(v) => v,
            Down::Full(hoard) => {
                drop(hoard);
                return;
            }
            Down::DiskFull => {
                if let Servers::Sqlite(d) = &self.servers {
                    let _ = std::fs::remove_file(d.filler());
                }
                return;
            }
        };
        for i in killed {
            match &mut self.servers {
                Servers::Redis(s) => s.restart(),
                Servers::Cluster(c) => c.nodes[i].restart(),
                Servers::RedLock(m) => m.servers[i].restart(),
                Servers::Postgres(s) => s.restart(),
                Servers::Mariadb(s) => s.restart(),
                Servers::Zk(z) => z.restart(i),
                Servers::Etcd(c) => c.restart(i),
                Servers::Sentinel(g) => g.nodes[i].restart(),
                Servers::Sqlite(_) => {}
            }
        }
    }

    /// The single server's address when clients reach it on one port
    /// (what a proxy can stand in front of).
    pub fn single_endpoint(&self) -> Option<std::net::SocketAddr> {
        let port = match &self.servers {
            Servers::Redis(s) => s.port,
            Servers::Postgres(s) => s.port,
            Servers::Mariadb(s) => s.port,
            Servers::Zk(z) if z.nodes.len() == 1 => z.nodes[0].port,
            Servers::Etcd(c) if c.members.len() == 1 => c.members[0].port,
            _ => return None,
        };
        Some(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
    }
}

/// Writes `path` until its file system has no byte left; the bytes written.
fn fill(path: &std::path::Path) -> Result<u64, String> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let block = vec![0xa5u8; 64 * 1024];
    let mut n = 0u64;
    // Big blocks, then single bytes for the last partial block.
    for size in [block.len(), 4096, 1] {
        loop {
            match f.write_all(&block[..size]).and_then(|_| f.sync_data()) {
                Ok(()) => n += size as u64,
                Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ENOSPC as i32) => break,
                Err(e) => return Err(format!("filling {}: {e}", path.display())),
            }
        }
    }
    Ok(n)
}

/// Mounts a tmpfs of `size` at `at`.
fn mount_tmpfs(at: &std::path::Path, size: &str) -> bool {
    std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(at)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether this process can mount a tmpfs (tried once, on a temp dir).
fn can_mount_tmpfs() -> bool {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAN.get_or_init(|| {
        if !nix::unistd::Uid::effective().is_root() {
            return false;
        }
        let Ok(dir) = tempfile::tempdir() else {
            return false;
        };
        let ok = mount_tmpfs(dir.path(), "1m");
        if ok {
            let _ = std::process::Command::new("umount")
                .arg(dir.path())
                .status();
        }
        ok
    })
}

/// Checkpoints SQLite's WAL at `db` and truncates it to nothing.
fn checkpoint(db: &std::path::Path) -> Result<(), String> {
    let url = format!("sqlite://{}", db.display());
    let run = move || -> Result<(), String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            use sqlx::Connection;
            let e = |e: sqlx::Error| format!("checkpointing {url}: {e}");
            let mut c = sqlx::SqliteConnection::connect(&url).await.map_err(e)?;
            sqlx::query("PRAGMA busy_timeout = 5000")
                .execute(&mut c)
                .await
                .map_err(e)?;
            let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
                .fetch_one(&mut c)
                .await
                .map_err(e)?;
            let _ = c.close().await;
            if busy != 0 {
                return Err(format!("{url}: the WAL stayed busy; it was not emptied"));
            }
            Ok(())
        })
    };
    std::thread::spawn(run)
        .join()
        .map_err(|_| "the checkpoint's thread panicked".to_string())?
}
