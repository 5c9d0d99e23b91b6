//! Deterministic simulation of the core.
//!
//! fenced's real core (the acquire loop, the hold table, the watchdog, the
//! release worker, the lost signal, the cleanup of cancelled calls) runs
//! against a simulated lock server behind a simulated network, on tokio's
//! paused clock, all driven by one seed: message delays and losses,
//! partitions of one client, a server paused, stopped, or restarted with
//! or without its state, sessions that the server ends, and tasks that
//! drop their calls at random awaits. One thread and a virtual clock make
//! a seed's run the same every time, so a failing seed replays exactly.
//!
//! Why not `turmoil`: it simulates hosts that talk TCP, and the core talks
//! to its backend through the SPI traits, not sockets; a simulated backend
//! behind those traits puts the faults where the core sees them, with
//! tokio's own test clock (`start_paused`) as the simulator. What that
//! does not cover (the engines' wire clients) the torture suite does,
//! against the real servers.
//!
//! After every run the checker asserts: no two tasks believed they held
//! the lock at once (a belief ends when the task lets go or its lost
//! signal fires, so a lost signal later than the next grant is a breach
//! too); tokens rise in the order of the beliefs; a guard never starts out
//! lost; and once every task has gone (aborted, so their calls are
//! dropped wherever they were) and the faults have healed, nothing is
//! queued after a request timeout's worth of cleanup and nothing is held
//! after the cleanup bound.
//!
//! Run by hand:
//!
//! ```text
//! FENCED_SIM_SEED=1234 cargo test -p fenced --lib sim::replay -- --nocapture
//! FENCED_SIM_SEEDS=100000 FENCED_SIM_SECS=3600 cargo test -p fenced --release --lib sim::seeds
//! ```

mod check;
mod world;

use crate::client::Client;
use crate::name::LockName;
use crate::spi::wake::Wakeups;
use check::{Holding, Log, Record};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use world::{Keeping, World};

/// The locks tasks contend for: the first alone, or with MultiLock both
/// at once (plans with `multi`), or the second alone.
const NAMES: [&str; 2] = ["sim", "sim2"];

/// A fault, at a moment of the run.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// One client's requests and replies are lost for a while.
    Cut { client: usize, secs: f64 },
    /// The server answers nothing for a while (SIGSTOP), then everything.
    Pause { secs: f64 },
    /// The server is down for a while, then back, with or without its state.
    Restart { secs: f64, lose: bool },
    /// Messages get lost with some chance, and delayed, for a while.
    Lossy {
        secs: f64,
        loss: f64,
        jitter_ms: u64,
    },
    /// The server ends one client's session now.
    Expire { client: usize },
}

/// `secs` in whole milliseconds, the timer's grain (see `World::delay`).
fn whole_ms(secs: f64) -> Duration {
    Duration::from_millis((secs * 1000.0).round() as u64)
}

impl Fault {
    /// How long it acts.
    fn lasts(self) -> Duration {
        match self {
            Fault::Cut { secs, .. }
            | Fault::Pause { secs }
            | Fault::Restart { secs, .. }
            | Fault::Lossy { secs, .. } => whole_ms(secs),
            Fault::Expire { .. } => Duration::ZERO,
        }
    }
}

/// What one seed runs.
#[derive(Debug)]
struct Plan {
    seed: u64,
    keeping: Keeping,
    /// `None`: the default lease.
    lease: Option<Duration>,
    /// The lease is fixed (never renewed): holds that work past it end on
    /// the server, and a task that keeps its guard after its lost signal
    /// releases nothing that wakes the waiters.
    fixed: bool,
    fair: bool,
    /// Whether tasks also take both locks at once (MultiLock) and the
    /// second alone.
    multi: bool,
    clients: usize,
    tasks_per_client: usize,
    run_for: Duration,
    faults: Vec<(Duration, Fault)>,
}

