//! `fenced-peers wake`: how long a Redis `PUBLISH` takes to reach a
//! subscriber in another process that has been idle for a while: the
//! floor under any hand-over whose waiter sleeps until it is told (S4),
//! whatever the lock library.
//!
//! The publisher sleeps the idle gap, then publishes its wall clock in
//! ns; the subscriber (a child process of this binary, one machine, one
//! clock) takes the difference on receipt. Figures are µs and round trips
//! of `redis-benchmark -c 1 SET` measured just before.

use anyhow::{Context, Result};
use futures_util::StreamExt;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const CHANNEL: &str = "peers:wake";

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The driver: for each idle gap, a fresh subscriber process and `n`
/// publishes; prints one Markdown row per gap.
pub(crate) fn run(url: &str, gaps_ms: &[u64], n: usize) -> Result<()> {
    let y = crate::scenarios::redis_set_limit(url)?;
    println!("Y = `redis-benchmark -c 1 -n 20000 -t set`: {y:.0} requests/s\n");
    println!("| idle gap (ms) | publish to receipt p50 (µs) | p90 (µs) | p50 (round trips) |");
    println!("|---|---|---|---|");
    let rt = tokio::runtime::Runtime::new()?;
    for &gap in gaps_ms {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["wake-sub", url])
            .stdout(Stdio::piped())
            .spawn()
            .context("the subscriber process")?;
        let mut lines = BufReader::new(child.stdout.take().context("its stdout")?).lines();
        anyhow::ensure!(
            lines.next().transpose()?.as_deref() == Some("ready"),
            "the subscriber did not start"
        );
        rt.block_on(async {
            let client = redis::Client::open(url)?;
            let mut c = client.get_multiplexed_async_connection().await?;
            for i in 0..=n {
                tokio::time::sleep(Duration::from_millis(gap)).await;
                let msg = if i == n {
                    "end".to_owned()
                } else {
                    now_ns().to_string()
                };
                redis::cmd("PUBLISH")
                    .arg(CHANNEL)
                    .arg(msg)
                    .query_async::<i64>(&mut c)
                    .await?;
            }
            anyhow::Ok(())
        })?;
        let line = lines
            .next()
            .transpose()?
            .context("the subscriber's figures")?;
        child.wait()?;
        let mut it = line.split_whitespace().map(str::parse::<f64>);
        let (Some(Ok(p50)), Some(Ok(p90))) = (it.next(), it.next()) else {
            anyhow::bail!("the subscriber said {line:?}");
        };
        println!("| {gap} | {p50:.0} | {p90:.0} | {:.1} |", p50 * y / 1e6);
    }
    Ok(())
}

/// The subscriber: says `ready` once subscribed, then prints the p50 and
/// p90 in µs when `end` comes.
pub(crate) async fn subscriber(url: &str) -> Result<()> {
    let client = redis::Client::open(url)?;
    let mut ps = client.get_async_pubsub().await?;
    ps.subscribe(CHANNEL).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready")?;
        out.flush()?;
    }
    let mut got = Vec::new();
    let mut messages = ps.on_message();
    while let Some(m) = messages.next().await {
        let text: String = m.get_payload()?;
        if text == "end" {
            break;
        }
        got.push(now_ns().saturating_sub(text.parse()?) as f64 / 1e3);
    }
    anyhow::ensure!(!got.is_empty(), "no message came");
    got.sort_by(f64::total_cmp);
    let at = |q: f64| got[((got.len() - 1) as f64 * q) as usize];
    println!("{} {}", at(0.5), at(0.9));
    Ok(())
}
