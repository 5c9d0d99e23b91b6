//! Real `fenced` processes for multi-process tests, signalled only by PID.

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Starts `fenced run` holding `name` on `url` while `cmd` runs, in its own
/// process group so that the whole group can be killed.
pub fn spawn_run(bin: &Path, url: &str, name: &str, extra: &[&str], cmd: &[&str]) -> Child {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(bin);
    c.arg("run").arg("--backend").arg(url).arg(name);
    c.args(extra).arg("--").args(cmd);
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c.process_group(0);
    c.spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()))
}

/// Waits up to `limit` for `child` to exit and returns its exit code
/// (`None` if a signal ended it). Past the limit it kills the group and
/// panics with `what` and the child's standard error, so that a child
/// stuck waiting for a lock the test holds fails the test instead of
/// hanging it.
pub fn exit_within(child: &mut Child, limit: std::time::Duration, what: &str) -> Option<i32> {
    use std::io::Read;
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            return status.code();
        }
        if std::time::Instant::now() >= deadline {
            kill_group(child);
            let mut err = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut err);
            }
            panic!("{what}: still running after {limit:?}; its stderr:\n{err}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// SIGKILLs the process group led by `child` (started by [`spawn_run`]) and reaps it.
pub fn kill_group(child: &mut Child) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
    let _ = child.wait();
}

/// Debian's libfaketime (the `faketime` package), to run a process with
/// its wall clock moved (`LD_PRELOAD` it, with `FAKETIME` or
/// `FAKETIME_TIMESTAMP_FILE`); `None` where it is not installed.
pub fn libfaketime() -> Option<std::path::PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime",
        "/usr/lib/aarch64-linux-gnu/faketime",
        "/usr/lib/faketime",
    ]
    .iter()
    .map(|d| std::path::Path::new(d).join("libfaketime.so.1"))
    .find(|p| p.is_file())
}
