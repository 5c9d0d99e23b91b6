//! The recipes fenced shares with Apache Curator on ZooKeeper, each way,
//! with the real Curator (Debian's libcurator-recipes-java): counters
//! (`DistributedAtomicLong`, `SharedCount`), the barrier
//! (`DistributedBarrier`) and elections (`LeaderLatch`). Every fenced
//! handle here has its default options.
#![cfg(feature = "zookeeper")]

use fenced::{Client, ErrorKind};
use fenced_testkit::interop::CuratorRecipes;
use fenced_testkit::servers::zookeeper::ZkEnsemble;
use fenced_testkit::{Timing, unique};

/// Runs `f` on the Curator driver in a blocking task, started now; its
/// answer gives both back.
fn curator<T: Send + 'static>(
    mut c: CuratorRecipes,
    f: impl FnOnce(&mut CuratorRecipes) -> T + Send + 'static,
) -> impl std::future::Future<Output = (CuratorRecipes, T)> {
    let task = tokio::task::spawn_blocking(move || {
        let t = f(&mut c);
        (c, t)
    });
    async move { task.await.unwrap() }
}

/// A fenced counter and a `DistributedAtomicLong` on its path are one
/// counter: each sees the other's adds, and adds made at once from both
/// sides are all counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_atomic_longs_are_fenced_counters() {
    let z = ZkEnsemble::start();
    let client = Client::connect(&z.url()).await.unwrap();
    let name = unique("dal");
    let path = format!("/{name}");
    let counter = client.counter(&name).unwrap();
    let mut java = CuratorRecipes::start(&z.connect_string());

    assert_eq!(java.ask(&format!("dal-add {path} 5")), "5");
    assert_eq!(counter.get().await.unwrap(), 5);
    assert_eq!(counter.add(3).await.unwrap(), 8);
    assert_eq!(java.ask(&format!("dal-get {path}")), "8");
    counter.set(-(1 << 40)).await.unwrap();
    assert_eq!(
        java.ask(&format!("dal-get {path}")),
        (-(1i64 << 40)).to_string()
    );
    counter.set(0).await.unwrap();

    // 200 adds from Curator while two fenced tasks add 100 each.
    let p = path.clone();
    let curator_adds = curator(java, move |j| {
        (0..200)
            .map(|_| j.ask(&format!("dal-add {p} 1")))
            .filter(|a| a.parse::<i64>().is_err())
            .collect::<Vec<_>>()
    });
    let fenced_adds = (0..2).map(|_| {
        let c = counter.clone();
        tokio::spawn(async move {
            for _ in 0..100 {
                c.add(1).await.unwrap();
            }
        })
    });
    let fenced_adds: Vec<_> = fenced_adds.collect();
    let (mut java, failed) = curator_adds.await;
    for t in fenced_adds {
        t.await.unwrap();
    }
    assert!(failed.is_empty(), "Curator's adds failed: {failed:?}");
    assert_eq!(counter.get().await.unwrap(), 400);
    assert_eq!(java.ask(&format!("dal-get {path}")), "400");

    // An older fenced kept a counter in its register: it goes on from
    // there, so an upgrade reissues no ID.
    let old = unique("dal");
    let register = client.versioned(&old).unwrap();
    assert!(register.compare_and_set(0, "41").await.unwrap());
    let moved = client.counter(&old).unwrap();
    assert_eq!(moved.get().await.unwrap(), 41);
    assert_eq!(moved.add(1).await.unwrap(), 42);
    assert_eq!(java.ask(&format!("dal-get /{old}")), "42");

    // A lock's node is a container the server deletes once empty: a
    // counter or barrier of its name is refused, not lost with it.
    let locked = unique("dal");
    let g = client.mutex(&locked).unwrap().acquire().await.unwrap();
    let e = client.counter(&locked).unwrap().add(1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let e = client.barrier(&locked).unwrap().is_set().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    g.release().await.unwrap();

    // A sequence over it hands out what Curator's adds do not.
    let seq = client.sequence(&name).unwrap();
    let a = seq.next().await.unwrap();
    assert_eq!(java.ask(&format!("dal-add {path} 1")), (a + 1).to_string());
    assert!(seq.next().await.unwrap() > a + 1);
    client.close().await;
}

