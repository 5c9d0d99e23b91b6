//! Who holds a lock, as an operator needs to know at 3 a.m.: the host, the
//! process and its command, and when the hold was granted. Every hold
//! records it beside the hold itself, in a form foreign clients ignore (an
//! etcd key's value, a ZooKeeper node's data, a column of the lease
//! tables, a field of the Redisson hash that no Redisson client reads).
//!
//! The record is one line of text, so that `etcdctl get`, `zkCli get`
//! and `redis-cli hgetall` show it readably:
//! `fenced1 <granted, ms since 1970> <pid> <host> <command>`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The first word of every record: a later layout gets another.
const TAG: &str = "fenced1";

/// The longest command a record keeps, in bytes; a longer one is cut at a
/// character boundary and ends in `…`.
pub const MAX_COMMAND_LEN: usize = 200;

/// The longest host name a record keeps, in bytes (a DNS name's limit).
const MAX_HOST_LEN: usize = 253;

/// On etcd and ZooKeeper, whose waiters write their key or node (and so
/// their record) when they queue: a waiter granted this long after gets
/// its record written again, with the grant's time; one granted sooner
/// keeps the one it queued with, off by less than this, and spares the
/// engine a write through consensus on every quick hand-over.
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
pub(crate) const RESTAMP_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Who holds a lock, as its hold recorded it (see [`HolderInfo::holder`](crate::HolderInfo::holder)).
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://holder-doc").await?;
/// client.set_command("nightly-report");
/// let _guard = client.mutex("reports")?.acquire().await?;
/// let status = client.status("reports").await?;
/// let holder = status.holders[0].holder.as_ref().unwrap();
/// assert_eq!(holder.pid, std::process::id());
/// assert_eq!(holder.command, "nightly-report");
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The host name of the machine whose process took the hold.
    pub host: String,
    /// That process's id.
    pub pid: u32,
    /// Its program's name, or what was set with
    /// [`Client::set_command`](crate::Client::set_command) (`fenced run`
    /// sets the command it runs, with what looks like a secret masked).
    pub command: String,
    /// When the attempt that was granted was sent, by that host's clock.
    pub granted_at: SystemTime,
}

impl Holder {
    /// Reads a record; `None` for anything else (a foreign client's data,
    /// an empty value, a later layout).
    pub(crate) fn decode(raw: &[u8]) -> Option<Holder> {
        let text = std::str::from_utf8(raw).ok()?;
        let mut parts = text.splitn(5, ' ');
        if parts.next()? != TAG {
            return None;
        }
        let ms: u64 = parts.next()?.parse().ok()?;
        let pid: u32 = parts.next()?.parse().ok()?;
        let host = parts.next()?.to_owned();
        let command = parts.next().unwrap_or("").to_owned();
        Some(Holder {
            host,
            pid,
            command,
            granted_at: UNIX_EPOCH + Duration::from_millis(ms),
        })
    }

    /// This host's name as holder records give it: the kernel's, else
    /// `$HOSTNAME`, else `localhost`.
    pub fn this_host() -> String {
        clean(&host_name(), MAX_HOST_LEN, true)
    }

    /// `granted_at` in ms since 1970.
    pub fn granted_at_ms(&self) -> u64 {
        self.granted_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// What one process records of itself; the grant time is added per
/// attempt by [`Whoami::record`].
#[derive(Debug)]
pub(crate) struct Whoami {
    /// `<pid> <host> <command>`: the record after its time.
    rest: std::sync::RwLock<std::sync::Arc<str>>,
    pid: u32,
    host: String,
}

impl Default for Whoami {
    /// The program's name, not its whole command line: arguments may carry
    /// passwords, and the record is readable by whoever can read the locks.
    fn default() -> Self {
        let me = Whoami {
            rest: std::sync::RwLock::new("".into()),
            pid: std::process::id(),
            host: Holder::this_host(),
        };
        me.set_command(&program_name());
        me
    }
}

impl Whoami {
    /// Sets the command later holds record.
    pub(crate) fn set_command(&self, command: &str) {
        let command = clean(command, MAX_COMMAND_LEN, false);
        let rest: std::sync::Arc<str> = format!("{} {} {command}", self.pid, self.host).into();
        *self.rest.write().unwrap_or_else(|e| e.into_inner()) = rest;
    }

    /// The record of a hold granted to an attempt sent now.
    pub(crate) fn record(&self) -> String {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let rest = self.rest.read().unwrap_or_else(|e| e.into_inner()).clone();
        format!("{TAG} {ms} {rest}")
    }
}

/// This host's name: the kernel's, else `$HOSTNAME`, else `localhost`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// The file name of the program this process was started as (its first
/// argument's), lossily UTF-8.
fn program_name() -> String {
    std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

/// `s` on one line and at most `max` bytes; with `no_space`, spaces
/// become `_` too (the host is one word of the record).
fn clean(s: &str, max: usize, no_space: bool) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_control() || (no_space && c == ' ') {
                if no_space { '_' } else { ' ' }
            } else {
                c
            }
        })
        .collect();
    if out.len() > max {
        let mut cut = max - '…'.len_utf8();
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    if out.is_empty() && no_space {
        out.push('-');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_command_is_the_program_name() {
        let h = Holder::decode(Whoami::default().record().as_bytes()).unwrap();
        let exe = std::env::current_exe().unwrap();
        assert_eq!(h.command, exe.file_name().unwrap().to_string_lossy());
    }

    #[test]
    fn a_record_reads_back() {
        let me = Whoami::default();
        me.set_command("backup --all  'x y'\nz");
        let rec = me.record();
        let h = Holder::decode(rec.as_bytes()).expect("a record");
        assert_eq!(h.pid, std::process::id());
        assert_eq!(h.command, "backup --all  'x y' z");
        assert!(!h.host.is_empty() && !h.host.contains(' '));
        let age = SystemTime::now().duration_since(h.granted_at).unwrap();
        assert!(age < Duration::from_secs(60), "{age:?}");
    }

    #[test]
    fn foreign_data_is_no_record() {
        for raw in [
            &b""[..],
            b"127.0.0.1",
            b"fenced1 x 1 h c",
            b"fenced2 1 1 h c",
            b"\xff",
        ] {
            assert_eq!(Holder::decode(raw), None, "{raw:?}");
        }
        let h = Holder::decode(b"fenced1 1000 7 host").unwrap();
        assert_eq!(
            (h.pid, h.host.as_str(), h.command.as_str()),
            (7, "host", "")
        );
        assert_eq!(h.granted_at_ms(), 1000);
    }

    #[test]
    fn long_commands_are_cut_on_a_character() {
        let me = Whoami::default();
        me.set_command(&"é".repeat(300));
        let h = Holder::decode(me.record().as_bytes()).unwrap();
        assert!(h.command.len() <= MAX_COMMAND_LEN, "{}", h.command.len());
        assert!(h.command.ends_with('…'));
    }
}
