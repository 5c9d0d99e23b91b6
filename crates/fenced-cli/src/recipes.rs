//! `fenced counter`, `seq`, `barrier`, `latch` and `queue`: the
//! coordination recipes, for scripts.

use crate::{EXIT_NOT_ACQUIRED, connect, parse_duration};
use clap::{Args, Subcommand};
use std::process::ExitCode;
use std::time::Duration;

/// The most IDs `fenced seq NAME next -n` prints at once.
const MAX_IDS: u32 = 1_000_000;

#[derive(Args, Debug)]
pub(crate) struct CounterArgs {
    /// The counter's name.
    name: String,
    #[command(subcommand)]
    op: CounterOp,
}

#[derive(Subcommand, Debug)]
enum CounterOp {
    /// Print the value (0 if never changed).
    Get,
    /// Add N (negative to subtract) and print the value after it.
    Add {
        #[arg(allow_hyphen_values = true, value_name = "N")]
        delta: i64,
    },
    /// Set the value, whatever it was.
    Set {
        #[arg(allow_hyphen_values = true, value_name = "N")]
        value: i64,
    },
    /// Print each new value as other clients change it, until killed
    /// (the first line is the value now).
    Watch,
}

#[derive(Args, Debug)]
pub(crate) struct SeqArgs {
    /// The sequence's name.
    name: String,
    #[command(subcommand)]
    op: SeqOp,
}

#[derive(Subcommand, Debug)]
enum SeqOp {
    /// Print the next ID (or the next N, one per line, taken at once).
    Next {
        /// How many IDs.
        #[arg(short = 'n', long, default_value_t = 1, value_name = "N",
              value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_IDS)))]
        count: u32,
    },
}

#[derive(Args, Debug)]
pub(crate) struct BarrierArgs {
    /// The barrier's name.
    name: String,
    #[command(subcommand)]
    op: BarrierOp,
}

#[derive(Subcommand, Debug)]
enum BarrierOp {
    /// Set the barrier: waiters wait from now on.
    Set,
    /// Remove the barrier: every waiter goes on.
    Remove,
    /// Wait while the barrier is set. Exits 0 once it is not, 75 if it
    /// still is after --timeout.
    Wait(WaitArgs),
    /// Exit 0 if the barrier is set, 1 if not (as `test`).
    Status,
}

#[derive(Args, Debug)]
pub(crate) struct LatchArgs {
    /// The latch's name.
    name: String,
    #[command(subcommand)]
    op: LatchOp,
}

#[derive(Subcommand, Debug)]
enum LatchOp {
    /// Set the count to N if it is zero. Exits 0 if set, 1 if the latch
    /// is in use (its count above zero).
    Set {
        #[arg(value_name = "N")]
        count: u64,
    },
    /// Take one off the count (unless zero) and print the count after.
    CountDown,
    /// Print the count.
    Count,
    /// Wait until the count is zero. Exits 0 then, 75 if it is not after
    /// --timeout.
    Wait(WaitArgs),
}

#[derive(Args, Debug)]
pub(crate) struct QueueArgs {
    /// The queue's name.
    name: String,
    #[command(subcommand)]
    op: QueueOp,
}

#[derive(Subcommand, Debug)]
enum QueueOp {
    /// Add an item (VALUE, or standard input without it) and print its id.
    Push {
        #[arg(value_name = "VALUE")]
        value: Option<String>,
    },
    /// Take the oldest item nobody holds.
    ///
    /// Without CMD: print it to standard output and finish it. With CMD:
    /// run CMD with the item on its standard input and FENCED_QUEUE,
    /// FENCED_ITEM (its id), FENCED_TOKEN (this delivery's fencing token)
    /// and FENCED_DELIVERIES set; finish the item if CMD exits 0, give it
    /// back to the queue otherwise, and exit with CMD's code. If this
    /// process dies, the item goes back when --lease ends; if the lease
    /// is lost while CMD runs, CMD is killed (exit 76). Exits 75 if no
    /// item came within --timeout.
    Take {
        #[command(flatten)]
        wait: WaitArgs,
        /// The taker's lease, renewed every third of it while this process
        /// lives.
        #[arg(long, value_parser = parse_duration, default_value = "30s", value_name = "DURATION",
              allow_hyphen_values = true)]
        lease: Duration,
        /// The exit code when no item came within --timeout (as `run`'s
        /// `-E`: set it apart from CMD's own codes).
        #[arg(short = 'E', long, value_name = "CODE", default_value_t = EXIT_NOT_ACQUIRED,
              value_parser = clap::value_parser!(u8).range(1..))]
        conflict_exit_code: u8,
        /// The command and its arguments.
        #[arg(last = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Print how many items wait or are taken.
    Len,
}

