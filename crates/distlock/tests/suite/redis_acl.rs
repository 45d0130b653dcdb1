//! Redis that requires a password, with the users of `scripts/redis-acl.conf` (started by
//! `scripts/test`), on a standalone server, a Sentinel group whose sentinels require a password
//! of their own, and a Cluster: the conformance suite as `app`, a user that may run only the
//! commands distlock's locks need and touch only keys and channels under `distlock:`; refused
//! credentials (the master's and the sentinels') as `Error::NotAuthorized`, saying which to
//! fix; and a `tenant` whose key pattern keeps it away from every lock outside its own names
//! (security: lock state only its owners can change).

use std::time::Duration;

use distlock::conformance::{Target, servers};
use tokio::time::timeout;

/// How long one step may take on a loaded machine.
const STEP: Duration = Duration::from_secs(30);

/// The server as `host:port`.
fn server() -> String {
    servers::first_address(&servers::REDIS_ACL.url()).to_owned()
}

/// A `scheme://` URL of the server as `user:password`.
fn as_user(scheme: &str, user: &str, password: &str) -> String {
    format!("{scheme}://{user}:{password}@{}/", server())
}

/// The hosts and path of a deployment's URL: what follows its user info, before its query.
fn hosts_and_path(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split('?').next().unwrap_or_default();
    match rest.rsplit_once('@') {
        Some((_, hosts)) => hosts.to_owned(),
        None => rest.to_owned(),
    }
}

/// The password-protected Sentinel group's URL, logging in to the master as `user:password`
/// and to the sentinels with `sentinel` (a `sentinel_user=`/`sentinel_password=` query, or
/// nothing).
fn sentinel_as(user: &str, password: &str, sentinel: &str) -> String {
    let url = format!(
        "redis+sentinel://{user}:{password}@{}",
        hosts_and_path(&servers::REDIS_SENTINEL_ACL.url())
    );
    if sentinel.is_empty() {
        url
    } else {
        format!("{url}?{sentinel}")
    }
}

/// The password-protected Cluster's URL as `user:password`.
fn cluster_as(user: &str, password: &str) -> String {
    format!(
        "redis+cluster://{user}:{password}@{}",
        hosts_and_path(&servers::REDIS_CLUSTER_ACL.url())
    )
}

/// The sentinels' password, as the test deployment sets it.
const SENTINEL_PASSWORD: &str = "sentinel_password=sentinel-pw";

distlock::conformance_suite!(redis_acl, Target::new(as_user("redis", "app", "app-pw")));
distlock::conformance_suite!(
    redis_acl_spin,
    Target::new(as_user("redis+spin", "app", "app-pw"))
);
distlock::conformance_suite!(
    redis_sentinel_acl,
    Target::new(sentinel_as("app", "app-pw", SENTINEL_PASSWORD))
);
distlock::conformance_suite!(redis_cluster_acl, Target::new(cluster_as("app", "app-pw")));

/// A raw connection of the server as `user:password`.
async fn raw(user: &str, password: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(as_user("redis", user, password)).unwrap();
    timeout(STEP, client.get_multiplexed_async_connection())
        .await
        .expect("the raw connection took too long")
        .expect("a raw connection")
}

