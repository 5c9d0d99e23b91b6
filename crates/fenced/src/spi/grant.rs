//! The grant rule shared by every backend that decides grants itself
//! (memory, SQLite, and the SQL lease table): one machine for mutexes,
//! read-write locks and semaphores.

use crate::spi::Mode;
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
/// - A semaphore's size is the one its holders took it with: a request
///   that counts another number of permits is refused (`Err` with the
///   holders' count), since letting it in would let holders believe in
///   two different limits at once.
pub(crate) fn grantable<'a>(
    holders: impl IntoIterator<Item = Held<'a>>,
    owner_key: &str,
    mode: Mode,
    fair: bool,
    queued_ahead: bool,
) -> Result<bool, u32> {
    let mut permits_used: u64 = 0;
    let mut conflict = false;
    for h in holders {
        let same_owner = h.owner_key == owner_key;
        match (h.mode, mode) {
            (Mode::Permits { max: theirs, .. }, Mode::Permits { max, .. }) if theirs != max => {
                return Err(theirs);
            }
            (Mode::Permits { take, .. }, Mode::Permits { .. }) => permits_used += u64::from(take),
            (Mode::Permits { .. }, _) | (_, Mode::Permits { .. }) => conflict = true,
            _ if same_owner => {}
            (Mode::Shared, Mode::Shared) => {}
            _ => conflict = true,
        }
    }
    if conflict || (fair && queued_ahead) {
        return Ok(false);
    }
    Ok(match mode {
        Mode::Permits { take, max } => permits_used + u64::from(take) <= u64::from(max),
        _ => true,
    })
}

/// The refusal of a semaphore request whose count of permits differs from
/// the one its holders took it with.
pub(crate) fn permits_differ(name: &str, theirs: u32, ours: u32) -> String {
    format!(
        "semaphore {name:?} is held as a semaphore of {theirs} permits; this request \
         counts {ours}: every client of one semaphore must give it the same number of permits"
    )
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
    last.saturating_add(1).max(now_us)
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
        let ok = |r: Result<bool, u32>| r.unwrap();
        assert!(ok(grantable([], "a", x, false, false)));
        assert!(!ok(grantable([h("b", x)], "a", x, false, false)));
        assert!(
            ok(grantable([h("a", x)], "a", x, false, false)),
            "reentrant"
        );
        assert!(
            ok(grantable([h("a", x)], "a", s, false, false)),
            "writer takes read"
        );
        assert!(!ok(grantable([h("b", x)], "a", s, false, false)));
        assert!(ok(grantable([h("b", s), h("c", s)], "a", s, false, false)));
        assert!(!ok(grantable([h("b", s)], "a", x, false, false)));
        assert!(
            !ok(grantable([], "a", x, true, true)),
            "fair waits its turn"
        );
        assert!(ok(grantable([], "a", x, false, true)), "unfair barges");
    }

    #[test]
    fn permits() {
        let p = |take| Mode::Permits { take, max: 3 };
        let g = |holders: Vec<Held<'static>>, mode| grantable(holders, "a", mode, false, false);
        assert_eq!(g(vec![h("a", p(1)), h("a", p(1))], p(1)), Ok(true));
        assert_eq!(g(vec![h("a", p(2)), h("b", p(1))], p(1)), Ok(false));
        assert_eq!(g(vec![h("b", Mode::Shared)], p(1)), Ok(false));
        assert_eq!(g(vec![h("b", p(1))], Mode::Exclusive), Ok(false));
        assert_eq!(g(vec![], Mode::Permits { take: 4, max: 3 }), Ok(false));
        // Another size than the holders': refused, whether it would fit or not.
        let five = |take| Mode::Permits { take, max: 5 };
        assert_eq!(g(vec![h("b", p(1))], five(1)), Err(3));
        assert_eq!(g(vec![h("b", p(3))], five(1)), Err(3));
    }

    #[test]
    fn tokens_rise() {
        let a = next_token(0);
        assert!(a > 1_600_000_000_000_000);
        assert_eq!(next_token(u64::MAX / 2), u64::MAX / 2 + 1);
    }
}
