//! `fenced torture`: worker processes contend for one lock and increment a
//! fenced counter while faults are injected; the recorded history is
//! checked against what the backend claims (RELIABILITY.md).
//!
//! - Workers (`torture-worker`, one process each) loop: acquire, read the
//!   counter, hold a random short time, write it + 1 under the fencing
//!   token, release. Every step is one JSON event on stdout, stamped with
//!   CLOCK_MONOTONIC.
//! - The counter lives in an SQLite file of the run's own, outside the
//!   lock backend: the resource that checks tokens, as a storage service
//!   would. A Redis restart cannot wipe it.
//! - Faults, in turn, every `--fault-every`: kill -9 or SIGSTOP the
//!   holder; reset or blackhole its connections (a TCP proxy per worker);
//!   kill and restart the server, the leader or the Sentinel master (with
//!   `--spawn`, which starts the topology here).

use crate::usage;
use anyhow::Context;
use clap::Args;
use fenced_testkit::torture::{
    self, Claim, Event, Expect, Family, Fault, Findings, Kind, mono_ns,
    proxy::Proxy,
    topology::{Running, Topology},
};
use serde_json::json;
use std::collections::HashMap;
use std::io::Write;
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

#[derive(Args, Debug)]
pub(crate) struct TortureArgs {
    /// Start this topology here (servers on loopback, in temp dirs) instead
    /// of using --backend: sqlite, redis, redis-aof, sentinel, cluster,
    /// redlock, postgres, postgres-advisory, mariadb, mariadb-advisory,
    /// zookeeper, zookeeper3, etcd, etcd3.
    #[arg(long, value_parser = Topology::parse, value_name = "TOPOLOGY")]
    spawn: Option<Topology>,
    /// Faults to inject in turn (comma-separated): kill, pause, cut,
    /// partition, restart, leader, failover, clock, stall, quorum, slow;
    /// `all` for every one the backend takes; `none` for contention only.
    #[arg(long, default_value = "all", value_name = "LIST")]
    faults: String,
    /// Worker processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=256))]
    clients: u32,
    /// How long the workload runs.
    #[arg(long, default_value = "30s", value_parser = crate::parse_positive_duration)]
    duration: Duration,
    /// The lock's lease (renewed by the watchdog while held); 2 s, or with
    /// --defaults the library's default (30 s).
    #[arg(long, value_parser = crate::parse_duration)]
    lease: Option<Duration>,
    /// Run at the settings a user gets: the default lease and, with
    /// --spawn, the backend's default session (etcd's and ZooKeeper's
    /// 10 s), not the short ones that make faults heal fast.
    #[arg(long)]
    defaults: bool,
    /// A hold lasts a random time up to this.
    #[arg(long, default_value = "20ms", value_parser = crate::parse_duration)]
    hold_max: Duration,
    /// Time between the end of one fault and the start of the next.
    #[arg(long, default_value = "2s", value_parser = crate::parse_duration)]
    fault_every: Duration,
    /// Seed for the workers' hold times and the choice of victims.
    #[arg(long)]
    seed: Option<u64>,
    /// Write every event of the run to FILE (JSON lines), to replay it.
    #[arg(long, value_name = "FILE")]
    history: Option<std::path::PathBuf>,
    /// One JSON object instead of the report.
    #[arg(long)]
    json: bool,
    /// Print what each backend claims under each fault (Markdown) and exit.
    #[arg(long)]
    claims: bool,
    /// Print the faults the --spawn topology takes, one a line, and exit.
    #[arg(long, requires = "spawn")]
    list_faults: bool,
    /// Print the reports in FILE (JSON lines from `--json` runs) as one
    /// Markdown table and exit.
    #[arg(long, value_name = "FILE")]
    table: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    name: String,
    #[arg(long)]
    id: u32,
    #[arg(long)]
    register: String,
    #[arg(long, value_parser = crate::parse_duration)]
    lease: Duration,
    #[arg(long, value_parser = crate::parse_duration)]
    hold_max: Duration,
    #[arg(long, value_parser = crate::parse_duration)]
    lost_wait: Duration,
    /// CLOCK_MONOTONIC ns at which to stop.
    #[arg(long)]
    until: u64,
    #[arg(long)]
    seed: u64,
}

const COUNTER: &str = "torture:counter";

