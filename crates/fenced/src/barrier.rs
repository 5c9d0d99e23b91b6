//! Barriers and count-down latches: a small value in the lock backend
//! that waiters watch, woken by the engine when it is written (Curator's
//! `DistributedBarrier`, Redisson's `RCountDownLatch`).

use crate::client::Client;
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::{RegisterWrite, WriteRule};
use std::time::Duration;
use tokio::time::Instant;

/// What a set barrier's register holds.
const SET: &[u8] = b"1";
/// What a removed barrier's register holds.
const REMOVED: &[u8] = b"0";

/// Lost races after which setting a latch's count gives up.
const MAX_SET_RACES: u32 = 100;

/// A barrier that holds every waiter back while it is set (Curator's
/// `DistributedBarrier`): one process sets it, any number
/// [`wait`](Self::wait), and all go on once it is removed.
///
/// It lives in the register named like the barrier, written `1` while
/// set, and stays set when the process that set it dies (as Curator's
/// persistent node does): remove it by hand (`fenced barrier NAME
/// remove`) if that process is gone for good. Waiters are woken by the
/// engine when the barrier is written, and look again on their own
/// every two seconds in case a notification was lost.
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
    client: Client,
    name: LockName,
}

impl Barrier {
    pub(crate) fn new(client: &Client, name: &str) -> Result<Barrier> {
        Ok(Barrier {
            client: client.clone(),
            name: LockName::new(name)?,
        })
    }

    /// The barrier's name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// Sets the barrier (again, if set already): waiters wait from now on.
    pub async fn set(&self) -> Result<()> {
        self.write(SET).await
    }

    /// Removes the barrier (if set): every waiter goes on.
    pub async fn remove(&self) -> Result<()> {
        self.write(REMOVED).await
    }

    /// Whether the barrier is set now.
    pub async fn is_set(&self) -> Result<bool> {
        let inner = &self.client.inner;
        let got = inner
            .read("register_read", |b| b.register_read(&self.name))
            .await?;
        self.is_set_in(got)
    }

    /// Waits while the barrier is set; at once if it is not.
    pub async fn wait(&self) -> Result<()> {
        self.wait_until(None).await.map(drop)
    }

    /// Waits while the barrier is set, for at most `timeout`: `true` if it
    /// was removed (or never set), `false` if it was still set then.
    pub async fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        self.wait_until(Some(Instant::now() + timeout)).await
    }

    async fn wait_until(&self, until: Option<Instant>) -> Result<bool> {
        let got = self
            .client
            .inner
            .wait_register(&self.name, until, |raw| {
                Ok((!self.is_set_in(raw)?).then_some(()))
            })
            .await?;
        Ok(got.is_some())
    }

    fn is_set_in(&self, raw: crate::spi::RegisterValue) -> Result<bool> {
        match raw {
            None => Ok(false),
            Some((v, _)) if v == SET => Ok(true),
            Some((v, _)) if v == REMOVED => Ok(false),
            Some((v, _)) => Err(Error::invalid(format!(
                "barrier {:?} holds {:?}, not 1 or 0: the name is used by another kind of value",
                self.name(),
                String::from_utf8_lossy(&v)
            ))),
        }
    }

    async fn write(&self, value: &[u8]) -> Result<()> {
        let inner = &self.client.inner;
        inner
            .write(
                "register_write",
                inner.backend.register_write(RegisterWrite {
                    name: &self.name,
                    value,
                    rule: WriteRule::Always,
                }),
            )
            .await
            .map(drop)
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
        Err(Error::new(
            crate::ErrorKind::TimedOut,
            format!(
                "latch {:?}: other clients set it and it went back to zero \
                 {MAX_SET_RACES} times while this one tried; nothing was set",
                self.name()
            ),
        ))
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
        self.wait_until(Some(Instant::now() + timeout)).await
    }

    async fn wait_until(&self, until: Option<Instant>) -> Result<bool> {
        let got = self
            .value
            .client()
            .inner
            .wait_register(self.value.lock_name(), until, |raw| {
                Ok((self.parse(raw)?.0 == 0).then_some(()))
            })
            .await?;
        Ok(got.is_some())
    }

    async fn read(&self) -> Result<(u64, u64)> {
        let inner = &self.value.client().inner;
        let name = self.value.lock_name();
        let got = inner
            .read("register_read", |b| b.register_read(name))
            .await?;
        self.parse(got)
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
/// a permit. The member that finds the barrier full writes the tokens
/// of the members inside to the register `<name>:barrier`, which is how
/// each of them learns it was counted, even one that looks after others
/// have left again; every entry and exit writes that register, which
/// wakes the waiters.
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
///             let member = barrier.enter().await?; // all three are in
///             // ... the work ...
///             member.leave().await // all three are out
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
    client: Client,
    members: crate::Semaphore,
    size: u32,
    rounds: crate::VersionedValue,
}

