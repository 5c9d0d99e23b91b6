//! Barriers and count-down latches: a small value in the lock backend
//! that waiters watch, woken by the engine when it is written (Curator's
//! `DistributedBarrier`, Redisson's `RCountDownLatch`).

use crate::client::Client;
use crate::error::{Error, Result};
use std::time::Duration;
use tokio::time::Instant;

/// What a set barrier's register holds.
const SET: &[u8] = b"1";
/// What a removed barrier's register holds.
const REMOVED: &[u8] = b"0";

/// Lost races after which setting a latch's count, or a barrier, gives up.
const MAX_SET_RACES: u32 = 100;

/// When a wait of `timeout` from now ends; `None` (no end) for one too
/// long to count ([`Duration::MAX`] for ever).
fn deadline(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// What `value` holds, by `parse`: a state and the register's version.
async fn read_parsed<T>(
    value: &crate::VersionedValue,
    parse: impl Fn(crate::spi::RegisterValue) -> Result<(T, u64)>,
) -> Result<(T, u64)> {
    parse(value.read_raw().await?)
}

/// Waits until `value`'s state (by `parse`) is `open`, or its version
/// has moved since the wait began (whoever writes it moves the version
/// only past an open state); whether it was before `until`.
async fn wait_open<T>(
    value: &crate::VersionedValue,
    until: Option<Instant>,
    parse: impl Fn(crate::spi::RegisterValue) -> Result<(T, u64)>,
    open: impl Fn(&T) -> bool,
) -> Result<bool> {
    let (state, since) = read_parsed(value, &parse).await?;
    if open(&state) {
        return Ok(true);
    }
    let got = value
        .wait(until, |raw| {
            let (state, version) = parse(raw)?;
            Ok((open(&state) || version != since).then_some(()))
        })
        .await?;
    Ok(got.is_some())
}

/// The error of a change that lost `MAX_SET_RACES` races in a row.
fn too_contended(what: &str) -> Error {
    Error::new(
        crate::ErrorKind::TimedOut,
        format!(
            "{what}: other clients' writes won {MAX_SET_RACES} races in a row; nothing was changed"
        ),
    )
}

/// A barrier that holds every waiter back while it is set (Curator's
/// `DistributedBarrier`): one process sets it, any number
/// [`wait`](Self::wait), and all go on once it is removed.
///
/// It lives in the register named like the barrier, written `1` while
/// set, and stays set when the process that set it dies (as Curator's
/// persistent node does): remove it by hand (`fenced barrier NAME
/// remove`) if that process is gone for good. Waiters are woken by the
/// engine when the barrier is written, and look again on their own
/// every two seconds in case a notification was lost. Only a change
/// writes (setting a set barrier writes nothing), so a waiter that sees
/// the register's version move on knows the barrier was removed since it
/// began, even if it was set again before the waiter looked.
///
/// On ZooKeeper the barrier is Curator's: it is set while the node at its
/// path (`/N` under the URL's path) exists, so a Curator
/// `DistributedBarrier` on that path is the same barrier; a waiter tells
/// a barrier removed and set again by the node's creation (`czxid`).
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://barrier-doc").await?;
/// let gate = client.barrier("deploy-gate")?;
/// gate.set().await?;
/// let waiter = {
///     let gate = client.barrier("deploy-gate")?;
///     tokio::spawn(async move { gate.wait().await })
/// };
/// assert!(gate.is_set().await?);
/// gate.remove().await?;
/// waiter.await.unwrap()?;
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Barrier {
    value: crate::VersionedValue,
}

impl Barrier {
    pub(crate) fn new(client: &Client, name: &str) -> Result<Barrier> {
        Ok(Barrier {
            value: client.versioned(name)?.native(crate::spi::Codec::Presence),
        })
    }

    /// The barrier's name.
    pub fn name(&self) -> &str {
        self.value.name()
    }

    /// Sets the barrier (if not set): waiters wait from now on.
    pub async fn set(&self) -> Result<()> {
        self.change(true).await
    }

    /// Removes the barrier (if set): every waiter goes on.
    pub async fn remove(&self) -> Result<()> {
        self.change(false).await
    }

    /// Whether the barrier is set now.
    pub async fn is_set(&self) -> Result<bool> {
        Ok(self.read().await?.0)
    }

    /// Waits while the barrier is set; at once if it is not.
    pub async fn wait(&self) -> Result<()> {
        self.wait_until(None).await.map(drop)
    }

    /// Waits while the barrier is set, for at most `timeout`: `true` if it
    /// was removed (or never set), `false` if it was still set then.
    pub async fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        self.wait_until(deadline(timeout)).await
    }

    async fn wait_until(&self, until: Option<Instant>) -> Result<bool> {
        // The version moves only when the barrier changes.
        wait_open(&self.value, until, |raw| self.parse(raw), |set| !set).await
    }

    /// Sets or removes it, writing only if that changes it.
    async fn change(&self, set: bool) -> Result<()> {
        for _ in 0..MAX_SET_RACES {
            let (now, version) = self.read().await?;
            if now == set {
                return Ok(());
            }
            let value = if set { SET } else { REMOVED };
            if self.value.compare_and_set(version, value).await? {
                return Ok(());
            }
        }
        Err(too_contended(&format!("barrier {:?}", self.name())))
    }

    /// Whether it is set, and the register's version.
    async fn read(&self) -> Result<(bool, u64)> {
        read_parsed(&self.value, |raw| self.parse(raw)).await
    }

    fn parse(&self, raw: crate::spi::RegisterValue) -> Result<(bool, u64)> {
        match raw {
            None => Ok((false, 0)),
            Some((v, version)) if v == SET => Ok((true, version)),
            Some((v, version)) if v == REMOVED => Ok((false, version)),
            Some((v, _)) => Err(Error::invalid(format!(
                "barrier {:?} holds {:?}, not 1 or 0: the name is used by another kind of value",
                self.name(),
                String::from_utf8_lossy(&v)
            ))),
        }
    }
}

