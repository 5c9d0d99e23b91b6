//! The lock backend.

use super::*;

impl LockBackend for RedisBackend {
    fn scheme(&self) -> &'static str {
        self.scheme
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> BoxFuture<'a, Result<Outcome>> {
        Box::pin(self.attempt_inner(req))
    }

    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> BoxFuture<'a, Result<Vec<Renewal>>> {
        Box::pin(self.renew_inner(holds))
    }

    fn request_timeout(&self) -> Duration {
        self.timeout
    }

    fn identity(&self) -> String {
        self.identity.clone()
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.release_inner(hold))
    }

    fn abandon<'a>(
        &'a self,
        name: &'a LockName,
        ticket: Option<Ticket>,
        hold_id: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.abandon_inner(name, ticket, hold_id))
    }

    fn status<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<LockStatus>> {
        Box::pin(self.status_inner(name))
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<usize>> {
        Box::pin(self.force_inner(name))
    }
}

impl Backend for RedisBackend {}
