//! The fenced test kit: fixtures that give each backend under test a URL,
//! the shared conformance suite, and helpers to run real `fenced` processes.
//!
//! A backend is done when [`conformance_suite!`] passes on it:
//!
//! ```text
//! fenced_testkit::conformance_suite!(sqlite, fenced_testkit::Fixture::sqlite(env!("CARGO_BIN_EXE_fenced")), processes);
//! ```

pub mod conformance;
pub mod dark_link;
mod fixture;
pub mod interop;
pub mod process;
pub mod servers;
mod timing;
#[cfg(feature = "tls")]
pub mod tls;
pub mod torture;

pub use fixture::{
    Fixture, Isolated, assert_listed, fails_at_once, hold, names_stay_data, one_holds,
    refuses_urls, two_clients, two_holds_in_turn, unique,
};
pub use timing::Timing;

/// Instantiates the conformance suite for one backend: every lock-contract
/// test as a `#[tokio::test]` in a module named `$backend`, built from the
/// fixture expression, by groups of what the backend offers:
///
/// | group | tests |
/// |---|---|
/// | `core` | every backend: exclusion, leases, fencing, signals, waiting, cancellation |
/// | `rw` / `mutex_only` | read-write locks, or their refusal |
/// | `permits` / `no_permits` | semaphores, or their refusal |
/// | `fair` / `no_fair` | FIFO mode, or its refusal |
/// | `processes` | real `fenced` processes sharing the backend |
/// | `network` | a holder partitioned, cut off, or whose replies are lost or late |
/// | `run_cut_off` | a `fenced run` holder partitioned: its command killed before the next one's starts |
/// | `session` | the holder's session ended by the engine |
/// | `restart` | the server restarted |
/// | `leader` | the leader of an ensemble or cluster killed while a lock is held |
/// | `pause` | a `fenced run` holder paused (SIGSTOP) past its session |
///
/// The groups a backend cannot run are listed under `skip`, each with
/// its reason: a string, or a name for a reason many backends share
/// (`no_network`, `lease_held`, `lease_frees_paused`,
/// `run_cut_off_in_process`, `one_server`, `several_servers`). Their
/// tests show as skipped (`#[ignore]`, with the reason) rather than
/// vanish. Three names stand for several groups at once:
/// `one_lease_server: all` skips the four groups a lease on one server
/// cannot run (`session`, `run_cut_off`, `leader`, `pause`),
/// `lease_file: all` the six an SQLite file cannot (those, `network` and
/// `restart`), and `redis_failover: all` what the Sentinel and Cluster
/// fixtures leave to others; each may be written `skip(one_lease_server)`. And
/// `lease_server`, in place of the groups, is what a lease table on one
/// server runs: every group but those four.
///
/// ```text
/// fenced_testkit::conformance_suite!(sqlite, Fixture::sqlite(bin), [core, rw, permits, fair, processes],
///     skip { network: no_network, session: lease_held, restart: "a file has no server",
///            run_cut_off: no_network, leader: "one file: no leader", pause: lease_frees_paused });
/// fenced_testkit::conformance_suite!(postgres, Fixture::postgres(bin), lease_server);
/// ```
///
/// The calling crate must depend on `tokio` (with `macros` and `rt-multi-thread`).
#[macro_export]
macro_rules! conformance_suite {
    ($backend:ident, $fixture:expr, [$($group:ident),* $(,)?]
        $(, skip { $($skipped:ident : $why:tt),* $(,)? })? $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            $( $crate::conformance_suite!(@group $group, $fixture); )*
            $($( $crate::conformance_suite!(@skip $skipped, $why); )*)?
        }
    };
    ($backend:ident, $fixture:expr, lease_server $(,)?) => {
        $crate::conformance_suite!($backend, $fixture,
            [core, rw, permits, fair, processes, network, restart], skip(one_lease_server));
    };
    ($backend:ident, $fixture:expr, [$($group:ident),* $(,)?], skip($profile:ident) $(,)?) => {
        $crate::conformance_suite!($backend, $fixture, [$($group),*], skip { $profile: all });
    };
    (@skip one_lease_server, all) => {
        $crate::conformance_suite!(@skip session, lease_held);
        $crate::conformance_suite!(@skip run_cut_off, run_cut_off_in_process);
        $crate::conformance_suite!(@skip leader, one_server);
        $crate::conformance_suite!(@skip pause, lease_frees_paused);
    };
    (@skip lease_file, all) => {
        $crate::conformance_suite!(@skip network, no_network);
        $crate::conformance_suite!(@skip session, lease_held);
        $crate::conformance_suite!(@skip restart, "an SQLite file has no server to restart");
        $crate::conformance_suite!(@skip run_cut_off, no_network);
        $crate::conformance_suite!(@skip leader, "one file: no leader");
        $crate::conformance_suite!(@skip pause, lease_frees_paused);
    };
    (@skip redis_failover, all) => {
        $crate::conformance_suite!(@skip processes, "the redis fixture covers it");
        $crate::conformance_suite!(@skip session, lease_held);
        $crate::conformance_suite!(@skip restart, several_servers);
        $crate::conformance_suite!(@skip run_cut_off, run_cut_off_in_process);
        $crate::conformance_suite!(@skip leader, "the torture suite's failover fault covers a master that dies");
        $crate::conformance_suite!(@skip pause, lease_frees_paused);
    };
    (@skip $group:ident, no_network) => {
        $crate::conformance_suite!(@skip $group, "no network between this client and its backend");
    };
    (@skip $group:ident, lease_held) => {
        $crate::conformance_suite!(@skip $group, "holds live on a lease, not on a session a test can end");
    };
    (@skip $group:ident, lease_frees_paused) => {
        $crate::conformance_suite!(@skip $group, "holds live on a lease here, which frees a paused holder's lock when it ends (killed_holder_process_frees_lock covers a holder that stops)");
    };
    (@skip $group:ident, run_cut_off_in_process) => {
        $crate::conformance_suite!(@skip $group, "the in-process partition test covers the rule here; the `fenced run` form runs on etcd and ZooKeeper, where it once failed");
    };
    (@skip $group:ident, one_server) => {
        $crate::conformance_suite!(@skip $group, "one server: no leader");
    };
    (@skip $group:ident, several_servers) => {
        $crate::conformance_suite!(@skip $group, "several servers: the torture suite restarts one of them (restart, leader, failover faults)");
    };
    (@skip $group:ident, $why:literal) => {
        $crate::conformance_suite!(@in $group, @skipped $why,);
    };
    (@group core, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [
            mutual_exclusion_tasks, tasks_of_one_client_exclude, owner_only_release,
            reentrancy_counts, lease_expiry_frees_dead_holder, watchdog_keeps_slow_holder,
            lost_signal_when_taken, lost_signal_when_lease_ends, try_and_timeout,
            waiter_is_woken_by_release, dropped_guard_releases, close_tells_live_guards,
            fenced_register_rejects_stale_tokens, versioned_values_lose_no_update,
            multilock_is_all_or_nothing, multilock_retakes_a_lock_lost_while_waiting,
            striped_segments_are_independent,
            bad_input_is_refused, leader_election_hands_over, cancelled_acquires_leave_nothing,
            cancellation_storm_leaves_the_lock_usable, grant_cases_mutex,
            a_thousand_waiters_of_one_client, waiters_of_one_client_outlast_leaked_holds,
            list_shows_what_is_held_or_waited_for, holders_say_who_they_are,
            counters_and_sequences_count_every_change, watchers_are_woken_by_writes,
            rate_limiters_admit_the_burst_then_the_rate, elections_are_observed_and_lead_work,
            queues_deliver_every_item_leased
        ]);
    };
    (@group rw, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [
            readers_share_writers_exclude, fencing_tokens_increase,
            cancelled_reads_beside_own_write_leave_nothing, grant_cases_rw
        ]);
        $crate::conformance_suite!(@skipped "this backend has read-write locks", [
            shared_modes_are_refused, fencing_tokens_increase_mutex
        ]);
    };
    (@group mutex_only, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [shared_modes_are_refused, fencing_tokens_increase_mutex]);
        $crate::conformance_suite!(@skipped "mutexes only: no read-write locks, no semaphores (shared_modes_are_refused checks the refusal)", [
            readers_share_writers_exclude, fencing_tokens_increase,
            cancelled_reads_beside_own_write_leave_nothing, grant_cases_rw,
            semaphore_never_exceeds_permits, grant_cases_permits, semaphore_is_refused,
            double_barriers_wait_for_every_member
        ]);
    };
    (@group permits, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [
            semaphore_never_exceeds_permits, grant_cases_permits,
            double_barriers_wait_for_every_member
        ]);
        $crate::conformance_suite!(@skipped "this backend has semaphores", [semaphore_is_refused]);
    };
    (@group no_permits, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [semaphore_is_refused]);
        $crate::conformance_suite!(@skipped "no semaphores on this backend, so no double barriers, whose members are permits (semaphore_is_refused checks the refusal)", [
            semaphore_never_exceeds_permits, grant_cases_permits,
            double_barriers_wait_for_every_member
        ]);
    };
    (@group fair, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [
            fair_mode_is_fifo, fair_waiters_of_one_client_keep_their_places,
            cancelled_wait_leaves_nothing
        ]);
        $crate::conformance_suite!(@skipped "this backend has fair mode", [fair_mode_is_refused]);
    };
    (@group no_fair, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [fair_mode_is_refused]);
        $crate::conformance_suite!(@skipped "no fair mode on this backend (fair_mode_is_refused checks the refusal)", [
            fair_mode_is_fifo, fair_waiters_of_one_client_keep_their_places,
            cancelled_wait_leaves_nothing
        ]);
    };
    (@in processes, $($then:tt)*) => {
        $crate::conformance_suite!($($then)* [
            processes_exclude_each_other, killed_holder_process_frees_lock,
            processes_share_counters_and_sequences, processes_share_a_queue
        ]);
    };
    (@in network, $($then:tt)*) => {
        $crate::conformance_suite!($($then)* [
            partitioned_holder_is_told_first, cut_connections_keep_or_lose_cleanly,
            a_lost_reply_is_not_a_second_grant, a_slow_reply_is_not_a_second_grant,
            a_lost_release_reply_is_not_a_loss, pushes_through_cut_connections_deliver_once,
            a_grant_past_its_lease_is_not_returned, calls_return_when_the_server_stops_answering
        ]);
    };
    (@in run_cut_off, $($then:tt)*) => {
        $crate::conformance_suite!($($then)* [cut_off_run_is_killed_before_the_next_runs]);
    };
    (@in session, $($then:tt)*) => {
        $crate::conformance_suite!($($then)* [killed_session_is_reported]);
    };
    (@in leader, $($then:tt)*) => {
        $crate::conformance_suite!($($then)* [leader_killed_while_held]);
    };
    (@in pause, $($then:tt)*) => {
        $crate::conformance_suite!($($then)* [paused_run_loses_its_session]);
    };
    (@in restart, $($then:tt)*) => {
        $crate::conformance_suite!($($then)* [tokens_rise_across_a_restart]);
    };
    (@group $group:ident, $fixture:expr) => {
        $crate::conformance_suite!(@in $group, @tests ($fixture),);
    };
    (@skipped $why:literal, [$($test:ident),* $(,)?]) => {
        $(
            #[test]
            #[ignore = $why]
            fn $test() {}
        )*
    };
    (@tests $fixture:expr, [$($test:ident),* $(,)?]) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                let fixture = $fixture;
                $crate::conformance::$test(&fixture).await;
            }
        )*
    };
}
