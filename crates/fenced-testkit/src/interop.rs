//! The foreign clients fenced interoperates with, run as they are run in
//! production: redis-py's `Lock` (Debian's `python3-redis`) and Apache
//! Curator's `InterProcessMutex` (Debian's `libcurator-recipes-java`).
//! Their small driver programs live in this crate's `interop/` folder.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

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