/// What the register of a double barrier holds: how many rounds filled,
/// and the tokens of the members counted in the last.
struct Fill {
    round: u64,
    tokens: Vec<u64>,
    version: u64,
}

impl Fill {
    fn text(round: u64, tokens: &[u64]) -> String {
        let mut text = round.to_string();
        for t in tokens {
            text.push(' ');
            text.push_str(&t.to_string());
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
            client: client.clone(),
            members: client.semaphore(name, members)?,
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

    /// Enters, and waits until all members have entered.
    pub async fn enter(&self) -> Result<Member> {
        let member = self.enter_until(None).await?;
        member.ok_or_else(|| Error::protocol("an entry without a deadline ended without entering"))
    }

    /// Enters, and waits up to `timeout` until all members have entered;
    /// `None`, having left again, if they had not by then.
    pub async fn enter_timeout(&self, timeout: Duration) -> Result<Option<Member>> {
        self.enter_until(Some(Instant::now() + timeout)).await
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
        let me = guard.fencing_token();
        let member = Member {
            guard,
            barrier: self.clone(),
        };
        self.poke().await?;
        let full = self
            .client
            .inner
            .wait_on(self.rounds.lock_name(), until, || async move {
                let fill = self.fill().await?;
                if fill.tokens.contains(&me) {
                    return Ok(Some(()));
                }
                let inside = self.members.status().await?.holders;
                if inside.len() as u32 >= self.size {
                    let tokens: Vec<u64> = inside.iter().map(|h| h.token).collect();
                    self.filled(fill, &tokens, me).await?;
                    return Ok(Some(()));
                }
                Ok(None)
            })
            .await?;
        if full.is_some() {
            return Ok(Some(member));
        }
        member.guard.release().await?;
        self.poke().await?;
        Ok(None)
    }

    /// Records that the members with `tokens` filled the barrier, so
    /// that each learns it was counted. A race lost to an entry or exit
    /// is tried again; one lost to a member that recorded a fill with
    /// `me` in it is done.
    async fn filled(&self, mut fill: Fill, tokens: &[u64], me: u64) -> Result<()> {
        for _ in 0..MAX_SET_RACES {
            let text = Fill::text(fill.round + 1, tokens);
            if self.rounds.compare_and_set(fill.version, text).await? {
                return Ok(());
            }
            fill = self.fill().await?;
            if fill.tokens.contains(&me) {
                return Ok(());
            }
        }
        Err(Error::new(
            crate::ErrorKind::TimedOut,
            format!(
                "double barrier {:?}: other members' writes won {MAX_SET_RACES} races in a \
                 row against the one that tells them it is full",
                self.name()
            ),
        ))
    }

    /// How many members are inside now.
    async fn inside(&self) -> Result<usize> {
        Ok(self.members.status().await?.holders.len())
    }

    /// What the register holds now.
    async fn fill(&self) -> Result<Fill> {
        let Some(v) = self.rounds.read().await? else {
            return Ok(Fill {
                round: 0,
                tokens: Vec::new(),
                version: 0,
            });
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
        let mut numbers = text.split(' ').map(|n| n.parse::<u64>().map_err(|_| bad()));
        let round = numbers.next().ok_or_else(bad)??;
        let tokens = numbers.collect::<Result<Vec<u64>>>()?;
        Ok(Fill {
            round,
            tokens,
            version: v.version,
        })
    }

    /// Writes the register as it is, to wake the waiters: someone
    /// entered or left. A lost race means another write woke them.
    async fn poke(&self) -> Result<()> {
        let fill = self.fill().await?;
        self.rounds
            .compare_and_set(fill.version, Fill::text(fill.round, &fill.tokens))
            .await
            .map(drop)
    }
}

/// A member inside a [`DoubleBarrier`]: its permit, held with the
/// watchdog. Dropped without [`leave`](Self::leave), it leaves without
/// waiting for the others (its permit is released in the background).
#[derive(Debug)]
#[must_use = "dropping a member leaves the barrier at once"]
pub struct Member {
    guard: crate::Guard,
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
        self.leave_until(Some(Instant::now() + timeout)).await
    }

    async fn leave_until(self, until: Option<Instant>) -> Result<bool> {
        let b = &self.barrier;
        self.guard.release().await?;
        b.poke().await?;
        let out = b
            .client
            .inner
            .wait_on(b.rounds.lock_name(), until, || async move {
                Ok((b.inside().await? == 0).then_some(()))
            })
            .await?;
        Ok(out.is_some())
    }
}
