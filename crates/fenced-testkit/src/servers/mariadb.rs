//! MariaDB from Debian's `mariadb-server`: a server per fixture, from a
//! template data directory made once per machine.

use super::{Server, free_port, require};
use nix::sys::signal::Signal;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// One MariaDB server in a temp dir, user `root` with no password over TCP.
pub struct MariaDb {
    /// Its loopback port.
    pub port: u16,
    dir: PathBuf,
    /// `mariadbd` options beyond the test kit's own.
    args: Vec<String>,
    server: Option<Server>,
    _tmp: tempfile::TempDir,
}

fn template() -> PathBuf {
    let dir = std::env::temp_dir().join("fenced-mariadb-template");
    if dir.join("mysql").is_dir() {
        return dir;
    }
    let install = require("mariadb-install-db", "mariadb-server", &[]);
    let tmp = tempfile::Builder::new()
        .prefix("fenced-mariadb-install")
        .tempdir()
        .expect("a temp dir for mariadb-install-db");
    let data = tmp.path().join("data");
    super::output_of(
        Command::new(install)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args([
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ]),
        "mariadb-install-db",
    );
    if std::fs::rename(&data, &dir).is_err() {
        assert!(
            dir.join("mysql").is_dir(),
            "no MariaDB template at {}",
            dir.display()
        );
    }
    dir
}

impl MariaDb {
    /// A fresh server with the `mysql` database.
    pub fn start() -> MariaDb {
        MariaDb::start_with(Vec::new())
    }

    /// A fresh server that also speaks TLS with `certs`' server
    /// certificate; clients may still connect without it.
    #[cfg(feature = "tls")]
    pub fn start_tls(certs: &crate::tls::TestCerts) -> MariaDb {
        MariaDb::start_with(vec![
            format!("--ssl-cert={}", certs.cert.display()),
            format!("--ssl-key={}", certs.key.display()),
            format!("--ssl-ca={}", certs.ca.display()),
        ])
    }

    fn start_with(args: Vec<String>) -> MariaDb {
        let tmp = tempfile::tempdir().expect("a temp dir for MariaDB");
        let dir = tmp.path().to_owned();
        let status = Command::new("cp")
            .arg("-a")
            .arg(template())
            .arg(dir.join("data"))
            .status()
            .expect("run cp");
        assert!(status.success(), "copy the MariaDB template");
        let mut s = MariaDb {
            port: 0,
            dir,
            args,
            server: None,
            _tmp: tmp,
        };
        let mut last = String::new();
        for _ in 0..5 {
            s.port = free_port();
            match s.launch() {
                Ok(()) => return s,
                Err(e) => last = e,
            }
        }
        panic!("MariaDB would not start: {last}");
    }

    fn launch(&mut self) -> Result<(), String> {
        let bin = require("mariadbd", "mariadb-server", &["/usr/sbin"]);
        let d = &self.dir;
        let mut cmd = Command::new(bin);
        cmd.arg("--no-defaults")
            .arg("--user=root")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", d.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", d.join("mysqld.pid").display()))
            .arg(format!("--log-error={}", d.join("error.log").display()))
            // trx-commit=2 writes the redo log to the kernel at each commit
            // (flushing it once a second), so a killed server keeps every
            // grant it answered; 0 lost up to a second of them, and the
            // torture suite's restart fault caught the overlaps that made.
            .args([
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                "--innodb-flush-log-at-trx-commit=2",
                "--skip-name-resolve",
            ])
            .args(&self.args);
        let log = d.join(format!("mariadbd-{}.out", self.port));
        let mut server = Server::start(cmd, &log, Signal::SIGTERM);
        let port = self.port;
        let client = require("mariadb", "mariadb-client", &[]);
        server.wait_ready(Duration::from_secs(30), || {
            Command::new(&client)
                .args([
                    "--no-defaults",
                    "-h",
                    "127.0.0.1",
                    "-u",
                    "root",
                    "-e",
                    "select 1",
                    "-P",
                ])
                .arg(port.to_string())
                .output()
                .is_ok_and(|o| o.status.success())
        })?;
        self.server = Some(server);
        Ok(())
    }

    /// `mysql://root@127.0.0.1:PORT/mysql`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/mysql", self.port)
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

    /// Starts the server again on the same port and data.
    pub fn restart(&mut self) {
        self.server.take();
        let what = format!("MariaDB on port {}", self.port);
        super::relaunch(&what, || self.launch());
    }

    /// Runs SQL with the `mariadb` client and returns its output.
    pub fn sql(&self, sql: &str) -> String {
        let client = require("mariadb", "mariadb-client", &[]);
        let mut cmd = Command::new(client);
        cmd.args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
            .args(["-N", "-B", "-D", "mysql"])
            .arg(format!("-P{}", self.port))
            .arg("-e")
            .arg(sql);
        super::output_of(&mut cmd, "mariadb")
    }
}