/// A `SharedCount` and a fenced counter on one path: a counter made with
/// `int32()` is written in the SharedCount's 4 bytes, one Curator made
/// stays in 4 bytes under a plain fenced handle, changes wake watchers on
/// either side, and a value past 32 bits is refused with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_shared_counts_are_fenced_counters() {
    let t = Timing::default();
    let z = ZkEnsemble::start();
    let client = Client::connect(&z.url()).await.unwrap();
    let mut java = CuratorRecipes::start(&z.connect_string());

    // fenced makes it (32 bits), Curator reads and changes it.
    let name = unique("count");
    let path = format!("/{name}");
    let count = client.counter(&name).unwrap().int32();
    count.set(7).await.unwrap();
    assert_eq!(java.ask(&format!("count-get {path}")), "7");
    assert_eq!(java.ask(&format!("count-add {path} 5")), "12");
    assert_eq!(count.get().await.unwrap(), 12);
    assert_eq!(count.add(-2).await.unwrap(), 10);
    assert_eq!(java.ask(&format!("count-get {path}")), "10");
    count.set(i32::MAX.into()).await.unwrap();
    let e = count.add(1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert_eq!(java.ask(&format!("count-get {path}")), i32::MAX.to_string());

    // Curator makes it; a plain fenced counter keeps its 4 bytes.
    let name = unique("count");
    let path = format!("/{name}");
    assert_eq!(java.ask(&format!("count-set {path} 9")), "ok");
    let plain = client.counter(&name).unwrap();
    assert_eq!(plain.get().await.unwrap(), 9);
    assert_eq!(plain.add(1).await.unwrap(), 10);
    assert_eq!(java.ask(&format!("count-get {path}")), "10");
    let e = plain.add(i64::from(i32::MAX)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert_eq!(java.ask(&format!("count-get {path}")), "10");

    // A Curator change wakes a fenced watch.
    let mut watch = plain.watch().await.unwrap();
    assert_eq!(watch.value(), 10);
    assert_eq!(java.ask(&format!("count-set {path} 11")), "ok");
    let seen = tokio::time::timeout(t.eventually(), watch.changed())
        .await
        .expect("Curator's write wakes the fenced watch")
        .unwrap();
    assert_eq!(seen, 11);

    // A fenced change wakes a Curator listener.
    let p = path.clone();
    let waiting = curator(java, move |j| {
        // "saw 42" at once if the write came first (the wait then proves
        // only the read); else the listener's wake-up.
        let first = j.ask(&format!("count-wait {p} 42 10000"));
        if first == "watching" { j.line() } else { first }
    });
    // Most often the listener is in place by then.
    tokio::time::sleep(t.ms(300)).await;
    plain.set(42).await.unwrap();
    let (_java, said) = waiting.await;
    assert_eq!(said, "saw 42");
    client.close().await;
}

/// A fenced barrier and a `DistributedBarrier` on one path are one
/// barrier: each side's waiter is held while the other side has it set,
/// and goes on when the other side removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_barriers_are_fenced_barriers() {
    let t = Timing::default();
    let z = ZkEnsemble::start();
    let client = Client::connect(&z.url()).await.unwrap();
    let name = unique("barrier");
    let path = format!("/{name}");
    let barrier = client.barrier(&name).unwrap();
    let mut java = CuratorRecipes::start(&z.connect_string());

    // fenced sets it; Curator waits until fenced removes it.
    barrier.set().await.unwrap();
    assert_eq!(java.ask(&format!("barrier-wait {path} 300")), "waiting");
    assert_eq!(
        java.line(),
        "timeout",
        "Curator passed a set fenced barrier"
    );
    let p = path.clone();
    let waiting = curator(java, move |j| {
        assert_eq!(j.ask(&format!("barrier-wait {p} 10000")), "waiting");
        j.line()
    });
    tokio::time::sleep(t.ms(200)).await;
    barrier.remove().await.unwrap();
    let (mut java, said) = waiting.await;
    assert_eq!(said, "passed");

    // Curator sets it; fenced waits until Curator removes it.
    assert_eq!(java.ask(&format!("barrier-set {path}")), "ok");
    assert!(barrier.is_set().await.unwrap());
    assert!(!barrier.wait_timeout(t.ms(200)).await.unwrap());
    let waiter = {
        let b = client.barrier(&name).unwrap();
        tokio::spawn(async move { b.wait_timeout(t.eventually()).await })
    };
    tokio::time::sleep(t.ms(200)).await;
    assert_eq!(java.ask(&format!("barrier-remove {path}")), "ok");
    assert!(
        waiter.await.unwrap().unwrap(),
        "Curator's removal frees fenced"
    );
    assert!(!barrier.is_set().await.unwrap());
    client.close().await;
}

