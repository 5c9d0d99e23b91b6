//! The lease tables and the statements on them.

/// The tables (also in the README).
pub(crate) const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS fenced_locks (
        name  VARBINARY(512) PRIMARY KEY,
        token BIGINT NOT NULL DEFAULT 0
    ) ENGINE = InnoDB",
    "CREATE TABLE IF NOT EXISTS fenced_holds (
        hold_id    VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,
        name       VARBINARY(512) NOT NULL,
        owner      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        `mode`     SMALLINT NOT NULL,
        take       INT NOT NULL,
        `max`      INT NOT NULL,
        token      BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL,
        holder     VARCHAR(600) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        KEY fenced_holds_name (name)
    ) ENGINE = InnoDB",
    "CREATE TABLE IF NOT EXISTS fenced_waiters (
        ticket     BIGINT AUTO_INCREMENT PRIMARY KEY,
        name       VARBINARY(512) NOT NULL,
        fair       TINYINT NOT NULL,
        bell       BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL,
        KEY fenced_waiters_name (name, ticket)
    ) ENGINE = InnoDB",
    "CREATE TABLE IF NOT EXISTS fenced_registers (
        name  VARBINARY(512) PRIMARY KEY,
        value LONGBLOB NOT NULL,
        fence BIGINT NOT NULL
    ) ENGINE = InnoDB",
];

/// The rate limiters' table, made on a limiter's first use, not with the
/// others: a role that may only read and write the tables an older fenced
/// made still connects (and gets an error naming the table only if it
/// uses a rate limiter).
pub(super) const RATES_TABLE: &str = "CREATE TABLE IF NOT EXISTS fenced_rates (
        name   VARBINARY(512) PRIMARY KEY,
        tat_us BIGINT NOT NULL
    ) ENGINE = InnoDB";

/// A rate limiter's state (see `spi::rate`), locked, with the server's
/// time in µs.
pub(super) const RATE_LOCK: &str = "SELECT tat_us,
    CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED) AS now_us
    FROM fenced_rates WHERE name = ? FOR UPDATE";
pub(super) const RATE_NOW: &str = "SELECT CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)";
pub(super) const RATE_SET: &str = "UPDATE fenced_rates SET tat_us = ? WHERE name = ?";
pub(super) const RATE_NEW: &str = "INSERT INTO fenced_rates (name, tat_us) VALUES (?, ?)";

/// A free lock's grant in one round trip: `SELECT fenced_try_grant(…)`
/// runs as one statement, so in one transaction (autocommit). It does what
/// [`MySqlBackend::attempt_tx`] does for an unfair, unqueued acquire of a
/// name without holds, and returns NULL, leaving the decision to that
/// transaction, when any hold row exists. The reads are locking reads, so
/// they see the latest commits whatever the isolation level.
pub(super) const TRY_GRANT_DDL: &str = "CREATE FUNCTION IF NOT EXISTS fenced_try_grant2(
    p_name VARBINARY(512), p_hold VARCHAR(64) CHARACTER SET ascii,
    p_owner VARCHAR(1024) CHARACTER SET utf8mb4, p_mode SMALLINT, p_take INT, p_max INT,
    p_ms BIGINT, p_holder VARCHAR(600) CHARACTER SET utf8mb4) RETURNS BIGINT NOT DETERMINISTIC MODIFIES SQL DATA
BEGIN
    DECLARE v_last, v_us, v_now, v_token BIGINT;
    DECLARE v_holds INT;
    INSERT INTO fenced_locks (name) VALUES (p_name) ON DUPLICATE KEY UPDATE token = token;
    SELECT token, CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED),
        CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)
        INTO v_last, v_us, v_now FROM fenced_locks WHERE name = p_name FOR UPDATE;
    SELECT COUNT(*) INTO v_holds FROM fenced_holds WHERE name = p_name FOR UPDATE;
    IF v_holds > 0 THEN
        RETURN NULL;
    END IF;
    SET v_token = GREATEST(v_last + 1, v_us);
    UPDATE fenced_locks SET token = v_token WHERE name = p_name;
    INSERT INTO fenced_holds (hold_id, name, owner, `mode`, take, `max`, token, expires_ms, holder)
        VALUES (p_hold, p_name, p_owner, p_mode, p_take, p_max, v_token, v_now + p_ms, p_holder);
    RETURN v_token;
