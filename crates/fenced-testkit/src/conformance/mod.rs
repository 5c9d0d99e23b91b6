//! The lock contract as tests, run against every backend by
//! [`conformance_suite!`](crate::conformance_suite). Each test takes a
//! [`Fixture`], uses names no other test uses, and bounds every wait with
//! [`Timing`]; none asserts on speed.

mod faults;
pub mod grant_cases;
pub use faults::*;

use crate::{Fixture, Timing, unique};

/// Every test of the suite, for the completeness check: each backend runs
/// or skips each one, with its reason: a feature a backend lacks shows as
/// its tests skipped, not as another test run in their place.
pub const TESTS: &[&str] = &[
    "mutual_exclusion_tasks",
    "owner_only_release",
    "reentrancy_counts",
    "tasks_of_one_client_exclude",
    "lease_expiry_frees_dead_holder",
    "watchdog_keeps_slow_holder",
    "fencing_tokens_increase",
    "fencing_tokens_increase_mutex",
    "lost_signal_when_taken",
    "lost_signal_when_lease_ends",
    "try_and_timeout",
    "waiter_is_woken_by_release",
    "dropped_guard_releases",
    "close_tells_live_guards",
    "cancelled_wait_leaves_nothing",
    "fair_mode_is_fifo",
    "fair_waiters_of_one_client_keep_their_places",
    "fair_mode_is_refused",
    "shared_modes_are_refused",
    "leader_election_hands_over",
    "semaphore_is_refused",
    "readers_share_writers_exclude",
    "semaphore_never_exceeds_permits",
    "versioned_values_lose_no_update",
    "fenced_register_rejects_stale_tokens",
    "multilock_is_all_or_nothing",
    "multilock_retakes_a_lock_lost_while_waiting",
    "striped_segments_are_independent",
    "bad_input_is_refused",
    "processes_exclude_each_other",
    "killed_holder_process_frees_lock",
    "partitioned_holder_is_told_first",
    "killed_session_is_reported",
    "cut_connections_keep_or_lose_cleanly",
    "tokens_rise_across_a_restart",
    "cancelled_acquires_leave_nothing",
    "cancellation_storm_leaves_the_lock_usable",
    "cancelled_reads_beside_own_write_leave_nothing",
    "a_lost_reply_is_not_a_second_grant",
    "a_slow_reply_is_not_a_second_grant",
    "a_lost_release_reply_is_not_a_loss",
    "pushes_through_cut_connections_deliver_once",
    "a_grant_past_its_lease_is_not_returned",
    "cut_off_run_is_killed_before_the_next_runs",
    "calls_return_when_the_server_stops_answering",
    "grant_cases_mutex",
    "grant_cases_rw",
    "grant_cases_permits",
    "leader_killed_while_held",
    "paused_run_loses_its_session",
    "a_thousand_waiters_of_one_client",
    "waiters_of_one_client_outlast_leaked_holds",
    "list_shows_what_is_held_or_waited_for",
    "holders_say_who_they_are",
    "counters_and_sequences_count_every_change",
    "watchers_are_woken_by_writes",
    "double_barriers_wait_for_every_member",
    "rate_limiters_admit_the_burst_then_the_rate",
    "elections_are_observed_and_lead_work",
    "queues_deliver_every_item_leased",
    "processes_share_counters_and_sequences",
    "processes_share_a_queue",
];

/// The backends (modules of a test binary made by
/// [`conformance_suite!`](crate::conformance_suite)) that neither run nor
/// skip some test, with the tests; `listing` is the binary's `--list`.
pub fn incomplete(listing: &str) -> Vec<(String, Vec<&'static str>)> {
    let mut backends: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
        Default::default();
    for line in listing.lines() {
        let Some(test) = line.strip_suffix(": test") else {
            continue;
        };
        if let Some((backend, name)) = test.split_once("::") {
            backends.entry(backend).or_default().insert(name);
        }
    }
    backends
        .into_iter()
        .filter_map(|(backend, listed)| {
            let missing: Vec<&str> = TESTS
                .iter()
                .copied()
                .filter(|t| !listed.contains(t))
                .collect();
            (!missing.is_empty()).then(|| (backend.to_owned(), missing))
        })
        .collect()
}

use fenced::{ErrorKind, LostReason, MultiLock, Owner};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::timeout;

/// Many tasks on several clients: never two inside, and a register
/// incremented inside the lock loses no update.
pub async fn mutual_exclusion_tasks(fx: &Fixture) {
    const CLIENTS: usize = 3;
    const TASKS: usize = 4;
    const ROUNDS: usize = 15;
    let name = unique("mx");
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = fx.client().await;
        for _ in 0..TASKS {
            let lock = client.mutex(&name).unwrap().owner(&Owner::new());
            let reg = client.register(&format!("{name}:counter")).unwrap();
            let inside = inside.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let g = lock.acquire().await.unwrap();
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    let v = reg.read_i64().await.unwrap().unwrap_or(0);
                    tokio::task::yield_now().await;
                    reg.write(&g, (v + 1).to_string()).await.unwrap();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(g.release().await.unwrap());
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let client = fx.client().await;
    let total = client
        .register(&format!("{name}:counter"))
        .unwrap()
        .read_i64()
        .await
        .unwrap();
    assert_eq!(total, Some((CLIENTS * TASKS * ROUNDS) as i64));
    assert!(client.status(&name).await.unwrap().is_free());
}

/// A thousand tasks of one client, with the default options, wait for
/// one lock at once (RELIABILITY.md's exhaustion case, as a web service
/// under a burst meets it): each gets it once, never two at a time, and
/// nothing is left held or queued. Bounded only to fail rather than hang.
pub async fn a_thousand_waiters_of_one_client(fx: &Fixture) {
    const WAITERS: usize = 1000;
    let t = Timing::default();
    let name = unique("thousand");
    let client = fx.client().await;
    let inside = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    // Held while the thousand line up, so that every one of them waits.
    let first = client.mutex(&name).unwrap().acquire().await.unwrap();
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let lock = client.mutex(&name).unwrap();
            let (inside, served) = (inside.clone(), served.clone());
            tokio::spawn(async move {
                let g = lock.acquire().await.unwrap();
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two of the waiters inside at once"
                );
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                served.fetch_add(1, Ordering::SeqCst);
                assert!(g.release().await.unwrap());
            })
        })
        .collect();
    tokio::task::yield_now().await;
    assert!(first.release().await.unwrap());
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    if timeout(t.ms(300_000), all).await.is_err() {
        panic!(
            "{} of {WAITERS} waiters got the lock within the bound",
            served.load(Ordering::SeqCst)
        );
    }
    assert_eq!(served.load(Ordering::SeqCst), WAITERS);
    let status = client.status(&name).await.unwrap();
    assert!(status.is_free(), "{status:?}");
    assert_eq!(status.waiters, 0, "nothing left queued: {status:?}");
}

/// Tasks of one client wait behind holds that are never released (their
/// guards leaked, as a task that hangs leaves them), each on a fixed
/// lease: each lease that runs out lets the next task in with no release
/// to wake anyone, one at a time, tokens rising. A client wakes one of its
/// waiters at a time, so this is where a waiter that nobody calls would
/// stall. Bounded only to fail rather than hang.
pub async fn waiters_of_one_client_outlast_leaked_holds(fx: &Fixture) {
    const WAITERS: usize = 5;
    let t = Timing::default();
    let name = unique("leaked");
    let client = fx.client().await;
    let lease = t.ms(300);
    let first = crate::hold(&client, &name, fenced::Lease::Fixed(lease)).await;
    let granted = Arc::new(std::sync::Mutex::new(vec![first]));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let lock = client.mutex(&name).unwrap().fixed_lease(lease);
            let granted = granted.clone();
            tokio::spawn(async move {
                let g = lock.acquire().await.unwrap();
                let mut granted = granted.lock().unwrap();
                let last = granted.last().expect("the first hold");
                assert!(
                    g.fencing_token() > last.fencing_token(),
                    "tokens rise from one leaked hold to the next"
                );
                assert!(
                    granted.iter().all(|h| !h.is_held()),
                    "granted while an earlier hold was still believed"
                );
                // Kept, never released: only its lease frees the lock.
                granted.push(g);
            })
        })
        .collect();
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    if timeout(t.ms(60_000), all).await.is_err() {
        panic!(
            "{} of {WAITERS} waiters got the lock within the bound",
            granted.lock().unwrap().len() - 1
        );
    }
    assert_eq!(granted.lock().unwrap().len(), WAITERS + 1);
}

/// `list` shows the locks under a prefix that are held (with their
/// holders' tokens) or waited for, and not those released, nor those
/// under another prefix: the prefix is text, not a pattern (`%` and `_`
/// match themselves, case counts, non-ASCII too); once everything is let
/// go, nothing.
pub async fn list_shows_what_is_held_or_waited_for(fx: &Fixture) {
    let t = Timing::default();
    let u = unique("list");
    let p = format!("{u}%_Aé-");
    let (a, b) = fx.two_clients().await;
    let held = a.mutex(&format!("{p}a")).unwrap().acquire().await.unwrap();
    let other = unique("unlisted");
    let elsewhere = a.mutex(&other).unwrap().acquire().await.unwrap();
    // What `LIKE 'p%'` would take for the prefix: wildcards, and another case.
    let mut decoys = Vec::new();
    for d in [format!("{u}zzAé-d"), format!("{u}%_aé-e")] {
        decoys.push(a.mutex(&d).unwrap().acquire().await.unwrap());
    }
    let contended = b.mutex(&format!("{p}b")).unwrap().acquire().await.unwrap();
    let waiter = a.mutex(&format!("{p}b")).unwrap();
    let waiting = tokio::spawn(async move { waiter.acquire().await });
    let released = a.mutex(&format!("{p}c")).unwrap().acquire().await.unwrap();
    assert!(released.release().await.unwrap());

    let listed = b.list(&p).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, [format!("{p}a"), format!("{p}b")], "{listed:?}");
    let tokens =
        |i: usize| -> Vec<u64> { listed[i].status.holders.iter().map(|h| h.token).collect() };
    assert_eq!(tokens(0), [held.fencing_token()]);
    assert_eq!(tokens(1), [contended.fencing_token()]);
    let everything = b.list("").await.unwrap();
    for name in [format!("{p}a"), format!("{p}b"), other] {
        assert!(
            everything.iter().any(|l| l.name == name),
            "{name} missing from the whole list"
        );
    }

    waiting.abort();
    let _ = waiting.await;
    for g in [held, elsewhere, contended].into_iter().chain(decoys) {
        assert!(g.release().await.unwrap());
    }
    // The dropped waiter's place is withdrawn in the background.
    t.wait_until("the list emptied", async || {
        b.list(&p).await.unwrap().is_empty()
    })
    .await;
}

