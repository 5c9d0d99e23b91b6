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

pub use fixture::{Fixture, one_holds, two_holds_in_turn, unique};
pub use timing::Timing;

/// Instantiates the conformance suite for one backend: every lock-contract
/// test as a `#[tokio::test]` in a module named `$backend`, built from the
/// fixture expression. Add `processes` for backends shared between
/// processes: those tests spawn real `fenced` processes.
///
/// The calling crate must depend on `tokio` (with `macros` and `rt-multi-thread`).
#[macro_export]
macro_rules! conformance_suite {
    ($backend:ident, $fixture:expr) => {
        $crate::conformance_suite!(@core $backend, $fixture, [fair_mode_is_fifo, cancelled_wait_leaves_nothing]);
    };
    ($backend:ident, $fixture:expr, processes) => {
        $crate::conformance_suite!(@core $backend, $fixture, [
            fair_mode_is_fifo, cancelled_wait_leaves_nothing,
            processes_exclude_each_other, killed_holder_process_frees_lock
        ]);
    };
    // No fair mode and no semaphores (RedLock: a majority of masters cannot
    // bound a count; PostgreSQL advisory locks count no permits): those
    // tests are replaced by checks of the refusal.
    ($backend:ident, $fixture:expr, processes, no_fair_no_permits) => {
        $crate::conformance_suite!(@tests $backend, $fixture, [
            mutual_exclusion_tasks, owner_only_release, reentrancy_counts,
            lease_expiry_frees_dead_holder, watchdog_keeps_slow_holder,
            fencing_tokens_increase, lost_signal_when_taken, lost_signal_when_lease_ends,
            try_and_timeout, waiter_is_woken_by_release, dropped_guard_releases,
            readers_share_writers_exclude, fair_mode_is_refused, semaphore_is_refused,
            fenced_register_rejects_stale_tokens, versioned_values_lose_no_update, multilock_is_all_or_nothing,
            striped_segments_are_independent, bad_input_is_refused, leader_election_hands_over,
            processes_exclude_each_other, killed_holder_process_frees_lock
        ]);
    };
    // A backend with mutexes only (Redis `layout=simple`): read-write
    // locks and semaphores are replaced by a check of their refusal.
    ($backend:ident, $fixture:expr, processes, mutex_only) => {
        $crate::conformance_suite!(@tests $backend, $fixture, [
            mutual_exclusion_tasks, owner_only_release, reentrancy_counts,
            lease_expiry_frees_dead_holder, watchdog_keeps_slow_holder,
            fencing_tokens_increase_mutex, lost_signal_when_taken, lost_signal_when_lease_ends,
            try_and_timeout, waiter_is_woken_by_release, dropped_guard_releases,
            cancelled_wait_leaves_nothing, fair_mode_is_fifo, shared_modes_are_refused,
            fenced_register_rejects_stale_tokens, versioned_values_lose_no_update, multilock_is_all_or_nothing,
            striped_segments_are_independent, bad_input_is_refused, leader_election_hands_over,
            processes_exclude_each_other, killed_holder_process_frees_lock
        ]);
    };
    // Mutexes only and no fair mode (MySQL `GET_LOCK`: no shared mode, no
    // permits, and no FIFO promise).
    ($backend:ident, $fixture:expr, processes, mutex_only_no_fair) => {
        $crate::conformance_suite!(@tests $backend, $fixture, [
            mutual_exclusion_tasks, owner_only_release, reentrancy_counts,
            lease_expiry_frees_dead_holder, watchdog_keeps_slow_holder,
            fencing_tokens_increase_mutex, lost_signal_when_taken, lost_signal_when_lease_ends,
            try_and_timeout, waiter_is_woken_by_release, dropped_guard_releases,
            fair_mode_is_refused, shared_modes_are_refused,
            fenced_register_rejects_stale_tokens, versioned_values_lose_no_update, multilock_is_all_or_nothing,
            striped_segments_are_independent, bad_input_is_refused, leader_election_hands_over,
            processes_exclude_each_other, killed_holder_process_frees_lock
        ]);
    };
    (@core $backend:ident, $fixture:expr, [$($extra:ident),*]) => {
        $crate::conformance_suite!(@tests $backend, $fixture, [
            mutual_exclusion_tasks, owner_only_release, reentrancy_counts,
            lease_expiry_frees_dead_holder, watchdog_keeps_slow_holder,
            fencing_tokens_increase, lost_signal_when_taken, lost_signal_when_lease_ends,
            try_and_timeout, waiter_is_woken_by_release, dropped_guard_releases,
            readers_share_writers_exclude, semaphore_never_exceeds_permits,
            fenced_register_rejects_stale_tokens, versioned_values_lose_no_update, multilock_is_all_or_nothing,
            striped_segments_are_independent, bad_input_is_refused, leader_election_hands_over
            $(, $extra)*
        ]);
    };
    (@tests $backend:ident, $fixture:expr, [$($test:ident),* $(,)?]) => {
        mod $backend {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let fixture = $fixture;
                    $crate::conformance::$test(&fixture).await;
                }
            )*
        }
    };
}
