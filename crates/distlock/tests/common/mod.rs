//! Helpers shared by the stock test files (each test file is its own crate; not every one
//! uses every helper). The servers come from `distlock::conformance::servers`.
#![allow(dead_code)]

use distlock::conformance::servers;

/// The Redis server's URL; fails at once, naming the address, when nothing answers there.
pub fn redis_url() -> String {
    servers::REDIS.url()
}

/// A name no other test run uses.
pub fn item(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}