/// Every hold records who took it: this host, this process, the command
/// its client was given (else its command line) and when, and another
/// client's `status` and `list` show it. Holds taken after the command
/// changes record the new one. The advisory modes and Redis's `simple`
/// layout keep nothing beside the lock, and show none.
pub async fn holders_say_who_they_are(fx: &Fixture) {
    let name = unique("who");
    let (a, b) = fx.two_clients().await;
    let keeps_none = fx.url.contains("mode=advisory") || fx.url.contains("layout=simple");
    a.set_command("nightly-report --all 'x y'");
    let before = std::time::SystemTime::now();
    let g = a.mutex(&name).unwrap().acquire().await.unwrap();
    let after = std::time::SystemTime::now();
    let st = b.status(&name).await.unwrap();
    assert_eq!(st.holders.len(), 1, "{st:?}");
    let h = &st.holders[0];
    assert_eq!(h.token, g.fencing_token());
    if keeps_none {
        assert_eq!(h.holder, None, "{h:?}");
        assert!(g.release().await.unwrap());
        return;
    }
    let who = h.holder.clone().expect("the hold records its holder");
    assert_eq!(who.pid, std::process::id());
    assert_eq!(who.command, "nightly-report --all 'x y'");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(who.host, host.trim());
    // By this host's clock, to the millisecond the record keeps.
    let ms = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
    };
    assert!(
        (ms(before)..=ms(after)).contains(&who.granted_at_ms()),
        "granted at {} outside {}..={}",
        who.granted_at_ms(),
        ms(before),
        ms(after)
    );
    let listed = b.list(&name).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].status.holders[0].holder.as_ref(), Some(&who));
    // A later hold records the command as it is then.
    a.set_command("another");
    let other = unique("who");
    let g2 = a.mutex(&other).unwrap().acquire().await.unwrap();
    let st = b.status(&other).await.unwrap();
    assert_eq!(st.holders[0].holder.as_ref().unwrap().command, "another");
    // The first hold is unchanged.
    let st = b.status(&name).await.unwrap();
    assert_eq!(st.holders[0].holder.as_ref(), Some(&who));
    assert!(g.release().await.unwrap());
    assert!(g2.release().await.unwrap());
    // A waiter's hold shows when it was granted, not when it queued. etcd
    // and ZooKeeper write a waiter's key when it queues, and the record
    // again, in the background, once granted a second or more after: it
    // shows a time after the release. Elsewhere the granting attempt
    // writes it, which a waiter may have sent up to a round trip before
    // the release it follows.
    let queues_keys = ["etcd", "zk"].iter().any(|s| fx.url.starts_with(s));
    let t = Timing::default();
    let third = unique("who");
    let held = b.mutex(&third).unwrap().acquire().await.unwrap();
    let lock = a.mutex(&third).unwrap();
    let waiter = tokio::spawn(async move { lock.acquire().await });
    // Queued where the backend shows waiters (etcd and ZooKeeper do);
    // elsewhere, given a moment to start waiting.
    let queued = async {
        while b.status(&third).await.unwrap().waiters == 0 {
            tokio::time::sleep(t.ms(10)).await;
        }
    };
    let _ = tokio::time::timeout(t.ms(300), queued).await;
    if queues_keys {
        // Past the second after which the record is written again.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let released_at = ms(std::time::SystemTime::now());
    assert!(held.release().await.unwrap());
    let got = waiter.await.unwrap().unwrap();
    if queues_keys {
        t.wait_until("the record shows the grant's time", || async {
            let st = b.status(&third).await.unwrap();
            let who = st.holders[0].holder.as_ref().expect("a record");
            who.granted_at_ms() >= released_at
        })
        .await;
    }
    assert!(got.release().await.unwrap());
}

/// A counter starts at 0, adds, compares and sets, and refuses an
/// overflow without writing; tasks of two clients adding at once lose no
/// change and each see a value of their own; a sequence's IDs, one at a
/// time and in blocks, from tasks of two clients, are all different and
/// rise for each task.
pub async fn counters_and_sequences_count_every_change(fx: &Fixture) {
    const TASKS: usize = 4;
    const ADDS: usize = 10;
    let (a, b) = fx.two_clients().await;
    let name = unique("count");
    let c = a.counter(&name).unwrap();
    assert_eq!(c.get().await.unwrap(), 0);
    assert_eq!(c.add(5).await.unwrap(), 5);
    assert_eq!(b.counter(&name).unwrap().add(-2).await.unwrap(), 3);
    assert!(c.compare_and_set(3, 10).await.unwrap());
    assert!(!c.compare_and_set(3, 11).await.unwrap());
    let e = c.add(i64::MAX).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert_eq!(c.get().await.unwrap(), 10, "the refused add wrote nothing");

    let adders: Vec<_> = [&a, &b]
        .into_iter()
        .flat_map(|client| {
            let name = &name;
            (0..TASKS).map(move |_| client.counter(name).unwrap())
        })
        .map(|c| {
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for _ in 0..ADDS {
                    seen.push(c.increment().await.unwrap());
                }
                seen
            })
        })
        .collect();
    let mut seen = Vec::new();
    for t in adders {
        seen.extend(t.await.unwrap());
    }
    let total = 2 * TASKS * ADDS;
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), total, "every add saw a value of its own");
    assert_eq!(c.get().await.unwrap(), 10 + total as i64, "no add lost");

    let ids = unique("ids");
    let takers: Vec<_> = [&a, &b]
        .into_iter()
        .flat_map(|client| {
            let ids = &ids;
            (0..TASKS).map(move |_| client.sequence(ids).unwrap())
        })
        .map(|s| {
            tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..ADDS {
                    if i % 3 == 0 {
                        got.extend(s.next_block(3).await.unwrap());
                    } else {
                        got.push(s.next().await.unwrap());
                    }
                }
                got
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in takers {
        let got = t.await.unwrap();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "rising: {got:?}");
        all.extend(got);
    }
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "no ID handed out twice");
    assert!(all[0] >= 1);
    let e = a.sequence(&ids).unwrap().next_block(0).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    // A sequence whose counter was set below 0 refuses, writing nothing.
    let neg = unique("ids");
    a.counter(&neg).unwrap().set(-5).await.unwrap();
    let e = a.sequence(&neg).unwrap().next().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert_eq!(a.counter(&neg).unwrap().get().await.unwrap(), -5);
    // A name too long for the counter's lock is refused when made.
    let long = "c".repeat(fenced::MAX_NAME_LEN - 2);
    let e = a.counter(&long).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    // A name that holds another kind of value is refused, not misread
    // (where the counter keeps its value: its register, or Curator's node).
    let text = unique("count");
    fx.plant(&text, "abc").await;
    let e = a.counter(&text).unwrap().add(1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}

