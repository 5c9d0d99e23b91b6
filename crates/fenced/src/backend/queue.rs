//! What the backends built on ordered keys share (etcd's create revisions,
//! ZooKeeper's sequential nodes): the grant rule over a FIFO queue of
//! holds and waiters, and fenced registers stored as one value that a
//! compare-and-set replaces.

use crate::error::{Error, Result};
use crate::name::LockName;
use crate::spi::grant::permits_differ;
use crate::spi::{Attempt, Blocked, BoxFuture, Mode, Outcome};
use std::future::Future;
use std::sync::Arc;

/// What a queued key waits for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    Granted,
    /// The deletion of this key.
    Key(Vec<u8>),
    /// Any deletion in the queue (a semaphore waits for permits).
    Any,
    /// Never: a semaphore key ahead counts this many permits, not ours.
    Refused(u32),
}

/// The grant rule over a queue in creation order: what the key at `me`
/// waits for. A key is granted when nothing ahead of it conflicts: for an
/// exclusive key, no key ahead; for a read key, no exclusive key ahead; for
/// permits, only permit keys ahead, taking with it no more than the
/// permits. `own(i)` is true for keys of the same owner, which never block
/// it (a writer taking read, one owner's permits). A semaphore key behind
/// one that counts another number of permits is refused (see
/// `spi::grant::grantable`).
pub(crate) fn waits_for(q: &[(&[u8], Mode)], me: usize, own: impl Fn(usize) -> bool) -> Wait {
    let ahead = (0..me).filter(|&i| !own(i));
    match q[me].1 {
        Mode::Exclusive => match ahead.last() {
            Some(i) => Wait::Key(q[i].0.to_vec()),
            None => Wait::Granted,
        },
        Mode::Shared => match ahead.filter(|&i| q[i].1 != Mode::Shared).last() {
            Some(i) => Wait::Key(q[i].0.to_vec()),
            None => Wait::Granted,
        },
        Mode::Permits { take, max } => {
            let mut used = u64::from(take);
            for (i, (key, mode)) in q[..me].iter().enumerate() {
                match mode {
                    Mode::Permits { max: theirs, .. } if *theirs != max => {
                        return Wait::Refused(*theirs);
                    }
                    Mode::Permits { take, .. } => used += u64::from(*take),
                    _ if own(i) => {}
                    _ => return Wait::Key(key.to_vec()),
                }
            }
            if used <= u64::from(max) {
                Wait::Granted
            } else {
                Wait::Any
            }
        }
    }
}

/// Which keys of a queue hold, given each key's owner where known.
pub(crate) fn grants(q: &[(&[u8], Mode)], owners: &[Option<String>]) -> Vec<bool> {
    (0..q.len())
        .map(|i| {
            waits_for(q, i, |j| {
                j != i && owners[j].is_some() && owners[j] == owners[i]
            }) == Wait::Granted
        })
        .collect()
}

/// A register as one stored value: 20 decimal digits of fence, `:`, the value.
pub(crate) fn encode_register(fence: u64, value: &[u8]) -> Vec<u8> {
    let mut raw = format!("{fence:020}:").into_bytes();
    raw.extend_from_slice(value);
    raw
}

/// The value and fence of a stored register; `Protocol` if it is not one.
pub(crate) fn decode_register(name: &LockName, raw: &[u8]) -> Result<(Vec<u8>, u64)> {
    raw.get(..20)
        .and_then(|f| std::str::from_utf8(f).ok()?.parse::<u64>().ok())
        .filter(|_| raw.get(20) == Some(&b':'))
        .map(|fence| (raw[21..].to_vec(), fence))
        .ok_or_else(|| {
            Error::protocol(format!(
                "the register of {:?} holds something else (want 20 digits of fence, ':', value)",
                name.as_str()
            ))
        })
}

/// Read, decide, write if unchanged since the read; again on a lost race.
/// `read` gives the value, fence and a version to compare; `write` stores
/// the encoded register if the version is still the one read (`None`:
/// still absent) and says whether it did; `decide` returns the new value
/// and fence, or `None` to refuse (then `Ok(false)`).
pub(crate) async fn register_cas<V, R, W, D>(
    name: &LockName,
    mut read: impl FnMut() -> R,
    mut write: impl FnMut(Option<V>, Vec<u8>) -> W,
    mut decide: D,
) -> Result<bool>
where
    R: Future<Output = Result<Option<(Vec<u8>, u64, V)>>>,
    W: Future<Output = Result<bool>>,
    D: FnMut(Option<(&[u8], u64)>) -> Result<Option<(Vec<u8>, u64)>>,
{
    for _ in 0..100 {
        let old = read().await?;
        let seen = old.as_ref().map(|(v, f, _)| (v.as_slice(), *f));
        let Some((value, fence)) = decide(seen)? else {
            return Ok(false);
        };
        if write(old.map(|(_, _, ver)| ver), encode_register(fence, &value)).await? {
            return Ok(true);
        }
    }
    Err(Error::unavailable(format!(
        "register {:?} changed under us 100 times in a row",
        name.as_str()
    )))
}

