//! `fenced run NAME -- CMD`: flock(1) across machines.

use crate::{EXIT_LOST, EXIT_NOT_ACQUIRED, connect, parse_duration};
use anyhow::Context;
use clap::{Args, ValueEnum};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::process::ExitCode;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The lock's name.
    name: String,
    /// How long to wait for the lock: 0 = do not wait; unset = for ever.
    /// A bare number is seconds, as flock's `-w`.
    #[arg(short = 'w', long, visible_alias = "timeout", value_parser = parse_duration,
          value_name = "DURATION", allow_hyphen_values = true, conflicts_with = "nonblock")]
    wait: Option<Duration>,
    /// Do not wait: as `--wait 0` (flock's `-n`).
    #[arg(short = 'n', long)]
    nonblock: bool,
    /// The exit code when the lock is not had in time (flock's `-E`).
    #[arg(short = 'E', long, value_name = "CODE", default_value_t = EXIT_NOT_ACQUIRED,
          value_parser = clap::value_parser!(u8).range(1..))]
    conflict_exit_code: u8,
    /// Take the lock shared: the read side of the read-write lock NAME, held
    /// beside other shared holders, never beside an exclusive one (flock's `-s`).
    #[arg(short = 's', long, conflicts_with = "permits")]
    shared: bool,
    /// Take N permits of the semaphore NAME (which has `--of` in all).
    #[arg(long, value_name = "N", requires = "of", value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
    /// The semaphore's permits in all, with `--permits`.
    #[arg(long, value_name = "M", requires = "permits", value_parser = clap::value_parser!(u32).range(1..))]
    of: Option<u32>,
    /// The lease, renewed every third of it while CMD runs.
    #[arg(long, value_parser = parse_duration, default_value = "30s", value_name = "DURATION", allow_hyphen_values = true)]
    lease: Duration,
    /// What to do with CMD if the lock is lost while it runs.
    #[arg(long, value_enum, default_value_t = OnLost::Kill)]
    on_lost: OnLost,
    /// Wait in first-come, first-served order.
    #[arg(long)]
    fair: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
    /// What to proclaim as leader of election NAME (`fenced elect`).
    #[arg(skip)]
    proclaim: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ElectArgs {
    /// The election's name.
    name: String,
    /// What observers see as the leader's value (an address, say); the
    /// host name and pid by default.
    #[arg(long, value_name = "VALUE")]
    value: Option<String>,
    /// How long to wait to lead: 0 = do not wait; unset = for ever.
    #[arg(short = 'w', long, visible_alias = "timeout", value_parser = parse_duration,
          value_name = "DURATION", allow_hyphen_values = true)]
    wait: Option<Duration>,
    /// The lease of the leadership, renewed every third of it while CMD runs.
    #[arg(long, value_parser = parse_duration, default_value = "30s", value_name = "DURATION", allow_hyphen_values = true)]
    lease: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
}

/// `fenced elect NAME -- CMD`: `run` on the election's lock, proclaiming
/// a value once leading.
pub(crate) async fn elect(backend: Option<String>, args: ElectArgs) -> anyhow::Result<ExitCode> {
    let value = args
        .value
        .unwrap_or_else(|| format!("{}:{}", fenced::Holder::this_host(), std::process::id()));
    let run = RunArgs {
        name: args.name,
        wait: args.wait,
        nonblock: false,
        conflict_exit_code: EXIT_NOT_ACQUIRED,
        shared: false,
        permits: None,
        of: None,
        lease: args.lease,
        on_lost: OnLost::Kill,
        fair: false,
        cmd: args.cmd,
        proclaim: Some(value),
    };
    self::run(backend, run).await
}

/// What `run` holds while CMD runs: a lock, or an election's leadership.
enum Held {
    Lock(fenced::Guard),
    Leader(fenced::Leadership),
}

impl Held {
    fn guard(&self) -> &fenced::Guard {
        match self {
            Held::Lock(g) => g,
            Held::Leader(l) => l.guard(),
        }
    }