impl Plan {
    fn new(seed: u64) -> Plan {
        let mut r = fastrand::Rng::with_seed(seed);
        // The defaults a user gets, most of the time: the 30 s lease and
        // (session engines) the 10 s session.
        let keeping = if r.bool() {
            Keeping::Lease
        } else {
            let ttl = if r.u8(0..4) > 0 { 10 } else { r.u64(2..=30) };
            Keeping::Session {
                ttl: Duration::from_secs(ttl),
            }
        };
        let lease = (r.u8(0..4) == 0).then(|| Duration::from_secs(r.u64(2..=40)));
        // A draw of its own, so that the other draws stay as they were.
        let fixed = lease.is_some() && fastrand::Rng::with_seed(seed.rotate_left(17)).bool();
        let clients = r.usize(1..=3);
        let run_for = Duration::from_secs(r.u64(30..=120));
        let mut faults = Vec::new();
        for _ in 0..r.usize(0..=6) {
            let at = Duration::from_millis(r.u64(0..run_for.as_millis() as u64));
            let secs = |r: &mut fastrand::Rng| r.f64() * 40.0;
            let fault = match r.u8(0..5) {
                0 => Fault::Cut {
                    client: r.usize(0..clients),
                    secs: secs(&mut r),
                },
                1 => Fault::Pause {
                    secs: secs(&mut r) / 4.0,
                },
                2 => Fault::Restart {
                    secs: secs(&mut r) / 4.0,
                    lose: r.bool(),
                },
                3 => Fault::Lossy {
                    secs: secs(&mut r),
                    loss: r.f64() * 0.5,
                    jitter_ms: r.u64(0..=3_000),
                },
                _ => Fault::Expire {
                    client: r.usize(0..clients),
                },
            };
            faults.push((at, fault));
        }
        faults.sort_by_key(|f| f.0);
        Plan {
            seed,
            keeping,
            lease,
            fixed,
            fair: r.bool(),
            multi: r.bool(),
            clients,
            tasks_per_client: r.usize(if clients == 1 { 2 } else { 1 }..=3),
            run_for,
            faults,
        }
    }
}

/// What a seed's run found.
pub(crate) struct Outcome {
    plan: String,
    record: Record,
}

impl Outcome {
    fn failed(&self) -> bool {
        !self.record.breaches.is_empty()
    }

    fn report(&self) -> String {
        format!(
            "{}\n{} grants, {} lost signals, {} calls cancelled\nbreaches:\n  {}\ntrace:\n{}",
            self.plan,
            self.record.grants,
            self.record.lost,
            self.record.cancelled,
            self.record.breaches.join("\n  "),
            self.record.trace.join("\n")
        )
    }
}

/// Wall-clock time a seed may take: a run that takes longer spins at one
/// virtual instant (a task that loops without waiting), which is a
/// livelock in the core.
const SEED_WALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs one seed on a thread of its own, within [`SEED_WALL_LIMIT`].
fn run(seed: u64) -> Outcome {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run_here(seed));
    });
    match rx.recv_timeout(SEED_WALL_LIMIT) {
        Ok(out) => out,
        Err(_) => Outcome {
            plan: format!("seed {seed}: {:?}", Plan::new(seed)),
            record: Record {
                breaches: vec![format!(
                    "the run did not end within {SEED_WALL_LIMIT:?} of wall time: \
                     something spins at one virtual instant"
                )],
                ..Record::default()
            },
        },
    }
}

/// Runs one seed to the end on this thread and checks it.
fn run_here(seed: u64) -> Outcome {
    let plan = Plan::new(seed);
    let described = format!("seed {seed}: {plan:?}");
    // The core's own randomness (retry jitter) follows the seed too.
    fastrand::seed(seed);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let record = rt.block_on(simulate(plan));
    Outcome {
        plan: described,
        record,
    }
}

