//! The grant rule shared by every backend that decides grants itself
//! (memory, SQLite, and the SQL lease table): one machine for mutexes,
//! read-write locks and semaphores.

use crate::spi::{Attempt, HolderInfo, Mode};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// A live hold as a lease table stores it, read in an attempt's
/// transaction.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) struct LiveHold {
    pub(crate) hold_id: String,
    pub(crate) owner: String,
    pub(crate) mode: Mode,
    pub(crate) token: u64,
    /// Lease left, by the database's clock (negative: expired).
    pub(crate) left_ms: i64,
    /// Its holder's record (see `holder`), where it was read.
    pub(crate) holder: Option<String>,
}

#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
impl LiveHold {
    /// Lease left, none if expired.
    pub(crate) fn lease_left(&self) -> Duration {
        Duration::from_millis(self.left_ms.max(0) as u64)
    }

    /// What status reports of it; `None` once its lease ran out.
    pub(crate) fn holder(self) -> Option<HolderInfo> {
        (self.left_ms > 0).then(|| HolderInfo {
            lease_left: self.lease_left(),
            owner: self.owner,
            mode: self.mode,
            token: self.token,
            holder: self
                .holder
                .and_then(|h| crate::Holder::decode(h.as_bytes())),
        })
    }
}

/// What the lease tables' attempt comes to, decided from what its
/// transaction read (as Curator's `StandardLockInternalsDriver.getsTheLock`
/// decides from the children it listed); the backend then writes it.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Grant it: a new token, a new hold, the queue place dropped.
    Grant,
    /// It can never be granted as asked.
    Refuse(String),
    /// Busy: keep or take a queue place, and look again by `retry_after`
    /// (when the first holder's lease runs out) if no wake-up comes.
    Wait { retry_after: Option<Duration> },
}

/// The grant of this very attempt, if an earlier try of it went through
/// but its answer was lost: the grant stands (as the Redis script has it).
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn stands(req: &Attempt, holds: &[LiveHold]) -> Option<u64> {
    holds
        .iter()
        .find(|h| h.hold_id == req.hold_id)
        .map(|h| h.token)
}

/// Decides `req` against the live `holds`, `queued_ahead` saying whether
/// an earlier live fair waiter stands in front of it.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) fn decide(req: &Attempt, holds: &[LiveHold], queued_ahead: bool) -> Decision {
    let held = holds.iter().map(|h| Held {
        owner_key: &h.owner,
        mode: h.mode,
    });
    match grantable(held, &req.owner_key, req.mode, req.fair, queued_ahead) {
        Err(theirs) => Decision::Refuse(permits_differ(
            req.name.as_str(),
            theirs,
            req.mode.permits().1,
        )),
        Ok(true) => Decision::Grant,
        Ok(false) => Decision::Wait {
            retry_after: holds
                .iter()
                .map(|h| Duration::from_millis(h.left_ms.max(1) as u64))
                .min(),
        },
    }
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

    fn live(hold_id: &str, owner: &str, mode: Mode, left_ms: i64) -> LiveHold {
        LiveHold {
            hold_id: hold_id.into(),
            owner: owner.into(),
            mode,
            token: 7,
            left_ms,
            holder: None,
        }
    }

    fn attempt(hold_id: &str, owner_key: &str, mode: Mode) -> Attempt {
        Attempt {
            name: crate::name::LockName::new("n").unwrap(),
            owner_key: owner_key.into(),
            hold_id: hold_id.into(),
            mode,
            kind: Default::default(),
            lease: Duration::from_secs(30),
            fair: false,
            will_wait: true,
            until: None,
            ticket: None,
            holder: String::new(),
        }
    }

    #[test]
    fn a_decision_from_what_a_transaction_read() {
        let x = Mode::Exclusive;
        let holds = [live("h1", "b", x, 900), live("h2", "c", Mode::Shared, 300)];
        assert_eq!(stands(&attempt("h2", "c", x), &holds), Some(7));
        assert_eq!(stands(&attempt("h3", "a", x), &holds), None);
        assert_eq!(
            decide(&attempt("h3", "a", x), &holds, false),
            Decision::Wait {
                retry_after: Some(Duration::from_millis(300))
            },
            "waits for the first lease to run out"
        );
        assert_eq!(decide(&attempt("h3", "a", x), &[], false), Decision::Grant);
        let sem = |take| Mode::Permits { take, max: 3 };
        let other = Mode::Permits { take: 1, max: 4 };
        assert!(matches!(
            decide(
                &attempt("h3", "a", other),
                &[live("h1", "b", sem(1), 1)],
                false
            ),
            Decision::Refuse(_)
        ));
    }
}
