//! Redis topologies from Debian's `redis-server`: one master, independent
//! masters for RedLock, a Sentinel group and a Cluster.

use super::{Server, free_port, require};
use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const READY: Duration = Duration::from_secs(20);

/// One `redis-server` without persistence (unless started with other args).
pub struct RedisServer {
    /// Its loopback port.
    pub port: u16,
    dir: PathBuf,
    conf: Option<PathBuf>,
    args: Vec<String>,
    server: Option<Server>,
    _tmp: Option<tempfile::TempDir>,
}

impl RedisServer {
    /// A fresh master with no persistence.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// A fresh master with no persistence that also listens for TLS on a
    /// port of its own ([`tls_url`](Self::tls_url)), with `certs`' server
    /// certificate; clients need no certificate.
    #[cfg(feature = "tls")]
    pub fn start_tls(certs: &crate::tls::TestCerts) -> RedisServer {
        let port = free_port().to_string();
        let path = |p: &Path| p.display().to_string();
        let (cert, key, ca) = (path(&certs.cert), path(&certs.key), path(&certs.ca));
        RedisServer::start_with(&[
            "--tls-port",
            &port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ])
    }

    /// `rediss://127.0.0.1:TLS_PORT` of a server started with
    /// [`start_tls`](Self::start_tls).
    #[cfg(feature = "tls")]
    pub fn tls_url(&self) -> String {
        let port = self
            .args
            .iter()
            .skip_while(|a| *a != "--tls-port")
            .nth(1)
            .expect("a server started with start_tls");
        format!("rediss://127.0.0.1:{port}")
    }

    /// A fresh server with extra `redis-server` arguments.
    pub fn start_with(args: &[&str]) -> RedisServer {
        let tmp = tempfile::tempdir().expect("a temp dir for redis");
        let mut s = RedisServer::start_in(tmp.path(), None, args);
        s._tmp = Some(tmp);
        s
    }

    fn start_in(dir: &Path, conf: Option<PathBuf>, args: &[&str]) -> RedisServer {
        let mut last = String::new();
        for _ in 0..5 {
            let mut s = RedisServer {
                port: free_port(),
                dir: dir.to_owned(),
                conf: conf.clone(),
                args: args.iter().map(|a| a.to_string()).collect(),
                server: None,
                _tmp: None,
            };
            match s.launch() {
                Ok(()) => return s,
                Err(e) => last = e,
            }
        }
        panic!("redis-server would not start: {last}");
    }

    fn launch(&mut self) -> Result<(), String> {
        let bin = require("redis-server", "redis-server", &[]);
        let mut cmd = Command::new(bin);
        // redis-server wants its config file, if any, first.
        cmd.args(&self.conf);
        cmd.arg("--port").arg(self.port.to_string());
        cmd.args([
            "--bind",
            "127.0.0.1",
            "--daemonize",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        cmd.arg("--dir").arg(&self.dir);
        cmd.args(["--protected-mode", "yes", "--enable-debug-command", "local"]);
        cmd.args(&self.args);
        let log = self.dir.join(format!("redis-{}.log", self.port));
        let mut server = Server::start(cmd, &log, Signal::SIGTERM);
        let port = self.port;
        server.wait_ready(READY, || ping(port))?;
        self.server = Some(server);
        Ok(())
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Runs one command and returns its reply.
    pub fn cmd(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        cmd_at(self.port, args)
    }

    /// The server process, while it runs.
    pub fn process(&self) -> Option<&Server> {
        self.server.as_ref()
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.kill();
        }
    }

    /// Stops the server (SIGTERM).
    pub fn stop(&mut self) {
        self.server.take();
    }

    /// Starts the server again on the same port and data dir.
    pub fn restart(&mut self) {
        self.server.take();
        let what = format!("redis-server on port {}", self.port);
        super::relaunch(&what, || self.launch());
    }
}

/// Runs one command on the server at `port`.
pub fn cmd_at(port: u16, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut con = client.get_connection_with_timeout(Duration::from_secs(2))?;
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(&mut con)
}

/// The server answers (a password-protected one answers NOAUTH).
fn ping(port: u16) -> bool {
    match cmd_at(port, &["PING"]) {
        Ok(redis::Value::SimpleString(s)) => s == "PONG",
        Err(e) => e.code() == Some("NOAUTH") || e.to_string().contains("NOAUTH"),
        Ok(_) => false,
    }
}

fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    let v = cmd_at(port, &["INFO", section]).ok()?;
    let text: String = redis::from_redis_value(v).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|s| s.trim().to_owned())
    })
}

/// Independent masters for RedLock.
pub struct RedisMasters {
    /// The masters.
    pub servers: Vec<RedisServer>,
}

impl RedisMasters {
    /// `n` fresh masters.
    pub fn start(n: usize) -> RedisMasters {
        RedisMasters {
            servers: (0..n).map(|_| RedisServer::start()).collect(),
        }
    }

    /// `redlock://127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.servers.iter().map(RedisServer::addr).collect();
        format!("redlock://{}", hosts.join(","))
    }
}

/// A Sentinel group: one master, two replicas, three sentinels watching
/// the service `mymaster`.
pub struct RedisSentinel {
    /// The data nodes; index 0 starts as master.
    pub nodes: Vec<RedisServer>,
    /// The sentinels.
    pub sentinels: Vec<RedisServer>,
}

