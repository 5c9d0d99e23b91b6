//! The history checker: exclusion, fencing, lost signals, token order and
//! recovery, from the events every process of a run recorded.

use super::{Event, Fault, Kind};
use serde::Serialize;

/// The figures of one run (RELIABILITY.md, "Figures each run reports").
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Findings {
    /// Holds begun (acquisitions).
    pub holds: u64,
    /// Episodes in which two or more workers believed they held the lock.
    pub overlaps: u64,
    /// Their total length, ms.
    pub overlap_ms: f64,
    /// Fenced writes the register accepted.
    pub writes_accepted: u64,
    /// Writes the register refused: a higher token had written.
    pub stale_rejected: u64,
    /// Accepted writes whose token was below one accepted before they were
    /// sent (I1; must be 0 whatever the fault).
    pub stale_accepted: u64,
    /// Accepted writes minus what the counter shows: read-modify-writes
    /// that overwrote each other (negative: a killed worker's write was
    /// accepted but never recorded).
    pub lost_updates: i64,
    /// Of those, the ones a write sent after its own hold's lost signal
    /// took part in: workers write on after the signal on purpose (a
    /// refused late write is what fencing is for), and a late write the
    /// register takes because the next holder has read but not yet
    /// written overwrites that holder's increment. The library told the
    /// writer first, so that is the writer's breach, not the lock's (I2
    /// counts `lost_updates` less these).
    pub lost_updates_after_signal: i64,
    /// Lost updates the lock caused, counted value by value: a value the
    /// register took k times lost k − 1 increments, less those a write
    /// sent after its own lost signal took part in. Unlike the difference
    /// `lost_updates` − `lost_updates_after_signal`, a killed worker's
    /// write the register took but nobody recorded cannot hide one (I2
    /// fails on either).
    pub lost_updates_by_lock: i64,
    /// Acquisitions whose token was below one granted before they asked (I7).
    pub token_regressions: u64,
    /// Lost signals that fired.
    pub signals_fired: u64,
    /// Holds whose write was refused, released without a lost signal (I4).
    pub signals_missing: u64,
    /// Holds the side probe found the backend no longer naming, still
    /// believed past the signal bound after that (I4: a missed signal).
    pub signals_missed: u64,
    /// Lost signals that fired outside every fault's window: under
    /// contention alone a healthy backend never loses a hold (I4: false).
    pub signals_false: u64,
    /// Side probes of the lock's state read during the run.
    pub probes: u64,
    /// Operations that failed and were retried (the server away).
    pub errors: u64,
    /// Acquisitions a cancellation storm dropped before they returned.
    pub cancelled: u64,
    /// Holds the side probe named, first during a cancellation storm,
    /// that no worker was ever given and that stayed named past the
    /// cleanup bound: what a dropped acquisition leaked.
    pub leaked_grants: u64,
    /// How long the lock took to be granted again after each fault (I3).
    pub recoveries: Vec<Recovery>,
    /// Recoveries past their bound, or that never came while the run went on.
    pub late_recoveries: u64,
    /// Overlaps that began outside every fault's window (from its start
    /// to its bound after its end): contention alone must never cause one.
    pub overlaps_outside_faults: u64,
}

/// The recovery after one fault.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recovery {
    /// The fault.
    pub fault: Fault,
    /// From the fault (or its healing, for server faults) to the next
    /// grant to a worker other than its victim, ms; `None` if none came.
    pub ms: Option<f64>,
    /// The backend's bound, ms.
    pub bound_ms: u64,
    /// Past the bound, or none while the run lasted at least the bound.
    pub late: bool,
    /// Overlaps that began in the fault's window (its start to its bound
    /// after its end) and after every later fault's start.
    pub overlaps: u64,
    /// Their total length, ms.
    pub overlap_ms: f64,
    /// Lost signals that fired in the fault's window: the fault showed
    /// where it took a hold from a client that then knew it.
    pub signals: u64,
    /// Calls that failed in workers while the fault lasted (its start to
    /// its healing): the fault showed where clients could not reach the
    /// lock (a full disk, a full server).
    pub errors: u64,
    /// Grants to workers while the fault lasted, and in as long a time
    /// just before it: a fault that shuts clients out slows them.
    pub grants_during: u64,
    /// See [`grants_during`](Self::grants_during).
    pub grants_before: u64,
}