/// A count-down latch (Redisson's `RCountDownLatch`): its count is set
/// once, each [`count_down`](Self::count_down) takes one off, and
/// [`wait`](Self::wait) returns once it is zero.
///
/// The count lives in the register named like the latch. Setting it
/// succeeds only while it is zero, so that a latch in use is not set
/// again under its waiters; once it reaches zero it may be set again for
/// another round. A count-down at zero changes nothing. A latch never
/// set counts zero: waiting on it returns at once, as Redisson's does.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://latch-doc").await?;
/// let loaded = client.latch("caches-loaded")?;
/// assert!(loaded.try_set_count(2).await?);
/// assert!(!loaded.try_set_count(5).await?); // in use: not set again
/// loaded.count_down().await?;
/// assert!(!loaded.wait_timeout(std::time::Duration::from_millis(10)).await?);
/// loaded.count_down().await?;
/// loaded.wait().await?;
/// assert_eq!(loaded.count().await?, 0);
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct CountDownLatch {
    value: crate::VersionedValue,
}

impl CountDownLatch {
    pub(crate) fn new(client: &Client, name: &str) -> Result<CountDownLatch> {
        Ok(CountDownLatch {
            value: client.versioned(name)?,
        })
    }

    /// The latch's name.
    pub fn name(&self) -> &str {
        self.value.name()
    }

    /// Sets the count to `count` if it is zero now; whether it did.
    ///
    /// # Errors
    /// [`InvalidInput`](crate::ErrorKind::InvalidInput) for a count of 0
    /// or above 2^53 (what every engine counts exactly).
    pub async fn try_set_count(&self, count: u64) -> Result<bool> {
        if count == 0 || count > 1 << 53 {
            return Err(Error::invalid(format!(
                "latch {:?}: a count of {count}; it takes 1 to 2^53",
                self.name()
            )));
        }
        for _ in 0..MAX_SET_RACES {
            let (n, version) = self.read().await?;
            if n > 0 {
                return Ok(false);
            }
            // A count-down at zero writes nothing, so only another set
            // can change the version under us: then look again.
            if self
                .value
                .compare_and_set(version, count.to_string())
                .await?
            {
                return Ok(true);
            }
        }
        Err(too_contended(&format!("latch {:?}", self.name())))
    }

