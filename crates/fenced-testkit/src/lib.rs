//! The fenced test kit: fixtures that give each backend under test a URL,
//! the shared conformance suite, and helpers to run real `fenced` processes.
//!
//! A backend is done when [`conformance_suite!`] passes on it:
//!
//! ```text
//! fenced_testkit::conformance_suite!(sqlite, fenced_testkit::Fixture::sqlite(env!("CARGO_BIN_EXE_fenced")), processes);
//! ```

pub mod conformance;
mod fixture;
pub mod process;
pub mod servers;
mod timing;
pub mod torture;

pub use fixture::{Fixture, Isolated, one_holds, two_holds_in_turn, unique};
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
/// Tests a backend cannot run are listed under `skip` with the reason,
/// and show as skipped (`#[ignore]`) rather than vanish.
///
/// ```text
/// fenced_testkit::conformance_suite!(sqlite, Fixture::sqlite(bin), [core, rw, permits, fair, processes],
///     skip { partitioned_holder_is_told_first: "a file on this host: no network" });
/// ```
///
/// The calling crate must depend on `tokio` (with `macros` and `rt-multi-thread`).
#[macro_export]
macro_rules! conformance_suite {
    ($backend:ident, $fixture:expr, [$($group:ident),* $(,)?]
        $(, skip { $($skipped:ident : $why:literal),* $(,)? })? $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            $( $crate::conformance_suite!(@group $group, $fixture); )*
            $($(
                #[test]
                #[ignore = $why]
                fn $skipped() {}
            )*)?
        }
    };
    (@group core, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [
            mutual_exclusion_tasks, tasks_of_one_client_exclude, owner_only_release,
            reentrancy_counts, lease_expiry_frees_dead_holder, watchdog_keeps_slow_holder,
            lost_signal_when_taken, lost_signal_when_lease_ends, try_and_timeout,
            waiter_is_woken_by_release, dropped_guard_releases, close_tells_live_guards,
            fenced_register_rejects_stale_tokens, versioned_values_lose_no_update,
            multilock_is_all_or_nothing, striped_segments_are_independent,
            bad_input_is_refused, leader_election_hands_over, cancelled_acquires_leave_nothing,
            grant_cases_mutex
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
            semaphore_never_exceeds_permits, grant_cases_permits, semaphore_is_refused
        ]);
    };
    (@group permits, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [semaphore_never_exceeds_permits, grant_cases_permits]);
        $crate::conformance_suite!(@skipped "this backend has semaphores", [semaphore_is_refused]);
    };
    (@group no_permits, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [semaphore_is_refused]);
        $crate::conformance_suite!(@skipped "no semaphores on this backend (semaphore_is_refused checks the refusal)", [
            semaphore_never_exceeds_permits, grant_cases_permits
        ]);
    };
    (@group fair, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [fair_mode_is_fifo, cancelled_wait_leaves_nothing]);
        $crate::conformance_suite!(@skipped "this backend has fair mode", [fair_mode_is_refused]);
    };
    (@group no_fair, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [fair_mode_is_refused]);
        $crate::conformance_suite!(@skipped "no fair mode on this backend (fair_mode_is_refused checks the refusal)", [
            fair_mode_is_fifo, cancelled_wait_leaves_nothing
        ]);
    };
    (@group processes, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [processes_exclude_each_other, killed_holder_process_frees_lock]);
    };
    (@group network, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [
            partitioned_holder_is_told_first, cut_connections_keep_or_lose_cleanly,
            a_lost_reply_is_not_a_second_grant, a_slow_reply_is_not_a_second_grant,
            a_lost_release_reply_is_not_a_loss,
            a_grant_past_its_lease_is_not_returned, calls_return_when_the_server_stops_answering
        ]);
    };
    (@group run_cut_off, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [cut_off_run_is_killed_before_the_next_runs]);
    };
    (@group session, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [killed_session_is_reported]);
    };
    (@group leader, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [leader_killed_while_held]);
    };
    (@group pause, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [paused_run_loses_its_session]);
    };
    (@group restart, $fixture:expr) => {
        $crate::conformance_suite!(@tests $fixture, [tokens_rise_across_a_restart]);
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
