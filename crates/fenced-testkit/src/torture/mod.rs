//! The torture suite's parts that are not the driver: the history every
//! worker process records, the checker that turns a history into the
//! figures of RELIABILITY.md, the guarantees each backend claims per
//! fault, a TCP proxy for network faults and the topologies it can start.
//!
//! `fenced torture` (in `fenced-cli`) runs the workload and the faults and
//! calls [`check`] on what was recorded.

mod check;
mod exhaust;
mod expect;
pub mod proxy;
pub mod topology;

pub use check::{Findings, Probing, Recovery, check, check_with};
pub use expect::{Claim, Expect, Family, Fault, claims_markdown, expect};

use serde::{Deserialize, Serialize};

/// One thing that happened, stamped with CLOCK_MONOTONIC: every process
/// of a run is on this machine, so all stamps share one clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When it happened (for replies: when the reply came), ns.
    pub t: u64,
    /// The worker (0: the driver).
    pub w: u32,
    /// What happened.
    pub e: Kind,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The worker got the lock.
    Acquired {
        /// Its fencing token.
        token: u64,
        /// When the worker asked for it.
        asked: u64,
    },
    /// A fenced write; the register accepted or refused it.
    Write {
        /// The token it was written under.
        token: u64,
        /// The value written: what was read + 1.
        value: i64,
        /// When it was sent.
        sent: u64,
        /// Whether the register took it.
        accepted: bool,
    },
    /// The worker is inside its critical section (it has read the
    /// counter, not yet written) and will stay there a while: the driver
    /// asked for it, to aim a fault at a holder mid-section.
    InSection {
        /// The hold's token.
        token: u64,
    },
    /// The lost signal of the worker's hold fired.
    Lost {
        /// Why, as the signal said.
        reason: String,
    },
    /// The worker released its hold.
    Released {
        /// What release said: `false` if the hold was already gone.
        ok: bool,
        /// When the worker called release: it stopped using the lock
        /// then, and the server may grant it before the reply comes.
        called: u64,
    },
    /// An operation failed (server away, timeout); the worker goes on.
    Error {
        /// Which: acquire, read, write, release.
        op: String,
        /// The error.
        error: String,
    },
    /// A worker's cancellation storm ended: what its tasks asked for and
    /// dropped (stamped at the storm's end; each hold a storm task won is
    /// recorded as an `acquired` and a `released` of its own worker id).
    Storm {
        /// Acquisitions started.
        tries: u64,
        /// Acquisitions dropped before they returned.
        dropped: u64,
        /// Acquisitions that returned a guard.
        won: u64,
    },
    /// Driver: the worker's process is gone (killed: stamped at the
    /// SIGKILL; or its run ended).
    Exited,
    /// Driver: a fault began.
    FaultStart {
        /// Which.
        fault: Fault,
        /// The worker it aimed at, if any.
        victim: Option<u32>,
        /// The backend should grant the lock again within this many ms of
        /// the fault's start (with a victim) or its end (a server fault).
        bound_ms: u64,
    },
    /// Driver: the fault healed.
    FaultEnd {
        /// Which.
        fault: Fault,
    },
    /// Driver: a side probe of the lock's real state (its status, read
    /// from the backend directly), stamped when the answer came.
    Probe {
        /// When it was sent.
        sent: u64,
        /// The tokens of the holds the backend names.
        named: Vec<u64>,
        /// How many holders it names.
        holders: u32,
    },
}

/// The current CLOCK_MONOTONIC time in ns.
pub fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always there on Linux");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}
