//! The simulated lock server and the network between it and the clients.
//!
//! The server is the `memory://` backend (one namespace per seed), with
//! what a networked engine adds around it: a session per client for the
//! session engines (etcd, ZooKeeper), kept alive by the client and ended
//! by the server when its keep-alives stop; a pause (SIGSTOP), a stop and
//! restart with or without its state; and a network that delays, loses
//! and cuts requests and replies. A request reaches the server in a task
//! of its own, so a caller that goes away leaves it on its way, as a
//! request already written to a socket is.

use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::lease::{SessionClock, believed_until};
use crate::spi::sync::unpoisoned;
use crate::spi::wake::Wakeups;
use crate::spi::{
    Attempt, Backend, HoldRef, LockBackend, LockStatus, Outcome, RegisterValue, RegisterWrite,
    Renewal, Reply, Store, Withdrawal,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How the server keeps holds.
#[derive(Clone, Copy, Debug)]
pub(super) enum Keeping {
    /// A hold lives as long as its lease (Redis, the SQL lease table).
    Lease,
    /// A hold lives as long as its client's session (etcd, ZooKeeper),
    /// which the server ends `ttl` after the last keep-alive it heard.
    Session { ttl: Duration },
}

/// A lease the server gives holds kept by a session: longer than any run,
/// so that only the session ends them.
const FOREVER: Duration = Duration::from_secs(24 * 3600);

/// What the network and the server do right now.
#[derive(Debug, Default)]
pub(super) struct Faults {
    /// Per client: its requests and replies are lost until then.
    pub(super) cut: Vec<Option<Instant>>,
    /// The server answers nothing until then (SIGSTOP); requests wait.
    pub(super) paused: Option<Instant>,
    /// The server is down until then: connections are refused.
    pub(super) down: Option<Instant>,
    /// The chance that a request, or a reply, is lost.
    pub(super) loss: f64,
    /// The longest extra delay of a message, on top of the base delay.
    pub(super) jitter: Duration,
}

/// A session as the server keeps it.
/// A session as the server keeps it, with the holds and queue places
/// that end with it. In the server's store, a hold or place taken in a
/// session is named by the hold id and the session (see [`in_session`]),
/// as an etcd key names its lease: a retry in a later session takes a
/// hold of its own, and the earlier one ends with its session.
struct ServerSession {
    expires: Instant,
    ends: Ends,
}

/// What ends with a session.
#[derive(Default)]
struct Ends {
    holds: Vec<HoldRef>,
    places: Vec<Withdrawal>,
}

/// The name in the server's store of `hold_id`'s hold or place in `session`.
fn in_session(hold_id: &str, session: u64) -> String {
    format!("{hold_id}@{session:x}")
}

/// The server, the network, and the randomness that drives both.
pub(super) struct World {
    pub(super) keeping: Keeping,
    rng: Mutex<fastrand::Rng>,
    /// The server's own store (holds, queues, tokens).
    pub(super) server: Arc<dyn Backend>,
    namespace: String,
    pub(super) faults: Mutex<Faults>,
    sessions: Mutex<(u64, BTreeMap<u64, ServerSession>)>,
    /// Rung when every fault heals, for the requests a pause holds.
    healed: tokio::sync::Notify,
    /// Releases that reached the server and freed a hold (lease keeping).
    pub(super) released: AtomicU64,
    log: Arc<super::check::Log>,
}

impl World {
    pub(super) fn new(
        seed: u64,
        keeping: Keeping,
        clients: usize,
        log: Arc<super::check::Log>,
    ) -> Result<Arc<World>> {
        let namespace = format!("sim-{seed}-{}", uuid::Uuid::new_v4().simple());
        let server =
            crate::backend::memory::MemoryBackend::open(&namespace, Arc::new(Wakeups::default()))?;
        Ok(Arc::new(World {
            keeping,
            rng: Mutex::new(fastrand::Rng::with_seed(seed ^ 0x5eed)),
            server,
            namespace,
            faults: Mutex::new(Faults {
                cut: vec![None; clients],
                ..Faults::default()
            }),
            sessions: Mutex::new((0, BTreeMap::new())),
            healed: tokio::sync::Notify::new(),
            released: AtomicU64::new(0),
            log,
        }))
    }

    /// A client's end of the network.
    pub(super) fn connect(
        self: &Arc<Self>,
        client: usize,
        wakeups: Arc<Wakeups>,
    ) -> Result<Arc<SimBackend>> {
        // Registers the client's wake-ups with the server's store, which
        // rings them on every change (notifications are not delayed).
        let bell = crate::backend::memory::MemoryBackend::open(&self.namespace, wakeups.clone())?;
        let session = match self.keeping {
            Keeping::Lease => None,
            Keeping::Session { .. } => Some(Arc::new(ClientSession {
                id: AtomicU64::new(0),
                clock: SessionClock::new(0, Instant::now()),
                wakeups,
            })),
        };
        let me = Arc::new(SimBackend {
            world: self.clone(),
            client,
            session,
            _bell: bell,
        });
        if let Some(s) = &me.session {
            tokio::spawn(keep_alive(me.world.clone(), client, Arc::downgrade(s)));
        }
        Ok(me)
    }

    fn draw<T>(&self, f: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
        f(&mut unpoisoned(&self.rng))
    }

    /// One message's delay: a base of 1 or 2 ms, and the jitter, in
    /// whole milliseconds (the timer's grain).
    fn delay(&self) -> Duration {
        let jitter = unpoisoned(&self.faults).jitter;
        let ms = jitter.as_millis() as u64;
        self.draw(|r| Duration::from_millis(r.u64(1..=2) + r.u64(0..=ms)))
    }

    fn lost(&self, client: usize) -> bool {
        let f = unpoisoned(&self.faults);
        let cut = f.cut[client].is_some_and(|u| Instant::now() < u);
        let loss = f.loss;
        drop(f);
        cut || self.draw(|r| r.f64() < loss)
    }

    fn down(&self) -> bool {
        unpoisoned(&self.faults)
            .down
            .is_some_and(|u| Instant::now() < u)
    }

    async fn unpaused(&self) {
        loop {
            let healed = self.healed.notified();
            let until = unpoisoned(&self.faults).paused;
            match until {
                Some(u) if Instant::now() < u => tokio::select! {
                    biased;
                    _ = healed => {}
                    _ = tokio::time::sleep_until(u) => {}
                },
                _ => return,
            }
        }
    }

    /// Whether no fault acts now: every message goes through at once.
    pub(super) fn is_whole(&self) -> bool {
        let f = unpoisoned(&self.faults);
        let now = Instant::now();
        let past = |u: Option<Instant>| u.is_none_or(|u| u <= now);
        f.cut.iter().all(|c| past(*c))
            && past(f.paused)
            && past(f.down)
            && f.loss == 0.0
            && f.jitter.is_zero()
    }

    /// Ends every fault now.
    pub(super) fn heal(&self) {
        let mut f = unpoisoned(&self.faults);
        *f = Faults {
            cut: vec![None; f.cut.len()],
            ..Faults::default()
        };
        drop(f);
        self.healed.notify_waiters();
    }

    /// Sends `op` to the server for `client` and waits for its reply,
    /// within the request timeout: what the network and the server's
    /// faults let through.
    async fn call<T, F>(self: &Arc<Self>, client: usize, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<World>) -> crate::spi::BoxFuture<'static, Result<T>> + Send + 'static,
    {
        if self.down() {
            tokio::time::sleep(self.delay()).await;
            return Err(Error::unavailable("sim: connection refused"));
        }
        let (tx, rx) = oneshot::channel();
        let world = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(world.delay()).await;
            if world.lost(client) || world.down() {
                return;
            }
            world.unpaused().await;
            if world.down() {
                return;
            }
            world.reap().await;
            let reply = op(world.clone()).await;
            tokio::time::sleep(world.delay()).await;
            if !world.lost(client) {
                let _ = tx.send(reply);
            }
        });
        let limit = crate::spi::backend::DEFAULT_TIMEOUT;
        let answer = async {
            match rx.await {
                Ok(reply) => reply,
                // Lost on the way: nothing comes back.
                Err(_) => std::future::pending().await,
            }
        };
        tokio::time::timeout(limit, answer)
            .await
            .unwrap_or_else(|_| Err(Error::unavailable("sim: no answer within the timeout")))
    }

    /// Ends the sessions whose time ran out, and their holds.
    async fn reap(&self) {
        let now = Instant::now();
        let ended = {
            let mut s = unpoisoned(&self.sessions);
            let gone: Vec<u64> =
                s.1.iter()
                    .filter(|(_, v)| v.expires <= now)
                    .map(|(k, _)| *k)
                    .collect();
            let mut ended = Ends::default();
            for k in gone {
                let Some(v) = s.1.remove(&k) else { continue };
                let session = format_args!("{}:{}", k >> 32, k & 0xffff_ffff);
                let n = v.ends.holds.len();
                self.log.note(
                    "server",
                    format_args!("ends session {session} and its {n} holds"),
                );
                ended.holds.extend(v.ends.holds);
                ended.places.extend(v.ends.places);
            }
            ended
        };
        self.end(ended).await;
    }

    /// Ends holds and places of sessions, in the server's store.
    async fn end(&self, what: Ends) -> bool {
        let mut was = false;
        for h in &what.holds {
            was |= self.server.release(h).await.unwrap_or(false);
        }
        for p in &what.places {
            let _ = self.server.abandon(p).await;
        }
        was
    }

    /// Ends `hold_id`'s holds and places in every session.
    async fn end_everywhere(&self, hold_id: &str) -> bool {
        let mine = |id: &str| id.split_once('@').is_some_and(|(h, _)| h == hold_id);
        let what = {
            let mut s = unpoisoned(&self.sessions);
            let mut what = Ends::default();
            for v in s.1.values_mut() {
                what.holds
                    .extend(v.ends.holds.extract_if(.., |h| mine(&h.hold_id)));
                what.places
                    .extend(v.ends.places.extract_if(.., |p| mine(&p.hold_id)));
            }
            what
        };
        self.end(what).await
    }

    /// The server stops; with `lose`, it comes back with no holds and no
    /// sessions (tokens keep their floor, as `next_token` promises).
    pub(super) async fn restart(&self, names: &[LockName], lose: bool) {
        if lose {
            unpoisoned(&self.sessions).1.clear();
            for n in names {
                let _ = self.server.force_release(n).await;
            }
        }
    }

    /// Whether the server keeps a session of `client`.
    pub(super) fn has_session(&self, client: usize) -> bool {
        let s = unpoisoned(&self.sessions);
        s.1.keys().any(|id| *id >> 32 == client as u64)
    }

    /// Notes when the server granted a hold (the first time: a retry's
    /// answer is the same grant), which the checker measures beliefs by.
    fn granted(&self, outcome: &Outcome, name: &LockName) {
        if let Outcome::Granted { token, .. } = outcome {
            let at = self.log.now();
            self.log.with(|r| {
                r.granted
                    .entry((name.as_str().to_owned(), *token))
                    .or_insert(at);
            });
        }
    }

    /// The server ends `client`'s session now (an operator's kill, an
    /// expiry the client has not noticed).
    pub(super) async fn expire_session_of(&self, client: usize) -> bool {
        let hit = {
            let mut s = unpoisoned(&self.sessions);
            let mine = s.1.iter_mut().filter(|(id, _)| *id >> 32 == client as u64);
            mine.map(|(_, v)| v.expires = Instant::now()).count() > 0
        };
        self.reap().await;
        hit
    }

    /// What the server holds for `name`, read directly (the checker's view).
    pub(super) async fn truth(&self, name: &LockName) -> Result<LockStatus> {
        self.reap().await;
        self.server.status(name).await
    }
}