/// What the checker needs to judge the side probes (I4).
#[derive(Clone, Copy, Debug)]
pub struct Probing {
    /// How long after the backend stops naming a hold its lost signal may
    /// take: a renewal interval plus a request timeout (RELIABILITY.md).
    pub signal_bound_ms: u64,
    /// Whether the backend's status names holds by their own tokens (all
    /// but advisory locks, which name only that the lock is held).
    pub names_tokens: bool,
    /// How long a grant whose acquisition was dropped may stay before the
    /// client withdraws it: the withdrawal, and a second one a request
    /// timeout later for a try of unknown fate (two request timeouts and
    /// a second's room).
    pub cleanup_bound_ms: u64,
}

struct Hold {
    start: u64,
    end: Option<u64>,
    token: u64,
    refused: bool,
    lost: bool,
    /// When its lost signal fired.
    lost_at: Option<u64>,
}

#[derive(Default)]
struct WorkerState {
    open: Option<usize>,
    last: Option<usize>,
}

/// Checks a run's history; `counter` is the register's final value (it
/// starts at 0 and each accepted write sets it to what was read + 1).
/// Side probes, if any, are judged with a signal bound of 10 s.
pub fn check(events: &[Event], counter: i64) -> Findings {
    check_with(
        events,
        counter,
        Probing {
            signal_bound_ms: 10_000,
            names_tokens: true,
            cleanup_bound_ms: 11_000,
        },
    )
}