    async fn release(self) -> fenced::Result<bool> {
        match self {
            Held::Lock(g) => g.release().await,
            Held::Leader(l) => l.resign().await,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnLost {
    /// Kill CMD (SIGKILL to its process group) and exit 76.
    Kill,
    /// Log a warning and let CMD finish (and still exit 76).
    Ignore,
}

pub(crate) async fn run(backend: Option<String>, args: RunArgs) -> anyhow::Result<ExitCode> {
    check(&args)?;
    let client = connect(backend.as_deref()).await?;
    let mut interrupts = Interrupts::new()?;
    let code = run_with(&client, args, &mut interrupts).await;
    // On every path, errors too: what the client still owes the backend
    // (a release, the withdrawal of a try that timed out) goes out before
    // the process does; unless a signal comes meanwhile (a backend that
    // hangs makes this last two request timeouts), which ends it at once.
    tokio::select! {
        () = client.close() => {}
        signal = interrupts.first() => {
            eprintln!("fenced: {signal} while closing; what was owed to the backend ends with its lease");
        }
    }
    code
}

/// What can be refused before any server is asked (exit 2 at once, not
/// after a connection's timeout, and no lock file made for it): the
/// name, the lease, the permits. A backend's own rules (ZooKeeper's `/`)
/// are its to check.
fn check(args: &RunArgs) -> anyhow::Result<()> {
    fenced::LockName::new(&args.name).map_err(|e| crate::usage(e.to_string()))?;
    if !(fenced::MIN_LEASE..=fenced::MAX_LEASE).contains(&args.lease) {
        return Err(crate::usage(format!(
            "--lease {} is out of range: {} to {}",
            humantime::format_duration(args.lease),
            humantime::format_duration(fenced::MIN_LEASE),
            humantime::format_duration(fenced::MAX_LEASE)
        )));
    }
    if let (Some(take), Some(max)) = (args.permits, args.of)
        && take > max
    {
        return Err(crate::usage(format!(
            "--permits {take} is more than the semaphore's {max} (--of)"
        )));
    }
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP, caught from before the lock is asked for
/// until fenced exits, by one set of listeners (a listener sees only the
/// signals that come after it is made, so a second set would miss one
/// that came in between). One that comes while fenced waits ends the wait
/// (the dropped acquisition withdraws its place, and `close` sends what
/// is owed) instead of killing fenced with a grant or a queue place left
/// for the server to time out; one that comes while CMD runs is passed on
/// to it, even if it came while CMD was being started.
pub(crate) struct Interrupts([tokio::signal::unix::Signal; 3]);

impl Interrupts {
    pub(crate) fn new() -> anyhow::Result<Self> {
        Ok(Interrupts([
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        ]))
    }

    /// The first of them to come (or one that came unread).
    pub(crate) async fn first(&mut self) -> Signal {
        let [int, term, hup] = &mut self.0;
        tokio::select! {
            _ = int.recv() => Signal::SIGINT,
            _ = term.recv() => Signal::SIGTERM,
            _ = hup.recv() => Signal::SIGHUP,
        }
    }
}

/// The exit code a shell reports for a process ended by `signal`.
pub(crate) fn signal_exit(signal: Signal) -> ExitCode {
    ExitCode::from(128 + signal as u8)
}

async fn run_with(
    client: &fenced::Client,
    args: RunArgs,
    interrupts: &mut Interrupts,
) -> anyhow::Result<ExitCode> {
    let lock = match (args.shared, args.permits, args.of) {
        (true, _, _) => client.rwlock(&args.name)?.read(),
        (false, Some(take), Some(max)) => client
            .semaphore(&args.name, max)?
            .permits(take)
            .as_lock()
            .clone(),
        _ => client.mutex(&args.name)?.as_lock().clone(),
    };
    let lock = lock.lease(args.lease).fair(args.fair);
    // What `status`, `list` and `top` show as the holder's command: the
    // command run, not `fenced run …`, with what looks like a secret masked.
    client.set_command(&shown_command(&args.cmd));
    let wait = if args.nonblock {
        Some(Duration::ZERO)
    } else {
        args.wait
    };
    let acquired = async {
        fenced::Result::<Option<Held>>::Ok(match &args.proclaim {
            None => match wait {
                None => Some(lock.acquire().await?),
                Some(d) if d.is_zero() => lock.try_acquire().await?,
                Some(d) => lock.acquire_timeout(d).await?,
            }
            .map(Held::Lock),
            Some(value) => {
                let election = client
                    .election(&args.name)?
                    .with_lock(|m| m.lease(args.lease).fair(args.fair));
                match wait {
                    None => Some(election.campaign(value).await?),
                    Some(d) if d.is_zero() => election.try_campaign(value).await?,
                    Some(d) => election.campaign_timeout(value, d).await?,
                }
                .map(Held::Leader)
            }
        })
    };
    let held = tokio::select! {
        held = acquired => held?,
        signal = interrupts.first() => {
            eprintln!("fenced: interrupted ({signal}) while waiting for {:?}; not acquired", args.name);
            return Ok(signal_exit(signal));
        }
    };
    let Some(held) = held else {
        let wait = wait.map(|d| humantime::format_duration(d).to_string());
        eprintln!(
            "fenced: lock {:?} is held elsewhere; not acquired within {}",
            args.name,
            wait.as_deref().unwrap_or("the wait")
        );
        return Ok(ExitCode::from(args.conflict_exit_code));
    };
    let guard = held.guard();
    let token = guard.fencing_token();
    let env = [
        ("FENCED_LOCK", args.name.clone()),
        ("FENCED_TOKEN", token.to_string()),
    ];
    let what = format!("lock {:?} (token {token})", args.name);
    let under = Under {
        lost: guard.lost(),
        held: || guard.is_held(),
        on_lost: args.on_lost,
        what: &what,
    };
    let ran = supervise(&args.cmd, &env, None, under, interrupts);
    let code = match ran.await? {
        Ran::Exited(code) => code,
        Ran::Lost => return lost_at_release(held, &what).await,
        Ran::NotRun => {
            held.release().await?;
            return Ok(ExitCode::from(127));
        }
    };
    // CMD ended first; but the hold may have been lost meanwhile with its
    // signal not yet fired (it fires at the next renewal), or fired and
    // ignored (`--on-lost ignore`): never a silent success.
    let signalled = !held.guard().is_held();
    match held.release().await {
        Ok(true) if !signalled => Ok(code),
        Ok(_) => {
            eprintln!("fenced: lost {what} while the command ran; it finished without it");
            Ok(ExitCode::from(EXIT_LOST))
        }
        Err(e) => {
            eprintln!(
                "fenced: releasing {:?} failed ({e}); its lease will free it",
                args.name
            );
            if signalled {
                eprintln!("fenced: lost {what} while the command ran; it finished without it");
                return Ok(ExitCode::from(EXIT_LOST));
            }
            Ok(code)
        }
    }
}

/// After CMD was killed for the loss: the release is a formality (the
/// hold is gone), and the exit code says lost whatever it answers.
async fn lost_at_release(held: Held, what: &str) -> anyhow::Result<ExitCode> {
    if let Err(e) = held.release().await {
        tracing::debug!(error = %e, "{what}: the release after the loss failed");
    }
    Ok(ExitCode::from(EXIT_LOST))
}

/// What a supervised command runs under: a hold's lost signal, whether
/// the hold stands now (no round trip), what to do on a loss, and the
/// hold's name for messages.
pub(crate) struct Under<'a, L, H> {
    pub(crate) lost: L,
    pub(crate) held: H,
    pub(crate) on_lost: OnLost,
    pub(crate) what: &'a str,
}

/// How a supervised command ended.
pub(crate) enum Ran {
    /// It exited, with this code (or 128 + the signal that ended it).
    Exited(ExitCode),
    /// What it ran under was lost, and it was killed.
    Lost,
    /// It could not be started (said on standard error).
    NotRun,
}

/// Runs `cmd` with `env` (and `stdin`, if given, on its standard input) in
/// a process group of its own that dies with fenced, until it exits; if
/// `lost` fires first, kills it (`OnLost::Kill`) or says so. SIGTERM,
/// SIGINT and SIGHUP (`interrupts`, caught since before the hold) are
/// passed on.
pub(crate) async fn supervise<L, H>(
    cmd: &[String],
    env: &[(&str, String)],
    stdin: Option<Vec<u8>>,
    under: Under<'_, L, H>,
    interrupts: &mut Interrupts,
) -> anyhow::Result<Ran>
where
    L: std::future::Future<Output = fenced::LostReason>,
    H: Fn() -> bool,
{
    let Under {
        lost,
        held,
        on_lost,
        what,
    } = under;
    let mut command = tokio::process::Command::new(&cmd[0]);
    command
        .args(&cmd[1..])
        .envs(env.iter().cloned())
        .process_group(0);
    if stdin.is_some() {
        command.stdin(std::process::Stdio::piped());
    }
    // CMD runs in a group of its own (killed whole on a loss), which the
    // terminal would treat as a background job: stopped when it reads it
    // (a password prompt, `read`), deaf to Ctrl-C and Ctrl-Z. Run from a
    // terminal in the foreground, fenced hands the terminal to CMD's
    // group, as a shell does, and takes it back when CMD ends or stops.
    let terminal = stdin.is_none() && in_foreground();
    // The terminal's settings before CMD can change them.
    let settings = terminal
        .then(|| nix::sys::termios::tcgetattr(std::io::stdin()).ok())
        .flatten();
    if terminal {
        hand_over_terminal(&mut command);
    }
    die_with_parent(&mut command);
    // Made before CMD starts, so that a stop at once is seen; and Ctrl-Z
    // while fenced's group has the terminal (CMD was sent to the
    // background with `bg`, then fenced brought back with `fg`) is CMD's
    // to stop, not fenced's alone.
    let mut children = signal(SignalKind::child())?;
    let mut suspends = match terminal {
        true => Some(signal(SignalKind::from_raw(Signal::SIGTSTP as i32))?),
        false => None,
    };
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            // The child gave its group the terminal before its exec failed.
            if terminal {
                let _ = nix::unistd::tcsetpgrp(std::io::stdin(), nix::unistd::getpgrp());
            }
            eprintln!("fenced: cannot run {:?}: {e}", cmd[0]);
            return Ok(Ran::NotRun);
        }
    };
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            // A command that does not read its input closes the pipe:
            // nothing to report.
            let _ = pipe.write_all(&bytes).await;
        });
    }
    let pgid = Pid::from_raw(child.id().context("the child has no pid")? as i32);
    // Whatever ends the wait, the terminal goes back to fenced's group.
    let mut tty = terminal.then(|| Terminal {
        pgid,
        settings,
        killed: false,
    });
    let killed = |tty: &mut Option<Terminal>| {
        if let Some(t) = tty {
            t.killed = true;
        }
    };
    tokio::pin!(lost);
    let mut lost_seen = false;
    let mut look_for_stops = terminal;
    let code = loop {
        if look_for_stops {
            look_for_stops = false;
            if let Some(signal) = job_stopped(pgid)
                && !job_control(pgid, signal, &held, on_lost)
            {
                eprintln!("fenced: lost {what} while stopped; killing the command");
                killed(&mut tty);
                let _ = killpg(pgid, Signal::SIGKILL);
                let _ = child.wait().await;
                break Ran::Lost;
            }
        }
        tokio::select! {
            status = child.wait() => break Ran::Exited(exit_code(status?)),
            // Only stops are asked for by `job_stopped`: CMD's exit stays
            // for `child.wait()` to reap.
            _ = children.recv(), if terminal => look_for_stops = true,
            Some(_) = async { suspends.as_mut()?.recv().await } => { let _ = killpg(pgid, Signal::SIGTSTP); }
            reason = &mut lost, if !lost_seen => {
                lost_seen = true;
                if on_lost == OnLost::Kill {
                    eprintln!("fenced: lost {what}: {reason}; killing the command");
                    killed(&mut tty);
                    let _ = killpg(pgid, Signal::SIGKILL);
                    let _ = child.wait().await;
                    break Ran::Lost;
                }
                eprintln!("fenced: lost {what}: {reason}; the command goes on (--on-lost ignore)");
            }
            signal = interrupts.first() => { let _ = killpg(pgid, signal); }
        }
    };
    Ok(code)
}