#[derive(Args, Debug)]
struct WaitArgs {
    /// How long to wait; unset = for ever. A bare number is seconds.
    #[arg(short = 'w', long, value_parser = parse_duration, value_name = "DURATION",
          allow_hyphen_values = true)]
    timeout: Option<Duration>,
}

/// Runs `f` with a client of the backend, and closes it after, on errors too.
async fn with_client<F, Fut>(backend: Option<String>, f: F) -> anyhow::Result<ExitCode>
where
    F: FnOnce(fenced::Client) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let client = connect(backend.as_deref()).await?;
    let code = f(client.clone()).await;
    client.close().await;
    code
}

pub(crate) async fn counter(
    backend: Option<String>,
    args: CounterArgs,
) -> anyhow::Result<ExitCode> {
    with_client(backend, |client| async move {
        let counter = client.counter(&args.name)?;
        match args.op {
            CounterOp::Get => println!("{}", counter.get().await?),
            CounterOp::Add { delta } => println!("{}", counter.add(delta).await?),
            CounterOp::Set { value } => counter.set(value).await?,
            CounterOp::Watch => {
                let mut watch = counter.watch().await?;
                println!("{}", watch.value());
                loop {
                    println!("{}", watch.changed().await?);
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
    .await
}

pub(crate) async fn seq(backend: Option<String>, args: SeqArgs) -> anyhow::Result<ExitCode> {
    with_client(backend, |client| async move {
        let seq = client.sequence(&args.name)?;
        let SeqOp::Next { count } = args.op;
        let ids = seq.next_block(count).await?;
        let mut out = String::new();
        for id in ids {
            out.push_str(&id.to_string());
            out.push('\n');
        }
        print!("{out}");
        Ok(ExitCode::SUCCESS)
    })
    .await
}

pub(crate) async fn barrier(
    backend: Option<String>,
    args: BarrierArgs,
) -> anyhow::Result<ExitCode> {
    with_client(backend, |client| async move {
        let barrier = client.barrier(&args.name)?;
        Ok(match args.op {
            BarrierOp::Set => {
                barrier.set().await?;
                ExitCode::SUCCESS
            }
            BarrierOp::Remove => {
                barrier.remove().await?;
                ExitCode::SUCCESS
            }
            BarrierOp::Status => {
                let set = barrier.is_set().await?;
                println!("{}: {}", args.name, if set { "set" } else { "not set" });
                ExitCode::from(u8::from(!set))
            }
            BarrierOp::Wait(w) => {
                let open = match w.timeout {
                    None => barrier.wait().await.map(|()| true)?,
                    Some(d) => barrier.wait_timeout(d).await?,
                };
                waited(open, "barrier", &args.name, "still set")
            }
        })
    })
    .await
}

pub(crate) async fn latch(backend: Option<String>, args: LatchArgs) -> anyhow::Result<ExitCode> {
    with_client(backend, |client| async move {
        let latch = client.latch(&args.name)?;
        Ok(match args.op {
            LatchOp::Set { count } => {
                if latch.try_set_count(count).await? {
                    ExitCode::SUCCESS
                } else {
                    eprintln!(
                        "fenced: latch {:?} is in use (count {}); not set",
                        args.name,
                        latch.count().await?
                    );
                    ExitCode::from(1)
                }
            }
            LatchOp::CountDown => {
                println!("{}", latch.count_down().await?);
                ExitCode::SUCCESS
            }
            LatchOp::Count => {
                println!("{}", latch.count().await?);
                ExitCode::SUCCESS
            }
            LatchOp::Wait(w) => {
                let open = match w.timeout {
                    None => latch.wait().await.map(|()| true)?,
                    Some(d) => latch.wait_timeout(d).await?,
                };
                waited(open, "latch", &args.name, "count above zero")
            }
        })
    })
    .await
}

/// The exit code of a wait: 0 when it ended, 75 (as `run`'s) on timeout.
fn waited(open: bool, what: &str, name: &str, still: &str) -> ExitCode {
    if open {
        return ExitCode::SUCCESS;
    }
    eprintln!("fenced: {what} {name:?}: {still} when the wait ran out");
    ExitCode::from(EXIT_NOT_ACQUIRED)
}

pub(crate) async fn queue(backend: Option<String>, args: QueueArgs) -> anyhow::Result<ExitCode> {
    with_client(backend, |client| async move {
        let queue = client.queue(&args.name)?;
        match args.op {
            QueueOp::Push { value } => {
                let value = match value {
                    Some(v) => v.into_bytes(),
                    None => {
                        let mut v = Vec::new();
                        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)?;
                        v
                    }
                };
                println!("{}", queue.push(value).await?);
                Ok(ExitCode::SUCCESS)
            }
            QueueOp::Len => {
                println!("{}", queue.len().await?);
                Ok(ExitCode::SUCCESS)
            }
            QueueOp::Take {
                wait,
                lease,
                conflict_exit_code,
                cmd,
            } => {
                let queue = queue.lease(lease);
                let code = take(&client, &queue, &args.name, wait, conflict_exit_code, cmd).await;
                // Its slot goes before the client closes (which would
                // call it lost).
                if let Err(e) = queue.release_taker().await {
                    tracing::debug!(error = %e, "releasing the taker slot failed; its lease frees it");
                }
                code
            }
        }
    })
    .await
}

/// The exit code after an item's acknowledgement: `code` once finished, 76
/// if another taker had it (this one's lease had ended).
fn finished(acked: fenced::Result<()>, code: ExitCode) -> anyhow::Result<ExitCode> {
    match acked {
        Ok(()) => Ok(code),
        Err(e) if e.kind() == fenced::ErrorKind::Lost => {
            eprintln!("fenced: {e}");
            Ok(ExitCode::from(crate::EXIT_LOST))
        }
        Err(e) => Err(e.into()),
    }
}

/// `fenced queue NAME take`: one item, printed or run by CMD.
async fn take(
    client: &fenced::Client,
    queue: &fenced::Queue,
    name: &str,
    wait: WaitArgs,
    conflict_exit_code: u8,
    cmd: Vec<String>,
) -> anyhow::Result<ExitCode> {
    if !cmd.is_empty() {
        // What the taker slot's holder record shows.
        client.set_command(&crate::run::shown_command(&cmd));
    }
    // Caught from here on, as `fenced run` does: a signal while waiting
    // ends the wait (a take dropped gives its item back), and one that
    // comes once the item is had reaches CMD.
    let mut interrupts = crate::run::Interrupts::new()?;
    let taken = async {
        fenced::Result::<Option<fenced::Item>>::Ok(match wait.timeout {
            None => Some(queue.take().await?),
            Some(d) => queue.take_timeout(d).await?,
        })
    };
    let item = tokio::select! {
        item = taken => item?,
        signal = interrupts.first() => {
            eprintln!("fenced: interrupted ({signal}) while waiting for an item of queue {name:?}");
            return Ok(crate::run::signal_exit(signal));
        }
    };
    let Some(item) = item else {
        eprintln!("fenced: queue {:?}: no item within the wait", name);
        return Ok(ExitCode::from(conflict_exit_code));
    };
    if cmd.is_empty() {
        use tokio::io::AsyncWriteExt;
        let mut out = tokio::io::stdout();
        out.write_all(item.payload()).await?;
        out.flush().await?;
        return finished(item.ack().await, ExitCode::SUCCESS);
    }
    let what = format!("the lease of queue {:?}'s item {}", name, item.id());
    if !item.is_held() {
        eprintln!("fenced: lost {what} before the command started; given back");
        let _ = item.release().await;
        return Ok(ExitCode::from(crate::EXIT_LOST));
    }
    let env = [
        ("FENCED_QUEUE", name.to_owned()),
        ("FENCED_ITEM", item.id().to_string()),
        ("FENCED_TOKEN", item.fencing_token().to_string()),
        ("FENCED_DELIVERIES", item.deliveries().to_string()),
    ];
    let ran = crate::run::supervise(
        &cmd,
        &env,
        Some(item.payload().to_vec()),
        crate::run::Under {
            lost: item.lost(),
            held: || item.is_held(),
            on_lost: crate::run::OnLost::Kill,
            what: &what,
        },
        &mut interrupts,
    )
    .await?;
    let code = match ran {
        crate::run::Ran::Exited(code) if code == ExitCode::SUCCESS => {
            return finished(item.ack().await, code);
        }
        // Its taker's lease is gone: the item is the next
        // taker's.
        crate::run::Ran::Lost => return Ok(ExitCode::from(crate::EXIT_LOST)),
        crate::run::Ran::Exited(code) => code,
        crate::run::Ran::NotRun => ExitCode::from(127),
    };
    if let Err(e) = item.release().await {
        eprintln!(
            "fenced: giving item back to queue {:?} failed ({e}); it goes back when \
                         the lease ends",
            name
        );
    }
    Ok(code)
}