/// One worker: loop until `--until`, print events.
pub(crate) async fn worker(backend: Option<String>, args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let id = args.id;
    // An event of worker `w`: this process, or one of its storm tasks.
    let emit_as = {
        let out = out.clone();
        move |w: u32, e: Kind| {
            let line =
                serde_json::to_string(&Event { t: mono_ns(), w, e }).expect("an event serializes");
            let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
            // A closed pipe means the driver is gone; nothing to tell.
            let _ = writeln!(o, "{line}").and_then(|_| o.flush());
        }
    };
    let emit = {
        let emit_as = emit_as.clone();
        move |e: Kind| emit_as(id, e)
    };
    let err = |op: &str, e: &dyn std::fmt::Display| Kind::Error {
        op: op.to_owned(),
        error: e.to_string(),
    };
    let client = crate::connect(backend.as_deref()).await?;
    let register = fenced::Client::connect(&args.register)
        .await?
        .register(COUNTER)?;
    let lock = client.mutex(&args.name)?.lease(args.lease);
    let mut rng = fastrand::Rng::with_seed(args.seed);
    // `slow MS` on stdin: stay MS in the next critical section, so the
    // driver can aim a fault at a holder that has read and not yet
    // written (the GC-pause case). 0: no request.
    let slow = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // `storm MS` on stdin: a cancellation storm from this client for MS.
    let (storms, mut storm_asked) = tokio::sync::mpsc::unbounded_channel::<u64>();
    std::thread::spawn({
        let slow = slow.clone();
        move || {
            use std::io::BufRead;
            for l in std::io::stdin().lock().lines() {
                let Ok(l) = l else { break };
                let number = |prefix: &str| l.trim().strip_prefix(prefix)?.parse().ok();
                if let Some(ms) = number("slow ") {
                    slow.store(ms, std::sync::atomic::Ordering::SeqCst)
                } else if let Some(ms) = number("storm ") {
                    let _ = storms.send(ms);
                }
            }
        }
    });
    tokio::spawn({
        // The default lease (30 s), not the run's short one: a grant a
        // dropped acquisition leaked then outlives the cleanup bound, where
        // the checker sees it, instead of running out unseen.
        let lock = client.mutex(&args.name)?;
        let (emit_as, seed) = (emit_as.clone(), args.seed);
        async move {
            let mut round = 0;
            while let Some(ms) = storm_asked.recv().await {
                round += 1;
                let until = tokio::time::Instant::now() + Duration::from_millis(ms);
                let mut tasks = tokio::task::JoinSet::new();
                for k in 0..STORM_TASKS {
                    let rng = fastrand::Rng::with_seed(seed ^ (round << 32) ^ u64::from(k));
                    let who = storm_id(id, k);
                    tasks.spawn(storm(lock.clone(), who, until, rng, emit_as.clone()));
                }
                let (mut tries, mut dropped, mut won) = (0, 0, 0);
                while let Some(r) = tasks.join_next().await {
                    if let Ok(c) = r {
                        (tries, dropped, won) = (tries + c.0, dropped + c.1, won + c.2);
                    }
                }
                emit_as(
                    id,
                    Kind::Storm {
                        tries,
                        dropped,
                        won,
                    },
                );
            }
        }
    });
    let left = |until: u64| Duration::from_nanos(until.saturating_sub(mono_ns()));
    while mono_ns() < args.until {
        let asked = mono_ns();
        let guard = match lock
            .acquire_timeout(left(args.until).min(Duration::from_secs(2)))
            .await
        {
            Ok(Some(g)) => g,
            Ok(None) => continue,
            Err(e) => {
                emit(err("acquire", &e));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let token = guard.fencing_token();
        emit(Kind::Acquired { token, asked });
        // The signal is told once, by whichever of the watcher and the
        // refused write's wait sees it first.
        let told = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tell_lost = {
            let (told, emit) = (told.clone(), emit.clone());
            move |r: fenced::LostReason| {
                if !told.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    emit(Kind::Lost {
                        reason: r.to_string(),
                    });
                }
            }
        };
        let mut watcher = tokio::spawn({
            let (lost, tell) = (guard.lost(), tell_lost.clone());
            async move { tell(lost.await) }
        });
        match register.read_i64().await {
            Ok(v) => {
                let v = v.unwrap_or(0);
                let mut hold = Duration::from_micros(rng.u64(0..=args.hold_max.as_micros() as u64));
                let ms = slow.swap(0, std::sync::atomic::Ordering::SeqCst);
                if ms > 0 {
                    emit(Kind::InSection { token });
                    hold = Duration::from_millis(ms);
                }
                tokio::time::sleep(hold).await;
                let sent = mono_ns();
                match register.write_with_token(token, (v + 1).to_string()).await {
                    Ok(()) => emit(Kind::Write {
                        token,
                        value: v + 1,
                        sent,
                        accepted: true,
                    }),
                    Err(e) if e.kind() == fenced::ErrorKind::StaleToken => {
                        emit(Kind::Write {
                            token,
                            value: v + 1,
                            sent,
                            accepted: false,
                        });
                        // A refused token means the lock went to another:
                        // the signal must come within the renewal bound.
                        if let Ok(r) = tokio::time::timeout(args.lost_wait, guard.lost()).await {
                            tell_lost(r);
                        }
                    }
                    Err(e) => emit(err("write", &e)),
                }
            }
            Err(e) => emit(err("read", &e)),
        }
        // A hold that ran out while the worker was stopped in its section
        // (no other holder got in, so its write went through): the lost
        // signal must still come, within the bound, not be cut short by
        // the release racing the watcher when the process wakes.
        if !guard.is_held() {
            let _ = tokio::time::timeout(args.lost_wait, &mut watcher).await;
        }
        watcher.abort();
        let called = mono_ns();
        match guard.release().await {
            Ok(ok) => emit(Kind::Released { ok, called }),
            Err(e) => {
                emit(err("release", &e));
                emit(Kind::Released { ok: false, called });
            }
        }
    }
    client.close().await;
    Ok(ExitCode::SUCCESS)
}

/// Tasks per worker in a cancellation storm.
const STORM_TASKS: u32 = 8;

/// The worker id a storm task's holds are recorded under: apart from every
/// worker process's.
fn storm_id(worker: u32, task: u32) -> u32 {
    1_000_000 + worker * 100 + task
}

/// One task of a cancellation storm, until `until`: acquisitions of
/// `lock` dropped at a random point (0–3 ms in, one in eight up to 50 ms:
/// often at once, often mid-wait, now and then just as a grant comes
/// back), by `timeout` around
/// `acquire`, `try_acquire`, or an `acquire_timeout` whose own wait is
/// about as long. What it wins it holds 0–2 ms, then releases, drops the
/// release part-way, or drops the guard. Returns (tries, dropped, won).
async fn storm(
    lock: fenced::Mutex,
    who: u32,
    until: tokio::time::Instant,
    mut rng: fastrand::Rng,
    emit: impl Fn(u32, Kind),
) -> (u64, u64, u64) {
    use tokio::time::timeout;
    let (mut tries, mut dropped, mut won) = (0, 0, 0);
    while tokio::time::Instant::now() < until {
        tries += 1;
        // Mostly within a round trip or two; one in eight long enough to
        // win now and then, so releases get dropped too.
        let cut_max = if rng.u8(0..8) == 0 { 50_000 } else { 3_000 };
        let cut = Duration::from_micros(rng.u64(0..=cut_max));
        let asked = mono_ns();
        let got = match rng.u8(0..3) {
            0 => timeout(cut, lock.acquire()).await.map(|r| r.map(Some)),
            1 => timeout(cut, lock.try_acquire()).await,
            _ => {
                let own = Duration::from_micros(rng.u64(1..=3_000));
                timeout(cut, lock.acquire_timeout(own)).await
            }
        };
        let guard = match got {
            Err(_) => {
                dropped += 1;
                continue;
            }
            Ok(Ok(Some(g))) => g,
            Ok(Ok(None)) => continue,
            Ok(Err(e)) => {
                emit(
                    who,
                    Kind::Error {
                        op: "storm acquire".into(),
                        error: e.to_string(),
                    },
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        won += 1;
        let token = guard.fencing_token();
        emit(who, Kind::Acquired { token, asked });
        tokio::time::sleep(Duration::from_micros(rng.u64(0..=2_000))).await;
        let called = mono_ns();
        match rng.u8(0..4) {
            0 => {
                // Dropped part-way: the client finishes it in the background.
                emit(who, Kind::Released { ok: true, called });
                let _ = timeout(Duration::from_micros(rng.u64(0..=1_000)), guard.release()).await;
            }
            1 => {
                emit(who, Kind::Released { ok: true, called });
                drop(guard);
            }
            _ => {
                let ok = guard.release().await.unwrap_or(false);
                emit(who, Kind::Released { ok, called });
            }
        }
    }
    (tries, dropped, won)
}

/// What the driver knows while the run goes on.
#[derive(Default)]
struct Live {
    events: Vec<Event>,
    /// Worker -> (pid, holds now, when it last acquired).
    workers: HashMap<u32, (u32, bool, u64)>,
    /// Workers that said they are in a slow critical section.
    in_section: Vec<u32>,
}

type Shared = Arc<Mutex<Live>>;

fn push(live: &Shared, e: Event) {
    let mut l = live.lock().unwrap_or_else(|p| p.into_inner());
    if matches!(e.e, Kind::InSection { .. }) {
        l.in_section.push(e.w);
    }
    if let Some(w) = l.workers.get_mut(&e.w) {
        match e.e {
            Kind::Acquired { .. } => (w.1, w.2) = (true, e.t),
            Kind::Released { .. } | Kind::Lost { .. } | Kind::Exited => w.1 = false,
            _ => {}
        }
    }
    l.events.push(e);
}

struct Run {
    exe: std::path::PathBuf,
    name: String,
    register_url: String,
    args_lease: Duration,
    hold_max: Duration,
    lost_wait: Duration,
    until: u64,
    seed: u64,
    logs: std::path::PathBuf,
    live: Shared,
    /// Per worker: the URL it uses (through its proxy, if any).
    urls: Vec<(String, Option<Proxy>)>,
    /// Per worker: its stdin, to ask for a slow section.
    stdins: HashMap<u32, tokio::process::ChildStdin>,
    /// libfaketime, when the run steps clocks: each worker reads its
    /// offset from `clock-<id>` in the logs dir.
    faketime: Option<std::path::PathBuf>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Run {
    /// Starts worker `id` on `url`; a reader task records its events.
    fn spawn(&mut self, id: u32, url: &str) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.logs.join(format!("worker-{id}.log")))?;
        let mut cmd = tokio::process::Command::new(&self.exe);
        if let Some(lib) = &self.faketime {
            let offset = self.clock_file(id);
            std::fs::write(&offset, "+0")?;
            // The wall clock only: event stamps and timers stay true.
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", &offset)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let mut child = cmd
            .arg("--backend")
            .arg(url)
            .arg("torture-worker")
            .arg(&self.name)
            .args(["--id", &id.to_string(), "--register", &self.register_url])
            .args(["--lease", &format!("{}ms", self.args_lease.as_millis())])
            .args(["--hold-max", &format!("{}us", self.hold_max.as_micros())])
            .args(["--lost-wait", &format!("{}ms", self.lost_wait.as_millis())])
            .args(["--until", &self.until.to_string()])
            .args(["--seed", &(self.seed ^ u64::from(id)).to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("start a torture worker")?;
        let pid = child.id().context("a worker without a pid")?;
        let stdout = child.stdout.take().context("worker stdout")?;
        self.stdins
            .insert(id, child.stdin.take().context("worker stdin")?);
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .workers
            .insert(id, (pid, false, 0));
        let live = self.live.clone();
        self.tasks.push(tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Event>(&line) {
                    Ok(e) => push(&live, e),
                    Err(_) => tracing::warn!("worker {id} said {line:?}"),
                }
            }
            let _ = child.wait().await;
            push(
                &live,
                Event {
                    t: mono_ns(),
                    w: id,
                    e: Kind::Exited,
                },
            );
        }));
        Ok(())
    }

    /// A worker inside its critical section: asks live workers for a
    /// section of `section` and waits (up to 5 s) for the first to say it
    /// is in one.
    async fn holder(&mut self, section: Duration) -> Option<(u32, u32)> {
        let ask = format!("slow {}\n", section.as_millis());
        use tokio::io::AsyncWriteExt;
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .in_section
            .clear();
        let ids: Vec<u32> = self.stdins.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.stdins.get_mut(&id)
                && s.write_all(ask.as_bytes()).await.is_err()
            {
                self.stdins.remove(&id);
            }
        }
        let mut found = None;
        for _ in 0..500 {
            {
                let l = self.live.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(&w) = l.in_section.first()
                    && let Some(&(pid, true, _)) = l.workers.get(&w)
                {
                    found = Some((w, pid));
                }
            }
            if found.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // One slow holder is enough: the others' next sections are normal
        // again (a long section each would stall the run after the fault).
        let ids: Vec<u32> = self.stdins.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.stdins.get_mut(&id) {
                let _ = s.write_all(b"slow 0\n").await;
            }
        }
        found
    }

    fn clock_file(&self, id: u32) -> std::path::PathBuf {
        self.logs.join(format!("clock-{id}"))
    }

    /// A live worker that does not hold the lock now.
    fn waiter(&self) -> Option<(u32, u32)> {
        let l = self.live.lock().unwrap_or_else(|p| p.into_inner());
        l.workers
            .iter()
            .filter(|(w, s)| !s.1 && self.stdins.contains_key(w))
            .map(|(&w, s)| (w, s.0))
            .min()
    }

    fn driver_event(&self, e: Kind) {
        push(
            &self.live,
            Event {
                t: mono_ns(),
                w: 0,
                e,
            },
        );
    }
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

/// A `key=duration` option of the URL's query, if present.
fn url_duration(url: &str, key: &str) -> Option<Duration> {
    let q = url.split_once('?')?.1;
    q.split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| crate::parse_duration(v).ok())
}

/// `url` with its single host:port replaced by 127.0.0.1:`port`.
fn through(url: &str, port: u16) -> anyhow::Result<String> {
    let mut u = url::Url::parse(url).with_context(|| format!("parse {url}"))?;
    u.set_host(Some("127.0.0.1"))
        .map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    u.set_port(Some(port))
        .map_err(|_| anyhow::anyhow!("{url} cannot take a port"))?;
    Ok(u.to_string())
}

/// The address of a URL naming exactly one host (what a proxy can stand in front of).
fn single_host(url: &str) -> Option<std::net::SocketAddr> {
    let u = url::Url::parse(url).ok()?;
    let host = u.host_str()?;
    if host.contains(',') {
        return None;
    }
    let port = u.port().or(match u.scheme() {
        "redis" => Some(6379),
        "postgres" | "postgresql" => Some(5432),
        "mysql" | "mariadb" => Some(3306),
        "zk" => Some(2181),
        "etcd" => Some(2379),
        _ => None,
    })?;
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()
        .ok()?
        .find(|a| a.ip().is_loopback())
}

fn parse_faults(list: &str) -> Result<Option<Vec<Fault>>, String> {
    match list.trim() {
        "all" => Ok(None),
        "none" | "" => Ok(Some(Vec::new())),
        l => l
            .split(',')
            .map(Fault::parse)
            .collect::<Result<_, _>>()
            .map(Some),
    }
}

pub(crate) async fn torture(
    backend: Option<String>,
    args: TortureArgs,
) -> anyhow::Result<ExitCode> {
    if args.claims {
        print!("{}", torture::claims_markdown());
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(path) = &args.table {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        print!("{}", markdown_table(&text)?);
        return Ok(ExitCode::SUCCESS);
    }
    if args.clients < 2 {
        return Err(usage(
            "--clients must be at least 2: a lock needs contenders",
        ));
    }
    let lease = args.lease.unwrap_or(if args.defaults {
        fenced::DEFAULT_LEASE
    } else {
        Duration::from_secs(2)
    });
    if lease < Duration::from_millis(500) {
        return Err(usage("--lease must be at least 500ms"));
    }
    let asked_faults = parse_faults(&args.faults).map_err(usage)?;
    if let Some(t) = args.spawn {
        if args.list_faults {
            for f in t.faults() {
                println!("{}", f.name());
            }
            return Ok(ExitCode::SUCCESS);
        }
        // Refuse before starting any server.
        for f in asked_faults.iter().flatten() {
            if !t.faults().contains(f) {
                return Err(usage(format!(
                    "the fault {} does not apply to the topology {}",
                    f.name(),
                    t.name()
                )));
            }
        }
    }
    let mut running: Option<Running> = None;
    let url = match (&backend, args.spawn) {
        (Some(_), Some(_)) => return Err(usage("give --backend or --spawn, not both")),
        (None, None) => {
            return Err(usage(
                "torture needs --backend URL (your servers) or --spawn TOPOLOGY",
            ));
        }
        (Some(u), None) => u.clone(),
        (None, Some(t)) => {
            if !args.json {
                eprintln!("fenced torture: starting {} ...", t.name());
            }
            let r = start(t, args.defaults)?;
            let url = r.url.clone();
            running = Some(r);
            url
        }
    };
    let family = Family::of(&url).ok_or_else(|| {
        usage(format!(
            "{url}: torture needs a backend shared between processes"
        ))
    })?;
    let endpoint = match &running {
        Some(r) => r.single_endpoint(),
        None => single_host(&url),
    };
    let applies = |f: Fault| -> Result<(), String> {
        if torture::expect(family, Some(f)).is_none() {
            return Err(format!(
                "the fault {} does not apply to {family:?}",
                f.name()
            ));
        }
        if f.needs_spawn() && !running.as_ref().is_some_and(|r| r.topology.takes(f)) {
            return Err(format!(
                "the fault {} needs --spawn with a topology that has it",
                f.name()
            ));
        }
        if f.needs_proxy() && endpoint.is_none() {
            return Err(format!(
                "the fault {} needs a backend on one loopback host:port (it puts a proxy in front)",
                f.name()
            ));
        }
        Ok(())
    };
    let faults: Vec<Fault> = match asked_faults {
        None => Fault::ALL
            .into_iter()
            .filter(|f| applies(*f).is_ok())
            .collect(),
        Some(list) => {
            for f in &list {
                applies(*f).map_err(usage)?;
            }
            list
        }
    };
    let expect = faults.iter().fold(
        torture::expect(family, None).expect("contention applies to every backend"),
        |e, f| e.and(torture::expect(family, Some(*f)).expect("checked above")),
    );
    // How long the backend may take to free a dead holder's lock: its
    // lease, or on etcd and ZooKeeper its session (10 s unless the URL
    // says otherwise), which outlives a dead client whatever the lease.
    let free_after = match family {
        Family::Etcd | Family::ZooKeeper => url_duration(&url, "session_timeout")
            .or_else(|| url_duration(&url, "lease_ttl"))
            .unwrap_or(Duration::from_secs(10)),
        _ => lease,
    };
    let bound = free_after * 2 + Duration::from_secs(5);
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);

    let dir = tempfile::tempdir()?;
    let register_url = format!("sqlite://{}", dir.path().join("register.db").display());
    let register = fenced::Client::connect(&register_url)
        .await?
        .register(COUNTER)?;
    register.write_unfenced("0").await?;
    let name = format!("torture:{:08x}", rng.u32(..));
    let proxied = faults.iter().any(|f| f.needs_proxy());
    let start = mono_ns();
    let until = start + args.duration.as_nanos() as u64;
    let mut run = Run {
        exe: std::env::current_exe()?,
        name: name.clone(),
        register_url,
        args_lease: lease,
        hold_max: args.hold_max,
        lost_wait: free_after + Duration::from_secs(3),
        until,
        seed,
        logs: dir.path().to_owned(),
        live: Shared::default(),
        urls: Vec::new(),
        stdins: HashMap::new(),
        faketime: None,
        tasks: Vec::new(),
    };
    if faults.contains(&Fault::Clock) {
        let lib = fenced_testkit::process::libfaketime()
            .context("the fault clock needs libfaketime: apt-get install faketime")?;
        run.faketime = Some(lib);
    }
    let worker_url = |run: &mut Run| -> anyhow::Result<String> {
        if !proxied {
            return Ok(url.clone());
        }
        let p = Proxy::start(endpoint.expect("checked above"))?;
        let u = through(&url, p.port())?;
        run.urls.push((u.clone(), Some(p)));
        Ok(u)
    };
    // The side probe (I4): the lock's state as the backend tells it, every
    // 100 ms, from a client of its own that no fault touches.
    let probe = {
        let (live, url, name) = (run.live.clone(), url.clone(), name.clone());
        tokio::spawn(async move {
            let Ok(c) = crate::connect(Some(&url)).await else {
                return;
            };
            loop {
                let sent = mono_ns();
                if let Ok(st) = c.status(&name).await {
                    push(
                        &live,
                        Event {
                            t: mono_ns(),
                            w: 0,
                            e: Kind::Probe {
                                sent,
                                named: st.holders.iter().map(|h| h.token).collect(),
                                holders: st.holders.len() as u32,
                            },
                        },
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut next_id = 1;
    for _ in 0..args.clients {
        let u = worker_url(&mut run)?;
        run.spawn(next_id, &u)?;
        next_id += 1;
    }
    let progress = !args.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut injected: HashMap<Fault, u32> = HashMap::new();
    let mut timeline = Vec::new();
    let mut k = 0usize;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Leave room after the last fault for the lock to be granted again.
    let room = |f: Fault| {
        let lasts = match f {
            Fault::Pause
            | Fault::Partition
            | Fault::Clock
            | Fault::Slow
            | Fault::Storm
            | Fault::Exhaust
            | Fault::Disk => free_after + Duration::from_secs(2),
            Fault::Failover => Duration::from_secs(5),
            _ => Duration::from_secs(2),
        };
        (lasts + free_after + Duration::from_secs(2)).as_nanos() as u64
    };
    while !faults.is_empty() {
        let f = faults[k % faults.len()];
        k += 1;
        if mono_ns() + room(f) > until {
            break;
        }
        if progress {
            eprint!(
                "\rfenced torture: {} ({}s left)   ",
                f.name(),
                (until - mono_ns()) / 1_000_000_000
            );
        }
        let victim = match f {
            // Every worker's link, or every worker's client, at once.
            Fault::Slow | Fault::Storm | Fault::Exhaust | Fault::Disk => None,
            // A server fault strikes while a worker holds the lock and
            // stays in its section across the outage: the case where a
            // server that forgot the lock (no persistence, a failover
            // before replication) lets a second holder in. The recovery is
            // still timed from the healing, since the holder may rightly
            // keep the lock through it.
            _ if f.needs_spawn() => {
                let _ = run
                    .holder(outage(f, free_after) + Duration::from_secs(2))
                    .await;
                None
            }
            // A waiter whose clock runs ahead sees the holder's lease over.
            Fault::Clock => run.waiter(),
            // Cut off past the lease, the holder is still in its section
            // when the lock goes to another: its write must be refused and
            // its lost signal must have fired.
            Fault::Partition => run.holder(free_after + Duration::from_secs(2)).await,
            _ => run.holder(Duration::from_secs(1)).await,
        };
        if f.needs_victim() && victim.is_none() {
            timeline.push(json!({"t_ms": (mono_ns() - start) / 1_000_000, "fault": f.name(), "skipped": "no holder"}));
            // The same fault again, once a holder shows (a dead holder's
            // session may keep the lock a while): moving on left a fault
            // of a crowded run never injected.
            k -= 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        // A fault that takes a while to put in place (a server's
        // connection limit or a disk filled) starts once it is: workers go
        // on freely while the filler works, and counting that time into the
        // fault's window let a full server pass for one that shut nobody
        // out (a loaded CI machine filled PostgreSQL's limit in seconds).
        let in_place = match f {
            Fault::Exhaust => Some(
                on_servers(&mut running, move |r| r.fault(f))
                    .await?
                    .map_err(anyhow::Error::msg)?,
            ),
            Fault::Disk => {
                let r = running.as_mut().expect("checked above");
                Some(r.fault(f).map_err(anyhow::Error::msg)?)
            }
            _ => None,
        };
        let at = (mono_ns() - start) / 1_000_000;
        run.driver_event(Kind::FaultStart {
            fault: f,
            victim: victim.map(|v| v.0),
            bound_ms: bound.as_millis() as u64,
        });
        use nix::sys::signal::Signal::{SIGCONT, SIGKILL, SIGSTOP};
        let what = match (f, victim) {
            (Fault::Kill, Some((w, pid))) => {
                // Its belief ends at the kill, not when its pipe closes.
                push(
                    &run.live,
                    Event {
                        t: mono_ns(),
                        w,
                        e: Kind::Exited,
                    },
                );
                run.stdins.remove(&w);
                signal(pid, SIGKILL);
                let u = worker_url(&mut run)?;
                run.spawn(next_id, &u)?;
                next_id += 1;
                format!("SIGKILL worker {w}")
            }
            (Fault::Pause, Some((w, pid))) => {
                signal(pid, SIGSTOP);
                tokio::time::sleep(free_after + Duration::from_secs(1)).await;
                signal(pid, SIGCONT);
                format!(
                    "SIGSTOP worker {w} for {:?}",
                    free_after + Duration::from_secs(1)
                )
            }
            (Fault::Cut, Some((w, _))) => {
                run.urls[w as usize - 1].1.as_ref().expect("proxied").cut();
                format!("reset worker {w}'s connections")
            }
            (Fault::Clock, Some((w, _))) => {
                let ahead = free_after + Duration::from_secs(3);
                std::fs::write(run.clock_file(w), format!("+{}", ahead.as_secs()))?;
                tokio::time::sleep(free_after + Duration::from_secs(2)).await;
                std::fs::write(run.clock_file(w), "+0")?;
                format!(
                    "worker {w}'s wall clock {}s ahead for {:?}",
                    ahead.as_secs(),
                    free_after + Duration::from_secs(2)
                )
            }
            (Fault::Slow, _) => {
                // Slow next to the short profile's 2 s lease, yet well
                // inside it: a SQL renewal is a few round trips, and a
                // harsher link (20-100 ms, 2% at 250 ms) cost a holder its
                // lease on PostgreSQL's lease table under a loaded machine.
                let slow = torture::proxy::Slow {
                    base: Duration::from_millis(10),
                    jitter: Duration::from_millis(40),
                    loss: 0.01,
                    rto: Duration::from_millis(200),
                };
                let lasts = free_after + Duration::from_secs(2);
                let proxies = || run.urls.iter().filter_map(|(_, p)| p.as_ref());
                proxies().for_each(|p| p.slow(Some(slow)));
                tokio::time::sleep(lasts).await;
                proxies().for_each(|p| p.slow(None));
                format!("every worker's traffic 10–50 ms late, 1% of it 200 ms more, for {lasts:?}")
            }
            (Fault::Storm, _) => {
                let lasts = free_after + Duration::from_secs(2);
                let ask = format!("storm {}\n", lasts.as_millis());
                use tokio::io::AsyncWriteExt;
                for s in run.stdins.values_mut() {
                    let _ = s.write_all(ask.as_bytes()).await;
                }
                tokio::time::sleep(lasts).await;
                format!(
                    "every worker's client {STORM_TASKS} tasks dropping acquisitions at random, \
                     for {lasts:?}"
                )
            }
            (Fault::Exhaust, _) => {
                let what = in_place.unwrap_or_default();
                // Each worker must connect again, to a full server: its
                // connections reset, and its reconnects held back a moment
                // while the hoard takes the slots they freed, as a
                // neighbour's connection storm would (a client that
                // reconnects at once otherwise wins its slot back).
                let proxies = || run.urls.iter().filter_map(|(_, p)| p.as_ref());
                for p in proxies() {
                    p.blackhole(true);
                    p.cut();
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                proxies().for_each(|p| p.blackhole(false));
                let lasts = free_after + Duration::from_secs(2);
                tokio::time::sleep(lasts).await;
                let held = on_servers(&mut running, |r| {
                    let held = r.hoarded().unwrap_or(0);
                    r.heal();
                    held
                })
                .await?;
                format!(
                    "{what}; every worker's connections reset; {held} held at the end \
                     (slots that freed taken again); freed after {lasts:?}"
                )
            }
            (Fault::Partition, Some((w, _))) => {
                let p = run.urls[w as usize - 1].1.as_ref().expect("proxied");
                p.blackhole(true);
                tokio::time::sleep(free_after + Duration::from_secs(1)).await;
                let p = run.urls[w as usize - 1].1.as_ref().expect("proxied");
                p.blackhole(false);
                format!(
                    "blackholed worker {w} for {:?}",
                    free_after + Duration::from_secs(1)
                )
            }
            // On this thread: a server restarted here dies with its thread
            // (the test kit's parent-death signal), and a blocking pool's
            // thread ends when idle.
            (_, _) => {
                let r = running.as_mut().expect("checked above");
                let what = match in_place {
                    Some(what) => what,
                    None => r.fault(f).map_err(anyhow::Error::msg)?,
                };
                let down = outage(f, free_after);
                tokio::time::sleep(down).await;
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.heal())).map_err(
                    |p| anyhow::anyhow!("could not heal {}: {}", f.name(), panic_text(&p)),
                )?;
                format!("{what}; healed after {down:?}")
            }
        };
        run.driver_event(Kind::FaultEnd { fault: f });
        *injected.entry(f).or_default() += 1;
        timeline.push(json!({"t_ms": at, "fault": f.name(), "what": what}));
        tokio::time::sleep(args.fault_every).await;
    }
    // Workers stop at `until`; a stuck one is killed 30 s later.
    probe.abort();
    let tasks = std::mem::take(&mut run.tasks);
    let stuck = tokio::time::timeout(
        Duration::from_nanos(until.saturating_sub(mono_ns())) + Duration::from_secs(30),
        futures_join(tasks),
    )
    .await
    .is_err();
    if progress {
        eprint!("\r{:60}\r", "");
    }
    // I5: after the longest lease, nothing may be held.
    tokio::time::sleep(free_after + Duration::from_secs(1)).await;
    let orphans = match crate::connect(Some(&url)).await {
        Ok(c) => {
            let n = c
                .status(&name)
                .await
                .map(|s| s.holders.len())
                .unwrap_or(usize::MAX);
            c.close().await;
            n
        }
        Err(_) => usize::MAX,
    };
    let counter = register.read_i64().await?.unwrap_or(0);
    let events = std::mem::take(&mut run.live.lock().unwrap_or_else(|p| p.into_inner()).events);
    if let Some(path) = &args.history {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        for e in &events {
            writeln!(f, "{}", serde_json::to_string(e)?)?;
        }
    }
    // A renewal interval plus a request timeout, with a second's room.
    let probing = torture::Probing {
        signal_bound_ms: (lease / 3 + Duration::from_secs(6)).as_millis() as u64,
        names_tokens: family != Family::SqlAdvisory,
        cleanup_bound_ms: 11_000,
    };
    let findings = torture::check_with(&events, counter, probing);
    let mut breaches = breaches(&findings, &expect, orphans);
    if stuck {
        breaches.push("a worker did not stop by the end of the run (killed)".into());
    }
    for f in &faults {
        if !injected.contains_key(f) {
            breaches.push(format!(
                "the fault {} was never injected (no holder seen, or no time)",
                f.name()
            ));
        }
    }
    let report = json!({
        "backend": url_redacted(&url), "family": family,
        "topology": running.as_ref().map(|r| r.topology.name()),
        "faults": faults.iter().map(|f| f.name()).collect::<Vec<_>>(),
        "injected": injected.iter().map(|(f, n)| (f.name(), n)).collect::<HashMap<_, _>>(),
        "clients": args.clients, "duration_s": args.duration.as_secs_f64(),
        "lease_ms": lease.as_millis() as u64, "bound_ms": bound.as_millis() as u64,
        "hold_max_ms": args.hold_max.as_secs_f64() * 1e3, "defaults": args.defaults,
        "seed": seed, "expect": expect, "findings": findings, "counter": counter,
        "orphans": orphans, "timeline": timeline, "breaches": breaches,
        "pass": breaches.is_empty(),
    });
    if args.json {
        println!("{report}");
    } else {
        print_report(&report, &findings, &expect, &breaches, dir.path());
    }
    if !breaches.is_empty() {
        // Keep the workers' logs for the post-mortem.
        let kept = dir.keep();
        eprintln!("fenced torture: workers' logs kept in {}", kept.display());
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts a topology's servers on this thread (they die with it), with
/// a launcher's panic turned into an error.
pub(crate) fn start(t: Topology, defaults: bool) -> anyhow::Result<Running> {
    std::panic::catch_unwind(|| t.start_with(defaults))
        .map_err(|p| anyhow::anyhow!("could not start {}: {}", t.name(), panic_text(&p)))
}

/// Runs `f` on the started topology on a blocking thread: filling a
/// server's connection limit takes a while, and the driver's one runtime
/// thread must go on reading the workers' events and probing the lock.
/// Never for what starts a server: one started on a blocking pool's
/// thread is killed when that thread ends (the test kit's parent-death
/// signal). A panic in it comes back as an error.
async fn on_servers<R: Send + 'static>(
    running: &mut Option<Running>,
    f: impl FnOnce(&mut Running) -> R + Send + 'static,
) -> anyhow::Result<R> {
    let mut r = running
        .take()
        .ok_or_else(|| anyhow::anyhow!("no servers were started (--spawn)"))?;
    let (r, out) = tokio::task::spawn_blocking(move || {
        let out = f(&mut r);
        (r, out)
    })
    .await
    .map_err(|e| match e.try_into_panic() {
        Ok(p) => anyhow::anyhow!("{}", panic_text(&p)),
        Err(e) => anyhow::anyhow!("{e}"),
    })?;
    *running = Some(r);
    Ok(out)
}

async fn futures_join(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        let _ = t.await;
    }
}

/// How long a server fault keeps the server down before healing it; a
/// stall, a third of the time a dead holder's lock takes to be freed
/// (shorter than any lease or session).
fn outage(f: Fault, free_after: Duration) -> Duration {
    match f {
        Fault::Failover => Duration::from_secs(4),
        Fault::Stall => free_after / 3,
        Fault::Disk => free_after + Duration::from_secs(2),
        _ => Duration::from_secs(1),
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}

fn url_redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// The claims the run broke.
fn breaches(f: &Findings, e: &Expect, orphans: usize) -> Vec<String> {
    let mut b = Vec::new();
    if f.holds == 0 {
        b.push("no worker ever held the lock: the run proves nothing".into());
    }
    if f.stale_accepted > 0 {
        b.push(format!("I1: {} stale writes accepted", f.stale_accepted));
    }
    if orphans > 0 {
        b.push(if orphans == usize::MAX {
            "I5: could not read the lock's state at the end".into()
        } else {
            format!("I5: {orphans} holds left at the end")
        });
    }
    if f.leaked_grants > 0 {
        b.push(format!(
            "I5: {} grants of dropped acquisitions outlived the cleanup bound",
            f.leaked_grants
        ));
    }
    if f.overlaps_outside_faults > 0 {
        b.push(format!(
            "I2: {} overlaps under contention alone (outside every fault's window)",
            f.overlaps_outside_faults
        ));
    }
    // A lost update a write sent after its own lost signal took part in
    // is that writer's, not the lock's (see `lost_updates_after_signal`).
    // Counted both ways: the net count sees an update lost without a
    // value written twice, the count by value one a killed worker's
    // unrecorded write would hide from the net count.
    let lost_updates = (f.lost_updates - f.lost_updates_after_signal).max(f.lost_updates_by_lock);
    if e.exclusion == Claim::Must && (f.overlaps > 0 || lost_updates > 0) {
        b.push(format!(
            "I2: {} overlaps ({:.1} ms), {} lost updates",
            f.overlaps, f.overlap_ms, lost_updates
        ));
    }
    if e.tokens == Claim::Must && f.token_regressions > 0 {
        b.push(format!("I7: {} token regressions", f.token_regressions));
    }
    if e.signals == Claim::Must && f.signals_missing > 0 {
        b.push(format!(
            "I4: {} refused holds without a lost signal",
            f.signals_missing
        ));
    }
    if e.signals == Claim::Must && f.signals_missed > 0 {
        b.push(format!(
            "I4: {} holds believed past the signal bound after the backend stopped naming them",
            f.signals_missed
        ));
    }
    if f.signals_false > 0 {
        b.push(format!(
            "I4: {} lost signals with no fault to cause them",
            f.signals_false
        ));
    }
    if e.liveness == Claim::Must && f.late_recoveries > 0 {
        b.push(format!(
            "I3: {} recoveries past the bound",
            f.late_recoveries
        ));
    }
    b
}

fn print_report(
    r: &serde_json::Value,
    f: &Findings,
    e: &Expect,
    breaches: &[String],
    dir: &std::path::Path,
) {
    let claim = |c: Claim| {
        if c == Claim::Must {
            "must hold"
        } else {
            "measured"
        }
    };
    let max_rec = f
        .recoveries
        .iter()
        .filter_map(|r| r.ms)
        .fold(None::<f64>, |m, x| Some(m.map_or(x, |m| m.max(x))));
    println!(
        "fenced torture: {} · faults {} · {} clients · {} s · seed {}",
        r["backend"].as_str().unwrap_or(""),
        r["faults"],
        r["clients"],
        r["duration_s"],
        r["seed"]
    );
    for t in r["timeline"].as_array().into_iter().flatten() {
        println!(
            "  {:>6} ms  {}",
            t["t_ms"],
            t["what"].as_str().or(t["skipped"].as_str()).unwrap_or("")
        );
    }
    println!(
        "  holds {} · overlaps {} ({:.1} ms) · writes accepted {} · stale rejected {} · \
         stale accepted {} · lost updates {} (after their writer's signal {}; the lock's, \
         value by value, {})",
        f.holds,
        f.overlaps,
        f.overlap_ms,
        f.writes_accepted,
        f.stale_rejected,
        f.stale_accepted,
        f.lost_updates,
        f.lost_updates_after_signal,
        f.lost_updates_by_lock
    );
    println!(
        "  token regressions {} · lost signals {} (missing {}, missed by probe {}, false {}; \
         {} probes) · recovery max {} (bound {} ms) · orphans {} · errors retried {}",
        f.token_regressions,
        f.signals_fired,
        f.signals_missing,
        f.signals_missed,
        f.signals_false,
        f.probes,
        max_rec.map_or("-".into(), |m| format!("{m:.0} ms")),
        r["bound_ms"],
        r["orphans"],
        f.errors
    );
    let mut per_fault: Vec<(Fault, u32, u64, f64, f64)> = Vec::new();
    for rec in &f.recoveries {
        let i = match per_fault.iter().position(|p| p.0 == rec.fault) {
            Some(i) => i,
            None => {
                per_fault.push((rec.fault, 0, 0, 0.0, 0.0));
                per_fault.len() - 1
            }
        };
        let p = &mut per_fault[i];
        p.1 += 1;
        p.2 += rec.overlaps;
        p.3 += rec.overlap_ms;
        p.4 = p.4.max(rec.ms.unwrap_or(f64::INFINITY));
    }
    for (fault, n, o, ms, rec) in per_fault {
        println!(
            "  {:>9} ×{n}: overlaps {o} ({ms:.1} ms), recovery max {}",
            fault.name(),
            if rec.is_finite() {
                format!("{rec:.0} ms")
            } else {
                "never".into()
            }
        );
    }
    println!(
        "  claims: exclusion {}, tokens {}, lost signal {}, liveness {}; stale writes and orphans: must be 0",
        claim(e.exclusion),
        claim(e.tokens),
        claim(e.signals),
        claim(e.liveness)
    );
    if breaches.is_empty() {
        println!("  PASS");
    } else {
        for b in breaches {
            println!("  BROKEN {b}");
        }
        println!("  (logs: {})", dir.display());
    }
}

/// The reports of several runs (JSON lines) as one Markdown table, each
/// topology's rows together (a resumed long run appends a topology's
/// missing runs at the end), then each topology's totals: its runs, its
/// critical sections over all of them (the long profile's measure), and
/// how many runs passed.
fn markdown_table(jsonl: &str) -> anyhow::Result<String> {
    let mut out = String::from(
        "| topology | faults (injected) | holds | overlaps (ms) | stale writes refused | \
         stale writes accepted | lost updates | token regressions | lost signals (missing) | \
         recovery max / bound | orphans | claims | verdict |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    // Per topology, in the order first seen: its name, runs, holds, runs
    // passed, and its rows.
    let mut totals: Vec<(String, u64, u64, u64, String)> = Vec::new();
    for (i, line) in jsonl
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let r: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("line {}: not a report", i + 1))?;
        let f = &r["findings"];
        let name = r["topology"].as_str().unwrap_or("?").to_owned();
        let at = match totals.iter().position(|t| t.0 == name) {
            Some(at) => at,
            None => {
                totals.push((name, 0, 0, 0, String::new()));
                totals.len() - 1
            }
        };
        let t = &mut totals[at];
        t.1 += 1;
        t.2 += f["holds"].as_u64().unwrap_or(0);
        t.3 += u64::from(r["pass"] == true);
        let injected: Vec<String> = r["faults"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|x| {
                let n = x.as_str().unwrap_or("?");
                format!("{n} ×{}", r["injected"][n].as_u64().unwrap_or(0))
            })
            .collect();
        let max_rec = f["recoveries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x["ms"].as_f64())
            .fold(None::<f64>, |m, x| Some(m.map_or(x, |m| m.max(x))));
        let e = &r["expect"];
        let measured: Vec<&str> = [
            ("exclusion", "I2"),
            ("tokens", "I7"),
            ("signals", "I4"),
            ("liveness", "I3"),
        ]
        .into_iter()
        .filter(|(k, _)| e[k] == "measured")
        .map(|(_, id)| id)
        .collect();
        let topology = format!(
            "{}{}",
            r["topology"].as_str().unwrap_or("?"),
            if r["defaults"] == true {
                " (defaults)"
            } else {
                ""
            }
        );
        totals[at].4 += &format!(
            "| {} | {} | {} | {} ({:.0}) | {} | {} | {} | {} | {} ({}) | {} / {} ms | {} | {} | {} |\n",
            topology,
            if injected.is_empty() {
                "none".to_owned()
            } else {
                injected.join(", ")
            },
            f["holds"],
            f["overlaps"],
            f["overlap_ms"].as_f64().unwrap_or(0.0),
            f["stale_rejected"],
            f["stale_accepted"],
            f["lost_updates"],
            f["token_regressions"],
            f["signals_fired"],
            f["signals_missing"],
            max_rec.map_or("–".into(), |m| format!("{m:.0}")),
            r["bound_ms"],
            r["orphans"],
            if measured.is_empty() {
                "all".to_owned()
            } else {
                format!("all but {}", measured.join(","))
            },
            if r["pass"] == true {
                "pass"
            } else {
                "**BROKEN**"
            },
        );
    }
    for t in &totals {
        out += &t.4;
    }
    out += "\n| topology | runs | critical sections | runs passed |\n|---|---|---|---|\n";
    for (name, runs, holds, passed, _) in totals {
        out += &format!("| {name} | {runs} | {holds} | {passed} |\n");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::markdown_table;

    #[test]
    fn the_table_sums_each_topologys_critical_sections() {
        let run = |topology: &str, holds: u64, pass: bool| {
            serde_json::json!({
                "topology": topology, "faults": ["kill"], "injected": {"kill": 2},
                "defaults": topology == "redis" && holds == 300,
                "findings": {"holds": holds, "overlaps": 0, "overlap_ms": 0.0, "recoveries": []},
                "expect": {}, "bound_ms": 9000, "orphans": 0, "pass": pass,
            })
            .to_string()
        };
        let jsonl = [
            run("redis", 700, true),
            run("etcd", 5, false),
            run("redis", 300, true),
        ]
        .join("\n");
        let table = markdown_table(&jsonl).expect("three reports");
        assert_eq!(
            table.matches("| redis | kill ×2 | 700 |").count(),
            1,
            "{table}"
        );
        // A run at the defaults is a row of its own, and its topology's.
        assert!(
            table.contains("| redis (defaults) | kill ×2 | 300 |"),
            "{table}"
        );
        assert!(table.contains("| etcd | kill ×2 | 5 |") && table.contains("**BROKEN**"));
        // The second redis run comes before etcd's, beside the first.
        assert!(
            table.find("| redis (defaults)").unwrap() < table.find("| etcd |").unwrap(),
            "{table}"
        );
        assert!(
            table.ends_with("| redis | 2 | 1000 | 2 |\n| etcd | 1 | 5 | 0 |\n"),
            "{table}"
        );
        assert!(markdown_table("not json").is_err());
    }
}