END";

pub(super) const TRY_GRANT: &str = "SELECT fenced_try_grant2(?, ?, ?, ?, ?, ?, ?, ?)";

/// Whether `fenced_holds` has the `holder` column (tables made by an older
/// fenced do not).
pub(super) const HAS_HOLDER: &str =
    "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.COLUMNS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'fenced_holds' AND COLUMN_NAME = 'holder'";
pub(super) const ADD_HOLDER: &str = "ALTER TABLE fenced_holds
    ADD COLUMN holder VARCHAR(600) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL";

/// The names starting with the prefix (bound twice, as bytes) that have a
/// live hold or queue place: a byte range on the `VARBINARY` names, which
/// ends below `0xFF`, a byte UTF-8 never has.
pub(super) const NAMES: &str = "SELECT name FROM fenced_holds
    WHERE name >= ? AND name < CONCAT(?, 0xFF)
      AND expires_ms > CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)
    UNION SELECT name FROM fenced_waiters
    WHERE name >= ? AND name < CONCAT(?, 0xFF)
      AND expires_ms > CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)";
/// The names starting with the prefix (bound twice) that fenced ever
/// granted (the advisory mode records their tokens here).
pub(crate) const GRANTED_NAMES: &str =
    "SELECT name FROM fenced_locks WHERE name >= ? AND name < CONCAT(?, 0xFF)";
pub(super) const NOW_MS: &str = "CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)";

pub(super) const LOCK_NAME: &str =
    "INSERT INTO fenced_locks (name) VALUES (?) ON DUPLICATE KEY UPDATE token = token";
pub(super) const READ_NAME: &str = "SELECT token,
    CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED) AS now_us,
    CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) AS now_ms
    FROM fenced_locks WHERE name = ? FOR UPDATE";
pub(super) const PURGE_HOLDS: &str = "DELETE FROM fenced_holds WHERE name = ? AND expires_ms <= ?";
pub(super) const PURGE_WAITERS: &str =
    "DELETE FROM fenced_waiters WHERE name = ? AND expires_ms <= ?";
pub(super) const SELECT_HOLDS: &str =
    "SELECT hold_id, owner, `mode`, take, `max`, token, expires_ms
    FROM fenced_holds WHERE name = ? AND expires_ms > ?";
pub(super) const QUEUE: &str = "SELECT
    CAST(EXISTS (SELECT 1 FROM fenced_waiters WHERE ticket = ? AND name = ?) AS SIGNED) AS mine,
    CAST(EXISTS (SELECT 1 FROM fenced_waiters WHERE name = ? AND fair = 1 AND ticket < ?) AS SIGNED) AS ahead";
pub(super) const SET_TOKEN: &str = "UPDATE fenced_locks SET token = ? WHERE name = ?";
pub(super) const INSERT_HOLD: &str = "INSERT INTO fenced_holds
    (hold_id, name, owner, `mode`, take, `max`, token, expires_ms, holder)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";
/// [`INSERT_HOLD`] on tables without the `holder` column that this user
/// may not add.
pub(super) const INSERT_HOLD_ANON: &str = "INSERT INTO fenced_holds
    (hold_id, name, owner, `mode`, take, `max`, token, expires_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)";
pub(super) const DELETE_TICKET: &str = "DELETE FROM fenced_waiters WHERE ticket = ?";
pub(super) const REFRESH_TICKET: &str =
    "UPDATE fenced_waiters SET expires_ms = ?, bell = ? WHERE ticket = ?";
pub(super) const INSERT_WAITER: &str =
    "INSERT INTO fenced_waiters (name, fair, bell, expires_ms) VALUES (?, ?, ?, ?)";
pub(super) const BELLS: &str = "SELECT bell FROM fenced_waiters
    WHERE name = ? AND expires_ms > CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)
      AND IS_USED_LOCK(CONCAT('fenced_doorbell:', bell)) = bell
    ORDER BY ticket LIMIT 8";