async fn simulate(plan: Plan) -> Record {
    let log = Log::new();
    let names = lock_names();
    let world = World::new(plan.seed, plan.keeping, plan.clients, log.clone())
        .expect("the simulated server");
    let mut clients = Vec::new();
    for c in 0..plan.clients {
        let wakeups = Arc::new(Wakeups::default());
        let backend = world.connect(c, wakeups.clone()).expect("a client");
        clients.push(Client::with_backend(backend, wakeups, format!("sim://{c}")));
    }
    let start = Instant::now();
    let stop = start + plan.run_for;

    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for k in 0..plan.tasks_per_client {
            let id = c * plan.tasks_per_client + k;
            let lock = |name: &str| {
                let lock = client.mutex(name).expect("a mutex").fair(plan.fair);
                match plan.lease {
                    Some(l) if plan.fixed => lock.fixed_lease(l),
                    Some(l) => lock.lease(l),
                    None => lock,
                }
            };
            let mut wants = vec![Want::One(0, lock(NAMES[0]))];
            if plan.multi {
                // Given in either order: MultiLock takes them in its own.
                let (a, b) = if id.is_multiple_of(2) { (0, 1) } else { (1, 0) };
                let both = crate::MultiLock::new([lock(NAMES[a]), lock(NAMES[b])]);
                wants.push(Want::Both(both));
                wants.push(Want::One(1, lock(NAMES[1])));
            }
            let rng = fastrand::Rng::with_seed(plan.seed.wrapping_mul(31).wrapping_add(id as u64));
            let who = (id, c);
            tasks.push(tokio::spawn(contend(who, wants, rng, log.clone())));
        }
    }
    let lease = plan.lease.unwrap_or(crate::DEFAULT_LEASE);
    let faults = tokio::spawn(inject(
        plan.faults.clone(),
        world.clone(),
        log.clone(),
        start,
        lease,
        plan.fixed,
    ));
    let watch = tokio::spawn(watch_places(
        world.clone(),
        log.clone(),
        plan.faults.clone(),
    ));
    let stalls = tokio::spawn(watch_stalls(
        world.clone(),
        log.clone(),
        plan.faults.clone(),
    ));

    // The faults end first, and the tasks go on a while with the server
    // whole: long enough for what a fault left behind, which only its
    // lease or the queue places' expiry could clear (a withdrawal that
    // found the server down), to clear.
    tokio::time::sleep_until(stop).await;
    faults.abort();
    watch.abort();
    stalls.abort();
    world.heal();
    log.note("sim", "every fault healed");
    let settle = lease.max(crate::spi::lease::QUEUE_TTL) + Duration::from_secs(5);
    tokio::time::sleep(settle).await;
    // Then every task goes at once, wherever it is: its acquisition,
    // release or hold dropped at that await.
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    log.note("sim", "every task aborted");

    // A dropped waiter's queue place goes with the cleanup, within a
    // request timeout or two; its expiry (QUEUE_TTL) would take longer.
    let timeout = crate::spi::backend::DEFAULT_TIMEOUT;
    tokio::time::sleep(timeout + timeout / 2).await;
    for name in &names {
        match world.truth(name).await {
            Ok(s) if s.waiters > 0 => log.breach(format!(
                "{name}: {} queue places left {:?} after every task went",
                s.waiters,
                timeout + timeout / 2
            )),
            Ok(_) => {}
            Err(e) => log.breach(format!("the server's state could not be read: {e}")),
        }
    }
    // A hold left behind by a dropped call is released by the cleanup
    // well within this; its lease (30 s by default) or its session (which
    // the live client keeps alive) would take longer.
    tokio::time::sleep(Duration::from_secs(20) - timeout * 3 / 2).await;
    for name in &names {
        match world.truth(name).await {
            Ok(s) if !s.holders.is_empty() => log.breach(format!(
                "{name}: still held 20 s after every task went: {:?}",
                s.holders
            )),
            Ok(_) => {}
            Err(e) => log.breach(format!("the server's state could not be read: {e}")),
        }
    }
    for c in &clients {
        c.close().await;
    }
    let mut record = log.take();
    for b in &mut record.beliefs {
        b.granted = record
            .granted
            .get(&(NAMES[b.lock].to_owned(), b.token))
            .copied();
    }
    for (lock, name) in NAMES.iter().enumerate() {
        let beliefs: Vec<_> = record
            .beliefs
            .iter()
            .filter(|b| b.lock == lock)
            .cloned()
            .collect();
        let kills: Vec<_> = record
            .kills
            .iter()
            .filter(|k| k.lock == lock)
            .copied()
            .collect();
        for f in check::exclusion(&beliefs, &kills) {
            record.breaches.push(format!("{name}: {f}"));
        }
    }
    record
}