/// Credentials the server refuses, and none where it requires them, are
/// `Error::NotAuthorized` at connect, saying what to fix and never the password; on Redlock
/// too, rather than "masters not reachable".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_not_authorized() {
    for (what, url, says) in [
        (
            "a wrong password",
            as_user("redis", "app", "not-the-pw"),
            "WRONGPASS",
        ),
        (
            "an unknown user",
            as_user("redis", "nobody", "not-the-pw"),
            "WRONGPASS",
        ),
        ("no credentials", format!("redis://{}/", server()), "NOAUTH"),
        (
            "Redlock masters that refuse the user",
            servers::REDLOCK
                .url()
                .replacen("://", "://nobody:not-the-pw@", 1),
            "WRONGPASS",
        ),
        (
            "a Sentinel master that refuses the password",
            sentinel_as("app", "not-the-pw", SENTINEL_PASSWORD),
            "WRONGPASS",
        ),
        (
            "a Sentinel master that refuses the user",
            sentinel_as("nobody", "not-the-pw", SENTINEL_PASSWORD),
            "WRONGPASS",
        ),
        (
            "sentinels that require a password none was given for",
            sentinel_as("app", "app-pw", ""),
            "sentinel_password=",
        ),
        (
            "sentinels that refuse the password",
            sentinel_as("app", "app-pw", "sentinel_password=not-the-pw"),
            "sentinel_user= and sentinel_password=",
        ),
        (
            "sentinels that refuse the user",
            sentinel_as(
                "app",
                "app-pw",
                "sentinel_user=nobody&sentinel_password=not-the-pw",
            ),
            "sentinel_user= and sentinel_password=",
        ),
        (
            "a Cluster that refuses the password",
            cluster_as("app", "not-the-pw"),
            "WRONGPASS",
        ),
        (
            "a Cluster that requires a password",
            format!(
                "redis+cluster://{}",
                hosts_and_path(&servers::REDIS_CLUSTER_ACL.url())
            ),
            "NOAUTH",
        ),
    ] {
        let err = timeout(STEP, distlock::connect(&url))
            .await
            .unwrap_or_else(|_| panic!("{what}: the refused connect took too long"))
            .err()
            .unwrap_or_else(|| panic!("{what} was let in"));
        assert!(err.is_not_authorized(), "{what}: {err}");
        let text = err.to_string();
        assert!(text.contains(says), "{what}: {text}");
        assert!(!text.contains("not-the-pw"), "{what}: {text}");
        assert!(!text.contains("sentinel-pw"), "{what}: {text}");
    }
    // The stock store's connection too.
    for (what, url, says) in [
        (
            "a stock store with a wrong password",
            as_user("redis", "app", "not-the-pw"),
            "WRONGPASS",
        ),
        (
            "a stock store without credentials",
            format!("redis://{}/", server()),
            "NOAUTH",
        ),
    ] {
        let err = timeout(STEP, distlock::stock::RedisStockStore::connect(&url))
            .await
            .unwrap_or_else(|_| panic!("{what}: the refused connect took too long"))
            .err()
            .unwrap_or_else(|| panic!("{what} was let in"));
        assert!(err.is_not_authorized(), "{what}: {err}");
        let text = err.to_string();
        assert!(
            text.contains(says) && !text.contains("not-the-pw"),
            "{what}: {text}"
        );
    }
}

/// Security on Sentinel and Cluster too: the `tenant` is refused a lock outside `tenant/`
/// there as on a standalone server (the same ACL file), and takes its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reaches_only_its_own_locks_on_sentinel_and_cluster() {
    let id = uuid::Uuid::new_v4().simple();
    for url in [
        sentinel_as("tenant", "tenant-pw", SENTINEL_PASSWORD),
        cluster_as("tenant", "tenant-pw"),
    ] {
        let shown = distlock::redact_url(&url);
        let tenant = timeout(STEP, distlock::connect(&url))
            .await
            .unwrap_or_else(|_| panic!("{shown}: connecting took too long"))
            .unwrap_or_else(|e| panic!("{shown}: {e}"));
        let own = format!("tenant/report-{id}");
        let guard = timeout(STEP, tenant.mutex(own.as_str()).unwrap().acquire())
            .await
            .unwrap_or_else(|_| panic!("{shown}: the tenant's own lock took too long"))
            .unwrap_or_else(|e| panic!("{shown}: {e}"));
        timeout(STEP, guard.release()).await.unwrap().unwrap();
        let refused = timeout(
            STEP,
            tenant
                .mutex(format!("stock/iphone-{id}").as_str())
                .unwrap()
                .try_acquire(),
        )
        .await
        .unwrap_or_else(|_| panic!("{shown}: the refused try took too long"))
        .expect_err("the tenant was let at a lock outside tenant/");
        assert!(refused.is_not_authorized(), "{shown}: {refused}");
        assert!(refused.to_string().contains("NOPERM"), "{shown}: {refused}");
    }
}

