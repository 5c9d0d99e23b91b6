//! Real servers for the backend tests: each is a direct child of the test
//! process, on a random loopback port, with its data in a temp dir, and is
//! stopped by PID when its handle drops.
//!
//! Servers also die with the thread that started them (`PR_SET_PDEATHSIG`),
//! so a test runner killed mid-run leaves no server behind.

pub mod etcd;
pub mod mariadb;
pub mod postgres;
pub mod redis;
pub mod zookeeper;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1, reserved for this process until it
/// exits, so that no other test process of this machine is handed it.
///
/// The kernel may offer a port again as soon as its probe socket closes,
/// and the test runner starts each test in a process of its own. Two
/// tests once got the same port: the second one's server could not bind
/// it, but its readiness probe was answered by the first one's server,
/// and the test ran against that server until its own test ended and
/// stopped it. (Earlier, two members of one cluster got the same port in
/// one process.) So each port handed out is held by an advisory lock on a
/// file named after it in a directory shared by the machine's test
/// processes; the lock goes with the process, whichever way it ends.
/// A process outside the test kit may still take the port before the
/// server binds it: [`Server::start`] callers retry with a new port when
/// the server exits at once.
///
/// Ports come from below the kernel's ephemeral range where it leaves
/// room (Linux's default starts at 32768), not from it: while a server
/// is down for a restart fault, an outgoing connection could be given
/// its port as a source port, and a client reconnecting to it could even
/// connect to itself (TCP's simultaneous open), so that the server could
/// not bind its port again. A ZooKeeper member once failed to restart
/// so ("Address already in use").
pub fn free_port() -> u16 {
    // Lock files whose locks this process holds: kept open until it exits.
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let below = below_ephemeral();
    for _ in 0..1000 {
        let port = match &below {
            Some(range) => {
                let port = fastrand::u16(range.clone());
                if TcpListener::bind(("127.0.0.1", port)).is_err() {
                    continue;
                }
                port
            }
            None => TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free loopback port"),
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(reservation(port));
        let Ok(file) = file else {
            // Another user's directory: the port goes unreserved.
            return port;
        };
        // A second open file of this process conflicts too, so a port this
        // process holds already is refused like another process's.
        if file.try_lock().is_ok() {
            held.push(file);
            return port;
        }
    }
    panic!("no loopback port that no test process holds already");
}

/// The ports below the kernel's ephemeral range, from 10000, if it
/// leaves at least a thousand there.
fn below_ephemeral() -> Option<std::ops::Range<u16>> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u16 = range.split_whitespace().next()?.parse().ok()?;
    (low >= 11_000).then_some(10_000..low)
}

/// The file whose lock reserves `port` (see [`free_port`]).
fn reservation(port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join("fenced-testkit-ports");
    let _ = std::fs::create_dir_all(&dir);
    dir.join(port.to_string())
}

/// The path of `bin` on `PATH` (or in `extra_dirs`), or a panic that says
/// how to install it.
pub fn require(bin: &str, package: &str, extra_dirs: &[&str]) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra_dirs.iter().map(PathBuf::from))
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{bin} is not installed: run scripts/test (it installs the test servers) \
                 or `apt-get install {package}`"
            )
        })
}

/// One server process.
pub struct Server {
    child: Child,
    stop: nix::sys::signal::Signal,
    log: PathBuf,
    what: String,
}

impl Server {
    /// Starts `cmd` with stdout and stderr appended to `log`, in its own
    /// process group, to be stopped with `stop`.
    pub fn start(mut cmd: Command, log: &Path, stop: nix::sys::signal::Signal) -> Server {
        use std::os::unix::process::CommandExt;
        let what = format!("{:?}", cmd.get_program());
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let err = out.try_clone().expect("dup a log file handle");
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        cmd.process_group(0);
        die_with_parent(&mut cmd);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        Server {
            child,
            stop,
            log: log.to_owned(),
            what,
        }
    }

    /// The server's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// The end of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Polls `ready` every 20 ms until it holds; `Err` with the log if the
    /// process exits first or `limit` passes.
    pub fn wait_ready(
        &mut self,
        limit: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), String> {
        let until = Instant::now() + limit;
        loop {
            if ready() {
                return Ok(());
            }
            if self.exited() {
                return Err(format!(
                    "{} exited at start:\n{}",
                    self.what,
                    self.log_tail()
                ));
            }
            if Instant::now() > until {
                return Err(format!(
                    "{} not ready after {limit:?}:\n{}",
                    self.what,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a signal (SIGSTOP, SIGCONT, SIGKILL...) to the server.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig);
    }

    /// Sends a signal to the server's whole process group (it was started
    /// in one of its own): PostgreSQL's backends with their postmaster.
    pub fn signal_group(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(self.child.id() as i32), sig);
    }

    /// Stops the server with its stop signal, then SIGKILL after 5 s, and reaps it.
    pub fn stop(&mut self) {
        if self.exited() {
            return;
        }
        self.signal(nix::sys::signal::Signal::SIGCONT);
        self.signal(self.stop);
        let until = Instant::now() + Duration::from_secs(5);
        while !self.exited() {
            if Instant::now() > until {
                self.signal(nix::sys::signal::Signal::SIGKILL);
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills the server at once (SIGKILL) and reaps it: a crash.
    pub fn kill(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Calls `launch` until it succeeds (a stopped server's port may linger
/// for a moment), up to 5 s; panics with the last error naming `what`.
/// Runs `cmd` (`what`, for the message) to its end; its output, trimmed.
/// Panics with its error output if it fails.
pub(crate) fn output_of(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub(crate) fn relaunch(what: &str, mut launch: impl FnMut() -> Result<(), String>) {
    let mut last = String::new();
    for _ in 0..50 {
        match launch() {
            Ok(()) => return,
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what} would not restart: {last}");
}

#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls prctl(2), which is async-signal-safe and touches no memory of
    // the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_handed_out_stays_reserved() {
        let port = free_port();
        let other = std::fs::OpenOptions::new()
            .write(true)
            .open(reservation(port))
            .unwrap();
        assert!(
            other.try_lock().is_err(),
            "port {port} can be taken by another holder"
        );
        assert_ne!(free_port(), port);
        if let Some(range) = below_ephemeral() {
            assert!(
                range.contains(&port),
                "{port} is not below the ephemeral range"
            );
        }
    }
}