    /// Takes one off the count, unless it is zero; the count after it.
    pub async fn count_down(&self) -> Result<u64> {
        let inner = &self.value.client().inner;
        let name = self.value.lock_name();
        let after = inner
            .write(
                "register_decrement",
                inner.backend.register_decrement(name, 1),
            )
            .await?;
        Ok(after.map_or(0, |n| n.max(0) as u64))
    }

    /// The count now.
    pub async fn count(&self) -> Result<u64> {
        Ok(self.read().await?.0)
    }

    /// Waits until the count is zero; at once if it is.
    pub async fn wait(&self) -> Result<()> {
        self.wait_until(None).await.map(drop)
    }

    /// Waits until the count is zero, for at most `timeout`: whether it
    /// reached zero.
    pub async fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        self.wait_until(deadline(timeout)).await
    }

    async fn wait_until(&self, until: Option<Instant>) -> Result<bool> {
        // A count is set only at zero, and count-downs leave the version:
        // it moves only when the latch is set again, its round over.
        wait_open(
            &self.value,
            until,
            |raw| self.parse(raw),
            |count| *count == 0,
        )
        .await
    }

    async fn read(&self) -> Result<(u64, u64)> {
        read_parsed(&self.value, |raw| self.parse(raw)).await
    }

    /// The count and the register's version.
    fn parse(&self, raw: crate::spi::RegisterValue) -> Result<(u64, u64)> {
        let Some((v, version)) = raw else {
            return Ok((0, 0));
        };
        let n = std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                Error::invalid(format!(
                    "latch {:?} holds {:?}, not a count: the name is used by another kind of value",
                    self.name(),
                    String::from_utf8_lossy(&v)
                ))
            })?;
        Ok((n, version))
    }
}

/// What a double barrier's register adds to its name.
const ROUND_SUFFIX: &str = ":barrier";

/// The most members a double barrier takes: its register lists the
/// tokens of the members of the last round that filled.
pub const MAX_MEMBERS: u32 = 1024;

/// A double barrier (Curator's `DistributedDoubleBarrier`): a group of
/// `members` processes [`enter`](Self::enter) it, each waiting until all
/// have entered, do their work, and [`leave`](Member::leave) it, each
/// waiting until all have left.
///
/// Membership is a permit of the semaphore named like the barrier, of
/// `members` permits, held with a lease and the watchdog as any hold is:
/// a member that dies leaves when its lease runs out, so it blocks the
/// others no longer than that. A member past the `members`-th waits for
/// a permit.
///
/// The register `<name>:barrier` keeps the rounds: the member that finds
/// the barrier full writes the next round's number with the tokens of
/// the members it counted, so each of them learns it was counted even if
/// it looks only after others have left; the member that finds it empty
/// again (none of the round's members inside) writes that the round
/// emptied, so each leaver learns it even if one has entered the next
/// round meanwhile (a group that loops on enter, work, leave); a member that gives up entering writes so first,
/// so that nobody counts it after. Every entry and exit writes the
/// register, which wakes the waiters.
///
/// It is meant for one group at a time: a process that enters while
/// members of the last round are still inside counts them.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://double-barrier-doc").await?;
/// let tasks: Vec<_> = (0..3)
///     .map(|_| {
///         let barrier = client.double_barrier("batch", 3).unwrap();
///         tokio::spawn(async move {
///             for _round in 0..2 {
///                 let member = barrier.enter().await?; // all three are in
///                 // ... the work ...
///                 member.leave().await?; // all three are out
///             }
///             Ok::<_, fenced::Error>(())
///         })
///     })
///     .collect();
/// for t in tasks {
///     t.await.unwrap()?;
/// }
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct DoubleBarrier {
    members: crate::Semaphore,
    size: u32,
    rounds: crate::VersionedValue,
}

