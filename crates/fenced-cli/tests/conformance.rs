//! The shared conformance suite on every backend this build has, with the
//! client's default settings (default lease; etcd's and ZooKeeper's
//! default 10 s session). What a backend cannot run shows as skipped, with
//! the reason.

use fenced_testkit::Fixture;

fenced_testkit::conformance_suite!(
    memory,
    Fixture::memory(),
    [core, rw, permits, fair],
    skip {
        processes: "memory:// is one process's",
        network: no_network,
        session: lease_held,
        restart: "memory:// has no server to restart",
        run_cut_off: "memory:// is one process's",
        leader: "one process: no leader",
        pause: "memory:// is one process's",
    }
);

fenced_testkit::conformance_suite!(
    sqlite,
    Fixture::sqlite(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, processes],
    skip(lease_file)
);

// The same in a directory every user may write, as the host's default
// lock file is: the file is made writable by all.
fenced_testkit::conformance_suite!(
    sqlite_shared,
    Fixture::sqlite_shared(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, processes],
    skip(lease_file)
);

fenced_testkit::conformance_suite!(
    redis,
    Fixture::redis(env!("CARGO_BIN_EXE_fenced")),
    lease_server
);

fenced_testkit::conformance_suite!(
    redis_simple,
    Fixture::redis_with(env!("CARGO_BIN_EXE_fenced"), "?layout=simple"),
    [core, mutex_only, fair, processes, network, restart],
    skip(one_lease_server)
);

fenced_testkit::conformance_suite!(
    redlock,
    Fixture::redlock(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, no_permits, no_fair, processes, network, restart],
    skip {
        session: lease_held,
        run_cut_off: run_cut_off_in_process,
        leader: "independent masters elect no leader; the torture suite kills one",
        pause: lease_frees_paused,
    }
);

fenced_testkit::conformance_suite!(
    redis_sentinel,
    Fixture::redis_sentinel(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, network],
    skip(redis_failover)
);

fenced_testkit::conformance_suite!(
    redis_cluster,
    Fixture::redis_cluster(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, network],
    skip(redis_failover)
);

fenced_testkit::conformance_suite!(
    postgres,
    Fixture::postgres(env!("CARGO_BIN_EXE_fenced")),
    lease_server
);

fenced_testkit::conformance_suite!(
    postgres_advisory,
    Fixture::postgres_with(env!("CARGO_BIN_EXE_fenced"), "?mode=advisory"),
    [
        core, rw, no_permits, no_fair, processes, network, session, restart
    ],
    skip {
        run_cut_off: run_cut_off_in_process,
        leader: one_server,
        pause: "a paused client keeps its database session, and so its lock, until the server ends the idle session (idle_session_timeout, off by default): the limit of session advisory locks",
    }
);

fenced_testkit::conformance_suite!(
    mariadb,
    Fixture::mariadb(env!("CARGO_BIN_EXE_fenced")),
    lease_server
);

fenced_testkit::conformance_suite!(
    mariadb_advisory,
    Fixture::mariadb_with(env!("CARGO_BIN_EXE_fenced"), "?mode=advisory"),
    [
        core, mutex_only, no_fair, processes, network, session, restart
    ],
    skip {
        run_cut_off: run_cut_off_in_process,
        leader: one_server,
        pause: "a paused client keeps its database session, and so its lock, until the server ends the idle session (wait_timeout, 8 h by default): the limit of GET_LOCK",
    }
);

#[cfg(feature = "etcd")]
fenced_testkit::conformance_suite!(
    etcd,
    Fixture::etcd(env!("CARGO_BIN_EXE_fenced"), 1),
    [
        core,
        rw,
        permits,
        fair,
        processes,
        network,
        run_cut_off,
        session,
        restart,
        pause
    ],
    skip {
        leader: "one member: the three-member fixture runs it",
    }
);

#[cfg(feature = "etcd")]
fenced_testkit::conformance_suite!(
    etcd_cluster,
    Fixture::etcd(env!("CARGO_BIN_EXE_fenced"), 3),
    [core, rw, permits, fair, network, session, leader, pause],
    skip {
        processes: "the one-member fixture covers it",
        restart: several_servers,
        run_cut_off: "the one-member fixture covers it",
    }
);

#[cfg(feature = "zookeeper")]
fenced_testkit::conformance_suite!(
    zookeeper,
    Fixture::zookeeper(env!("CARGO_BIN_EXE_fenced"), 1),
    [
        core,
        rw,
        permits,
        fair,
        processes,
        network,
        run_cut_off,
        restart,
        pause
    ],
    skip {
        session: "ZooKeeper ends a session only when it stops hearing from its client: the partition test covers that",
        leader: "one node: the three-node fixture runs it",
    }
);

#[cfg(feature = "zookeeper")]
fenced_testkit::conformance_suite!(
    zookeeper_ensemble,
    Fixture::zookeeper(env!("CARGO_BIN_EXE_fenced"), 3),
    [core, rw, permits, fair, network, leader, pause],
    skip {
        processes: "the one-node fixture covers it",
        session: "ZooKeeper ends a session only when it stops hearing from its client: the partition test covers that",
        restart: several_servers,
        run_cut_off: "the one-node fixture covers it",
    }
);

/// Every backend here runs or skips (with its reason) every test of the
/// suite: a backend added without its tests, or a test added without its
/// backends, fails here.
#[test]
fn every_backend_runs_or_skips_every_test() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--list", "--ignored"])
        .output()
        .expect("list this binary's tests");
    let mut listing = String::from_utf8(out.stdout).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--list")
        .output()
        .expect("list this binary's tests");
    listing.push_str(&String::from_utf8(out.stdout).unwrap());
    let gaps = fenced_testkit::conformance::incomplete(&listing);
    assert!(
        gaps.is_empty(),
        "backends that neither run nor skip: {gaps:?}"
    );
}
