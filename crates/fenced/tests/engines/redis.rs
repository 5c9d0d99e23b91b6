//! Redis beyond the conformance suite: interop with redis-py and with
//! Redisson's layout, RedLock with a master down, Sentinel failover, and
//! bad input and faults.

#![cfg(feature = "redis")]

use fenced::{Client, ErrorKind, RetryPolicy};
use fenced_testkit::interop::{redis_py, redis_py_try};
use fenced_testkit::servers::redis::{RedisMasters, RedisSentinel, RedisServer};
use fenced_testkit::{Timing, unique};
use nix::sys::signal::Signal;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

/// A plain connection to the server, for what fenced's API does not show.
fn raw_connection(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// fenced (`layout=simple`) and redis-py's `Lock` exclude each other on
/// the same key, whichever takes it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_lock_and_fenced_exclude_each_other() {
    let t = Timing::default();
    let server = RedisServer::start();
    let url = format!("{}?layout=simple", server.url());
    let c = Client::connect(&url).await.unwrap();
    let name = unique("py");

    // redis-py first.
    let mut py = redis_py(server.port, &name, &["hold", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(py.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held");
    let lock = c.mutex(&name).unwrap();
    assert!(
        lock.try_acquire().await.unwrap().is_none(),
        "redis-py holds it"
    );
    assert_eq!(c.status(&name).await.unwrap().holders.len(), 1);
    // Released by redis-py (no message is published): the fallback re-check finds it.
    let g = lock
        .acquire_timeout(t.eventually())
        .await
        .unwrap()
        .expect("free once redis-py releases");
    assert!(py.wait().unwrap().success());

    // fenced first.
    assert_eq!(redis_py_try(server.port, &name), "busy");
    assert!(g.release().await.unwrap());
    assert_eq!(redis_py_try(server.port, &name), "acquired");
}

/// While someone queues, a release names the queue's head on the head
/// owner's own channel (Redisson `RFairLock`'s `<channel>:<field>`), so
/// other processes sleep on; with nobody queued it publishes Redisson's
/// `0` on the lock's channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_queue_head_on_its_clients_channel() {
    let t = Timing::default();
    let server = RedisServer::start();
    let (holder, waiter) = fenced_testkit::two_clients(&server.url()).await;
    let name = unique("head");
    let who_waits = waiter.id().to_owned();
    let channel = format!("redisson_lock__channel:{{{name}}}");
    let mut sub = raw_connection(&server);
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe(format!("{channel}*")).unwrap();
    pubsub.set_read_timeout(Some(t.eventually())).unwrap();

    let g = holder.mutex(&name).unwrap().acquire().await.unwrap();
    let lock = waiter.mutex(&name).unwrap();
    let w = tokio::spawn(async move {
        let g = lock.acquire().await.unwrap();
        let token = g.fencing_token();
        assert!(g.release().await.unwrap());
        token
    });
    let queued = tokio::time::Instant::now() + t.eventually();
    while holder.status(&name).await.unwrap().waiters == 0 {
        assert!(
            tokio::time::Instant::now() < queued,
            "the waiter never queued"
        );
        tokio::time::sleep(t.ms(10)).await;
    }
    let mut con = raw_connection(&server);
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(format!("fenced_queue:{{{name}}}"))
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    let (ticket, who) = members[0].split_once('|').expect("<ticket>|<client>");
    assert_eq!(who, who_waits);
    let first = g.fencing_token();
    assert!(g.release().await.unwrap());
    let msg = pubsub.get_message().expect("the release publishes");
    assert_eq!(msg.get_channel_name(), format!("{channel}:{who_waits}"));
    assert_eq!(msg.get_payload::<String>().unwrap(), ticket);
    let token = tokio::time::timeout(t.eventually(), w)
        .await
        .expect("the head was woken")
        .unwrap();
    assert!(token > first);
    // The head's release leaves nobody queued: Redisson's `0`, for all.
    let msg = pubsub.get_message().expect("the head's release publishes");
    assert_eq!(msg.get_channel_name(), channel);
    assert_eq!(msg.get_payload::<String>().unwrap(), "0");
}

/// Many acquisitions of one client waiting on one lock share its two
/// channels (Redisson's and the client's own): every acquisition is its
/// own owner, and a channel per owner grew the subscriptions (on the
/// client and the server) by one per wait, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_of_one_client_share_its_channels() {
    const WAITERS: usize = 50;
    let t = Timing::default();
    let server = RedisServer::start();
    let (holder, waiter) = fenced_testkit::two_clients(&server.url()).await;
    let name = unique("manywaits");
    let g = holder.mutex(&name).unwrap().acquire().await.unwrap();
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let lock = waiter.mutex(&name).unwrap();
            tokio::spawn(async move { lock.acquire().await.unwrap().release().await.unwrap() })
        })
        .collect();
    t.wait_until("every acquisition queued", || async {
        holder.status(&name).await.unwrap().waiters == WAITERS
    })
    .await;
    let mut con = raw_connection(&server);
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("redisson_lock__channel:{{{name}}}*"))
        .query(&mut con)
        .unwrap();
    assert!(
        channels.len() <= 2,
        "{} channels: {channels:?}",
        channels.len()
    );
    assert!(g.release().await.unwrap());
    for task in tasks {
        assert!(task.await.unwrap());
    }
}

