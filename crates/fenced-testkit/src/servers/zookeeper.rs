//! ZooKeeper from Debian's `zookeeper`: a standalone server or an
//! ensemble, each node a JVM on random loopback ports in a temp dir.

use super::{Server, free_port};
use nix::sys::signal::Signal;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const READY: Duration = Duration::from_secs(60);
const JAR: &str = "/usr/share/java/zookeeper.jar";

/// One ZooKeeper node.
pub struct Node {
    /// Client port.
    pub port: u16,
    quorum: u16,
    election: u16,
    server: Option<Server>,
}

/// A ZooKeeper standalone server (one node) or ensemble.
pub struct ZkEnsemble {
    /// The nodes; node i has `myid` i + 1.
    pub nodes: Vec<Node>,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl ZkEnsemble {
    /// A fresh standalone server.
    pub fn start() -> ZkEnsemble {
        ZkEnsemble::start_n(1)
    }

    /// A fresh ensemble of `n` nodes (1: standalone).
    pub fn start_n(n: usize) -> ZkEnsemble {
        assert!(
            std::path::Path::new(JAR).exists(),
            "{JAR} is missing: run scripts/test, or `apt-get install zookeeper`"
        );
        let mut last = String::new();
        for _ in 0..3 {
            let tmp = tempfile::tempdir().expect("a temp dir for ZooKeeper");
            let mut e = ZkEnsemble {
                nodes: (0..n)
                    .map(|_| Node {
                        port: free_port(),
                        quorum: free_port(),
                        election: free_port(),
                        server: None,
                    })
                    .collect(),
                dir: tmp.path().to_owned(),
                _tmp: tmp,
            };
            for i in 0..n {
                e.spawn(i);
            }
            match (0..n).try_for_each(|i| e.wait(i)) {
                Ok(()) => return e,
                Err(err) => last = err,
            }
        }
        panic!("ZooKeeper would not start: {last}");
    }

    fn spawn(&mut self, i: usize) {
        let node_dir = self.dir.join(format!("n{}", i + 1));
        let data = node_dir.join("data");
        std::fs::create_dir_all(&data).expect("a ZooKeeper data dir");
        std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("write myid");
        // Debian's zoo.cfg timing (tickTime 2 s, initLimit 10, syncLimit
        // 5), so the session limits are the ones users get: from 4 s to
        // 40 s, a client's default 10 s granted as asked.
        let mut cfg = format!(
            "tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={}\n\
             clientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr,stat,mntr\n",
            data.display(),
            self.nodes[i].port
        );
        if self.nodes.len() > 1 {
            cfg.push_str("quorumListenOnAllIPs=false\n");
            for (j, n) in self.nodes.iter().enumerate() {
                cfg.push_str(&format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    j + 1,
                    n.quorum,
                    n.election
                ));
            }
        }
        let conf = node_dir.join("zoo.cfg");
        std::fs::write(&conf, cfg).expect("write zoo.cfg");
        let mut cmd = Command::new("java");
        cmd.args([
            "-Xmx128m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            &format!("{JAR}:/usr/share/java/slf4j-simple.jar"),
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
        ])
        .arg(&conf);
        let log = node_dir.join("zookeeper.log");
        self.nodes[i].server = Some(Server::start(cmd, &log, Signal::SIGTERM));
    }

    fn wait(&mut self, i: usize) -> Result<(), String> {
        let port = self.nodes[i].port;
        let server = self.nodes[i].server.as_mut().expect("spawned");
        server.wait_ready(READY, || {
            four_letter(port, "srvr").is_some_and(|s| s.contains("Mode:"))
        })
    }

    /// `zk://127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,...`, as ZooKeeper clients take it.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the node that says it leads (standalone counts).
    pub fn leader(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| {
            self.nodes[i].server.is_some()
                && four_letter(self.nodes[i].port, "srvr")
                    .is_some_and(|s| s.contains("Mode: leader") || s.contains("Mode: standalone"))
        })
    }

    /// Kills node `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut s) = self.nodes[i].server.take() {
            s.kill();
        }
    }

    /// Restarts a killed node with its data.
    pub fn restart(&mut self, i: usize) {
        self.spawn(i);
        if let Err(e) = self.wait(i) {
            panic!("ZooKeeper node {i} would not restart: {e}");
        }
    }

    /// Node `i`'s process, for SIGSTOP/SIGCONT.
    pub fn process(&self, i: usize) -> Option<&Server> {
        self.nodes[i].server.as_ref()
    }
}

/// A ZooKeeper four-letter word (`ruok`, `srvr`) over TCP; its answer.
pub fn four_letter(port: u16, word: &str) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(word.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}
