//! The client's one session: dialled, watched, confirmed by `sync` through the leader, and replaced when it expires.

use super::*;

/// Opens a new session when the current one ends, and wakes every waiter;
/// keeps each session's bound while it lives (see [`heartbeat`]).
pub(super) async fn monitor(inner: Arc<ZkShared>) {
    loop {
        let (z, number) = unpoisoned(&inner.zk).clone();
        let mut states = z.state_watcher();
        let ended = async {
            loop {
                let s = states.changed().await;
                if s.is_terminated() {
                    break;
                }
                inner.wakeups.wake_all();
            }
        };
        // The heartbeat runs inside this task (never spawned apart), so
        // it stops with the session, and with the monitor when the
        // backend closes: a beat left running would keep the session,
        // and its connection, open for good.
        tokio::select! {
            () = ended => {}
            () = heartbeat(&inner, &z, number) => {}
        }
        drop(z);
        inner.clock.end(number);
        tracing::warn!(
            session = number,
            "ZooKeeper session ended; its holds are lost, opening a new one"
        );
        inner.wakeups.wake_all();
        let mut pause = Duration::from_millis(100);
        let (fresh, dialed) = loop {
            let dialed = Instant::now();
            match ZkShared::dial(
                &inner.connect,
                inner.session_timeout,
                &inner.digest,
                &inner.label,
            )
            .await
            {
                Ok(c) => break (c, dialed),
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        };
        let n = inner.sessions.fetch_add(1, Ordering::AcqRel) + 1;
        let until = believed_until(dialed, fresh.session_timeout());
        inner.clock.start(n, until);
        *unpoisoned(&inner.zk) = (fresh, n);
        inner.wakeups.wake_all();
    }
}

/// Sends a `sync` every quarter of the negotiated session timeout, and
/// moves the session's bound to the send time of each answered one plus
/// three quarters of that timeout. The leader expires a session it has not
/// heard of for the timeout; a `sync` is answered only through the leader,
/// so a server cut off from it (which still answers reads until it gives
/// up on the leader) confirms nothing. The server we talk to touched the
/// session when our request came in, but tells the leader only at its next
/// ping, up to half a tick later; the server holds the timeout to at least
/// two ticks, so a quarter of it covers that lag. (The client's own pings
/// would not do: they stop at the server we talk to, and the client does
/// not say when it last heard one.)
///
/// A sync goes out every period whether or not the last one has come
/// back: the server answers a session's requests in order, so a sync
/// queued behind a burst of this client's own requests must not hold up
/// the next one's confirmation (and every hold of the session with it).
pub(super) async fn heartbeat(inner: &ZkShared, z: &zk::Client, number: u64) {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let timeout = z.session_timeout();
    let period = (timeout / 4).max(Duration::from_millis(50));
    let mut beats = FuturesUnordered::new();
    let mut next = Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {
                let sent = Instant::now();
                next = sent + period;
                beats.push(async move {
                    let answered = tokio::time::timeout(timeout, z.sync("/")).await;
                    (sent, matches!(answered, Ok(Ok(()))))
                });
            }
            Some((sent, answered)) = beats.next() => {
                if answered {
                    inner.clock.confirm(number, believed_until(sent, timeout - timeout / 4));
                }
            }
        }
    }
}

impl ZkShared {
    pub(super) async fn dial(
        connect: &str,
        session_timeout: Duration,
        digest: &Option<String>,
        label: &str,
    ) -> Result<zk::Client> {
        let mut c = zk::Client::connector()
            .with_session_timeout(session_timeout)
            .with_connection_timeout(session_timeout.min(Duration::from_secs(5)));
        if let Some(d) = digest {
            c = c.with_auth("digest", d.as_bytes());
        }
        let attempt = tokio::time::timeout(session_timeout, c.connect(connect)).await;
        match attempt {
            Ok(r) => r.map_err(|e| map_err(label, e)),
            Err(_) => Err(Error::unavailable(format!(
                "ZooKeeper at {label} is unreachable: no session within {session_timeout:?}"
            ))),
        }
    }

    pub(super) fn err(&self, e: zk::Error) -> Error {
        map_err(&self.label, e)
    }

    pub(super) fn client(&self) -> zk::Client {
        unpoisoned(&self.zk).0.clone()
    }

    pub(super) fn session(&self) -> u64 {
        unpoisoned(&self.zk).1
    }

    pub(super) fn acls(&self) -> zk::Acls<'static> {
        if self.digest.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    pub(super) fn path_of(name: &LockName) -> Result<String> {
        let n = name.as_str();
        if n.contains('/') || n.contains('\0') {
            return Err(Error::invalid(format!(
                "lock name {n:?} has a '/' or NUL: on ZooKeeper a lock is one node under \
                 the URL's path"
            )));
        }
        if n == "fenced.meta" || n == "zookeeper" {
            return Err(Error::invalid(format!(
                "lock name {n:?} is reserved on ZooKeeper"
            )));
        }
        Ok(format!("/{n}"))
    }

    pub(super) fn own_node(&self, req: &Attempt) -> Arc<OwnNode> {
        let session = self.session();
        let mut nodes = unpoisoned(&self.nodes);
        if let Some(n) = nodes.get(&req.hold_id)
            && n.session == session
        {
            return n.clone();
        }
        let own = Arc::new(OwnNode {
            name: req.name.clone(),
            owner: req.owner_key.clone(),
            protect: format!("_c_{}-", uuid::Uuid::new_v4()),
            exclusive: req.mode == Mode::Exclusive,
            semaphore: matches!(req.mode, Mode::Permits { .. }) && req.kind != Kind::Member,
            member: req.kind == Kind::Member,
            child: Mutex::new(None),
            gate: Mutex::new(None),
            gate_sent: AtomicBool::new(false),
            extra: Mutex::new(Vec::new()),
            czxid: Mutex::new(0),
            session,
            deadline: Mutex::new(None),
            watcher: Mutex::new(None),
            create_sent: AtomicBool::new(false),
            create_lost: AtomicBool::new(false),
            later_sibling: AtomicBool::new(false),
            born: Instant::now(),
        });
        nodes.insert(req.hold_id.clone(), own.clone());
        own
    }
}