/// The default layout is Redisson `RLock`'s: a hash field
/// `<client id>:<owner id>` with the hold count and a PEXPIRE, released
/// with a publish of `0` on `redisson_lock__channel:{name}`. A holder
/// that follows Redisson's scripts (written here from its documented
/// layout) and fenced exclude each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_layout_on_the_wire() {
    let t = Timing::default();
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let name = unique("rsn");
    // The owner named, so that the test knows its field.
    let me = fenced::Owner::new();
    let field = format!("{}:{}", c.id(), me.id());
    let mut con = raw_connection(&server);
    let redisson_lock = redis::Script::new(
        "if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then \
           redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil end \
         return redis.call('pttl', KEYS[1])",
    );
    let redisson_unlock = redis::Script::new(
        "if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return nil end \
         if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then return 0 end \
         redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '0'); return 1",
    );
    let channel = format!("redisson_lock__channel:{{{name}}}");

    // fenced holds: the hash looks like Redisson's, and Redisson waits.
    let mut sub = raw_connection(&server);
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(&channel).unwrap();
    pubsub.set_read_timeout(Some(t.eventually())).unwrap();
    let g = c.mutex(&name).unwrap().owner(&me).acquire().await.unwrap();
    let count: Option<i64> = redis::cmd("HGET")
        .arg(&name)
        .arg(&field)
        .query(&mut con)
        .unwrap();
    assert_eq!(count, Some(1));
    let ttl: i64 = redis::cmd("PTTL").arg(&name).query(&mut con).unwrap();
    assert!(ttl > 0 && ttl <= 30_000, "PEXPIRE is the lease: {ttl}");
    let busy: Option<i64> = redisson_lock
        .key(&name)
        .arg(30_000)
        .arg("redisson-uuid:1")
        .invoke(&mut con)
        .unwrap();
    assert!(
        busy.is_some_and(|ms| ms > 0),
        "Redisson must see the lock held"
    );
    assert!(g.release().await.unwrap());
    let msg = pubsub.get_message().expect("fenced's release publishes");
    assert_eq!(msg.get_channel_name(), channel);
    assert_eq!(msg.get_payload::<String>().unwrap(), "0");
    drop(pubsub);

    // Redisson holds: fenced waits, sees the foreign holder, and takes
    // the lock when Redisson's unlock publishes.
    let got: Option<i64> = redisson_lock
        .key(&name)
        .arg(30_000)
        .arg("redisson-uuid:1")
        .invoke(&mut con)
        .unwrap();
    assert_eq!(got, None, "free after fenced's release");
    let lock = c.mutex(&name).unwrap();
    assert!(lock.try_acquire().await.unwrap().is_none());
    let st = c.status(&name).await.unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(st.holders[0].owner, "redisson-uuid:1");
    let waiter = tokio::spawn(async move { lock.acquire().await.map(|g| g.fencing_token()) });
    tokio::time::sleep(t.ms(100)).await;
    assert!(!waiter.is_finished());
    let released: Option<i64> = redisson_unlock
        .key(&name)
        .key(&channel)
        .arg("redisson-uuid:1")
        .invoke(&mut con)
        .unwrap();
    assert_eq!(released, Some(1));
    let token = tokio::time::timeout(t.eventually(), waiter)
        .await
        .expect("the waiter takes the lock after Redisson's unlock")
        .unwrap()
        .unwrap();
    assert!(token > 0);
}