/// What a doorbell holds to show it is one (see the module docs).
pub(super) const DOORBELL_MARK: &str =
    "SELECT CAST(GET_LOCK(CONCAT('fenced_doorbell:', CONNECTION_ID()), 0) AS SIGNED) AS got";
/// A register watcher's place (see [`watch_register`](crate::spi::Store::watch_register)):
/// a waiter row under the register's wake key, one per client, kept alive
/// by each arming. ?: ttl ms, key, bell.
pub(super) const REFRESH_WATCHER: &str = "UPDATE fenced_waiters
    SET expires_ms = CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) + ?
    WHERE name = ? AND bell = ?";
/// ?: key, bell, ttl ms.
pub(super) const INSERT_WATCHER: &str = "INSERT INTO fenced_waiters (name, fair, bell, expires_ms)
    VALUES (?, 0, ?, CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) + ?)";
pub(super) const REGISTER_DELETE: &str = "DELETE FROM fenced_registers WHERE name = ?";
/// Drops the lapsed places of every register watcher: their names begin
/// with the byte 0x01, which no lock name has.
pub(super) const PURGE_WATCHERS: &str = "DELETE FROM fenced_waiters
    WHERE name >= 0x01 AND name < 0x02
      AND expires_ms <= CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)";
/// The doorbells of the clients watching register key ?.
pub(super) const WATCHER_BELLS: &str = "SELECT DISTINCT bell FROM fenced_waiters
    WHERE name = ? AND expires_ms > CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)
      AND IS_USED_LOCK(CONCAT('fenced_doorbell:', bell)) = bell
    LIMIT 1024";
pub(super) const FORGET_BELL: &str = "DELETE FROM fenced_waiters WHERE bell = ?";
pub(super) const RELEASE: &str = "DELETE FROM fenced_holds WHERE hold_id = ?
    RETURNING name, CAST(expires_ms > CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) AS SIGNED) AS live";
pub(super) const ABANDON_TICKET: &str = "DELETE FROM fenced_waiters WHERE ticket = ?";
pub(super) const ABANDON_HOLD: &str = "DELETE FROM fenced_holds WHERE hold_id = ?";
pub(super) const STATUS_HOLDS: &str =
    "SELECT hold_id, owner, `mode`, take, `max`, token, expires_ms,
    CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) AS now_ms
    FROM fenced_holds WHERE name = ?";
/// [`STATUS_HOLDS`] with the holders' records.
pub(super) const SHOW_HOLDS: &str =
    "SELECT hold_id, owner, `mode`, take, `max`, token, expires_ms, holder,
    CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) AS now_ms
    FROM fenced_holds WHERE name = ?";
pub(super) const STATUS_REST: &str = "SELECT
    CAST((SELECT count(*) FROM fenced_waiters WHERE name = ?
          AND expires_ms > CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)) AS SIGNED) AS waiters,
    CAST(COALESCE((SELECT token FROM fenced_locks WHERE name = ?), 0) AS SIGNED) AS token";
pub(super) const NEXT_TOKEN: &str = "INSERT INTO fenced_locks (name, token)
    VALUES (?, LAST_INSERT_ID(CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)))
    ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, VALUES(token)))";
pub(super) const LAST_TOKEN: &str =
    "SELECT CAST(COALESCE((SELECT token FROM fenced_locks WHERE name = ?), 0) AS SIGNED) AS token";
pub(super) const FORCE: &str = "DELETE FROM fenced_holds WHERE name = ?";
pub(super) const REGISTER_READ: &str = "SELECT value, fence FROM fenced_registers WHERE name = ?";
pub(super) const REGISTER_LOCK: &str =
    "SELECT value, fence FROM fenced_registers WHERE name = ? FOR UPDATE";
pub(super) const REGISTER_SWAP: &str =
    "UPDATE fenced_registers SET value = ?, fence = fence + 1 WHERE name = ? AND fence = ?";
pub(super) const REGISTER_CREATE: &str =
    "INSERT IGNORE INTO fenced_registers (name, value, fence) VALUES (?, ?, 1)";
pub(super) const REGISTER_UPSERT: &str =
    "INSERT INTO fenced_registers (name, value, fence) VALUES (?, ?, ?)
    ON DUPLICATE KEY UPDATE value = VALUES(value), fence = VALUES(fence)";
