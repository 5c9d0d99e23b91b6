//! etcd from Debian's `etcd-server`: one member or a cluster, each member
//! on two random loopback ports (client and peer) in a temp dir.

use super::{Server, free_port, require};
use nix::sys::signal::Signal;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const READY: Duration = Duration::from_secs(30);

/// One etcd member.
pub struct Member {
    /// Client port.
    pub port: u16,
    /// Client port for TLS, if the cluster was started with it.
    pub tls_port: Option<u16>,
    peer: u16,
    name: String,
    server: Option<Server>,
}

/// An etcd cluster of one or more members.
pub struct EtcdCluster {
    /// The members, in start order.
    pub members: Vec<Member>,
    /// The server certificate and key of a cluster that speaks TLS.
    tls: Option<(PathBuf, PathBuf)>,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl EtcdCluster {
    /// A fresh single-member etcd.
    pub fn start() -> EtcdCluster {
        EtcdCluster::start_n(1)
    }

    /// A fresh cluster of `n` members.
    pub fn start_n(n: usize) -> EtcdCluster {
        EtcdCluster::start_with(n, None)
    }

    /// A fresh single member that also serves clients over TLS with
    /// `certs`' server certificate, on its `tls_port` ([`tls_url`](Self::tls_url)).
    #[cfg(feature = "tls")]
    pub fn start_tls(certs: &crate::tls::TestCerts) -> EtcdCluster {
        EtcdCluster::start_with(1, Some((certs.cert.clone(), certs.key.clone())))
    }

    fn start_with(n: usize, tls: Option<(PathBuf, PathBuf)>) -> EtcdCluster {
        let mut last = String::new();
        for _ in 0..5 {
            let tmp = tempfile::tempdir().expect("a temp dir for etcd");
            let mut c = EtcdCluster {
                members: (1..=n)
                    .map(|i| Member {
                        port: free_port(),
                        tls_port: tls.as_ref().map(|_| free_port()),
                        peer: free_port(),
                        name: format!("n{i}"),
                        server: None,
                    })
                    .collect(),
                tls: tls.clone(),
                dir: tmp.path().to_owned(),
                _tmp: tmp,
            };
            match c.launch_all() {
                Ok(()) => return c,
                Err(e) => last = e,
            }
        }
        panic!("etcd would not start: {last}");
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn launch_all(&mut self) -> Result<(), String> {
        for i in 0..self.members.len() {
            self.spawn(i, "new");
        }
        for i in 0..self.members.len() {
            self.wait(i)?;
        }
        Ok(())
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let bin = require("etcd", "etcd-server", &[]);
        let cluster = self.initial_cluster();
        let token = format!("fenced-{}", self.members[0].port);
        let m = &mut self.members[i];
        let data = self.dir.join(format!("{}.etcd", m.name));
        let mut client = format!("http://127.0.0.1:{}", m.port);
        if let Some(port) = m.tls_port {
            client.push_str(&format!(",https://127.0.0.1:{port}"));
        }
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let mut cmd = Command::new(bin);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &token])
            // etcd's own heartbeat (100 ms) and election timeout (1 s):
            // leader faults take as long as they do for users.
            .args(["--logger", "zap", "--log-level", "warn"]);
        if let Some((cert, key)) = &self.tls {
            cmd.arg("--cert-file").arg(cert).arg("--key-file").arg(key);
        }
        let log = self.dir.join(format!("etcd-{}.log", m.name));
        m.server = Some(Server::start(cmd, &log, Signal::SIGTERM));
    }

    fn wait(&mut self, i: usize) -> Result<(), String> {
        let port = self.members[i].port;
        let server = self.members[i].server.as_mut().expect("spawned");
        server.wait_ready(READY, || healthy(port))
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// `etcds://127.0.0.1:TLS_PORT,...` of a cluster started with
    /// [`start_tls`](Self::start_tls).
    #[cfg(feature = "tls")]
    pub fn tls_url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| {
                format!(
                    "127.0.0.1:{}",
                    m.tls_port.expect("a cluster started with TLS")
                )
            })
            .collect();
        format!("etcds://{}", hosts.join(","))
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,...` for `etcdctl --endpoints`.
    pub fn endpoints(&self) -> String {
        self.url().trim_start_matches("etcd://").to_owned()
    }

    /// The index of the current leader, by asking every live member.
    pub fn leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| {
            self.members[i].server.is_some()
                && etcdctl(
                    &format!("127.0.0.1:{}", self.members[i].port),
                    &["endpoint", "status", "-w", "fields"],
                )
                .is_some_and(|out| {
                    let field = |k: &str| {
                        out.lines()
                            .find(|l| l.starts_with(&format!("\"{k}\" :")))
                            .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
                    };
                    field("MemberID").is_some() && field("MemberID") == field("Leader")
                })
        })
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut s) = self.members[i].server.take() {
            s.kill();
        }
    }

    /// Restarts a killed member with its data.
    pub fn restart(&mut self, i: usize) {
        self.spawn(i, "existing");
        if let Err(e) = self.wait(i) {
            panic!("etcd member {i} would not restart: {e}");
        }
    }

    /// The member's process, for SIGSTOP/SIGCONT.
    pub fn process(&self, i: usize) -> Option<&Server> {
        self.members[i].server.as_ref()
    }
}

fn healthy(port: u16) -> bool {
    etcdctl(&format!("127.0.0.1:{port}"), &["endpoint", "health"]).is_some()
}

/// Runs `etcdctl` (API v3) against `endpoints`; its stdout if it succeeded.
pub fn etcdctl(endpoints: &str, args: &[&str]) -> Option<String> {
    let bin = require("etcdctl", "etcd-client", &[]);
    let out = Command::new(bin)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .arg("--command-timeout=2s")
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