/// [`check`], with side probes judged by `probing`.
pub fn check_with(events: &[Event], counter: i64, probing: Probing) -> Findings {
    let mut ev: Vec<&Event> = events.iter().collect();
    ev.sort_by_key(|e| e.t);
    let end_of_run = ev.last().map_or(0, |e| e.t);
    let mut f = Findings::default();
    let mut holds: Vec<Hold> = Vec::new();
    let mut workers: std::collections::HashMap<u32, WorkerState> = Default::default();
    let mut grants: Vec<(u64, u64, u64, u32)> = Vec::new(); // (t, asked, token, w)
    let mut accepted: Vec<(u64, u64, u64)> = Vec::new(); // (t, sent, token)
    // Per value written: how many accepted writes wrote it, and how many
    // of those were sent after their hold's lost signal.
    let mut values: std::collections::HashMap<i64, (i64, i64)> = Default::default();
    let mut probes: Vec<(u64, u64, &[u64], u32)> = Vec::new(); // (sent, t, named, holders)
    let mut signals: Vec<u64> = Vec::new(); // when lost signals fired
    let mut released: std::collections::HashMap<u64, u64> = Default::default(); // token -> called
    for e in &ev {
        let st = workers.entry(e.w).or_default();
        let close = |st: &mut WorkerState, holds: &mut Vec<Hold>| {
            if let Some(i) = st.open.take() {
                holds[i].end = Some(e.t);
            }
        };
        match &e.e {
            Kind::Acquired { token, asked } => {
                close(st, &mut holds);
                holds.push(Hold {
                    start: e.t,
                    end: None,
                    token: *token,
                    refused: false,
                    lost: false,
                    lost_at: None,
                });
                st.open = Some(holds.len() - 1);
                st.last = st.open;
                grants.push((e.t, *asked, *token, e.w));
            }
            Kind::Write {
                token,
                sent,
                accepted: ok,
                value,
            } => {
                if *ok {
                    accepted.push((e.t, *sent, *token));
                    let late = st
                        .last
                        .map(|i| &holds[i])
                        .filter(|h| h.token == *token)
                        .and_then(|h| h.lost_at)
                        .is_some_and(|at| at <= *sent);
                    let v = values.entry(*value).or_default();
                    v.0 += 1;
                    v.1 += i64::from(late);
                } else {
                    f.stale_rejected += 1;
                    if let Some(h) = st.last.map(|i| &mut holds[i]).filter(|h| h.token == *token) {
                        h.refused = true;
                    }
                }
            }
            Kind::Lost { .. } => {
                f.signals_fired += 1;
                signals.push(e.t);
                if let Some(i) = st.last {
                    holds[i].lost = true;
                    holds[i].lost_at.get_or_insert(e.t);
                }
                close(st, &mut holds);
            }
            Kind::Released { called, .. } => {
                if let Some(i) = st.open.take() {
                    holds[i].end = Some((*called).min(e.t));
                    released.insert(holds[i].token, *called);
                }
                if let Some(h) = st.last.take().map(|i| &holds[i])
                    && h.refused
                    && !h.lost
                {
                    f.signals_missing += 1;
                }
            }
            Kind::Exited => {
                close(st, &mut holds);
                st.last = None;
            }
            Kind::Error { .. } => f.errors += 1,
            Kind::Storm { dropped, .. } => f.cancelled += dropped,
            Kind::Probe {
                sent,
                named,
                holders,
            } => probes.push((*sent, e.t, named, *holders)),
            Kind::InSection { .. } | Kind::FaultStart { .. } | Kind::FaultEnd { .. } => {}
        }
    }
    f.holds = holds.len() as u64;
    let episodes = overlaps(&holds, end_of_run);
    f.overlaps = episodes.len() as u64;
    f.overlap_ms = episodes.iter().map(|(a, b)| b - a).sum::<u64>() as f64 / 1e6;
    f.writes_accepted = accepted.len() as u64;
    f.lost_updates = accepted.len() as i64 - counter;
    // Each value written k times lost k - 1 increments; those a late
    // write took part in are the late writer's.
    f.lost_updates_after_signal = values
        .values()
        .map(|&(k, late)| (k - 1).min(late).max(0))
        .sum::<i64>()
        .min(f.lost_updates.max(0));
    f.lost_updates_by_lock = values
        .values()
        .map(|&(k, late)| (k - 1 - late).max(0))
        .sum();
    // I1: a write is stale if a higher token's write had been accepted
    // before it was sent.
    f.stale_accepted = count_below_earlier_max(
        &accepted,
        |&(t, _, _)| t,
        |&(_, sent, _)| sent,
        |&(_, _, k)| k,
    );
    // I7: a grant is a regression if a higher token had been granted
    // before it was asked for.
    f.token_regressions = count_below_earlier_max(&grants, |g| g.0, |g| g.1, |g| g.2);
    let windows;
    (f.recoveries, windows) = recoveries(&ev, &grants, end_of_run);
    f.late_recoveries = f.recoveries.iter().filter(|r| r.late).count() as u64;
    // An overlap is charged to the latest fault whose window it began in.
    for &(a, b) in &episodes {
        let latest = windows
            .iter()
            .enumerate()
            .filter(|(_, (from, to))| a >= *from && a <= *to)
            .max_by_key(|(_, (from, _))| *from)
            .map(|(i, _)| i);
        match latest {
            Some(i) => {
                f.recoveries[i].overlaps += 1;
                f.recoveries[i].overlap_ms += (b - a) as f64 / 1e6;
            }
            None => f.overlaps_outside_faults += 1,
        }
    }
    // I4, by the side probe: a hold the backend no longer names must stop
    // being believed (its signal, or its release) within the bound.
    f.probes = probes.len() as u64;
    let bound = probing.signal_bound_ms * 1_000_000;
    for h in &holds {
        let end = h.end.unwrap_or(end_of_run);
        let unnamed = probes.iter().find(|(sent, t, named, holders)| {
            *sent > h.start
                && *t < end
                && if probing.names_tokens {
                    !named.contains(&h.token)
                } else {
                    *holders == 0
                }
        });
        if let Some((_, t, _, _)) = unnamed
            && end - t > bound
        {
            f.signals_missed += 1;
        }
    }
    // I5 under a cancellation storm: a hold the backend names that no
    // worker was given (its acquisition was dropped) must be withdrawn
    // within the cleanup bound. Only holds first named during a storm:
    // a worker killed between its grant and its event leaves one too.
    if probing.names_tokens {
        f.leaked_grants = leaked_grants(&ev, &grants, &released, &probes, probing.cleanup_bound_ms);
    }
    // Lost signals are charged to the fault whose window they fell in;
    // with none, they were false.
    for &at in &signals {
        let latest = windows
            .iter()
            .enumerate()
            .filter(|(_, (from, to))| at >= *from && at <= *to)
            .max_by_key(|(_, (from, _))| *from)
            .map(|(i, _)| i);
        match latest {
            Some(i) => f.recoveries[i].signals += 1,
            None => f.signals_false += 1,
        }
    }
    f
}