/// Whether fenced's standard input is a terminal whose foreground is
/// fenced's process group.
fn in_foreground() -> bool {
    let stdin = std::io::stdin();
    std::io::IsTerminal::is_terminal(&stdin)
        && nix::unistd::tcgetpgrp(&stdin).is_ok_and(|g| g == nix::unistd::getpgrp())
}

/// Makes CMD's group the terminal's foreground before CMD runs, so that a
/// CMD that reads the terminal at once is not stopped first; and lets
/// fenced change the foreground from the background (SIGTTOU ignored:
/// fenced is in the background while CMD has the terminal).
#[allow(unsafe_code)]
fn hand_over_terminal(cmd: &mut tokio::process::Command) {
    use nix::sys::signal::{SigHandler, signal};
    // SAFETY: ignoring a signal installs no handler code; nothing in fenced
    // relies on SIGTTOU's default action (stopping it).
    unsafe {
        let _ = signal(Signal::SIGTTOU, SigHandler::SigIgn);
    }
    // SAFETY: the closure runs in the forked child, in its new process
    // group, before exec, and calls only signal(2) and tcsetpgrp(3) (an
    // ioctl), which are async-signal-safe and touch no memory of the
    // parent. SIGTTOU, ignored as the parent's is, is set back to its
    // default for CMD.
    unsafe {
        cmd.pre_exec(|| {
            // fd 0 itself: `std::io::stdin()` may allocate on first use.
            let stdin = std::os::fd::BorrowedFd::borrow_raw(0);
            let _ = nix::unistd::tcsetpgrp(stdin, nix::unistd::getpgrp());
            signal(Signal::SIGTTOU, SigHandler::SigDfl).map_err(std::io::Error::from)?;
            Ok(())
        });
    }
}

