//! `fenced-peers`: fenced beside the other Rust lock libraries, on the same
//! servers in the same run, every figure as a ratio to the engine's own
//! limit measured in the same round.
//!
//! ```sh
//! cargo run --release -p fenced-peers -- --rounds 3 --out target/peers
//! ```
//!
//! It starts a Redis and a PostgreSQL of its own (the test kit's
//! launchers, on loopback, in temp dirs), or uses `--redis URL` and
//! `--postgres URL`. Each round measures the limits (`redis-benchmark -c 1
//! SET`; a loop of one-row upserts on one PostgreSQL connection), then
//! runs S1–S4 for every library, in an order that turns by one each round.
//! The table is the median over the rounds; `peers.jsonl` keeps every
//! round's rows, `peers.svg` plots the table.
//!
//! Every library runs the same worker: S2's critical section reads and
//! writes a plain counter on a connection of its own, S4's two processes
//! alternate as holder and waiter with holds of 30–50 ms. Not part of CI
//! (CI only builds it): benchmarks never gate a test run.

mod libs;
mod report;
mod scenarios;
mod wake;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use libs::{Engine, Lib};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    version,
    about = "fenced beside rslock, distributed-lock and a raw loop"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Rounds; the table shows each figure's median over them.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds each scenario runs, per library and round.
    #[arg(long, default_value_t = 5)]
    secs: u64,
    /// Libraries to run (all by default).
    #[arg(long, value_delimiter = ',')]
    libs: Vec<Lib>,
    /// A Redis to use instead of one of our own.
    #[arg(long)]
    redis: Option<String>,
    /// A PostgreSQL to use instead of one of our own.
    #[arg(long)]
    postgres: Option<String>,
    /// The `fenced` binary whose own `fenced bench` rows go beside the
    /// table (by default the one next to this binary, if it is there).
    #[arg(long)]
    fenced_bin: Option<PathBuf>,
    /// Where `peers.md`, `peers.jsonl` and `peers.svg` go.
    #[arg(long, default_value = "target/peers")]
    out: PathBuf,
}

/// One worker process of a multi-process scenario (started by the driver),
/// or the pub/sub wake-up measurement.
#[derive(Subcommand)]
enum Command {
    #[command(hide = true)]
    Worker(scenarios::Job),
    /// How long a PUBLISH takes to reach a subscriber process idle for
    /// each gap: the floor under a hand-over to a waiter that sleeps
    /// until told (S4), whatever the library.
    Wake {
        /// A Redis to use instead of one of our own.
        #[arg(long)]
        redis: Option<String>,
        /// Idle gaps before each publish, ms.
        #[arg(long, value_delimiter = ',', default_value = "0,5,40")]
        gaps: Vec<u64>,
        /// Publishes per gap.
        #[arg(long, default_value_t = 200)]
        n: usize,
    },
    #[command(hide = true)]
    WakeSub { url: String },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Worker(job)) => {
            let rt = tokio::runtime::Runtime::new()?;
            return rt.block_on(scenarios::worker(job));
        }
        Some(Command::WakeSub { url }) => {
            let rt = tokio::runtime::Runtime::new()?;
            return rt.block_on(wake::subscriber(&url));
        }
        Some(Command::Wake { redis, gaps, n }) => {
            let server = redis
                .is_none()
                .then(fenced_testkit::servers::redis::RedisServer::start);
            let url = redis.or_else(|| server.as_ref().map(|s| s.url()));
            return wake::run(&url.context("a Redis")?, &gaps, n);
        }
        None => {}
    }
    let libs = if cli.libs.is_empty() {
        Lib::ALL.to_vec()
    } else {
        cli.libs.clone()
    };
    let wants = |e: Engine| libs.iter().any(|l| l.engine() == e);
    // Kept alive for the run; each stops its server when dropped.
    let mut redis_server = None;
    let mut pg_server = None;
    let redis_url = match (&cli.redis, wants(Engine::Redis)) {
        (Some(u), _) => Some(u.clone()),
        (None, true) => {
            let s = fenced_testkit::servers::redis::RedisServer::start();
            let u = s.url();
            redis_server = Some(s);
            Some(u)
        }
        (None, false) => None,
    };
    let pg_url = match (&cli.postgres, wants(Engine::Postgres)) {
        (Some(u), _) => Some(u.clone()),
        (None, true) => {
            let s = fenced_testkit::servers::postgres::PgServer::start();
            let u = s.url();
            pg_server = Some(s);
            Some(u)
        }
        (None, false) => None,
    };
    let fenced_bin = cli.fenced_bin.clone().or_else(|| {
        let p = std::env::current_exe().ok()?.with_file_name("fenced");
        p.exists().then_some(p)
    });
    std::fs::create_dir_all(&cli.out).with_context(|| format!("{}", cli.out.display()))?;
    let plan = scenarios::Plan {
        libs,
        secs: Duration::from_secs(cli.secs),
        redis: redis_url,
        postgres: pg_url,
        fenced_bin,
    };
    let rows = scenarios::run(&plan, cli.rounds)?;
    let jsonl: String = rows.iter().map(|r| format!("{}\n", r.to_json())).collect();
    std::fs::write(cli.out.join("peers.jsonl"), jsonl)?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let table = report::table(&rows, &plan, cli.rounds, &args.join(" "));
    std::fs::write(cli.out.join("peers.md"), &table)?;
    report::plot(&rows, &cli.out.join("peers.svg"))?;
    println!("{table}");
    eprintln!(
        "wrote {0}/peers.md, {0}/peers.jsonl and {0}/peers.svg",
        cli.out.display()
    );
    drop((redis_server, pg_server));
    Ok(())
}
