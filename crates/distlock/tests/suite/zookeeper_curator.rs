//! The ZooKeeper backend against the real Apache Curator: Debian's Curator 5.4 jars, driven by
//! `tests/suite/zookeeper_curator/CuratorLock.java` (compiled here with `javac`), take an `InterProcessMutex`
//! on the path distlock uses for a lock name, and the two exclude each other both ways.
//!
//! Needs the ZooKeeper server of `scripts/test --servers-only` (`DISTLOCK_ZK_URL` overrides),
//! `javac` (Debian's `default-jdk-headless`) and the jars of `libcurator-recipes-java` in
//! /usr/share/java; `scripts/test` installs both when missing. A missing one fails the test,
//! naming the package.

mod harness;
mod mutex;
mod recipes;

use harness::{connect_string, curator_layout};

/// No promise: the test's own helpers (the connect string of a URL, Curator's node names).
#[test]
fn connect_strings_are_taken_from_urls() {
    assert_eq!(connect_string("zk://127.0.0.1:2181/"), "127.0.0.1:2181");
    assert_eq!(connect_string("zk://a:1,b:2/base?x=1"), "a:1,b:2");
    assert_eq!(connect_string("zk://a:1?session_timeout=2s"), "a:1");
    assert!(curator_layout(
        "_c_3f0c1e3c-7d2a-4b8e-9c1f-0a1b2c3d4e5f-lock-0000000007"
    ));
    assert!(!curator_layout("lock-0000000007"));
}