/// Security, and promise 1 against another user: `tenant`, whose ACL allows only keys and
/// channels of locks named `tenant/...`, takes such locks, is refused any other lock with
/// `Error::NotAuthorized` (NOPERM), and can neither delete nor overwrite the key of a lock
/// that `app` holds, which keeps its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_a_tenant_reaches_only_its_own_locks() {
    let app = timeout(STEP, distlock::connect(&as_user("redis", "app", "app-pw")))
        .await
        .unwrap()
        .unwrap();
    let tenant = timeout(
        STEP,
        distlock::connect(&as_user("redis", "tenant", "tenant-pw")),
    )
    .await
    .unwrap()
    .unwrap();
    let id = uuid::Uuid::new_v4().simple();

    let own = format!("tenant/report-{id}");
    let guard = timeout(STEP, tenant.mutex(own.as_str()).unwrap().acquire())
        .await
        .expect("the tenant's own lock took too long")
        .expect("the tenant could not take a lock under tenant/");
    timeout(STEP, guard.release()).await.unwrap().unwrap();

    let other = format!("stock/iphone-{id}");
    let held = timeout(STEP, app.mutex(other.as_str()).unwrap().acquire())
        .await
        .unwrap()
        .unwrap();
    let refused = timeout(STEP, tenant.mutex(other.as_str()).unwrap().try_acquire())
        .await
        .expect("the refused try took too long")
        .expect_err("the tenant was let at a lock outside tenant/");
    assert!(refused.is_not_authorized(), "{refused}");
    assert!(refused.to_string().contains("NOPERM"), "{refused}");
    let forced = timeout(STEP, tenant.force_unlock(&other))
        .await
        .unwrap()
        .expect_err("the tenant force-unlocked a lock outside tenant/");
    assert!(forced.is_not_authorized(), "{forced}");

    let mut raw_tenant = raw("tenant", "tenant-pw").await;
    // The key of a lock is `distlock:{ESCAPED NAME}:lock`, `/` escaped as `%2F`.
    let key = format!("distlock:{{{}}}:lock", other.replace('/', "%2F"));
    let deleted: redis::RedisResult<i64> = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut raw_tenant)
        .await;
    assert_eq!(
        deleted.map_err(|e| e.code().map(str::to_owned)),
        Err(Some("NOPERM".to_owned())),
        "the tenant deleted the holder's key"
    );
    let overwritten: redis::RedisResult<()> = redis::cmd("SET")
        .arg(&key)
        .arg("mine")
        .query_async(&mut raw_tenant)
        .await;
    assert!(
        overwritten.is_err(),
        "the tenant overwrote the holder's key"
    );

    assert!(!held.is_lost(), "the holder lost its lock");
    assert!(
        timeout(STEP, held.is_held()).await.unwrap().unwrap(),
        "the server no longer holds the app's lock"
    );
    timeout(STEP, held.release()).await.unwrap().unwrap();
}

/// docs/security.md quotes the users of `scripts/redis-acl.conf` that the tests run as, line
/// for line: the example a reader copies is the one tested.
#[test]
fn the_documented_acl_is_the_tested_one() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let read = |path: &str| {
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
    };
    let (acl, docs) = (read("scripts/redis-acl.conf"), read("docs/security.md"));
    for user in ["app", "tenant"] {
        let line = acl
            .lines()
            .find(|line| line.starts_with(&format!("user {user} ")))
            .unwrap_or_else(|| panic!("scripts/redis-acl.conf has no user {user}"));
        assert!(
            docs.lines().any(|quoted| quoted.trim() == line),
            "docs/security.md does not quote the tested user {user}:\n{line}"
        );
    }
}