/// Runs `end` (a withdrawal or release) until it succeeds or fails for
/// good, backing off 50 ms doubling to 1 s over transient errors (a
/// leader election, a reconnect), at most `tries` times and while `worth`
/// says the session that owns the key or node still lives (when it ends,
/// the key goes with it). Used where the caller has gone: a hold whose key
/// outlived a failed release would block the lock for as long as the
/// client's session lives.
pub(crate) async fn retry_transient<F, Fut, T>(mut end: F, tries: u32, worth: impl Fn() -> bool)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = crate::error::Result<T>>,
{
    let mut pause = std::time::Duration::from_millis(50);
    for _ in 0..tries {
        if !worth() {
            return;
        }
        match end().await {
            Err(e) if e.is_transient() => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(1));
            }
            _ => return,
        }
    }
}

/// Tries for a withdrawal someone waits on (about 15 s).
pub(crate) const TRIES_WAITED_ON: u32 = 20;
/// Tries for a release nobody waits on any more (about 10 minutes).
pub(crate) const TRIES_IN_BACKGROUND: u32 = 600;

/// A backend whose holds and queue places are keys or nodes of the
/// client's session (etcd, ZooKeeper), ended by deleting them.
pub(crate) trait SessionKeys: Send + Sync + 'static {
    /// Deletes the key of `hold_id`, retrying transient errors up to
    /// `tries` times while the session lasts.
    fn end_patiently<'a>(&'a self, hold_id: &'a str, tries: u32) -> BoxFuture<'a, ()>;

    /// Whether the key of `hold_id` is still tracked (not yet deleted).
    fn tracks(&self, hold_id: &str) -> bool;
}

/// Goes on deleting the key of `hold_id` in the background while the
/// session lives: a release or withdrawal whose tries all failed.
pub(crate) fn end_in_background<K: SessionKeys>(keys: Arc<K>, hold_id: String) {
    tokio::spawn(async move { keys.end_patiently(&hold_id, TRIES_IN_BACKGROUND).await });
}

/// Withdraws a cancelled acquisition's key (a place or a grant); if every
/// try fails it goes on in the background, or the key would block the
/// lock until the session ends.
pub(crate) async fn withdraw<K: SessionKeys>(keys: &Arc<K>, hold_id: &str) {
    keys.end_patiently(hold_id, TRIES_WAITED_ON).await;
    if keys.tracks(hold_id) {
        end_in_background(keys.clone(), hold_id.to_owned());
    }
}

/// How an attempt whose key is not granted ends when it does not wait
/// there: refused (a semaphore key ahead counts other permits), or busy
/// for a caller that will not wait; its key is deleted first. `None` when
/// the caller waits on the key.
pub(crate) async fn unwaited<K: SessionKeys>(
    keys: &K,
    req: &Attempt,
    wait: &Wait,
) -> Option<Outcome> {
    let outcome = match wait {
        Wait::Refused(theirs) => {
            let ours = req.mode.permits().1;
            Outcome::Refused(permits_differ(req.name.as_str(), *theirs, ours))
        }
        _ if !req.will_wait => Outcome::Busy(Blocked {
            ticket: None,
            retry_after: None,
        }),
        _ => return None,
    };
    keys.end_patiently(&req.hold_id, TRIES_WAITED_ON).await;
    Some(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q<'a>(items: &[(&'a str, Mode)]) -> Vec<(&'a [u8], Mode)> {
        items.iter().map(|(k, m)| (k.as_bytes(), *m)).collect()
    }

    #[test]
    fn grant_rule_is_fifo_per_mode() {
        use Mode::{Exclusive as X, Shared as S};
        let q1 = q(&[("n/1", S), ("n/2", S), ("n/3", X), ("n/4", S)]);
        let none = |_| false;
        assert_eq!(waits_for(&q1, 0, none), Wait::Granted);
        assert_eq!(waits_for(&q1, 1, none), Wait::Granted);
        assert_eq!(waits_for(&q1, 2, none), Wait::Key(b"n/2".to_vec()));
        assert_eq!(waits_for(&q1, 3, none), Wait::Key(b"n/3".to_vec()));
        let p = |take| Mode::Permits { take, max: 3 };
        let q2 = q(&[("s/1", p(2)), ("s/2", p(1)), ("s/3", p(1))]);
        assert_eq!(waits_for(&q2, 1, none), Wait::Granted);
        assert_eq!(waits_for(&q2, 2, none), Wait::Any);
        let q3 = q(&[("s/1", p(1)), ("s/2", Mode::Permits { take: 1, max: 5 })]);
        assert_eq!(waits_for(&q3, 1, none), Wait::Refused(3));
        // An owner's own keys never block it.
        assert_eq!(waits_for(&q1, 2, |i| i < 2), Wait::Granted);
        let owners = [Some("a".to_owned()), None, Some("a".to_owned()), None];
        assert_eq!(grants(&q1, &owners), vec![true, true, false, false]);
    }

    #[test]
    fn registers_round_trip() {
        let n = LockName::new("r").unwrap();
        let raw = encode_register(42, b"x:y");
        assert_eq!(decode_register(&n, &raw).unwrap(), (b"x:y".to_vec(), 42));
        assert!(decode_register(&n, b"42:x").is_err());
    }
}