/// Gives the terminal back to fenced's group, if CMD's group `pgid` has it
/// (a job the shell moved to the background meanwhile keeps it from
/// neither).
fn take_back_terminal(pgid: Pid) {
    let stdin = std::io::stdin();
    if nix::unistd::tcgetpgrp(&stdin).is_ok_and(|g| g == pgid) {
        let _ = nix::unistd::tcsetpgrp(&stdin, nix::unistd::getpgrp());
    }
}

/// The terminal CMD's group was given: taken back however supervision
/// ends (CMD's exit, a loss, an error); and when fenced killed CMD
/// (`killed`), with its settings as they were before CMD (a killed
/// editor leaves the terminal raw). A CMD that ended by itself keeps what
/// it set (`stty`).
struct Terminal {
    pgid: Pid,
    settings: Option<nix::sys::termios::Termios>,
    killed: bool,
}

impl Drop for Terminal {
    fn drop(&mut self) {
        // Only settings CMD's group left behind are put back: not those of
        // whatever has the terminal now (the shell, another job).
        let had_it = nix::unistd::tcgetpgrp(std::io::stdin()).is_ok_and(|g| g == self.pgid);
        take_back_terminal(self.pgid);
        if let (true, true, Some(t)) = (self.killed, had_it, &self.settings) {
            use nix::sys::termios::{SetArg, tcsetattr};
            let _ = tcsetattr(std::io::stdin(), SetArg::TCSADRAIN, t);
        }
    }
}

