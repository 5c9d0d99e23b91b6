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
    /// Which lock.
    pub(super) lock: usize,
    pub(super) client: usize,
    pub(super) token: u64,
    /// When the server granted it: the belief must not overlap the one
    /// before it from here on, though the reply came later.
    pub(super) granted: Option<Duration>,
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
    /// When the server granted each (lock, token) first.
    pub(super) granted: std::collections::BTreeMap<(String, u64), Duration>,
    pub(super) grants: usize,
    /// Acquisitions in progress, and when recent ones ended.
    pub(super) waiting: usize,
    pub(super) ended: Vec<Duration>,
    /// Tasks in a blocking acquisition now: since when, and the locks it
    /// waits for (a bit per lock).
    pub(super) blocked: std::collections::BTreeMap<usize, (Duration, u8)>,
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
    pub(super) lock: usize,
    pub(super) client: Option<usize>,
    pub(super) upto: u64,
    /// How long after the kill its holders may still believe.
    pub(super) within: Duration,
}

/// A task's belief while it lasts; recorded when it ends, however it
/// ends (a task aborted in the middle of its hold ends it too).
pub(super) struct Holding {
    pub(super) log: Arc<Log>,
    pub(super) task: usize,
    pub(super) lock: usize,
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
                lock: self.lock,
                client: self.client,
                token: self.token,
                granted: None,
                from: self.from,
                to,
                how,
            })
        });
    }
}

/// Exclusion and rising tokens over the beliefs of one exclusive lock, in
/// the order the server granted them: no belief may last past the
/// server's next grant (so a lost signal later than the grant is a
/// breach, though the new holder hears of its grant later still), and
/// tokens rise. Beliefs never held (acquired already lost) are left out.
///
/// A belief whose hold the server dropped (`kills`: granted before the
/// kill, believed after it) may overlap a grant made after the kill: no
/// client can know of a kill before the next grant. It must end within
/// the kill's `within` (RELIABILITY's I4), and tokens still rise.
pub(super) fn exclusion(beliefs: &[Belief], kills: &[Kill]) -> Vec<String> {
    let start = |b: &Belief| b.granted.unwrap_or(b.from);
    let mut b: Vec<&Belief> = beliefs.iter().filter(|b| b.to > b.from).collect();
    b.sort_by_key(|b| (start(b), b.token));
    let broken = |x: &Belief, other: &Belief| {
        kills.iter().any(|k| {
            k.client.is_none_or(|c| c == x.client)
                && x.token <= k.upto
                && k.at < x.to
                && x.to <= k.at + k.within
                && other.token > k.upto
        })
    };
    let excused = |x: &Belief, y: &Belief| broken(x, y) || broken(y, x);
    let mut out = Vec::new();
    for (i, x) in b.iter().enumerate() {
        for y in &b[i + 1..] {
            if start(y) >= x.to {
                break;
            }
            if !excused(x, y) {
                out.push(format!(
                    "overlap: t{} (token {}) believed it held from {:?} to {:?} ({}); \
                     t{} (token {}) was granted at {:?} (told at {:?})",
                    x.task,
                    x.token,
                    x.from,
                    x.to,
                    x.how,
                    y.task,
                    y.token,
                    start(y),
                    y.from
                ));
            }
        }
    }
    for w in b.windows(2) {
        if w[1].token <= w[0].token && !excused(w[0], w[1]) {
            out.push(format!(
                "token fell: t{} got {} at {:?} after t{} got {} at {:?}",
                w[1].task,
                w[1].token,
                start(w[1]),
                w[0].task,
                w[0].token,
                start(w[0])
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
            lock: 0,
            client: task,
            token,
            granted: None,
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
            lock: 0,
            client,
            upto,
            within: Duration::from_millis(100),
        };
        let (x, y) = (b(0, 1, 0, 10), b(1, 2, 9, 20));
        assert!(exclusion(&[x.clone(), y.clone()], &[kill(8, Some(0), 1)]).is_empty());
        let late = b(0, 1, 12, 30);
        assert!(exclusion(&[late, y.clone()], &[kill(8, None, 1)]).is_empty());
        assert_eq!(
            exclusion(&[x.clone(), y.clone()], &[kill(8, Some(1), 1)]).len(),
            1
        );
        assert_eq!(exclusion(&[x, y.clone()], &[kill(8, None, 0)]).len(), 1);
        // Excused only until the holder should have been told.
        let told_late = b(0, 1, 0, 500);
        assert_eq!(exclusion(&[told_late, y], &[kill(8, Some(0), 1)]).len(), 1);
        // Measured from the server's grant, not from its reply.
        let mut z = b(1, 2, 12, 20);
        z.granted = Some(Duration::from_millis(9));
        assert_eq!(exclusion(&[b(0, 1, 0, 10), z], &[]).len(), 1);
        let fell = exclusion(&[b(0, 5, 0, 10), b(1, 2, 10, 20)], none);
        assert_eq!(fell.len(), 1, "{fell:?}");
        assert!(fell[0].starts_with("token fell"));
    }
}
