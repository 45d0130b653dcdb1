//! Fault injection, for the test suite and for `distlock check`: faults *during* a request.
//!
//! - [`proxy`]: a TCP proxy on loopback between a client and its server that the caller
//!   controls per request (lose the reply of the next request, delay, blackhole, reset).
//! - [`backend`]: a [`Backend`](crate::backend::Backend) wrapper that hangs or fails any
//!   method after a delay, usable around every backend.

pub mod backend;
pub mod proxy;

pub use backend::{Fault, FaultyBackend, Method};
pub use proxy::FaultProxy;