/// Grants a cancellation storm leaked: holds the side probe named longer
/// than `bound_ms` (from the first probe that named them to the last) that
/// either no worker was given, first named during a storm or within the
/// bound after it, or were given and released during a storm, and still
/// named past their release by more than the bound (a release dropped
/// part-way, a guard dropped).
fn leaked_grants(
    ev: &[&Event],
    grants: &[(u64, u64, u64, u32)],
    released: &std::collections::HashMap<u64, u64>,
    probes: &[(u64, u64, &[u64], u32)],
    bound_ms: u64,
) -> u64 {
    let bound = bound_ms * 1_000_000;
    let mut storms = Vec::new();
    for (i, e) in ev.iter().enumerate() {
        if let Kind::FaultStart {
            fault: Fault::Storm,
            ..
        } = e.e
        {
            let end = ev[i..]
                .iter()
                .find(|x| {
                    matches!(
                        x.e,
                        Kind::FaultEnd {
                            fault: Fault::Storm
                        }
                    )
                })
                .map_or(u64::MAX, |x| x.t);
            storms.push((e.t, end));
        }
    }
    if storms.is_empty() {
        return 0;
    }
    let in_storm = |t: u64, slack: u64| {
        storms
            .iter()
            .any(|&(a, b)| t >= a && t <= b.saturating_add(slack))
    };
    let given: std::collections::HashSet<u64> = grants.iter().map(|g| g.2).collect();
    let mut named: std::collections::HashMap<u64, (u64, u64)> = Default::default();
    for &(_, t, tokens, _) in probes {
        for &k in tokens {
            let span = named.entry(k).or_insert((t, t));
            span.1 = t;
        }
    }
    named
        .iter()
        .filter(|(k, (first, last))| match released.get(k) {
            _ if !given.contains(k) => in_storm(*first, bound) && last - first > bound,
            Some(&at) => in_storm(at, 0) && last.saturating_sub(at) > bound,
            None => false,
        })
        .count() as u64
}

/// Counts items whose key is below the largest key among items that
/// completed (`done`) strictly before they began (`began`).
fn count_below_earlier_max<T>(
    items: &[T],
    done: impl Fn(&T) -> u64,
    began: impl Fn(&T) -> u64,
    key: impl Fn(&T) -> u64,
) -> u64 {
    let mut by_done: Vec<(u64, u64)> = items.iter().map(|i| (done(i), key(i))).collect();
    by_done.sort_unstable();
    let mut prefix_max = Vec::with_capacity(by_done.len());
    let mut m = 0;
    for &(_, k) in &by_done {
        m = m.max(k);
        prefix_max.push(m);
    }
    items
        .iter()
        .filter(|i| {
            let n = by_done.partition_point(|&(t, _)| t < began(i));
            n > 0 && prefix_max[n - 1] > key(i)
        })
        .count() as u64
}

/// Episodes with two or more holders: (start, end) in ns.
fn overlaps(holds: &[Hold], end_of_run: u64) -> Vec<(u64, u64)> {
    let mut points: Vec<(u64, i32)> = Vec::new();
    for h in holds {
        let end = h.end.unwrap_or(end_of_run);
        if end > h.start {
            points.push((h.start, 1));
            points.push((end, -1));
        }
    }
    // Ends before starts at one instant: a hand-over is not an overlap.
    points.sort_unstable();
    let (mut depth, mut since, mut episodes) = (0i32, 0u64, Vec::new());
    for (t, d) in points {
        let before = depth;
        depth += d;
        if before < 2 && depth >= 2 {
            since = t;
        } else if before >= 2 && depth < 2 {
            episodes.push((since, t));
        }
    }
    episodes
}