/// Applies the plan's faults at their moments.
async fn inject(
    faults: Vec<(Duration, Fault)>,
    world: Arc<World>,
    log: Arc<Log>,
    start: Instant,
    lease: Duration,
    fixed: bool,
) {
    let names = lock_names();
    // How long a holder whose hold the server dropped may go on believing
    // (RELIABILITY's I4): its next renewal or keep-alive, a request
    // timeout for it and one for a retry, and a second's room.
    let session = match world.keeping {
        Keeping::Session { ttl } => ttl / 3,
        Keeping::Lease => Duration::ZERO,
    };
    // Where another fault keeps the holder from hearing of it (a cut, a
    // pause, lost messages), all that bounds its belief is its lease, or
    // its session, as last confirmed before the kill.
    let hard = match world.keeping {
        Keeping::Session { ttl } => lease.min(ttl),
        Keeping::Lease => lease,
    } + Duration::from_secs(1);
    let tell = match world.keeping {
        // A fixed lease is never renewed: nothing asks the server whether
        // it still keeps the hold, and the lease alone bounds the belief
        // (the fencing token is what guards the resource then).
        Keeping::Lease if fixed => hard,
        _ => {
            (lease / 3).max(session)
                + crate::spi::backend::DEFAULT_TIMEOUT * 2
                + Duration::from_secs(1)
        }
    };
    let plan = faults.clone();
    let within = |at: Duration, tight: Duration| {
        let muffled = plan
            .iter()
            .any(|&(t, f)| t != at && t < at + tight && at < t + f.lasts());
        if muffled { hard.max(tight) } else { tight }
    };
    for (at, fault) in faults {
        tokio::time::sleep_until(start + at).await;
        log.note("fault", format_args!("{fault:?}"));
        let until = |secs: f64| Some(Instant::now() + whole_ms(secs));
        let faults = || crate::spi::sync::unpoisoned(&world.faults);
        match fault {
            Fault::Cut { client, secs } => faults().cut[client] = until(secs),
            Fault::Pause { secs } => faults().paused = until(secs),
            Fault::Restart { secs, lose } => {
                faults().down = until(secs);
                if lose {
                    let down = whole_ms(secs);
                    kill(&world, &log, None, within(at, down + tell)).await;
                }
                world.restart(&names, lose).await;
            }
            Fault::Lossy {
                secs,
                loss,
                jitter_ms,
            } => {
                {
                    let mut f = faults();
                    f.loss = loss;
                    f.jitter = Duration::from_millis(jitter_ms);
                }
                let world = world.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(whole_ms(secs)).await;
                    let mut f = crate::spi::sync::unpoisoned(&world.faults);
                    f.loss = 0.0;
                    f.jitter = Duration::ZERO;
                });
            }
            Fault::Expire { client } => {
                if world.has_session(client) {
                    kill(&world, &log, Some(client), within(at, tell)).await;
                    world.expire_session_of(client).await;
                }
            }
        }
    }
}

/// The locks' names.
fn lock_names() -> Vec<LockName> {
    NAMES
        .iter()
        .map(|n| LockName::new(n).expect("a valid name"))
        .collect()
}

