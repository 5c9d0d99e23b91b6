//! Leader election on any backend: a campaign is a mutex held with the
//! watchdog, and the leader proclaims a value (its address, say) in a
//! fenced register beside it, under its token.

use crate::client::Client;
use crate::error::{ErrorKind, Result};
use crate::fence::FencedRegister;
use crate::guard::Guard;
use crate::mutex::Mutex;
use std::time::Duration;

/// An election among the clients that campaign on one name.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let a = fenced::Client::connect("memory://election-doc").await?;
/// let b = fenced::Client::connect("memory://election-doc").await?;
/// let leading = a.election("scheduler")?.campaign("10.0.0.7:8080").await?;
/// assert!(b.election("scheduler")?.try_campaign("10.0.0.8:8080").await?.is_none());
/// let leader = b.election("scheduler")?.leader().await?.expect("a leader");
/// assert_eq!(leader.value, b"10.0.0.7:8080");
/// leading.resign().await?;
/// assert!(b.election("scheduler")?.leader().await?.is_none());
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    lock: Mutex,
    value: FencedRegister,
}

/// The current leader as observers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// What the leader proclaimed.
    pub value: Vec<u8>,
    /// Its fencing token: later leaders have larger ones.
    pub token: u64,
}

impl Election {
    pub(crate) fn new(client: &Client, name: &str) -> Result<Election> {
        Ok(Election {
            lock: client.mutex(name)?.for_election(),
            value: client.register(&format!("{name}:leader"))?,
        })
    }

    /// The lock behind the election, to set its lease, owner or retry policy.
    #[must_use = "a builder method returns the changed handle; the one it was called on is gone"]
    pub fn with_lock(mut self, f: impl FnOnce(Mutex) -> Mutex) -> Self {
        self.lock = f(self.lock);
        self
    }

    /// Waits until this client leads, then proclaims `value`.
    pub async fn campaign(&self, value: impl AsRef<[u8]>) -> Result<Leadership> {
        let guard = self.lock.acquire().await?;
        self.lead(guard, value.as_ref()).await
    }

    /// Leads if nobody does now; `None` otherwise.
    pub async fn try_campaign(&self, value: impl AsRef<[u8]>) -> Result<Option<Leadership>> {
        match self.lock.try_acquire().await? {
            Some(guard) => Ok(Some(self.lead(guard, value.as_ref()).await?)),
            None => Ok(None),
        }
    }

    /// Waits up to `wait` to lead.
    pub async fn campaign_timeout(
        &self,
        value: impl AsRef<[u8]>,
        wait: Duration,
    ) -> Result<Option<Leadership>> {
        match self.lock.acquire_timeout(wait).await? {
            Some(guard) => Ok(Some(self.lead(guard, value.as_ref()).await?)),
            None => Ok(None),
        }
    }

    async fn lead(&self, guard: Guard, value: &[u8]) -> Result<Leadership> {
        let l = Leadership {
            guard,
            value: self.value.clone(),
        };
        l.proclaim(value).await?;
        Ok(l)
    }

    /// The current leader, if one leads and has proclaimed its value
    /// (between a new leader's grant and its proclamation there is none).
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let inner = &self.lock.as_lock().client.inner;
        if inner.backend.election().is_some() {
            let native = inner
                .read("leader", |b| match b.election() {
                    Some(e) => e.leader(&self.lock.as_lock().name),
                    None => Box::pin(async { Ok(None) }),
                })
                .await?;
            return Ok(native.map(|(value, token)| Leader { value, token }));
        }
        let status = self.lock.status().await?;
        let Some(holder) = status.holders.first() else {
            return Ok(None);
        };
        Ok(match self.value.read().await? {
            Some((value, fence)) if fence == holder.token => Some(Leader {
                value,
                token: fence,
            }),
            _ => None,
        })
    }
}

impl Election {
    /// The election's name.
    pub fn name(&self) -> &str {
        self.lock.as_lock().name()
    }

    /// Who takes part now: the leader's hold (its token, lease and
    /// holder record: host, pid, command) and how many candidates wait,
    /// as Curator's `LeaderLatch::getParticipants` says. Between a
    /// leader's end and the next one's grant, nobody leads.
    pub async fn participants(&self) -> Result<Participants> {
        let status = self.lock.status().await?;
        Ok(Participants {
            leader: status.holders.into_iter().next(),
            waiting: status.waiters,
        })
    }

    /// A watch on who leads, from the leader now: each
    /// [`changed`](LeaderWatch::changed) waits for the next leader, the
    /// next value proclaimed, or the end of a leadership with nobody
    /// after it, as Curator's `LeaderLatchListener` and `etcdctl elect
    /// --listen` report. A new leader's proclamation and a resignation
    /// wake observers through the engine; a leader that died is seen
    /// within two seconds of its lease's end.
    pub async fn observe(&self) -> Result<LeaderWatch> {
        Ok(LeaderWatch {
            last: self.leader().await?,
            election: self.clone(),
        })
    }