/// A fenced election and a `LeaderLatch` on one path are one election:
/// candidates of both queue in one line, each side sees the other's
/// leader and its value (a latch's id; a fenced leader's proclamation),
/// and each side's candidate leads when the other's leader lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_leader_latches_are_fenced_elections() {
    let t = Timing::default();
    let z = ZkEnsemble::start();
    let client = Client::connect(&z.url()).await.unwrap();
    let name = unique("latch");
    let path = format!("/{name}");
    let election = client.election(&name).unwrap();
    let mut java = CuratorRecipes::start(&z.connect_string());

    // Curator leads; fenced sees it, and waits behind it.
    assert_eq!(java.ask(&format!("latch-start {path} java-a")), "started");
    assert_eq!(java.ask("latch-await java-a 10000"), "leader");
    let leader = election.leader().await.unwrap().expect("Curator's leader");
    assert_eq!(leader.value, b"java-a");
    assert!(election.try_campaign("fenced-b").await.unwrap().is_none());
    let mut watch = election.observe().await.unwrap();
    assert_eq!(
        watch.leader().map(|l| l.value.clone()),
        Some(b"java-a".to_vec())
    );
    let campaign = {
        let e = client.election(&name).unwrap();
        tokio::spawn(async move { e.campaign("fenced-b").await })
    };
    t.wait_until(
        "the fenced candidate queues behind Curator's leader",
        || async { election.participants().await.unwrap().waiting == 1 },
    )
    .await;
    assert_eq!(java.ask("latch-has java-a"), "true");

    // Curator's leader lets go: the fenced candidate leads and proclaims.
    assert_eq!(java.ask("latch-close java-a"), "closed");
    let leading = tokio::time::timeout(t.eventually(), campaign)
        .await
        .expect("Curator's close hands the lead to fenced")
        .unwrap()
        .unwrap();
    assert!(leading.is_leader());
    assert!(leading.guard().fencing_token() > leader.token);
    let seen = loop {
        let l = tokio::time::timeout(t.eventually(), watch.changed())
            .await
            .expect("the observer is woken")
            .unwrap();
        if l.as_ref().is_some_and(|l| l.value == b"fenced-b") {
            break l.unwrap();
        }
    };
    assert_eq!(seen.token, leading.guard().fencing_token());
    assert_eq!(java.ask(&format!("latch-leader {path}")), "fenced-b");

    // A Curator candidate waits behind fenced's leader, then leads.
    assert_eq!(java.ask(&format!("latch-start {path} java-c")), "started");
    assert_eq!(java.ask("latch-await java-c 300"), "timeout");
    assert_eq!(java.ask("latch-has java-c"), "false");
    assert_eq!(java.ask(&format!("latch-ids {path}")), "fenced-b,java-c");
    assert!(leading.resign().await.unwrap());
    assert_eq!(java.ask("latch-await java-c 10000"), "leader");
    let leader = election
        .leader()
        .await
        .unwrap()
        .expect("Curator leads again");
    assert_eq!(leader.value, b"java-c");
    assert_eq!(java.ask("latch-close java-c"), "closed");
    client.close().await;
}

/// A fenced semaphore and an `InterProcessSemaphoreV2` on one path share
/// its permits: Curator's leases and fenced's holds add up to the size,
/// a hold of several permits counts as that many leases, and each side's
/// waiter gets a permit when the other side lets one go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_semaphores_share_permits_with_fenced() {
    let t = Timing::default();
    let z = ZkEnsemble::start();
    let client = Client::connect(&z.url()).await.unwrap();
    let name = unique("sem");
    let path = format!("/{name}");
    let pool = client.semaphore(&name, 2).unwrap();
    let mut java = CuratorRecipes::start(&z.connect_string());

    // One permit each: full.
    let a = pool.acquire().await.unwrap();
    assert_eq!(
        java.ask(&format!("sem-acquire {path} 2 j1 10000")),
        "acquired"
    );
    assert!(
        pool.try_acquire().await.unwrap().is_none(),
        "a third permit of two"
    );
    assert_eq!(java.ask(&format!("sem-acquire {path} 2 j2 300")), "timeout");
    let st = client.status(&name).await.unwrap();
    assert_eq!(st.holders.len(), 2, "{st:?}");

    // A fenced waiter gets the permit Curator lets go.
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.acquire_timeout(t.eventually()).await })
    };
    t.wait_until("the fenced waiter queues", || async {
        client.status(&name).await.unwrap().waiters == 1
    })
    .await;
    assert_eq!(java.ask("sem-release j1"), "released");
    let b = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("Curator's release frees a permit for fenced");
    assert!(b.fencing_token() > a.fencing_token());

    // A Curator waiter gets the permit fenced lets go.
    let p = path.clone();
    let waiting = curator(java, move |j| j.ask(&format!("sem-acquire {p} 2 j3 10000")));
    t.wait_until("Curator queues", || async {
        client.status(&name).await.unwrap().waiters == 1
    })
    .await;
    assert!(a.release().await.unwrap());
    let (mut java, said) = waiting.await;
    assert_eq!(said, "acquired");
    assert!(pool.try_acquire().await.unwrap().is_none());
    assert!(b.release().await.unwrap());
    assert_eq!(java.ask("sem-release j3"), "released");

    // Two permits of three are two leases to Curator.
    let big = client.semaphore(&name, 3).unwrap();
    assert_eq!(
        java.ask(&format!("sem-acquire {path} 3 j4 10000")),
        "acquired"
    );
    let two = big
        .clone()
        .permits(2)
        .try_acquire()
        .await
        .unwrap()
        .expect("1 + 2 of 3");
    assert_eq!(java.ask(&format!("sem-acquire {path} 3 j5 300")), "timeout");
    assert!(big.try_acquire().await.unwrap().is_none());
    assert!(two.release().await.unwrap());
    assert_eq!(
        java.ask(&format!("sem-acquire {path} 3 j5 10000")),
        "acquired"
    );
    assert_eq!(
        java.ask(&format!("sem-acquire {path} 3 j6 10000")),
        "acquired"
    );
    assert_eq!(java.ask("sem-release j4"), "released");
    assert_eq!(java.ask("sem-release j5"), "released");
    assert_eq!(java.ask("sem-release j6"), "released");
    t.wait_until("nothing is left held", || async {
        client.status(&name).await.unwrap().is_free()
    })
    .await;
    client.close().await;
}