/// A client's session: its id (0 while it has none) and its clock.
struct ClientSession {
    id: AtomicU64,
    clock: SessionClock<u64>,
    wakeups: Arc<Wakeups>,
}

/// Keeps a client's session alive every TTL/3, as the etcd backend does:
/// a new one when the server says it is gone or when it was not confirmed
/// within its TTL, measured from the keep-alive's send time.
async fn keep_alive(world: Arc<World>, client: usize, session: Weak<ClientSession>) {
    let Keeping::Session { ttl } = world.keeping else {
        return;
    };
    let mut lives_until = Instant::now();
    loop {
        let Some(s) = session.upgrade() else { return };
        let id = s.id.load(Ordering::Acquire);
        let sent = Instant::now();
        if id == 0 {
            let made = world
                .call(client, move |w| {
                    Box::pin(async move {
                        let mut s = unpoisoned(&w.sessions);
                        s.0 += 1;
                        let id = ((client as u64) << 32) | s.0;
                        s.1.insert(
                            id,
                            ServerSession {
                                expires: Instant::now() + ttl,
                                ends: Ends::default(),
                            },
                        );
                        Ok(id)
                    })
                })
                .await;
            if let Ok(id) = made {
                lives_until = believed_until(sent, ttl);
                s.clock.start(id, lives_until);
                s.id.store(id, Ordering::Release);
                s.wakeups.wake_all();
                continue;
            }
        } else {
            let alive = world
                .call(client, move |w| {
                    Box::pin(async move {
                        let mut s = unpoisoned(&w.sessions);
                        Ok(s.1.get_mut(&id).map(|v| v.expires = Instant::now() + ttl))
                    })
                })
                .await;
            match alive {
                Ok(Some(())) => {
                    lives_until = believed_until(sent, ttl);
                    s.clock.confirm(id, lives_until);
                }
                Ok(None) => end_session(&s, id),
                Err(_) if Instant::now() >= lives_until => end_session(&s, id),
                Err(_) => {}
            }
        }
        drop(s);
        tokio::time::sleep(ttl / 3).await;
    }
}