/// While no fault has acted for longer than a queue place lives
/// (`QUEUE_TTL`), every place must belong to a wait in progress or one
/// that ended within the last second: a dropped or ended wait's place is
/// withdrawn within a round trip when the server is whole, not left to
/// expire. Looks once a second.
async fn watch_places(world: Arc<World>, log: Arc<Log>, faults: Vec<(Duration, Fault)>) {
    let names = lock_names();
    let quiet_enough = crate::spi::lease::QUEUE_TTL + Duration::from_secs(1);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = log.now();
        // Since the last fault ended, by the plan, and by what acts now.
        let quiet = now.saturating_sub(last_fault_end(&faults, now));
        if !world.is_whole() || quiet < quiet_enough {
            continue;
        }
        let mut places = 0;
        for n in &names {
            places += world.truth(n).await.map_or(0, |s| s.waiters);
        }
        let (waiting, recent) = log.with(|r| {
            r.ended
                .retain(|t| now.saturating_sub(*t) <= Duration::from_secs(1));
            (r.waiting, r.ended.len())
        });
        if places > waiting + recent {
            log.breach(format!(
                "{places} queue places with {waiting} waits in progress and {recent} \
                 just ended, the server whole for {quiet:?}: a wait's place outlived it"
            ));
        }
    }
}

/// The end of the last fault that began by `now`, by the plan (a sample
/// could miss a short one).
fn last_fault_end(faults: &[(Duration, Fault)], now: Duration) -> Duration {
    faults
        .iter()
        .filter(|(at, _)| *at <= now)
        .map(|&(at, f)| at + f.lasts())
        .max()
        .unwrap_or_default()
}

/// Liveness: while the server has been whole long enough for every
/// client to be past its retries, no lock a task waits for may stay free
/// on the server for longer than a fallback period and a second, when the
/// task began to wait before it was free (a lease that ran out, with no
/// release to wake anyone, is noticed by then). A client wakes one of its
/// waiters at a time, so this is where a waiter that nobody calls and
/// that does not lead would show. Looks four times a second.
async fn watch_stalls(world: Arc<World>, log: Arc<Log>, faults: Vec<(Duration, Fault)>) {
    let names = lock_names();
    let quiet_enough = Duration::from_secs(15);
    let bound = crate::core::acquire::MAX_FALLBACK + Duration::from_secs(1);
    // Per lock: since when it has been free, in a quiet time.
    let mut free_since: Vec<Option<Duration>> = vec![None; names.len()];
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = log.now();
        let quiet =
            world.is_whole() && now.saturating_sub(last_fault_end(&faults, now)) >= quiet_enough;
        for (i, n) in names.iter().enumerate() {
            let free = quiet && world.truth(n).await.is_ok_and(|s| s.holders.is_empty());
            free_since[i] = free.then(|| free_since[i].unwrap_or(now));
        }
        let stuck = log.with(|r| {
            r.blocked.iter().find_map(|(id, (t, locks))| {
                let mut since = Duration::ZERO;
                for (i, f) in free_since.iter().enumerate() {
                    if locks & (1 << i) != 0 {
                        since = since.max((*f)?);
                    }
                }
                (*t < since && now - since > bound).then_some((*id, *t, since))
            })
        });
        if let Some((id, t, since)) = stuck {
            log.breach(format!(
                "t{id} has waited since {t:?} for what has been free on the whole server \
                 since {since:?}"
            ));
            free_since.iter_mut().for_each(|f| *f = None);
        }
    }
}

/// Records that the server is about to drop holds it granted, and how
/// long their holders may take to be told.
async fn kill(world: &World, log: &Log, client: Option<usize>, within: Duration) {
    for (lock, name) in lock_names().iter().enumerate() {
        let upto = world.truth(name).await.map_or(u64::MAX, |s| s.last_token);
        let at = log.now();
        log.with(|r| {
            r.kills.push(check::Kill {
                at,
                lock,
                client,
                upto,
                within,
            })
        });
    }
}

