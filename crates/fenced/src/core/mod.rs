//! Generic machinery above the backend SPI, written once for every backend.

pub(crate) mod acquire;
pub(crate) mod hold;
pub(crate) mod watchdog;
pub(crate) mod worker;
