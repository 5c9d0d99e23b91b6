//! `fenced bench`: the scenarios of docs/bench-scenarios.md, each beside the
//! engine's own limit measured in the same run.
//!
//! - S1 uncontended: one client, acquire + release of `bench:s1`.
//! - S2 contended: worker processes increment a counter in the backend
//!   under one lock; throughput, waits, fairness and lost updates.
//! - S3 many keys: worker processes acquire + release one of 1,024 keys
//!   chosen uniformly; the aggregate rate.
//! - S4 handoff: process A releases at a CLOCK_MONOTONIC instant, process
//!   B (already waiting) notes when it acquires.
//! - S5 held-lease scale: one process holds `--leases` leases (30 s,
//!   watchdog on) for `--hold`: RSS, CPU, the requests the renewals cost
//!   (Redis round trips), leases lost.
//! - F1 flash sale: the demo's four modes, oversold and purchases/s.
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

mod raw;

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// Scenarios to run.
    #[arg(required_unless_present = "table", value_enum)]
    scenarios: Vec<Scenario>,
    /// Print the rows in FILE (JSON lines from `--json` runs) as Markdown
    /// tables, one per scenario, and exit.
    #[arg(long, value_name = "FILE")]
    table: Option<std::path::PathBuf>,
    /// S1 iterations.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    iterations: u64,
    /// S4 repetitions.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    handoffs: u64,
    /// S2 worker processes.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    processes: u32,
    /// S2 duration.
    #[arg(long, default_value = "20s", value_parser = crate::parse_positive_duration)]
    duration: Duration,
    /// Fair (FIFO) locks in S2 and S4.
    #[arg(long)]
    fair: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Draw the latency distributions and the rates against the limits
    /// into FILE (SVG).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
    /// S5: leases held at once.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..))]
    leases: u32,
    /// S5: how long they are held.
    #[arg(long, default_value = "60s", value_parser = crate::parse_positive_duration)]
    hold: Duration,
    /// Start this topology here (the torture suite's list: redis,
    /// postgres, zookeeper, ...) and bench it, instead of --backend.
    #[cfg(feature = "torture")]
    #[arg(long, value_parser = fenced_testkit::torture::topology::Topology::parse, value_name = "TOPOLOGY")]
    spawn: Option<fenced_testkit::torture::topology::Topology>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    S1,
    S2,
    S3,
    S4,
    S5,
    F1,
    /// The recipes, one client: a counter's `add(1)` and a rate
    /// limiter's decision (always granted), each in a loop of S1's
    /// iterations.
    R1,
}

#[derive(Args, Debug)]
pub(crate) struct HandoffWorkerArgs {
    name: String,
    #[arg(long)]
    fair: bool,
}

#[derive(Args, Debug)]
pub(crate) struct S2WorkerArgs {
    name: String,
    #[arg(long, value_parser = crate::parse_duration)]
    duration: Duration,
    #[arg(long)]
    fair: bool,
    /// S3: acquire + release one of this many keys `NAME:<k>` chosen
    /// uniformly, no counter.
    #[arg(long)]
    keys: Option<u32>,
}

/// S1 is bounded at 60 s whatever the iteration count.
const S1_LIMIT: Duration = Duration::from_secs(60);

/// S1 runs in this many slices, each after a slice of the engine's raw
/// loop (see [`raw`]).
const S1_SLICES: u64 = 10;

fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always there on Linux");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

struct Report {
    json: bool,
    /// What was benched: the topology, or the URL's scheme (and mode).
    target: String,
    /// Every row so far, for the tables at the end.
    rows: std::sync::Mutex<Vec<serde_json::Value>>,
}

impl Report {
    /// The run's rows as the tables `--table` prints, each figure beside
    /// the engine's limit (text output only: JSON is the rows).
    fn tables(&self) -> anyhow::Result<Option<String>> {
        if self.json {
            return Ok(None);
        }
        let rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        let jsonl: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
        tables(&jsonl.join("\n")).map(Some)
    }

