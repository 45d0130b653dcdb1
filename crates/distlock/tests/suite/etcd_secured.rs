//! etcd that takes only TLS with a client certificate and has authentication on
//! (`scripts/etcd-deployment secured`, started by `scripts/test`): the conformance suite as the
//! user `app` over verified TLS; what a client that gets the password, the CA or the client
//! certificate wrong is told; the roles that keep another user away from the locks (security:
//! lock state only its owners can change); and tokens the server stops taking (its simple
//! tokens last 3 s unused).

use std::process::Command;
use std::time::Duration;

use distlock::conformance::{Target, servers};
use tokio::time::timeout;

use crate::common::with_option;

/// How long one step may take on a loaded machine.
const STEP: Duration = Duration::from_secs(30);

fn secured() -> String {
    servers::ETCD_SECURED.url()
}

distlock::conformance_suite!(etcd_secured, Target::new(secured()));

/// `url` with its user info replaced by `user_info` (none when empty).
fn as_user(url: &str, user_info: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    match user_info {
        "" => format!("{scheme}://{rest}"),
        _ => format!("{scheme}://{user_info}@{rest}"),
    }
}

/// The value of `url`'s option `key`.
fn option(url: &str, key: &str) -> String {
    let (_, query) = url.split_once('?').expect("a query");
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("the secured URL has no {key}="))
        .to_owned()
}

async fn connect(url: &str) -> distlock::Locks {
    timeout(STEP, distlock::connect(url))
        .await
        .expect("the connect took too long")
        .unwrap_or_else(|e| panic!("{}: {e}", distlock::redact_url(url)))
}

/// The error of connecting to `url` and taking a lock, which must fail within a step.
async fn refused(url: &str) -> distlock::Error {
    let url = servers::with_query(url, "connect_timeout=10s");
    let attempt = async {
        let locks = distlock::connect(&url).await?;
        let name = format!("refused-{}", uuid::Uuid::new_v4().simple());
        locks.mutex(name.as_str())?.try_acquire().await.map(drop)
    };
    timeout(STEP, attempt)
        .await
        .expect("the refused request took too long")
        .err()
        .unwrap_or_else(|| panic!("{} was let in", distlock::redact_url(&url)))
}

/// The error and its causes, as one text.
fn described(err: &distlock::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// A wrong password and an unknown user are `Error::NotAuthorized`, saying the cluster refused
/// them; a CA that did not sign the server's certificate, and no client certificate, are
/// refused as TLS failures that name the options to fix; plain text to a TLS port fails
/// with advice to add `tls=true`. No message holds a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_an_untrusted_ca_or_no_client_certificate_is_refused() {
    let url = secured();
    for user_info in ["app:not-the-pw", "nobody:not-the-pw"] {
        let err = refused(&as_user(&url, user_info)).await;
        assert!(err.is_not_authorized(), "{user_info}: {err}");
        let text = described(&err);
        assert!(text.contains("refused the user or the password"), "{text}");
        assert!(!text.contains("not-the-pw"), "{text}");
    }

    let other_ca = option(&url, "ca").replace("/ca.pem", "/other-ca.pem");
    let untrusted = with_option(&url, "ca", &format!("ca={other_ca}"));
    let text = described(&refused(&untrusted).await);
    assert!(
        text.contains("UnknownIssuer") || text.contains("invalid peer certificate"),
        "not refused as an untrusted certificate: {text}"
    );
    assert!(
        text.contains("ca="),
        "the error names no option to fix: {text}"
    );

    let no_identity = with_option(&with_option(&url, "cert", ""), "key", "");
    let err = refused(&no_identity).await;
    assert!(!err.is_not_authorized(), "{err}");
    let text = described(&err);
    assert!(
        text.contains("cert= and key="),
        "the error names no option to fix: {text}"
    );

    let plain = with_option(
        &with_option(&with_option(&url, "cert", ""), "key", ""),
        "ca",
        "",
    );
    let err = refused(&plain).await;
    let text = described(&err);
    assert!(
        text.contains("tls=true"),
        "the error names no option to fix: {text}"
    );
    for err in [err, refused(&no_identity).await, refused(&untrusted).await] {
        let text = described(&err);
        assert!(!text.contains("app-pw"), "{text}");
    }
}

