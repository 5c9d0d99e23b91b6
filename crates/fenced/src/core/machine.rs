//! The grant rule shared by every backend that decides grants itself
//! (memory, SQLite, and the SQL lease table): one machine for mutexes,
//! read-write locks and semaphores.

use crate::backend::Mode;
use std::time::{SystemTime, UNIX_EPOCH};

/// A current holder, as the rule needs it.
pub(crate) struct Held<'a> {
    pub(crate) owner_key: &'a str,
    pub(crate) mode: Mode,
}

/// Whether a request by `owner_key` in `mode` can be granted beside the
/// live `holders`, when `queued_ahead` says whether an earlier live fair
/// waiter stands in front of it (only fair requests respect the queue).
///
/// - An owner never conflicts with its own exclusive or shared holds: that
///   is reentrancy, and a writer taking read (the downgrade). A reader's
///   upgrade to writer is refused earlier, by the client, since two readers
///   upgrading at once would wait on each other for ever.
/// - Exclusive conflicts with every other owner's hold; shared with other
///   owners' exclusive holds and with permits; permits add up to `max`.
pub(crate) fn grantable<'a>(
    holders: impl IntoIterator<Item = Held<'a>>,
    owner_key: &str,
    mode: Mode,
    fair: bool,
    queued_ahead: bool,
) -> bool {
    if fair && queued_ahead {
        return false;
    }
    let mut permits_used: u64 = 0;
    for h in holders {
        let same_owner = h.owner_key == owner_key;
        match (h.mode, mode) {
            (Mode::Permits { take, .. }, Mode::Permits { .. }) => permits_used += u64::from(take),
            (Mode::Permits { .. }, _) | (_, Mode::Permits { .. }) => return false,
            _ if same_owner => {}
            (Mode::Shared, Mode::Shared) => {}
            _ => return false,
        }
    }
    match mode {
        Mode::Permits { take, max } => permits_used + u64::from(take) <= u64::from(max),
        _ => true,
    }
}

/// The next fencing token for a name whose last token was `last`: one more,
/// and never less than the host's wall clock in microseconds, so that a
/// store that lost its counter (a crash before the write reached disk, a
/// process restart for `memory://`) still never issues a token below one it
/// issued before, as long as the clock does not step back by more than what
/// was lost.
pub(crate) fn next_token(last: u64) -> u64 {
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    (last + 1).max(now_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(owner_key: &str, mode: Mode) -> Held<'_> {
        Held { owner_key, mode }
    }

    #[test]
    fn exclusive_and_shared() {
        let x = Mode::Exclusive;
        let s = Mode::Shared;
        assert!(grantable([], "a", x, false, false));
        assert!(!grantable([h("b", x)], "a", x, false, false));
        assert!(grantable([h("a", x)], "a", x, false, false), "reentrant");
        assert!(
            grantable([h("a", x)], "a", s, false, false),
            "writer takes read"
        );
        assert!(!grantable([h("b", x)], "a", s, false, false));
        assert!(grantable([h("b", s), h("c", s)], "a", s, false, false));
        assert!(!grantable([h("b", s)], "a", x, false, false));
        assert!(!grantable([], "a", x, true, true), "fair waits its turn");
        assert!(grantable([], "a", x, false, true), "unfair barges");
    }

    #[test]
    fn permits() {
        let p = |take| Mode::Permits { take, max: 3 };
        assert!(grantable(
            [h("a", p(1)), h("a", p(1))],
            "a",
            p(1),
            false,
            false
        ));
        assert!(!grantable(
            [h("a", p(2)), h("b", p(1))],
            "a",
            p(1),
            false,
            false
        ));
        assert!(!grantable([h("b", Mode::Shared)], "a", p(1), false, false));
        assert!(!grantable(
            [h("b", p(1))],
            "a",
            Mode::Exclusive,
            false,
            false
        ));
        assert!(!grantable(
            [],
            "a",
            Mode::Permits { take: 4, max: 3 },
            false,
            false
        ));
    }

    #[test]
    fn tokens_rise() {
        let a = next_token(0);
        assert!(a > 1_600_000_000_000_000);
        assert_eq!(next_token(u64::MAX / 2), u64::MAX / 2 + 1);
    }
}
