//! The contract under faults the engine itself produces, through the
//! fixture's hooks (a partition, a cut, a killed session, a restart, a
//! lost reply) and under cancellation at random await points. Every test
//! runs at the defaults a user gets: default lease, default session.

use crate::{Fixture, Isolated, Timing, unique};
use fenced::{DEFAULT_LEASE, ErrorKind, LostReason, Owner};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{Instant, timeout};

/// A client of its own behind the kit's proxy (`replies`: one whose
/// replies can be held back), an observer client beside it, and a fresh
/// lock name starting `what`.
async fn cut_off(fx: &Fixture, replies: bool, what: &str) -> (Isolated, fenced::Client, String) {
    let iso = if replies {
        fx.isolated_for_replies().await
    } else {
        fx.isolated().await
    };
    let iso = iso.expect("this backend has network faults");
    (iso, fx.client().await, unique(what))
}

/// Runs `op` with the replies from the server held back until `applied`
/// shows the server acted on it, then resets the connection (the reply
/// is lost) and lets replies through again: what `op` ended with.
async fn with_reply_lost<T, Op, F, Fut>(
    t: &Timing,
    iso: &Isolated,
    what: &str,
    op: Op,
    applied: F,
) -> T
where
    T: Send + 'static,
    Op: std::future::Future<Output = T> + Send + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    iso.hold_replies(true);
    let op = tokio::spawn(op);
    t.wait_until(&format!("{what} never reached the server"), applied)
        .await;
    iso.cut();
    iso.hold_replies(false);
    timeout(t.eventually(), op)
        .await
        .unwrap_or_else(|_| panic!("{what} never ended"))
        .unwrap()
}

/// A random duration below `max`, for cancellation at random points.
fn random_below(max: Duration) -> Duration {
    let r = uuid::Uuid::new_v4().as_u128();
    Duration::from_nanos((r % max.as_nanos().max(1)) as u64)
}