/// A hold's record of its holder is the hash field `@<hold id>`, gone with
/// the hold. A record whose hold an older fenced cleared (it knows no
/// records) is forgotten by the next script, not taken for a holder; an
/// `@` field that is no record of ours is a foreign holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_records_on_the_wire() {
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let mut con = raw_connection(&server);
    let name = unique("rec");
    let fields = |con: &mut redis::Connection| -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = redis::cmd("HGETALL").arg(&name).query(con).unwrap();
        all.sort();
        all
    };
    let g = c.mutex(&name).unwrap().acquire().await.unwrap();
    let held = fields(&mut con);
    assert_eq!(held.len(), 3, "owner, ~hold, @record: {held:?}");
    let record = held
        .iter()
        .find(|(f, _)| f.starts_with('@'))
        .expect("@<hold id>");
    assert!(record.1.starts_with("fenced1 "), "{record:?}");
    assert!(
        held.iter()
            .any(|(f, _)| f[1..] == record.0[1..] && f.starts_with('~'))
    );
    assert!(g.release().await.unwrap());
    let exists: i64 = redis::cmd("EXISTS").arg(&name).query(&mut con).unwrap();
    assert_eq!(exists, 0, "the record goes with the hold");

    // A field put on the lock's hash by hand, for a minute.
    let plant = |con: &mut redis::Connection, field: &str, value: &str| {
        let _: () = redis::pipe()
            .cmd("HSET")
            .arg(&name)
            .arg(field)
            .arg(value)
            .cmd("PEXPIRE")
            .arg(&name)
            .arg(60_000)
            .query(con)
            .unwrap();
    };
    plant(&mut con, "@orphan", "fenced1 1 2 host cmd");
    let g = c.mutex(&name).unwrap().try_acquire().await.unwrap();
    let g = g.expect("an orphaned record holds nothing");
    assert!(fields(&mut con).iter().all(|(f, _)| f != "@orphan"));
    assert!(g.release().await.unwrap());

    plant(&mut con, "@someone", "not ours");
    let st = c.status(&name).await.unwrap();
    assert_eq!(st.holders.len(), 1, "{st:?}");
    assert_eq!(st.holders[0].owner, "@someone");
    assert!(
        c.mutex(&name)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
}

/// RedLock with one of three masters killed while a lock is held: the
/// holder keeps it (renewals reach a majority), nobody else gets it, and
/// after the release the next holder is granted by the remaining majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_stays_exclusive_with_a_master_down() {
    let t = Timing::default();
    let mut masters = RedisMasters::start(3);
    let (a, b) = fenced_testkit::two_clients(&masters.url()).await;
    let name = unique("rl");
    let g = fenced_testkit::hold(&a, &name, fenced::Lease::Renewed(t.ms(600))).await;
    let first = g.fencing_token();
    masters.servers[0].kill();
    let lock_b = b.mutex(&name).unwrap().retry(RetryPolicy::Never);
    // Longer than the lease: only renewals by a majority keep it held.
    for _ in 0..4 {
        assert!(lock_b.try_acquire().await.unwrap().is_none(), "two holders");
        tokio::time::sleep(t.ms(300)).await;
    }
    assert!(
        g.is_held(),
        "renewals on two of three masters keep the lock"
    );
    assert!(g.release().await.unwrap());
    let g2 = lock_b
        .acquire_timeout(t.eventually())
        .await
        .unwrap()
        .expect("granted by the two masters left");
    assert!(g2.fencing_token() > first);
    masters.servers[1].kill();
    let e = fenced_testkit::fails_at_once(&b, "rl2").await;
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("majority"), "{e}");
}

