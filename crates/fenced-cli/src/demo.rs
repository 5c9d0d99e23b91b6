//! `fenced demo flash-sale`: the seeds' 秒杀 (flash sale) with real worker
//! processes sharing one stock in the backend.

use crate::connect;
use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use fenced::{Client, ErrorKind, FencedRegister};
use std::process::{ExitCode, Stdio};
use std::time::Instant;

#[derive(Subcommand, Debug)]
pub(crate) enum Demo {
    /// N worker processes buy from one stock: without a lock they oversell;
    /// with one (or a lock per segment, or an atomic decrement) they sell
    /// exactly the stock.
    FlashSale(FlashSaleArgs),
}

#[derive(Args, Debug)]
pub(crate) struct FlashSaleArgs {
    /// Items in stock.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    stock: u32,
    /// Worker processes.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    workers: u32,
    /// Purchase attempts in all, shared among the workers.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    attempts: u64,
    /// Segments for `segmented` mode.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    segments: u32,
    /// Which way to sell.
    #[arg(long, value_enum, default_value_t = Mode::All)]
    mode: Mode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// Read the stock, subtract one, write it back: no lock.
    None,
    /// One lock around read-and-write; the write is fenced by its token.
    Lock,
    /// The stock split into segments, a lock each.
    Segmented,
    /// One atomic decrement in the backend, no lock.
    Atomic,
    /// Every mode in turn.
    All,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Lock => "lock",
            Mode::Segmented => "segmented",
            Mode::Atomic => "atomic",
            Mode::All => "all",
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    #[arg(long, value_enum)]
    mode: Mode,
    #[arg(long)]
    prefix: String,
    #[arg(long)]
    attempts: u64,
    #[arg(long)]
    segments: u32,
}

