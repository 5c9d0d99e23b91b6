//! The foreign clients fenced interoperates with, run as they are run in
//! production: redis-py's `Lock` (Debian's `python3-redis`) and Apache
//! Curator's `InterProcessMutex` (Debian's `libcurator-recipes-java`).
//! Their small driver programs live in this crate's `interop/` folder.

use std::io::Write;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// A driver program in `interop/`.
fn driver(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("interop")
        .join(path)
}

/// A Python that has redis-py: Debian's `python3-redis` goes with
/// `/usr/bin/python3`, which may not be the first `python3` on PATH.
fn python() -> PathBuf {
    for p in ["/usr/bin/python3", "python3"] {
        let ok = Command::new(p)
            .args(["-c", "import redis"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return PathBuf::from(p);
        }
    }
    panic!("no python3 with redis-py: run scripts/test, or `apt-get install python3-redis`");
}

/// redis-py's `Lock` on `name` at the Redis of `port`, doing `args`
/// (`try`, `hold <ms>`, `loop <rounds> <file>`: see `interop/py`).
pub fn redis_py(port: u16, name: &str, args: &[&str]) -> Command {
    let mut c = Command::new(python());
    c.arg(driver("py/redis_py_lock.py"))
        .arg(port.to_string())
        .arg(name)
        .args(args);
    c
}

/// What redis-py's `Lock` says when it tries `name` once: `acquired` or
/// `busy`.
pub fn redis_py_try(port: u16, name: &str) -> String {
    let out = redis_py(port, name, &["try"]).output().expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Curator's mutex on `path` at the ZooKeeper `connect`, holding it
/// `hold_ms` once it has it; its output says what it did, a line a step.
pub fn curator(connect: &str, path: &str, hold_ms: u64) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new("java")
        .arg("-cp")
        .arg("/usr/share/java/curator-recipes.jar:/usr/share/java/slf4j-nop.jar")
        .arg(driver("java/CuratorLock.java"))
        .args([connect, path, &hold_ms.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run java (Debian's default-jdk-headless)");
    let out = BufReader::new(child.stdout.take().expect("piped"));
    (child, out)
}

/// The next line a driver printed.
pub fn next_line(out: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    out.read_line(&mut line).expect("the driver's output");
    line.trim().to_owned()
}

/// Curator's other recipes (counters, barrier, leader latch) in one JVM
/// at the ZooKeeper `connect`, driven a command a line (see
/// `interop/java/CuratorRecipes.java` for the commands). Blocking: run it
/// in `spawn_blocking` where fenced must act while it waits. Killed when
/// dropped.
pub struct CuratorRecipes {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl CuratorRecipes {
    /// Starts the driver and waits until it is connected.
    pub fn start(connect: &str) -> CuratorRecipes {
        let mut child = Command::new("java")
            .arg("-cp")
            .arg("/usr/share/java/curator-recipes.jar:/usr/share/java/slf4j-nop.jar")
            .arg(driver("java/CuratorRecipes.java"))
            .arg(connect)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run java (Debian's default-jdk-headless)");
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut c = CuratorRecipes {
            child,
            stdin,
            stdout,
        };
        assert_eq!(c.line(), "ready");
        c
    }

    /// Sends `command` without reading its answer.
    pub fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("the driver's stdin");
        self.stdin.flush().expect("the driver's stdin");
    }

    /// The next line the driver says.
    pub fn line(&mut self) -> String {
        next_line(&mut self.stdout)
    }

    /// Sends `command` and returns its one-line answer.
    pub fn ask(&mut self, command: &str) -> String {
        self.send(command);
        self.line()
    }
}

impl Drop for CuratorRecipes {
    fn drop(&mut self) {
        // Asked to quit, it closes its latches and its session; killed if
        // it has not within a few seconds.
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
