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