    fn row(&self, mut v: serde_json::Value) {
        v["target"] = json!(self.target);
        self.rows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(v.clone());
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
    if let Some(path) = &args.table {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        print!("{}", tables(&text)?);
        return Ok(ExitCode::SUCCESS);
    }
    // Servers die with the thread that started them: this one, which
    // outlives the bench.
    #[cfg(feature = "torture")]
    let (_servers, backend) = match args.spawn {
        None => (None, backend),
        Some(_) if backend.is_some() => {
            return Err(crate::usage("give --backend or --spawn, not both"));
        }
        Some(t) => {
            let r = crate::torture::start(t, true)?;
            let url = r.url.clone();
            (Some(r), Some(url))
        }
    };
    if let Some(p) = &args.plot
        && p.extension().and_then(|e| e.to_str()) != Some("svg")
    {
        return Err(crate::usage(format!(
            "--plot writes SVG: give a FILE.svg, not {}",
            p.display()
        )));
    }
    let client = crate::connect(backend.as_deref()).await?;
    // The URL as given, for the workers: `client.url()` has its secrets
    // masked. (None is the host's SQLite file, which has none.)
    let url = backend.clone().unwrap_or_else(|| client.url().to_owned());
    for s in &args.scenarios {
        if matches!(s, Scenario::S2 | Scenario::S3 | Scenario::S4) {
            crate::needs_processes(&url, &format!("{s:?}"))?;
        }
    }
    let mut plot = Plot::default();
    let bar = |what: &str, len: Option<u64>| progress(!args.json, what, len);
    let scheme = url.split(':').next().unwrap_or("").to_owned();
    #[cfg(feature = "torture")]
    let target = args.spawn.map(|t| t.name().to_owned());
    #[cfg(not(feature = "torture"))]
    let target: Option<String> = None;
    #[cfg_attr(not(feature = "torture"), allow(clippy::unnecessary_literal_unwrap))]
    let target = target.unwrap_or_else(|| {
        let advisory = if url.contains("mode=advisory") {
            "-advisory"
        } else {
            ""
        };
        format!("{scheme}{advisory}")
    });
    let report = Report {
        json: args.json,
        target,
        rows: Default::default(),
    };
    let limits = redis_limits(&url)?;
    if let Some(l) = &limits {
        plot.rates.push(("limit: SET / 2".into(), l.set / 2.0));
        for (rate, cmd) in [(l.set, &l.set_cmd), (l.eval, &l.eval_cmd)] {
            report.row(
                json!({"limit": true, "backend": scheme, "command": cmd, "clients": 1,
                              "ops_per_sec": rate}),
            );
        }
    }
    // The raw loop runs in slices between S1's when S1 runs, else at once.
    let mut raw = raw::RawLoop::open(&url).await?;
    let limit_row = |raw: &raw::RawLoop, plot: &mut Plot| {
        if !raw.is_redis() {
            plot.rates
                .push(("limit: raw write loop".into(), raw.pairs_rate()));
        }
        report.row(
            json!({"limit": true, "backend": scheme, "command": raw.command(),
                          "clients": 1, "ops_per_sec": raw.rate()}),
        );
    };
    if let Some(r) = &mut raw
        && !args.scenarios.contains(&Scenario::S1)
    {
        r.run(r.default_n).await?;
        limit_row(r, &mut plot);
    }
    for s in &args.scenarios {
        match s {
            Scenario::S1 => {
                let pb = bar("S1", Some(args.iterations));
                let r = s1(&client, args.iterations, pb.as_ref(), raw.as_mut()).await?;
                pb.inspect(|b| b.finish_and_clear());
                if let Some(raw) = &raw {
                    limit_row(raw, &mut plot);
                }
                plot.latency
                    .push(("S1 acquire+release".into(), r.total.clone()));
                plot.rates.push(("S1".into(), r.ops));
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
                match &raw {
                    Some(raw) if raw.is_redis() => {
                        row["ratio_to_client_set_half"] = json!(r.ops / raw.pairs_rate());
                    }
                    Some(raw) => row["ratio_to_limit"] = json!(r.ops / raw.pairs_rate()),
                    None => {}
                }
                report.row(row);
            }
            Scenario::S3 => {
                let pb = bar("S3", None);
                let r = s2(&url, &client, &args, Some(1024)).await?;
                pb.inspect(|b| b.finish_and_clear());
                plot.latency
                    .push(("S3 acquire+release".into(), r.wait.clone()));
                plot.rates
                    .push(("S3 (8 procs, 1,024 keys)".into(), r.total as f64 / r.secs));
                report.row(json!({
                    "scenario": "S3", "backend": scheme, "clients": args.processes, "keys": 1024,
                    "duration_s": r.secs, "ops_per_sec": r.total as f64 / r.secs,
                    "p50_us": r.wait.value_at_quantile(0.5), "p99_us": r.wait.value_at_quantile(0.99),
                }));
            }
            Scenario::S5 => {
                let pb = bar("S5", Some(u64::from(args.leases)));
                let row = s5(&url, &args, pb.clone()).await?;
                pb.inspect(|b| b.finish_and_clear());
                report.row(row);
            }
            Scenario::R1 => {
                let pb = bar("R1", None);
                let rows = r1(&client, args.iterations).await?;
                pb.inspect(|b| b.finish_and_clear());
                for (what, r) in rows {
                    plot.rates.push((format!("R1 {what}"), r.ops));
                    let h = &r.total;
                    let mut row = json!({
                        "scenario": "R1", "backend": scheme, "clients": 1, "recipe": what,
                        "iterations": r.n, "duration_s": r.secs, "ops_per_sec": r.ops,
                        "p50_us": h.value_at_quantile(0.5), "p99_us": h.value_at_quantile(0.99),
                    });
                    if let Some(l) = &limits {
                        row["ratio_to_set"] = json!(r.ops / l.set);
                        row["ratio_to_eval"] = json!(r.ops / l.eval);
                    }
                    report.row(row);
                }
            }
            Scenario::F1 => {
                let pb = bar("F1", None);
                let rows = crate::demo::bench_rows(&url, args.processes).await?;
                pb.inspect(|b| b.finish_and_clear());
                for row in rows {
                    if let Some(r) = row["ops_per_sec"].as_f64() {
                        plot.rates
                            .push((format!("F1 {}", row["mode"].as_str().unwrap_or("")), r));
                    }
                    report.row(row);
                }
            }
            Scenario::S2 => {
                let pb = bar("S2", None);
                let r = s2(&url, &client, &args, None).await?;
                pb.inspect(|b| b.finish_and_clear());
                plot.latency.push(("S2 wait".into(), r.wait.clone()));
                plot.rates
                    .push(("S2 (8 procs, one lock)".into(), r.total as f64 / r.secs));
                let mut row = json!({
                    "scenario": "S2", "backend": scheme, "clients": args.processes,
                    "fair": args.fair, "duration_s": r.secs, "acquisitions": r.total,
                    "ops_per_sec": r.total as f64 / r.secs,
                    "p50_us": r.wait.value_at_quantile(0.5), "p99_us": r.wait.value_at_quantile(0.99),
                    "jain": r.jain, "run_length_mean": r.run_mean, "run_length_max": r.run_max,
                    "lost_updates": r.lost_updates,
                });
                if let Some(l) = &limits {
                    row["ratio_to_set"] = json!(r.total as f64 / r.secs / l.set);
                }
                if r.round_trips > 0 {
                    // Every request the workers sent (the lock's, the
                    // counter's read and write) per acquisition.
                    row["server_requests_per_op"] =
                        json!(r.round_trips as f64 / r.total.max(1) as f64);
                }
                report.row(row);
            }
            Scenario::S4 => {
                let pb = bar("S4", None);
                let h = s4(&url, &client, args.handoffs, args.fair).await?;
                pb.inspect(|b| b.finish_and_clear());
                plot.latency.push(("S4 handoff".into(), h.clone()));
                let mut row = json!({
                    "scenario": "S4", "backend": scheme, "clients": 2, "handoffs": h.len(), "fair": args.fair,
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
    if let Some(r) = raw {
        r.close().await;
    }
    if let Some(t) = report.tables()? {
        println!();
        print!("{t}");
    }
    if let Some(path) = &args.plot {
        plot.draw(path, &scheme)?;
        if !args.json {
            eprintln!("fenced bench: plot written to {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A progress bar (a bar with `len`, else a spinner with the time spent)
/// on stderr when it is a terminal and the output is not JSON.
fn progress(show: bool, what: &str, len: Option<u64>) -> Option<indicatif::ProgressBar> {
    use indicatif::{ProgressBar, ProgressStyle};
    if !show || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return None;
    }
    let b = match len {
        Some(n) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{prefix} {spinner} {elapsed} {msg}")
                .expect("a valid template"),
        ),
    };
    b.set_prefix(what.to_owned());
    b.enable_steady_tick(Duration::from_millis(200));
    Some(b)
}

/// What `--plot` draws: latency distributions and rates.
#[derive(Default)]
struct Plot {
    latency: Vec<(String, Histogram<u64>)>,
    rates: Vec<(String, f64)>,
}

impl Plot {
    /// Two panels: latency by percentile (log µs) per scenario, and the
    /// rates beside the limit.
    fn draw(&self, path: &std::path::Path, backend: &str) -> anyhow::Result<()> {
        use plotters::prelude::*;
        let root = SVGBackend::new(path, (1100, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let (left, right) = root.split_horizontally(600);
        let max_us = self
            .latency
            .iter()
            .map(|(_, h)| h.max())
            .max()
            .unwrap_or(1)
            .max(10);
        let mut chart = ChartBuilder::on(&left)
            .caption(
                format!("{backend}: latency by percentile"),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..3.0f64, (1f64..max_us as f64 * 2.0).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("µs")
            .x_labels(4)
            .x_label_formatter(&|x| format!("p{}", 100.0 * (1.0 - 10f64.powf(-x))))
            .draw()?;
        for (i, (name, h)) in self.latency.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            // x = "nines": 1 is p90, 2 is p99, 3 is p99.9.
            let points: Vec<(f64, f64)> = (0..=60)
                .map(|k| {
                    let x = f64::from(k) / 20.0;
                    let q = (1.0 - 10f64.powf(-x)).min(0.9999);
                    (x, h.value_at_quantile(q).max(1) as f64)
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()?;
        let n = self.rates.len().max(1);
        let max_rate = self.rates.iter().map(|r| r.1).fold(1.0, f64::max);
        let mut bars = ChartBuilder::on(&right)
            .caption("operations per second", ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(170)
            .build_cartesian_2d(0f64..max_rate * 1.1, 0f64..n as f64)?;
        let names: Vec<String> = self.rates.iter().map(|r| r.0.clone()).collect();
        bars.configure_mesh()
            .disable_y_mesh()
            .y_labels(n * 2 + 1)
            .y_label_formatter(&|y| {
                let i = (n as f64 - y - 0.5).round();
                let centred = (n as f64 - y - 0.5 - i).abs() < 1e-6;
                match (centred, names.get(i as usize)) {
                    (true, Some(s)) => s.clone(),
                    _ => String::new(),
                }
            })
            .draw()?;
        bars.draw_series(self.rates.iter().enumerate().map(|(i, (name, r))| {
            let y = (n - 1 - i) as f64;
            let color = if name.starts_with("limit") {
                RGBColor(150, 150, 150)
            } else {
                RGBColor(40, 110, 180)
            };
            Rectangle::new([(0.0, y + 0.15), (*r, y + 0.85)], color.filled())
        }))?;
        root.present()?;
        Ok(())
    }
}

struct S1 {
    ops: f64,
    total: Histogram<u64>,
    acquire: Histogram<u64>,
    n: u64,
    secs: f64,
}

/// S1, in [`S1_SLICES`] slices with a slice of the engine's raw loop
/// before each, if there is one; only S1's own time counts in its rate.
async fn s1(
    client: &fenced::Client,
    iterations: u64,
    pb: Option<&indicatif::ProgressBar>,
    mut raw: Option<&mut raw::RawLoop>,
) -> anyhow::Result<S1> {
    let lock = client.mutex("bench:s1")?;
    let mut h = Histogram::<u64>::new(3)?;
    let mut ha = Histogram::<u64>::new(3)?;
    // Warm up: connections, script cache.
    for _ in 0..100 {
        lock.acquire().await?.release().await?;
    }
    let bounded = Instant::now();
    let mut secs = 0.0;
    let mut n = 0;
    let slice = iterations.div_ceil(S1_SLICES).max(1);
    while n < iterations && bounded.elapsed() < S1_LIMIT {
        if let Some(r) = raw.as_deref_mut() {
            r.run(r.default_n.div_ceil(S1_SLICES)).await?;
        }
        let started = Instant::now();
        let end = (n + slice).min(iterations);
        while n < end && bounded.elapsed() < S1_LIMIT {
            let t = Instant::now();
            let g = lock.acquire().await?;
            ha.record(t.elapsed().as_micros() as u64)?;
            g.release().await?;
            h.record(t.elapsed().as_micros() as u64)?;
            n += 1;
            if n % 256 == 0
                && let Some(b) = pb
            {
                b.set_position(n);
            }
        }
        secs += started.elapsed().as_secs_f64();
    }
    Ok(S1 {
        ops: n as f64 / secs,
        total: h,
        acquire: ha,
        n,
        secs,
    })
}

/// R1: a counter's `add(1)`, a rate limiter's decision, and a work
/// queue's item (pushed, taken and finished), one after another from one
/// client, `iterations` of each (at most S1's bound in time each); the
/// rate limiter is refused where the backend has none.
async fn r1(client: &fenced::Client, iterations: u64) -> anyhow::Result<Vec<(&'static str, S1)>> {
    let mut rows = Vec::new();
    let counter = client.counter("bench:r1:counter")?;
    rows.push((
        "counter add",
        timed_loop(iterations, || async { counter.add(1).await.map(drop) }).await?,
    ));
    // Every decision granted: what a decision costs, not how it waits.
    if let Ok(limiter) = client.rate_limiter("bench:r1:rate", 1e6, fenced::MAX_BURST) {
        rows.push((
            "rate decision",
            timed_loop(iterations, || async {
                limiter.try_acquire(1).await.map(drop)
            })
            .await?,
        ));
    }
    let queue = client.queue("bench:r1:queue")?;
    rows.push((
        "queue item",
        timed_loop(iterations, || async {
            queue.push(b"job").await?;
            queue.take().await?.ack().await
        })
        .await?,
    ));
    Ok(rows)
}

/// `op` `iterations` times (after 100 to warm up), bounded by S1's time.
async fn timed_loop<F, Fut>(iterations: u64, mut op: F) -> anyhow::Result<S1>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = fenced::Result<()>>,
{
    for _ in 0..100 {
        op().await?;
    }
    let mut h = Histogram::<u64>::new(3)?;
    let started = Instant::now();
    let mut n = 0;
    while n < iterations && started.elapsed() < S1_LIMIT {
        let t = Instant::now();
        op().await?;
        h.record(t.elapsed().as_micros() as u64)?;
        n += 1;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(S1 {
        ops: n as f64 / secs,
        acquire: h.clone(),
        total: h,
        n,
        secs,
    })
}

/// S4: this process is A; a `bench-handoff-worker` process is B.
/// What S2's workers did together.
struct S2 {
    secs: f64,
    total: u64,
    wait: Histogram<u64>,
    jain: f64,
    run_mean: f64,
    run_max: u64,
    lost_updates: i64,
    round_trips: u64,
}

/// One S2 worker's record: when it got the lock (CLOCK_MONOTONIC ns) and
/// how long it waited for it (µs).
#[derive(serde::Serialize, serde::Deserialize)]
struct S2Record {
    at_ns: Vec<u64>,
    wait_us: Vec<u64>,
    /// Redis round trips the worker's client sent, from `go` to the end.
    #[serde(default)]
    round_trips: u64,
}

async fn s2(
    url: &str,
    client: &fenced::Client,
    args: &BenchArgs,
    keys: Option<u32>,
) -> anyhow::Result<S2> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let name = if keys.is_some() {
        "bench:s3"
    } else {
        "bench:s2"
    };
    let counter = client.register("bench:s2:counter")?;
    if keys.is_none() {
        counter.write_unfenced("0").await?;
    }
    let exe = std::env::current_exe()?;
    let mut workers = Vec::new();
    for _ in 0..args.processes {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("--backend")
            .arg(url)
            .arg("bench-s2-worker")
            .arg(name)
            .arg("--duration")
            .arg(format!("{}ms", args.duration.as_millis()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if args.fair {
            cmd.arg("--fair");
        }
        if let Some(k) = keys {
            cmd.arg("--keys").arg(k.to_string());
        }
        let mut w = cmd.spawn().context("start an S2 worker")?;
        let stdin = w.stdin.take().context("worker stdin")?;
        let stdout = tokio::io::BufReader::new(w.stdout.take().context("worker stdout")?);
        workers.push((w, stdin, stdout));
    }
    // Start together: every worker has connected before any begins.
    let mut line = String::new();
    for (_, _, out) in &mut workers {
        line.clear();
        out.read_line(&mut line).await?;
        if line.trim() != "ready" {
            bail!("an S2 worker said {line:?}");
        }
    }
    let start = Instant::now();
    for (_, stdin, _) in &mut workers {
        stdin.write_all(b"go\n").await?;
    }
    let mut records = Vec::new();
    for (mut w, _, mut out) in workers {
        line.clear();
        out.read_line(&mut line).await?;
        let r: S2Record = serde_json::from_str(line.trim())
            .with_context(|| format!("an S2 worker's record {line:?}"))?;
        w.wait().await?;
        records.push(r);
    }
    let secs = start.elapsed().as_secs_f64();
    let mut wait = Histogram::<u64>::new(3)?;
    let mut order = Vec::new();
    for (i, r) in records.iter().enumerate() {
        for (&at, &w) in r.at_ns.iter().zip(&r.wait_us) {
            wait.record(w)?;
            order.push((at, i));
        }
    }
    order.sort_unstable();
    let total = order.len() as u64;
    // Runs: back-to-back acquisitions by one process.
    let mut runs = Vec::new();
    for (k, &(_, who)) in order.iter().enumerate() {
        if k == 0 || order[k - 1].1 != who {
            runs.push(0u64);
        }
        *runs.last_mut().expect("pushed") += 1;
    }
    let counts: Vec<f64> = records.iter().map(|r| r.at_ns.len() as f64).collect();
    let sum: f64 = counts.iter().sum();
    let squares: f64 = counts.iter().map(|c| c * c).sum();
    let jain = if squares > 0.0 {
        sum * sum / (counts.len() as f64 * squares)
    } else {
        0.0
    };
    let end = match keys {
        None => counter.read_i64().await?.unwrap_or(0),
        Some(_) => total as i64,
    };
    Ok(S2 {
        secs,
        total,
        wait,
        jain,
        run_mean: if runs.is_empty() {
            0.0
        } else {
            total as f64 / runs.len() as f64
        },
        run_max: runs.iter().copied().max().unwrap_or(0),
        lost_updates: total as i64 - end,
        round_trips: records.iter().map(|r| r.round_trips).sum(),
    })
}

/// An S2 worker: after `go`, for the duration: acquire, read the counter,
/// write it + 1 under the fencing token, release. Prints its record as
/// one JSON line.
pub(crate) async fn s2_worker(
    backend: Option<String>,
    args: S2WorkerArgs,
) -> anyhow::Result<ExitCode> {
    let client = crate::connect(backend.as_deref()).await?;
    let lock = client
        .mutex(&args.name)?
        .lease(Duration::from_secs(10))
        .fair(args.fair);
    let counter = client.register(&format!("{}:counter", args.name))?;
    let mut out = std::io::stdout();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let mut rec = S2Record {
        at_ns: Vec::new(),
        wait_us: Vec::new(),
        round_trips: 0,
    };
    let trips0 = fenced::metrics::redis_round_trips();
    let end = Instant::now() + args.duration;
    if let Some(keys) = args.keys {
        // S3: many keys, little contention; the figure is the aggregate rate.
        let locks: Vec<fenced::Mutex> = (0..keys.max(1))
            .map(|k| client.mutex(&format!("{}:{k}", args.name)))
            .collect::<Result<_, _>>()?;
        while Instant::now() < end {
            let lock = &locks[fastrand::usize(..locks.len())];
            let asked = Instant::now();
            lock.acquire().await?.release().await?;
            rec.at_ns.push(mono_ns());
            rec.wait_us.push(asked.elapsed().as_micros() as u64);
        }
        rec.round_trips = fenced::metrics::redis_round_trips() - trips0;
        writeln!(out, "{}", serde_json::to_string(&rec)?)?;
        out.flush()?;
        client.close().await;
        return Ok(ExitCode::SUCCESS);
    }
    while Instant::now() < end {
        let asked = Instant::now();
        let Some(g) = lock.acquire_timeout(end - asked).await? else {
            break;
        };
        rec.at_ns.push(mono_ns());
        rec.wait_us.push(asked.elapsed().as_micros() as u64);
        let n = counter.read_i64().await?.unwrap_or(0);
        counter.write(&g, (n + 1).to_string()).await?;
        g.release().await?;
    }
    rec.round_trips = fenced::metrics::redis_round_trips() - trips0;
    writeln!(out, "{}", serde_json::to_string(&rec)?)?;
    out.flush()?;
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

async fn s4(
    url: &str,
    client: &fenced::Client,
    reps: u64,
    fair: bool,
) -> anyhow::Result<Histogram<u64>> {
    let name = "bench:s4";
    let lock = client.mutex(name)?.fair(fair);
    let exe = std::env::current_exe()?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("--backend")
        .arg(url)
        .arg("bench-handoff-worker")
        .arg(name);
    if fair {
        cmd.arg("--fair");
    }
    let mut b = cmd
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
    let lock = client.mutex(&args.name)?.fair(args.fair);
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

/// This process's resident set, MB, and CPU time used, s (from /proc).
fn rss_and_cpu() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i)?.parse::<f64>().ok())
        .sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    (rss_kb / 1024.0, ticks / hz)
}

/// S5: hold `--leases` leases (30 s, watchdog on) for `--hold`; RSS, CPU,
/// the server commands the renewals cost, leases lost.
async fn s5(
    url: &str,
    args: &BenchArgs,
    pb: Option<indicatif::ProgressBar>,
) -> anyhow::Result<serde_json::Value> {
    let client = fenced::Client::connect(url).await?;
    let n = args.leases;
    let (rss0, _) = rss_and_cpu();
    let started = Instant::now();
    // Acquire with 64 tasks at a time: one client, one connection set.
    let mut tasks = tokio::task::JoinSet::new();
    let per = n.div_ceil(64);
    for t in 0..64u32 {
        let c = client.clone();
        tasks.spawn(async move {
            let mut held = Vec::new();
            for i in (t * per)..((t + 1) * per).min(n) {
                let lock = c
                    .mutex(&format!("bench:s5:{i}"))?
                    .lease(Duration::from_secs(30));
                held.push(lock.acquire().await?);
            }
            anyhow::Ok(held)
        });
    }
    let mut guards = Vec::with_capacity(n as usize);
    while let Some(r) = tasks.join_next().await {
        guards.extend(r??);
    }
    let acquire_s = started.elapsed().as_secs_f64();
    let trips0 = fenced::metrics::redis_round_trips();
    let (_, cpu0) = rss_and_cpu();
    let hold_started = Instant::now();
    if let Some(b) = &pb {
        b.set_message(format!(
            "holding {n} leases for {}",
            humantime::format_duration(args.hold)
        ));
    }
    tokio::time::sleep(args.hold).await;
    let held_s = hold_started.elapsed().as_secs_f64();
    let (rss, cpu1) = rss_and_cpu();
    let trips = fenced::metrics::redis_round_trips() - trips0;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    let release_started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut it = guards.into_iter();
    loop {
        let chunk: Vec<fenced::Guard> = it.by_ref().take(n.div_ceil(64) as usize).collect();
        if chunk.is_empty() {
            break;
        }
        tasks.spawn(async move {
            for g in chunk {
                g.release().await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let release_s = release_started.elapsed().as_secs_f64();
    client.close().await;
    let mut row = json!({
        "scenario": "S5", "backend": url.split(':').next().unwrap_or(""), "clients": 1,
        "leases": n, "lease_s": 30, "duration_s": held_s,
        "acquire_per_sec": f64::from(n) / acquire_s, "release_per_sec": f64::from(n) / release_s,
        "rss_mb": rss, "rss_growth_mb": rss - rss0, "cpu_percent": 100.0 * (cpu1 - cpu0) / held_s,
        "leases_lost": lost,
    });
    if url.starts_with("redis") {
        // The renewals' requests: a round trip renews up to 1,000 leases.
        row["server_commands_per_sec"] = json!(trips as f64 / held_s);
    }
    Ok(row)
}

/// The rows of several runs (JSON lines) as Markdown tables, one per
/// scenario, each figure beside the engine's limit from the same run.
fn tables(jsonl: &str) -> anyhow::Result<String> {
    let rows: Vec<serde_json::Value> = jsonl
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("a line is not a bench row")?;
    let num = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    // Per target: the single-client write limit, as acquire+release pairs/s.
    let limit = |target: &str| -> Option<(f64, String)> {
        rows.iter()
            .filter(|r| r["limit"] == true && r["target"] == target)
            .find_map(|r| {
                let cmd = r["command"].as_str().unwrap_or("");
                let rate = num(r, "ops_per_sec");
                if cmd.contains("-t set") {
                    Some((rate / 2.0, "SET/2".to_owned()))
                } else if cmd.contains("EVAL") {
                    None
                } else if cmd.contains("INSERT") {
                    Some((rate / 2.0, "upsert/2".to_owned()))
                } else {
                    Some((rate, "create+delete".to_owned()))
                }
            })
    };
    let of = |s: &'static str| rows.iter().filter(move |r| r["scenario"] == s);
    let t = |r: &serde_json::Value| r["target"].as_str().unwrap_or("?").to_owned();
    let mut out = String::new();
    out += "### S1 uncontended (1 client, acquire + release)\n\n\
             | target | ops/s | p50 µs | p99 µs | p99.9 µs | limit pairs/s (what) | ratio |\n\
             |---|---|---|---|---|---|---|\n";
    for r in of("S1") {
        let (lim, ratio) = match limit(&t(r)) {
            Some((l, what)) => (
                format!("{l:.0} ({what})"),
                format!("{:.2}", num(r, "ops_per_sec") / l),
            ),
            None => ("–".into(), "–".into()),
        };
        out += &format!(
            "| {} | {:.0} | {} | {} | {} | {lim} | {ratio} |\n",
            t(r),
            num(r, "ops_per_sec"),
            r["p50_us"],
            r["p99_us"],
            r["p999_us"],
        );
    }
    out += "\n### S2 contended (processes on one lock, read-modify-write of a counter)\n\n\
             | target | processes | fair | acquisitions/s | wait p50 / p99 µs | Jain | run length mean (max) | server requests per acquisition | lost updates |\n\
             |---|---|---|---|---|---|---|---|---|\n";
    for r in of("S2") {
        out += &format!(
            "| {} | {} | {} | {:.0} | {} / {} | {:.2} | {:.1} ({}) | {} | {} |\n",
            t(r),
            r["clients"],
            r["fair"],
            num(r, "ops_per_sec"),
            r["p50_us"],
            r["p99_us"],
            num(r, "jain"),
            num(r, "run_length_mean"),
            r["run_length_max"],
            r["server_requests_per_op"]
                .as_f64()
                .map_or("–".into(), |x| format!("{x:.1}")),
            r["lost_updates"]
        );
    }
    out += "\n### S3 many keys (processes over 1,024 keys)\n\n\
             | target | processes | ops/s | p50 µs | p99 µs |\n|---|---|---|---|---|\n";
    for r in of("S3") {
        out += &format!(
            "| {} | {} | {:.0} | {} | {} |\n",
            t(r),
            r["clients"],
            num(r, "ops_per_sec"),
            r["p50_us"],
            r["p99_us"]
        );
    }
    out += "\n### S4 handoff (release in A to acquire in B)\n\n\
             | target | fair | p50 µs | p99 µs | p50 in SET round trips |\n|---|---|---|---|---|\n";
    for r in of("S4") {
        out += &format!(
            "| {} | {} | {} | {} | {} |\n",
            t(r),
            r["fair"].as_bool().unwrap_or(false),
            r["p50_us"],
            r["p99_us"],
            r["p50_round_trips"]
                .as_f64()
                .map_or("–".into(), |x| format!("{x:.1}"))
        );
    }
    out += "\n### S5 held-lease scale (1 process, leases of 30 s, watchdog on)\n\n\
             | target | leases | held s | acquire/s | RSS MB | CPU % | server commands/s | leases lost |\n\
             |---|---|---|---|---|---|---|---|\n";
    for r in of("S5") {
        out += &format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {} | {} |\n",
            t(r),
            r["leases"],
            num(r, "duration_s"),
            num(r, "acquire_per_sec"),
            num(r, "rss_mb"),
            num(r, "cpu_percent"),
            r["server_commands_per_sec"]
                .as_f64()
                .map_or("–".into(), |x| format!("{x:.1}")),
            r["leases_lost"]
        );
    }
    out += "\n### F1 flash sale (stock 1,000, 8 processes, 100,000 attempts)\n\n\
             | target | mode | sold | oversold | purchases/s |\n|---|---|---|---|---|\n";
    for r in of("F1") {
        out += &format!(
            "| {} | {} | {} | {} | {:.0} |\n",
            t(r),
            r["mode"].as_str().unwrap_or(""),
            r["sold"],
            r["oversold"],
            num(r, "ops_per_sec")
        );
    }
    Ok(without_empty_sections(&out))
}

/// `text` without the `### ` sections whose table has no row (scenarios
/// the run did not have).
fn without_empty_sections(text: &str) -> String {
    let mut out = String::new();
    for (i, section) in text.split("\n### ").enumerate() {
        let rows = section.lines().filter(|l| l.starts_with("| ")).count();
        // A header row and no other: nothing was measured.
        if rows > 1 {
            if !out.is_empty() {
                out += "\n";
            }
            if i > 0 {
                out += "### ";
            }
            out += section.trim_end_matches('\n');
            out += "\n";
        }
    }
    out
}
