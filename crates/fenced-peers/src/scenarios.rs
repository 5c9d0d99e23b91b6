//! The scenarios of docs/bench-scenarios.md, run the same way for every
//! library: S1 in this process, S2–S4 in worker processes of this binary.

use crate::libs::{Counter, Engine, Lib, Locker};
use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// S2's and S3's worker processes.
const PROCESSES: usize = 8;
/// S3's keys, chosen uniformly.
const KEYS: u64 = 1024;

/// What one run measures.
pub(crate) struct Plan {
    pub(crate) libs: Vec<Lib>,
    pub(crate) secs: Duration,
    pub(crate) redis: Option<String>,
    pub(crate) postgres: Option<String>,
    pub(crate) fenced_bin: Option<PathBuf>,
}

impl Plan {
    fn url(&self, e: Engine) -> &str {
        match e {
            Engine::Redis => self.redis.as_deref(),
            Engine::Postgres => self.postgres.as_deref(),
        }
        .expect("a server for every engine a library runs on")
    }
}

/// A scenario that runs in worker processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Multi {
    S2,
    S3,
    S4,
}

/// One figure of one round: `what` is the scenario and the figure's name.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub(crate) round: usize,
    pub(crate) row: String,
    pub(crate) engine: Engine,
    pub(crate) what: &'static str,
    pub(crate) value: f64,
}

impl Row {
    pub(crate) fn to_json(&self) -> String {
        serde_json::json!({
            "round": self.round,
            "row": self.row,
            "engine": format!("{:?}", self.engine),
            "what": self.what,
            "value": self.value,
        })
        .to_string()
    }
}

/// Values up to an hour (in ns or µs), to 3 significant figures: a
/// histogram that grows would clamp what `saturating_record` gives it.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always there on Linux");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// Every round: the limits, then each library's S1 (multi-thread and
/// current-thread runtimes), S2, S3 and S4, in an order turned by one
/// each round so that no library always runs first.
pub(crate) fn run(plan: &Plan, rounds: usize) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for round in 0..rounds {
        let mut push = |row: String, engine, what, value| {
            eprintln!("round {} {row:<45} {what:<22} {value:.3}", round + 1);
            rows.push(Row {
                round,
                row,
                engine,
                what,
                value,
            });
        };
        let mut limits = Vec::new();
        if let Some(url) = &plan.redis {
            let y = redis_set_limit(url)?;
            push("limit".into(), Engine::Redis, "Y", y);
            limits.push((Engine::Redis, y));
        }
        if let Some(url) = &plan.postgres {
            let y = block_on_new(postgres_limit(url.clone()))?;
            push("limit".into(), Engine::Postgres, "Y", y);
            limits.push((Engine::Postgres, y));
        }
        let y = |e: Engine| limits.iter().find(|l| l.0 == e).map_or(1.0, |l| l.1);
        let mut order = plan.libs.clone();
        let turn = round % order.len().max(1);
        order.rotate_left(turn);
        for lib in order {
            let (e, url) = (lib.engine(), plan.url(lib.engine()));
            let label = lib.label().to_owned();
            for (what, flavor) in [
                ("S1 ×Y", Flavor::Multi),
                ("S1 ×Y current_thread", Flavor::Current),
            ] {
                let (ops, p50, cpu) = s1(lib, url, plan.secs, flavor)?;
                push(label.clone(), e, what, ops / y(e));
                match flavor {
                    Flavor::Multi => push(label.clone(), e, "S1 p50 RT", p50 * y(e) / 1e6),
                    // One thread runs the loop and the library's tasks:
                    // its CPU time is the client's whole cost.
                    Flavor::Current => push(label.clone(), e, "S1 client CPU µs", cpu),
                }
            }
            let s2 = multi(lib, Multi::S2, url, plan.secs)?;
            let n = s2.acquisitions.len() as f64;
            push(
                label.clone(),
                e,
                "S2 ×Y",
                n / plan.secs.as_secs_f64() / y(e),
            );
            push(label.clone(), e, "S2 run length", s2.run_length());
            push(
                label.clone(),
                e,
                "S2 p99 wait ms",
                s2.wait_quantile(0.99) / 1e3,
            );
            let counted = block_on_new(read_counter(e, url.to_owned()))?;
            push(label.clone(), e, "S2 lost updates", n - counted as f64);
            let s3 = multi(lib, Multi::S3, url, plan.secs)?;
            push(
                label.clone(),
                e,
                "S3 ×Y",
                s3.count as f64 / plan.secs.as_secs_f64() / y(e),
            );
            let s4 = multi(lib, Multi::S4, url, plan.secs)?;
            if let Some((p50, count)) = s4.handover_p50_us() {
                push(label.clone(), e, "S4 p50 µs", p50);
                push(label.clone(), e, "S4 p50 RT", p50 * y(e) / 1e6);
                push(label.clone(), e, "S4 hand-overs", count as f64);
            }
        }
        if let Some(bin) = &plan.fenced_bin {
            for e in [Engine::Redis, Engine::Postgres] {
                let Some(url) = (match e {
                    Engine::Redis => plan.redis.as_deref(),
                    Engine::Postgres => plan.postgres.as_deref(),
                }) else {
                    continue;
                };
                let got = fenced_bench(bin, url, plan.secs).unwrap_or_else(|e| {
                    eprintln!("no `fenced bench` rows: {e:#}");
                    Vec::new()
                });
                for (what, value) in got {
                    let value = match what {
                        "S1 ×Y" | "S2 ×Y" | "S3 ×Y" => value / y(e),
                        "S4 p50 RT" => value * y(e) / 1e6,
                        _ => value,
                    };
                    push("fenced bench".into(), e, what, value);
                }
            }
        }
    }
    Ok(rows)
}

