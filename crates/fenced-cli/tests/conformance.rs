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
        processes_exclude_each_other: "memory:// is one process's",
        killed_holder_process_frees_lock: "memory:// is one process's",
        partitioned_holder_is_told_first: "no network between this client and its backend",
        cut_connections_keep_or_lose_cleanly: "no network between this client and its backend",
        a_lost_reply_is_not_a_second_grant: "no network between this client and its backend",
        a_grant_past_its_lease_is_not_returned: "no network between this client and its backend",
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        tokens_rise_across_a_restart: "memory:// has no server to restart",
    }
);

fenced_testkit::conformance_suite!(
    sqlite,
    Fixture::sqlite(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, processes],
    skip {
        partitioned_holder_is_told_first: "no network between this client and its backend",
        cut_connections_keep_or_lose_cleanly: "no network between this client and its backend",
        a_lost_reply_is_not_a_second_grant: "no network between this client and its backend",
        a_grant_past_its_lease_is_not_returned: "no network between this client and its backend",
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        tokens_rise_across_a_restart: "an SQLite file has no server to restart",
    }
);

fenced_testkit::conformance_suite!(
    redis,
    Fixture::redis(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, processes, network, restart],
    skip {
        killed_session_is_reported: "holds live on a lease, not on a session a test can end"
    }
);

fenced_testkit::conformance_suite!(
    redis_simple,
    Fixture::redis_with(env!("CARGO_BIN_EXE_fenced"), "?layout=simple"),
    [core, mutex_only, fair, processes, network, restart],
    skip {
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        semaphore_is_refused: "mutexes only: shared_modes_are_refused checks the refusal",
    }
);

fenced_testkit::conformance_suite!(
    redlock,
    Fixture::redlock(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, no_permits, no_fair, processes, network, restart],
    skip {
        killed_session_is_reported: "holds live on a lease, not on a session a test can end"
    }
);

fenced_testkit::conformance_suite!(
    redis_sentinel,
    Fixture::redis_sentinel(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, network],
    skip {
        processes_exclude_each_other: "the redis fixture covers it",
        killed_holder_process_frees_lock: "the redis fixture covers it",
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        tokens_rise_across_a_restart: "several servers: the torture suite restarts one of them (restart, leader, failover faults)",
    }
);

fenced_testkit::conformance_suite!(
    redis_cluster,
    Fixture::redis_cluster(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, network],
    skip {
        processes_exclude_each_other: "the redis fixture covers it",
        killed_holder_process_frees_lock: "the redis fixture covers it",
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        tokens_rise_across_a_restart: "several servers: the torture suite restarts one of them (restart, leader, failover faults)",
    }
);

fenced_testkit::conformance_suite!(
    postgres,
    Fixture::postgres(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, processes, network, restart],
    skip {
        killed_session_is_reported: "holds live on a lease, not on a session a test can end"
    }
);

fenced_testkit::conformance_suite!(
    postgres_advisory,
    Fixture::postgres_with(env!("CARGO_BIN_EXE_fenced"), "?mode=advisory"),
    [
        core, rw, no_permits, no_fair, processes, network, session, restart
    ]
);

fenced_testkit::conformance_suite!(
    mariadb,
    Fixture::mariadb(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, processes, network, restart],
    skip {
        killed_session_is_reported: "holds live on a lease, not on a session a test can end"
    }
);

fenced_testkit::conformance_suite!(
    mariadb_advisory,
    Fixture::mariadb_with(env!("CARGO_BIN_EXE_fenced"), "?mode=advisory"),
    [
        core, mutex_only, no_fair, processes, network, session, restart
    ],
    skip {
        semaphore_is_refused: "mutexes only: shared_modes_are_refused checks the refusal"
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
        restart
    ]
);

#[cfg(feature = "etcd")]
fenced_testkit::conformance_suite!(
    etcd_cluster,
    Fixture::etcd(env!("CARGO_BIN_EXE_fenced"), 3),
    [core, rw, permits, fair, network, session],
    skip {
        processes_exclude_each_other: "the one-member fixture covers it",
        killed_holder_process_frees_lock: "the one-member fixture covers it",
        tokens_rise_across_a_restart: "several servers: the torture suite restarts one of them (restart, leader, failover faults)",
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
        restart
    ],
    skip {
        killed_session_is_reported: "ZooKeeper ends a session only when it stops hearing from its client: the partition test covers that"
    }
);

#[cfg(feature = "zookeeper")]
fenced_testkit::conformance_suite!(
    zookeeper_ensemble,
    Fixture::zookeeper(env!("CARGO_BIN_EXE_fenced"), 3),
    [core, rw, permits, fair, network],
    skip {
        processes_exclude_each_other: "the one-node fixture covers it",
        killed_holder_process_frees_lock: "the one-node fixture covers it",
        killed_session_is_reported: "ZooKeeper ends a session only when it stops hearing from its client: the partition test covers that",
        tokens_rise_across_a_restart: "several servers: the torture suite restarts one of them (restart, leader, failover faults)",
    }
);
