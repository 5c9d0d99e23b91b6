//! etcd beyond the conformance suite: interop with `etcdctl lock` and
//! `etcdctl elect`, bad input and faults, users' own transactions, nested
//! names. (The leader kill and the paused client are conformance tests.)
#![cfg(feature = "etcd")]

use fenced::{Client, ErrorKind};
use fenced_testkit::servers::etcd::{EtcdCluster, etcdctl};
use fenced_testkit::{Timing, unique};
use nix::sys::signal::Signal;
use std::process::{Command, Stdio};

/// `etcdctl ARGS...` against `endpoints`, running, with stdout piped.
fn etcdctl_spawn(endpoints: &str, args: &[&str]) -> std::process::Child {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run etcdctl (Debian's etcd-client)")
}

fn etcdctl_lock(c: &EtcdCluster, name: &str, cmd: &[&str]) -> std::process::Child {
    let mut args = vec!["lock", name, "--"];
    args.extend_from_slice(cmd);
    etcdctl_spawn(&c.endpoints(), &args)
}

/// The first `n` lines `etcdctl ARGS...` prints, and the still running process.
fn etcdctl_lines(endpoints: &str, args: &[&str], n: usize) -> (std::process::Child, Vec<String>) {
    use std::io::{BufRead, BufReader};
    let mut child = etcdctl_spawn(endpoints, args);
    let out = child.stdout.take().expect("piped");
    let lines = BufReader::new(out)
        .lines()
        .take(n)
        .map(|l| l.expect("etcdctl's output"))
        .collect();
    (child, lines)
}

/// `etcdctl lock NAME` and fenced's mutex `NAME` are one lock, each way:
/// fenced's key is `NAME/<lease hex>` with an empty value, a holder from
/// either side keeps the other out, and each side's waiter gets the lock
/// when the other lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_interop_both_ways() {
    let t = Timing::default();
    let c = EtcdCluster::start();
    let client = Client::connect(&c.url()).await.unwrap();
    let name = unique("etcdctl");
    let lock = client.mutex(&name).unwrap();

    // etcdctl holds (for as long as its command runs); fenced waits.
    let held = etcdctl_lock(&c, &name, &["sleep", "2"]);
    t.wait_until("etcdctl holds the lock", || async {
        !client.status(&name).await.unwrap().is_free()
    })
    .await;
    let st = client.status(&name).await.unwrap();
    assert!(st.holders[0].owner.starts_with("etcd lease "), "{st:?}");
    // `fenced list` shows etcdctl's hold too: its key is the same layout.
    fenced_testkit::assert_listed(&client, &name, &st).await;
    assert!(lock.try_acquire().await.unwrap().is_none(), "two holders");
    let g = lock
        .acquire_timeout(t.eventually())
        .await
        .unwrap()
        .expect("etcdctl's release wakes the fenced waiter");
    let out = held.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(g.fencing_token() > st.holders[0].token);

    // fenced's key is etcd's mutex layout.
    let keys = etcdctl(
        &c.endpoints(),
        &["get", "--prefix", "--keys-only", &format!("{name}/")],
    )
    .unwrap();
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let hex = keys[0].strip_prefix(&format!("{name}/")).unwrap();
    assert!(
        !hex.is_empty()
            && hex
                .chars()
                .all(|ch| ch.is_ascii_hexdigit() && !ch.is_ascii_uppercase()),
        "{keys:?}"
    );

    // fenced holds; etcdctl waits, and gets the lock when fenced releases.
    let waiter = etcdctl_lock(&c, &name, &["sh", "-c", "echo got $ETCD_LOCK_KEY"]);
    t.wait_until("etcdctl queues behind fenced", || async {
        client.status(&name).await.unwrap().waiters == 1
    })
    .await;
    assert!(g.release().await.unwrap());
    let out = tokio::task::spawn_blocking(move || waiter.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(&format!("got {name}/")), "{said}");
    client.close().await;
}