/// The signal that stopped CMD (the leader of group `pgid`), if it is
/// stopped.
fn job_stopped(pgid: Pid) -> Option<Signal> {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    match waitid(Id::Pid(pgid), WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG) {
        Ok(WaitStatus::Stopped(_, signal)) => Some(signal),
        _ => None,
    }
}

/// CMD was stopped by `signal`; does what a shell's job would, and says
/// whether the hold still stands (`held`) once CMD is continued.
///
/// - A read or write of the terminal from the background (SIGTTIN,
///   SIGTTOU) while fenced is in the foreground: fenced was brought back
///   with `fg` after a `bg`; CMD gets the terminal and goes on.
/// - Otherwise (Ctrl-Z): fenced's group stops too (SIGSTOP: fenced
///   catches SIGTSTP), so that the shell sees the job stopped and gets
///   the terminal; when continued, CMD goes on, with the terminal if
///   fenced has it (`fg`), unless the hold was lost meanwhile. A group
///   no shell watches (orphaned: fenced started by a terminal emulator
///   or `ssh -t` itself) does not stop, as the kernel would not stop it
///   for Ctrl-Z: CMD goes on at once.
fn job_control(pgid: Pid, signal: Signal, held: &impl Fn() -> bool, on_lost: OnLost) -> bool {
    use nix::unistd::{getpgrp, tcsetpgrp};
    if matches!(signal, Signal::SIGTTIN | Signal::SIGTTOU) && in_foreground() {
        let _ = tcsetpgrp(std::io::stdin(), pgid);
        let _ = killpg(pgid, Signal::SIGCONT);
        return true;
    }
    take_back_terminal(pgid);
    if watched() {
        let _ = killpg(getpgrp(), Signal::SIGSTOP);
    }
    // Continued (or never stopped). `--on-lost ignore` lets CMD finish
    // whatever befell the hold.
    if !held() && on_lost == OnLost::Kill {
        return false;
    }
    if in_foreground() {
        let _ = tcsetpgrp(std::io::stdin(), pgid);
    }
    let _ = killpg(pgid, Signal::SIGCONT);
    true
}