/// What the register of a double barrier holds, written
/// `<round> <emptied> <member token>… -<withdrawn token>…`: the last
/// round that filled and the tokens counted in it, the last round that
/// emptied, and the members that gave up entering since it filled.
#[derive(Default)]
struct Rounds {
    round: u64,
    emptied: u64,
    members: Vec<u64>,
    withdrawn: Vec<u64>,
    /// The register's version it was read at: what a write of it
    /// compares against.
    version: u64,
}

impl Rounds {
    fn text(&self) -> String {
        let mut text = format!("{} {}", self.round, self.emptied);
        for t in &self.members {
            text.push_str(&format!(" {t}"));
        }
        for t in &self.withdrawn {
            text.push_str(&format!(" -{t}"));
        }
        text
    }
}

impl DoubleBarrier {
    pub(crate) fn new(client: &Client, name: &str, members: u32) -> Result<DoubleBarrier> {
        if members == 0 || members > MAX_MEMBERS {
            return Err(Error::invalid(format!(
                "double barrier {name:?}: {members} members; it takes 1 to {MAX_MEMBERS}"
            )));
        }
        if name.len() + ROUND_SUFFIX.len() > crate::MAX_NAME_LEN {
            return Err(Error::invalid(format!(
                "double barrier name is {} bytes long; double barriers take at most {} (their \
                 register's name adds {ROUND_SUFFIX:?})",
                name.len(),
                crate::MAX_NAME_LEN - ROUND_SUFFIX.len()
            )));
        }
        Ok(DoubleBarrier {
            members: client.semaphore(name, members)?.for_barrier(),
            size: members,
            rounds: client.versioned(&format!("{name}{ROUND_SUFFIX}"))?,
        })
    }

    /// The barrier's name.
    pub fn name(&self) -> &str {
        self.members.as_lock().name()
    }

    /// How many members the barrier waits for.
    pub fn members(&self) -> u32 {
        self.size
    }

    /// The lock behind the membership, to set its lease or retry policy.
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn with_lock(mut self, f: impl FnOnce(crate::Semaphore) -> crate::Semaphore) -> Self {
        self.members = f(self.members);
        self
    }

    /// Enters, and waits until all members have entered.
    pub async fn enter(&self) -> Result<Member> {
        let member = self.enter_until(None).await?;
        member.ok_or_else(|| Error::protocol("an entry without a deadline ended without entering"))
    }

    /// Enters, and waits up to `timeout` until all members have entered;
    /// `None`, having left again, if they had not by then.
    pub async fn enter_timeout(&self, timeout: Duration) -> Result<Option<Member>> {
        self.enter_until(deadline(timeout)).await
    }

    async fn enter_until(&self, until: Option<Instant>) -> Result<Option<Member>> {
        let guard = match until {
            None => self.members.acquire().await?,
            Some(u) => {
                let left = u.saturating_duration_since(Instant::now());
                match self.members.acquire_timeout(left).await? {
                    Some(g) => g,
                    None => return Ok(None),
                }
            }
        };
        if self.in_layout() {
            return self.enter_in_layout(guard, until).await;
        }
        let me = guard.fencing_token();
        let counted = match self.wait_to_be_counted(&guard, until).await {
            Ok(Some(round)) => Some(round),
            // Not counted in time, or the wait failed: give up, written
            // first, so that nobody counts this member after. (A future
            // dropped here cannot write it: its permit is released in the
            // background, and a member filling the barrier in that moment
            // may count it.)
            Ok(None) => self.withdraw(me).await?,
            Err(e) => {
                let _ = self.withdraw(me).await;
                return Err(e);
            }
        };
        let Some((round, mates)) = counted else {
            guard.release().await?;
            return Ok(None);
        };
        Ok(Some(Member {
            guard,
            round,
            mates,
            nodes: Vec::new(),
            barrier: self.clone(),
        }))
    }