/// Bad names, an unreachable cluster and wrong credentials: clear errors,
/// nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_faults() {
    let c = EtcdCluster::start();
    let client = Client::connect(&c.url()).await.unwrap();
    let e = client
        .mutex("jobs/")
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("ends with '/'"), "{e}");
    assert!(client.mutex("").is_err());
    fenced_testkit::refuses_urls(
        &c.url(),
        &[
            "?lease_ttl=0s",
            "?lease_ttl=500ms",
            "?bogus=1",
            "/some/path",
        ],
    )
    .await;
    let port = fenced_testkit::servers::free_port();
    let e = Client::connect(&format!("etcd://127.0.0.1:{port}?timeout=1s"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains(&port.to_string()), "{e}");

    // Authentication on: a wrong password is refused, the right one works.
    let ep = c.endpoints();
    etcdctl(&ep, &["user", "add", "root:rootpw"]).expect("add root");
    etcdctl(&ep, &["auth", "enable"]).expect("enable auth");
    let host = ep.split(',').next().unwrap();
    let e = Client::connect(&format!("etcd://root:wrong@{host}"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(!e.to_string().contains("wrong"), "the password leaked: {e}");
    let ok = Client::connect(&format!("etcd://root:rootpw@{host}"))
        .await
        .unwrap();
    let g = ok.mutex("authed").unwrap().acquire().await.unwrap();
    assert!(g.release().await.unwrap());
    ok.close().await;
}

/// Elections are `concurrency.Election`'s layout: `etcdctl elect -l`
/// observes fenced's leader and its proclaimed value, an `etcdctl elect`
/// candidate leads after fenced resigns, and fenced observes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_interop() {
    let t = Timing::default();
    let c = EtcdCluster::start();
    let client = Client::connect(&c.url()).await.unwrap();
    let name = unique("elect");
    let election = client.election(&name).unwrap();
    let leading = election.campaign("fenced-a").await.unwrap();

    let (mut observer, seen) = etcdctl_lines(&c.endpoints(), &["elect", "-l", &name], 2);
    let _ = observer.kill();
    let _ = observer.wait();
    assert!(seen[0].starts_with(&format!("{name}/")), "{seen:?}");
    assert_eq!(seen[1], "fenced-a");

    let name2 = name.clone();
    let endpoints = c.endpoints();
    let candidate =
        std::thread::spawn(move || etcdctl_lines(&endpoints, &["elect", &name2, "etcdctl-b"], 2));
    t.wait_until("etcdctl campaigns", || async {
        client.status(&name).await.unwrap().waiters == 1
    })
    .await;
    assert!(leading.resign().await.unwrap());
    let (mut child, lines) = tokio::task::spawn_blocking(move || candidate.join().unwrap())
        .await
        .unwrap();
    assert_eq!(
        lines.get(1).map(String::as_str),
        Some("etcdctl-b"),
        "{lines:?}"
    );
    let leader = election.leader().await.unwrap().expect("etcdctl leads");
    assert_eq!(leader.value, b"etcdctl-b");
    assert!(
        election.try_campaign("fenced-c").await.unwrap().is_none(),
        "one leader"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGINT,
    )
    .unwrap();
    let _ = child.wait();
    let next = election
        .campaign_timeout("fenced-c", t.eventually())
        .await
        .unwrap()
        .expect("etcdctl resigned on SIGINT");
    assert!(next.guard().fencing_token() > leader.token);
    assert!(next.resign().await.unwrap());
}

/// `Guard::ownership` is etcd's `IsOwner`: a user's own transaction
/// guarded by the hold's key and create revision commits while the hold
/// lasts and is refused once the lock was taken away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ownership_guards_users_own_transactions() {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let c = EtcdCluster::start();
    let client = Client::connect(&c.url()).await.unwrap();
    let name = unique("owner");
    let g = client.mutex(&name).unwrap().acquire().await.unwrap();
    let o = g.ownership().expect("etcd records holds");
    assert_eq!(o.revision, g.fencing_token());
    assert!(o.key.starts_with(format!("{name}/").as_bytes()));
    let endpoints: Vec<String> = c
        .endpoints()
        .split(',')
        .map(|h| format!("http://{h}"))
        .collect();
    let mut etcd = etcd_client::Client::connect(&endpoints, None)
        .await
        .unwrap();
    let guarded = |value: &'static str| {
        Txn::new()
            .when([Compare::create_revision(
                o.key.clone(),
                CompareOp::Equal,
                o.revision as i64,
            )])
            .and_then([TxnOp::put(format!("{name}:data"), value, None)])
    };
    assert!(etcd.txn(guarded("mine")).await.unwrap().succeeded());
    assert_eq!(
        client.mutex(&name).unwrap().force_unlock().await.unwrap(),
        1
    );
    assert!(
        !etcd.txn(guarded("stale")).await.unwrap().succeeded(),
        "a write guarded by a lost hold committed"
    );
    let got = etcd.get(format!("{name}:data"), None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"mine");
}