pub(crate) async fn demo(backend: Option<String>, demo: Demo) -> anyhow::Result<ExitCode> {
    let Demo::FlashSale(args) = demo;
    let client = connect(backend.as_deref()).await?;
    crate::needs_processes(client.url(), "the flash-sale demo")?;
    let modes = match args.mode {
        Mode::All => vec![Mode::None, Mode::Lock, Mode::Segmented, Mode::Atomic],
        m => vec![m],
    };
    println!(
        "flash sale on {}: stock {}, {} worker processes, {} attempts",
        client.url(),
        args.stock,
        args.workers,
        args.attempts
    );
    println!(
        "{:<10} {:>8} {:>9} {:>10} {:>12} {:>9}",
        "mode", "sold", "oversold", "attempts", "purchases/s", "seconds"
    );
    let mut wrong = false;
    for mode in modes {
        let r = sell(&client, backend.as_deref(), &args, mode).await?;
        let oversold = r.sold.saturating_sub(u64::from(args.stock));
        println!(
            "{:<10} {:>8} {:>9} {:>10} {:>12.0} {:>9.2}",
            mode.name(),
            r.sold,
            oversold,
            r.attempts,
            r.sold as f64 / r.secs.max(1e-9),
            r.secs
        );
        if mode == Mode::None {
            if oversold == 0 {
                println!(
                    "           (no oversell happened in this run of `none`: the race is real but timing-dependent)"
                );
            }
        } else if r.sold != u64::from(args.stock).min(r.attempts)
            && r.attempts >= u64::from(args.stock)
        {
            wrong = true;
            println!("           ^ WRONG: expected exactly {} sold", args.stock);
        }
    }
    client.close().await;
    Ok(if wrong {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// F1 for `fenced bench`: the flash sale in every mode (stock 1,000,
/// 100,000 attempts, 10 segments) as one JSON row each.
pub(crate) async fn bench_rows(url: &str, workers: u32) -> anyhow::Result<Vec<serde_json::Value>> {
    let client = connect(Some(url)).await?;
    let args = FlashSaleArgs {
        stock: 1000,
        workers,
        attempts: 100_000,
        segments: 10,
        mode: Mode::All,
    };
    let scheme = url.split(':').next().unwrap_or("");
    let mut rows = Vec::new();
    for mode in [Mode::None, Mode::Lock, Mode::Segmented, Mode::Atomic] {
        let r = sell(&client, Some(url), &args, mode).await?;
        rows.push(serde_json::json!({
            "scenario": "F1", "backend": scheme, "mode": mode.name(), "clients": workers,
            "stock": args.stock, "attempts": r.attempts, "sold": r.sold,
            "oversold": r.sold.saturating_sub(u64::from(args.stock)),
            "duration_s": r.secs, "ops_per_sec": r.sold as f64 / r.secs.max(1e-9),
        }));
    }
    client.close().await;
    Ok(rows)
}

struct Result {
    sold: u64,
    attempts: u64,
    secs: f64,
}

fn stock_registers(
    client: &Client,
    prefix: &str,
    mode: Mode,
    segments: u32,
) -> anyhow::Result<Vec<FencedRegister>> {
    let n = if mode == Mode::Segmented { segments } else { 1 };
    (0..n)
        .map(|i| Ok(client.register(&format!("{prefix}:stock:{i}"))?))
        .collect()
}

async fn sell(
    client: &Client,
    backend: Option<&str>,
    args: &FlashSaleArgs,
    mode: Mode,
) -> anyhow::Result<Result> {
    let prefix = format!("flash-sale:{}:{}", std::process::id(), mode.name());
    let regs = stock_registers(client, &prefix, mode, args.segments)?;
    let n = regs.len() as u32;
    for (i, reg) in regs.iter().enumerate() {
        let share = args.stock / n + u32::from((i as u32) < args.stock % n);
        reg.write_unfenced(share.to_string()).await?;
    }
    let exe = std::env::current_exe().context("cannot find the fenced binary to start workers")?;
    let started = Instant::now();
    let mut children = Vec::new();
    for w in 0..args.workers {
        let attempts = args.attempts / u64::from(args.workers)
            + u64::from(u64::from(w) < args.attempts % u64::from(args.workers));
        let mut cmd = tokio::process::Command::new(&exe);
        if let Some(b) = backend {
            cmd.arg("--backend").arg(b);
        }
        cmd.arg("demo-worker")
            .args(["--mode", mode.name(), "--prefix", &prefix])
            .args([
                "--attempts",
                &attempts.to_string(),
                "--segments",
                &n.to_string(),
            ])
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        children.push(cmd.spawn().context("cannot start a worker process")?);
    }
    let (mut sold, mut attempts) = (0, 0);
    for child in children {
        let out = child.wait_with_output().await?;
        if !out.status.success() {
            bail!("a {} worker failed ({})", mode.name(), out.status);
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("worker output")?;
        sold += v["sold"].as_u64().unwrap_or(0);
        attempts += v["attempts"].as_u64().unwrap_or(0);
    }
    Ok(Result {
        sold,
        attempts,
        secs: started.elapsed().as_secs_f64(),
    })
}

pub(crate) async fn worker(backend: Option<String>, args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let client = connect(backend.as_deref()).await?;
    let regs = stock_registers(&client, &args.prefix, args.mode, args.segments)?;
    let mut empty = vec![false; regs.len()];
    let (mut sold, mut attempts) = (0u64, 0u64);
    while attempts < args.attempts {
        let live: Vec<usize> = (0..regs.len()).filter(|i| !empty[*i]).collect();
        if live.is_empty() {
            break; // sold out
        }
        attempts += 1;
        let i = live[fastrand::usize(..live.len())];
        let reg = &regs[i];
        let bought = match args.mode {
            Mode::None => {
                let v = reg.read_i64().await?.unwrap_or(0);
                if v > 0 {
                    tokio::task::yield_now().await;
                    reg.write_unfenced((v - 1).to_string()).await?;
                }
                v > 0
            }
            Mode::Lock | Mode::Segmented => {
                let guard = client
                    .mutex(&format!("{}:lock:{i}", args.prefix))?
                    .acquire()
                    .await?;
                let v = reg.read_i64().await?.unwrap_or(0);
                let ok = v > 0
                    && match reg.write(&guard, (v - 1).to_string()).await {
                        Ok(()) => true,
                        Err(e) if e.kind() == ErrorKind::StaleToken => false,
                        Err(e) => return Err(e.into()),
                    };
                guard.release().await?;
                if v <= 0 {
                    empty[i] = true;
                }
                ok
            }
            Mode::Atomic => {
                let ok = reg.try_decrement(1).await?.is_some();
                if !ok {
                    empty[i] = true;
                }
                ok
            }
            Mode::All => bail!("a worker sells in one mode"),
        };
        if args.mode == Mode::None && !bought {
            empty[i] = true;
        }
        sold += u64::from(bought);
    }
    client.close().await;
    println!(
        "{}",
        serde_json::json!({ "sold": sold, "attempts": attempts })
    );
    Ok(ExitCode::SUCCESS)
}