/// Waiters on one client go on when another client writes: a counter's
/// watch sees the change, a barrier's waiters stay while it is set and
/// all go once it is removed, a latch's waiters stay until its count
/// reaches zero; bad input is refused with nothing written.
pub async fn watchers_are_woken_by_writes(fx: &Fixture) {
    const WAITERS: usize = 3;
    // Only a guard against a hang: nothing here asserts on time.
    let hang = Duration::from_secs(60);
    let (a, b) = fx.two_clients().await;

    let name = unique("watched");
    let mut watch = b.counter(&name).unwrap().watch().await.unwrap();
    assert_eq!(watch.value(), 0);
    // The watch waits first, then another client writes.
    let waiting = tokio::spawn(async move {
        let n = watch.changed().await.unwrap();
        (n, watch)
    });
    tokio::task::yield_now().await;
    a.counter(&name).unwrap().add(3).await.unwrap();
    let (n, mut watch) = timeout(hang, waiting).await.unwrap().unwrap();
    assert_eq!(n, 3);
    // A change made while nobody waited is seen by the next wait.
    a.counter(&name).unwrap().add(-1).await.unwrap();
    assert_eq!(timeout(hang, watch.changed()).await.unwrap().unwrap(), 2);
    assert_eq!(watch.value(), 2);

    let gate = unique("gate");
    let barrier = a.barrier(&gate).unwrap();
    assert!(!barrier.is_set().await.unwrap());
    assert!(
        b.barrier(&gate)
            .unwrap()
            .wait_timeout(Duration::ZERO)
            .await
            .unwrap()
    );
    barrier.set().await.unwrap();
    let passed = Arc::new(AtomicUsize::new(0));
    let waiters: Vec<_> = (0..WAITERS)
        .map(|i| {
            let w = if i % 2 == 0 { &b } else { &a }.barrier(&gate).unwrap();
            let passed = passed.clone();
            tokio::spawn(async move {
                w.wait().await.unwrap();
                passed.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    assert!(
        !b.barrier(&gate)
            .unwrap()
            .wait_timeout(Duration::from_millis(50))
            .await
            .unwrap()
    );
    assert!(b.barrier(&gate).unwrap().is_set().await.unwrap());
    assert_eq!(
        passed.load(Ordering::SeqCst),
        0,
        "a waiter passed a set barrier"
    );
    barrier.remove().await.unwrap();
    for w in waiters {
        timeout(hang, w).await.unwrap().unwrap();
    }
    assert_eq!(passed.load(Ordering::SeqCst), WAITERS);

    let latch_name = unique("latch");
    let latch = a.latch(&latch_name).unwrap();
    assert_eq!(latch.count().await.unwrap(), 0);
    assert!(
        latch.wait_timeout(Duration::ZERO).await.unwrap(),
        "never set: open"
    );
    assert!(latch.try_set_count(3).await.unwrap());
    assert!(
        !b.latch(&latch_name)
            .unwrap()
            .try_set_count(2)
            .await
            .unwrap(),
        "set twice"
    );
    let opened = Arc::new(AtomicUsize::new(0));
    let waiters: Vec<_> = (0..WAITERS)
        .map(|i| {
            let l = if i % 2 == 0 { &b } else { &a }.latch(&latch_name).unwrap();
            let opened = opened.clone();
            tokio::spawn(async move {
                l.wait().await.unwrap();
                opened.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    assert_eq!(latch.count_down().await.unwrap(), 2);
    assert_eq!(b.latch(&latch_name).unwrap().count_down().await.unwrap(), 1);
    assert!(!latch.wait_timeout(Duration::from_millis(50)).await.unwrap());
    assert_eq!(
        opened.load(Ordering::SeqCst),
        0,
        "the latch opened above zero"
    );
    assert_eq!(b.latch(&latch_name).unwrap().count_down().await.unwrap(), 0);
    for w in waiters {
        timeout(hang, w).await.unwrap().unwrap();
    }
    assert_eq!(opened.load(Ordering::SeqCst), WAITERS);
    assert_eq!(latch.count_down().await.unwrap(), 0, "a count-down at zero");
    assert!(
        latch.try_set_count(1).await.unwrap(),
        "at zero it may be set again"
    );

    for bad in [0, (1 << 53) + 1] {
        let e = latch.try_set_count(bad).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    }
    assert_eq!(
        latch.count().await.unwrap(),
        1,
        "refused sets wrote nothing"
    );
    // A name that holds another kind of value is refused, not misread;
    // but in Curator's layout a barrier is set while its node exists,
    // whatever the node holds (Curator's own barrier writes its address
    // there), and the counter's node exists.
    let barrier_on_counter = a.barrier(&name).unwrap().is_set().await;
    if fx.curator_layout() {
        assert!(barrier_on_counter.unwrap(), "the node is there: set");
    } else {
        let e = barrier_on_counter.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    }
    let text = unique("text");
    let v = a.versioned(&text).unwrap();
    assert!(v.compare_and_set(0, b"abc").await.unwrap());
    let e = a.latch(&text).unwrap().count().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    // Refused or left alone, depending on the engine; never changed.
    let _ = a.latch(&text).unwrap().count_down().await;
    assert_eq!(
        v.read().await.unwrap().unwrap().value,
        b"abc",
        "nothing written"
    );
}

/// Members of a double barrier on two clients, entering one at a time:
/// none passes `enter` before the last has entered; leaving one at a
/// time, none passes `leave` before the last has left. Members that loop
/// on enter, leave all get round; a member alone gives up and leaves; a
/// member that died inside (a permit nobody renews) keeps the others
/// only until its lease runs out; bad input is refused.
pub async fn double_barriers_wait_for_every_member(fx: &Fixture) {
    const MEMBERS: usize = 3;
    let hang = Duration::from_secs(60);
    let (a, b) = fx.two_clients().await;
    let name = unique("double");
    // How many members are inside: waited for, bounded by `hang`.
    let inside = |n: usize, name: String, client: fenced::Client| async move {
        let until = tokio::time::Instant::now() + hang;
        while client.status(&name).await.unwrap().holders.len() != n {
            assert!(tokio::time::Instant::now() < until, "never {n} inside");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };

    let passed = Arc::new(AtomicUsize::new(0));
    let mut entering = Vec::new();
    for i in 0..MEMBERS {
        let barrier = if i % 2 == 0 { &a } else { &b }
            .double_barrier(&name, MEMBERS as u32)
            .unwrap();
        let counted = passed.clone();
        entering.push(tokio::spawn(async move {
            let member = barrier.enter().await.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
            member
        }));
        inside(i + 1, name.clone(), a.clone()).await;
        if i + 1 < MEMBERS {
            assert_eq!(
                passed.load(Ordering::SeqCst),
                0,
                "passed enter with {} of {MEMBERS} in",
                i + 1
            );
        }
    }
    let mut members = Vec::new();
    for e in entering {
        members.push(timeout(hang, e).await.unwrap().unwrap());
    }
    assert_eq!(passed.load(Ordering::SeqCst), MEMBERS);
    let left = Arc::new(AtomicUsize::new(0));
    let mut leaving = Vec::new();
    for (i, member) in members.into_iter().enumerate() {
        assert!(member.guard().is_held());
        let counted = left.clone();
        leaving.push(tokio::spawn(async move {
            member.leave().await.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
        }));
        inside(MEMBERS - i - 1, name.clone(), a.clone()).await;
        if i + 1 < MEMBERS {
            assert_eq!(
                left.load(Ordering::SeqCst),
                0,
                "passed leave with {} of {MEMBERS} out",
                i + 1
            );
        }
    }
    for l in leaving {
        timeout(hang, l).await.unwrap().unwrap();
    }
    assert_eq!(left.load(Ordering::SeqCst), MEMBERS);

    // A group that loops: the last to leave may enter the next round
    // before the others have seen the round empty.
    let looping: Vec<_> = (0..MEMBERS)
        .map(|i| {
            let barrier = if i % 2 == 0 { &a } else { &b }
                .double_barrier(&name, MEMBERS as u32)
                .unwrap();
            tokio::spawn(async move {
                for _ in 0..3 {
                    barrier.enter().await.unwrap().leave().await.unwrap();
                }
            })
        })
        .collect();
    for l in looping {
        timeout(hang, l).await.unwrap().unwrap();
    }

    // Alone, a member gives up and leaves again.
    let lonely = a.double_barrier(&name, MEMBERS as u32).unwrap();
    assert!(
        lonely
            .enter_timeout(Duration::from_millis(100))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        a.status(&name).await.unwrap().is_free(),
        "the lonely member left"
    );

    // A member whose permit lapses while it waits is told so.
    let lapsing = a
        .double_barrier(&unique("double"), 2)
        .unwrap()
        .with_lock(|s| s.fixed_lease(Duration::from_millis(200)));
    let e = timeout(hang, lapsing.enter()).await.unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");

    // A member that entered and died (it never leaves, and nothing renews
    // its lease): the other counts it, and its lease's end ends the
    // other's wait to leave.
    let dead = unique("double");
    let barrier = b.double_barrier(&dead, 2).unwrap();
    let live = tokio::spawn(async move { barrier.enter().await.unwrap() });
    inside(1, dead.clone(), a.clone()).await;
    let dying = a
        .double_barrier(&dead, 2)
        .unwrap()
        .with_lock(|s| s.fixed_lease(Duration::from_secs(3)));
    let ghost = timeout(hang, dying.enter()).await.unwrap().unwrap();
    std::mem::forget(ghost); // never leaves, never releases
    let member = timeout(hang, live).await.unwrap().unwrap();
    assert!(
        timeout(hang, member.leave_timeout(hang))
            .await
            .unwrap()
            .unwrap()
    );

    let e = a.double_barrier(&name, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let e = a
        .double_barrier(&name, fenced::MAX_MEMBERS + 1)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let long = "d".repeat(fenced::MAX_NAME_LEN - 2);
    let e = a.double_barrier(&long, 2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}

/// A rate limiter shared by tasks of two clients grants exactly its
/// burst at once, however many ask together; then no more than the rate
/// allows over the time measured here (an upper bound: the server's
/// clock paces it, and a slow test only grants less); `acquire` waits
/// its turn; bad input is refused with nothing taken. Backends without
/// one server's clock refuse to make one.
pub async fn rate_limiters_admit_the_burst_then_the_rate(fx: &Fixture) {
    const TASKS: usize = 4;
    let hang = Duration::from_secs(60);
    let (a, b) = fx.two_clients().await;
    let scheme = a.url().split(':').next().unwrap_or_default().to_owned();
    let offers =
        fenced::backend_for_scheme(&scheme).is_some_and(|info| info.capabilities.rate_limiters);
    let name = unique("rate");
    if !offers {
        let e = a.rate_limiter(&name, 10.0, 5).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        return;
    }
    // A rate of one per 1000 s: nothing comes back while the test runs.
    const BURST: u32 = 5;
    let tries: Vec<_> = [&a, &b]
        .into_iter()
        .flat_map(|c| (0..TASKS).map(|_| c.rate_limiter(&name, 0.001, BURST).unwrap()))
        .map(|l| {
            tokio::spawn(async move {
                let mut granted = 0;
                for _ in 0..3 {
                    match l.try_acquire(1).await.unwrap() {
                        fenced::RateDecision::Granted => granted += 1,
                        fenced::RateDecision::RetryAfter(wait) => {
                            // One interval, give or take the time between
                            // this client's look and another's grant.
                            assert!(wait <= Duration::from_secs(1001), "{wait:?}");
                        }
                    }
                }
                granted
            })
        })
        .collect();
    let mut granted = 0;
    for t in tries {
        granted += t.await.unwrap();
    }
    assert_eq!(
        granted,
        BURST,
        "exactly the burst, from {} asking",
        2 * TASKS
    );

    // 40 a second, bursts of 4: count what tasks of both clients get
    // over a stretch of time, asking as fast as they can.
    let paced = unique("rate");
    let (rate, burst) = (40.0, 4);
    let started = std::time::Instant::now();
    let takers: Vec<_> = [&a, &b]
        .into_iter()
        .flat_map(|c| (0..TASKS).map(|_| c.rate_limiter(&paced, rate, burst).unwrap()))
        .map(|l| {
            tokio::spawn(async move {
                let mut got = 0u32;
                for _ in 0..6 {
                    l.acquire(1).await.unwrap();
                    got += 1;
                }
                got
            })
        })
        .collect();
    let mut got = 0;
    for t in takers {
        got += timeout(hang, t).await.unwrap().unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(got, 6 * 2 * TASKS as u32, "every acquire was granted");
    let most = f64::from(burst) + rate * elapsed + 1.0;
    assert!(
        f64::from(got) <= most,
        "{got} granted in {elapsed:.3}s: at most {most:.1} allowed"
    );

    let limiter = a.rate_limiter(&unique("rate"), 1.0, 2).unwrap();
    for n in [0, 3] {
        let e = limiter.try_acquire(n).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    }
    assert!(
        limiter.try_acquire(2).await.unwrap().is_granted(),
        "refusals took nothing"
    );
    for (rate, burst) in [
        (0.0, 1),
        (-1.0, 1),
        (f64::NAN, 1),
        (f64::INFINITY, 1),
        (2e6, 1),
        (1.0, 0),
        (1.0, fenced::MAX_BURST + 1),
        (0.000_001, 1_000_000),
    ] {
        let e = a.rate_limiter(&name, rate, burst).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{rate} {burst}: {e}");
    }
}

/// A holder whose lease ran out cannot release or affect the new holder.
pub async fn owner_only_release(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("own");
    let (a, b) = fx.two_clients().await;
    let old = crate::hold(&a, &name, fenced::Lease::Fixed(t.ms(200))).await;
    let new = b
        .mutex(&name)
        .unwrap()
        .acquire_timeout(t.eventually())
        .await
        .unwrap()
        .expect("the expired lease frees the lock");
    assert!(!old.is_held());
    assert!(
        !old.release().await.unwrap(),
        "a stale release must report it was not ours"
    );
    let st = b.status(&name).await.unwrap();
    assert_eq!(st.holders.len(), 1, "the new holder keeps the lock");
    assert_eq!(st.holders[0].token, new.fencing_token());
    assert!(new.is_held());
    assert!(new.release().await.unwrap());
    assert!(b.status(&name).await.unwrap().is_free());

    // A renewal from a holder whose hold was taken away is stale: it finds
    // the hold gone (the lost signal fires) and touches the new holder's
    // in nothing.
    let old = crate::hold(&a, &name, fenced::Lease::Renewed(t.ms(2000))).await;
    assert_eq!(b.mutex(&name).unwrap().force_unlock().await.unwrap(), 1);
    let new = b
        .mutex(&name)
        .unwrap()
        .acquire_timeout(t.eventually())
        .await
        .unwrap()
        .expect("the broken lock is free");
    let reason = timeout(t.eventually(), old.lost())
        .await
        .expect("the stale renewal reports the hold lost");
    assert_eq!(reason, LostReason::Taken);
    let st = b.status(&name).await.unwrap();
    assert_eq!(st.holders.len(), 1, "{st:?}");
    assert_eq!(st.holders[0].token, new.fencing_token());
    assert!(new.is_held());
    assert!(!old.release().await.unwrap(), "a stale release is reported");
    assert_eq!(b.status(&name).await.unwrap().holders.len(), 1);
    assert!(new.release().await.unwrap());
    assert!(b.status(&name).await.unwrap().is_free());
}

/// The same owner nests; the lock is free only when the count falls to zero.
pub async fn reentrancy_counts(fx: &Fixture) {
    let name = unique("re");
    let (a, b) = fx.two_clients().await;
    let me = Owner::new();
    let lock = a.mutex(&name).unwrap().owner(&me);
    let outer = lock.acquire().await.unwrap();
    let inner = lock.acquire().await.unwrap();
    let inner2 = lock.try_acquire().await.unwrap().expect("reentrant try");
    assert_eq!(inner2.hold_count(), 3);
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    assert!(inner2.release().await.unwrap());
    assert!(inner.release().await.unwrap());
    assert_eq!(outer.hold_count(), 1);
    assert!(
        b.mutex(&name)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "still held once"
    );
    // Another owner of the same client is excluded too, and so is an
    // acquisition that names none (every acquisition is its own owner),
    // unless it runs inside the owner's scope.
    assert!(
        lock.clone()
            .owner(&Owner::new())
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    let plain = a.mutex(&name).unwrap();
    assert!(plain.try_acquire().await.unwrap().is_none());
    let scoped = me
        .scope(async { plain.try_acquire().await.unwrap() })
        .await
        .expect("the owner's scope nests");
    assert_eq!(scoped.hold_count(), 2);
    assert!(scoped.release().await.unwrap());
    assert!(outer.release().await.unwrap());
    let g = b
        .mutex(&name)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the last release");
    assert!(g.fencing_token() > 0);
}

/// Eight tasks sharing one client, with default options (no owner named),
/// exclude each other as processes do: a service shares one client across
/// its request handlers, and two requests for one order must not both get
/// in. Their read-modify-write of a counter loses no update.
pub async fn tasks_of_one_client_exclude(fx: &Fixture) {
    const TASKS: usize = 8;
    const ROUNDS: usize = 10;
    let name = unique("tasks");
    let client = fx.client().await;
    let inside = Arc::new(AtomicUsize::new(0));
    let counter = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let lock = client.mutex(&name).unwrap();
        let (inside, counter) = (inside.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = lock.acquire().await.unwrap();
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two tasks of one client inside one mutex"
                );
                let v = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(g.release().await.unwrap());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), TASKS * ROUNDS);
    assert!(client.status(&name).await.unwrap().is_free());
}

/// A holder that vanished without releasing (its guard leaked, as if the
/// process died) stops blocking others once its lease ends.
pub async fn lease_expiry_frees_dead_holder(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("dead");
    let (a, b) = fx.two_clients().await;
    let g = crate::hold(&a, &name, fenced::Lease::Fixed(t.ms(300))).await;
    std::mem::forget(g); // never released
    let got = b
        .mutex(&name)
        .unwrap()
        .acquire_timeout(t.eventually())
        .await
        .unwrap();
    assert!(got.is_some(), "the dead holder's lease must free the lock");
}

/// The watchdog keeps a slow holder's lock for many leases.
///
/// The lease is short enough that the check spans three of them, and long
/// enough that a server a loaded machine keeps waiting for a few hundred
/// milliseconds still answers a renewal in time: a renewal that comes back
/// after the lease has ended rightly loses the hold, so a lease shorter
/// than the machine's worst stall would test the machine, not the watchdog.
pub async fn watchdog_keeps_slow_holder(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("wd");
    let (a, b) = fx.two_clients().await;
    let lease = t.ms(2000);
    let g = crate::hold(&a, &name, fenced::Lease::Renewed(lease)).await;
    let rival = b.mutex(&name).unwrap();
    for _ in 0..6 {
        tokio::time::sleep(lease / 2).await;
        assert!(g.is_held(), "renewed hold must stay held");
        assert!(
            rival.try_acquire().await.unwrap().is_none(),
            "a rival got a renewed lock"
        );
    }
    let st = b.status(&name).await.unwrap();
    assert_eq!(st.holders.len(), 1);
    assert!(g.release().await.unwrap());
}

/// Tokens strictly increase across owners, clients and modes.
pub async fn fencing_tokens_increase(fx: &Fixture) {
    tokens_rise(fx, true).await;
}

/// Tokens strictly increase across owners, clients and both sides of a
/// mutex-only backend's locks.
pub async fn fencing_tokens_increase_mutex(fx: &Fixture) {
    tokens_rise(fx, false).await;
}

async fn tokens_rise(fx: &Fixture, with_read: bool) {
    let name = unique("tok");
    let clients = [fx.client().await, fx.client().await];
    let mut last = 0;
    for i in 0..12 {
        let c = &clients[i % 2];
        let g = match i % 3 {
            0 => c.mutex(&name).unwrap().acquire().await.unwrap(),
            1 if with_read => c.rwlock(&name).unwrap().read().acquire().await.unwrap(),
            _ => c.rwlock(&name).unwrap().write().acquire().await.unwrap(),
        };
        assert!(
            g.fencing_token() > last,
            "token {} after {last}",
            g.fencing_token()
        );
        last = g.fencing_token();
        assert!(g.release().await.unwrap());
    }
    assert_eq!(clients[0].status(&name).await.unwrap().last_token, last);
}

/// When the hold is taken away, the renewal notices, `lost()` fires, and
/// the old token is refused by a fenced register.
pub async fn lost_signal_when_taken(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("lost");
    let (a, b) = fx.two_clients().await;
    let g = crate::hold(&a, &name, fenced::Lease::Renewed(t.ms(2000))).await;
    let reg = a.register(&format!("{name}:reg")).unwrap();
    reg.write(&g, "1").await.unwrap();
    assert_eq!(b.mutex(&name).unwrap().force_unlock().await.unwrap(), 1);
    let reason = timeout(t.eventually(), g.lost())
        .await
        .expect("lost() must fire");
    assert_eq!(reason, LostReason::Taken);
    assert!(!g.is_held());
    let new = b.mutex(&name).unwrap().acquire().await.unwrap();
    reg.write(&new, "2").await.unwrap();
    let err = reg.write(&g, "stale").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StaleToken);
    assert_eq!(reg.read_i64().await.unwrap(), Some(2));
    assert!(!g.release().await.unwrap());
}

/// A fixed lease ends the hold on the local clock, before any round trip.
pub async fn lost_signal_when_lease_ends(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("fixed");
    let a = fx.client().await;
    let g = crate::hold(&a, &name, fenced::Lease::Fixed(t.ms(200))).await;
    assert!(g.is_held());
    let reason = timeout(t.eventually(), g.lost())
        .await
        .expect("lost() must fire");
    assert_eq!(reason, LostReason::Expired);
    assert!(!g.is_held());
    assert_eq!(g.lease_left(), Duration::ZERO);
}

/// try never waits; timeouts give up; wait_timeout maps to error kinds.
pub async fn try_and_timeout(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("try");
    let (a, b) = fx.two_clients().await;
    let g = a.mutex(&name).unwrap().acquire().await.unwrap();
    let lock = b.mutex(&name).unwrap();
    assert!(lock.try_acquire().await.unwrap().is_none());
    assert!(lock.acquire_timeout(t.ms(150)).await.unwrap().is_none());
    let e = lock
        .clone()
        .wait_timeout(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WouldBlock);
    let e = lock
        .clone()
        .wait_timeout(t.ms(100))
        .acquire()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(e.to_string().contains(&name), "{e}");
    assert!(g.release().await.unwrap());
    assert!(lock.try_acquire().await.unwrap().is_some());
}

/// A blocked acquirer gets the lock once the holder releases.
pub async fn waiter_is_woken_by_release(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("wake");
    let (a, b) = fx.two_clients().await;
    let g = a.mutex(&name).unwrap().acquire().await.unwrap();
    let lock = b.mutex(&name).unwrap();
    let waiter = tokio::spawn(async move { lock.acquire().await.map(|g| g.fencing_token()) });
    tokio::time::sleep(t.ms(100)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter must wait while the lock is held"
    );
    let first = g.fencing_token();
    assert!(g.release().await.unwrap());
    // Woken by the backend's notification, not found by the fallback
    // re-check (every 2 s while the holder's lease is long): the bound
    // stays below it, unscaled, so this fails when wake-ups are broken.
    let token = timeout(Duration::from_millis(1500), waiter)
        .await
        .expect("the release must wake the waiter, not its fallback re-check")
        .unwrap()
        .unwrap();
    assert!(token > first);
}

/// Closing a client while one of its guards is alive tells the guard (its
/// lost signal has fired, `Closed`, when `close` returns) and gives its
/// lock back: another client gets it.
pub async fn close_tells_live_guards(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("close");
    let (a, b) = fx.two_clients().await;
    let g = a.mutex(&name).unwrap().acquire().await.unwrap();
    let lost = g.lost();
    a.close().await;
    assert!(!g.is_held(), "{name}: a guard believed held after close");
    // Polled once: the signal must already have fired.
    let reason = timeout(Duration::ZERO, lost)
        .await
        .expect("the lost signal fired before close returned");
    assert_eq!(reason, LostReason::Closed);
    // A closed client hands out no more guards: nothing would tell them.
    let e = a
        .mutex(&unique("after-close"))
        .unwrap()
        .try_acquire()
        .await
        .expect_err("a closed client refuses to acquire");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    another_takes_it(&t, &b, &name, g, "the closed client's lock is given back").await;
}

/// `b` gets lock `name`, which `lost` held until it lost it, with a
/// higher token; `lost`'s release then reports the loss.
async fn another_takes_it(
    t: &Timing,
    b: &fenced::Client,
    name: &str,
    lost: fenced::Guard,
    what: &str,
) {
    let won = b
        .mutex(name)
        .unwrap()
        .acquire_timeout(t.eventually())
        .await
        .unwrap()
        .expect(what);
    assert!(won.fencing_token() > lost.fencing_token());
    assert!(!lost.release().await.unwrap());
    assert!(won.release().await.unwrap());
}

/// Dropping a guard releases in the background.
pub async fn dropped_guard_releases(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("drop");
    let (a, b) = fx.two_clients().await;
    drop(a.mutex(&name).unwrap().acquire().await.unwrap());
    let g = b
        .mutex(&name)
        .unwrap()
        .acquire_timeout(t.eventually())
        .await
        .unwrap();
    assert!(g.is_some(), "a dropped guard must release");
}

/// A waiting acquire that is dropped leaves no queue place or hold behind:
/// a fair newcomer is not blocked by it.
pub async fn cancelled_wait_leaves_nothing(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("cancel");
    let (a, b, c) = (fx.client().await, fx.client().await, fx.client().await);
    let g = a.mutex(&name).unwrap().acquire().await.unwrap();
    let fair = b.mutex(&name).unwrap().fair(true);
    assert!(
        timeout(t.ms(200), fair.acquire()).await.is_err(),
        "must still be waiting"
    );
    assert!(fair.acquire_timeout(t.ms(100)).await.unwrap().is_none());
    assert!(g.release().await.unwrap());
    // The withdrawals run in the background: give them a bounded moment.
    t.wait_until("a cancelled waiter stayed queued", || async {
        c.status(&name).await.unwrap().waiters == 0
    })
    .await;
    let got = c
        .mutex(&name)
        .unwrap()
        .fair(true)
        .try_acquire()
        .await
        .unwrap();
    assert!(
        got.is_some(),
        "a fair newcomer found the lock blocked by a cancelled waiter"
    );
}

/// Fair waiters get the lock in the order they asked for it.
pub async fn fair_mode_is_fifo(fx: &Fixture) {
    let mut clients = Vec::new();
    for _ in 0..5 {
        clients.push(fx.client().await);
    }
    fair_line(fx, "fifo", clients, Duration::ZERO).await;
}

/// Fair waiters keep their places in line through a long wait, three
/// tasks of one client and two of another: a client wakes one of its
/// waiters at a time, and a queue place that lives on a lease (a lease
/// table's, Redis's: 10 s after its waiter last asked) must not run out
/// for the tasks that are not woken, or they would lose their turn to
/// the other client's.
pub async fn fair_waiters_of_one_client_keep_their_places(fx: &Fixture) {
    let (one, other) = (fx.client().await, fx.client().await);
    let clients = vec![one.clone(), one.clone(), one, other.clone(), other];
    // Longer than a queue place lives unless its waiter asks again.
    fair_line(fx, "places", clients, Timing::default().ms(13_000)).await;
}

/// A fair waiter on each of `clients` in turn, each queued before the
/// next asks, behind a holder that keeps the lock `linger` longer (every
/// place still there then): they get the lock in the order they asked.
async fn fair_line(fx: &Fixture, stem: &str, clients: Vec<fenced::Client>, linger: Duration) {
    let t = Timing::default();
    let name = unique(stem);
    let holder = fx.client().await;
    let g = holder
        .mutex(&name)
        .unwrap()
        .fair(true)
        .acquire()
        .await
        .unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let order = order.clone();
        let lock = c.mutex(&name).unwrap().fair(true);
        waiters.push(tokio::spawn(async move {
            let g = lock.acquire().await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            g.release().await.unwrap();
        }));
        // Wait until waiter i is queued before starting i + 1.
        let queued = async || holder.status(&name).await.unwrap().waiters > i;
        t.wait_until(&format!("waiter {i} never queued"), queued)
            .await;
    }
    tokio::time::sleep(linger).await;
    let status = holder.status(&name).await.unwrap();
    assert_eq!(
        status.waiters,
        clients.len(),
        "every place kept: {status:?}"
    );
    assert!(g.release().await.unwrap());
    for w in waiters {
        timeout(t.eventually(), w)
            .await
            .expect("every fair waiter gets its turn")
            .unwrap();
    }
    let asked: Vec<usize> = (0..clients.len()).collect();
    assert_eq!(*order.lock().unwrap(), asked);
}

/// A backend without fair mode refuses it with a clear error and takes
/// nothing.
pub async fn fair_mode_is_refused(fx: &Fixture) {
    let name = unique("nofair");
    let c = fx.client().await;
    let e = c
        .mutex(&name)
        .unwrap()
        .fair(true)
        .try_acquire()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("fair"), "{e}");
    assert!(c.status(&name).await.unwrap().is_free());
}

/// A mutex-only backend refuses read-write locks and semaphores with a
/// clear error and takes nothing.
pub async fn shared_modes_are_refused(fx: &Fixture) {
    let name = unique("noshared");
    let c = fx.client().await;
    let read = c.rwlock(&name).unwrap().read().try_acquire().await;
    let sem = c.semaphore(&name, 3).unwrap().try_acquire().await;
    for r in [read.map(drop), sem.map(drop)] {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("mutex"), "{e}");
    }
    assert!(c.status(&name).await.unwrap().is_free());
    // The write side of a read-write lock is a mutex, and works.
    let w = c
        .rwlock(&name)
        .unwrap()
        .write()
        .try_acquire()
        .await
        .unwrap();
    assert!(w.expect("free").release().await.unwrap());
}

/// One leader at a time; observers see who; leadership passes on when the
/// leader resigns, with a larger token, and a former leader cannot proclaim.
pub async fn leader_election_hands_over(fx: &Fixture) {
    let t = Timing::default();
    let name = unique("elect");
    let (a, b, c) = (fx.client().await, fx.client().await, fx.client().await);
    let first = a.election(&name).unwrap().campaign("a").await.unwrap();
    let eb = b.election(&name).unwrap();
    assert!(eb.try_campaign("b").await.unwrap().is_none(), "one leader");
    let seen = c.election(&name).unwrap().leader().await.unwrap().unwrap();
    assert_eq!(seen.value, b"a");
    assert_eq!(seen.token, first.guard().fencing_token());
    let waiting = tokio::spawn(async move { eb.campaign("b").await });
    tokio::time::sleep(t.ms(50)).await;
    assert!(!waiting.is_finished());
    let old_token = first.guard().fencing_token();
    // Leadership taken away (an operator breaks the lock): the waiting
    // candidate leads, and the old leader can no longer proclaim.
    assert_eq!(c.mutex(&name).unwrap().force_unlock().await.unwrap(), 1);
    let second = timeout(t.eventually(), waiting)
        .await
        .expect("the waiting candidate leads next")
        .unwrap()
        .unwrap();
    assert!(second.guard().fencing_token() > old_token);
    let seen = c.election(&name).unwrap().leader().await.unwrap().unwrap();
    assert_eq!(seen.value, b"b");
    let e = first.proclaim("a again").await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::StaleToken | ErrorKind::Lost),
        "{e}"
    );
    let seen = c.election(&name).unwrap().leader().await.unwrap().unwrap();
    assert_eq!(seen.value, b"b");
    assert!(
        !first.resign().await.unwrap(),
        "the old leader no longer led"
    );
    assert!(second.resign().await.unwrap());
    assert!(c.election(&name).unwrap().leader().await.unwrap().is_none());
}

/// An observer on another client sees each leader and each value it
/// proclaims, and the end of leadership; `participants` names the
/// leader's hold; `run_as_leader` returns the work's output after
/// resigning, and drops the work with a `Lost` error when leadership is
/// taken away.
pub async fn elections_are_observed_and_lead_work(fx: &Fixture) {
    let hang = Duration::from_secs(60);
    let name = unique("observed");
    let (a, b) = fx.two_clients().await;
    let mut watch = a.election(&name).unwrap().observe().await.unwrap();
    assert!(watch.leader().is_none());
    let eb = b.election(&name).unwrap();
    let leading = eb.campaign("b1").await.unwrap();
    assert!(leading.is_leader());
    // The next change: the leader with its value (between grant and
    // proclamation an observer may see nobody yet).
    let mut seen = None;
    for _ in 0..3 {
        seen = timeout(hang, watch.changed()).await.unwrap().unwrap();
        if seen.is_some() {
            break;
        }
    }
    let seen = seen.expect("the observer saw the leader");
    assert_eq!(seen.value, b"b1");
    assert_eq!(seen.token, leading.guard().fencing_token());
    leading.proclaim("b2").await.unwrap();
    let seen = timeout(hang, watch.changed())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(seen.value, b"b2");
    let who = a.election(&name).unwrap().participants().await.unwrap();
    assert_eq!(
        who.leader.map(|h| h.token),
        Some(leading.guard().fencing_token())
    );
    assert!(leading.resign().await.unwrap());
    assert!(
        timeout(hang, watch.changed())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
    assert!(
        a.election(&name)
            .unwrap()
            .participants()
            .await
            .unwrap()
            .leader
            .is_none()
    );

    let out = timeout(hang, eb.run_as_leader("b3", async { 7 }))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out, 7);
    assert!(
        a.status(&name).await.unwrap().is_free(),
        "resigned after the work"
    );

    // Taken away while working: the work is dropped, the error says so.
    let short = b
        .election(&name)
        .unwrap()
        .with_lock(|m| m.lease(Duration::from_secs(1)));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let working = tokio::spawn(async move {
        short
            .run_as_leader("b4", async move {
                let _ = started_tx.send(());
                std::future::pending::<()>().await
            })
            .await
    });
    timeout(hang, started_rx).await.unwrap().unwrap();
    assert_eq!(a.mutex(&name).unwrap().force_unlock().await.unwrap(), 1);
    let e = timeout(hang, working).await.unwrap().unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
}

/// A backend without semaphores refuses them with a clear error and takes
/// nothing.
pub async fn semaphore_is_refused(fx: &Fixture) {
    let name = unique("nosem");
    let c = fx.client().await;
    let e = c
        .semaphore(&name, 3)
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("semaphore"), "{e}");
    assert!(c.status(&name).await.unwrap().is_free());
}

/// Readers share, writers exclude, a writer may take read, a reader may
/// not upgrade (the last two are for a named owner).
pub async fn readers_share_writers_exclude(fx: &Fixture) {
    let name = unique("rw");
    let (a, b) = fx.two_clients().await;
    let rw_a = a.rwlock(&name).unwrap();
    let rw_b = b.rwlock(&name).unwrap();
    let me = Owner::new();
    let r1 = rw_a.read().owner(&me).acquire().await.unwrap();
    let r2 = rw_b.read().acquire().await.unwrap();
    let r3 = rw_b.read().acquire().await.unwrap();
    assert_eq!(a.status(&name).await.unwrap().holders.len(), 3);
    assert!(rw_b.write().try_acquire().await.unwrap().is_none());
    assert!(rw_a.write().try_acquire().await.unwrap().is_none());
    let up = rw_a.write().owner(&me).try_acquire().await.unwrap_err();
    assert_eq!(
        up.kind(),
        ErrorKind::InvalidInput,
        "upgrade must be refused: {up}"
    );
    for r in [r1, r2, r3] {
        assert!(r.release().await.unwrap());
    }
    let w = rw_a.write().owner(&me).acquire().await.unwrap();
    assert!(
        rw_b.read().try_acquire().await.unwrap().is_none(),
        "a reader got in beside a writer"
    );
    assert!(
        rw_a.read().try_acquire().await.unwrap().is_none(),
        "another acquisition on the writer's client is another owner"
    );
    let own_read = rw_a
        .read()
        .owner(&me)
        .try_acquire()
        .await
        .unwrap()
        .expect("the writer may take read");
    assert!(w.release().await.unwrap());
    // Downgraded: still a reader, so other readers may join but no writer.
    assert!(rw_b.write().try_acquire().await.unwrap().is_none());
    let other_read = rw_b.read().try_acquire().await.unwrap();
    assert!(other_read.is_some());
    assert!(own_read.release().await.unwrap());
}

/// The grant-case table's mutex rows (see [`grant_cases`]).
pub async fn grant_cases_mutex(fx: &Fixture) {
    grant_cases::run(fx, grant_cases::MUTEX).await;
}

/// The grant-case table's read-write rows.
pub async fn grant_cases_rw(fx: &Fixture) {
    grant_cases::run(fx, grant_cases::RW).await;
}

/// The grant-case table's semaphore rows.
pub async fn grant_cases_permits(fx: &Fixture) {
    grant_cases::run(fx, grant_cases::PERMITS).await;
}

/// A semaphore never lets more than its permits in.
pub async fn semaphore_never_exceeds_permits(fx: &Fixture) {
    const PERMITS: u32 = 3;
    let name = unique("sem");
    let inside = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let client = fx.client().await;
        for _ in 0..4 {
            let sem = client.semaphore(&name, PERMITS).unwrap();
            let (inside, peak) = (inside.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..8 {
                    let g = sem.acquire().await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    assert!(
                        now <= PERMITS as usize,
                        "{now} holders of {PERMITS} permits"
                    );
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(peak.load(Ordering::SeqCst) <= PERMITS as usize);
    // Exactly its permits fit at once, from as many clients.
    let mut full = Vec::new();
    for _ in 0..PERMITS {
        let c = fx.client().await;
        let g = c.semaphore(&name, PERMITS).unwrap().try_acquire().await;
        full.push(g.unwrap().expect("a free permit"));
    }
    assert!(full.iter().all(|g| g.is_held()));
    let c = fx.client().await;
    assert!(
        c.semaphore(&name, PERMITS)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "one more than its permits"
    );
    for g in full {
        assert!(g.release().await.unwrap());
    }
    // Taking two of three permits leaves room for one, not two.
    let c = fx.client().await;
    let two = c
        .semaphore(&name, PERMITS)
        .unwrap()
        .permits(2)
        .acquire()
        .await
        .unwrap();
    assert!(
        c.semaphore(&name, PERMITS)
            .unwrap()
            .permits(2)
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    let one = c
        .semaphore(&name, PERMITS)
        .unwrap()
        .try_acquire()
        .await
        .unwrap();
    assert!(one.is_some());
    assert!(
        c.semaphore(&name, PERMITS)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    // A request that counts another number of permits than the holders
    // is refused with a clear error, and takes nothing: letting it in
    // would let it walk past the others' limit.
    for other in [PERMITS + 2, 1] {
        let e = c
            .semaphore(&name, other)
            .unwrap()
            .try_acquire()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains(&format!("{PERMITS} permits")), "{e}");
    }
    assert_eq!(c.status(&name).await.unwrap().holders.len(), 2);
    drop(two);
}

/// Versioned compare-and-set: only the writer that read the current
/// version gets in, and concurrent read-modify-write loops from several
/// clients lose no update.
pub async fn versioned_values_lose_no_update(fx: &Fixture) {
    let name = unique("ver");
    let (a, b) = fx.two_clients().await;
    let va = a.versioned(&name).unwrap();
    assert_eq!(va.read().await.unwrap(), None);
    assert!(
        !va.compare_and_set(3, "x").await.unwrap(),
        "a version that never was"
    );
    assert_eq!(
        va.read().await.unwrap(),
        None,
        "a refused compare-and-set leaves nothing behind"
    );
    assert!(va.compare_and_set(0, "0").await.unwrap());
    assert!(
        !b.versioned(&name)
            .unwrap()
            .compare_and_set(0, "y")
            .await
            .unwrap(),
        "a second create"
    );
    let (tasks, each) = (4, 10);
    let mut joins = Vec::new();
    for i in 0..tasks {
        let v = if i % 2 == 0 { &a } else { &b }.versioned(&name).unwrap();
        joins.push(tokio::spawn(async move {
            for _ in 0..each {
                v.update(|old| {
                    let n: i64 = std::str::from_utf8(old.expect("created"))
                        .unwrap()
                        .parse()
                        .unwrap();
                    Ok((n + 1).to_string().into_bytes())
                })
                .await
                .unwrap();
            }
        }));
    }
    for j in joins {
        j.await.unwrap();
    }
    let end = b.versioned(&name).unwrap().read().await.unwrap().unwrap();
    let n = (tasks * each) as u64;
    assert_eq!(end.value, n.to_string().into_bytes(), "lost updates");
    assert_eq!(end.version, n + 1);
    assert!(!va.compare_and_set(n, "stale").await.unwrap());
    assert!(va.compare_and_set(n + 1, "last").await.unwrap());
    let bad = va
        .update(|_| Err(fenced::Error::new(ErrorKind::InvalidInput, "no")))
        .await;
    assert_eq!(bad.unwrap_err().kind(), ErrorKind::InvalidInput);
}

/// The register takes equal or higher tokens and refuses lower ones.
pub async fn fenced_register_rejects_stale_tokens(fx: &Fixture) {
    let c = fx.client().await;
    let reg = c.register(&unique("reg")).unwrap();
    assert_eq!(reg.read().await.unwrap(), None);
    reg.write_with_token(10, "a").await.unwrap();
    reg.write_with_token(10, "b").await.unwrap();
    reg.write_with_token(11, "5").await.unwrap();
    let e = reg.write_with_token(9, "stale").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StaleToken);
    assert_eq!(reg.read().await.unwrap(), Some((b"5".to_vec(), 11)));
    assert_eq!(reg.try_decrement(2).await.unwrap(), Some(3));
    assert_eq!(reg.try_decrement(4).await.unwrap(), None);
    assert_eq!(reg.read_i64().await.unwrap(), Some(3));
    // Tokens past 2^53 (where a double stops counting by one) are told
    // apart exactly: the lower one is stale.
    let big = c.register(&unique("reg-big")).unwrap();
    let top = (1u64 << 53) + 2;
    big.write_with_token(top, "a").await.unwrap();
    let e = big.write_with_token(top - 1, "stale").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StaleToken, "{e}");
    assert_eq!(big.read().await.unwrap(), Some((b"a".to_vec(), top)));
    reg.write_unfenced("7").await.unwrap();
    assert_eq!(
        reg.read().await.unwrap(),
        Some((b"7".to_vec(), 11)),
        "unfenced keeps the fence"
    );
    assert_eq!(
        c.register(&unique("none"))
            .unwrap()
            .try_decrement(1)
            .await
            .unwrap(),
        None
    );
}

/// A MultiLock takes all or nothing and rolls back what it took.
pub async fn multilock_is_all_or_nothing(fx: &Fixture) {
    let t = Timing::default();
    let (x, y) = (unique("mlx"), unique("mly"));
    let (a, b) = fx.two_clients().await;
    let held_y = b.mutex(&y).unwrap().acquire().await.unwrap();
    let multi = MultiLock::new([a.mutex(&y).unwrap(), a.mutex(&x).unwrap()]);
    assert!(multi.try_acquire().await.unwrap().is_none());
    assert!(multi.acquire_timeout(t.ms(100)).await.unwrap().is_none());
    assert!(
        a.status(&x).await.unwrap().is_free(),
        "rolled back: x must not stay held"
    );
    assert!(held_y.release().await.unwrap());
    let both = multi.acquire().await.unwrap();
    assert!(both.is_held());
    assert!(b.mutex(&x).unwrap().try_acquire().await.unwrap().is_none());
    assert!(both.release().await.unwrap());
    assert!(b.status(&x).await.unwrap().is_free() && b.status(&y).await.unwrap().is_free());
}

/// A lock a MultiLock took first and lost while it waited for the next is
/// taken again: a MultiGuard never starts out lost (the simulation's
/// finding: it used to come back with the lost lock in it).
pub async fn multilock_retakes_a_lock_lost_while_waiting(fx: &Fixture) {
    let t = Timing::default();
    let (x, y) = (unique("mlr-a"), unique("mlr-b"));
    let (a, b) = fx.two_clients().await;
    let held_y = b.mutex(&y).unwrap().acquire().await.unwrap();
    // x comes first (MultiLock takes locks by name), on a lease nothing
    // renews, which runs out while y is awaited.
    let lease = Duration::from_secs(2);
    let multi = MultiLock::new([
        a.mutex(&y).unwrap(),
        a.mutex(&x).unwrap().fixed_lease(lease),
    ]);
    assert_eq!(multi.locks()[0].name(), x);
    let waiting = tokio::spawn(async move { multi.acquire().await });
    tokio::time::sleep(lease * 2).await;
    assert!(held_y.release().await.unwrap());
    let both = timeout(t.ms(30_000), waiting)
        .await
        .expect("the MultiLock got both once y was free")
        .unwrap()
        .unwrap();
    assert!(
        both.is_held(),
        "a MultiGuard started out with a lock lost while it waited"
    );
    let _ = both.release().await;
}

/// Segments of a striped lock are independent locks.
pub async fn striped_segments_are_independent(fx: &Fixture) {
    let name = unique("stripe");
    let (a, b) = fx.two_clients().await;
    let sa = a.striped(&name, 4).unwrap();
    let sb = b.striped(&name, 4).unwrap();
    let g0 = sa.segment(0).unwrap().acquire().await.unwrap();
    assert!(
        sb.segment(0)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        sb.segment(1)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(sa.index_for("order-7"), sb.index_for("order-7"));
    assert!(sa.segment(4).is_err());
    drop(g0);
}

/// Bad input: a clear error naming the value, before any I/O, nothing held.
pub async fn bad_input_is_refused(fx: &Fixture) {
    let c = fx.client().await;
    let invalid = |r: fenced::Result<_>| r.map(|_: ()| ()).unwrap_err().kind();
    assert_eq!(invalid(c.mutex("").map(drop)), ErrorKind::InvalidInput);
    assert_eq!(
        invalid(c.mutex(&"n".repeat(fenced::MAX_NAME_LEN + 1)).map(drop)),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        invalid(c.mutex("a\u{0}b").map(drop)),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        invalid(c.semaphore("s", 0).map(drop)),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        invalid(c.striped("s", 0).map(drop)),
        ErrorKind::InvalidInput
    );
    let name = unique("bad");
    let lock = c.mutex(&name).unwrap();
    for bad in [
        lock.clone().lease(Duration::ZERO),
        lock.clone()
            .fixed_lease(Duration::from_secs(400 * 24 * 3600)),
    ] {
        let e = bad.try_acquire().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    }
    let e = c
        .semaphore(&name, 2)
        .unwrap()
        .permits(3)
        .acquire()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot take 3"), "{e}");
    let e = lock
        .clone()
        .lease(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("lease"), "{e}");
    assert!(
        c.status(&name).await.unwrap().is_free(),
        "bad input must not touch the lock"
    );
    for url in ["nope://x", "no-scheme-at-all", "sqlite://"] {
        let e = fenced::Client::connect(url).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{url}: {e}");
    }
    // Numbers at the edge of their type: a clear error or the plain
    // meaning (a wait longer than any clock is a wait for ever), never a
    // panic.
    let g = lock
        .acquire_timeout(Duration::MAX)
        .await
        .unwrap()
        .expect("free");
    assert!(g.release().await.unwrap());
    let g = lock
        .clone()
        .wait_timeout(Duration::MAX)
        .acquire()
        .await
        .unwrap();
    assert!(g.release().await.unwrap());
    let multi = MultiLock::new([lock.clone()]);
    let both = multi.acquire_timeout(Duration::MAX).await.unwrap();
    assert!(both.expect("free").release().await.unwrap());
    // A register and a versioned value share one record: a fence at the
    // top of u64 (where the backend takes it) is a version with no
    // successor, refused rather than wrapped.
    let edge = unique("ver-edge");
    let stored = c
        .register(&edge)
        .unwrap()
        .write_with_token(u64::MAX, "x")
        .await;
    let v = c.versioned(&edge).unwrap();
    match (stored, v.compare_and_set(u64::MAX, "y").await) {
        (Ok(()), Err(e)) | (Err(_), Err(e)) => assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}"),
        (Err(_), Ok(false)) => {}
        (w, cas) => panic!("fence u64::MAX: write {w:?}, compare-and-set {cas:?}"),
    }
    let reg = c.register(&unique("reg-edge")).unwrap();
    reg.write_unfenced(i64::MIN.to_string()).await.unwrap();
    match reg.try_decrement(i64::MAX).await {
        Ok(None) => {}
        // Redis counts in doubles and refuses what it cannot count exactly.
        Err(e) if e.kind() == ErrorKind::InvalidInput => {}
        other => panic!("decrementing i64::MIN by i64::MAX: {other:?}"),
    }
    for policy in [
        fenced::RetryPolicy::NTimes {
            times: 1000,
            sleep: Duration::ZERO,
        },
        fenced::RetryPolicy::OneTime {
            sleep: Duration::MAX,
        },
    ] {
        let e = lock.clone().retry(policy).try_acquire().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    }
    assert!(c.status(&name).await.unwrap().is_free());
}

/// 8 `fenced run` processes increment a counter file 120 times each
/// under one lock (`FENCED_TEST_PROCESS_ROUNDS` for more): the total is
/// exact. Each round is a whole process, so the rounds cost CI minutes;
/// the torture suite covers contention in depth.
pub async fn processes_exclude_each_other(fx: &Fixture) {
    const PROCS: usize = 8;
    let rounds: usize = std::env::var("FENCED_TEST_PROCESS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let bin = fx
        .fenced_bin
        .clone()
        .expect("processes tests need the fenced binary");
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    std::fs::write(&counter, "0\n").unwrap();
    let name = unique("proc");
    let script = format!(
        "n=$(cat '{0}'); echo $((n + 1)) > '{0}.tmp' && mv '{0}.tmp' '{0}'",
        counter.display()
    );
    let mut workers = Vec::new();
    for _ in 0..PROCS {
        let (bin, url, name, script) = (bin.clone(), fx.url.clone(), name.clone(), script.clone());
        workers.push(tokio::task::spawn_blocking(move || {
            for _ in 0..rounds {
                let out = std::process::Command::new(&bin)
                    .args(["run", "--backend", &url, &name, "--", "sh", "-c", &script])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "fenced run failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let total: usize = std::fs::read_to_string(&counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(total, PROCS * rounds);
    assert!(fx.client().await.status(&name).await.unwrap().is_free());
}

/// Processes that add to one counter and take IDs from one sequence
/// through the `fenced` command at once: no add is lost, no ID is handed
/// out twice, and each process's IDs rise.
pub async fn processes_share_counters_and_sequences(fx: &Fixture) {
    const PROCS: usize = 8;
    const ROUNDS: usize = 10;
    let bin = fx
        .fenced_bin
        .clone()
        .expect("processes tests need the fenced binary");
    let (hits, ids) = (unique("hits"), unique("ids"));
    let script = format!(
        "for i in $(seq {ROUNDS}); do \"$0\" --backend \"$1\" counter {hits} add 1 >/dev/null || exit 1; \
         \"$0\" --backend \"$1\" seq {ids} next -n 3 || exit 1; done"
    );
    let workers: Vec<_> = (0..PROCS)
        .map(|_| {
            std::process::Command::new("sh")
                .args(["-c", &script, &bin.display().to_string(), &fx.url])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        let out = tokio::task::spawn_blocking(move || w.wait_with_output().unwrap())
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Vec<u64> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "rising: {got:?}");
        all.extend(got);
    }
    let client = fx.client().await;
    assert_eq!(
        client.counter(&hits).unwrap().get().await.unwrap(),
        (PROCS * ROUNDS) as i64,
        "no add lost"
    );
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        (n, all.len()),
        (PROCS * ROUNDS * 3, PROCS * ROUNDS * 3),
        "no ID twice"
    );
}

/// `fenced queue` takers in three processes, beside one killed with
/// SIGKILL while it held an item: every item is run exactly once by the
/// live takers, the killed one's after its lease ended.
pub async fn processes_share_a_queue(fx: &Fixture) {
    const ITEMS: usize = 9;
    const TAKERS: usize = 3;
    let t = Timing::default();
    let bin = fx
        .fenced_bin
        .clone()
        .expect("processes tests need the fenced binary");
    let name = unique("jobs");
    let client = fx.client().await;
    let queue = client.queue(&name).unwrap();
    queue.push("victim").await.unwrap();
    let mut victim = std::process::Command::new(&bin)
        .args([
            "--backend",
            &fx.url,
            "queue",
            &name,
            "take",
            "--lease",
            "1s",
        ])
        .args(["--", "sleep", "600"])
        .spawn()
        .unwrap();
    let first = client.versioned(&format!("{name}:item:1")).unwrap();
    t.wait_until("the victim takes the first item", || async {
        let v = first.read().await.unwrap();
        v.is_some_and(|v| v.value.starts_with(b"t"))
    })
    .await;
    victim.kill().unwrap();
    victim.wait().unwrap();
    for i in 0..ITEMS {
        queue.push(format!("item-{i}")).await.unwrap();
    }
    // Each taker runs items until none is waiting or taken: bounded.
    let script = "for i in $(seq 300); do \
         [ \"$(\"$0\" --backend \"$1\" queue \"$2\" len)\" = 0 ] && exit 0; \
         \"$0\" --backend \"$1\" queue \"$2\" take -w 1 -- sh -c 'cat; echo'; \
         c=$?; [ $c = 0 ] || [ $c = 75 ] || exit $c; done; exit 1";
    let takers: Vec<_> = (0..TAKERS)
        .map(|_| {
            std::process::Command::new("sh")
                .args(["-c", script, &bin.display().to_string(), &fx.url, &name])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ran = Vec::new();
    for w in takers {
        let out = tokio::task::spawn_blocking(move || w.wait_with_output().unwrap())
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "a taker never saw the queue empty: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ran.extend(
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(str::to_owned),
        );
    }
    ran.sort();
    let mut want: Vec<String> = (0..ITEMS).map(|i| format!("item-{i}")).collect();
    want.push("victim".to_owned());
    want.sort();
    assert_eq!(
        ran, want,
        "every item run once, the victim's after its lease"
    );
}

/// A `fenced run` holder killed with SIGKILL frees the lock when its lease ends.
pub async fn killed_holder_process_frees_lock(fx: &Fixture) {
    let t = Timing::default();
    let bin = fx
        .fenced_bin
        .clone()
        .expect("processes tests need the fenced binary");
    let name = unique("kill");
    let c = fx.client().await;
    let mut child = crate::process::spawn_run(
        &bin,
        &fx.url,
        &name,
        &["--lease", "600ms"],
        &["sleep", "60"],
    );
    t.wait_until("the child never took the lock", || async {
        !c.status(&name).await.unwrap().is_free()
    })
    .await;
    let lock = c.mutex(&name).unwrap();
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "held by the child"
    );
    crate::process::kill_group(&mut child);
    // Its keys outlive it by its session, on backends that have one.
    let got = lock
        .acquire_timeout(t.eventually() + fx.session_timeout())
        .await
        .unwrap();
    assert!(got.is_some(), "a killed holder's lease must free the lock");
}

/// A work queue: every item pushed by tasks of two clients is taken
/// exactly once by takers of both (three of them sharing one handle), in
/// push order for one taker; an item given back or dropped comes back
/// with a higher token; a taker that died gives its item back when its
/// lease ends; and once every item is finished nothing is left behind.
pub async fn queues_deliver_every_item_leased(fx: &Fixture) {
    const PUSHERS: usize = 4;
    const EACH: usize = 10;
    let hang = Duration::from_secs(60);
    let (a, b) = fx.two_clients().await;

    // Bad input: refused, nothing pushed.
    let name = unique("queue");
    let q = a.queue(&name).unwrap();
    let e = q
        .push(vec![0u8; fenced::MAX_ITEM_LEN + 1])
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let e = a.queue(&"q".repeat(fenced::MAX_NAME_LEN)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(
        q.try_take().await.unwrap().is_none(),
        "an empty queue gave an item"
    );
    assert_eq!(q.len().await.unwrap(), 0);

    // One taker gets the items in push order.
    for i in 0..5 {
        q.push(format!("fifo-{i}")).await.unwrap();
    }
    for i in 0..5 {
        let item = q.take_timeout(hang).await.unwrap().expect("an item");
        assert_eq!(item.payload(), format!("fifo-{i}").as_bytes());
        assert_eq!(item.deliveries(), 1);
        item.ack().await.unwrap();
    }

    // Pushers and takers of both clients at once: three takers share a's
    // handle, three have handles of their own on b.
    let taken = Arc::new(std::sync::Mutex::new(Vec::new()));
    let shared = a.queue(&name).unwrap();
    let mut takers = Vec::new();
    for t in 0..6 {
        let q = if t < 3 {
            shared.clone()
        } else {
            b.queue(&name).unwrap()
        };
        let taken = taken.clone();
        takers.push(tokio::spawn(async move {
            let until = tokio::time::Instant::now() + hang;
            while taken.lock().unwrap().len() < PUSHERS * EACH {
                assert!(tokio::time::Instant::now() < until, "items never came");
                let Some(item) = q.take_timeout(Duration::from_millis(200)).await.unwrap() else {
                    continue;
                };
                assert_eq!(
                    item.deliveries(),
                    1,
                    "nothing failed, yet an item came again"
                );
                taken.lock().unwrap().push(item.payload().to_vec());
                item.ack().await.unwrap();
            }
        }));
    }
    let mut pushers = Vec::new();
    for p in 0..PUSHERS {
        let q = if p % 2 == 0 { &a } else { &b }.queue(&name).unwrap();
        pushers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..EACH {
                ids.push(q.push(format!("{p}-{i}")).await.unwrap());
            }
            ids
        }));
    }
    for p in pushers {
        let ids = p.await.unwrap();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "one pusher's ids fell: {ids:?}"
        );
    }
    for t in takers {
        t.await.unwrap();
    }
    let mut got = std::mem::take(&mut *taken.lock().unwrap());
    got.sort();
    let mut want: Vec<Vec<u8>> = (0..PUSHERS)
        .flat_map(|p| (0..EACH).map(move |i| format!("{p}-{i}").into_bytes()))
        .collect();
    want.sort();
    assert_eq!(got, want, "every item exactly once");

    // Given back, then dropped: it comes back, its token higher each time.
    q.push("again").await.unwrap();
    let first = q.take_timeout(hang).await.unwrap().expect("an item");
    let token = first.fencing_token();
    assert!(first.release().await.unwrap());
    let second = b
        .queue(&name)
        .unwrap()
        .take_timeout(hang)
        .await
        .unwrap()
        .expect("given back");
    assert_eq!((second.payload(), second.deliveries()), (&b"again"[..], 2));
    assert!(second.fencing_token() > token);
    let token = second.fencing_token();
    drop(second);
    let third = q
        .take_timeout(hang)
        .await
        .unwrap()
        .expect("dropped, so given back");
    assert_eq!(third.deliveries(), 3);
    assert!(third.fencing_token() > token);
    third.ack().await.unwrap();

    // A taker that dies holding an item: its runtime ends (no watchdog,
    // no release) and then its connections close, as a killed process's
    // do; the item comes back once its lease has ended.
    q.push("orphan").await.unwrap();
    let (url, queue) = (a.url().to_owned(), name.clone());
    let token = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (token, dead) = rt.block_on(async {
            let c = fenced::Client::connect(&url).await.unwrap();
            let q = c.queue(&queue).unwrap().lease(Duration::from_millis(500));
            let item = q.take_timeout(hang).await.unwrap().expect("an item");
            assert_eq!(item.payload(), b"orphan");
            (item.fencing_token(), (item, q, c))
        });
        rt.shutdown_background();
        drop(dead);
        token
    })
    .join()
    .unwrap();
    let back = b
        .queue(&name)
        .unwrap()
        .take_timeout(hang)
        .await
        .unwrap()
        .expect("back after the lease");
    assert_eq!((back.payload(), back.deliveries()), (&b"orphan"[..], 2));
    assert!(back.fencing_token() > token);
    back.ack().await.unwrap();

    // Takes dropped at every await point, some after their write
    // landed: each item is still taken, exactly once, by this handle's
    // later takes, and the queue ends empty.
    let mut want = Vec::new();
    for i in 0..5 {
        want.push(format!("cancel-{i}").into_bytes());
        q.push(&want[i]).await.unwrap();
    }
    for i in 0..60u64 {
        let cut = Duration::from_micros(fastrand::u64(0..3_000) + i * 20);
        if let Ok(item) = timeout(cut, q.take()).await {
            drop(item.unwrap()); // given back in the background
        }
    }
    let mut got = Vec::new();
    for _ in 0..want.len() {
        let item = q
            .take_timeout(hang)
            .await
            .unwrap()
            .expect("an item lost to a cancelled take");
        got.push(item.payload().to_vec());
        item.ack().await.unwrap();
    }
    got.sort();
    assert_eq!(got, want, "every item once after the cancelled takes");

    // Holes: an id a pusher took and never wrote. One marked long ago is
    // given up by the next take; a fresh one is marked, and neither holds
    // back the items after it.
    // A pusher's first step: the next id from the tail, a register that
    // holds the last id as decimal text.
    let tail = a.versioned(&format!("{name}:tail")).unwrap();
    let take_id = || async {
        let next = tail
            .update(|v| {
                let n: u64 = std::str::from_utf8(v.unwrap_or(b"0"))
                    .unwrap()
                    .parse()
                    .unwrap();
                Ok((n + 1).to_string().into_bytes())
            })
            .await
            .unwrap();
        std::str::from_utf8(&next.value)
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let old = take_id().await;
    let old_hole = a.versioned(&format!("{name}:item:{old}")).unwrap();
    assert!(old_hole.compare_and_set(0, "w0").await.unwrap());
    let fresh = take_id().await;
    q.push("after the holes").await.unwrap();
    let item = q
        .take_timeout(hang)
        .await
        .unwrap()
        .expect("the item after the holes");
    assert_eq!(item.payload(), b"after the holes");
    item.ack().await.unwrap();
    let read = |id: u64| {
        let v = a.versioned(&format!("{name}:item:{id}")).unwrap();
        async move { v.read().await.unwrap().map(|v| v.value) }
    };
    assert_eq!(
        read(old).await.as_deref(),
        Some(&b"h"[..]),
        "the old hole was not given up"
    );
    let mark = read(fresh).await.expect("the fresh hole was not marked");
    assert!(mark.starts_with(b"w"), "{mark:?}");

    // Finished: nothing waits, and the items' registers are gone (swept
    // in the background, up to the fresh hole).
    assert_eq!(q.len().await.unwrap(), 0);
    assert!(q.try_take().await.unwrap().is_none());
    for id in [1, PUSHERS * EACH] {
        let item = a.versioned(&format!("{name}:item:{id}")).unwrap();
        Timing::default()
            .wait_until(&format!("item {id} swept"), || async {
                item.read().await.unwrap().is_none()
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    /// [`super::TESTS`] names every test in the suite's sources.
    #[test]
    fn every_test_is_listed() {
        let sources = [include_str!("mod.rs"), include_str!("faults.rs")];
        let mut found: Vec<&str> = sources
            .iter()
            .flat_map(|s| s.lines())
            .filter_map(|l| l.strip_prefix("pub async fn "))
            .filter_map(|l| l.split_once("(fx: &Fixture)").map(|(n, _)| n))
            .collect();
        found.sort_unstable();
        let mut listed = super::TESTS.to_vec();
        listed.sort_unstable();
        assert_eq!(found, listed);
    }

    #[test]
    fn a_backend_missing_a_test_is_incomplete() {
        let listing = super::TESTS
            .iter()
            .map(|t| format!("full::{t}: test\n"))
            .chain(["short::bad_input_is_refused: test\n".to_owned()])
            .collect::<String>();
        let gaps = super::incomplete(&listing);
        assert_eq!(gaps.len(), 1);
        assert_eq!(gaps[0].0, "short");
        assert!(!gaps[0].1.contains(&"bad_input_is_refused"));
    }
}
