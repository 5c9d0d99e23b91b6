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
        a_slow_reply_is_not_a_second_grant: "no network between this client and its backend",
        a_lost_release_reply_is_not_a_loss: "no network between this client and its backend",
        a_grant_past_its_lease_is_not_returned: "no network between this client and its backend",
        calls_return_when_the_server_stops_answering: "no network between this client and its backend",
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        tokens_rise_across_a_restart: "memory:// has no server to restart",
        cut_off_run_is_killed_before_the_next_runs: "memory:// is one process's",
        leader_killed_while_held: "one process: no leader",
        paused_run_loses_its_session: "memory:// is one process's",
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
        a_slow_reply_is_not_a_second_grant: "no network between this client and its backend",
        a_lost_release_reply_is_not_a_loss: "no network between this client and its backend",
        a_grant_past_its_lease_is_not_returned: "no network between this client and its backend",
        calls_return_when_the_server_stops_answering: "no network between this client and its backend",
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        tokens_rise_across_a_restart: "an SQLite file has no server to restart",
        cut_off_run_is_killed_before_the_next_runs: "no network between this client and its backend",
        leader_killed_while_held: "one file: no leader",
        paused_run_loses_its_session: "holds live on a lease here, which frees a paused holder's lock when it ends (killed_holder_process_frees_lock covers a holder that stops)",
    }
);

fenced_testkit::conformance_suite!(
    redis,
    Fixture::redis(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, processes, network, restart],
    skip {
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        cut_off_run_is_killed_before_the_next_runs: "the in-process partition test covers the rule here; the `fenced run` form runs on etcd and ZooKeeper, where it once failed",
        leader_killed_while_held: "one server: no leader",
        paused_run_loses_its_session: "holds live on a lease here, which frees a paused holder's lock when it ends (killed_holder_process_frees_lock covers a holder that stops)",
    }
);

fenced_testkit::conformance_suite!(
    redis_simple,
    Fixture::redis_with(env!("CARGO_BIN_EXE_fenced"), "?layout=simple"),
    [core, mutex_only, fair, processes, network, restart],
    skip {
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        cut_off_run_is_killed_before_the_next_runs: "the in-process partition test covers the rule here; the `fenced run` form runs on etcd and ZooKeeper, where it once failed",
        leader_killed_while_held: "one server: no leader",
        paused_run_loses_its_session: "holds live on a lease here, which frees a paused holder's lock when it ends (killed_holder_process_frees_lock covers a holder that stops)",
    }
);

fenced_testkit::conformance_suite!(
    redlock,
    Fixture::redlock(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, no_permits, no_fair, processes, network, restart],
    skip {
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        cut_off_run_is_killed_before_the_next_runs: "the in-process partition test covers the rule here; the `fenced run` form runs on etcd and ZooKeeper, where it once failed",
        leader_killed_while_held: "independent masters elect no leader; the torture suite kills one",
        paused_run_loses_its_session: "holds live on a lease here, which frees a paused holder's lock when it ends (killed_holder_process_frees_lock covers a holder that stops)",
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
        cut_off_run_is_killed_before_the_next_runs: "the in-process partition test covers the rule here; the `fenced run` form runs on etcd and ZooKeeper, where it once failed",
        leader_killed_while_held: "the torture suite's failover fault covers a master that dies",
        paused_run_loses_its_session: "holds live on a lease here, which frees a paused holder's lock when it ends (killed_holder_process_frees_lock covers a holder that stops)",
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
        cut_off_run_is_killed_before_the_next_runs: "the in-process partition test covers the rule here; the `fenced run` form runs on etcd and ZooKeeper, where it once failed",
        leader_killed_while_held: "the torture suite's failover fault covers a master that dies",
        paused_run_loses_its_session: "holds live on a lease here, which frees a paused holder's lock when it ends (killed_holder_process_frees_lock covers a holder that stops)",
    }
);