fn end_session(s: &ClientSession, id: u64) {
    if s.id
        .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        s.clock.end(id);
        s.wakeups.wake_all();
    }
}

/// A client's backend: every call crosses the simulated network.
pub(super) struct SimBackend {
    world: Arc<World>,
    client: usize,
    session: Option<Arc<ClientSession>>,
    _bell: Arc<dyn Backend>,
}

impl SimBackend {
    fn send<T, F, Fut>(&self, op: F) -> Reply<'static, T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<World>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let (world, client) = (self.world.clone(), self.client);
        Box::pin(async move { world.call(client, move |w| Box::pin(op(w))).await })
    }
}

impl LockBackend for SimBackend {
    fn scheme(&self) -> &'static str {
        "sim"
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome> {
        let mut req = req.clone();
        let Some(s) = self.session.clone() else {
            return self.send(move |w| async move {
                let outcome = w.server.attempt(&req).await?;
                w.granted(&outcome, &req.name);
                Ok(outcome)
            });
        };
        Box::pin(async move {
            let id = s.id.load(Ordering::Acquire);
            if id == 0 {
                return Err(Error::unavailable("sim: no session yet"));
            }
            req.lease = FOREVER;
            req.hold_id = in_session(&req.hold_id, id);
            let outcome = self
                .send(move |w| async move {
                    if !unpoisoned(&w.sessions).1.contains_key(&id) {
                        return Err(Error::unavailable("sim: the session is gone"));
                    }
                    let outcome = w.server.attempt(&req).await?;
                    w.granted(&outcome, &req.name);
                    let mut sessions = unpoisoned(&w.sessions);
                    let Some(v) = sessions.1.get_mut(&id).map(|v| &mut v.ends) else {
                        return Ok(outcome);
                    };
                    let q = &req.hold_id;
                    v.places.retain(|p| p.hold_id != *q);
                    match &outcome {
                        Outcome::Granted { .. } if !v.holds.iter().any(|h| h.hold_id == *q) => {
                            v.holds.push(req.hold_ref());
                            let session = format_args!("{}:{}", id >> 32, id & 0xffff_ffff);
                            w.log
                                .note("server", format_args!("grants in session {session}"));
                        }
                        Outcome::Busy(b) if b.ticket.is_some() => {
                            let mut place = req.withdrawal();
                            place.ticket = b.ticket;
                            v.places.push(place);
                        }
                        _ => {}
                    }
                    Ok(outcome)
                })
                .await?;
            Ok(match outcome {
                Outcome::Granted { token, .. } => Outcome::Granted {
                    token,
                    session: Some(s.clock.bound_of(id)),
                },
                other => other,
            })
        })
    }