/// Lock `a` is the prefix `a/`, which lock `a/b`'s keys (`a/b/…`) also
/// start with: `a` must not count them as its holders or waiters. And no
/// lock may be named into fenced's own records (`fenced.token/…`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_names_are_separate_locks() {
    let c = EtcdCluster::start();
    let client = Client::connect(&c.url()).await.unwrap();
    let parent = unique("orders");
    let child = format!("{parent}/1001");
    let g = client.mutex(&child).unwrap().acquire().await.unwrap();
    let p = client
        .mutex(&parent)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("lock a is free while lock a/b is held");
    let st = client.status(&parent).await.unwrap();
    assert_eq!(st.holders.len(), 1, "{st:?}");
    assert_eq!(st.holders[0].token, p.fencing_token());
    // Held, not proclaimed: no leader value (the child's key is not
    // taken for one either).
    let election = client.election(&parent).unwrap();
    assert_eq!(election.leader().await.unwrap(), None);
    assert!(p.release().await.unwrap());
    // A leader of `a` while `a/b` is held is the one leader it sees.
    let l = election.campaign(b"me").await.unwrap();
    let seen = election.leader().await.unwrap().expect("a leader");
    assert_eq!(
        (seen.value.as_slice(), seen.token),
        (&b"me"[..], l.guard().fencing_token())
    );
    drop(l);
    assert!(g.release().await.unwrap());
    for reserved in ["fenced.token", "fenced.register/x", "fenced.anything"] {
        let e = client
            .mutex(reserved)
            .unwrap()
            .try_acquire()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{reserved}: {e}");
    }
}

/// A waiter whose only key ahead is deleted is granted by that delete
/// alone, with no listing, unless its own key went first: an operator's
/// `etcdctl del` of a waiter's key must not leave it believing it holds
/// beside the waiter that queued after it (who, next in line, is then
/// granted by the same delete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_was_deleted_is_not_granted_by_the_delete_ahead() {
    let t = Timing::default();
    let c = EtcdCluster::start();
    let name = unique("deleted-waiter");
    let connect = || async { Client::connect(&c.url()).await.unwrap() };
    let (a, b, w) = (connect().await, connect().await, connect().await);
    let held = a.mutex(&name).unwrap().acquire().await.unwrap();
    let keys = || {
        let out = etcdctl(
            &c.endpoints(),
            &[
                "get",
                "--prefix",
                "--keys-only",
                "--sort-by=CREATE",
                &format!("{name}/"),
            ],
        )
        .expect("etcdctl get");
        out.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let lock_b = b.mutex(&name).unwrap();
    let mut waiter_b = tokio::spawn(async move { lock_b.acquire().await });
    t.wait_until("b queues", || async { keys().len() == 2 })
        .await;
    let (a_key, b_key) = (keys()[0].clone(), keys()[1].clone());
    etcdctl(&c.endpoints(), &["del", &b_key]).expect("delete b's key by hand");
    // b hears its key go and queues again (under the same name); w queues
    // too, and a lets go as soon as it has, whether b has queued or not.
    let lock_w = w.mutex(&name).unwrap();
    let mut waiter_w = tokio::spawn(async move { lock_w.acquire().await });
    t.wait_until("w queues behind a", || async {
        keys().iter().any(|k| *k != a_key && *k != b_key)
    })
    .await;
    assert!(held.release().await.unwrap());
    // Exactly one of them is granted; the other waits for its release.
    let (first, mut other) = tokio::select! {
        g = &mut waiter_b => (g, waiter_w),
        g = &mut waiter_w => (g, waiter_b),
    };
    let first = first.unwrap().expect("one waiter is granted");
    let st = a.status(&name).await.unwrap();
    assert_eq!(st.holders.len(), 1, "{st:?}");
    assert_eq!(st.holders[0].token, first.fencing_token(), "{st:?}");
    assert!(
        tokio::time::timeout(t.ms(500), &mut other).await.is_err(),
        "two holders at once: the second was granted while the first held"
    );
    let first_token = first.fencing_token();
    assert!(first.release().await.unwrap());
    let second = other.await.unwrap().expect("the other is granted next");
    assert!(second.fencing_token() > first_token);
    assert!(second.release().await.unwrap());
    for client in [a, b, w] {
        client.close().await;
    }
}
