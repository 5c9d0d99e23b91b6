//! ZooKeeper beyond the conformance suite: interop with Apache Curator's
//! `InterProcessMutex` (Debian's libcurator-recipes-java), digest ACLs,
//! and bad input and faults. (The leader kill and the paused client are
//! conformance tests.)
#![cfg(feature = "zookeeper")]

use fenced::{Client, ErrorKind};
use fenced_testkit::interop::{curator, next_line};
use fenced_testkit::servers::zookeeper::ZkEnsemble;
use fenced_testkit::{Timing, unique};

/// Curator's `InterProcessMutex` on `/N` and fenced's mutex `N` are one
/// lock, each way: a holder on either side keeps the other out, and each
/// side's waiter gets the lock when the other lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_interop_both_ways() {
    let t = Timing::default();
    let z = ZkEnsemble::start();
    let client = Client::connect(&z.url()).await.unwrap();
    let name = unique("curator");
    let lock = client.mutex(&name).unwrap();

    // Curator holds for 2 s; fenced waits for it.
    let (java, mut out) = curator(&z.connect_string(), &format!("/{name}"), 2000);
    let mut out = tokio::task::spawn_blocking(move || {
        assert_eq!(next_line(&mut out), "waiting");
        assert_eq!(next_line(&mut out), "acquired");
        out
    })
    .await
    .unwrap();
    let st = client.status(&name).await.unwrap();
    assert_eq!(st.holders.len(), 1, "{st:?}");
    assert!(st.holders[0].owner.starts_with("zk session "), "{st:?}");
    // `fenced list` shows Curator's hold too: its node is the same layout.
    fenced_testkit::assert_listed(&client, &name, &st).await;
    assert!(lock.try_acquire().await.unwrap().is_none(), "two holders");
    let g = lock
        .acquire_timeout(t.eventually())
        .await
        .unwrap()
        .expect("Curator's release wakes the fenced waiter");
    let said = tokio::task::spawn_blocking(move || next_line(&mut out))
        .await
        .unwrap();
    assert_eq!(
        said, "released",
        "fenced got the lock before Curator let go"
    );
    assert!(g.fencing_token() > st.holders[0].token);
    let mut java = java;
    assert!(java.wait().unwrap().success());

    // fenced holds; Curator queues behind it and gets it on release.
    let (mut java, mut out) = curator(&z.connect_string(), &format!("/{name}"), 0);
    let mut out = tokio::task::spawn_blocking(move || {
        assert_eq!(next_line(&mut out), "waiting");
        out
    })
    .await
    .unwrap();
    t.wait_until("Curator queues behind fenced", || async {
        client.status(&name).await.unwrap().waiters == 1
    })
    .await;
    assert!(g.release().await.unwrap());
    let said = tokio::task::spawn_blocking(move || {
        let a = next_line(&mut out);
        let b = next_line(&mut out);
        (a, b)
    })
    .await
    .unwrap();
    assert_eq!(said, ("acquired".to_owned(), "released".to_owned()));
    assert!(java.wait().unwrap().success());
    client.close().await;
}

/// Digest auth: nodes are created with the creator-only ACL, so another
/// identity (a wrong password is another identity) can neither queue on
/// nor delete them; the error says so, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_acl_keeps_other_identities_out() {
    let z = ZkEnsemble::start();
    let alice = Client::connect(&format!("{}?digest=alice:secret", z.url()))
        .await
        .unwrap();
    let name = unique("acl");
    let g = alice.mutex(&name).unwrap().acquire().await.unwrap();
    // Another identity cannot even set up: the metadata nodes are alice's.
    let e = Client::connect(&format!("{}?digest=alice:wrong", z.url()))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("refused"), "{e}");
    assert!(
        !e.to_string().contains("secret") && !e.to_string().contains("wrong"),
        "a password leaked: {e}"
    );
    // Nor, without credentials, queue on or break alice's lock.
    let anyone = Client::connect(&z.url()).await;
    if let Ok(anyone) = anyone {
        let e = anyone
            .mutex(&name)
            .unwrap()
            .try_acquire()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(anyone.mutex(&name).unwrap().force_unlock().await.is_err());
    }
    assert!(g.is_held());
    let st = alice.status(&name).await.unwrap();
    assert_eq!((st.holders.len(), st.waiters), (1, 0), "{st:?}");
    assert!(g.release().await.unwrap());
}

/// Bad names, URLs, a missing chroot and an unreachable ensemble: clear
/// errors, no node left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_faults() {
    let z = ZkEnsemble::start();
    let client = Client::connect(&z.url()).await.unwrap();
    for bad in ["a/b", "nul\0name", "fenced.meta"] {
        let e = match client.mutex(bad) {
            Err(e) => e,
            Ok(lock) => lock.try_acquire().await.unwrap_err(),
        };
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad:?}: {e}");
    }
    fenced_testkit::refuses_urls(
        &z.url(),
        &[
            "?session_timeout=100ms",
            "?timeout=0s",
            "?timeout=10000000000000000000s",
            "?timeout=soon",
            "?digest=nopassword",
            "?bogus=1",
            "/no/such/chroot",
        ],
    )
    .await;
    let e = Client::connect(&format!("zk://u:p@{}", z.connect_string()))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("digest"), "{e}");
    let port = fenced_testkit::servers::free_port();
    let e = Client::connect(&format!("zk://127.0.0.1:{port}?session_timeout=1s"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // Nothing left: only the metadata tree at the root.
    let st = client.status("a").await.unwrap();
    assert!(st.is_free());
    client.close().await;
}

/// The last-token record of a lock never goes backwards: an owner that
/// holds write and takes read (the downgrade) releases the read (the
/// higher token) first; the write's release must not write its own,
/// lower token over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_token_record_never_goes_backwards() {
    let z = ZkEnsemble::start();
    let c = Client::connect(&z.url()).await.unwrap();
    let name = unique("lasttoken");
    let me = fenced::Owner::new();
    let rw = c.rwlock(&name).unwrap();
    let w = rw.write().owner(&me).acquire().await.unwrap();
    let r = rw.read().owner(&me).acquire().await.unwrap();
    let top = r.fencing_token();
    assert!(top > w.fencing_token());
    assert!(r.release().await.unwrap());
    assert!(w.release().await.unwrap());
    let st = c.status(&name).await.unwrap();
    assert!(st.is_free());
    assert_eq!(
        st.last_token, top,
        "the record went back to the write's token"
    );
}

/// A client closed and dropped ends its session and its connection: a
/// heartbeat task once outlived the client and kept both open for good,
/// so a server's limit of connections per address (60 by default) came
/// to refuse a process that reconnects now and then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_client_leaves_no_connection() {
    let t = Timing::default();
    let z = ZkEnsemble::start();
    let port: u16 = z
        .connect_string()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("one node's port");
    let alive = || {
        fenced_testkit::servers::zookeeper::four_letter(port, "mntr")
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("zk_num_alive_connections"))
                    .and_then(|n| n.trim().parse::<u32>().ok())
            })
            .expect("mntr answers")
    };
    let before = alive();
    for _ in 0..5 {
        let c = Client::connect(&z.url()).await.unwrap();
        let g = c.mutex(&unique("leak")).unwrap().acquire().await.unwrap();
        assert!(g.release().await.unwrap());
        c.close().await;
    }
    t.wait_until("the closed clients' connections end", || async {
        alive() <= before
    })
    .await;
}
