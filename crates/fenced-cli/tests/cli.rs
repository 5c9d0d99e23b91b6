//! The `fenced` command as a user runs it.

use std::process::{Command, Output};

fn fenced(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fenced"))
        .arg("--backend")
        .arg(url)
        .args(args)
        .output()
        .expect("run fenced")
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("locks.db").display())
}

#[test]
fn run_passes_token_and_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let out = fenced(
        &url,
        &[
            "run",
            "job",
            "--",
            "sh",
            "-c",
            "echo $FENCED_LOCK $FENCED_TOKEN; exit 7",
        ],
    );
    assert_eq!(out.status.code(), Some(7));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut words = text.split_whitespace();
    assert_eq!(words.next(), Some("job"));
    let token: u64 = words.next().unwrap().parse().unwrap();
    let status = fenced(&url, &["status", "job", "--json"]);
    // Free: 1, as `test` says false.
    assert_eq!(status.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["held"], false);
    assert_eq!(v["last_token"].as_u64(), Some(token));
}

#[test]
fn busy_lock_exits_75_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fenced"));
    let mut holder = fenced_testkit::process::spawn_run(bin, &url, "busy", &[], &["sleep", "30"]);
    let t = fenced_testkit::Timing::default();
    let deadline = std::time::Instant::now() + t.eventually();
    loop {
        let v: serde_json::Value =
            serde_json::from_slice(&fenced(&url, &["status", "busy", "--json"]).stdout).unwrap();
        if v["held"] == true {
            assert_eq!(v["holders"].as_array().unwrap().len(), 1);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the holder never took the lock"
        );
        std::thread::sleep(t.ms(20));
    }
    let out = fenced(&url, &["run", "busy", "--wait", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(75));
    assert!(String::from_utf8_lossy(&out.stderr).contains("busy"));
    let out = fenced(&url, &["run", "busy", "--wait", "200ms", "--", "true"]);
    assert_eq!(out.status.code(), Some(75));
    fenced_testkit::process::kill_group(&mut holder);
}