/// Whether fenced's process group is watched by a shell that can continue
/// it, as the kernel decides whether a group is orphaned: some member has
/// a parent in another group of the same session. Walks up from fenced's
/// parent through the group's members (a script's shell, `make`, `time`)
/// to the first process outside the group.
fn watched() -> bool {
    use nix::unistd::{Pid, getpgid, getpgrp, getppid, getsid};
    let (group, session) = (getpgrp(), getsid(None).ok());
    let mut at = getppid();
    for _ in 0..64 {
        if at.as_raw() <= 1 {
            return false;
        }
        match getpgid(Some(at)) {
            Ok(g) if g == group => {}
            Ok(_) => return getsid(Some(at)).ok() == session,
            Err(_) => return false,
        }
        // The next parent up: field 4 of /proc/PID/stat, after the
        // command's closing parenthesis.
        let stat = std::fs::read_to_string(format!("/proc/{at}/stat")).unwrap_or_default();
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
        else {
            return false;
        };
        at = Pid::from_raw(ppid);
    }
    false
}

/// CMD must not outlive fenced: if fenced is killed (SIGKILL, OOM), nobody
/// renews the lease, and a CMD that ran on would work without the lock.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before exec and only
    // calls prctl(2), which is async-signal-safe and touches no memory of
    // the parent. fenced spawns from the runtime's one thread, and
    // PR_SET_PDEATHSIG fires when that thread exits.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
}

/// CMD's exit code, or 128 + the signal that ended it (as shells report).
fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c.clamp(0, 255) as u8),
        (None, Some(s)) => ExitCode::from((128 + s).clamp(0, 255) as u8),
        _ => ExitCode::FAILURE,
    }
}

/// CMD as a holder record shows it: its words as a shell would read them
/// back, with the values of arguments that look like secrets (`--password
/// X`, `--token=X`, `-pX`, a URL's password) replaced by `***`, since
/// whoever can read the locks can read the record. The words of an
/// argument with spaces in it (`sh -c '…'`) are looked at the same way.
pub(crate) fn shown_command(cmd: &[String]) -> String {
    shell_words(&masked(cmd))
}

/// `words` with the values of what looks like a secret as `***`: the word
/// after a flag whose name says so (`--password X`), the value of
/// `NAME=value` and `--name=value` (`PGPASSWORD=x`, `--api-key=x`), of a
/// header (`Authorization: Bearer x`), of `-u user:password`, a URL's
/// password and its query values that say so (`?access_token=x`), and
/// mysql's `-pPASSWORD`.
fn masked(words: &[String]) -> Vec<String> {
    let mysql = words.first().is_some_and(|w| {
        let program = w.rsplit('/').next().unwrap_or(w);
        program.starts_with("mysql") || program.starts_with("mariadb")
    });
    let mut shown = Vec::with_capacity(words.len());
    let mut hide_next = false;
    let mut user_next = false;
    for arg in words {
        let word = if std::mem::take(&mut hide_next) {
            "***".to_owned()
        } else if std::mem::take(&mut user_next) {
            match arg.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => arg.clone(),
            }
        } else if let Some((name, _)) = arg.split_once(": ").filter(|(n, _)| says_secret(n)) {
            format!("{name}: ***")
        } else if arg.contains(char::is_whitespace) {
            let inner: Vec<String> = arg.split_whitespace().map(str::to_owned).collect();
            masked(&inner).join(" ")
        } else if mysql && arg.len() > 2 && arg.starts_with("-p") && !arg.starts_with("--") {
            "-p***".to_owned()
        } else if let Some((name, _)) = arg
            .split_once('=')
            .filter(|(n, _)| !n.contains("://") && says_secret(n))
        {
            format!("{name}=***")
        } else if arg.starts_with('-') && !arg.contains('=') && says_secret(arg) {
            hide_next = true;
            arg.clone()
        } else if arg == "-u" || arg == "--user" {
            user_next = true;
            arg.clone()
        } else {
            hide_url_secrets(arg)
        };
        shown.push(word);
    }
    shown
}