    fn ends_holds(&self) -> bool {
        self.session.is_none()
    }

    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>> {
        let mut holds = holds.to_vec();
        if let Some(s) = &self.session {
            // As etcd: a hold is renewed in the client's session of now;
            // one taken in an earlier session is gone.
            let id = s.id.load(Ordering::Acquire);
            for h in &mut holds {
                h.lease = FOREVER;
                h.hold_id = in_session(&h.hold_id, id);
            }
        }
        self.send(move |w| async move { w.server.renew(&holds).await })
    }

    fn identity(&self) -> String {
        format!("sim://{}", self.world.namespace)
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> Reply<'a, bool> {
        let hold = hold.clone();
        if self.session.is_none() {
            return self.send(move |w| async move {
                let freed = w.server.release(&hold).await;
                if matches!(freed, Ok(true)) {
                    w.released.fetch_add(1, Ordering::Relaxed);
                }
                freed
            });
        }
        self.send(move |w| async move { Ok(w.end_everywhere(&hold.hold_id).await) })
    }

    fn release_later(&self, hold: HoldRef) {
        // As the etcd backend: a hold kept by a session stays while the
        // session lives, so its release is tried again while it does.
        let Some(s) = self.session.clone() else {
            return;
        };
        let (world, client) = (self.world.clone(), self.client);
        let id = s.id.load(Ordering::Acquire);
        tokio::spawn(async move {
            while s.id.load(Ordering::Acquire) == id && id != 0 {
                let hold_id = hold.hold_id.clone();
                let ended = world
                    .call(client, move |w| {
                        Box::pin(async move { Ok(w.end_everywhere(&hold_id).await) })
                    })
                    .await;
                if ended.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    fn abandon<'a>(&'a self, gone: &'a Withdrawal) -> Reply<'a, ()> {
        let gone = gone.clone();
        if self.session.is_none() {
            return self.send(move |w| async move { w.server.abandon(&gone).await });
        }
        self.send(move |w| async move {
            w.end_everywhere(&gone.hold_id).await;
            Ok(())
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus> {
        let name = name.clone();
        self.send(move |w| async move { w.server.status(&name).await })
    }

    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>> {
        let prefix = prefix.to_owned();
        self.send(move |w| async move { w.server.names(&prefix).await })
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> Reply<'a, usize> {
        let name = name.clone();
        self.send(move |w| async move { w.server.force_release(&name).await })
    }
}

impl Store for SimBackend {
    fn register_read<'a>(&'a self, name: &'a LockName) -> Reply<'a, RegisterValue> {
        let name = name.clone();
        self.send(move |w| async move { w.server.register_read(&name).await })
    }

    fn register_write<'a>(&'a self, write: RegisterWrite<'a>) -> Reply<'a, bool> {
        let (name, value, rule) = (write.name.clone(), write.value.to_vec(), write.rule);
        self.send(move |w| async move {
            let write = RegisterWrite {
                name: &name,
                value: &value,
                rule,
            };
            w.server.register_write(write).await
        })
    }

    fn register_decrement<'a>(&'a self, name: &'a LockName, by: i64) -> Reply<'a, Option<i64>> {
        let name = name.clone();
        self.send(move |w| async move { w.server.register_decrement(&name, by).await })
    }

    fn register_delete<'a>(&'a self, name: &'a LockName) -> Reply<'a, bool> {
        let name = name.clone();
        self.send(move |w| async move { w.server.register_delete(&name).await })
    }

    fn watch_register<'a>(&'a self, name: &'a LockName) -> Reply<'a, ()> {
        let name = name.clone();
        self.send(move |w| async move { w.server.watch_register(&name).await })
    }

    fn rate_acquire<'a>(
        &'a self,
        name: &'a LockName,
        cost: crate::spi::rate::RateCost,
    ) -> Reply<'a, Option<std::time::Duration>> {
        let name = name.clone();
        self.send(move |w| async move { w.server.rate_acquire(&name, cost).await })
    }
}

impl Backend for SimBackend {}
