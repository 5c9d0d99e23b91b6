//! The lock backend.

use super::*;

impl LockBackend for RedisBackend {
    fn scheme(&self) -> &'static str {
        self.scheme
    }

    fn doctor(&self) -> Reply<'_, Vec<crate::doctor::Check>> {
        Box::pin(self.checks())
    }

    fn attempt<'a>(&'a self, req: &'a Attempt) -> Reply<'a, Outcome> {
        Box::pin(self.attempt_inner(req))
    }

    fn renew<'a>(&'a self, holds: &'a [HoldRef]) -> Reply<'a, Vec<Renewal>> {
        Box::pin(self.renew_inner(holds))
    }

    fn request_timeout(&self) -> Duration {
        self.timeout
    }

    fn identity(&self) -> String {
        self.identity.clone()
    }

    fn release<'a>(&'a self, hold: &'a HoldRef) -> Reply<'a, bool> {
        Box::pin(self.release_inner(hold))
    }

    fn abandon<'a>(&'a self, gone: &'a Withdrawal) -> Reply<'a, ()> {
        Box::pin(self.abandon_inner(gone))
    }

    fn status<'a>(&'a self, name: &'a LockName) -> Reply<'a, LockStatus> {
        Box::pin(self.status_inner(name))
    }

    fn force_release<'a>(&'a self, name: &'a LockName) -> Reply<'a, usize> {
        Box::pin(self.force_inner(name))
    }

    fn names<'a>(&'a self, prefix: &'a str) -> Reply<'a, Vec<LockName>> {
        Box::pin(self.names_inner(prefix))
    }
}

impl Backend for RedisBackend {}
