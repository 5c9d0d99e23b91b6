//! What the simulation records, and the invariants it checks against.

use crate::spi::sync::unpoisoned;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// One stretch of time a task believed it held the lock, from the moment
/// its acquisition returned to the moment it stopped believing: it let go
/// (released, dropped, was aborted) or its lost signal fired.
#[derive(Clone, Debug)]
pub(super) struct Belief {
    pub(super) task: usize,
    pub(super) client: usize,
    pub(super) token: u64,
    pub(super) from: Duration,
    pub(super) to: Duration,
    pub(super) how: String,
}

/// The run's record: a trace for replay, the beliefs, and what broke.
pub(super) struct Log {
    start: Instant,
    inner: Mutex<Record>,
}

#[derive(Default)]
pub(super) struct Record {
    pub(super) trace: Vec<String>,
    pub(super) beliefs: Vec<Belief>,
    pub(super) breaches: Vec<String>,
    /// When the server dropped holds it had promised (a session killed,
    /// a restart that lost the state).
    pub(super) kills: Vec<Kill>,
    pub(super) grants: usize,
    pub(super) lost: usize,
    pub(super) cancelled: usize,
}

impl Log {
    pub(super) fn new() -> Arc<Log> {
        Arc::new(Log {
            start: Instant::now(),
            inner: Mutex::default(),
        })
    }

    pub(super) fn now(&self) -> Duration {
        self.start.elapsed()
    }

    pub(super) fn note(&self, who: &str, what: impl std::fmt::Display) {
        let line = format!("{:>12.3?} {who} {what}", self.now());
        unpoisoned(&self.inner).trace.push(line);
    }

    pub(super) fn breach(&self, what: impl std::fmt::Display) {
        let line = format!("{:?}: {what}", self.now());
        unpoisoned(&self.inner).breaches.push(line);
    }

    pub(super) fn with<T>(&self, f: impl FnOnce(&mut Record) -> T) -> T {
        f(&mut unpoisoned(&self.inner))
    }

    pub(super) fn take(&self) -> Record {
        std::mem::take(&mut unpoisoned(&self.inner))
    }
}

/// The server dropped holds it had granted: at `at`, those of `client`
/// (`None`: everyone's), the ones with tokens up to `upto` (the last
/// token it had issued then).
#[derive(Clone, Copy, Debug)]
pub(super) struct Kill {
    pub(super) at: Duration,
    pub(super) client: Option<usize>,
    pub(super) upto: u64,
}

/// A task's belief while it lasts; recorded when it ends, however it
/// ends (a task aborted in the middle of its hold ends it too).
pub(super) struct Holding {
    pub(super) log: Arc<Log>,
    pub(super) task: usize,
    pub(super) client: usize,
    pub(super) token: u64,
    pub(super) from: Duration,
    pub(super) how: Option<String>,
}

impl Holding {
    pub(super) fn end(mut self, how: impl Into<String>) {
        self.how = Some(how.into());
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let how = self.how.take().unwrap_or_else(|| "aborted".into());
        let to = self.log.now();
        self.log.note(
            &format!("t{}", self.task),
            format_args!("ends its hold: {how}"),
        );
        self.log.with(|r| {
            r.beliefs.push(Belief {
                task: self.task,
                client: self.client,
                token: self.token,
                from: self.from,
                to,
                how,
            })
        });
    }
}

/// Exclusion and rising tokens over the beliefs of one exclusive lock: no
/// two beliefs overlap (each is half-open: one that ends at the instant
/// another begins does not overlap it), and in the order they began, their
/// tokens rise.
///
/// A belief whose hold the server dropped (`kills`: granted before the
/// kill, believed after it) may overlap a belief whose grant came after
/// the kill, and may even begin after it (its reply was on its way): no
/// client can know of a kill before the next grant. Tokens still rise in
/// the order of grants, and a belief the server broke is the only one
/// that can begin after a later grant's.
pub(super) fn exclusion(beliefs: &[Belief], kills: &[Kill]) -> Vec<String> {
    let mut b: Vec<&Belief> = beliefs.iter().filter(|b| b.to > b.from).collect();
    b.sort_by_key(|b| (b.from, b.to));
    let broken = |x: &Belief, other: &Belief| {
        kills.iter().any(|k| {
            k.client.is_none_or(|c| c == x.client)
                && x.token <= k.upto
                && k.at < x.to
                && other.token > k.upto
        })
    };
    let excused = |x: &Belief, y: &Belief| broken(x, y) || broken(y, x);
    let mut out = Vec::new();
    for (i, x) in b.iter().enumerate() {
        for y in &b[i + 1..] {
            if y.from >= x.to {
                break;
            }
            if !excused(x, y) {
                out.push(format!(
                    "overlap: t{} (token {}) believed it held from {:?} to {:?} ({}), \
                     t{} (token {}) from {:?}",
                    x.task, x.token, x.from, x.to, x.how, y.task, y.token, y.from
                ));
            }
        }
    }
    for w in b.windows(2) {
        if w[1].token <= w[0].token && !excused(w[0], w[1]) {
            out.push(format!(
                "token fell: t{} got {} at {:?} after t{} got {} at {:?}",
                w[1].task, w[1].token, w[1].from, w[0].task, w[0].token, w[0].from
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(task: usize, token: u64, from: u64, to: u64) -> Belief {
        Belief {
            task,
            client: task,
            token,
            from: Duration::from_millis(from),
            to: Duration::from_millis(to),
            how: "released".into(),
        }
    }

    #[test]
    fn the_checker_sees_overlaps_and_falling_tokens_and_nothing_else() {
        let none = &[];
        assert!(exclusion(&[b(0, 1, 0, 10), b(1, 2, 10, 20), b(2, 3, 25, 25)], none).is_empty());
        let overlap = exclusion(&[b(0, 1, 0, 10), b(1, 2, 9, 20)], none);
        assert_eq!(overlap.len(), 1, "{overlap:?}");
        assert!(overlap[0].starts_with("overlap"));
        // A kill at 8 ms of t0's hold (token 1, the last one then)
        // excuses t1's grant after it (token 2), whichever belief began
        // first; a kill of another client's holds, or one before t0's
        // grant, excuses nothing.
        let kill = |ms, client, upto| Kill {
            at: Duration::from_millis(ms),
            client,
            upto,
        };
        let (x, y) = (b(0, 1, 0, 10), b(1, 2, 9, 20));
        assert!(exclusion(&[x.clone(), y.clone()], &[kill(8, Some(0), 1)]).is_empty());
        let late = b(0, 1, 12, 30);
        assert!(exclusion(&[late, y.clone()], &[kill(8, None, 1)]).is_empty());
        assert_eq!(
            exclusion(&[x.clone(), y.clone()], &[kill(8, Some(1), 1)]).len(),
            1
        );
        assert_eq!(exclusion(&[x, y], &[kill(8, None, 0)]).len(), 1);
        let fell = exclusion(&[b(0, 5, 0, 10), b(1, 2, 10, 20)], none);
        assert_eq!(fell.len(), 1, "{fell:?}");
        assert!(fell[0].starts_with("token fell"));
    }
}
