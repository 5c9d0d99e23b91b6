//! One table of grant cases: who holds a name, who asks, and what the
//! grant rule must answer. The rule is written five times (the Rust rule
//! of memory and SQLite, the etcd/ZooKeeper queue rule, the Redis script,
//! and the PostgreSQL and MariaDB grant functions and transactions); every
//! backend runs this same table against its real engine, so the five
//! cannot drift apart.

use crate::{Fixture, unique};
use fenced::{Client, ErrorKind, Guard, Lock, Owner};

/// Who holds or asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// The asking owner itself (a named owner on the asking client).
    Me,
    /// Another owner, on another client.
    Other,
}

/// A hold, or a request, on one name.
#[derive(Clone, Copy, Debug)]
pub enum Side {
    /// A mutex.
    Mutex(Who),
    /// The read side of a read-write lock.
    Read(Who),
    /// The write side of a read-write lock.
    Write(Who),
    /// `take` permits of a semaphore of `max`.
    Permits(Who, u32, u32),
}

/// What the rule must answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Granted at once.
    Grant,
    /// Busy: the asker would wait.
    Wait,
    /// Refused: it can never be granted as asked.
    Refuse,
}

/// One row of the table.
#[derive(Debug)]
pub struct Case {
    /// What the row checks.
    pub what: &'static str,
    /// The holders, taken in order before the request.
    pub held: &'static [Side],
    /// The request.
    pub ask: Side,
    /// The answer the rule must give.
    pub answer: Answer,
}

use Answer::*;
use Side::*;
use Who::*;

/// The rows for mutexes.
#[rustfmt::skip]
pub const MUTEX: &[Case] = &[
    Case { what: "a free mutex is granted", held: &[], ask: Mutex(Me), answer: Grant },
    Case { what: "a held mutex makes another owner wait", held: &[Mutex(Other)], ask: Mutex(Me), answer: Wait },
];

/// The rows for read-write locks.
#[rustfmt::skip]
pub const RW: &[Case] = &[
    Case { what: "a free lock is granted for write", held: &[], ask: Write(Me), answer: Grant },
    Case { what: "readers share", held: &[Read(Other), Read(Other)], ask: Read(Me), answer: Grant },
    Case { what: "a writer waits for readers", held: &[Read(Other)], ask: Write(Me), answer: Wait },
    Case { what: "a reader waits for another's writer", held: &[Write(Other)], ask: Read(Me), answer: Wait },
    Case { what: "a writer waits for another's writer", held: &[Write(Other)], ask: Write(Me), answer: Wait },
    Case { what: "a writer may take read (the downgrade)", held: &[Write(Me)], ask: Read(Me), answer: Grant },
    Case { what: "a reader's upgrade is refused", held: &[Read(Me)], ask: Write(Me), answer: Refuse },
    Case { what: "an upgrade beside other readers is refused", held: &[Read(Me), Read(Other)], ask: Write(Me), answer: Refuse },
];

/// The rows for semaphores.
#[rustfmt::skip]
pub const PERMITS: &[Case] = &[
    Case { what: "a free semaphore is granted", held: &[], ask: Permits(Me, 1, 3), answer: Grant },
    Case { what: "permits add up to the limit", held: &[Permits(Other, 1, 3), Permits(Other, 1, 3)], ask: Permits(Me, 1, 3), answer: Grant },
    Case { what: "a count that fits beside a larger hold", held: &[Permits(Other, 2, 3)], ask: Permits(Me, 1, 3), answer: Grant },
    Case { what: "a count past the limit waits", held: &[Permits(Other, 2, 3)], ask: Permits(Me, 2, 3), answer: Wait },
    Case { what: "a full semaphore makes everyone wait", held: &[Permits(Other, 1, 3), Permits(Other, 1, 3), Permits(Other, 1, 3)], ask: Permits(Me, 1, 3), answer: Wait },
    Case { what: "one owner's permits add up, never nest", held: &[Permits(Me, 2, 3)], ask: Permits(Me, 2, 3), answer: Wait },
    Case { what: "another count of permits is refused", held: &[Permits(Other, 1, 3)], ask: Permits(Me, 1, 4), answer: Refuse },
    Case { what: "more permits than the semaphore has is refused", held: &[], ask: Permits(Me, 4, 3), answer: Refuse },
];

/// The lock a side names, on `client`, as `me` where it is the asker's.
fn lock_of(client: &Client, name: &str, side: Side, me: &Owner) -> fenced::Result<Lock> {
    let (lock, who) = match side {
        Mutex(w) => (client.mutex(name)?.into(), w),
        Read(w) => (client.rwlock(name)?.read(), w),
        Write(w) => (client.rwlock(name)?.write(), w),
        Permits(w, take, max) => (client.semaphore(name, max)?.permits(take).into(), w),
    };
    Ok(match who {
        Me => lock.owner(me),
        Other => lock,
    })
}

/// Runs `cases` on the backend of `fx`: each row on a fresh name, its
/// holders taken, its request tried once, everything given back.
pub async fn run(fx: &Fixture, cases: &[Case]) {
    let (mine, theirs) = (fx.client().await, fx.client().await);
    for case in cases {
        let name = unique("grant");
        let me = Owner::new();
        let mut held: Vec<Guard> = Vec::new();
        for side in case.held {
            let client = match side {
                Mutex(Me) | Read(Me) | Write(Me) | Permits(Me, ..) => &mine,
                _ => &theirs,
            };
            let lock = lock_of(client, &name, *side, &me).unwrap();
            let g = lock
                .try_acquire()
                .await
                .unwrap_or_else(|e| panic!("{}: holder {side:?} was refused: {e}", case.what));
            held.push(
                g.unwrap_or_else(|| panic!("{}: holder {side:?} was not granted", case.what)),
            );
        }
        let got = match lock_of(&mine, &name, case.ask, &me) {
            Ok(lock) => lock.try_acquire().await,
            Err(e) => Err(e),
        };
        let answer = match got {
            Ok(Some(g)) => {
                held.push(g);
                Grant
            }
            Ok(None) => Wait,
            Err(e) if e.kind() == ErrorKind::InvalidInput => Refuse,
            Err(e) => panic!("{}: the request failed: {e}", case.what),
        };
        assert_eq!(
            answer, case.answer,
            "{} (holders {:?}, asked {:?})",
            case.what, case.held, case.ask
        );
        for g in held.into_iter().rev() {
            g.release().await.unwrap();
        }
        assert!(
            mine.status(&name).await.unwrap().is_free(),
            "{}: something was left held",
            case.what
        );
    }
    mine.close().await;
    theirs.close().await;
}
