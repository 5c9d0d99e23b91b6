//! The lease tables, the one-call grant function, and the statements on them.

use super::*;

/// The tables (also in the README).
pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fenced_locks (
    name  TEXT PRIMARY KEY,
    token BIGINT NOT NULL DEFAULT 0          -- the last fencing token, kept after release
);
CREATE TABLE IF NOT EXISTS fenced_holds (
    hold_id    TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    owner      TEXT NOT NULL,                -- <client id>:<owner id>
    mode       SMALLINT NOT NULL,            -- 0 exclusive, 1 shared, 2 permits
    take       INTEGER NOT NULL,
    max        INTEGER NOT NULL,
    token      BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,         -- database time
    holder     TEXT                          -- host, pid, command, grant time (see `Holder`)
);
CREATE INDEX IF NOT EXISTS fenced_holds_name ON fenced_holds (name);
CREATE TABLE IF NOT EXISTS fenced_waiters (
    ticket     BIGSERIAL PRIMARY KEY,
    name       TEXT NOT NULL,
    fair       BOOLEAN NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS fenced_waiters_name ON fenced_waiters (name, ticket);
CREATE TABLE IF NOT EXISTS fenced_registers (
    name  TEXT PRIMARY KEY,
    value BYTEA NOT NULL,
    fence BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS fenced_rates (
    name   TEXT PRIMARY KEY,
    tat_us BIGINT NOT NULL
);
";

/// A counter's add in one statement: the register's integer plus $2 and
/// its version plus one (created at $2, version 1). A value that is not
/// written in decimal digits returns no row, and a sum out of range fails
/// the cast (22003): the client then changes it by compare-and-set,
/// which says why.
pub(super) const REGISTER_ADD: &str = "INSERT INTO fenced_registers AS r (name, value, fence)
    VALUES ($1, convert_to($2::bigint::text, 'UTF8'), 1)
    ON CONFLICT (name) DO UPDATE
    SET value = convert_to((convert_from(r.value, 'UTF8')::bigint + $2::bigint)::text, 'UTF8'),
        fence = r.fence + 1
    WHERE convert_from(r.value, 'UTF8') ~ '^\\s*-?[0-9]+\\s*$'
    RETURNING convert_from(r.value, 'UTF8')::bigint AS value";

/// The rate limiters' table, for databases whose tables an older fenced
/// made (created on first use).
pub(super) const RATES_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS fenced_rates (name TEXT PRIMARY KEY, tat_us BIGINT NOT NULL)";

/// A rate limiter's decision (see `spi::rate`) by the server's clock, in
/// one statement: $1 name, $2 cost, $3 tolerance (µs). `granted` is
/// the new TAT, or NULL when refused; `tat` the one before (from the
/// statement's snapshot); `now_us` the server's time.
pub(super) const RATE: &str =
    "WITH c AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us),
    up AS (INSERT INTO fenced_rates AS r (name, tat_us) SELECT $1, c.now_us + $2 FROM c
        ON CONFLICT (name) DO UPDATE SET tat_us = greatest(r.tat_us, (SELECT now_us FROM c)) + $2
        WHERE greatest(r.tat_us, (SELECT now_us FROM c)) + $2 - $3 <= (SELECT now_us FROM c)
        RETURNING r.tat_us)
    SELECT (SELECT tat_us FROM up) AS granted,
        (SELECT tat_us FROM fenced_rates WHERE name = $1) AS tat,
        (SELECT now_us FROM c) AS now_us";

/// The names starting with $1 that have a live hold or queue place (by
/// `left`, not `LIKE`, which takes `%` and `_` for wildcards).
pub(crate) const NAMES: &str = "SELECT name FROM fenced_holds
    WHERE expires_at > clock_timestamp() AND left(name, length($1)) = $1
    UNION SELECT name FROM fenced_waiters
    WHERE expires_at > clock_timestamp() AND left(name, length($1)) = $1";
/// The names starting with $1 that fenced ever granted (the advisory mode
/// records their tokens here).
pub(crate) const GRANTED_NAMES: &str =
    "SELECT name FROM fenced_locks WHERE left(name, length($1)) = $1";

/// A grant in one round trip when the name has no hold row at all (an
/// unfair, unqueued acquire of a free lock); NULL sends the caller to the
/// full transaction. Each statement sees a fresh snapshot under READ
/// COMMITTED, so the hold check runs after the name's row is locked; under
/// another isolation the function declines.
///
/// Created only if missing (a role that does not own it can still use it),
/// in a savepoint: a role that may not create functions runs every acquire
/// as the full transaction.
pub(super) const TRY_GRANT_DDL: &str = "
DO $do$
BEGIN
IF to_regprocedure('fenced_try_grant2(text, text, text, smallint, integer, integer, double precision, text)') IS NULL THEN
CREATE FUNCTION fenced_try_grant2(p_name TEXT, p_hold TEXT, p_owner TEXT,
    p_mode SMALLINT, p_take INTEGER, p_max INTEGER, p_ms DOUBLE PRECISION, p_holder TEXT)
    RETURNS BIGINT LANGUAGE plpgsql AS $fn$
DECLARE
    last BIGINT;
    granted BIGINT;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN NULL;
    END IF;
    INSERT INTO fenced_locks (name) VALUES (p_name)
        ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
        RETURNING token INTO last;
    IF EXISTS (SELECT 1 FROM fenced_holds WHERE name = p_name) THEN
        RETURN NULL;
    END IF;
    granted := GREATEST(last + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
    UPDATE fenced_locks SET token = granted WHERE name = p_name;
    INSERT INTO fenced_holds (hold_id, name, owner, mode, take, max, token, expires_at, holder)
        VALUES (p_hold, p_name, p_owner, p_mode, p_take, p_max, granted,
                clock_timestamp() + p_ms * interval '1 millisecond', p_holder);
    RETURN granted;
END $fn$;
END IF;
END $do$;
";

/// Whether `fenced_holds` has the `holder` column (tables made by an older
/// fenced do not).
pub(super) const HAS_HOLDER: &str = "SELECT EXISTS (SELECT 1 FROM pg_attribute
    WHERE attrelid = to_regclass('fenced_holds') AND attname = 'holder' AND NOT attisdropped)";
pub(super) const ADD_HOLDER: &str = "ALTER TABLE fenced_holds ADD COLUMN IF NOT EXISTS holder TEXT";

/// Whether the tables exist already (then [`SCHEMA`] is not run).
pub(super) const HAS_TABLES: &str = "SELECT to_regclass('fenced_locks') IS NOT NULL
    AND to_regclass('fenced_holds') IS NOT NULL
    AND to_regclass('fenced_waiters') IS NOT NULL
    AND to_regclass('fenced_registers') IS NOT NULL";

/// Run on every connection fenced opens. A server (or database, or role)
/// set to `synchronous_commit = off` acknowledges a commit before writing
/// it, and a crash then forgets the last grants and token raises: the lock
/// goes to a second holder and tokens repeat. Only `off` is raised; the
/// stronger settings that wait for standbys are kept.
pub(crate) const DURABLE_COMMITS: &str = "SELECT set_config('synchronous_commit', 'on', false)
    WHERE current_setting('synchronous_commit') = 'off'";

/// Readies a session fenced opens: commits that survive a crash
/// ([`DURABLE_COMMITS`]), and a server that gives up on a statement, or on
/// a wait for a row lock, no later than the client gives up on it.
pub(crate) async fn prepare(
    c: &mut PgConnection,
    timeout: Duration,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(DURABLE_COMMITS).execute(&mut *c).await?;
    let ms = timeout.as_millis().to_string();
    sqlx::query(
        "SELECT set_config('statement_timeout', $1, false), \
                set_config('lock_timeout', $1, false)",
    )
    .bind(ms)
    .execute(c)
    .await
    .map(drop)
}

/// How long (ms) a change that names an unfair head keeps the lock for it
/// against other unfair requests: the notification's hop and the head's
/// call, with room for a busy host. Without it, the releasing process,
/// already running, took the lock again before the head's call came, as
/// often as not (one process held it 298 times in a row in S2 on a busy
/// host). The head's place ends with the moment unless its call renews or
/// withdraws it: a head that died holds the others up until they look
/// again on their own (at most `MAX_FALLBACK`, 2 s), once, since the next
/// change names the next place. A literal, for the statements' `concat!`.
macro_rules! handoff {
    () => {
        "interval '20 milliseconds'"
    };
}

/// The condition on a `fenced_waiters` row that its hand-over
/// ([`handoff!`]) stands: an unfair place whose expiry a change cut to
/// the moment, not yet past.
macro_rules! handing_over {
    () => {
        concat!(
            "NOT fair AND expires_at > clock_timestamp() AND expires_at <= clock_timestamp() + ",
            handoff!()
        )
    };
}

/// The two notifications of a change the head of lock `$name` may use,
/// as one count: the head (`\x02<ticket>:<name>`, from relation `$head`
/// with a column `ticket`, none if it is empty), then the bare name (one
/// per row of `$rows`, or one if `$rows` is empty text), for clients that
/// do not read heads. They are added in this order, by the order `+`
/// evaluates its arguments, and a transaction's notifications reach every
/// listener together and in order.
macro_rules! notify_pair {
    ($head:literal, $name:literal, $rows:literal) => {
        concat!(
            "(SELECT count(*) FROM (SELECT pg_notify('fenced_wake', chr(2) || ticket || ':' || ",
            $name,
            ") FROM ",
            $head,
            ") AS a) + (SELECT count(*) FROM (SELECT pg_notify('fenced_wake', ",
            $name,
            ")",
            $rows,
            ") AS b)"
        )
    };
}

/// The `NOTIFY` channel.
pub(super) const CHANNEL: &str = "fenced_wake";
/// Serialises schema creation between processes.
pub(crate) const SCHEMA_LOCK: i64 = 0x6665_6e63_6564; // "fenced"

pub(super) const NEXT_TOKEN: &str = "INSERT INTO fenced_locks (name, token)
    VALUES ($1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
    ON CONFLICT (name) DO UPDATE SET token = GREATEST(fenced_locks.token + 1, EXCLUDED.token)
    RETURNING token";

/// The one-call grant, not called while another's hand-over stands
/// ([`handoff!`]).
pub(super) const TRY_GRANT: &str = concat!(
    "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM fenced_waiters WHERE name = $1 AND ",
    handing_over!(),
    ") THEN fenced_try_grant2($1, $2, $3, $4, $5, $6, $7, $8) END"
);
/// [`TRY_GRANT`] for a queued caller (an unfair waiter, woken as the
/// head), which also withdraws its place $9 when it grants: one
/// statement, one transaction.
pub(super) const TRY_GRANT_TICKETED: &str = concat!(
    "WITH c AS (SELECT NOT EXISTS (SELECT 1 FROM fenced_waiters
        WHERE name = $1 AND ticket <> $9 AND ",
    handing_over!(),
    ") AS free),
    g AS (SELECT CASE WHEN c.free THEN fenced_try_grant2($1, $2, $3, $4, $5, $6, $7, $8) END AS token FROM c),
    d AS (DELETE FROM fenced_waiters WHERE ticket = $9 AND (SELECT token FROM g) IS NOT NULL)
    SELECT token FROM g"
);
pub(super) const LOCK_NAME: &str = "INSERT INTO fenced_locks (name) VALUES ($1)
    ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
    RETURNING token, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us";
pub(super) const PURGE: &str = "WITH h AS (DELETE FROM fenced_holds WHERE name = $1 AND expires_at <= clock_timestamp() RETURNING 1),
    w AS (DELETE FROM fenced_waiters WHERE name = $1 AND expires_at <= clock_timestamp() RETURNING 1)
    SELECT (SELECT count(*) FROM h) AS holds, (SELECT count(*) FROM w) AS waiters";
pub(super) const SELECT_HOLDS: &str = "SELECT hold_id, owner, mode, take, max, token,
    (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint AS left_ms
    FROM fenced_holds WHERE name = $1 AND expires_at > clock_timestamp()";
/// [`SELECT_HOLDS`] with the holders' records, for status.
pub(super) const SHOW_HOLDS: &str = "SELECT hold_id, owner, mode, take, max, token, holder,
    (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint AS left_ms
    FROM fenced_holds WHERE name = $1 AND expires_at > clock_timestamp()";
/// Whether ticket $2 is still queued, whether a fair place is ahead of
/// it, and the ms left of another's hand-over ([`handoff!`]), if one stands.
pub(super) const QUEUE: &str = concat!(
    "SELECT
    EXISTS (SELECT 1 FROM fenced_waiters WHERE ticket = $2 AND name = $1) AS mine,
    EXISTS (SELECT 1 FROM fenced_waiters WHERE name = $1 AND fair AND ticket < $2) AS ahead,
    (SELECT (extract(epoch FROM min(expires_at) - clock_timestamp()) * 1000)::bigint
        FROM fenced_waiters WHERE name = $1 AND ticket <> $2 AND ",
    handing_over!(),
    ") AS handoff_ms"
);
pub(super) const GRANT: &str = "WITH t AS (UPDATE fenced_locks SET token = $7 WHERE name = $2)
    INSERT INTO fenced_holds (hold_id, name, owner, mode, take, max, token, expires_at, holder)
    VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp() + $8 * interval '1 millisecond', $9)";
/// [`GRANT`] on tables without the `holder` column that this role may not add.
pub(super) const GRANT_ANON: &str = "WITH t AS (UPDATE fenced_locks SET token = $7 WHERE name = $2)
    INSERT INTO fenced_holds (hold_id, name, owner, mode, take, max, token, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp() + $8 * interval '1 millisecond')";
pub(super) const DELETE_TICKET: &str = "DELETE FROM fenced_waiters WHERE ticket = $1";
pub(super) const REFRESH_TICKET: &str = "UPDATE fenced_waiters
    SET expires_at = clock_timestamp() + $2 * interval '1 millisecond' WHERE ticket = $1";
pub(super) const INSERT_WAITER: &str = "INSERT INTO fenced_waiters (name, fair, expires_at)
    VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond') RETURNING ticket";
// pg_notify returns void, which no driver decodes: wrap it in a count.
pub(super) const NOTIFY: &str = "SELECT count(*) FROM (SELECT pg_notify('fenced_wake', $1)) AS n";
/// The CTE `called` that starts the hand-over to the unfair head in
/// relation `$h` (a column `ticket`).
macro_rules! call {
    ($h:literal) => {
        concat!(
            "called AS (UPDATE fenced_waiters SET expires_at = least(expires_at, clock_timestamp() + ",
            handoff!(),
            ") WHERE ticket IN (SELECT ticket FROM ",
            $h,
            ") AND NOT fair RETURNING 1)"
        )
    };
}

/// A change to lock $1 that its queue's head may use: [`notify_pair!`]
/// (see [`head_of`](super::head_of) for the head's), passing over ticket
/// $2 (the caller's own, or -1). An unfair head's hand-over
/// ([`handoff!`]) is its place's expiry cut to the moment.
pub(super) const NOTIFY_HEAD: &str = concat!(
    "WITH h AS (SELECT ticket FROM fenced_waiters
        WHERE name = $1 AND ticket <> $2 AND expires_at > clock_timestamp()
        ORDER BY ticket LIMIT 1),
    ",
    call!("h"),
    "
    SELECT ",
    notify_pair!("h", "$1", ""),
    " AS notified"
);
pub(super) const RENEW: &str = "UPDATE fenced_holds h
    SET expires_at = clock_timestamp() + v.ms * interval '1 millisecond'
    FROM unnest($1::text[], $2::bigint[]) AS v(id, ms)
    WHERE h.hold_id = v.id AND h.expires_at > clock_timestamp()
    RETURNING h.hold_id";
/// A release, and [`NOTIFY_HEAD`]'s two notifications for its lock. Only
/// an exclusive hold's release names the head: it frees the whole lock.
/// A read or permit hold's frees a part that the head may not fit in and
/// another waiter may, so every waiter looks (the bare name alone).
pub(super) const RELEASE: &str = concat!(
    "WITH d AS (DELETE FROM fenced_holds WHERE hold_id = $1
        RETURNING name, mode, expires_at > clock_timestamp() AS live),
    h AS (SELECT w.ticket, d.name FROM d, LATERAL (SELECT ticket FROM fenced_waiters
        WHERE name = d.name AND expires_at > clock_timestamp() ORDER BY ticket LIMIT 1) AS w
        WHERE d.mode = 0),
    ",
    call!("h"),
    "
    SELECT live, ",
    notify_pair!("h", "name", " FROM d"),
    " AS notified FROM d"
);
/// A withdrawal (the queue place $2, the hold $3, of lock $1), and
/// [`NOTIFY_HEAD`]'s notifications if it took anything away. The
/// statement's snapshot still shows the place it deletes, so the head is
/// looked for past it. It starts no hand-over: two front waiters
/// withdrawing at once would each delete its own place and cut the
/// other's, row locks taken in opposite orders (a deadlock).
pub(super) const ABANDON: &str = concat!(
    "WITH w AS (DELETE FROM fenced_waiters WHERE ticket = $2 RETURNING 1),
    h AS (DELETE FROM fenced_holds WHERE hold_id = $3 RETURNING 1),
    go AS (SELECT 1 WHERE EXISTS (SELECT 1 FROM w) OR EXISTS (SELECT 1 FROM h)),
    hd AS (SELECT ticket FROM fenced_waiters
        WHERE name = $1 AND ticket <> $2 AND expires_at > clock_timestamp()
            AND EXISTS (SELECT 1 FROM go)
        ORDER BY ticket LIMIT 1)
    SELECT ",
    notify_pair!("hd", "$1", " FROM go"),
    " AS notified"
);
pub(super) const STATUS_WAITERS: &str = "SELECT
    (SELECT count(*) FROM fenced_waiters WHERE name = $1 AND expires_at > clock_timestamp()) AS waiters,
    COALESCE((SELECT token FROM fenced_locks WHERE name = $1), 0) AS token";
/// Every hold of $1 deleted, and [`NOTIFY_HEAD`]'s notifications (no
/// hand-over: an operator's unlock need not keep the lock for anyone, and
/// its row locks then cannot cross a release's).
pub(super) const FORCE: &str = concat!(
    "WITH d AS (DELETE FROM fenced_holds WHERE name = $1 RETURNING 1),
    hd AS (SELECT ticket FROM fenced_waiters
        WHERE name = $1 AND expires_at > clock_timestamp() ORDER BY ticket LIMIT 1)
    SELECT (SELECT count(*) FROM d) AS n, ",
    notify_pair!("hd", "$1", ""),
    " AS notified"
);
pub(super) const REGISTER_DELETE: &str = "DELETE FROM fenced_registers WHERE name = $1";
pub(super) const REGISTER_READ: &str = "SELECT value, fence FROM fenced_registers WHERE name = $1";
/// The register's writes (see [`RegisterSql`](super::super::RegisterSql)).
pub(super) const REGISTER_SQL: super::super::RegisterSql = super::super::RegisterSql {
    fenced: "INSERT INTO fenced_registers (name, value, fence) VALUES ($1, $2, $3)
    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence
    WHERE fenced_registers.fence <= EXCLUDED.fence",
    unfenced: "INSERT INTO fenced_registers (name, value, fence) VALUES ($1, $2, 0)
    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
    create: "INSERT INTO fenced_registers (name, value, fence) VALUES ($1, $2, 1)
    ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, fence = 1
    WHERE fenced_registers.fence = 0",
    swap: "UPDATE fenced_registers SET value = $2, fence = fence + 1 WHERE name = $1 AND fence = $3",
};
pub(super) const REGISTER_DECREMENT: &str = "UPDATE fenced_registers
    SET value = convert_to((convert_from(value, 'UTF8')::bigint - $2)::text, 'UTF8')
    WHERE name = $1 AND convert_from(value, 'UTF8')::bigint >= $2
    RETURNING convert_from(value, 'UTF8')::bigint AS value";
