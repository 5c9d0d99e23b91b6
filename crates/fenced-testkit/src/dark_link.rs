//! A link gone dark in the kernel, as a machine that lost power or a
//! network that drops everything looks to its peer: no reset, no close,
//! no acknowledgement, so each side learns of it only from its own TCP
//! timers. The torture suite's proxy cannot show this: it is a live
//! process whose kernel acknowledges every segment, so a server behind
//! it never sees its client go quiet.

use crate::servers::require;
use std::process::Command;

/// Drops every TCP segment on the loopback device between two ports of
/// 127.0.0.1, both ways, until dropped (by `iptables`; needs
/// `CAP_NET_ADMIN`).
#[must_use = "the link comes back when this is dropped"]
pub struct DarkLink {
    rules: Vec<Vec<String>>,
}

impl DarkLink {
    /// Darkens the connection between local ports `a` and `b`.
    pub fn between(a: u16, b: u16) -> DarkLink {
        let rule = |from: u16, to: u16| -> Vec<String> {
            [
                "OUTPUT",
                "-o",
                "lo",
                "-p",
                "tcp",
                "--sport",
                &from.to_string(),
            ]
            .into_iter()
            .map(String::from)
            .chain(["--dport".into(), to.to_string(), "-j".into(), "DROP".into()])
            .collect()
        };
        let mut link = DarkLink { rules: Vec::new() };
        for r in [rule(a, b), rule(b, a)] {
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

/// `iptables -w <op> <rule>`: `-w` waits for the table's lock, which
/// tests running side by side take too.
fn iptables(op: &str, rule: &[String]) -> Result<(), String> {
    let bin = require("iptables", "iptables", &["/usr/sbin", "/sbin"]);
    let out = Command::new(bin)
        .args(["-w", op])
        .args(rule)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}
