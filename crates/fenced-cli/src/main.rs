//! `fenced`: run a command under a distributed lock, inspect locks, and
//! see what a lock is for in the flash-sale demo.

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;

mod bench;
mod demo;
mod doctor;
mod recipes;
mod run;
mod status;
#[cfg(feature = "top")]
mod top;
#[cfg(feature = "torture")]
mod torture;

/// Exit code when the lock was not had within `--wait` (EX_TEMPFAIL).
pub(crate) const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code when the lock was lost while CMD ran and CMD was killed.
pub(crate) const EXIT_LOST: u8 = 76;
/// Exit code when the backend fails (unreachable, refusing, answering
/// nonsense): sysexits' `EX_UNAVAILABLE`, apart from CMD's own codes and
/// from `status`'s 1 for a free lock.
pub(crate) const EXIT_BACKEND: u8 = 69;

/// The help text's backend section, from the backend table: every URL
/// this build of fenced can open.
fn backend_help() -> String {
    let mut urls = Vec::new();
    for b in fenced::backends() {
        if b.is_built() {
            urls.push(format!("  {:<42} {}", b.example, b.summary));
        }
    }
    format!(
        "Backend: --backend URL, else $FENCED_BACKEND, else the host's SQLite file \
         /run/lock/fenced/locks.db (/var/tmp/fenced/locks.db where /run/lock is root's \
         alone), shared by every user's fenced on this host: the directory is made 0777 \
         and the file 0666, so every user may take, release and break its locks; name a \
         file of your own in FENCED_BACKEND for a private one.\n\
         URLs this build opens:\n{}\n\
         Logs: FENCED_LOG=debug (tracing filter syntax).",
        urls.join("\n")
    )
}

#[derive(Parser, Debug)]
#[command(
    name = "fenced",
    version,
    about = "Distributed locks with fencing tokens: like flock(1), but across machines",
    after_help = backend_help()
)]
struct Cli {
    /// Backend URL (sqlite:///path/locks.db, redis://host:6379, memory://...).
    #[arg(long, global = true, env = "FENCED_BACKEND", value_name = "URL")]
    backend: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Hold lock NAME while CMD runs, renewing its lease.
    ///
    /// CMD gets FENCED_LOCK (the name) and FENCED_TOKEN (the fencing token)
    /// in its environment. fenced exits with CMD's exit code; 75 (or -E's)
    /// if the lock was not had within --wait; 76 if the lock was lost and
    /// CMD killed; 69 if the backend failed; 2 for a bad argument.
    Run(run::RunArgs),
    /// Show whether lock NAME is held, by whom, its token and lease left.
    /// Exits 0 when held, 1 when free (as `test`: `if fenced status NAME`),
    /// 69 if the backend failed, 2 for a bad argument.
    Status(status::StatusArgs),
    /// List the locks that are held or waited for, whose names start with
    /// PREFIX (every lock without one): holders, tokens, lease left,
    /// waiters. Exits 0, 69 if the backend failed, 2 for a bad argument.
    List(status::ListArgs),
    /// The locks held or waited for, live in the terminal, refreshed every
    /// --interval; q quits. Exits 2 when standard output is not a terminal.
    #[cfg(feature = "top")]
    Top(top::TopArgs),
    /// Break lock NAME, whoever holds it (with --force when it is held).
    ///
    /// Its holders' lost signals fire at their next renewal, and a `fenced
    /// run` holding it kills its command. Exits 0 when the lock is free
    /// afterwards, 2 when it is held and --force was not given.
    Unlock(status::UnlockArgs),
    /// Run CMD while this process leads election NAME (as `etcdctl elect`).
    ///
    /// Waits to lead, proclaims --value for observers (the library's
    /// `Election::leader` reads it; on etcd, `etcdctl elect --listen`
    /// too), runs CMD with FENCED_LOCK and FENCED_TOKEN set, and resigns
    /// when it exits. Exit codes as `run`'s: 76 if
    /// leadership was lost and CMD killed.
    Elect(run::ElectArgs),
    /// A 64-bit counter shared by every client: get, add, set, watch.
    Counter(recipes::CounterArgs),
    /// Unique, increasing IDs across processes: `fenced seq NAME next`.
    Seq(recipes::SeqArgs),
    /// A barrier that holds waiters back while set: set, remove, wait,
    /// status.
    Barrier(recipes::BarrierArgs),
    /// A count-down latch: set N, count-down, count, wait.
    Latch(recipes::LatchArgs),
    /// A leased work queue: push, take (running CMD on the item), len.
    Queue(recipes::QueueArgs),
    /// Check what in the backend's settings weakens the guarantees.
    ///
    /// Redis persistence and eviction, PostgreSQL's synchronous_commit
    /// and fsync, MariaDB's innodb_flush_log_at_trx_commit, the file
    /// system and free space under SQLite's file, the size of an etcd
    /// cluster or ZooKeeper ensemble and the session it grants, and the
    /// server's clock offset. One verdict per check (pass, unknown, warn,
    /// fail). Exits 1 if a check fails, 0 if none does, 69 if the backend
    /// failed, 2 for a bad argument.
    Doctor(doctor::DoctorArgs),
    /// Demonstrations with real worker processes.
    #[command(subcommand)]
    Demo(demo::Demo),
    #[command(hide = true)]
    DemoWorker(demo::WorkerArgs),
    /// Benchmark scenarios (docs/bench-scenarios.md) beside the engine's own limit.
    Bench(bench::BenchArgs),
    #[command(hide = true)]
    BenchHandoffWorker(bench::HandoffWorkerArgs),
    #[command(hide = true)]
    BenchS2Worker(bench::S2WorkerArgs),
    /// Contend for one lock from worker processes while faults are
    /// injected; check the history against the backend's guarantees.
    #[cfg(feature = "torture")]
    Torture(torture::TortureArgs),
    #[cfg(feature = "torture")]
    #[command(hide = true)]
    TortureWorker(torture::WorkerArgs),
    /// Print a shell's completion script for fenced on stdout
    /// (bash: `fenced completions bash > /etc/bash_completion.d/fenced`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print fenced's manual page (roff) on stdout
    /// (`fenced man > /usr/local/share/man/man1/fenced.1`), or a command's
    /// (`fenced man run > …/fenced-run.1`).
    Man {
        /// The command whose page to print (fenced-COMMAND(1)).
        command: Option<String>,
    },
}