/// Sentinel: a planned failover keeps the lock (the grant had reached the
/// replicas) and clients follow the new master; a master that dies before
/// its replicas saw a grant loses it, which `min_replicas` prevents by
/// refusing grants the replicas did not confirm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_what_is_kept_and_what_is_lost() {
    let t = Timing::default();
    let mut group = RedisSentinel::start();
    let url = group.url();
    let (a, b) = fenced_testkit::two_clients(&url).await;
    let kept = unique("kept");
    let g = a.mutex(&kept).unwrap().acquire().await.unwrap();
    let old = group.master_port().unwrap();
    // Sentinel may not have judged the replicas yet (NOGOODSLAVE): ask again.
    t.wait_until("sentinel never accepted a failover", || async {
        fenced_testkit::servers::redis::cmd_at(
            group.sentinels[0].port,
            &[
                "SENTINEL",
                "FAILOVER",
                fenced_testkit::servers::redis::SERVICE,
            ],
        )
        .is_ok()
    })
    .await;
    t.wait_until("sentinel never failed over", || async {
        group.master_port().is_some_and(|p| p != old)
    })
    .await;
    let lock_b = b.mutex(&kept).unwrap();
    // Clients reconnect to the new master on their own; the lock is there.
    let seen = t
        .until_available("the new master answers", || lock_b.try_acquire())
        .await;
    assert!(
        seen.is_none(),
        "the replicated grant survives a planned failover"
    );
    assert!(g.release().await.unwrap());

    // The replicas stop (as if partitioned away); a grant reaches only the master.
    let careful = Client::connect(&format!("{url}?min_replicas=1&wait_timeout=300ms"))
        .await
        .unwrap();
    let master = group.master_port().unwrap();
    // Both replicas follow the new master, in sync, before they stop: a
    // replica still reconnecting could get the grant from a sync already
    // under way.
    // Sentinel turns the old master into a replica at its next INFO poll,
    // which comes every 10 s.
    let synced = || {
        let info = fenced_testkit::servers::redis::cmd_at(master, &["INFO", "replication"])
            .ok()
            .and_then(|v| redis::from_redis_value::<String>(v).ok())
            .unwrap_or_default();
        info.contains("connected_slaves:2") && info.matches("state=online").count() == 2
    };
    let until = tokio::time::Instant::now() + t.ms(30_000);
    while !synced() {
        assert!(
            tokio::time::Instant::now() < until,
            "the replicas never caught up with the new master"
        );
        tokio::time::sleep(t.ms(50)).await;
    }
    let replicas: Vec<usize> = (0..group.nodes.len())
        .filter(|i| group.nodes[*i].port != master)
        .collect();
    for i in &replicas {
        group.nodes[*i].process().unwrap().signal(Signal::SIGSTOP);
    }
    // Cut the replication links too: bytes already in a stopped replica's
    // socket would still reach it when it resumes.
    fenced_testkit::servers::redis::cmd_at(master, &["CLIENT", "KILL", "TYPE", "replica"]).unwrap();
    let e = fenced_testkit::fails_at_once(&careful, "careful").await;
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("replicas"), "{e}");
    let lost = unique("lost");
    let g = a.mutex(&lost).unwrap().acquire().await.unwrap();
    let m = group.nodes.iter_mut().find(|n| n.port == master).unwrap();
    m.kill();
    for i in &replicas {
        group.nodes[*i].process().unwrap().signal(Signal::SIGCONT);
    }
    t.wait_until("sentinel never promoted a replica", || async {
        group.master_port().is_some_and(|p| p != master)
    })
    .await;
    let lock_lost = b.mutex(&lost).unwrap();
    let taken = t
        .until_available("the promoted replica answers", || lock_lost.try_acquire())
        .await;
    // The documented loss: the promoted replica never saw the grant.
    let taken = taken.expect("the grant died with the old master");
    assert!(
        taken.fencing_token() > g.fencing_token(),
        "tokens still rise across the failover (the clock floor)"
    );
    drop(g);
}

