//! Any string as a lock name: refused with a typed error, or mapped onto every backend's
//! server-side name without a panic, within each server's limits.
#![no_main]

use distlock::LockName;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let name = match LockName::new(text) {
        Ok(name) => name,
        Err(error) => {
            assert!(error.is_invalid_input(), "{text:?}: {error}");
            return;
        }
    };
    let escaped = name.escaped();
    assert!(!escaped.is_empty());
    // ZooKeeper: one path component under the base, never `.` or `..`.
    let path = distlock::zookeeper::lock_path("/distlock/locks", name.as_str());
    let node = path
        .strip_prefix("/distlock/locks/")
        .expect("the node is under the base");
    assert!(!node.is_empty() && !node.contains('/'), "{text:?} -> {path:?}");
    assert!(node != "." && node != "..", "{text:?} -> {path:?}");
    // MySQL: at most 64 bytes; short names are themselves.
    let mysql = distlock::mysql::server_lock_name(name.as_str());
    assert!(mysql.len() <= 64, "{text:?} -> {mysql:?}");
    if name.as_str().len() <= 64 {
        assert_eq!(mysql, name.as_str());
    }
    // PostgreSQL: any name has a key.
    let _ = distlock::postgres::advisory_key(name.as_str());
});
