//! Generic machinery above the backend SPI, written once for every backend.

pub(crate) mod acquire;
pub(crate) mod engine;
pub(crate) mod hold;
pub(crate) mod metrics;
pub(crate) mod retry;
pub(crate) mod watchdog;
pub(crate) mod worker;