/// Sentinel: a client follows the master the sentinels name even while
/// the one it was connected to still answers as a master. Here the old
/// master shuts the sentinels out (they log in as `default`, clients as
/// `app`), so they fail over without demoting it; the grant that "did not
/// reach the replica" is deleted on the promoted one. The holder must learn
/// that its hold is gone instead of renewing it on the old master for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_client_leaves_a_replaced_master_that_still_answers() {
    let t = Timing::default();
    let group = RedisSentinel::start();
    for n in &group.nodes {
        n.cmd(&["ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all"])
            .unwrap();
    }
    let url = group
        .url()
        .replacen("redis+sentinel://", "redis+sentinel://app:pw@", 1);
    let (_a, _b, name, g) = fenced_testkit::one_holds(&url, "moved").await;
    let old = group.master_port().unwrap();
    let replicas: Vec<u16> = group
        .nodes
        .iter()
        .map(|n| n.port)
        .filter(|p| *p != old)
        .collect();
    t.wait_until("the grant never reached the replicas", || async {
        replicas.iter().all(|p| {
            fenced_testkit::servers::redis::cmd_at(*p, &["EXISTS", &name])
                .is_ok_and(|v| v == redis::Value::Int(1))
        })
    })
    .await;
    let mut app = redis::Client::open(format!("redis://app:pw@127.0.0.1:{old}"))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("ACL")
        .arg(&["SETUSER", "default", "off"])
        .exec(&mut app)
        .unwrap();
    redis::cmd("CLIENT")
        .arg(&["KILL", "USER", "default"])
        .exec(&mut app)
        .unwrap();
    let until = tokio::time::Instant::now() + t.ms(60_000);
    let new = loop {
        let named: Vec<Option<u16>> = group
            .sentinels
            .iter()
            .map(|s| {
                let v = fenced_testkit::servers::redis::cmd_at(
                    s.port,
                    &[
                        "SENTINEL",
                        "get-master-addr-by-name",
                        fenced_testkit::servers::redis::SERVICE,
                    ],
                )
                .ok()?;
                redis::from_redis_value::<Vec<String>>(v)
                    .ok()?
                    .get(1)?
                    .parse()
                    .ok()
            })
            .collect();
        if let Some(Some(p)) = named.first()
            && *p != old
            && named.iter().all(|n| *n == Some(*p))
        {
            break *p;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the sentinels never agreed on a new master: {named:?}"
        );
        tokio::time::sleep(t.ms(100)).await;
    };
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut app).unwrap();
    assert_eq!(
        role.first(),
        Some(&redis::Value::BulkString(b"master".to_vec())),
        "the old master was not demoted"
    );
    fenced_testkit::servers::redis::cmd_at(new, &["DEL", &name]).unwrap();
    // A client that connects now: one that was connected before may not
    // have read the sentinels' `+switch-master` yet.
    let b = Client::connect(&url).await.unwrap();
    let lock_b = b.mutex(&name).unwrap();
    let other = t
        .until_available("the new master answers", || lock_b.try_acquire())
        .await;
    let Some(other) = other else {
        panic!(
            "the lock is held where a new client looks (the old master?): {:?}",
            lock_b.status().await
        );
    };
    let reason = tokio::time::timeout(t.ms(30_000), g.lost())
        .await
        .expect("the holder never learned that the sentinels' master lost its hold");
    assert!(!reason.to_string().is_empty());
    assert!(
        !g.release().await.unwrap(),
        "the hold was not ours any more"
    );
    assert!(other.release().await.unwrap());

    let unknown = url.replace("/mymaster", "/nosuchservice");
    let e = Client::connect(&unknown).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(
        e.to_string()
            .contains("no sentinel watches a master of this name"),
        "{e}"
    );
}

