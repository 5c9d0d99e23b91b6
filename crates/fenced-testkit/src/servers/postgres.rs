//! PostgreSQL from Debian's `postgresql`: a server per fixture, started
//! from a template data directory made once per machine (initdb takes a
//! second; a copy takes a tenth of that). PostgreSQL refuses to run as
//! root, so as root the server runs as the `postgres` user.

use super::{Server, free_port, require};
use nix::sys::signal::Signal;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// One PostgreSQL server in a temp dir.
pub struct PgServer {
    /// Its loopback port.
    pub port: u16,
    data: PathBuf,
    /// `-c` settings beyond the test kit's own.
    settings: Vec<String>,
    server: Option<Server>,
    _tmp: tempfile::TempDir,
}

/// The directory with `initdb`, `postgres` and `pg_isready` (Debian keeps
/// them off PATH, under `/usr/lib/postgresql/<version>/bin`).
pub fn bin_dir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("postgres").is_file())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "PostgreSQL is not installed: run scripts/test (it installs the test servers) \
             or `apt-get install postgresql`"
        )
    })
}

/// The user the server runs as: `postgres` when we are root, else us.
fn run_as() -> Option<(u32, u32)> {
    if !nix::unistd::Uid::effective().is_root() {
        return None;
    }
    let u = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .expect("a `postgres` user (Debian's postgresql package makes one)");
    Some((u.uid.as_raw(), u.gid.as_raw()))
}

fn as_server_user(cmd: &mut Command) {
    if let Some((uid, gid)) = run_as() {
        cmd.uid(uid).gid(gid);
    }
}

fn chown_tree(path: &Path) {
    if let Some((uid, gid)) = run_as() {
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(path)
            .status()
            .expect("run chown");
        assert!(status.success(), "chown {}", path.display());
    }
}

/// A data directory made by initdb once, shared by every fixture on this
/// machine (made in a temp dir and renamed into place, so concurrent test
/// processes never see half of one).
fn template() -> PathBuf {
    let bin = bin_dir();
    let version = bin
        .parent()
        .and_then(|v| v.file_name())
        .map(|v| v.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("fenced-pg-template-{version}"));
    if dir.join("PG_VERSION").is_file() {
        return dir;
    }
    let tmp = tempfile::Builder::new()
        .prefix("fenced-pg-initdb")
        .tempdir()
        .expect("a temp dir for initdb");
    let data = tmp.path().join("data");
    chown_tree(tmp.path());
    let mut cmd = Command::new(bin.join("initdb"));
    cmd.arg("-D").arg(&data);
    cmd.args([
        "-A",
        "trust",
        "-U",
        "postgres",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C.UTF-8",
    ]);
    as_server_user(&mut cmd);
    super::output_of(&mut cmd, "initdb");
    // Another process may have won the race: then use its template.
    if std::fs::rename(&data, &dir).is_err() {
        assert!(
            dir.join("PG_VERSION").is_file(),
            "no PostgreSQL template at {}",
            dir.display()
        );
    }
    dir
}

impl PgServer {
    /// A fresh server with an empty `postgres` database, user `postgres`, trust auth.
    pub fn start() -> PgServer {
        PgServer::start_with(|_| Vec::new())
    }

    /// A fresh server that also speaks TLS (`ssl=on`) with `certs`'
    /// server certificate; clients may still connect without it.
    #[cfg(feature = "tls")]
    pub fn start_tls(certs: &crate::tls::TestCerts) -> PgServer {
        PgServer::start_with(|dir| {
            // The server reads them as its own user and wants the key
            // private: copies in its directory, owned with the rest.
            let copy = |from: &Path, name: &str| {
                let to = dir.join(name);
                std::fs::copy(from, &to).expect("copy a certificate file");
                format!("{}", to.display())
            };
            vec![
                "ssl=on".to_owned(),
                format!("ssl_cert_file={}", copy(&certs.cert, "server.pem")),
                format!("ssl_key_file={}", copy(&certs.key, "server.key")),
            ]
        })
    }

    /// A fresh server with `settings` (given the server's temp dir, where
    /// files it reads may be put) added to its `-c` settings.
    fn start_with(settings: impl FnOnce(&Path) -> Vec<String>) -> PgServer {
        let tmp = tempfile::tempdir().expect("a temp dir for PostgreSQL");
        let data = tmp.path().join("data");
        let status = Command::new("cp")
            .arg("-a")
            .arg(template())
            .arg(&data)
            .status()
            .expect("run cp");
        assert!(status.success(), "copy the PostgreSQL template");
        let settings = settings(tmp.path());
        chown_tree(tmp.path());
        let mut last = String::new();
        for _ in 0..5 {
            let mut s = PgServer {
                port: free_port(),
                data: data.clone(),
                settings: settings.clone(),
                server: None,
                _tmp: tempfile::tempdir().expect("a temp dir"),
            };
            match s.launch() {
                Ok(()) => {
                    s._tmp = tmp;
                    return s;
                }
                Err(e) => last = e,
            }
        }
        panic!("PostgreSQL would not start: {last}");
    }

    fn launch(&mut self) -> Result<(), String> {
        let bin = bin_dir();
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-p")
            .arg(self.port.to_string());
        // A commit reaches the kernel before it is acknowledged
        // (synchronous_commit=on), so a killed server keeps every grant it
        // answered; the torture suite's restart fault relies on that. Only
        // the fsync, which guards against losing the machine, is skipped.
        for c in [
            "listen_addresses=127.0.0.1",
            "unix_socket_directories=",
            "fsync=off",
            "synchronous_commit=on",
            "full_page_writes=off",
        ] {
            cmd.arg("-c").arg(c);
        }
        for c in &self.settings {
            cmd.arg("-c").arg(c);
        }
        as_server_user(&mut cmd);
        let log = self.log_path();
        // The log file is opened by us (root) before the user switch.
        let mut server = Server::start(cmd, &log, Signal::SIGINT);
        let (port, ready_bin) = (self.port, bin.join("pg_isready"));
        server.wait_ready(Duration::from_secs(30), || {
            Command::new(&ready_bin)
                .args(["-h", "127.0.0.1", "-U", "postgres", "-q", "-p"])
                .arg(port.to_string())
                .status()
                .is_ok_and(|s| s.success())
        })?;
        self.server = Some(server);
        Ok(())
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs SQL with `psql` as the superuser and returns its output
    /// (unaligned, tuples only).
    pub fn sql(&self, sql: &str) -> String {
        let psql = require("psql", "postgresql-client", &[]);
        let mut cmd = Command::new(psql);
        cmd.args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.url())
            .arg("-c")
            .arg(sql);
        super::output_of(&mut cmd, "psql")
    }

    /// The server's log (its stderr), where errors land at the server's
    /// default `log_min_messages`.
    pub fn log_path(&self) -> PathBuf {
        self.data
            .with_file_name(format!("postgres-{}.log", self.port))
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
        let what = format!("PostgreSQL on port {}", self.port);
        super::relaunch(&what, || self.launch());
    }
}