/// What a task asks for: one lock (by its index in [`NAMES`]), or both.
enum Want {
    One(usize, crate::Mutex),
    Both(crate::MultiLock),
}

/// What it got.
enum Got {
    One(usize, crate::Guard),
    Both(crate::MultiGuard),
}

impl Want {
    async fn try_acquire(&self) -> crate::Result<Option<Got>> {
        match self {
            Want::One(i, m) => Ok(m.try_acquire().await?.map(|g| Got::One(*i, g))),
            Want::Both(m) => Ok(m.try_acquire().await?.map(Got::Both)),
        }
    }

    async fn acquire_timeout(&self, wait: Duration) -> crate::Result<Option<Got>> {
        match self {
            Want::One(i, m) => Ok(m.acquire_timeout(wait).await?.map(|g| Got::One(*i, g))),
            Want::Both(m) => Ok(m.acquire_timeout(wait).await?.map(Got::Both)),
        }
    }

    async fn acquire(&self) -> crate::Result<Option<Got>> {
        match self {
            Want::One(i, m) => Ok(Some(Got::One(*i, m.acquire().await?))),
            Want::Both(m) => Ok(Some(Got::Both(m.acquire().await?))),
        }
    }
}

impl Got {
    /// Each lock held, with its token.
    fn tokens(&self) -> Vec<(usize, u64)> {
        match self {
            Got::One(i, g) => vec![(*i, g.fencing_token())],
            Got::Both(m) => m
                .guards()
                .iter()
                .map(|g| {
                    let i = NAMES
                        .iter()
                        .position(|n| *n == g.name())
                        .expect("a known name");
                    (i, g.fencing_token())
                })
                .collect(),
        }
    }

    fn is_held(&self) -> bool {
        match self {
            Got::One(_, g) => g.is_held(),
            Got::Both(m) => m.is_held(),
        }
    }

    fn lost(&self) -> crate::spi::BoxFuture<'static, crate::LostReason> {
        match self {
            Got::One(_, g) => Box::pin(g.lost()),
            Got::Both(m) => Box::pin(m.lost()),
        }
    }

    async fn release(self) -> crate::Result<bool> {
        match self {
            Got::One(_, g) => g.release().await,
            Got::Both(m) => m.release().await,
        }
    }
}