/// Bad URLs, credentials, names and leases get clear errors; a server that
/// dies under a waiter gives an error, not a hang; nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_faults() {
    let t = Timing::default();
    let secured = RedisServer::start_with(&["--requirepass", "right"]);
    let wrong = format!("redis://:wrong@127.0.0.1:{}", secured.port);
    let e = Client::connect(&wrong).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(
        !e.to_string().contains("wrong@"),
        "the password is hidden: {e}"
    );
    let right = format!("redis://:right@127.0.0.1:{}", secured.port);
    Client::connect(&right)
        .await
        .expect("the right password works");

    let nobody = fenced_testkit::servers::free_port();
    let e = Client::connect(&format!("redis://127.0.0.1:{nobody}"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains(&nobody.to_string()), "{e}");

    let mut server = RedisServer::start();
    for (url, says) in [
        (format!("{}?layout=bogus", server.url()), "layout"),
        (format!("{}?nope=1", server.url()), "unknown parameter"),
        (format!("{}?timeout=soon", server.url()), "duration"),
        (
            format!("redis://127.0.0.1:{},127.0.0.1:1", server.port),
            "redlock",
        ),
        ("redis://127.0.0.1:99999".to_owned(), "port"),
        ("redis+sentinel://127.0.0.1:1".to_owned(), "service"),
    ] {
        let e = Client::connect(&url).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{url}: {e}");
        assert!(e.to_string().contains(says), "{url}: {e}");
    }

    let c = Client::connect(&server.url()).await.unwrap();
    let e = c.mutex("a}b").unwrap().try_acquire().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("slot"), "{e}");
    // A name with its own hash tag works, and so do braces, quotes and UTF-8.
    for name in ["orders:{42}", "a{b", "lock 'x\"; DEL *", "naïve ключ"] {
        let g = c.mutex(name).unwrap().try_acquire().await.unwrap().unwrap();
        assert!(g.release().await.unwrap(), "{name}");
    }
    let e = c
        .mutex("x")
        .unwrap()
        .lease(Duration::from_micros(500))
        .try_acquire()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");

    // The server dies while a waiter waits: the waiter gets an error.
    let name = unique("dies");
    let _g = c.mutex(&name).unwrap().acquire().await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let waiter = other.mutex(&name).unwrap().retry(RetryPolicy::NTimes {
        times: 2,
        sleep: Duration::from_millis(50),
    });
    let w = tokio::spawn(async move { waiter.acquire_timeout(Duration::from_secs(60)).await });
    tokio::time::sleep(t.ms(200)).await;
    server.kill();
    let r = tokio::time::timeout(t.eventually(), w)
        .await
        .expect("a waiter must not hang on a dead server")
        .unwrap();
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Unavailable);
    server.restart();
    assert!(
        other.status(&name).await.unwrap().is_free(),
        "a restart without persistence forgets the lock"
    );
}

/// A foreign hash on the lock's key with no expiry (a client that sets
/// none, or an operator's HSET) is a holder with no lease to wait for: a
/// waiter looks again every 2 s, as it does in the simple layout, not at
/// once and again (it ran the script every millisecond).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_hash_without_expiry_is_not_polled_hot() {
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let name = unique("foreign");
    let mut con = raw_connection(&server);
    let _: () = redis::cmd("HSET")
        .arg(&name)
        .arg("someone-else:1")
        .arg(1)
        .query(&mut con)
        .unwrap();
    let lock = c.mutex(&name).unwrap();
    let before = fenced::metrics::redis_round_trips();
    let got = lock.acquire_timeout(Duration::from_secs(1)).await.unwrap();
    let trips = fenced::metrics::redis_round_trips() - before;
    assert!(got.is_none(), "the foreign holder keeps the lock");
    assert!(
        trips < 20,
        "a waiter ran {trips} requests in one second against a holder without expiry"
    );
}

