//! The lease tables and the statements on them.

/// The tables, created on first use (also shown in the README).
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fenced_holds (
    hold_id    TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    owner      TEXT NOT NULL,      -- <client id>:<owner id>
    mode       INTEGER NOT NULL,   -- 0 exclusive, 1 shared, 2 permits
    take       INTEGER NOT NULL,   -- permits taken (mode 2)
    max        INTEGER NOT NULL,   -- permits in all (mode 2)
    token      INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,   -- host wall clock, ms since 1970
    holder     TEXT                -- host, pid, command, grant time (see `Holder`)
);
CREATE INDEX IF NOT EXISTS fenced_holds_name ON fenced_holds (name);
CREATE TABLE IF NOT EXISTS fenced_tokens (
    name  TEXT PRIMARY KEY,        -- '': the floor of forgotten names
    token INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fenced_tokens_token ON fenced_tokens (token);
CREATE TABLE IF NOT EXISTS fenced_waiters (
    ticket     INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT NOT NULL,
    fair       INTEGER NOT NULL,
    wake_addr  TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS fenced_waiters_name ON fenced_waiters (name, ticket);
CREATE TABLE IF NOT EXISTS fenced_registers (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    fence INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fenced_rates (
    name   TEXT PRIMARY KEY,
    tat_us INTEGER NOT NULL        -- when the limiter is idle again, µs since 1970
) WITHOUT ROWID;
";

/// A rate limiter's decision (see `spi::rate`): ?1 name, ?2 now, ?3
/// cost, ?4 tolerance (µs). A row back: granted.
pub(super) const RATE: &str = "INSERT INTO fenced_rates (name, tat_us) VALUES (?1, ?2 + ?3)
    ON CONFLICT (name) DO UPDATE SET tat_us = max(tat_us, ?2) + ?3
    WHERE max(tat_us, ?2) + ?3 - ?4 <= ?2
    RETURNING tat_us";
pub(super) const RATE_TAT: &str = "SELECT tat_us FROM fenced_rates WHERE name = ?1";

/// The names starting with ?1 that have a live hold or queue place (?2:
/// now): compared by `substr`, since `LIKE` folds case and takes `%` and
/// `_` for wildcards.
pub(super) const NAMES: &str = "SELECT name FROM fenced_holds
    WHERE expires_ms > ?2 AND substr(name, 1, length(?1)) = ?1
    UNION SELECT name FROM fenced_waiters
    WHERE expires_ms > ?2 AND substr(name, 1, length(?1)) = ?1";
pub(super) const PURGE_HOLDS: &str =
    "DELETE FROM fenced_holds WHERE name = ?1 AND expires_ms <= ?2";
pub(super) const PURGE_WAITERS: &str =
    "DELETE FROM fenced_waiters WHERE name = ?1 AND expires_ms <= ?2";
pub(super) const SELECT_HOLDS: &str =
    "SELECT hold_id, owner, mode, take, max, token, expires_ms FROM fenced_holds WHERE name = ?1";
/// [`SELECT_HOLDS`] with the holders' records, for status.
pub(super) const SHOW_HOLDS: &str =
    "SELECT hold_id, owner, mode, take, max, token, expires_ms, holder
    FROM fenced_holds WHERE name = ?1";
/// Whether a file made before holds recorded their holder needs the column.
pub(super) const HAS_HOLDER: &str =
    "SELECT EXISTS (SELECT 1 FROM pragma_table_info('fenced_holds') WHERE name = 'holder')";
pub(super) const ADD_HOLDER: &str = "ALTER TABLE fenced_holds ADD COLUMN holder TEXT";
pub(super) const MY_TICKET: &str =
    "SELECT ticket FROM fenced_waiters WHERE ticket = ?1 AND name = ?2";
pub(super) const FAIR_AHEAD: &str =
    "SELECT EXISTS (SELECT 1 FROM fenced_waiters WHERE name = ?1 AND fair = 1 AND ticket < ?2)";
/// The token a grant of ?1 must exceed: its own last one, or the floor of
/// forgotten names (see [`RAISE_FLOOR`]).
pub(super) const LAST_TOKEN: &str =
    "SELECT coalesce(max(token), 0) FROM fenced_tokens WHERE name IN (?1, '')";
/// ?1's own last token, for `status` (0 once forgotten).
pub(super) const NAME_TOKEN: &str = "SELECT token FROM fenced_tokens WHERE name = ?1";
pub(super) const SET_TOKEN: &str = "INSERT INTO fenced_tokens (name, token) VALUES (?1, ?2)
    ON CONFLICT (name) DO UPDATE SET token = excluded.token";
pub(super) const INSERT_HOLD: &str = "INSERT INTO fenced_holds
    (hold_id, name, owner, mode, take, max, token, expires_ms, holder)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
pub(super) const DELETE_TICKET: &str = "DELETE FROM fenced_waiters WHERE ticket = ?1";
pub(super) const REFRESH_TICKET: &str =
    "UPDATE fenced_waiters SET expires_ms = ?2 WHERE ticket = ?1";
pub(super) const INSERT_WAITER: &str =
    "INSERT INTO fenced_waiters (name, fair, wake_addr, expires_ms)
    VALUES (?1, ?2, ?3, ?4) RETURNING ticket";
pub(super) const RENEW: &str =
    "UPDATE fenced_holds SET expires_ms = ?3 WHERE hold_id = ?1 AND expires_ms > ?2";
pub(super) const RELEASE: &str = "DELETE FROM fenced_holds WHERE hold_id = ?1 RETURNING expires_ms";
pub(super) const WAKE_ADDRS: &str = "SELECT wake_addr FROM fenced_waiters
    WHERE name = ?1 AND expires_ms > ?2 ORDER BY ticket LIMIT 8";
/// A register watcher's place (see [`watch_register`](crate::spi::Store::watch_register)):
/// a waiter row under the register's wake key, one per process, kept
/// alive by each arming.
pub(super) const REFRESH_WATCHER: &str =
    "UPDATE fenced_waiters SET expires_ms = ?3 WHERE name = ?1 AND wake_addr = ?2";
/// Drops the lapsed places of every register watcher (?1: now): their
/// names begin with the byte 0x01, which no lock name has.
pub(super) const PURGE_WATCHERS: &str = "DELETE FROM fenced_waiters
    WHERE name >= char(1) AND name < char(2) AND expires_ms <= ?1";
/// The processes watching register key ?1 (?2: now).
pub(super) const WATCHER_ADDRS: &str = "SELECT DISTINCT wake_addr FROM fenced_waiters
    WHERE name = ?1 AND expires_ms > ?2 LIMIT 1024";
pub(super) const FORGET_ADDR: &str = "DELETE FROM fenced_waiters WHERE wake_addr = ?1";
pub(super) const COUNT_WAITERS: &str =
    "SELECT COUNT(*) FROM fenced_waiters WHERE name = ?1 AND expires_ms > ?2";
pub(super) const FORCE_RELEASE: &str = "DELETE FROM fenced_holds WHERE name = ?1";
pub(super) const REGISTER_DELETE: &str = "DELETE FROM fenced_registers WHERE name = ?1";
pub(super) const REGISTER_READ: &str =
    "SELECT CAST(value AS BLOB) AS value, fence FROM fenced_registers WHERE name = ?1";
/// The register's writes (see [`RegisterSql`](super::super::RegisterSql)).
pub(super) const REGISTER_SQL: super::super::RegisterSql = super::super::RegisterSql {
    fenced: "INSERT INTO fenced_registers (name, value, fence) VALUES (?1, ?2, ?3)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value, fence = excluded.fence
    WHERE fenced_registers.fence <= excluded.fence",
    unfenced: "INSERT INTO fenced_registers (name, value, fence) VALUES (?1, ?2, 0)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    create: "INSERT INTO fenced_registers (name, value, fence) VALUES (?1, ?2, 1)
    ON CONFLICT (name) DO UPDATE SET value = excluded.value, fence = 1
    WHERE fenced_registers.fence = 0",
    swap: "UPDATE fenced_registers SET value = ?2, fence = fence + 1 WHERE name = ?1 AND fence = ?3",
};
pub(super) const REGISTER_DECREMENT: &str = "UPDATE fenced_registers
    SET value = CAST(CAST(CAST(value AS INTEGER) - ?2 AS TEXT) AS BLOB)
    WHERE name = ?1 AND CAST(value AS INTEGER) >= ?2
    RETURNING CAST(value AS INTEGER) AS value";

/// The names whose last token may be forgotten: nobody holds or waits
/// for them, and their last grant is older than ?1 (µs since 1970). Never
/// the floor row, `''` (no lock name is empty). A macro, for `concat!`.
macro_rules! forgettable {
    () => {
        "t.name <> '' AND t.token < ?1
      AND NOT EXISTS (SELECT 1 FROM fenced_holds h WHERE h.name = t.name)
      AND NOT EXISTS (SELECT 1 FROM fenced_waiters w WHERE w.name = t.name)"
    };
}

/// Raises the floor (the row named `''`) to the highest token about to be
/// forgotten. A forgotten name's next token is one more than the floor at
/// least ([`LAST_TOKEN`]), so tokens still rise when the clock has stepped
/// back (a board with no clock that boots in 1970, a restored snapshot),
/// which `next_token`'s wall-clock floor alone would not survive.
pub(super) const RAISE_FLOOR: &str = concat!(
    "INSERT INTO fenced_tokens (name, token)
    SELECT '', m FROM (SELECT max(t.token) AS m FROM fenced_tokens t WHERE ",
    forgettable!(),
    ") WHERE m IS NOT NULL
    ON CONFLICT (name) DO UPDATE SET token = max(token, excluded.token)"
);

/// Forgets the last tokens of forgettable names, at most ?2 of them, after
/// [`RAISE_FLOOR`] in the same transaction. Without this, a name used once
/// (a lock per order) kept its row for ever, and the host's lock file, in
/// a 5 MB tmpfs on Debian and Ubuntu, filled up.
pub(super) const FORGET_OLD_TOKENS: &str = concat!(
    "DELETE FROM fenced_tokens WHERE name IN (SELECT t.name FROM fenced_tokens t WHERE ",
    forgettable!(),
    " LIMIT ?2)"
);