/// One task: acquires in one of the ways a user does (waiting, trying,
/// waiting with a timeout, or waiting until it gives up and drops the
/// call), holds for a while unless its lost signal fires first, and lets
/// go by releasing (maybe dropping the release half-way) or by dropping
/// the guard.
async fn contend(
    (id, client): (usize, usize),
    wants: Vec<Want>,
    mut r: fastrand::Rng,
    log: Arc<Log>,
) {
    let who = format!("t{id}");
    // Draws of its own for what came later, so that the others stay.
    let mut later = fastrand::Rng::with_seed(r.get_seed().rotate_left(29));
    let lease = match &wants[0] {
        Want::One(_, m) => m.as_lock().options().lease.duration(),
        Want::Both(_) => unreachable!("the first want is one lock"),
    };
    loop {
        let lock = &wants[r.usize(0..wants.len())];
        let patience = Duration::from_millis(r.u64(0..20_000));
        let dropped = || {
            log.with(|r| r.cancelled += 1);
            log.note(&who, "drops its acquire");
            Ok(None)
        };
        let kind = r.u8(0..5);
        let since = log.now();
        let locks = match lock {
            Want::One(i, _) => 1u8 << i,
            Want::Both(_) => 0b11,
        };
        log.with(|r| {
            r.waiting += 1;
            if kind > 0 {
                r.blocked.insert(id, (since, locks));
            }
        });
        let got = match kind {
            0 => lock.try_acquire().await,
            1 => lock.acquire_timeout(patience).await,
            2 => match tokio::time::timeout(patience, lock.acquire()).await {
                Ok(g) => g,
                Err(_) => dropped(),
            },
            // Dropped about when its own wait ends, while it withdraws.
            3 => {
                let wait = lock.acquire_timeout(patience);
                let cut = patience + Duration::from_millis(r.u64(0..5));
                tokio::time::timeout(cut, wait)
                    .await
                    .unwrap_or_else(|_| dropped())
            }
            _ => lock.acquire().await,
        };
        let now = log.now();
        log.with(|r| {
            r.waiting -= 1;
            r.ended.push(now);
            r.blocked.remove(&id);
        });
        match got {
            Ok(Some(g)) => {
                let held = g.is_held();
                log.with(|r| r.grants += 1);
                log.note(&who, "acquires");
                if !held {
                    log.breach(format!("{who} got a guard that was lost from the start"));
                }
                let from = log.now();
                let holding = g
                    .tokens()
                    .into_iter()
                    .map(|(lock, token)| Holding {
                        log: log.clone(),
                        task: id,
                        lock,
                        client,
                        token,
                        from,
                        how: None,
                    })
                    .collect::<Vec<_>>();
                let end = |holding: Vec<Holding>, how: &str| {
                    holding.into_iter().for_each(|h| h.end(how));
                };
                // Mostly short work; now and then past the lease, which
                // the watchdog must renew.
                let longest = if r.u8(0..4) == 0 {
                    lease * 2
                } else {
                    Duration::from_secs(2)
                };
                let work = Duration::from_millis(r.u64(0..=longest.as_millis() as u64));
                let worked = tokio::time::Instant::now() + work;
                tokio::select! {
                    biased;
                    why = g.lost() => {
                        log.with(|r| r.lost += 1);
                        end(holding, &format!("lost ({why})"));
                        // Now and then the task keeps its dead guard until
                        // its work is done: its release then finds nothing
                        // and wakes no one, and the waiters must notice the
                        // free lock on their own.
                        if later.bool() {
                            tokio::time::sleep_until(worked).await;
                        }
                        drop(g);
                    }
                    _ = tokio::time::sleep(work) => match r.u8(0..3) {
                        0 => {
                            end(holding, "dropped its guard");
                            drop(g);
                        }
                        1 => {
                            end(holding, "releasing, then dropping the release");
                            let cut = Duration::from_millis(r.u64(0..50));
                            if tokio::time::timeout(cut, g.release()).await.is_err() {
                                log.with(|r| r.cancelled += 1);
                            }
                        }
                        _ => {
                            end(holding, "releasing");
                            let _ = g.release().await;
                        }
                    },
                }
            }
            Ok(None) => log.note(&who, "did not get it"),
            Err(e) => log.note(&who, format_args!("failed: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(r.u64(0..2_000))).await;
    }
}

/// Seeds from `FENCED_SIM_BASE` (0 by default) on, as many as
/// `FENCED_SIM_SEEDS` says (2,000 by default) or as fit in
/// `FENCED_SIM_SECS` of wall time (60 by default).
fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn seeds() {
    let base = env_u64("FENCED_SIM_BASE", 0);
    let count = env_u64("FENCED_SIM_SEEDS", 2_000);
    let budget = Duration::from_secs(env_u64("FENCED_SIM_SECS", 60));
    let began = std::time::Instant::now();
    let (mut ran, mut grants, mut lost) = (0u64, 0usize, 0usize);
    for seed in base..base.saturating_add(count) {
        let out = run(seed);
        assert!(
            !out.failed(),
            "the simulation broke the contract; replay with \
             FENCED_SIM_SEED={seed} cargo test -p fenced --lib sim::replay -- --nocapture\n{}",
            out.report()
        );
        ran += 1;
        grants += out.record.grants;
        lost += out.record.lost;
        if began.elapsed() >= budget {
            break;
        }
    }
    let secs = began.elapsed().as_secs_f64();
    println!(
        "{ran} seeds from {base} in {secs:.1} s ({:.0} seeds/s): {grants} grants, {lost} lost signals",
        ran as f64 / secs
    );
    assert!(grants > 0, "no task ever got the lock");
    assert!(lost > 0, "no fault ever struck a holder");
}

/// The seeds that found defects, run whatever range CI runs: a session's
/// grant taken over by a retry in a later session (the simulated server's
/// own, 1914), a waiter's place that a withdrawal with no ticket could not
/// find (67), and a try held in a stopped server that landed after its
/// withdrawal and stayed for the session's life (15329). The plans and the
/// tasks' draws have changed since, so these seeds no longer replay those
/// runs: the regression tests are the conformance and unit tests named in
/// the fixes; these stay as seeds that once mattered.
#[test]
fn seeds_that_found_defects() {
    for seed in [67, 1914, 15329] {
        let out = run(seed);
        assert!(!out.failed(), "{}", out.report());
    }
}

/// Replays `FENCED_SIM_SEED` with its whole trace; without it, checks that
/// a seed replays the same: two runs of one seed trace the same events.
#[test]
fn replay() {
    if let Ok(seed) = std::env::var("FENCED_SIM_SEED") {
        let seed = seed.parse().expect("FENCED_SIM_SEED is a number");
        let out = run(seed);
        println!("{}", out.report());
        assert!(!out.failed(), "seed {seed} broke the contract");
        return;
    }
    for seed in [1, 7, 4242, 15329] {
        // Once here after other seeds, once on a thread of its own: no
        // state a run leaves behind, or a thread starts with, may matter.
        let a = run_here(seed);
        let b = run(seed);
        assert!(a.record.grants > 0);
        assert_eq!(
            a.record.trace, b.record.trace,
            "seed {seed} ran differently twice"
        );
    }
}

/// Hundreds of one client's tasks wait for one lock on a server that
/// takes about 100 ms a call: the client's call slots (`MAX_CALLS`) queue
/// their tries, and a woken head waits behind the others' first tries. Its
/// lease must count from when its try went out, not from before it waited
/// for a slot: counted from before, the grant came back spent, was given
/// back, and its waiter queued again at the end, over and over (found on
/// a ZooKeeper ensemble, where a thousand waiters stalled for minutes).
/// Every grant is used: the server sees one release per hold.
#[test]
fn a_try_waiting_for_a_call_slot_does_not_spend_its_lease() {
    const WAITERS: usize = 600;
    let lease = Duration::from_millis(250);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let world = World::new(1, Keeping::Lease, 1, Log::new()).expect("the server");
        unpoisoned_faults(&world).jitter = Duration::from_millis(100);
        let wakeups = Arc::new(Wakeups::default());
        let backend = world.connect(0, wakeups.clone()).expect("a client");
        let client = Client::with_backend(backend, wakeups, "sim://0".into());
        let lock = || client.mutex("slots").expect("a mutex").fixed_lease(lease);
        let first = lock().acquire().await.expect("the first hold");
        let tasks: Vec<_> = (0..WAITERS)
            .map(|_| {
                let lock = lock();
                tokio::spawn(async move {
                    let g = lock.acquire().await.expect("granted");
                    g.release().await.expect("released");
                })
            })
            .collect();
        tokio::task::yield_now().await;
        assert!(first.release().await.expect("released"));
        for t in tasks {
            t.await.expect("a waiter");
        }
        client.close().await;
        assert_eq!(
            world.released.load(std::sync::atomic::Ordering::Relaxed),
            WAITERS as u64 + 1,
            "grants came back spent and were given back unused"
        );
    });
}

fn unpoisoned_faults(world: &World) -> std::sync::MutexGuard<'_, world::Faults> {
    crate::spi::sync::unpoisoned(&world.faults)
}