/// RedLock: masters that answer renewals with errors for a while (less
/// than the lease: here scripts are refused them, `NOPERM`) make renewals
/// fail, not report the hold taken: no majority said it was gone. The
/// hold stays believed, and renews again once they answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_errors_are_not_a_lost_hold() {
    let t = Timing::default();
    let masters = RedisMasters::start(3);
    let c = Client::connect(&masters.url()).await.unwrap();
    let g = c
        .mutex(&unique("rl-mute"))
        .unwrap()
        .lease(t.ms(3000))
        .acquire()
        .await
        .unwrap();
    for s in &masters.servers[1..] {
        s.cmd(&["ACL", "SETUSER", "default", "-@scripting"])
            .unwrap();
    }
    // Past a renewal (one a second): it meets two masters that refuse it.
    tokio::time::sleep(t.ms(1500)).await;
    for s in &masters.servers[1..] {
        s.cmd(&["ACL", "SETUSER", "default", "+@all"]).unwrap();
    }
    let lost = tokio::time::timeout(t.ms(2500), g.lost()).await;
    assert!(
        lost.is_err(),
        "masters that did not answer were taken for masters that said the hold was gone: {lost:?}"
    );
    assert!(g.is_held());
    assert!(g.release().await.unwrap());
}

/// `WAIT` for `min_replicas` holds the connection it is sent on until the
/// replicas answer: it runs on a connection of its own, so renewals never
/// queue behind it. With the replicas stopped, grants that wait for them
/// fail one after another, and a short-lease hold of the same client is
/// renewed all the while.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_replicas_does_not_stall_renewals() {
    let t = Timing::default();
    let group = RedisSentinel::start();
    let url = format!("{}?min_replicas=1&wait_timeout=1s", group.url());
    let c = Client::connect(&url).await.unwrap();
    let held = fenced_testkit::hold(&c, &unique("short"), fenced::Lease::Renewed(t.ms(600))).await;
    for n in &group.nodes[1..] {
        n.process().unwrap().signal(Signal::SIGSTOP);
    }
    for _ in 0..3 {
        let e = fenced_testkit::fails_at_once(&c, "waits").await;
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(
            held.is_held(),
            "a WAIT stalled the renewals of another hold"
        );
    }
    for n in &group.nodes[1..] {
        n.process().unwrap().signal(Signal::SIGCONT);
    }
    assert!(held.release().await.unwrap());
}

/// On a Cluster, `WAIT` for `min_replicas` asks the master of the lock's
/// slot alone: the cluster client sends a bare `WAIT` to every master and
/// answers with the fewest replicas any shard has, so one shard whose
/// replica is down failed the grants of every other shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waits_for_the_replicas_of_the_lock_shard_only() {
    use fenced_testkit::servers::redis::RedisCluster;
    let cluster = RedisCluster::start_with_replicas(3, true);
    let slot_of = |name: &str| -> u64 {
        redis::from_redis_value(cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", name]).unwrap())
            .unwrap()
    };
    // A name in the first shard (slots 0..5461), and the second shard's
    // replica stopped.
    let name = (0..)
        .map(|_| unique("shard0"))
        .find(|n| slot_of(n) < 16384 / 3)
        .unwrap();
    let c = Client::connect(&format!("{}?min_replicas=1&wait_timeout=1s", cluster.url()))
        .await
        .unwrap();
    // Connected to every node first (the grants' connection included: an
    // acquire and a release): a node that does not answer slows a cluster
    // connection's set-up, which is not what this tests.
    let warm = c.mutex(&name).unwrap().acquire().await.unwrap();
    assert!(warm.release().await.unwrap());
    cluster.nodes[4].process().unwrap().signal(Signal::SIGSTOP);
    let g = c
        .mutex(&name)
        .unwrap()
        .retry(RetryPolicy::Never)
        .try_acquire()
        .await;
    cluster.nodes[4].process().unwrap().signal(Signal::SIGCONT);
    let g = g
        .expect("the lock's own shard has its replica: the grant must not fail")
        .expect("free");
    assert!(g.release().await.unwrap());
}