    /// Campaigns, then runs `work` while leading (Curator's
    /// `LeaderSelector`): its output, after resigning, once it finishes;
    /// or, should leadership be lost first, a [`Lost`](ErrorKind::Lost)
    /// error with `work` dropped, which cancels it at its next await. To
    /// take part again after leading (Curator's `autoRequeue`), call it
    /// in a loop.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let client = fenced::Client::connect("memory://run-as-leader-doc").await?;
    /// let election = client.election("compactor")?;
    /// let compacted = election
    ///     .run_as_leader("10.0.0.7", async { /* the leader's work */ 42 })
    ///     .await?;
    /// assert_eq!(compacted, 42);
    /// # Ok::<_, fenced::Error>(()) }).unwrap();
    /// ```
    pub async fn run_as_leader<T>(
        &self,
        value: impl AsRef<[u8]>,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T> {
        let leadership = self.campaign(value).await?;
        let lost = leadership.guard().lost();
        tokio::select! {
            out = work => {
                // The work is done whatever the resignation says; one that
                // failed leaves the lease to end the leadership.
                if let Err(e) = leadership.resign().await {
                    tracing::warn!(election = %self.name(), error = %e, "resigning after the work failed; the lease will end the leadership");
                }
                Ok(out)
            }
            reason = lost => Err(crate::error::Error::new(
                ErrorKind::Lost,
                format!("leadership of {:?} lost while leading: {reason}", self.name()),
            )),
        }
    }

    /// Arms the engine's notifications of a new leader or value, then
    /// reads who leads.
    async fn leader_armed(&self, wake: &str) -> Result<Option<Leader>> {
        let inner = &self.lock.as_lock().client.inner;
        if inner.backend.election().is_some() {
            let name = &self.lock.as_lock().name;
            inner
                .read("watch_leader", |b| match b.election() {
                    Some(e) => e.watch_leader(name, wake),
                    None => Box::pin(async { Ok(()) }),
                })
                .await?;
        }
        self.leader().await
    }
}

/// Who takes part in an [`Election`] (see [`Election::participants`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Participants {
    /// The leader's hold, if one leads.
    pub leader: Option<crate::HolderInfo>,
    /// How many candidates wait to lead.
    pub waiting: usize,
}

/// The leaders of an [`Election`] as they change (see
/// [`Election::observe`]).
#[derive(Debug)]
pub struct LeaderWatch {
    election: Election,
    last: Option<Leader>,
}

impl LeaderWatch {
    /// The leader last seen, if one led.
    pub fn leader(&self) -> Option<&Leader> {
        self.last.as_ref()
    }

    /// Waits until the leader, or its value, is not the one last seen;
    /// the leader then (`None`: nobody leads). Cancel safe. Waits for
    /// ever where nothing changes: bound it with `tokio::time::timeout`
    /// where that matters.
    pub async fn changed(&mut self) -> Result<Option<Leader>> {
        let election = &self.election;
        let last = &self.last;
        let register = election.value.lock_name();
        let wake = crate::spi::wake::register_key(register.as_str());
        let wake = &wake;
        let now = election
            .lock
            .as_lock()
            .client
            .inner
            .wait_on(register, None, || async move {
                let now = election.leader_armed(wake).await?;
                Ok((now != *last).then_some(now))
            })
            .await?;
        let Some(now) = now else {
            return Err(crate::error::Error::protocol(
                "a wait without a deadline ended without a leader",
            ));
        };
        self.last = now.clone();
        Ok(now)
    }
}

/// Leadership won in an [`Election`]: a [`Guard`] that also proclaims.
/// Dropping it resigns (in the background); watch [`Guard::lost`] to stop
/// leading work the moment leadership is lost.
#[derive(Debug)]
#[must_use = "dropping leadership resigns at once"]
pub struct Leadership {
    guard: Guard,
    value: FencedRegister,
}

impl Leadership {
    /// Publishes a new value for observers, under this leadership's token
    /// (refused with `StaleToken` if a newer leader has proclaimed).
    pub async fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<()> {
        let g = &self.guard;
        let c = g.client();
        let native = match c.backend.election() {
            Some(e) => Some(
                c.write(
                    "proclaim",
                    e.proclaim(g.hold_ref(), g.fencing_token(), value.as_ref()),
                )
                .await?,
            ),
            None => None,
        };
        let done = match native {
            None => self.value.write(g, value).await,
            Some(true) => Ok(()),
            Some(false) => Err(crate::error::Error::new(
                crate::error::ErrorKind::Lost,
                format!(
                    "cannot proclaim on {:?}: this leadership (token {}) has ended",
                    self.value.name(),
                    g.fencing_token()
                ),
            )),
        };
        // A newer leader's token has written, or the election no longer
        // names us: another was granted after this hold, so it is over,
        // whatever the lease or session still says (an advisory lock's
        // session can be killed between two checks).
        // (Only an exclusive hold: a semaphore's other holders have tokens
        // of their own, higher or not.)
        if let Err(e) = &done
            && matches!(e.kind(), ErrorKind::StaleToken | ErrorKind::Lost)
            && g.mode() == crate::Mode::Exclusive
        {
            g.lose(crate::LostReason::Taken);
        }
        done
    }

    /// The guard of the leadership: token, `is_held`, `lost`.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Whether this process still leads, as far as it knows (Curator's
    /// `LeaderLatch::hasLeadership`): its lease and session hold.
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Steps down; `true` if it still led. Observers are told.
    pub async fn resign(self) -> Result<bool> {
        let token = self.guard.fencing_token();
        let native = self.guard.client().backend.election().is_some();
        let led = self.guard.release().await?;
        if !native {
            // Where the value is a register, a write wakes observers: the
            // value again under this leadership's token (refused, and so
            // harmless, once a newer leader has written).
            if let Ok(Some((value, fence))) = self.value.read().await
                && fence == token
            {
                let _ = self.value.write_with_token(token, value).await;
            }
        }
        Ok(led)
    }
}