/// `fenced completions SHELL` and `fenced man`: both from the same clap
/// definition as `--help`, so they never disagree with it.
fn print_generated(command: &Command) -> anyhow::Result<ExitCode> {
    use clap::CommandFactory;
    use std::io::Write;
    let mut cli = Cli::command();
    let mut out = Vec::new();
    match command {
        Command::Completions { shell } => {
            clap_complete::generate(*shell, &mut cli, "fenced", &mut out);
        }
        Command::Man { command: None } => clap_mangen::Man::new(cli).render(&mut out)?,
        Command::Man {
            command: Some(name),
        } => {
            let page = cli
                .find_subcommand(name)
                .filter(|c| !c.is_hide_set())
                .ok_or_else(|| usage(format!("fenced has no command {name:?}")))?
                .clone()
                .name(format!("fenced-{name}"));
            clap_mangen::Man::new(page).render(&mut out)?;
        }
        _ => unreachable!("only completions and man are generated"),
    }
    std::io::stdout().lock().write_all(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// A bad argument found after parsing (a value clap takes but fenced
/// refuses): `fenced` exits 2 on it, as on one clap refuses.
#[derive(Debug)]
pub(crate) struct Usage(pub(crate) String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A [`Usage`] error.
pub(crate) fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Usage(msg.into()))
}

/// Exit code for bad arguments, and for values the library refuses as
/// bad input (a zero lease, a malformed URL): 2, as for clap's own.
fn is_usage(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<Usage>().is_some()
            || c.downcast_ref::<fenced::Error>()
                .is_some_and(|f| f.kind() == fenced::ErrorKind::InvalidInput)
    })
}

/// clap's message on one line, whole, without its usage and tips
/// (`--help` has those): "the following required arguments were not
/// provided: `<NAME>`".
fn one_line(rendered: &str) -> String {
    // The message is the first paragraph; usage and tips come after a
    // blank line.
    let words: Vec<&str> = rendered
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .flat_map(str::split_whitespace)
        .collect();
    match words.join(" ") {
        w if w.is_empty() => "invalid arguments".to_owned(),
        w => w.trim_start_matches("error: ").to_owned(),
    }
}

/// An error and its causes, each said once: fenced's messages quote the
/// engine's error, whose own causes often repeat it word for word.
fn each_cause_once(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let said = cause.to_string();
        if said.is_empty() || text.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
}

/// Colour in logs only on a terminal, and never with `NO_COLOR` set
/// (<https://no-color.org>).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && std::io::stderr().is_terminal()
}

