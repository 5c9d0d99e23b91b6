//! `fenced bench`: the scenarios of BENCHMARKS.md, each beside the
//! engine's own limit measured in the same run.
//!
//! - S1 uncontended: one client, acquire + release of `bench:s1`.
//! - S4 handoff: process A releases at a CLOCK_MONOTONIC instant, process
//!   B (already waiting) notes when it acquires.
//!
//! Limits: for Redis, `redis-benchmark -c 1 -t set` on the same server;
//! S1's ceiling is SET/2 (two round trips), S4's is 3 round trips.

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// Scenarios to run.
    #[arg(required = true, value_enum)]
    scenarios: Vec<Scenario>,
    /// S1 iterations.
    #[arg(long, default_value_t = 20_000)]
    iterations: u64,
    /// S4 repetitions.
    #[arg(long, default_value_t = 200)]
    handoffs: u64,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    S1,
    S4,
}

#[derive(Args, Debug)]
pub(crate) struct HandoffWorkerArgs {
    name: String,
}

/// S1 is bounded at 60 s whatever the iteration count.
const S1_LIMIT: Duration = Duration::from_secs(60);

fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always there on Linux");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

struct Report {
    json: bool,
}

impl Report {
    fn row(&self, v: serde_json::Value) {
        if self.json {
            println!("{v}");
            return;
        }
        let o = v.as_object().expect("an object");
        let line: Vec<String> = o
            .iter()
            .map(|(k, v)| match v {
                serde_json::Value::Number(n) if n.is_f64() => {
                    format!("{k}={:.1}", n.as_f64().unwrap_or(0.0))
                }
                serde_json::Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect();
        println!("{}", line.join("  "));
    }
}

pub(crate) async fn bench(backend: Option<String>, args: BenchArgs) -> anyhow::Result<ExitCode> {
    let client = crate::connect(backend.as_deref()).await?;
    let url = client.url().to_owned();
    let scheme = url.split(':').next().unwrap_or("").to_owned();
    let report = Report { json: args.json };
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres") {
        let (rate, cmd) = postgres_limit(&url).await?;
        report.row(
            json!({"limit": true, "backend": scheme, "command": cmd, "clients": 1,
                          "ops_per_sec": rate}),
        );
    }
    let limits = redis_limits(&url)?;
    if let Some(l) = &limits {
        for (rate, cmd) in [(l.set, &l.set_cmd), (l.eval, &l.eval_cmd)] {
            report.row(
                json!({"limit": true, "backend": scheme, "command": cmd, "clients": 1,
                              "ops_per_sec": rate}),
            );
        }
    }
    for s in &args.scenarios {
        match s {
            Scenario::S1 => {
                let r = s1(&client, args.iterations).await?;
                let h = &r.total;
                let mut row = json!({
                    "scenario": "S1", "backend": scheme, "clients": 1, "iterations": r.n,
                    "duration_s": r.secs, "ops_per_sec": r.ops,
                    "p50_us": h.value_at_quantile(0.5), "p99_us": h.value_at_quantile(0.99),
                    "p999_us": h.value_at_quantile(0.999),
                    "acquire_p50_us": r.acquire.value_at_quantile(0.5),
                });
                if let Some(l) = &limits {
                    row["ratio_to_set_half"] = json!(r.ops / (l.set / 2.0));
                    row["ratio_to_eval_half"] = json!(r.ops / (l.eval / 2.0));
                }
                report.row(row);
            }
            Scenario::S4 => {
                let h = s4(&url, &client, args.handoffs).await?;
                let mut row = json!({
                    "scenario": "S4", "backend": scheme, "clients": 2, "handoffs": h.len(),
                    "p50_us": h.value_at_quantile(0.5), "p99_us": h.value_at_quantile(0.99),
                });
                if let Some(l) = &limits {
                    let rtt_us = 1e6 / l.set;
                    row["p50_round_trips"] = json!(h.value_at_quantile(0.5) as f64 / rtt_us);
                }
                report.row(row);
            }
        }
    }
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

struct S1 {
    ops: f64,
    total: Histogram<u64>,
    acquire: Histogram<u64>,
    n: u64,
    secs: f64,
}

async fn s1(client: &fenced::Client, iterations: u64) -> anyhow::Result<S1> {
    let lock = client.mutex("bench:s1")?;
    let mut h = Histogram::<u64>::new(3)?;
    let mut ha = Histogram::<u64>::new(3)?;
    // Warm up: connections, script cache.
    for _ in 0..100 {
        lock.acquire().await?.release().await?;
    }
    let start = Instant::now();
    let mut n = 0;
    while n < iterations && start.elapsed() < S1_LIMIT {
        let t = Instant::now();
        let g = lock.acquire().await?;
        ha.record(t.elapsed().as_micros() as u64)?;
        g.release().await?;
        h.record(t.elapsed().as_micros() as u64)?;
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(S1 {
        ops: n as f64 / secs,
        total: h,
        acquire: ha,
        n,
        secs,
    })
}

/// S4: this process is A; a `bench-handoff-worker` process is B.
async fn s4(url: &str, client: &fenced::Client, reps: u64) -> anyhow::Result<Histogram<u64>> {
    let name = "bench:s4";
    let lock = client.mutex(name)?;
    let exe = std::env::current_exe()?;
    let mut b = tokio::process::Command::new(exe)
        .arg("--backend")
        .arg(url)
        .arg("bench-handoff-worker")
        .arg(name)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("start the S4 worker")?;
    let mut to_b = b.stdin.take().context("worker stdin")?;
    let mut from_b = tokio::io::BufReader::new(b.stdout.take().context("worker stdout")?);
    let mut h = Histogram::<u64>::new(3)?;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut line = String::new();
    for _ in 0..reps {
        let g = lock.acquire().await?;
        to_b.write_all(b"go\n").await?;
        line.clear();
        from_b.read_line(&mut line).await?;
        if line.trim() != "waiting" {
            bail!("the S4 worker said {line:?}");
        }
        // Let B's attempt reach the server and B subscribe.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let t0 = mono_ns();
        g.release().await?;
        line.clear();
        from_b.read_line(&mut line).await?;
        let t1: u64 = line.trim().parse().context("the S4 worker's timestamp")?;
        h.record(t1.saturating_sub(t0) / 1000)?;
    }
    drop(to_b);
    b.wait().await?;
    Ok(h)
}

/// B of S4: on each `go`, say `waiting`, acquire, print the monotonic
/// instant it got the lock, release.
pub(crate) async fn handoff_worker(
    backend: Option<String>,
    args: HandoffWorkerArgs,
) -> anyhow::Result<ExitCode> {
    let client = crate::connect(backend.as_deref()).await?;
    let lock = client.mutex(&args.name)?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in BufReader::new(stdin.lock()).lines() {
        if line?.trim() != "go" {
            break;
        }
        writeln!(out, "waiting")?;
        out.flush()?;
        let g = lock.acquire().await?;
        let t = mono_ns();
        g.release().await?;
        writeln!(out, "{t}")?;
        out.flush()?;
    }
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

/// The engine's own limits for one client, measured right before.
struct Limits {
    /// `SET` requests/s.
    set: f64,
    set_cmd: String,
    /// Requests/s of an `EVAL` of a compare-and-delete script: the floor
    /// of any lock whose steps are scripts.
    eval: f64,
    eval_cmd: String,
}

const CAD: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// `redis-benchmark -c 1` for `SET` and for a compare-and-delete `EVAL`
/// against the server of a `redis://` URL, or `None` for other backends.
fn redis_limits(url: &str) -> anyhow::Result<Option<Limits>> {
    let Ok(u) = url::Url::parse(url) else {
        return Ok(None);
    };
    if u.scheme() != "redis" {
        return Ok(None);
    }
    let host = u.host_str().unwrap_or("127.0.0.1").to_owned();
    let port = u.port().unwrap_or(6379).to_string();
    let base: Vec<String> = ["-h", &host, "-p", &port, "-c", "1", "-n", "20000", "-q"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let auth: Vec<String> = u
        .password()
        .map(|p| vec!["-a".to_owned(), p.to_owned()])
        .unwrap_or_default();
    let run = |extra: &[&str]| -> anyhow::Result<Option<(f64, String)>> {
        let mut args = base.clone();
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = match std::process::Command::new("redis-benchmark")
            .args(&args)
            .args(&auth)
            .stderr(Stdio::null())
            .output()
        {
            Ok(o) => o,
            Err(_) => {
                eprintln!(
                    "fenced bench: redis-benchmark not found (apt-get install redis-tools); \
                     no limit rows"
                );
                return Ok(None);
            }
        };
        let text = String::from_utf8_lossy(&out.stdout);
        // `-q` prints "NAME: 41322.31 requests per second, ..." after \r progress lines.
        let rate = text
            .split(['\r', '\n'])
            .filter(|l| l.contains("requests per second"))
            .filter_map(|l| {
                l.split(": ")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .next_back()
            .with_context(|| format!("could not read redis-benchmark's output: {text:?}"))?;
        Ok(Some((rate, format!("redis-benchmark {}", args.join(" ")))))
    };
    let Some((set, set_cmd)) = run(&["-t", "set"])? else {
        return Ok(None);
    };
    let Some((eval, eval_cmd)) = run(&["EVAL", CAD, "1", "bench:limit", "v"])? else {
        return Ok(None);
    };
    Ok(Some(Limits {
        set,
        set_cmd,
        eval,
        eval_cmd,
    }))
}

/// A raw loop of one-row upserts on one PostgreSQL connection: what a
/// single statement costs on this server (an acquire+release is at least
/// two).
#[cfg(feature = "postgres")]
async fn postgres_limit(url: &str) -> anyhow::Result<(f64, String)> {
    use sqlx::Connection;
    const SQL: &str = "INSERT INTO fenced_locks (name) VALUES ('bench:limit') \
        ON CONFLICT (name) DO UPDATE SET token = fenced_locks.token + 1";
    let mut base = url::Url::parse(url)?;
    base.set_query(None);
    let mut c = sqlx::PgConnection::connect(base.as_str()).await?;
    let n = 5000;
    let start = Instant::now();
    for _ in 0..n {
        sqlx::query(SQL).execute(&mut c).await?;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    c.close().await?;
    Ok((rate, format!("{n} x {SQL}")))
}