    /// Whether the engine has a double barrier layout of its own
    /// (Curator's on ZooKeeper), which this barrier then follows.
    fn in_layout(&self) -> bool {
        self.rounds.client().inner.backend.barriers().is_some()
    }

    fn lock_name(&self) -> &crate::name::LockName {
        &self.members.as_lock().name
    }

    /// Curator's entry, its member node made (`guard`): in once `ready`
    /// is set, which the member that finds them all in sets.
    async fn enter_in_layout(
        &self,
        guard: crate::Guard,
        until: Option<Instant>,
    ) -> Result<Option<Member>> {
        let inner = &self.rounds.client().inner;
        let name = self.lock_name();
        let guard_ref = &guard;
        let entered = inner
            .wait_armed(
                name,
                until,
                |b| watch_ready(b, name),
                || async move {
                    if !guard_ref.is_held() {
                        return Err(Error::new(
                            crate::ErrorKind::Lost,
                            format!(
                                "double barrier {:?}: this member's node (token {}) went before \
                             the barrier filled",
                                self.name(),
                                guard_ref.fencing_token()
                            ),
                        ));
                    }
                    let (members, ready) = self.members_now().await?;
                    // A `ready` whose round is over (all its members gone
                    // without the last of them removing it) opens nothing;
                    // the member that fills this round replaces it.
                    if ready && !self.ready_is_stale(&members).await? {
                        return Ok(Some(members));
                    }
                    if members.len() >= self.size as usize {
                        inner
                            .write("set_ready", set_ready(&*inner.backend, name, true))
                            .await?;
                        return Ok(Some(members));
                    }
                    Ok(None)
                },
            )
            .await;
        match entered {
            Ok(Some(nodes)) => Ok(Some(Member {
                guard,
                round: 0,
                mates: Vec::new(),
                nodes,
                barrier: self.clone(),
            })),
            // Not all in by then: out again.
            Ok(None) => {
                guard.release().await?;
                Ok(None)
            }
            Err(e) => {
                let _ = guard.release().await;
                Err(e)
            }
        }
    }

    /// Whether `ready` is left from a round that is over.
    async fn ready_is_stale(&self, members: &[String]) -> Result<bool> {
        let name = self.lock_name();
        (self.rounds.client().inner)
            .read("ready_is_stale", |b| match b.barriers() {
                Some(l) => l.ready_is_stale(name, members),
                None => Box::pin(async { Ok(false) }),
            })
            .await
    }

    /// The members' nodes in the engine's layout, sorted, and whether
    /// `ready` is set.
    async fn members_now(&self) -> Result<(Vec<String>, bool)> {
        let name = self.lock_name();
        (self.rounds.client().inner)
            .read("barrier_members", |b| match b.barriers() {
                Some(l) => l.barrier_members(name),
                None => Box::pin(async { Ok((Vec::new(), false)) }),
            })
            .await
    }

    /// Waits until this member is counted in a round that filled: the
    /// round and the tokens counted in it.
    async fn wait_to_be_counted(
        &self,
        guard: &crate::Guard,
        until: Option<Instant>,
    ) -> Result<Option<(u64, Vec<u64>)>> {
        let me = guard.fencing_token();
        self.poke().await?;
        let inner = &self.rounds.client().inner;
        inner
            .wait_on(self.rounds.lock_name(), until, || async move {
                let rounds = self.rounds().await?;
                if rounds.members.contains(&me) {
                    return Ok(Some((rounds.round, rounds.members)));
                }
                if !guard.is_held() {
                    return Err(Error::new(
                        crate::ErrorKind::Lost,
                        format!(
                            "double barrier {:?}: this member's permit (token {me}) ended \
                             before the barrier filled",
                            self.name()
                        ),
                    ));
                }
                let inside: Vec<u64> = (self.members.status().await?.holders.iter())
                    .map(|h| h.token)
                    .filter(|t| !rounds.withdrawn.contains(t))
                    .collect();
                if inside.len() as u32 >= self.size && inside.contains(&me) {
                    let filled = Rounds {
                        round: rounds.round + 1,
                        members: inside,
                        withdrawn: Vec::new(),
                        ..rounds
                    };
                    // A lost race: another write came; look again.
                    if self.write(&filled).await? {
                        return Ok(Some((filled.round, filled.members)));
                    }
                }
                Ok(None)
            })
            .await
    }