/// flock's habits: `-n`, `-w SECONDS`, `-E CODE`, `-s`; and a semaphore's
/// permits; and `status` as a test (0 held, 1 free).
#[test]
fn run_speaks_flock_and_status_is_a_test() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fenced"));
    let t = fenced_testkit::Timing::default();
    let wait_held = |name: &str, holders: usize| {
        let deadline = std::time::Instant::now() + t.eventually();
        loop {
            let out = fenced(&url, &["status", name, "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if v["holders"].as_array().unwrap().len() == holders {
                assert_eq!(out.status.code(), Some(0), "held: status says 0");
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name} never had {holders} holders"
            );
            std::thread::sleep(t.ms(20));
        }
    };
    // Two shared holders at once; an exclusive one is refused beside them.
    let mut r1 = fenced_testkit::process::spawn_run(bin, &url, "files", &["-s"], &["sleep", "30"]);
    wait_held("files", 1);
    let out = fenced(&url, &["run", "-s", "-n", "files", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a second shared holder: {out:?}"
    );
    let out = fenced(&url, &["run", "-n", "-E", "9", "files", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(9),
        "exclusive beside shared: {out:?}"
    );
    let out = fenced(&url, &["run", "-w", "0.2", "files", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "-w 0.2: {out:?}");
    fenced_testkit::process::kill_group(&mut r1);
    // 2 of 3 permits held: 1 more fits, 2 more do not.
    let mut p = fenced_testkit::process::spawn_run(
        bin,
        &url,
        "pool",
        &["--permits", "2", "--of", "3"],
        &["sleep", "30"],
    );
    wait_held("pool", 1);
    let out = fenced(
        &url,
        &[
            "run",
            "-n",
            "--permits",
            "1",
            "--of",
            "3",
            "pool",
            "--",
            "true",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "1 of the 3 left: {out:?}");
    let out = fenced(
        &url,
        &[
            "run",
            "-n",
            "--permits",
            "2",
            "--of",
            "3",
            "pool",
            "--",
            "true",
        ],
    );
    assert_eq!(out.status.code(), Some(75), "2 with 1 left: {out:?}");
    fenced_testkit::process::kill_group(&mut p);
    // Bad combinations are bad arguments.
    for args in [
        vec!["run", "-n", "-w", "1", "x", "--", "true"],
        vec![
            "run",
            "-s",
            "--permits",
            "1",
            "--of",
            "2",
            "x",
            "--",
            "true",
        ],
        vec!["run", "--permits", "1", "x", "--", "true"],
        vec!["run", "--permits", "3", "--of", "2", "x", "--", "true"],
        vec!["run", "-E", "0", "x", "--", "true"],
        vec!["run", "-w", "-1", "x", "--", "true"],
    ] {
        let out = fenced(&url, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}

/// `fenced list`: nothing on an empty backend; then each held lock, in
/// name order, as JSON lines under a prefix and as a table without one.
#[test]
fn list_shows_the_held_locks_as_a_table_and_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fenced"));
    let out = fenced(&url, &["list"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no lock held"));
    let mut holders: Vec<_> = ["jobs:a", "jobs:b", "other"]
        .iter()
        .map(|n| fenced_testkit::process::spawn_run(bin, &url, n, &[], &["sleep", "60"]))
        .collect();
    let t = fenced_testkit::Timing::default();
    let deadline = std::time::Instant::now() + t.eventually();
    let listed = loop {
        let out = fenced(&url, &["list", "jobs:", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if lines.len() == 2 {
            break lines;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never both held: {lines:?}"
        );
        std::thread::sleep(t.ms(20));
    };
    assert_eq!(listed[0]["name"], "jobs:a");
    assert_eq!(listed[1]["name"], "jobs:b");
    for (l, child) in listed.iter().zip(&holders) {
        assert_eq!(l["held"], true);
        assert_eq!(l["holders"][0]["mode"], "exclusive");
        assert_eq!(l["holders"][0]["token"], l["last_token"]);
        // Who holds: the `fenced run` process, and the command it runs.
        let who = &l["holders"][0]["holder"];
        assert_eq!(who["pid"], child.id(), "{l}");
        assert_eq!(who["command"], "sleep 60", "{l}");
        assert!(who["granted_at_ms"].as_u64().is_some_and(|t| t > 0), "{l}");
    }
    let out = fenced(&url, &["list"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three locks: {text}");
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("LEASE LEFT"),
        "{text}"
    );
    for ((line, name), child) in lines[1..]
        .iter()
        .zip(["jobs:a", "jobs:b", "other"])
        .zip(&holders)
    {
        assert!(
            line.starts_with(name)
                && line.contains("exclusive")
                && line.contains(&format!(" {}@", child.id()))
                && line.ends_with(" sleep 60"),
            "{text}"
        );
    }
    for h in &mut holders {
        fenced_testkit::process::kill_group(h);
    }
}

/// `tmux` on a server of this test's own, killed when dropped.
/// A tmux server of one test's own (its socket named for the process and
/// the session, so tests run as threads of one process do not share it),
/// whose one session is `session`.
struct Tmux {
    socket: String,
    session: &'static str,
}

impl Tmux {
    fn new(session: &'static str) -> Tmux {
        Tmux {
            socket: format!("fenced-test-{}-{session}", std::process::id()),
            session,
        }
    }

    /// Starts the session: a 160 × 20 terminal running `command`.
    fn start(&self, command: &[&str]) {
        let mut args = vec![
            "new-session",
            "-d",
            "-s",
            self.session,
            "-x",
            "160",
            "-y",
            "20",
            "--",
        ];
        args.extend_from_slice(command);
        let out = self.run(&args);
        assert!(out.status.success(), "{out:?}");
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux (Debian: tmux) runs the terminal tests")
    }

    /// Types `keys` (tmux's names: `Enter`, `C-z`) into the session.
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", self.session];
        args.extend_from_slice(keys);
        assert!(self.run(&args).status.success());
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", self.session]).stdout)
            .into_owned()
    }

    /// The screen, once it shows every one of `what`.
    fn shows(&self, what: &[&str]) -> String {
        let t = fenced_testkit::Timing::default();
        let deadline = std::time::Instant::now() + t.eventually();
        loop {
            let screen = self.screen();
            if what.iter().all(|w| screen.contains(w)) {
                return screen;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never showed {what:?}:\n{screen}"
            );
            std::thread::sleep(t.ms(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[test]
fn top_shows_the_locks_live_in_a_terminal_and_quits_on_q() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fenced"));
    // Not a terminal: told to use `list`, exit 2.
    let out = fenced(&url, &["top"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("fenced list"));

    let t = fenced_testkit::Timing::default();
    let mut first = fenced_testkit::process::spawn_run(bin, &url, "jobs:a", &[], &["sleep", "60"]);
    let tmux = Tmux::new("top");
    let bin = bin.to_str().unwrap();
    // Through sh, to keep top's exit code.
    let code = dir.path().join("code");
    let top = format!(
        "'{bin}' --backend '{url}' top jobs: --interval 200ms; echo $? > '{}'",
        code.display()
    );
    tmux.start(&["sh", "-c", &top]);
    let shows = |what: &[&str]| tmux.shows(what);
    let screen = shows(&["jobs:a", "exclusive", "1 held"]);
    assert!(screen.contains("fenced top: sqlite://"), "{screen}");
    // It looks again on its own: a lock taken later shows.
    let mut second =
        fenced_testkit::process::spawn_run(bin.as_ref(), &url, "jobs:b", &[], &["sleep", "60"]);
    shows(&["jobs:a", "jobs:b", "2 held"]);
    tmux.keys(&["q"]);
    let deadline = std::time::Instant::now() + t.eventually();
    while tmux.run(&["has-session", "-t", "top"]).status.success() {
        assert!(std::time::Instant::now() < deadline, "q did not quit");
        std::thread::sleep(t.ms(50));
    }
    let code = std::fs::read_to_string(&code).expect("top's exit code");
    assert_eq!(code.trim(), "0");
    for h in [&mut first, &mut second] {
        fenced_testkit::process::kill_group(h);
    }
}

/// `fenced run` from a terminal: CMD may read it (a password prompt, a
/// confirmation), Ctrl-Z stops CMD and fenced together as one job, `fg`
/// continues both, and Ctrl-C reaches CMD.
#[test]
fn run_from_a_terminal_lets_cmd_read_it_and_stops_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let bin = env!("CARGO_BIN_EXE_fenced");
    let tmux = Tmux::new("tty");
    tmux.start(&["bash", "--norc", "--noprofile", "-i"]);
    let run = format!(
        "'{bin}' --backend '{url}' run tty -- sh -c 'read l; echo got:$l; exec sleep 31.5'"
    );
    tmux.keys(&[&run, "Enter"]);
    let state = |pattern: &str| -> Option<char> {
        for p in std::fs::read_dir("/proc").unwrap().flatten() {
            let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline)
                .replace('\0', " ")
                .trim_end()
                == pattern
            {
                let stat = std::fs::read_to_string(p.path().join("stat")).unwrap_or_default();
                return stat.rsplit(')').next()?.trim_start().chars().next();
            }
        }
        None
    };
    let t = fenced_testkit::Timing::default();
    let until = |what: &str, ok: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + t.eventually();
        while !ok() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(t.ms(50));
        }
    };
    // Typed once CMD reads: typed ahead, while bash still had the terminal
    // raw for its line editor, the line was once neither echoed nor read.
    until("CMD never read the terminal", &|| {
        state("sh -c read l; echo got:$l; exec sleep 31.5") == Some('S')
    });
    // Before the fix CMD, in a background group, was stopped by its read.
    tmux.keys(&["hello", "Enter"]);
    tmux.shows(&["got:hello"]);
    let stopped = |why: &str| until(why, &|| state("sleep 31.5") == Some('T'));
    let running = |why: &str| until(why, &|| matches!(state("sleep 31.5"), Some('S' | 'R')));
    // CMD is the `sleep` it execs, not the `sh` that echoed.
    running("CMD never became sleep");
    tmux.keys(&["C-z"]);
    tmux.shows(&["Stopped"]);
    stopped("Ctrl-Z did not stop CMD");
    tmux.keys(&["fg", "Enter"]);
    running("fg did not continue CMD");
    // Sent to the background and brought back, fenced has the terminal:
    // Ctrl-Z reaches fenced, which stops CMD with it.
    tmux.keys(&["C-z"]);
    stopped("the second Ctrl-Z did not stop CMD");
    tmux.keys(&["bg", "Enter"]);
    running("bg did not continue CMD");
    tmux.keys(&["fg", "Enter"]);
    // Ctrl-Z once bash has given the terminal to fenced's job (field 8 of
    // /proc/PID/stat is the terminal's foreground group): before that it
    // would reach bash, which ignores it.
    let shell: i32 = String::from_utf8_lossy(&tmux.run(&["display", "-p", "#{pane_pid}"]).stdout)
        .trim()
        .parse()
        .expect("the pane's shell");
    until("fg did not give fenced the terminal", &|| {
        let stat = std::fs::read_to_string(format!("/proc/{shell}/stat")).unwrap_or_default();
        let tpgid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(5));
        tpgid
            .and_then(|g| g.parse::<i32>().ok())
            .is_some_and(|g| g > 0 && g != shell)
    });
    tmux.keys(&["C-z"]);
    stopped("Ctrl-Z after bg and fg did not stop CMD");
    tmux.keys(&["fg", "Enter"]);
    running("the last fg did not continue CMD");
    tmux.keys(&["C-c"]);
    until("Ctrl-C did not end CMD", &|| state("sleep 31.5").is_none());
    tmux.keys(&["echo rc:$?", "Enter"]);
    tmux.shows(&["rc:130"]);
    let out = fenced(&url, &["status", "tty"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the lock is free again: {out:?}"
    );

    // Runs `command` as a new job, stops it with Ctrl-Z, brings it back
    // with `fg`, and ends it with Ctrl-C.
    let stop_and_go = |command: &str, job: &str| {
        tmux.keys(&["clear", "Enter"]);
        tmux.keys(&[command, "Enter"]);
        running(&format!("the {job} CMD never ran"));
        tmux.keys(&["C-z"]);
        tmux.shows(&["Stopped"]);
        stopped(&format!("Ctrl-Z did not stop the {job} CMD"));
        tmux.keys(&["fg", "Enter"]);
        running(&format!("fg did not continue the {job} CMD"));
        tmux.keys(&["C-c"]);
    };
    // In a pipeline, the job is fenced and `cat`: Ctrl-Z stops them all,
    // or the shell would never see the job stopped.
    stop_and_go(
        &format!("'{bin}' --backend '{url}' run tty -- sleep 31.5 | cat"),
        "piped",
    );
    until("Ctrl-C did not end the piped CMD", &|| {
        state("sleep 31.5").is_none()
    });
    // (After `fg`, bash's PIPESTATUS holds the job's last status, cat's.)
    until("the piped run kept the lock", &|| {
        fenced(&url, &["status", "tty"]).status.code() == Some(1)
    });
    // From a script: its shell is in fenced's group, and stops with it.
    stop_and_go(
        &format!("sh -c \"'{bin}' --backend '{url}' run tty -- sleep 31.5; echo rc:\\$?\""),
        "script's",
    );
    tmux.shows(&["rc:130"]);
}

/// `fenced unlock`: refused on a held lock without `--force`; with it, the
/// holder (a `fenced run` with the default 30 s lease) is told at its next
/// renewal and its command killed; on a free lock, nothing to do.
#[test]
fn unlock_breaks_a_held_lock_only_with_force() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fenced"));
    let out = fenced(&url, &["unlock", "stuck"]);
    assert_eq!(out.status.code(), Some(0), "free: {out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("free"));
    let mut holder = fenced_testkit::process::spawn_run(bin, &url, "stuck", &[], &["sleep", "60"]);
    let t = fenced_testkit::Timing::default();
    let deadline = std::time::Instant::now() + t.eventually();
    while fenced(&url, &["status", "stuck"]).status.code() != Some(0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the holder never took the lock"
        );
        std::thread::sleep(t.ms(20));
    }
    let out = fenced(&url, &["unlock", "stuck"]);
    assert_eq!(out.status.code(), Some(2), "held, no --force: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_eq!(
        fenced(&url, &["status", "stuck"]).status.code(),
        Some(0),
        "still held"
    );
    let out = fenced(&url, &["unlock", "stuck", "--force"]);
    assert_eq!(out.status.code(), Some(0), "--force: {out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("broke 1 hold"));
    // Another takes it at once; the old holder learns at its next renewal
    // (a third of the lease) and its command is killed: exit 76.
    let out = fenced(&url, &["run", "-n", "stuck", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "after the break: {out:?}");
    let deadline = std::time::Instant::now() + t.ms(30_000);
    let code = loop {
        if let Some(status) = holder.try_wait().unwrap() {
            break status.code();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the broken holder ran on"
        );
        std::thread::sleep(t.ms(50));
    };
    assert_eq!(code, Some(76));
    fenced_testkit::process::kill_group(&mut holder);
}

/// The exit code of a `fenced run` child within a while, and what it said
/// on standard error.
fn exit_and_stderr(child: &mut std::process::Child, what: &str) -> (Option<i32>, String) {
    use std::io::Read;
    let t = fenced_testkit::Timing::default();
    let code = fenced_testkit::process::exit_within(child, t.eventually(), what);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (code, err)
}

/// Starts `fenced run NAME EXTRA -- CMD`, breaks its lock once it holds
/// it (as `fenced unlock --force` does), calls `then`, and returns how
/// the run ended: its exit code and its standard error.
fn break_the_lock_of_a_run(
    url: &str,
    name: &str,
    extra: &[&str],
    cmd: &[&str],
    then: impl FnOnce(),
) -> (Option<i32>, String) {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fenced"));
    let mut holder = fenced_testkit::process::spawn_run(bin, url, name, extra, cmd);
    let t = fenced_testkit::Timing::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = fenced::Client::connect(url).await.unwrap();
        let lock = client.mutex(name).unwrap();
        t.wait_until("the holder never took the lock", || async {
            !lock.status().await.unwrap().is_free()
        })
        .await;
        assert_eq!(lock.force_unlock().await.unwrap(), 1);
    });
    then();
    exit_and_stderr(&mut holder, "the holder")
}

#[test]
fn lost_lock_kills_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let (code, err) = break_the_lock_of_a_run(
        &url,
        "victim",
        &["--lease", "300ms"],
        &["sleep", "60"],
        || {},
    );
    assert_eq!(
        code,
        Some(76),
        "fenced run must kill CMD and exit 76 when the lock is lost"
    );
    assert!(err.contains("lost lock"), "{err}");
}

/// A hold lost while CMD ran is reported even when CMD finishes before
/// the loss is noticed (the next renewal is a third of the 30 s lease
/// away), and with `--on-lost ignore`: exit 76, never CMD's 0.
#[test]
fn a_loss_cmd_outran_is_still_exit_76() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    for (i, extra) in [&[][..], &["--on-lost", "ignore"][..]]
        .into_iter()
        .enumerate()
    {
        let go = dir.path().join(format!("go{i}"));
        let wait = format!("while [ ! -e '{}' ]; do sleep 0.02; done", go.display());
        let (code, err) = break_the_lock_of_a_run(
            &url,
            &format!("outran{i}"),
            extra,
            &["sh", "-c", &wait],
            || std::fs::write(&go, "").unwrap(),
        );
        assert_eq!(code, Some(76), "{extra:?}: {err}");
        assert!(err.contains("lost lock"), "{err}");
    }
}

/// SIGTERM, SIGINT or SIGHUP while `fenced run` waits for the lock ends
/// the wait: exit 128 + the signal, nothing acquired, and the lock goes
/// to the next.
#[test]
fn a_signal_while_waiting_ends_the_wait() {
    use nix::sys::signal::{Signal, kill};
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fenced"));
    let t = fenced_testkit::Timing::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(fenced::Client::connect(&url)).unwrap();
    let held = rt
        .block_on(client.mutex("waited").unwrap().acquire())
        .unwrap();
    for (signal, code) in [
        (Signal::SIGTERM, 143),
        (Signal::SIGINT, 130),
        (Signal::SIGHUP, 129),
    ] {
        let mut waiter = fenced_testkit::process::spawn_run(bin, &url, "waited", &[], &["true"]);
        // Signalled while it still connects, it dies of the signal (the
        // default action, with nothing held yet): wait until it catches
        // SIGHUP, SIGINT and SIGTERM (bits 0, 1 and 14 of SigCgt).
        let pid = nix::unistd::Pid::from_raw(waiter.id() as i32);
        rt.block_on(
            t.wait_until("the waiter never caught the signals", || async {
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("SigCgt:"))
                    .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
                    .is_some_and(|m| m & 0x4003 == 0x4003)
            }),
        );
        kill(pid, signal).unwrap();
        let (got, err) = exit_and_stderr(&mut waiter, "the waiter");
        assert_eq!(got, Some(code), "{signal}: {err}");
        assert!(err.contains("while waiting"), "{err}");
    }
    assert!(rt.block_on(held.release()).unwrap());
    let out = fenced(&url, &["run", "waited", "-n", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// The recipes from the command line, on the embedded default, by
/// several processes at once: a counter loses no add, a sequence hands
/// out no ID twice, and `barrier wait` and `latch wait` processes go on
/// only once the barrier is removed or the count reaches zero.
#[test]
fn recipes_work_across_processes_from_the_command_line() {
    const PROCS: usize = 4;
    const ADDS: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let text = |args: &[&str]| {
        let out = fenced(&url, args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let spawn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_fenced"))
            .arg("--backend")
            .arg(&url)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let script = format!(
        "for i in $(seq {ADDS}); do \"$0\" --backend \"$1\" counter hits add 1 >/dev/null || exit 1; \
         \"$0\" --backend \"$1\" seq ids next -n 2 || exit 1; done"
    );
    // All started before any is waited for: they run at once.
    let adders: Vec<_> = (0..PROCS)
        .map(|_| {
            Command::new("sh")
                .args(["-c", &script, env!("CARGO_BIN_EXE_fenced"), &url])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ids = Vec::new();
    for adder in adders {
        let out = adder.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        ids.extend(
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(|l| l.parse::<u64>().unwrap()),
        );
    }
    assert_eq!(
        text(&["counter", "hits", "get"]).trim(),
        (PROCS * ADDS).to_string()
    );
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        (n, ids.len()),
        (PROCS * ADDS * 2, PROCS * ADDS * 2),
        "no ID twice"
    );
    assert_eq!(
        text(&["counter", "hits", "add", "-3"]).trim(),
        (PROCS * ADDS - 3).to_string()
    );

    text(&["barrier", "gate", "set"]);
    assert_eq!(
        fenced(&url, &["barrier", "gate", "status"]).status.code(),
        Some(0)
    );
    assert_eq!(
        fenced(&url, &["barrier", "gate", "wait", "-w", "0"])
            .status
            .code(),
        Some(75)
    );
    text(&["latch", "done", "set", "2"]);
    assert_eq!(
        fenced(&url, &["latch", "done", "set", "5"]).status.code(),
        Some(1),
        "in use"
    );
    let mut waiters: Vec<_> = (0..PROCS)
        .map(|i| {
            if i % 2 == 0 {
                spawn(&["barrier", "gate", "wait"])
            } else {
                spawn(&["latch", "done", "wait"])
            }
        })
        .collect();
    assert_eq!(text(&["latch", "done", "count-down"]).trim(), "1");
    // A wait of our own that runs out gives the waiters time to start.
    let out = fenced(&url, &["latch", "done", "wait", "-w", "0.3"]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    for w in &mut waiters {
        assert!(
            w.try_wait().unwrap().is_none(),
            "a waiter went on too early"
        );
    }
    text(&["barrier", "gate", "remove"]);
    assert_eq!(text(&["latch", "done", "count-down"]).trim(), "0");
    for w in waiters {
        let out = w.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    assert_eq!(
        fenced(&url, &["barrier", "gate", "status"]).status.code(),
        Some(1)
    );

    let out = fenced(
        &url,
        &[
            "elect",
            "leader",
            "--value",
            "me:1",
            "--",
            "sh",
            "-c",
            "echo $FENCED_TOKEN",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let token: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(token > 0);
    for bad in [
        &["counter", "hits", "add", "x"][..],
        &["seq", "ids", "next", "-n", "0"],
        &["latch", "done", "set", "0"],
        &["barrier", "gate", "wait", "-w", "soon"],
    ] {
        let out = fenced(&url, bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
    }
}

/// Completion scripts and manual pages come from the same definition as
/// `--help`: they name every command a user may type.
#[test]
fn completions_and_man_pages_name_every_command() {
    let text = |args: &[&str]| {
        let out = fenced("memory://", args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let commands = [
        "run", "status", "list", "top", "unlock", "doctor", "demo", "bench", "torture", "elect",
        "counter", "seq", "barrier", "latch",
    ];
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = text(&["completions", shell]);
        for c in commands {
            assert!(script.contains(c), "{shell} completes {c}");
        }
    }
    let page = text(&["man"]);
    assert!(
        page.starts_with(".ie") && page.contains(".TH fenced 1"),
        "{page}"
    );
    assert!(
        !page.contains("torture\\-worker"),
        "hidden commands stay out of fenced(1)"
    );
    for c in commands {
        assert!(
            page.contains(&format!("fenced\\-{c}(1)")),
            "fenced(1) lists {c}"
        );
    }
    let run = text(&["man", "run"]);
    assert!(
        run.contains(".TH fenced-run 1") && run.contains("nonblock"),
        "{run}"
    );
    for args in [
        &["completions", "tcsh"][..],
        &["man", "torture-worker"],
        &["man", "nope"],
    ] {
        let out = fenced("memory://", args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn bad_arguments_get_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    for (args, needle) in [
        (vec!["run", "x", "--wait", "soon", "--", "true"], "soon"),
        (vec!["run", "x", "--lease", "-1s", "--", "true"], "-1s"),
        (vec!["demo", "flash-sale", "--workers", "0"], "0"),
    ] {
        let out = fenced(&url, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
    }
    // Values clap takes but fenced refuses are bad arguments too: 2, with
    // the reason on one line.
    for (url, args, needle) in [
        ("redis-ish://x", vec!["status", "x"], "redis-ish"),
        (
            url.as_str(),
            vec!["run", "", "--", "true"],
            "lock name is empty",
        ),
        (url.as_str(), vec!["status", ""], "lock name is empty"),
        (
            url.as_str(),
            vec!["run", "x", "--lease", "0", "--", "true"],
            "lease",
        ),
        (
            url.as_str(),
            vec!["run", "x", "--lease", "9999d", "--", "true"],
            "lease",
        ),
        ("memory://", vec!["torture", "--clients", "1"], "clients"),
        ("memory://", vec!["demo", "flash-sale"], "one process"),
        ("memory://", vec!["bench", "s2"], "one process"),
        ("memory://", vec!["bench", "s1", "s4"], "one process"),
        (
            url.as_str(),
            vec!["torture", "--spawn", "redis", "--faults", "quorum"],
            "quorum",
        ),
        (url.as_str(), vec!["bench", "s1", "--iterations", "0"], "0"),
        (url.as_str(), vec!["bench", "s2", "--duration", "0s"], "0s"),
        (
            url.as_str(),
            vec!["bench", "s1", "--plot", "out.png"],
            "svg",
        ),
    ] {
        let out = fenced(url, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // Refused before any server is asked: at once, not after a
    // connection's timeout, and no lock file made for it.
    let file = dir.path().join("never.db");
    for url in [
        "redis://127.0.0.1:1".to_owned(),
        format!("sqlite://{}", file.display()),
    ] {
        for (args, needle) in [
            (vec!["run", "", "--", "true"], "lock name is empty"),
            (vec!["run", "x", "--lease", "0", "--", "true"], "lease"),
            (
                vec!["run", "x", "--permits", "3", "--of", "2", "--", "true"],
                "--of",
            ),
            (vec!["elect", "", "--", "true"], "lock name is empty"),
        ] {
            let out = fenced(&url, &args);
            assert_eq!(out.status.code(), Some(2), "{url} {args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(needle), "{url} {args:?}: {err}");
        }
    }
    assert!(!file.exists(), "a refused command made the lock file");
    // No command at all, or none under `demo`: the help, and 2.
    for args in [&[][..], &["demo"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_fenced"))
            .args(args)
            .env_remove("FENCED_BACKEND")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Usage"),
            "{args:?}"
        );
    }
    let out = fenced("sqlite:///nonexistent-dir/sub/locks.db", &["status", "x"]);
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent-dir/sub/locks.db"));
}

/// A server that refuses the connection is reported as refusing it, once,
/// on one line, at once rather than after a pool's timeout (this test
/// asserts the words, not the time). Port 1 on loopback: nothing listens.
#[test]
fn a_refused_connection_is_said_once() {
    for url in [
        "redis://127.0.0.1:1",
        "postgres://u@127.0.0.1:1/db",
        "postgres://u@127.0.0.1:1/db?mode=advisory",
        "mysql://u@127.0.0.1:1/db",
        "zk://127.0.0.1:1,127.0.0.1:2/",
    ] {
        let out = fenced(url, &["status", "x"]);
        assert_eq!(out.status.code(), Some(69), "{url}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{url}: {err}");
        assert!(!err.contains("timed out"), "{url}: {err}");
        let refusals = err.matches("Connection refused").count();
        let hosts = url.matches("127.0.0.1").count();
        assert_eq!(refusals, hosts, "{url}: {err}");
    }
}

#[test]
fn flash_sale_sells_exactly_the_stock_with_a_lock() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let out = fenced(
        &url,
        &[
            "demo",
            "flash-sale",
            "--stock",
            "60",
            "--workers",
            "4",
            "--attempts",
            "2000",
        ],
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for mode in ["lock", "segmented", "atomic"] {
        let row = text
            .lines()
            .find(|l| l.starts_with(mode))
            .unwrap_or_else(|| panic!("{text}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!((cols[1], cols[2]), ("60", "0"), "{mode}: {row}");
    }
    assert!(text.lines().any(|l| l.starts_with("none")), "{text}");
}

/// `fenced run` processes and a redis-py loop increment one file under the
/// same lock name: no increment is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_and_fenced_run_never_overlap() {
    const ROUNDS: usize = 25;
    let server = fenced_testkit::servers::redis::RedisServer::start();
    let url = format!("{}?layout=simple", server.url());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("counter");
    std::fs::write(&file, "0").unwrap();
    let name = fenced_testkit::unique("pyloop");
    let py = fenced_testkit::interop::redis_py(
        server.port,
        &name,
        &["loop", &ROUNDS.to_string(), file.to_str().unwrap()],
    )
    .spawn()
    .unwrap();
    let script = format!(
        "for i in $(seq {ROUNDS}); do {fenced} run --backend '{url}' {name} -- \
         sh -c 'n=$(cat {f}); sleep 0.002; echo $((n+1)) > {f}' || exit 1; done",
        f = file.display(),
        fenced = env!("CARGO_BIN_EXE_fenced"),
    );
    let sh = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .spawn()
        .unwrap();
    let (py, sh) = tokio::task::spawn_blocking(move || {
        let mut py = py;
        let mut sh = sh;
        (py.wait().unwrap(), sh.wait().unwrap())
    })
    .await
    .unwrap();
    assert!(py.success() && sh.success());
    let n: usize = std::fs::read_to_string(&file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        n,
        2 * ROUNDS,
        "an increment was lost: the two clients overlapped"
    );
}

/// `innodb_flush_log_at_trx_commit = 0` acknowledges commits a server
/// crash forgets (the torture suite's restart fault caught the overlaps
/// that made). It is global, so fenced cannot raise it for its own
/// sessions as it does PostgreSQL's `synchronous_commit`: it says so when
/// it connects, and stays quiet at 2 (written at commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_forgets_commits_is_reported() {
    let server = fenced_testkit::servers::mariadb::MariaDb::start();
    let status = |what: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fenced"))
            .args(["--backend", &server.url(), "status", "durability"])
            .output()
            .expect("run fenced");
        // Free: 1.
        assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert_eq!(
        server.sql("SELECT @@GLOBAL.innodb_flush_log_at_trx_commit"),
        "2"
    );
    let quiet = status("written at commit");
    assert!(!quiet.contains("innodb_flush_log_at_trx_commit"), "{quiet}");
    server.sql("SET GLOBAL innodb_flush_log_at_trx_commit = 0");
    let warned = status("flushed once a second");
    assert!(
        warned.contains("innodb_flush_log_at_trx_commit is 0"),
        "no warning: {warned}"
    );
}

/// `fenced` as another user of this host, with the default backend: the
/// binary is copied where that user may run it, and `setpriv` drops root.
fn as_user(bin: &std::path::Path, uid: Option<u32>, args: &[&str]) -> Command {
    let mut c = match uid {
        None => Command::new(bin),
        Some(uid) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg("--")
                .arg(bin);
            c
        }
    };
    // What a user's shell has: no backend named, a home of their own.
    c.args(args)
        .env_remove("FENCED_BACKEND")
        .env_remove("XDG_STATE_HOME")
        .env(
            "HOME",
            if uid.is_some() {
                "/nonexistent"
            } else {
                "/root"
            },
        )
        .stdin(std::process::Stdio::null());
    c
}

#[test]
fn two_users_exclude_each_other_with_the_default_backend() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(0) {
        eprintln!("skipped: only root can run fenced as a second user (CI runs as root)");
        return;
    }
    let nobody = 65534;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("fenced");
    std::fs::copy(env!("CARGO_BIN_EXE_fenced"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let name = format!("two-users-{}", std::process::id());
    let t = fenced_testkit::Timing::default();
    for (holder, other) in [(None, Some(nobody)), (Some(nobody), None)] {
        let mut held = as_user(&bin, holder, &["run", &name, "--", "sleep", "60"]);
        let mut held = held
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        // Asked as the other user: the holder shows in the host's file.
        let deadline = std::time::Instant::now() + t.eventually();
        loop {
            let out = as_user(&bin, other, &["status", &name, "--json"])
                .output()
                .unwrap();
            assert!(
                out.status.code().is_some(),
                "status as uid {other:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
                panic!(
                    "status as uid {other:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
            if v["held"] == true {
                break;
            }
            if let Ok(Some(status)) = held.try_wait() {
                let mut err = String::new();
                use std::io::Read;
                held.stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                panic!("the holder (uid {holder:?}) exited {status}: {err}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the holder (uid {holder:?}) never took the lock"
            );
            std::thread::sleep(t.ms(20));
        }
        let out = as_user(&bin, other, &["run", &name, "--wait", "0", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(75),
            "uid {other:?} took {name} while uid {holder:?} held it: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // SIGTERM to the group: `fenced run` passes it on, CMD ends, and
        // the lock is released.
        let killed = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", held.id())])
            .status()
            .unwrap();
        assert!(killed.success());
        held.wait().unwrap();
        // Freed, the other user takes it.
        let out = as_user(&bin, other, &["run", &name, "--", "true"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "uid {other:?} could not take the freed lock: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let file = fenced::default_sqlite_path();
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o666, 0o666, "{} is {mode:o}", file.display());
}

/// A link planted in the host's lock directory in place of a lock file is
/// refused, not followed: SQLite resolves a link in the database's own
/// path, so following it would let one user redirect another's writes.
#[test]
fn a_link_in_the_host_lock_directory_is_refused() {
    let default = fenced::default_sqlite_path();
    let dir = default.parent().unwrap();
    // Made as a user's first `fenced` makes it.
    let out = Command::new(env!("CARGO_BIN_EXE_fenced"))
        .args(["status", "x"])
        .env_remove("FENCED_BACKEND")
        .output()
        .unwrap();
    assert!(
        out.status.code().is_some_and(|c| c == 0 || c == 1),
        "{out:?}"
    );
    let target = tempfile::tempdir().unwrap();
    let victim = target.path().join("victim");
    let link = dir.join(format!("link-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let out = fenced(&format!("sqlite://{}", link.display()), &["status", "x"]);
    let _ = std::fs::remove_file(&link);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a regular file"),
        "{out:?}"
    );
    assert!(!victim.exists(), "the link was followed");
}

/// `fenced doctor` on what a user runs: one line per check, its verdict
/// first; exit 1 when a check fails, 0 otherwise.
fn doctor(url: &str) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fenced"))
        .args(["doctor", url])
        .output()
        .expect("run fenced doctor");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), text)
}

/// The line of check `name` (its first word), which must be there.
fn verdict<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name))
        .unwrap_or_else(|| panic!("no {name} check in:\n{text}"))
}

/// Redis as Debian's test kit starts it, with no persistence, fails the
/// persistence check; with an append-only file, nothing fails.
#[test]
fn doctor_fails_a_redis_that_forgets_its_locks_in_a_restart() {
    use fenced_testkit::servers::redis::RedisServer;
    let bare = RedisServer::start();
    let (code, text) = doctor(&bare.url());
    assert_eq!(code, Some(1), "{text}");
    assert!(verdict(&text, "persistence").contains("FAIL"), "{text}");
    assert!(verdict(&text, "eviction").contains("PASS"), "{text}");
    assert!(verdict(&text, "clock").contains("PASS"), "{text}");
    // Debian's redis.conf: snapshots only. A warning, not a failure.
    let snapshots = RedisServer::start_with(&["--save", "3600 1 300 100 60 10000"]);
    let (code, text) = doctor(&snapshots.url());
    assert_eq!(code, Some(0), "{text}");
    assert!(verdict(&text, "persistence").contains("WARN"), "{text}");
    // A managed Redis that hides CONFIG: what cannot be read is unknown,
    // and the rest is still checked.
    let hidden = RedisServer::start_with(&["--rename-command", "CONFIG", ""]);
    let (code, text) = doctor(&hidden.url());
    assert_eq!(code, Some(0), "{text}");
    assert!(verdict(&text, "persistence").contains("UNKNOWN"), "{text}");
    assert!(verdict(&text, "eviction").contains("UNKNOWN"), "{text}");
    assert!(verdict(&text, "clock").contains("PASS"), "{text}");
    let aof = RedisServer::start_with(&["--appendonly", "yes"]);
    let (code, text) = doctor(&aof.url());
    assert_eq!(code, Some(0), "{text}");
    assert!(verdict(&text, "persistence").contains("PASS"), "{text}");
    let mut c = redis::Client::open(aof.url())
        .unwrap()
        .get_connection()
        .unwrap();
    for (k, v) in [("maxmemory", "100mb"), ("maxmemory-policy", "volatile-lru")] {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(k)
            .arg(v)
            .query::<()>(&mut c)
            .unwrap();
    }
    let (code, text) = doctor(&aof.url());
    assert_eq!(code, Some(1), "{text}");
    assert!(verdict(&text, "eviction").contains("FAIL"), "{text}");
}

/// `fenced doctor URL` exits with `code`, each of `verdicts`' checks
/// with its verdict (and the text given, if any).
fn doctor_says(url: &str, code: i32, verdicts: &[(&str, &str, &str)]) {
    let (exit, text) = doctor(url);
    assert_eq!(exit, Some(code), "{text}");
    for (check, said, detail) in verdicts {
        let line = verdict(&text, check);
        assert!(line.contains(said) && line.contains(detail), "{text}");
    }
}

/// ZooKeeper: one address is a warning (no fault tolerance unless it
/// fronts an ensemble), three pass; the session the server granted is
/// the one asked for at the defaults.
#[test]
fn doctor_reads_zookeeper_ensembles() {
    use fenced_testkit::servers::zookeeper::ZkEnsemble;
    let one = ZkEnsemble::start();
    doctor_says(
        &one.url(),
        0,
        &[("ensemble", "WARN", ""), ("session", "PASS", "")],
    );
    drop(one);
    let three = ZkEnsemble::start_n(3);
    doctor_says(&three.url(), 0, &[("ensemble", "PASS", "survives 1 down")]);
}

/// etcd: one member is a warning, three pass, and the member answering
/// has a leader.
#[cfg(feature = "etcd")]
#[test]
fn doctor_reads_etcd_clusters() {
    use fenced_testkit::servers::etcd::EtcdCluster;
    let one = EtcdCluster::start();
    doctor_says(
        &one.url(),
        0,
        &[("cluster", "WARN", ""), ("leader", "PASS", "")],
    );
    drop(one);
    let three = EtcdCluster::start_n(3);
    let survives = ("cluster", "PASS", "survives 1 down");
    doctor_says(&three.url(), 0, &[survives, ("leader", "PASS", "")]);
}

/// Sentinel and Cluster fail over: with min_replicas=0 (the default) a
/// promoted replica may never have had a grant, a warning; with
/// min_replicas=1 and a replica there, a pass; with more asked than there
/// are, a failure. The test kit's servers keep no data, a failure too.
#[test]
fn doctor_reads_failover_settings_of_sentinel_and_cluster() {
    use fenced_testkit::servers::redis::{RedisCluster, RedisSentinel};
    let group = RedisSentinel::start();
    let (code, text) = doctor(&group.url());
    assert_eq!(code, Some(1), "{text}");
    assert!(verdict(&text, "replication").contains("WARN"), "{text}");
    assert!(verdict(&text, "persistence").contains("FAIL"), "{text}");
    let (_, text) = doctor(&format!("{}?min_replicas=1", group.url()));
    assert!(verdict(&text, "replication").contains("PASS"), "{text}");
    let (_, text) = doctor(&format!("{}?min_replicas=3", group.url()));
    assert!(verdict(&text, "replication").contains("FAIL"), "{text}");
    drop(group);
    let cluster = RedisCluster::start_with_replicas(3, true);
    let (code, text) = doctor(&cluster.url());
    assert_eq!(code, Some(1), "{text}");
    assert!(verdict(&text, "replication").contains("WARN"), "{text}");
    assert!(verdict(&text, "persistence").contains("FAIL"), "{text}");
    let (_, text) = doctor(&format!("{}?min_replicas=1", cluster.url()));
    assert!(verdict(&text, "replication").contains("PASS"), "{text}");
}

/// PostgreSQL: fenced's own sessions commit durably whatever the
/// server's default; the test kit's fsync=off (a speed trade for tests)
/// is a failing check, as it would be on a user's server.
#[test]
fn doctor_reads_postgresql_durability() {
    let server = fenced_testkit::servers::postgres::PgServer::start();
    // The default of every new session of this database (the test kit
    // starts the server with synchronous_commit=on on its command line,
    // which ALTER SYSTEM cannot override).
    server.sql("ALTER DATABASE postgres SET synchronous_commit = off");
    assert_eq!(server.sql("SHOW synchronous_commit"), "off");
    let (code, text) = doctor(&server.url());
    assert_eq!(code, Some(1), "{text}");
    assert!(verdict(&text, "fsync").contains("FAIL"), "{text}");
    let commit = verdict(&text, "synchronous_commit");
    assert!(
        commit.contains("PASS") && commit.contains("off by default"),
        "{text}"
    );
}

/// MariaDB at the test kit's innodb_flush_log_at_trx_commit = 2 warns;
/// at 0, it fails. SQLite on a local disk, and memory://, fail nothing.
#[test]
fn doctor_reads_mariadb_durability_and_the_sqlite_file_system() {
    let server = fenced_testkit::servers::mariadb::MariaDb::start();
    let (code, text) = doctor(&server.url());
    assert_eq!(code, Some(0), "{text}");
    assert!(
        verdict(&text, "innodb_flush_log_at_trx_commit").contains("WARN"),
        "{text}"
    );
    server.sql("SET GLOBAL innodb_flush_log_at_trx_commit = 0");
    let (code, text) = doctor(&server.url());
    assert_eq!(code, Some(1), "{text}");
    assert!(
        verdict(&text, "innodb_flush_log_at_trx_commit").contains("FAIL"),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let (code, text) = doctor(&sqlite_url(&dir));
    assert_eq!(code, Some(0), "{text}");
    assert!(verdict(&text, "file").contains("PASS"), "{text}"); // "file system"
    assert!(verdict(&text, "space").contains("PASS"), "{text}");
    assert!(verdict(&text, "journal").contains("PASS"), "{text}");
    let (code, text) = doctor("memory://doctor");
    assert_eq!(code, Some(0), "{text}");
    assert!(verdict(&text, "scope").contains("WARN"), "{text}");
}

/// SQLite forgets the last token of a name free for a day, and keeps the
/// highest token it forgot as a floor: granted under a clock three days
/// back, forgotten by a client of today, granted again under a clock four
/// days back, the name still gets a higher token (the wall clock alone,
/// which tokens never fall below, would have given a lower one).
#[test]
fn tokens_still_rise_when_a_forgotten_name_meets_a_clock_stepped_back() {
    let lib =
        fenced_testkit::process::libfaketime().expect("libfaketime (Debian's faketime package)");
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(&dir);
    let token_at = |offset: &str| -> u64 {
        let out = Command::new(env!("CARGO_BIN_EXE_fenced"))
            .env("LD_PRELOAD", &lib)
            .env("FAKETIME", offset)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .args(["--backend", &url, "run", "old", "--", "sh", "-c"])
            .arg("echo $FENCED_TOKEN")
            .output()
            .expect("run fenced");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let first = token_at("-3d");
    let status = fenced(&url, &["status", "old", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        v["last_token"], 0,
        "forgotten when a client opened the file: {v}"
    );
    let second = token_at("-4d");
    assert!(second > first, "{second} after {first}");
}
