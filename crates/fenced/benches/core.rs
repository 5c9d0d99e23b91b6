//! The core's in-process overhead, on `memory://` (no I/O): one acquire +
//! release, the same with 100,000 other holds in the client's hold table,
//! and the watchdog's CPU per renewal round with 100,000 renewed holds.
//!
//! `cargo bench -p fenced --bench core`

use criterion::{Criterion, criterion_group, criterion_main};
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Holds `n` leases on `client` (names `held:<i>`).
async fn hold(client: &fenced::Client, n: u32, lease: Duration) -> Vec<fenced::Guard> {
    let mut guards = Vec::with_capacity(n as usize);
    for i in 0..n {
        let lock = client
            .mutex(&format!("held:{i}"))
            .expect("a name")
            .lease(lease);
        guards.push(lock.acquire().await.expect("memory:// grants"));
    }
    guards
}

/// CPU time this process has used (user + system).
fn cpu_time() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    tv(usage.user_time()) + tv(usage.system_time())
}

/// One acquire + release of `bench` on `client`, as a criterion bench.
fn cycle(c: &mut Criterion, rt: &tokio::runtime::Runtime, what: &str, client: &fenced::Client) {
    let lock = client.mutex("bench").expect("a name");
    c.bench_function(what, |b| {
        b.to_async(rt).iter(|| async {
            let g = lock.acquire().await.expect("free");
            g.release().await.expect("held")
        })
    });
}

fn acquire_release(c: &mut Criterion) {
    let rt = runtime();
    let connect = |ns: &str| {
        rt.block_on(fenced::Client::connect(&format!("memory://{ns}")))
            .expect("memory://")
    };
    cycle(
        c,
        &rt,
        "acquire+release, empty hold table",
        &connect("bench-ar"),
    );
    let busy = connect("bench-busy");
    let _held = rt.block_on(hold(&busy, 100_000, Duration::from_secs(600)));
    cycle(c, &rt, "acquire+release, 100,000 other holds", &busy);
}

fn watchdog(c: &mut Criterion) {
    let rt = runtime();
    let client = rt
        .block_on(fenced::Client::connect("memory://bench-wd"))
        .expect("memory://");
    // A 3 s lease is renewed every second: each second is one round.
    let _held = rt.block_on(hold(&client, 100_000, Duration::from_secs(3)));
    let mut group = c.benchmark_group("watchdog");
    group.sample_size(10);
    group.bench_function("CPU per renewal round, 100,000 holds", |b| {
        b.iter_custom(|rounds| {
            let mut cpu = Duration::ZERO;
            for _ in 0..rounds {
                let c0 = cpu_time();
                rt.block_on(async { tokio::time::sleep(Duration::from_secs(1)).await });
                // Time asleep costs no CPU: what was used is the round's.
                cpu += cpu_time() - c0;
            }
            cpu
        })
    });
    group.finish();
}

criterion_group!(benches, acquire_release, watchdog);
criterion_main!(benches);