/// A holder cut off by a partition (bytes held back, sockets left open),
/// at the default lease and the backend's default session: its lost
/// signal fires before any other client is granted the lock. The rival
/// tries every 20 ms; a try sent before the grant happened, so the signal
/// must have fired by the send of the try that wins. Once it has fired
/// the partition heals, so that backends that never give a cut-off
/// session's lock away (advisory locks) let it go too.
pub async fn partitioned_holder_is_told_first(fx: &Fixture) {
    let t = Timing::default();
    let (iso, observer, name) = cut_off(fx, false, "part").await;
    let g = iso.client.mutex(&name).unwrap().acquire().await.unwrap();
    let token = g.fencing_token();
    let told: Arc<Mutex<Option<(Instant, LostReason)>>> = Arc::default();
    let lost = g.lost();
    let record = told.clone();
    tokio::spawn(async move {
        let reason = lost.await;
        *record.lock().unwrap() = Some((Instant::now(), reason));
    });
    iso.partition(true);
    let limit = Instant::now() + DEFAULT_LEASE + fx.session_timeout() + t.eventually() * 3;
    let rival = observer.mutex(&name).unwrap();
    let mut healed = false;
    let (sent, won) = loop {
        assert!(
            Instant::now() < limit,
            "{name}: nobody got the lock back after the partition (told: {:?})",
            *told.lock().unwrap()
        );
        if !healed && told.lock().unwrap().is_some() {
            iso.partition(false);
            healed = true;
        }
        let sent = Instant::now();
        match rival.try_acquire().await {
            Ok(Some(won)) => break (sent, won),
            Ok(None) => {}
            Err(e) if e.kind() == ErrorKind::Unavailable => {}
            Err(e) => panic!("{name}: the rival's try failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let Some((at, reason)) = *told.lock().unwrap() else {
        panic!("{name}: another client was granted the lock and the cut-off holder was never told");
    };
    assert!(
        at <= sent,
        "{name}: another client was granted the lock {:?} before the cut-off holder was told \
         ({reason})",
        at - sent
    );
    assert!(!g.is_held());
    assert!(won.fencing_token() > token);
    assert!(won.release().await.unwrap());
    iso.partition(false);
    drop(g);
}

/// The holder's session ended by the engine (its etcd lease revoked, its
/// database session terminated): the lost signal fires, at the default
/// lease, and another client gets the lock.
pub async fn killed_session_is_reported(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("killsess");
    let (a, b) = fx.two_clients().await;
    let g = a.mutex(&name).unwrap().acquire().await.unwrap();
    fx.kill_session(&name)
        .expect("this backend's holds live on a session");
    let reason = timeout(DEFAULT_LEASE / 3 + t.eventually(), g.lost())
        .await
        .expect("the lost signal must fire when the session is killed");
    assert!(
        matches!(reason, LostReason::Taken | LostReason::SessionExpired),
        "{reason:?}"
    );
    assert!(!g.is_held());
    super::another_takes_it(&t, &b, &name, g, "the killed session's lock is free").await;
}

/// Every connection of a holder reset: the hold survives (the client
/// reconnects and renews it; sessions outlive a reconnect) or its lost
/// signal fires (a database session holding an advisory lock ends with
/// its connection); never both held by this client and given to another.
pub async fn cut_connections_keep_or_lose_cleanly(fx: &Fixture) {
    let t = Timing::default();
    let (iso, observer, name) = cut_off(fx, false, "cut").await;
    let lease = t.ms(1500);
    let g = iso
        .client
        .mutex(&name)
        .unwrap()
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    iso.cut();
    // Past two renewals after the cut.
    tokio::time::sleep(lease).await;
    if g.is_held() {
        let st = observer.status(&name).await.unwrap();
        assert!(
            st.holders.iter().any(|h| h.token == g.fencing_token()) || st.holders.len() == 1,
            "{name}: the holder believes it holds, the backend says {st:?}"
        );
        assert!(
            observer
                .mutex(&name)
                .unwrap()
                .try_acquire()
                .await
                .unwrap()
                .is_none(),
            "{name}: granted to another while the cut holder believes it holds"
        );
        assert!(g.release().await.unwrap());
    } else {
        timeout(t.eventually(), g.lost())
            .await
            .expect("a hold no longer believed has its lost signal fired");
        drop(g);
    }
    let won = observer
        .mutex(&name)
        .unwrap()
        .acquire_timeout(t.eventually())
        .await
        .unwrap();
    assert!(
        won.is_some(),
        "{name}: the lock stayed blocked after the cut"
    );
}

/// Tokens keep rising across a restart of the server (SIGKILL, then a
/// start on the same data; a Redis without persistence forgets its
/// counter, and the clock floor takes over).
pub async fn tokens_rise_across_a_restart(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("restart");
    let c = fx.client().await;
    let g = c.mutex(&name).unwrap().acquire().await.unwrap();
    let before = g.fencing_token();
    assert!(g.release().await.unwrap());
    c.close().await;
    fx.restart()
        .expect("this fixture has one server to restart");
    let c = fx.client().await;
    let lock = c.mutex(&name).unwrap();
    let g = t
        .until_available("acquire after the restart", || lock.acquire())
        .await;
    assert!(
        g.fencing_token() > before,
        "token {} after a restart, {before} before",
        g.fencing_token()
    );
    assert!(g.release().await.unwrap());
}

/// Takes and releases lock `name` through `c`, so that what a backend
/// keeps for the next request (a pooled connection, an idle database
/// session, a loaded script, the lock's ZooKeeper container) is there
/// before a test holds replies back: the request must reach the server
/// then, not wait for an answer that makes it.
async fn warm_up(c: &fenced::Client, name: &str) {
    let g = c.mutex(name).unwrap().acquire().await.unwrap();
    assert!(g.release().await.unwrap());
    // sqlx pings each pooled connection as it goes back to the pool, in
    // the background: let that answer come before replies are held, or
    // the next request waits for a connection the ping still has.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// Acquisitions dropped at random points (a `timeout` of a few random
/// milliseconds around each), on a held lock (they wait in the queue)
/// and on a free one (they may win a grant nobody takes): once the
/// background withdrawals are done, nothing is held or queued, and the
/// lock is had again.
pub async fn cancelled_acquires_leave_nothing(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("storm");
    let (a, b) = fx.two_clients().await;
    for held in [true, false] {
        let holder = if held {
            Some(a.mutex(&name).unwrap().acquire().await.unwrap())
        } else {
            None
        };
        for _ in 0..60 {
            let lock = b.mutex(&name).unwrap();
            let _ = timeout(random_below(Duration::from_millis(4)), lock.acquire()).await;
        }
        if let Some(h) = holder {
            assert!(h.release().await.unwrap());
        }
        t.wait_until(
            &format!("{name}: a cancelled acquisition left a hold or a queue place"),
            || async {
                let st = b.status(&name).await.unwrap();
                st.is_free() && st.waiters == 0
            },
        )
        .await;
        // A dropped try still out when the status was read may land after
        // it (RedLock: a round on several masters): its withdrawal waits
        // for it, so the lock is free again within a bounded time, not at
        // once.
        let g = a
            .mutex(&name)
            .unwrap()
            .fair(false)
            .acquire_timeout(t.eventually())
            .await
            .unwrap()
            .expect("nothing in the way");
        assert!(g.release().await.unwrap());
    }
}

/// A cancellation storm from many tasks sharing one client, with default
/// settings: each drops acquisitions in a tight loop, 0–2 ms in, far
/// faster than the server can answer or withdraw them, while the lock is
/// held and after it is released (so some drops land as grants). Afterwards
/// nothing is left held or queued, and another client takes the lock,
/// within the usual bound: a grant leaked with the default 30 s lease would
/// outlast it. (Before the client bounded its calls in flight, every
/// dropped try went on in the background and every one was withdrawn, so
/// the backlog kept an SQLite file busy long after the storm.)
pub async fn cancellation_storm_leaves_the_lock_usable(fx: &Fixture) {
    const TASKS: usize = 16;
    const DROPS: usize = 250;
    let t = Timing::default();
    let name = unique("storm-many");
    let (a, b) = fx.two_clients().await;
    let holder = a.mutex(&name).unwrap().acquire().await.unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(holder.release().await.unwrap());
    });
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let lock = b.mutex(&name).unwrap();
        tasks.push(tokio::spawn(async move {
            for k in 0..DROPS {
                let cut = random_below(Duration::from_millis(2));
                if (i + k) % 3 == 0 {
                    let _ = timeout(cut, lock.try_acquire()).await;
                } else {
                    let _ = timeout(cut, lock.acquire()).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    release.await.unwrap();
    t.wait_until(
        &format!("{name}: the storm left a hold or a queue place"),
        || async {
            let st = a.status(&name).await.unwrap();
            st.is_free() && st.waiters == 0
        },
    )
    .await;
    let g = a
        .mutex(&name)
        .unwrap()
        .acquire_timeout(t.eventually())
        .await
        .unwrap()
        .expect("the lock is usable after the storm");
    assert!(g.release().await.unwrap());
}

/// Read acquisitions of an owner that holds write (a downgrade on its
/// way), dropped at random points: after the write is released, nothing
/// of the owner is left held, and another client takes write.
pub async fn cancelled_reads_beside_own_write_leave_nothing(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("storm-rw");
    let (a, b) = fx.two_clients().await;
    let me = Owner::new();
    let rw = a.rwlock(&name).unwrap();
    let w = rw.write().owner(&me).acquire().await.unwrap();
    for _ in 0..40 {
        let read = rw.read().owner(&me);
        let _ = timeout(random_below(Duration::from_millis(4)), read.acquire()).await;
    }
    assert!(w.release().await.unwrap());
    t.wait_until(
        &format!("{name}: a cancelled read left a hold behind"),
        || async { b.status(&name).await.unwrap().is_free() },
    )
    .await;
    let g = b
        .rwlock(&name)
        .unwrap()
        .write()
        .acquire_timeout(t.eventually())
        .await
        .unwrap()
        .expect("free for another writer");
    assert!(g.release().await.unwrap());
}

/// A grant whose answer is lost (the request reached the server, the
/// connection was reset before the reply came back) is tried again, and
/// the try finds the grant already made: one hold, not a second one, and
/// not an error. For an acquisition of its own and for a named owner's
/// (whose holds the server lets nest, so the retry must not add one).
pub async fn a_lost_reply_is_not_a_second_grant(fx: &Fixture) {
    lost_reply_once(fx, None).await;
    lost_reply_once(fx, Some(Owner::new())).await;
}

async fn lost_reply_once(fx: &Fixture, owner: Option<Owner>) {
    let t = Timing::default();
    let (iso, observer, name) = cut_off(fx, true, "lostreply").await;
    let mut lock = iso.client.mutex(&name).unwrap();
    if let Some(o) = &owner {
        lock = lock.owner(o);
    }
    warm_up(&iso.client, &name).await;
    let g = with_reply_lost(
        &t,
        &iso,
        &format!("{name}: the acquire"),
        async move { lock.acquire().await },
        || async { !observer.status(&name).await.unwrap().is_free() },
    )
    .await
    .expect("a lost reply is tried again, not an error");
    let st = observer.status(&name).await.unwrap();
    assert_eq!(st.holders.len(), 1, "{name}: {st:?}");
    assert!(g.is_held());
    assert!(g.release().await.unwrap());
    t.wait_until(
        &format!("{name}: a grant of the lost reply stayed"),
        || async { observer.status(&name).await.unwrap().is_free() },
    )
    .await;
}

/// Pushes whose connections are reset at random points, one reset per
/// push (a request lost, or its reply: the id taken, the item written,
/// or neither), while a taker of another client takes and acknowledges:
/// each push is tried again, not an error, and each item is delivered
/// once. An id whose reply was lost is a hole the taker gives up; a
/// write whose reply was lost is found where it landed, or its id given
/// up before anything else is written there.
pub async fn pushes_through_cut_connections_deliver_once(fx: &Fixture) {
    const PUSHES: usize = 20;
    let t = Timing::default();
    let hang = t.eventually() * 6;
    let (iso, observer, name) = cut_off(fx, false, "cutpush").await;
    let q = iso.client.queue(&name).unwrap();
    let taken = Arc::new(Mutex::new(Vec::new()));
    let taker = tokio::spawn({
        let (q, taken, name) = (observer.queue(&name).unwrap(), taken.clone(), name.clone());
        async move {
            let until = Instant::now() + hang;
            while taken.lock().unwrap().len() < PUSHES {
                assert!(Instant::now() < until, "{name}: items never came");
                let Some(item) = q.take_timeout(t.ms(200)).await.unwrap() else {
                    continue;
                };
                assert_eq!(
                    item.deliveries(),
                    1,
                    "{name}: nothing failed on the taker's side"
                );
                taken.lock().unwrap().push(item.payload().to_vec());
                item.ack().await.unwrap();
            }
        }
    });
    let mut ids = Vec::new();
    for i in 0..PUSHES {
        // The reset lands while the push is on its way, or just after it
        // (the next push then meets the broken connection).
        let cut = async {
            tokio::time::sleep(random_below(t.ms(3))).await;
            iso.cut();
        };
        let (id, ()) = tokio::join!(q.push(format!("cut-{i:02}")), cut);
        ids.push(id.unwrap_or_else(|e| panic!("{name}: push {i} through a reset: {e}")));
    }
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "{name}: the ids fell: {ids:?}"
    );
    taker.await.unwrap();
    let mut got = std::mem::take(&mut *taken.lock().unwrap());
    got.sort();
    let want: Vec<Vec<u8>> = (0..PUSHES)
        .map(|i| format!("cut-{i:02}").into_bytes())
        .collect();
    assert_eq!(got, want, "{name}: every item once");
    assert!(
        observer
            .queue(&name)
            .unwrap()
            .try_take()
            .await
            .unwrap()
            .is_none(),
        "{name}: an item came twice"
    );
}

/// A release whose reply is lost (the connection cut after the server
/// applied it) is tried again, finds nothing to release, and still
/// reports the release, not a loss: the hold was ours until then.
pub async fn a_lost_release_reply_is_not_a_loss(fx: &Fixture) {
    let t = Timing::default();
    let (iso, observer, name) = cut_off(fx, true, "lostrelease").await;
    warm_up(&iso.client, &name).await;
    let g = iso.client.mutex(&name).unwrap().acquire().await.unwrap();
    // As in warm_up: the pool's check of the connection answers first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let was_ours = with_reply_lost(
        &t,
        &iso,
        &format!("{name}: the release"),
        async move { g.release().await },
        || async { observer.status(&name).await.unwrap().is_free() },
    )
    .await
    .expect("a lost reply is tried again, not an error");
    assert!(
        was_ours,
        "{name}: a release whose reply was lost reported a loss"
    );
}

/// A try whose answer comes back only after the request timeout is waited
/// on, not raced by a second try for the same hold: both answers would set
/// the hold up, the second undoing the first's lease keeping, and the
/// hold the caller got would be deleted under it.
pub async fn a_slow_reply_is_not_a_second_grant(fx: &Fixture) {
    let t = Timing::default();
    let (iso, observer, name) = cut_off(fx, true, "slowreply").await;
    let lock = iso.client.mutex(&name).unwrap();
    warm_up(&iso.client, &name).await;
    iso.hold_replies(true);
    let attempt = tokio::spawn(async move { lock.acquire().await });
    t.wait_until(
        &format!("{name}: the request never reached the server"),
        || async { !observer.status(&name).await.unwrap().is_free() },
    )
    .await;
    // Past the request timeout, and past the pause before a second try.
    tokio::time::sleep(iso.client.request_timeout() + t.ms(400)).await;
    iso.hold_replies(false);
    let g = timeout(t.eventually(), attempt)
        .await
        .expect("the acquire ends")
        .unwrap()
        .expect("a slow reply is waited on, not an error");
    // Give a second answer's set-up time to undo the first.
    tokio::time::sleep(t.ms(500)).await;
    assert!(g.is_held(), "{name}: the hold was lost");
    let st = observer.status(&name).await.unwrap();
    let tokens: Vec<u64> = st.holders.iter().map(|h| h.token).collect();
    assert_eq!(tokens, [g.fencing_token()], "{name}: {st:?}");
    assert!(g.release().await.unwrap());
}

/// A grant whose answer comes back after the lease it granted has run
/// out is never handed to the caller as a guard: the caller gets a guard
/// it still holds, or an error.
pub async fn a_grant_past_its_lease_is_not_returned(fx: &Fixture) {
    let t = Timing::default();
    let (iso, observer, name) = cut_off(fx, true, "late").await;
    let lease = t.ms(800);
    let lock = iso.client.mutex(&name).unwrap().fixed_lease(lease);
    warm_up(&iso.client, &name).await;
    iso.hold_replies(true);
    let attempt = tokio::spawn(async move { lock.acquire().await });
    t.wait_until(
        &format!("{name}: the request never reached the server"),
        || async { !observer.status(&name).await.unwrap().is_free() },
    )
    .await;
    tokio::time::sleep(lease + t.ms(200)).await;
    iso.hold_replies(false);
    match timeout(t.eventually(), attempt)
        .await
        .expect("the acquire ends")
        .unwrap()
    {
        Ok(g) => {
            assert!(
                g.lease_left() > Duration::ZERO,
                "{name}: acquire returned a guard whose lease had run out"
            );
            drop(g);
        }
        Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
    }
}

/// A `fenced run` holder cut off by a partition, at the default lease and
/// session, has its command killed (and exits 76) before another client's
/// `fenced run` starts its command. The cut-off command writes the time
/// every 10 ms; the next one writes the time it starts: the last stamp of
/// the first must come before the stamp of the second.
pub async fn cut_off_run_is_killed_before_the_next_runs(fx: &Fixture) {
    let t = Timing::default();
    let bin = fx
        .fenced_bin
        .clone()
        .expect("processes tests need the fenced binary");
    let iso = fx
        .isolated()
        .await
        .expect("this backend has network faults");
    let dir = tempfile::tempdir().unwrap();
    let (first_log, second_log) = (dir.path().join("first"), dir.path().join("second"));
    let name = unique("runcut");
    let stamper = format!(
        "while true; do date +%s%N >> '{}'; sleep 0.01; done",
        first_log.display()
    );
    let mut first = crate::process::spawn_run(&bin, &iso.url, &name, &[], &["sh", "-c", &stamper]);
    t.wait_until("the cut-off holder's command never ran", || async {
        std::fs::read_to_string(&first_log).is_ok_and(|s| !s.is_empty())
    })
    .await;
    iso.partition(true);
    let starter = format!("date +%s%N > '{}'", second_log.display());
    let mut second = crate::process::spawn_run(&bin, &fx.url, &name, &[], &["sh", "-c", &starter]);
    let limit = Duration::from_secs(30) + fx.session_timeout() + t.eventually() * 2;
    let exited = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + limit;
        let mut codes = (None, None);
        while std::time::Instant::now() < deadline && (codes.0.is_none() || codes.1.is_none()) {
            if codes.0.is_none() {
                codes.0 = first.try_wait().unwrap().map(|s| s.code());
            }
            if codes.1.is_none() {
                codes.1 = second.try_wait().unwrap().map(|s| s.code());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for c in [&mut first, &mut second] {
            crate::process::kill_group(c);
        }
        codes
    })
    .await
    .unwrap();
    iso.partition(false);
    assert_eq!(
        exited.0,
        Some(Some(76)),
        "the cut-off `fenced run` must kill its command and exit 76"
    );
    assert_eq!(
        exited.1,
        Some(Some(0)),
        "the second `fenced run` must get the lock and run"
    );
    let last_first: u128 = std::fs::read_to_string(&first_log)
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .expect("stamps of the first command");
    let second_start: u128 = std::fs::read_to_string(&second_log)
        .unwrap()
        .trim()
        .parse()
        .expect("the second command's stamp");
    assert!(
        last_first < second_start,
        "{name}: the cut-off command still ran {} ms after the next one started",
        (last_first - second_start) / 1_000_000
    );
}

/// A client whose server stops answering (a partition: bytes held back,
/// sockets left open) still gets an answer from every call within about
/// a request timeout (5 s by default) past the call's own deadline: an
/// error, not a hang. `try_acquire`, `acquire_timeout`, `status`, a
/// register read, a release (the background takes it over) and `close`.
pub async fn calls_return_when_the_server_stops_answering(fx: &Fixture) {
    let t = Timing::default();
    let iso = fx
        .isolated()
        .await
        .expect("this backend has network faults");
    let c = &iso.client;
    let name = unique("mute");
    let held = c
        .mutex(&unique("mute-held"))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let mut dropped = Vec::new();
    for _ in 0..3 {
        dropped.push(
            c.mutex(&unique("mute-drop"))
                .unwrap()
                .acquire()
                .await
                .unwrap(),
        );
    }
    let reg = c.register(&unique("mute-reg")).unwrap();
    iso.partition(true);
    // Generous: a request timeout, its retries' slack, and a scale for a
    // loaded machine. What fails here is a call that never returns.
    let bound = t.eventually() + Duration::from_secs(5);
    let lock = c.mutex(&name).unwrap();
    // All at once, as a service's tasks would call them.
    let (tried, waited, status, read, released) = tokio::join!(
        timeout(bound, lock.try_acquire()),
        timeout(bound, lock.acquire_timeout(t.ms(100))),
        timeout(bound, c.status(&name)),
        timeout(bound, reg.read()),
        timeout(bound, held.release()),
    );
    tried
        .expect("try_acquire returns while the server is silent")
        .expect_err("nothing is granted while the server is silent");
    waited
        .expect("acquire_timeout returns while the server is silent")
        .expect_err("nothing is granted while the server is silent");
    status
        .expect("status returns while the server is silent")
        .expect_err("no status while the server is silent");
    read.expect("a register read returns while the server is silent")
        .expect_err("no value while the server is silent");
    let _ = released.expect("release returns while the server is silent");
    drop(dropped);
    timeout(bound, c.close())
        .await
        .expect("close returns while the server is silent");
    iso.partition(false);
}

/// The leader of the ensemble or cluster is killed while a client holds a
/// lock at the default lease and session: through the election and for
/// two session timeouts after it nobody else gets the lock, the hold is
/// still believed, and a waiter gets it, with a higher token, once it is
/// released.
pub async fn leader_killed_while_held(fx: &Fixture) {
    let t = Timing::default();
    let (_a, b, name, g) = crate::one_holds(&fx.url, "leader").await;
    fx.kill_leader().expect("this backend has a leader to kill");
    let lock = b.mutex(&name).unwrap();
    for _ in 0..2 * fx.session_timeout().as_secs() {
        tokio::time::sleep(t.ms(1000)).await;
        let other = t
            .until_available("a new leader is elected", || lock.try_acquire())
            .await;
        assert!(other.is_none(), "two holders after the leader died");
    }
    assert!(g.is_held(), "the hold survives the election");
    let waiter = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(20)).await });
    tokio::time::sleep(t.ms(200)).await;
    let token = g.fencing_token();
    assert!(g.release().await.unwrap());
    let next = waiter.await.unwrap().unwrap().expect("the waiter gets it");
    assert!(next.fencing_token() > token);
    assert!(next.release().await.unwrap());
}

/// A `fenced run` paused (SIGSTOP) past its session timeout, at the
/// defaults: the server ends its session, another client gets the lock
/// with a higher token, the stale token is refused by the fenced register,
/// and when the paused process resumes it sees the loss and kills its
/// command (exit 76).
pub async fn paused_run_loses_its_session(fx: &Fixture) {
    use nix::sys::signal::{Signal, kill};
    let t = Timing::default();
    let bin = fx
        .fenced_bin
        .clone()
        .expect("processes tests need the fenced binary");
    let name = unique("paused");
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    // The command starts once the child knows it holds the lock. A key on
    // the server is not enough: a child paused before the grant reached
    // it, whose session then ended, rightly asks again when it resumes,
    // and would wait behind this test's hold.
    let cmd = format!("touch '{}'; exec sleep 60", started.display());
    let mut child = crate::process::spawn_run(&bin, &fx.url, &name, &[], &["sh", "-c", &cmd]);
    let b = fx.client().await;
    t.wait_until("the child's command never started", || async {
        started.exists()
    })
    .await;
    let stale = b.status(&name).await.unwrap().holders[0].token;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let g = b
        .mutex(&name)
        .unwrap()
        .acquire_timeout(fx.session_timeout() + t.eventually())
        .await
        .unwrap()
        .expect("the paused holder's session ends");
    assert!(g.fencing_token() > stale);
    let reg = b.register(&format!("{name}:data")).unwrap();
    reg.write(&g, "new").await.unwrap();
    let e = reg.write_with_token(stale, "late").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StaleToken);
    kill(pid, Signal::SIGCONT).unwrap();
    let limit = t.eventually();
    let code = tokio::task::spawn_blocking(move || {
        crate::process::exit_within(&mut child, limit, "the resumed holder")
    })
    .await
    .unwrap();
    assert_eq!(code, Some(76), "the resumed holder must see the loss");
    assert!(g.is_held());
    assert!(g.release().await.unwrap());
}
