//! Helpers shared by the stock test files (each test file is its own crate; not every one
//! uses every helper).
#![allow(dead_code)]

/// The Redis server's URL (`DISTLOCK_REDIS_URL`, default 127.0.0.1:6379); fails at once,
/// naming the address, when nothing answers there.
pub fn redis_url() -> String {
    let url =
        std::env::var("DISTLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let address = url
        .trim_start_matches("redis://")
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .to_owned();
    if std::net::TcpStream::connect(&address).is_err() {
        panic!("Redis is not reachable at {address}; start it with scripts/test");
    }
    url
}

/// A name no other test run uses.
pub fn item(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}