    /// Gives up entering: written before the permit goes, so that no
    /// member counts this one after; the round it was counted in, and
    /// its mates, if a member counted it first. Only withdrawals of
    /// members still inside are kept.
    async fn withdraw(&self, me: u64) -> Result<Option<(u64, Vec<u64>)>> {
        for _ in 0..MAX_SET_RACES {
            let rounds = self.rounds().await?;
            if rounds.members.contains(&me) {
                return Ok(Some((rounds.round, rounds.members)));
            }
            let holders: Vec<u64> = (self.members.status().await?.holders.iter())
                .map(|h| h.token)
                .collect();
            let mut after = rounds;
            after.withdrawn.retain(|t| holders.contains(t));
            after.withdrawn.push(me);
            if self.write(&after).await? {
                return Ok(None);
            }
        }
        Err(too_contended(&format!("double barrier {:?}", self.name())))
    }

    /// Writes `rounds` by compare-and-set on the version it was read at.
    async fn write(&self, rounds: &Rounds) -> Result<bool> {
        self.rounds
            .compare_and_set(rounds.version, rounds.text())
            .await
    }

    /// What the register holds now.
    async fn rounds(&self) -> Result<Rounds> {
        let Some(v) = self.rounds.read().await? else {
            return Ok(Rounds::default());
        };
        let bad = || {
            Error::invalid(format!(
                "double barrier {:?}: its register holds {:?}, not rounds and tokens: the \
                 name is used by another kind of value",
                self.name(),
                String::from_utf8_lossy(&v.value)
            ))
        };
        let text = std::str::from_utf8(&v.value).map_err(|_| bad())?;
        let mut words = text.split(' ');
        let number = |w: Option<&str>| w.and_then(|w| w.parse::<u64>().ok()).ok_or_else(bad);
        let round = number(words.next())?;
        let emptied = number(words.next())?;
        let mut rounds = Rounds {
            round,
            emptied,
            version: v.version,
            ..Rounds::default()
        };
        for w in words {
            match w.strip_prefix('-') {
                Some(t) => rounds.withdrawn.push(number(Some(t))?),
                None => rounds.members.push(number(Some(w))?),
            }
        }
        Ok(rounds)
    }

    /// Writes the register as it is, to wake the waiters: someone
    /// entered or left. A lost race means another write woke them.
    async fn poke(&self) -> Result<()> {
        let rounds = self.rounds().await?;
        self.write(&rounds).await.map(drop)
    }
}

/// A member inside a [`DoubleBarrier`]: its permit, held with the
/// watchdog. Dropped without [`leave`](Self::leave), it leaves without
/// waiting for the others (its permit is released in the background).
#[derive(Debug)]
#[must_use = "dropping a member leaves the barrier at once"]
pub struct Member {
    guard: crate::Guard,
    /// The round it was counted in.
    round: u64,
    /// The tokens counted in that round, its own among them.
    mates: Vec<u64>,
    /// In the engine's own layout, the members' nodes when it went in
    /// (its round's; a member of the next is not among them).
    nodes: Vec<String>,
    barrier: DoubleBarrier,
}

impl Member {
    /// The member's hold: its token, and [`lost`](crate::Guard::lost)
    /// should its lease run out.
    pub fn guard(&self) -> &crate::Guard {
        &self.guard
    }