fenced_testkit::conformance_suite!(
    postgres,
    Fixture::postgres(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, processes, network, restart],
    skip {
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        cut_off_run_is_killed_before_the_next_runs: "the in-process partition test covers the rule here; the `fenced run` form runs on etcd and ZooKeeper, where it once failed",
        leader_killed_while_held: "one server: no leader",
        paused_run_loses_its_session: "holds live on a lease here, which frees a paused holder's lock when it ends (killed_holder_process_frees_lock covers a holder that stops)",
    }
);

fenced_testkit::conformance_suite!(
    postgres_advisory,
    Fixture::postgres_with(env!("CARGO_BIN_EXE_fenced"), "?mode=advisory"),
    [
        core, rw, no_permits, no_fair, processes, network, session, restart
    ],
    skip {
        cut_off_run_is_killed_before_the_next_runs: "the in-process partition test covers the rule here; the `fenced run` form runs on etcd and ZooKeeper, where it once failed",
        leader_killed_while_held: "one server: no leader",
        paused_run_loses_its_session: "a paused client keeps its database session, and so its lock, until the server ends the idle session (idle_session_timeout, off by default): the limit of session advisory locks",
    }
);

fenced_testkit::conformance_suite!(
    mariadb,
    Fixture::mariadb(env!("CARGO_BIN_EXE_fenced")),
    [core, rw, permits, fair, processes, network, restart],
    skip {
        killed_session_is_reported: "holds live on a lease, not on a session a test can end",
        cut_off_run_is_killed_before_the_next_runs: "the in-process partition test covers the rule here; the `fenced run` form runs on etcd and ZooKeeper, where it once failed",
        leader_killed_while_held: "one server: no leader",
        paused_run_loses_its_session: "holds live on a lease here, which frees a paused holder's lock when it ends (killed_holder_process_frees_lock covers a holder that stops)",
    }
);

fenced_testkit::conformance_suite!(
    mariadb_advisory,
    Fixture::mariadb_with(env!("CARGO_BIN_EXE_fenced"), "?mode=advisory"),
    [
        core, mutex_only, no_fair, processes, network, session, restart
    ],
    skip {
        cut_off_run_is_killed_before_the_next_runs: "the in-process partition test covers the rule here; the `fenced run` form runs on etcd and ZooKeeper, where it once failed",
        leader_killed_while_held: "one server: no leader",
        paused_run_loses_its_session: "a paused client keeps its database session, and so its lock, until the server ends the idle session (wait_timeout, 8 h by default): the limit of GET_LOCK",
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
        leader_killed_while_held: "one member: the three-member fixture runs it",
    }
);

#[cfg(feature = "etcd")]
fenced_testkit::conformance_suite!(
    etcd_cluster,
    Fixture::etcd(env!("CARGO_BIN_EXE_fenced"), 3),
    [core, rw, permits, fair, network, session, leader, pause],
    skip {
        processes_exclude_each_other: "the one-member fixture covers it",
        killed_holder_process_frees_lock: "the one-member fixture covers it",
        tokens_rise_across_a_restart: "several servers: the torture suite restarts one of them (restart, leader, failover faults)",
        cut_off_run_is_killed_before_the_next_runs: "the one-member fixture covers it",
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
        killed_session_is_reported: "ZooKeeper ends a session only when it stops hearing from its client: the partition test covers that",
        leader_killed_while_held: "one node: the three-node fixture runs it",
    }
);

#[cfg(feature = "zookeeper")]
fenced_testkit::conformance_suite!(
    zookeeper_ensemble,
    Fixture::zookeeper(env!("CARGO_BIN_EXE_fenced"), 3),
    [core, rw, permits, fair, network, leader, pause],
    skip {
        processes_exclude_each_other: "the one-node fixture covers it",
        killed_holder_process_frees_lock: "the one-node fixture covers it",
        killed_session_is_reported: "ZooKeeper ends a session only when it stops hearing from its client: the partition test covers that",
        tokens_rise_across_a_restart: "several servers: the torture suite restarts one of them (restart, leader, failover faults)",
        cut_off_run_is_killed_before_the_next_runs: "the one-node fixture covers it",
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