/// Parses `500ms`, `30s`, `2m`, `1h`, or `0`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration; write it like 500ms, 30s, 2m, or 2.5 (seconds)");
    let s = s.trim();
    // A bare number is seconds, as flock's `-w 2.5` and `sleep 2.5` read it.
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|_| bad());
    }
    humantime::parse_duration(s).map_err(|_| bad())
}

/// A duration above zero.
pub(crate) fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!("{s:?}: give a duration above zero")),
        d => Ok(d),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind as K;
            if matches!(e.kind(), K::DisplayHelp | K::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // `fenced`, `fenced demo`: the help, on standard error, and 2,
            // as for any argument missing.
            if e.kind() == K::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
            }
            eprintln!("fenced: {}", one_line(&e.render().to_string()));
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FENCED_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .init();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fenced: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let backend = cli.backend.filter(|b| !b.trim().is_empty());
    rt.block_on(async move {
        let result = match cli.command {
            Command::Run(args) => run::run(backend, args).await,
            Command::Status(args) => status::status(backend, args).await,
            Command::List(args) => status::list(backend, args).await,
            #[cfg(feature = "top")]
            Command::Top(args) => top::top(backend, args).await,
            Command::Unlock(args) => status::unlock(backend, args).await,
            Command::Elect(args) => run::elect(backend, args).await,
            Command::Counter(args) => recipes::counter(backend, args).await,
            Command::Seq(args) => recipes::seq(backend, args).await,
            Command::Barrier(args) => recipes::barrier(backend, args).await,
            Command::Latch(args) => recipes::latch(backend, args).await,
            Command::Queue(args) => recipes::queue(backend, args).await,
            Command::Doctor(args) => doctor::doctor(backend, args).await,
            Command::Demo(demo) => demo::demo(backend, demo).await,
            Command::DemoWorker(args) => demo::worker(backend, args).await,
            Command::Bench(args) => bench::bench(backend, args).await,
            Command::BenchHandoffWorker(args) => bench::handoff_worker(backend, args).await,
            Command::BenchS2Worker(args) => bench::s2_worker(backend, args).await,
            #[cfg(feature = "torture")]
            Command::Torture(args) => torture::torture(backend, args).await,
            #[cfg(feature = "torture")]
            Command::TortureWorker(args) => torture::worker(backend, args).await,
            c @ (Command::Completions { .. } | Command::Man { .. }) => print_generated(&c),
        };
        match result {
            Ok(code) => code,
            Err(e) => {
                eprintln!("fenced: {}", each_cause_once(&e));
                if is_usage(&e) {
                    ExitCode::from(2)
                } else {
                    ExitCode::from(EXIT_BACKEND)
                }
            }
        }
    })
}

/// Refuses a backend that worker processes cannot share (`memory://` lives
/// in one process): a demo or benchmark across processes would measure
/// nothing, or show a lock that excludes no one.
pub(crate) fn needs_processes(url: &str, what: &str) -> anyhow::Result<()> {
    if url.starts_with("memory:") {
        return Err(usage(format!(
            "{url}: {what} runs worker processes, and memory:// is one process's; \
             give a backend processes share (sqlite:///path/locks.db, redis://...)"
        )));
    }
    Ok(())
}

/// Connects to the backend the user named, or the default SQLite file.
pub(crate) async fn connect(backend: Option<&str>) -> anyhow::Result<fenced::Client> {
    Ok(match backend {
        Some(url) => fenced::Client::connect(url).await?,
        None => fenced::Client::from_env().await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_quoted_is_not_said_again() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = anyhow::Error::new(io)
            .context("cannot connect to 127.0.0.1:1: Connection refused")
            .context("backend unavailable");
        assert_eq!(
            each_cause_once(&e),
            "backend unavailable: cannot connect to 127.0.0.1:1: Connection refused"
        );
    }

    #[test]
    fn clap_messages_stay_whole_on_one_line() {
        let e = Cli::try_parse_from(["fenced", "status"]).unwrap_err();
        let line = one_line(&e.render().to_string());
        assert!(line.contains("<NAME>"), "{line}");
        assert!(!line.contains("Usage"), "{line}");
        let e =
            Cli::try_parse_from(["fenced", "run", "x", "--wait", "abc", "--", "true"]).unwrap_err();
        let line = one_line(&e.render().to_string());
        assert!(line.ends_with("2.5 (seconds)"), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }
}