/// Runs `f` on a runtime of its own, for the driver's few async calls.
fn block_on_new<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavor {
    Multi,
    Current,
}

/// The CPU time this thread has used.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}

/// S1: one client, acquire and release one lock in a loop for `secs`;
/// operations per second, the p50 of one acquire + release in µs, and the
/// CPU time the loop's thread used per operation in µs.
fn s1(lib: Lib, url: &str, secs: Duration, flavor: Flavor) -> Result<(f64, f64, f64)> {
    let url = url.to_owned();
    std::thread::spawn(move || {
        let rt = match flavor {
            Flavor::Multi => tokio::runtime::Builder::new_multi_thread(),
            Flavor::Current => tokio::runtime::Builder::new_current_thread(),
        }
        .enable_all()
        .build()?;
        rt.block_on(async move {
            let locker = Locker::connect(lib, &url).await?;
            let name = format!("peers:s1:{}", lib.arg());
            // Warm: connections made, scripts loaded.
            for _ in 0..100 {
                locker.unlock(locker.lock(&name).await?).await?;
            }
            let mut h = histogram();
            let (start, cpu) = (Instant::now(), thread_cpu());
            let mut n = 0u64;
            while start.elapsed() < secs {
                let t = Instant::now();
                locker.unlock(locker.lock(&name).await?).await?;
                h.saturating_record(t.elapsed().as_nanos() as u64);
                n += 1;
            }
            let ops = n as f64 / start.elapsed().as_secs_f64();
            let cpu = (thread_cpu() - cpu).as_secs_f64() * 1e6 / n.max(1) as f64;
            Ok((ops, h.value_at_quantile(0.5) as f64 / 1e3, cpu))
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("S1's thread panicked"))?
}

/// What the workers of one multi-process scenario reported.
#[derive(Default)]
struct Reports {
    /// S2: (acquired at, worker, wait in µs).
    acquisitions: Vec<(u64, usize, u64)>,
    /// S3: acquire + release pairs done.
    count: u64,
    /// S4: (at, worker, true for an acquisition, false for a release).
    events: Vec<(u64, usize, bool)>,
}

impl Reports {
    /// The mean number of acquisitions in a row by one process.
    fn run_length(&self) -> f64 {
        let mut a = self.acquisitions.clone();
        a.sort_unstable();
        let runs = 1 + a.windows(2).filter(|w| w[0].1 != w[1].1).count();
        a.len() as f64 / runs as f64
    }

    fn wait_quantile(&self, q: f64) -> f64 {
        let mut h = histogram();
        for a in &self.acquisitions {
            h.saturating_record(a.2);
        }
        h.value_at_quantile(q) as f64
    }

    /// The median time from one process's release to the other's
    /// acquisition, over the hand-overs (acquisitions right after the
    /// other process released).
    fn handover_p50_us(&self) -> Option<(f64, u64)> {
        let mut ev = self.events.clone();
        ev.sort_unstable();
        let mut h = histogram();
        for w in ev.windows(2) {
            let ((rel, a, false), (acq, b, true)) = (w[0], w[1]) else {
                continue;
            };
            if a != b {
                h.saturating_record((acq - rel) / 1000);
            }
        }
        (!h.is_empty()).then(|| (h.value_at_quantile(0.5) as f64, h.len()))
    }
}

/// Worker processes, killed if the driver gives up on them early.
struct Workers(Vec<std::process::Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `scenario` in worker processes of this binary, started together
/// once every one has connected.
fn multi(lib: Lib, scenario: Multi, url: &str, secs: Duration) -> Result<Reports> {
    if scenario == Multi::S2 {
        block_on_new(async { Counter::connect(lib.engine(), url).await?.reset().await })?;
    }
    let n = if scenario == Multi::S4 { 2 } else { PROCESSES };
    let exe = std::env::current_exe()?;
    let turn = std::env::temp_dir().join(format!(
        "fenced-peers-turn-{}-{:x}",
        std::process::id(),
        fastrand::u64(..)
    ));
    let mut workers = Workers(Vec::new());
    for index in 0..n {
        let child = Command::new(&exe)
            .arg("worker")
            .arg(lib.arg())
            .arg(format!("{scenario:?}").to_lowercase())
            .arg(url)
            .arg(secs.as_secs().to_string())
            .arg(index.to_string())
            .arg(&turn)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a worker")?;
        workers.0.push(child);
    }
    let mut outs = Vec::new();
    for c in &mut workers.0 {
        let mut out = BufReader::new(c.stdout.take().expect("piped"));
        let mut line = String::new();
        out.read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("a {} worker did not start: {line:?}", lib.label());
        }
        outs.push(out);
    }
    for c in &mut workers.0 {
        writeln!(c.stdin.as_mut().expect("piped"), "go")?;
    }
    // Each worker's output is read on a thread of its own: one left
    // unread could fill its pipe and block.
    let readers: Vec<_> = outs
        .into_iter()
        .map(|out| {
            std::thread::spawn(move || out.lines().collect::<std::io::Result<Vec<String>>>())
        })
        .collect();
    let mut r = Reports::default();
    for (i, reader) in readers.into_iter().enumerate() {
        let lines = reader
            .join()
            .map_err(|_| anyhow::anyhow!("a reader thread panicked"))??;
        for line in lines {
            let f: Vec<&str> = line.split(' ').collect();
            let num = |k: usize| -> Result<u64> {
                f.get(k)
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("a worker's line {line:?}"))
            };
            match f[0] {
                "a" => r.acquisitions.push((num(1)?, i, num(2)?)),
                "n" => r.count += num(1)?,
                "acq" => r.events.push((num(1)?, i, true)),
                "rel" => r.events.push((num(1)?, i, false)),
                "done" => {}
                other => bail!("a worker said {other:?}"),
            }
        }
    }
    for c in &mut workers.0 {
        let status = c.wait()?;
        if !status.success() {
            bail!("a {} {scenario:?} worker failed: {status}", lib.label());
        }
    }
    workers.0.clear();
    let _ = std::fs::remove_file(&turn);
    Ok(r)
}

/// What one worker process runs: its command line.
#[derive(clap::Args)]
pub(crate) struct Job {
    lib: Lib,
    scenario: Multi,
    url: String,
    /// How long it runs, in seconds.
    secs: u64,
    /// This worker's number among its scenario's.
    index: usize,
    /// S4: the file where the holder writes its number, so that a
    /// releaser waits for the other to take the lock before it asks
    /// again (the two alternate, whatever the library's waiting).
    turn: PathBuf,
}

/// One worker: connects (and takes and gives back a lock of its own
/// once, so that every library's connections are open), says `ready`,
/// waits for `go`, runs until `secs` have passed, then writes what it
/// measured, kept in memory meanwhile.
pub(crate) async fn worker(job: Job) -> Result<()> {
    let Job {
        lib,
        scenario,
        url,
        secs,
        index,
        turn,
    } = job;
    let secs = Duration::from_secs(secs);
    let locker = Locker::connect(lib, &url).await?;
    let mut counter = match scenario {
        Multi::S2 => Some(Counter::connect(lib.engine(), &url).await?),
        _ => None,
    };
    let warm = format!("peers:warm:{}:{index}", lib.arg());
    locker.unlock(locker.lock(&warm).await?).await?;
    if let Some(c) = counter.as_mut() {
        c.get().await?;
    }
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready")?;
        out.flush()?;
    }
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let start = Instant::now();
    let name = format!("peers:{scenario:?}:{}", lib.arg()).to_lowercase();
    let me = index.to_string();
    let mut log = String::new();
    let mut n = 0u64;
    while start.elapsed() < secs {
        match scenario {
            Multi::S2 => {
                let t0 = mono_ns();
                let held = locker.lock(&name).await?;
                let t1 = mono_ns();
                let c = counter.as_mut().expect("S2 has its counter");
                let v = c.get().await?;
                c.set(v + 1).await?;
                locker.unlock(held).await?;
                let _ = writeln!(log, "a {t1} {}", (t1 - t0) / 1000);
            }
            Multi::S3 => {
                let key = format!("{name}:{}", fastrand::u64(..KEYS));
                locker.unlock(locker.lock(&key).await?).await?;
                n += 1;
            }
            Multi::S4 => {
                let held = locker.lock(&name).await?;
                let _ = writeln!(log, "acq {}", mono_ns());
                std::fs::write(&turn, &me)?;
                if start.elapsed() < secs {
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(30..=50))).await;
                }
                let _ = writeln!(log, "rel {}", mono_ns());
                locker.unlock(held).await?;
                // Asks again only once the other, waiting since before
                // this release, has taken the lock: the two alternate.
                while start.elapsed() < secs && std::fs::read_to_string(&turn)? == me {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    }
    if scenario == Multi::S3 {
        let _ = writeln!(log, "n {n}");
    }
    let mut out = std::io::stdout().lock();
    out.write_all(log.as_bytes())?;
    writeln!(out, "done")?;
    out.flush()?;
    Ok(())
}

/// `redis-benchmark -c 1 SET` on the server of `url`: requests per second.
pub(crate) fn redis_set_limit(url: &str) -> Result<f64> {
    let rest = url.trim_start_matches("redis://");
    let hostport = rest.split(['/', '?']).next().unwrap_or(rest);
    let (host, port) = hostport.rsplit_once(':').unwrap_or((hostport, "6379"));
    let out = Command::new("redis-benchmark")
        .args([
            "-h", host, "-p", port, "-c", "1", "-n", "20000", "-q", "-t", "set",
        ])
        .stderr(Stdio::null())
        .output()
        .context("redis-benchmark (Debian's redis-tools)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(['\r', '\n'])
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
        .with_context(|| format!("redis-benchmark's output: {text:?}"))
}

/// One-row upserts per second on one PostgreSQL connection: the engine's
/// own limit for a statement a lock needs at least one of.
async fn postgres_limit(url: String) -> Result<f64> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&url).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS peers_limit (k int PRIMARY KEY, v bigint)")
        .execute(&mut c)
        .await?;
    let upsert = "INSERT INTO peers_limit VALUES (1, $1) ON CONFLICT (k) DO UPDATE SET v = $1";
    for i in 0..200i64 {
        sqlx::query(upsert).bind(i).execute(&mut c).await?;
    }
    let (n, start) = (3000i64, Instant::now());
    for i in 0..n {
        sqlx::query(upsert).bind(i).execute(&mut c).await?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

async fn read_counter(e: Engine, url: String) -> Result<i64> {
    Counter::connect(e, &url).await?.get().await
}

/// `fenced bench`'s own S1, S2 (its worker writes through a fenced
/// register) and S4 (one fixed waiter, 5 ms holds) on the same server:
/// ops/s, and S4's p50 in µs.
fn fenced_bench(
    bin: &std::path::Path,
    url: &str,
    secs: Duration,
) -> Result<Vec<(&'static str, f64)>> {
    let out = Command::new(bin)
        .args([
            "bench",
            "--backend",
            url,
            "s1",
            "s2",
            "s4",
            "--json",
            "--duration",
        ])
        .arg(format!("{}s", secs.as_secs()))
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("{}", bin.display()))?;
    if !out.status.success() {
        eprintln!(
            "fenced bench failed on {url} ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut got = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v.get("limit").is_some() {
            continue;
        }
        let num = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
        match v.get("scenario").and_then(|s| s.as_str()) {
            Some("S1") => got.extend(num("ops_per_sec").map(|x| ("S1 ×Y", x))),
            Some("S2") => {
                got.extend(num("ops_per_sec").map(|x| ("S2 ×Y", x)));
                got.extend(num("run_length_mean").map(|x| ("S2 run length", x)));
                got.extend(num("p99_us").map(|x| ("S2 p99 wait ms", x / 1e3)));
            }
            Some("S4") => got.extend(num("p50_us").map(|x| ("S4 p50 RT", x))),
            _ => {}
        }
    }
    Ok(got)
}
