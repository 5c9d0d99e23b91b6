//! One try: the one-call grant function, else one transaction.

use super::*;

impl PgBackend {
    /// One attempt, retried when the server aborts it for a conflict.
    pub(super) async fn attempt_inner(&self, req: &Attempt) -> Result<Outcome> {
        // Dropped since we opened: go on without it.
        let gone = |e: &sqlx::Error| has_state(e, &["42883"]);
        let tx = || self.attempt_tx(req);
        let fast = crate::backend::sql::call_try_grant(
            &self.pool,
            TRY_GRANT,
            req,
            ms(req.lease) as f64,
            Some(TRY_GRANT_TICKETED),
        );
        // A queued waiter takes the one call only for an exclusive hold:
        // a shared or permit grant must wake the waiters behind it, which
        // the call does not.
        let exclusive = req.mode == crate::spi::Mode::Exclusive;
        crate::backend::sql::attempt(&self.fast, req, fast, tx, is_conflict, gone, exclusive)
            .await
            .map_err(|e| self.db(e))
    }

    pub(super) async fn attempt_tx(
        &self,
        req: &Attempt,
    ) -> std::result::Result<Outcome, sqlx::Error> {
        let name = req.name.as_str();
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn
            .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await?;
        let c: &mut PgConnection = &mut tx;
        let row = sqlx::query(LOCK_NAME).bind(name).fetch_one(&mut *c).await?;
        let last: i64 = row.try_get("token")?;
        let now_us: i64 = row.try_get("now_us")?;
        let purged = sqlx::query(PURGE).bind(name).fetch_one(&mut *c).await?;
        let changed = purged.try_get::<i64, _>("holds")? > 0;
        let rows = sqlx::query(SELECT_HOLDS)
            .bind(name)
            .fetch_all(&mut *c)
            .await?;
        let holds = rows
            .iter()
            .map(|r| hold_row(r, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if let Some(token) = stands(req, &holds) {
            let outcome = Outcome::granted(token);
            tell(c, name, req, &outcome, changed).await?;
            tx.commit().await?;
            return Ok(outcome);
        }
        let q = sqlx::query(QUEUE)
            .bind(name)
            .bind(req.ticket.unwrap_or(i64::MAX))
            .fetch_one(&mut *c)
            .await?;
        let mine = q.try_get::<bool, _>("mine")?.then_some(()).and(req.ticket);
        let ahead = q.try_get::<bool, _>("ahead")?;
        // Another's hand-over stands: an unfair request that would be a
        // new owner waits it out (one nesting into its own hold need not).
        let handoff = q
            .try_get::<Option<i64>, _>("handoff_ms")?
            .filter(|_| !req.fair && !holds.iter().any(|h| h.owner == req.owner_key));
        let decision = match (decide(req, &holds, ahead), handoff) {
            (Decision::Grant, Some(left)) => Decision::Wait {
                retry_after: Some(Duration::from_millis(left.max(1) as u64)),
            },
            (d, _) => d,
        };
        let outcome = match decision {
            Decision::Refuse(why) => Outcome::Refused(why),
            Decision::Grant => {
                let token = (last.saturating_add(1)).max(now_us);
                crate::backend::sql::grant_row(
                    (GRANT, GRANT_ANON),
                    self.holders,
                    req,
                    token,
                    ms(req.lease) as f64,
                )
                .execute(&mut *c)
                .await?;
                if let Some(t) = mine {
                    sqlx::query(DELETE_TICKET).bind(t).execute(&mut *c).await?;
                }
                Outcome::granted(token as u64)
            }
            Decision::Wait { retry_after } => {
                let ttl = ms(QUEUE_TTL) as f64;
                // Unfair waiters queue too (they are never in anyone's
                // way: only fair places are), so that a release wakes the
                // head's process alone, not every process that waits.
                let ticket = match (mine, req.will_wait) {
                    (Some(t), _) => {
                        sqlx::query(REFRESH_TICKET)
                            .bind(t)
                            .bind(ttl)
                            .execute(&mut *c)
                            .await?;
                        Some(t)
                    }
                    (None, true) => {
                        let row = sqlx::query(INSERT_WAITER)
                            .bind(name)
                            .bind(req.fair)
                            .bind(ttl)
                            .fetch_one(&mut *c)
                            .await?;
                        Some(row.try_get::<i64, _>("ticket")?)
                    }
                    (None, false) => None,
                };
                Outcome::Busy(Blocked {
                    ticket,
                    retry_after,
                })
            }
        };
        tell(c, name, req, &outcome, changed).await?;
        tx.commit().await?;
        Ok(outcome)
    }
}

/// What an attempt's transaction tells the other waiters, given whether
/// it purged expired holds (`changed`):
/// - an exclusive grant, nothing: no one else can go;
/// - a grant others may share (readers in a row, permits to spare), after
///   a queued wait or a purge, the bare name: every waiter looks, since
///   more than the head may get in (the place it held may even have
///   expired during a slow call, which is why the request's ticket, not
///   the place found, decides);
/// - no grant after a purge, the head ([`NOTIFY_HEAD`]), passing over the
///   caller's own place.
async fn tell(
    c: &mut PgConnection,
    name: &str,
    req: &Attempt,
    outcome: &Outcome,
    changed: bool,
) -> std::result::Result<(), sqlx::Error> {
    match outcome {
        Outcome::Granted { .. } if req.mode == crate::spi::Mode::Exclusive => Ok(()),
        Outcome::Granted { .. } if changed || req.ticket.is_some() => {
            sqlx::query(NOTIFY).bind(name).fetch_one(c).await.map(drop)
        }
        Outcome::Granted { .. } => Ok(()),
        Outcome::Busy(b) if changed => notify_head(c, name, b.ticket).await,
        _ if changed => notify_head(c, name, None).await,
        _ => Ok(()),
    }
}

/// [`NOTIFY_HEAD`] for `name`, passing over the caller's own place.
async fn notify_head(
    c: &mut PgConnection,
    name: &str,
    own: Option<i64>,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(NOTIFY_HEAD)
        .bind(name)
        .bind(own.unwrap_or(-1))
        .fetch_one(c)
        .await
        .map(drop)
}