/// The service name sentinels watch.
pub const SERVICE: &str = "mymaster";

impl RedisSentinel {
    /// Starts the group and waits until the sentinels know the master and
    /// both replicas are in sync.
    pub fn start() -> RedisSentinel {
        let master = RedisServer::start();
        let replicaof = format!("127.0.0.1 {}", master.port);
        let mut nodes = vec![master];
        for _ in 0..2 {
            let r = RedisServer::start_with(&["--replicaof", &replicaof]);
            nodes.push(r);
        }
        for r in &mut nodes[1..] {
            let port = r.port;
            r.server
                .as_mut()
                .expect("running")
                .wait_ready(READY, || {
                    info_field(port, "replication", "master_link_status").as_deref() == Some("up")
                })
                .expect("replica in sync");
        }
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let tmp = tempfile::tempdir().expect("a temp dir for a sentinel");
            let conf = tmp.path().join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "sentinel monitor {SERVICE} 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds {SERVICE} 1000\n\
                     sentinel failover-timeout {SERVICE} 4000\n\
                     sentinel parallel-syncs {SERVICE} 2\n",
                    nodes[0].port
                ),
            )
            .expect("write sentinel.conf");
            let mut s = RedisServer::start_in(tmp.path(), Some(conf), &["--sentinel"]);
            s._tmp = Some(tmp);
            sentinels.push(s);
        }
        let group = RedisSentinel { nodes, sentinels };
        for s in &group.sentinels {
            let port = s.port;
            let probe = || {
                cmd_at(port, &["SENTINEL", "replicas", SERVICE])
                    .ok()
                    .and_then(|v| match v {
                        redis::Value::Array(a) => Some(a.len() >= 2),
                        _ => None,
                    })
                    .unwrap_or(false)
            };
            let until = std::time::Instant::now() + READY;
            while !probe() {
                assert!(
                    std::time::Instant::now() < until,
                    "sentinel never saw the replicas"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        group
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/mymaster`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.sentinels.iter().map(RedisServer::addr).collect();
        format!("redis+sentinel://{}/{SERVICE}", hosts.join(","))
    }

    /// The port of the current master, as the first sentinel reports it.
    pub fn master_port(&self) -> Option<u16> {
        let v = cmd_at(
            self.sentinels[0].port,
            &["SENTINEL", "get-master-addr-by-name", SERVICE],
        )
        .ok()?;
        let addr: Vec<String> = redis::from_redis_value(v).ok()?;
        addr.get(1)?.parse().ok()
    }
}

/// A Redis Cluster of `n` masters, slots split evenly, and as many
/// replicas (none, or one per master).
pub struct RedisCluster {
    /// The masters, then the replicas (replica `n + i` follows master `i`).
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `n` masters, no replicas: starts the nodes, assigns slots, joins
    /// them and waits for `cluster_state:ok` everywhere.
    pub fn start(n: usize) -> RedisCluster {
        RedisCluster::start_with_replicas(n, false)
    }

    /// `n` masters and, with `replicas`, one replica each, in sync.
    pub fn start_with_replicas(n: usize, replicas: bool) -> RedisCluster {
        let total = if replicas { 2 * n } else { n };
        let nodes: Vec<RedisServer> = (0..total)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        for (i, s) in nodes[..n].iter().enumerate() {
            let lo = 16384 * i / n;
            let hi = 16384 * (i + 1) / n - 1;
            s.cmd(&["CLUSTER", "ADDSLOTSRANGE", &lo.to_string(), &hi.to_string()])
                .expect("CLUSTER ADDSLOTSRANGE");
        }
        for s in &nodes[1..] {
            nodes[0]
                .cmd(&["CLUSTER", "MEET", "127.0.0.1", &s.port.to_string()])
                .expect("CLUSTER MEET");
        }
        let until = std::time::Instant::now() + READY;
        for s in &nodes {
            while info_cluster(s.port, total).as_deref() != Some("ok") {
                assert!(std::time::Instant::now() < until, "cluster never became ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for i in 0..total.saturating_sub(n) {
            let id: String =
                redis::from_redis_value(nodes[i].cmd(&["CLUSTER", "MYID"]).expect("CLUSTER MYID"))
                    .expect("a node id");
            let replica = &nodes[n + i];
            while replica.cmd(&["CLUSTER", "REPLICATE", &id]).is_err() {
                // The replica learns the master's id by gossip first.
                assert!(
                    std::time::Instant::now() < until,
                    "a replica never followed"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            while info_field(replica.port, "replication", "master_link_status").as_deref()
                != Some("up")
            {
                assert!(std::time::Instant::now() < until, "a replica never synced");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        RedisCluster { nodes }
    }

    /// `redis+cluster://127.0.0.1:P1,...`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(RedisServer::addr).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }
}

fn info_cluster(port: u16, n: usize) -> Option<String> {
    let v = cmd_at(port, &["CLUSTER", "INFO"]).ok()?;
    let text: String = redis::from_redis_value(v).ok()?;
    let ok = text.lines().find_map(|l| {
        l.strip_prefix("cluster_state:")
            .map(|s| s.trim().to_owned())
    })?;
    let known: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("cluster_known_nodes:"))
        .and_then(|s| s.trim().parse().ok())?;
    let slots: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("cluster_slots_ok:"))
        .and_then(|s| s.trim().parse().ok())?;
    (known == n && slots == 16384).then_some(ok)
}
