//! A link gone dark in the kernel, as a machine that lost power or a
//! network that drops everything looks to its peer: no reset, no close,
//! no acknowledgement, so each side learns of it only from its own TCP
//! timers. The torture suite's proxy cannot show this: it is a live
//! process whose kernel acknowledges every segment, so a server behind
//! it never sees its client go quiet.

use crate::servers::require;
use std::process::Command;

/// The comment on every rule, with the test process's pid.
const TAG: &str = "fenced-testkit-dark-link";

/// Drops every TCP segment on the loopback device between two ports of
/// 127.0.0.1, both ways, until dropped (by `iptables`, as root).
#[must_use = "the link comes back when this is dropped"]
pub struct DarkLink {
    rules: Vec<Vec<String>>,
}

impl DarkLink {
    /// Whether this process can darken links: `iptables` needs root (CI
    /// runs as root; the test kit's SQLite disk test needs it too).
    pub fn available() -> bool {
        nix::unistd::Uid::effective().is_root()
    }

    /// Darkens the connection between local ports `a` and `b`. First
    /// removes the rules of test processes that died without removing
    /// theirs (killed, not unwound), so none outlives its run for long.
    pub fn between(a: u16, b: u16) -> DarkLink {
        sweep();
        let me = std::process::id();
        let mut link = DarkLink { rules: Vec::new() };
        for r in [rule(a, b, me), rule(b, a, me)] {
            iptables("-I", &r).unwrap_or_else(|e| panic!("darken {a} <-> {b}: {e}"));
            link.rules.push(r);
        }
        link
    }
}

impl Drop for DarkLink {
    fn drop(&mut self) {
        for r in self.rules.drain(..) {
            if let Err(e) = iptables("-D", &r) {
                eprintln!("could not remove the dark link's rule {r:?}: {e}");
            }
        }
    }
}

/// The rule that drops segments from port `from` to port `to`, tagged
/// with the pid of the process that made it.
fn rule(from: u16, to: u16, pid: u32) -> Vec<String> {
    let (from, to) = (from.to_string(), to.to_string());
    let tag = format!("{TAG} pid={pid}");
    [
        "OUTPUT",
        "-o",
        "lo",
        "-p",
        "tcp",
        "--sport",
        &from,
        "--dport",
        &to,
        "-m",
        "comment",
        "--comment",
        &tag,
        "-j",
        "DROP",
    ]
    .map(String::from)
    .to_vec()
}

/// Removes the rules whose process is gone.
fn sweep() {
    let Ok(listing) = iptables_output(&["-S", "OUTPUT"]) else {
        return;
    };
    for line in listing.lines().filter(|l| l.contains(TAG)) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let after = |flag: &str| {
            let i = words.iter().position(|w| *w == flag)?;
            words.get(i + 1)?.trim_matches('"').parse::<u32>().ok()
        };
        let pid = words.iter().find_map(|w| {
            w.trim_matches('"')
                .strip_prefix("pid=")?
                .parse::<u32>()
                .ok()
        });
        let (Some(from), Some(to), Some(pid)) = (after("--sport"), after("--dport"), pid) else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // Another process may have swept it already.
        let _ = iptables("-D", &rule(from as u16, to as u16, pid));
    }
}

/// `iptables -w <op> <rule>`: `-w` waits for the table's lock, which
/// tests running side by side take too.
fn iptables(op: &str, rule: &[String]) -> Result<(), String> {
    let mut args = vec!["-w", op];
    args.extend(rule.iter().map(String::as_str));
    iptables_output(&args).map(drop)
}

fn iptables_output(args: &[&str]) -> Result<String, String> {
    let bin = require("iptables", "iptables", &["/usr/sbin", "/sbin"]);
    let out = Command::new(bin)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// A holder of `url`'s lock (a session lock: the advisory modes) whose
/// link goes dark gives the lock up within about its lease, and is told
/// first: it no longer believes in its hold when the next one is granted,
/// and its lost signal fires. `holder_port(name)` is the local port of
/// the session that holds `name`, as the server shows it; `server_port`
/// is the server's. `lease`: the hold's, or `None` for the client's
/// default (30 s). Skips (and says so) without root.
pub async fn a_dark_holder_gives_way(
    url: &str,
    server_port: u16,
    lease: Option<std::time::Duration>,
    holder_port: impl Fn(&str) -> String,
) {
    if !DarkLink::available() {
        eprintln!("skipped: only root can drop a link's segments (CI runs as root)");
        return;
    }
    let t = crate::Timing::default();
    let (a, b) = crate::two_clients(url).await;
    let name = crate::unique("dark");
    let g = match lease {
        Some(lease) => crate::hold(&a, &name, fenced::Lease::Renewed(lease)).await,
        None => a.mutex(&name).unwrap().acquire().await.unwrap(),
    };
    let shown = holder_port(&name);
    let port: u16 = shown
        .parse()
        .unwrap_or_else(|_| panic!("the holder's port: {shown:?}"));
    let dark = DarkLink::between(port, server_port);
    // Twice the default lease: the server's defaults would keep the lock
    // for hours.
    let limit = t.ms(60_000);
    let g2 = b
        .mutex(&name)
        .unwrap()
        .acquire_timeout(limit)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("the lock of a holder gone dark was still held after {limit:?}"));
    assert!(
        !g.is_held(),
        "the dark holder still believed in its hold at the next grant"
    );
    assert!(g2.fencing_token() > g.fencing_token());
    drop(dark);
    tokio::time::timeout(t.eventually(), g.lost())
        .await
        .expect("the dark holder's lost signal");
    assert!(g2.release().await.unwrap());
}