/// Fenced members and a `DistributedDoubleBarrier` member on one path are
/// one group: nobody passes `enter` before the last of the three is in,
/// whichever side it is on, nor `leave` before the last is out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_double_barriers_count_fenced_members() {
    let t = Timing::default();
    let z = ZkEnsemble::start();
    let (a, b) = (
        Client::connect(&z.url()).await.unwrap(),
        Client::connect(&z.url()).await.unwrap(),
    );
    let name = unique("double");
    let path = format!("/{name}");
    let java = CuratorRecipes::start(&z.connect_string());
    let inside = |n: usize| {
        let (a, name) = (a.clone(), name.clone());
        async move {
            t.wait_until(&format!("{n} members inside"), || async {
                a.status(&name).await.unwrap().holders.len() == n
            })
            .await;
        }
    };

    let first = {
        let barrier = a.double_barrier(&name, 3).unwrap();
        tokio::spawn(async move { barrier.enter().await })
    };
    inside(1).await;
    let p = path.clone();
    let curator_in = curator(java, move |j| {
        j.ask(&format!("dbarrier-enter {p} 3 j 20000"))
    });
    inside(2).await;
    tokio::time::sleep(t.ms(200)).await;
    assert!(
        !first.is_finished(),
        "a fenced member passed with 2 of 3 in"
    );
    let last = b.double_barrier(&name, 3).unwrap().enter().await.unwrap();
    let first = tokio::time::timeout(t.eventually(), first)
        .await
        .expect("the last member lets the first in")
        .unwrap()
        .unwrap();
    let (java, said) = curator_in.await;
    assert_eq!(said, "entered");

    // Leaving: Curator's member and the first wait for the last.
    let curator_out = curator(java, |j| j.ask("dbarrier-leave j 20000"));
    let first_out = tokio::spawn(async move { first.leave().await });
    tokio::time::sleep(t.ms(300)).await;
    assert!(!first_out.is_finished(), "a member left before the last");
    assert!(last.leave_timeout(t.eventually()).await.unwrap());
    tokio::time::timeout(t.eventually(), first_out)
        .await
        .expect("the first member leaves")
        .unwrap()
        .unwrap();
    let (_java, said) = curator_out.await;
    assert_eq!(said, "left");
    t.wait_until("nothing is left", || async {
        a.status(&name).await.unwrap().is_free()
    })
    .await;

    // A round whose members all went without leaving leaves its `ready`
    // behind: it lets no later member in alone, and the next round fills.
    let left = unique("double");
    let (x, y) = tokio::join!(
        async { a.double_barrier(&left, 2).unwrap().enter().await.unwrap() },
        async { b.double_barrier(&left, 2).unwrap().enter().await.unwrap() },
    );
    drop((x, y));
    t.wait_until("the dropped members' nodes go", || async {
        a.status(&left).await.unwrap().is_free()
    })
    .await;
    let alone = a.double_barrier(&left, 2).unwrap();
    assert!(
        alone.enter_timeout(t.ms(300)).await.unwrap().is_none(),
        "a leftover ready let a lone member in"
    );
    let (x, y) = tokio::join!(
        async { a.double_barrier(&left, 2).unwrap().enter().await.unwrap() },
        async { b.double_barrier(&left, 2).unwrap().enter().await.unwrap() },
    );
    let (x, y) = tokio::join!(x.leave(), y.leave());
    x.unwrap();
    y.unwrap();
    a.close().await;
    b.close().await;
}