    /// Leaves, and waits until every member has left.
    pub async fn leave(self) -> Result<()> {
        self.leave_until(None).await.map(drop)
    }

    /// Leaves, and waits up to `timeout` until every member has left:
    /// whether all had.
    pub async fn leave_timeout(self, timeout: Duration) -> Result<bool> {
        self.leave_until(deadline(timeout)).await
    }

    async fn leave_until(self, until: Option<Instant>) -> Result<bool> {
        if self.barrier.in_layout() {
            return self.leave_in_layout(until).await;
        }
        let (b, round, mates) = (&self.barrier, self.round, &self.mates);
        self.guard.release().await?;
        b.poke().await?;
        let out = b
            .rounds
            .client()
            .inner
            .wait_on(b.rounds.lock_name(), until, || async move {
                let rounds = b.rounds().await?;
                if rounds.emptied >= round {
                    return Ok(Some(()));
                }
                // Out when none of this round's members is inside (a
                // member of the next round may be already).
                let holders = b.members.status().await?.holders;
                if !holders.iter().any(|h| mates.contains(&h.token)) {
                    let emptied = Rounds {
                        emptied: round,
                        ..rounds
                    };
                    // A lost race: another write came; look again.
                    if b.write(&emptied).await? {
                        return Ok(Some(()));
                    }
                }
                Ok(None)
            })
            .await?;
        Ok(out.is_some())
    }
}

impl Member {
    /// Leaves in the engine's own layout (Curator's): this member's node
    /// goes at once, then it waits until none of the nodes that were in
    /// when it entered is left, and removes `ready`, as Curator's leaver
    /// does. (Curator's lowest member keeps its node until it is alone;
    /// the others go at once: either way every member waits for the
    /// others' nodes to go. Waiting only for its own round's nodes, a
    /// member is not held back by one that left and entered the next
    /// round already.)
    async fn leave_in_layout(self, until: Option<Instant>) -> Result<bool> {
        let Member {
            guard,
            nodes,
            barrier,
            ..
        } = self;
        let b = &barrier;
        let inner = &b.rounds.client().inner;
        let name = b.lock_name();
        let me = inner
            .backend
            .barriers()
            .and_then(|l| l.member_of(guard.hold_ref()));
        guard.release().await?;
        let (nodes, me) = (&nodes, me.as_deref());
        let nothing = |_: &dyn crate::spi::Backend| -> crate::spi::Reply<'_, ()> {
            Box::pin(async { Ok(()) })
        };
        let out = inner
            .wait_armed(name, until, nothing, || async move {
                loop {
                    let (members, _) = b.members_now().await?;
                    let Some(mate) = members
                        .iter()
                        .find(|m| Some(m.as_str()) != me && nodes.contains(m))
                    else {
                        return Ok(Some(()));
                    };
                    let watching = inner
                        .read("watch_member", |b| match b.barriers() {
                            Some(l) => l.watch_member(name, mate),
                            None => Box::pin(async { Ok(false) }),
                        })
                        .await?;
                    if watching {
                        return Ok(None);
                    }
                    // Gone already: look again.
                }
            })
            .await?;
        inner
            .write("set_ready", set_ready(&*inner.backend, name, false))
            .await?;
        Ok(out.is_some())
    }
}

/// Watches `ready` of double barrier `name` in the engine's layout.
fn watch_ready<'a>(
    b: &'a dyn crate::spi::Backend,
    name: &'a crate::name::LockName,
) -> crate::spi::Reply<'a, ()> {
    match b.barriers() {
        Some(l) => l.watch_ready(name),
        None => b.watch_register(name),
    }
}

/// Sets or removes `ready` of double barrier `name` in the engine's layout.
fn set_ready<'a>(
    b: &'a dyn crate::spi::Backend,
    name: &'a crate::name::LockName,
    ready: bool,
) -> crate::spi::Reply<'a, ()> {
    match b.barriers() {
        Some(l) => l.set_ready(name, ready),
        None => Box::pin(async { Ok(()) }),
    }
}