/// The recovery after each fault, and each fault's window (its start to
/// its bound after its end).
fn recoveries(
    ev: &[&Event],
    grants: &[(u64, u64, u64, u32)],
    end_of_run: u64,
) -> (Vec<Recovery>, Vec<(u64, u64)>) {
    let (mut out, mut windows) = (Vec::new(), Vec::new());
    for (i, e) in ev.iter().enumerate() {
        let Kind::FaultStart {
            fault,
            victim,
            bound_ms,
        } = &e.e
        else {
            continue;
        };
        let healed = ev[i..]
            .iter()
            .find(|x| matches!(&x.e, Kind::FaultEnd { fault: g } if g == fault))
            .map_or(end_of_run, |x| x.t);
        let from = if victim.is_some() { e.t } else { healed };
        let next = grants
            .iter()
            .filter(|g| g.0 > from && Some(g.3) != *victim)
            .map(|g| g.0)
            .min();
        let ms = next.map(|t| (t - from) as f64 / 1e6);
        let bound = bound_ms * 1_000_000;
        let late = match next {
            Some(t) => t - from > bound,
            None => end_of_run.saturating_sub(from) >= bound,
        };
        let errors = ev[i..]
            .iter()
            .take_while(|x| x.t <= healed)
            .filter(|x| x.w != 0 && matches!(x.e, Kind::Error { .. }))
            .count() as u64;
        let lasted = healed.saturating_sub(e.t);
        let granted =
            |from: u64, to: u64| grants.iter().filter(|g| g.0 >= from && g.0 < to).count();
        out.push(Recovery {
            fault: *fault,
            ms,
            bound_ms: *bound_ms,
            late,
            overlaps: 0,
            overlap_ms: 0.0,
            signals: 0,
            errors,
            grants_during: granted(e.t, healed) as u64,
            grants_before: granted(e.t.saturating_sub(lasted), e.t) as u64,
        });
        windows.push((e.t, healed + bound));
    }
    (out, windows)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn ev(t_ms: u64, w: u32, e: Kind) -> Event {
        Event { t: t_ms * MS, w, e }
    }
    fn acq(t: u64, w: u32, token: u64) -> Event {
        ev(
            t,
            w,
            Kind::Acquired {
                token,
                asked: t.saturating_sub(1) * MS,
            },
        )
    }
    fn write(t: u64, w: u32, token: u64, value: i64, accepted: bool) -> Event {
        ev(
            t,
            w,
            Kind::Write {
                token,
                value,
                sent: (t - 1) * MS,
                accepted,
            },
        )
    }
    /// A side probe answered at `t` ms, sent a ms before, naming `named`.
    fn probe(t: u64, named: Vec<u64>) -> Event {
        ev(
            t,
            0,
            Kind::Probe {
                sent: (t - 1) * MS,
                holders: named.len() as u32,
                named,
            },
        )
    }
    fn rel(t: u64, w: u32) -> Event {
        ev(
            t,
            w,
            Kind::Released {
                ok: true,
                called: t * MS,
            },
        )
    }

    #[test]
    fn clean_hand_overs_have_no_findings() {
        let h = vec![
            acq(10, 1, 1),
            write(12, 1, 1, 1, true),
            rel(14, 1),
            acq(14, 2, 2),
            write(16, 2, 2, 2, true),
            rel(18, 2),
        ];
        let f = check(&h, 2);
        assert_eq!((f.holds, f.overlaps, f.writes_accepted), (2, 0, 2));
        assert_eq!(
            (f.lost_updates, f.stale_accepted, f.token_regressions),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_paused_holder_overlaps_and_its_late_write_is_refused() {
        let h = vec![
            acq(10, 1, 1),
            // worker 1 stops; its lease runs out; worker 2 gets the lock.
            acq(2010, 2, 2),
            write(2012, 2, 2, 1, true),
            rel(2020, 2),
            write(3000, 1, 1, 1, false),
            ev(
                3001,
                1,
                Kind::Lost {
                    reason: "taken".into(),
                },
            ),
            rel(3002, 1),
        ];
        let f = check(&h, 1);
        assert_eq!(f.overlaps, 1);
        assert!((f.overlap_ms - 10.0).abs() < 1e-9, "{}", f.overlap_ms);
        assert_eq!(
            (f.stale_rejected, f.stale_accepted, f.signals_missing),
            (1, 0, 0)
        );
        assert_eq!(f.lost_updates, 0);
        // No fault was declared: the overlap is not excused by one.
        assert_eq!(f.overlaps_outside_faults, 1);
    }

    #[test]
    fn stale_acceptance_lost_updates_and_missing_signals_are_caught() {
        let h = vec![
            acq(10, 1, 5),
            write(12, 1, 5, 1, true),
            rel(13, 1),
            // A register that took token 4 after token 5 was accepted.
            acq(20, 2, 4),
            write(22, 2, 4, 1, true),
            rel(23, 2),
            acq(30, 3, 6),
            write(32, 3, 6, 2, false),
            rel(33, 3),
        ];
        let f = check(&h, 1);
        assert_eq!(f.stale_accepted, 1);
        assert_eq!(f.token_regressions, 1);
        assert_eq!(f.lost_updates, 1);
        assert_eq!(f.signals_missing, 1);
    }

    /// A worker told its hold was lost writes on (as workers do): the
    /// register takes it, since the next holder has read but not yet
    /// written, and the next holder's increment is overwritten. That lost
    /// update is the late writer's; one whose writes were both sent
    /// before any signal is the lock's.
    #[test]
    fn a_write_after_the_lost_signal_owns_its_lost_update() {
        let lost = |t: u64, w: u32| {
            ev(
                t,
                w,
                Kind::Lost {
                    reason: "lease expired".into(),
                },
            )
        };
        let h = vec![
            acq(10, 1, 5),
            lost(20, 1),
            acq(21, 2, 6),
            // Worker 1 read 0 before its signal and writes 1 after it;
            // worker 2 read 0 too.
            write(24, 1, 5, 1, true),
            write(26, 2, 6, 1, true),
            rel(27, 2),
            rel(28, 1),
        ];
        let f = check(&h, 1);
        assert_eq!((f.lost_updates, f.lost_updates_after_signal), (1, 1));
        assert_eq!(f.lost_updates_by_lock, 0);
        // The same writes, both sent before any signal: the lock's.
        let h = vec![
            acq(10, 1, 5),
            write(22, 1, 5, 1, true),
            acq(21, 2, 6),
            write(26, 2, 6, 1, true),
            rel(27, 2),
            lost(28, 1),
            rel(29, 1),
        ];
        let f = check(&h, 1);
        assert_eq!((f.lost_updates, f.lost_updates_after_signal), (1, 0));
        assert_eq!(f.lost_updates_by_lock, 1);
    }

    /// A killed worker's write the register took, never recorded, makes
    /// the net count of lost updates one too low: counted value by value,
    /// a value written twice by the lock's fault still shows.
    #[test]
    fn an_unrecorded_write_does_not_hide_a_lost_update() {
        let h = vec![
            // Workers 1 and 2 both read 0 and write 1: one increment lost.
            acq(10, 1, 5),
            write(12, 1, 5, 1, true),
            acq(11, 2, 6),
            write(14, 2, 6, 1, true),
            rel(15, 1),
            rel(16, 2),
            // Worker 3 reads 1 and its write of 2 is taken, but it is
            // killed before it records the answer.
            acq(20, 3, 7),
            ev(22, 3, Kind::Exited),
        ];
        let f = check(&h, 2);
        assert_eq!(f.lost_updates, 0, "masked in the net count");
        assert_eq!(f.lost_updates_by_lock, 1);
    }

    #[test]
    fn the_side_probe_finds_missed_and_false_signals() {
        let probing = Probing {
            signal_bound_ms: 1000,
            names_tokens: true,
            cleanup_bound_ms: 11_000,
        };
        let h = vec![
            acq(10, 1, 7),
            probe(100, vec![7]),
            // The backend stops naming the hold at 500 ms; the holder goes
            // on believing it for 3 s: a missed signal.
            probe(500, vec![]),
            rel(3500, 1),
            // A lost signal with no fault anywhere: a false one.
            acq(4000, 2, 8),
            probe(4100, vec![8]),
            ev(
                4200,
                2,
                Kind::Lost {
                    reason: "taken".into(),
                },
            ),
            rel(4201, 2),
        ];
        let f = check_with(&h, 0, probing);
        assert_eq!((f.probes, f.signals_missed, f.signals_false), (3, 1, 1));
        // Released within the bound of the probe that no longer named it:
        // nothing missed.
        let h = vec![acq(10, 1, 7), probe(500, vec![]), rel(900, 1)];
        assert_eq!(check_with(&h, 0, probing).signals_missed, 0);
        // Advisory locks name only that the lock is held.
        let h = vec![acq(10, 1, 7), probe(500, vec![3]), rel(3500, 1)];
        let by_count = Probing {
            names_tokens: false,
            ..probing
        };
        assert_eq!(check_with(&h, 0, by_count).signals_missed, 0);
        assert_eq!(check_with(&h, 0, probing).signals_missed, 1);
    }

    #[test]
    fn a_grant_no_one_was_given_that_outlives_the_cleanup_is_a_leak() {
        let storm = |t, start: bool| {
            let fault = Fault::Storm;
            let e = if start {
                Kind::FaultStart {
                    fault,
                    victim: None,
                    bound_ms: 9000,
                }
            } else {
                Kind::FaultEnd { fault }
            };
            ev(t, 0, e)
        };
        // Token 7 was given (worker 1); 8, named first during the storm,
        // was given to no one: withdrawn within 11 s it is cleanup, named
        // for 12 s it leaked. Token 9, first named before the storm (a
        // killed worker's grant), is not the storm's.
        let mut h = vec![
            probe(50, vec![9]),
            storm(100, true),
            acq(200, 1, 7),
            probe(300, vec![7, 8]),
            rel(400, 1),
            storm(4000, false),
            probe(9000, vec![8, 9]),
        ];
        assert_eq!(check(&h, 0).leaked_grants, 0, "within the bound");
        h.push(probe(12_301, vec![8, 9]));
        assert_eq!(check(&h, 0).leaked_grants, 1);
        // Token 7, released during the storm, still named 12 s after.
        h.push(probe(12_402, vec![7]));
        assert_eq!(check(&h, 0).leaked_grants, 2);
        // Advisory locks name no tokens: nothing to judge.
        let blind = Probing {
            signal_bound_ms: 10_000,
            names_tokens: false,
            cleanup_bound_ms: 11_000,
        };
        assert_eq!(check_with(&h, 0, blind).leaked_grants, 0);
    }

    #[test]
    fn concurrent_writes_in_either_order_are_not_stale() {
        // Token 6 sent before token 5's reply came: both legal.
        let h = vec![
            ev(
                10,
                1,
                Kind::Write {
                    token: 5,
                    value: 1,
                    sent: 5 * MS,
                    accepted: true,
                },
            ),
            ev(
                9,
                2,
                Kind::Write {
                    token: 6,
                    value: 2,
                    sent: 6 * MS,
                    accepted: true,
                },
            ),
        ];
        assert_eq!(check(&h, 2).stale_accepted, 0);
    }

    #[test]
    fn recovery_is_timed_from_the_fault_or_its_healing() {
        let start = |t, victim| {
            ev(
                t,
                0,
                Kind::FaultStart {
                    fault: Fault::Kill,
                    victim,
                    bound_ms: 3000,
                },
            )
        };
        let h = vec![
            acq(10, 1, 1),
            start(100, Some(1)),
            ev(100, 1, Kind::Exited),
            ev(101, 0, Kind::FaultEnd { fault: Fault::Kill }),
            acq(2100, 2, 2),
            rel(2200, 2),
            ev(
                3000,
                0,
                Kind::FaultStart {
                    fault: Fault::Restart,
                    victim: None,
                    bound_ms: 1000,
                },
            ),
            ev(
                4000,
                0,
                Kind::FaultEnd {
                    fault: Fault::Restart,
                },
            ),
            acq(6000, 3, 3),
            rel(6100, 3),
        ];
        let f = check(&h, 0);
        assert_eq!(f.recoveries.len(), 2);
        assert_eq!(f.recoveries[0].ms, Some(2000.0));
        assert!(!f.recoveries[0].late);
        assert_eq!(f.recoveries[1].ms, Some(2000.0));
        assert!(f.recoveries[1].late);
        assert_eq!(f.late_recoveries, 1);
    }
}