/// Whether a flag, variable or header name says its value is a secret.
fn says_secret(name: &str) -> bool {
    const SECRET: [&str; 6] = ["pass", "secret", "token", "key", "auth", "credential"];
    let n = name.trim_start_matches('-').to_ascii_lowercase();
    SECRET.iter().any(|s| n.contains(s))
}

/// A URL with its password, and the query values whose keys say so, as
/// `***`.
fn hide_url_secrets(arg: &str) -> String {
    let Some(scheme_end) = arg.find("://") else {
        return arg.to_owned();
    };
    let (head, rest) = arg.split_at(scheme_end + 3);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let rest = match authority
        .rfind('@')
        .and_then(|at| authority[..at].find(':').map(|c| (c, at)))
    {
        Some((colon, at)) => format!("{}:***{}", &rest[..colon], &rest[at..]),
        None => rest.to_owned(),
    };
    let Some((path, query)) = rest.split_once('?') else {
        return format!("{head}{rest}");
    };
    let query: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if says_secret(k) => format!("{k}=***"),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{head}{path}?{}", query.join("&"))
}

/// Words joined as a shell would read them back: one with a space, a
/// quote or a shell character in it is single-quoted (not for `*`: the
/// masks stay readable).
fn shell_words(words: &[String]) -> String {
    words
        .iter()
        .map(|w| {
            if !w.is_empty()
                && !w.contains(|c: char| c.is_whitespace() || "'\"\\$`;&|<>()".contains(c))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::shown_command;

    fn shown(words: &[&str]) -> String {
        shown_command(&words.iter().map(|w| w.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn secrets_are_masked_and_words_quoted() {
        assert_eq!(shown(&["sleep", "60"]), "sleep 60");
        assert_eq!(
            shown(&["sh", "-c", "echo 'hi' $X"]),
            r#"sh -c 'echo '\''hi'\'' $X'"#
        );
        assert_eq!(
            shown(&[
                "dump",
                "--password",
                "s3cr3t",
                "--api-key=abc",
                "-pXyz",
                "-v"
            ]),
            "dump --password *** --api-key=*** -pXyz -v"
        );
        assert_eq!(
            shown(&["psql", "postgres://app:hunter2@db:5432/x?sslmode=require"]),
            "psql postgres://app:***@db:5432/x?sslmode=require"
        );
        assert_eq!(
            shown(&["curl", "https://example.com/a@b"]),
            "curl https://example.com/a@b"
        );
        assert_eq!(
            shown(&["sh", "-c", "pg_dump --password hunter2 db > out"]),
            "sh -c 'pg_dump --password *** db > out'"
        );
        assert_eq!(
            shown(&["mysqldump", "-pS3cr3t", "db"]),
            "mysqldump -p*** db"
        );
        assert_eq!(
            shown(&[
                "env",
                "PGPASSWORD=x",
                "docker",
                "run",
                "-e",
                "API_TOKEN=y",
                "img"
            ]),
            "env PGPASSWORD=*** docker run -e API_TOKEN=*** img"
        );
        assert_eq!(
            shown(&[
                "curl",
                "-u",
                "alice:pw",
                "-H",
                "Authorization: Bearer x",
                "https://h/x?access_token=abc&n=1"
            ]),
            "curl -u alice:*** -H 'Authorization: ***' 'https://h/x?access_token=***&n=1'"
        );
        assert_eq!(
            shown(&["x", "--url=https://h/?token=abc", "next"]),
            "x --url=https://h/?token=*** next"
        );
        for odd in [
            "",
            "=",
            "-p",
            ":",
            "a: ",
            "file:///x",
            "user@host",
            "a:b@c@d",
            "é=ü",
        ] {
            shown(&["x", odd]);
        }
    }
}