/// Security, and promise 1 against another user: the user `tenant`, whose role grants only
/// `tenant/`, can neither queue for nor force-unlock a lock that `app` holds under
/// `distlock/` (the cluster answers permission denied, an `Error::NotAuthorized` naming the
/// role to grant), nor delete the holder's key with `etcdctl`; the holder keeps its lock,
/// and `tenant` takes locks under its own prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_another_user_cannot_touch_the_locks_of_a_prefix_it_is_not_granted() {
    let url = secured();
    let app = connect(&url).await;
    let name = format!("order-{}", uuid::Uuid::new_v4().simple());
    let guard = timeout(STEP, app.mutex(name.as_str()).unwrap().acquire())
        .await
        .expect("the grant took too long")
        .unwrap();

    let intruder_url = as_user(&url, "tenant:tenant-pw");
    let intruder = connect(&intruder_url).await;
    let queued = timeout(STEP, intruder.mutex(name.as_str()).unwrap().try_acquire())
        .await
        .expect("the refused try took too long")
        .expect_err("tenant was let into app's prefix");
    assert!(queued.is_not_authorized(), "{queued}");
    assert!(described(&queued).contains("grant-permission"), "{queued}");
    let forced = timeout(STEP, intruder.force_unlock(&name))
        .await
        .expect("the refused force-unlock took too long")
        .expect_err("tenant force-unlocked app's lock");
    assert!(forced.is_not_authorized(), "{forced}");

    let prefix = format!("distlock/{name}/");
    let deleted = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints=https://".to_owned() + servers::first_address(&url),
            format!("--cacert={}", option(&url, "ca")),
            format!("--cert={}", option(&url, "cert")),
            format!("--key={}", option(&url, "key")),
            "--user=tenant:tenant-pw".to_owned(),
            "--command-timeout=10s".to_owned(),
            "del".to_owned(),
            "--prefix".to_owned(),
            prefix,
        ])
        .output()
        .expect("run etcdctl");
    assert!(
        !deleted.status.success(),
        "etcdctl as tenant deleted app's key: {}",
        String::from_utf8_lossy(&deleted.stdout)
    );
    assert!(
        String::from_utf8_lossy(&deleted.stderr).contains("permission denied"),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );

    let rival = connect(&url).await;
    let rival_try = timeout(STEP, rival.mutex(name.as_str()).unwrap().try_acquire())
        .await
        .unwrap()
        .unwrap();
    assert!(rival_try.is_none(), "a second holder while app holds it");
    assert!(!guard.is_lost(), "the holder lost its lock");
    timeout(STEP, guard.release()).await.unwrap().unwrap();

    let own = connect(&with_prefix(&intruder_url, "tenant/")).await;
    let mine = timeout(STEP, own.mutex(name.as_str()).unwrap().acquire())
        .await
        .unwrap()
        .expect("tenant under its own prefix");
    timeout(STEP, mine.release()).await.unwrap().unwrap();
}

/// `url` with its key prefix replaced by `prefix`.
fn with_prefix(url: &str, prefix: &str) -> String {
    let (authority, query) = url.split_once('?').unwrap_or((url, ""));
    let (scheme, rest) = authority.split_once("://").expect("a URL");
    let hosts = rest.split_once('/').map_or(rest, |(hosts, _)| hosts);
    format!("{scheme}://{hosts}/{prefix}?{query}")
}

/// A client certificate alone authenticates as the user of its common name (`app`): no
/// password in the URL, the same locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_alone_is_the_user_of_its_common_name() {
    let by_password = connect(&secured()).await;
    let by_certificate = connect(&as_user(&secured(), "")).await;
    let name = format!("cert-{}", uuid::Uuid::new_v4().simple());
    let guard = timeout(STEP, by_certificate.mutex(name.as_str()).unwrap().acquire())
        .await
        .unwrap()
        .unwrap();
    let other = timeout(
        STEP,
        by_password.mutex(name.as_str()).unwrap().try_acquire(),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(other.is_none(), "two holders of one lock");
    timeout(STEP, guard.release()).await.unwrap().unwrap();
}

/// Promises 1 and 2 across tokens the server stops taking: a client idle for longer than the
/// server's token TTL takes a new token and its next grant succeeds; a lock held across
/// several TTLs stays held (its lease renewed, `lost()` silent), excludes a rival, and is
/// released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise2_a_token_the_server_stops_taking_is_replaced_without_losing_a_lock() {
    let locks = connect(&secured()).await;
    let name = format!("token-{}", uuid::Uuid::new_v4().simple());
    let mutex = locks.mutex(name.as_str()).unwrap();
    let first = timeout(STEP, mutex.acquire()).await.unwrap().unwrap();
    let first_token = first.fencing_token();
    timeout(STEP, first.release()).await.unwrap().unwrap();
    // The server's simple tokens last 3 s unused.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let held = timeout(STEP, mutex.acquire())
        .await
        .expect("the grant after the token expired took too long")
        .expect("the grant after the token expired");
    assert!(held.fencing_token() > first_token, "promise 3: tokens grow");
    let rival = connect(&secured()).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        !held.is_lost(),
        "the lock was lost while its tokens expired"
    );
    let rival_try = timeout(STEP, rival.mutex(name.as_str()).unwrap().try_acquire())
        .await
        .unwrap()
        .expect("the rival's try after its token expired");
    assert!(rival_try.is_none(), "a second holder while the first holds");
    timeout(STEP, held.release()).await.unwrap().unwrap();
}

/// User info given to a cluster with authentication off (the open standalone server) is
/// refused with `Error::NotAuthorized`, which says that anyone could change the locks there:
/// a missing `etcdctl auth enable` does not pass unnoticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_for_a_cluster_with_authentication_off_is_refused() {
    let open = as_user(&servers::ETCD.url(), "app:app-pw");
    let err = refused(&open).await;
    assert!(err.is_not_authorized(), "{err}");
    let text = described(&err);
    assert!(text.contains("authentication off"), "{text}");
    assert!(!text.contains("app-pw"), "{text}");
}
