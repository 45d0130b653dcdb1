//! ZooKeeper with a digest identity (`zk://user:password@host/base`): the conformance suite as
//! an authenticated client, and the node ACLs that keep every other identity away from the
//! locks (security: lock state only its owners can change).

use std::time::Duration;

use distlock::conformance::{Target, servers};
use tokio::time::timeout;
use zookeeper_client as zkc;

/// How long one step may take on a loaded machine.
const STEP: Duration = Duration::from_secs(30);

/// The standalone server as `host:port`.
fn server() -> String {
    servers::first_address(&servers::ZOOKEEPER.url()).to_owned()
}

/// A `zk://` URL of the standalone server as `user:password`, on `base`.
fn as_user(user: &str, password: &str, base: &str) -> String {
    format!("zk://{user}:{password}@{}{base}", server())
}

/// A base path no other test run uses, under `/distlock-digest`, which is made open to every
/// identity first: each test's identity then makes its own base path under it.
async fn own_base() -> String {
    let open = zkc::CreateMode::Persistent.with_acls(zkc::Acls::anyone_all());
    raw(None)
        .await
        .mkdir("/distlock-digest", &open)
        .await
        .expect("make /distlock-digest");
    format!("/distlock-digest/{}/locks", uuid::Uuid::new_v4().simple())
}

distlock::conformance_suite!(
    zk_digest,
    Target::new(as_user(
        "distlock-suite",
        "suite-pw",
        "/distlock-digest-suite/locks"
    ))
);

/// A raw session of the standalone server, authenticated as `user:password` when given.
async fn raw(identity: Option<&str>) -> zkc::Client {
    let connector = zkc::Client::connector();
    let connector = match identity {
        Some(identity) => connector.with_auth("digest", identity.as_bytes()),
        None => connector,
    };
    timeout(STEP, connector.connect(&server()))
        .await
        .expect("the raw session did not connect in time")
        .expect("raw ZooKeeper session")
}

/// Security, and promise 1 against another identity: a holder's lock node, made under a base
/// path that a digest identity created, can be deleted neither by a session of another
/// identity nor by an unauthenticated one (ZooKeeper answers NoAuth); a distlock client with
/// another identity, or with the owner's user and a wrong password, is refused at connect
/// with `Error::NotAuthorized`, which names what to fix; the holder keeps its lock
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise1_another_identity_cannot_delete_a_holders_node() {
    let base = own_base().await;
    let owner = as_user("app", "app-pw", &base);
    let locks = timeout(STEP, distlock::connect(&owner))
        .await
        .unwrap()
        .unwrap();
    let name = format!("stock-{}", uuid::Uuid::new_v4().simple());
    let guard = timeout(STEP, locks.mutex(name.as_str()).unwrap().acquire())
        .await
        .expect("the grant took too long")
        .unwrap();
    let lock = format!("{base}/{name}");
    let mine = raw(Some("app:app-pw")).await;
    let children = mine.list_children(&lock).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let node = format!("{lock}/{}", children[0]);

    for (who, identity) in [
        ("another identity", Some("intruder:intruder-pw")),
        ("the owner's user with a wrong password", Some("app:wrong")),
        ("an unauthenticated session", None),
    ] {
        let other = raw(identity).await;
        assert_eq!(
            other.delete(&node, None).await,
            Err(zkc::Error::NoAuth),
            "{who} deleted the holder's node"
        );
        assert_eq!(
            other.delete(&lock, None).await,
            Err(zkc::Error::NoAuth),
            "{who} deleted the lock's node"
        );
        let create = zkc::CreateMode::EphemeralSequential.with_acls(zkc::Acls::anyone_all());
        assert_eq!(
            other
                .create(&format!("{lock}/_c_x-lock-"), b"", &create)
                .await
                .map(drop),
            Err(zkc::Error::NoAuth),
            "{who} queued for the lock"
        );
    }

    for (who, password) in [
        ("another identity", None),
        ("a wrong password", Some("wrong")),
    ] {
        let url = match password {
            Some(password) => as_user("app", password, &base),
            None => as_user("intruder", "intruder-pw", &base),
        };
        let err = timeout(STEP, distlock::connect(&url))
            .await
            .expect("the refused connect took too long")
            .err()
            .unwrap_or_else(|| panic!("{who} was let in"));
        assert!(err.is_not_authorized(), "{who}: {err}");
        let text = err.to_string();
        assert!(
            text.contains("user and password") || text.contains("zk://user:password@"),
            "{text}"
        );
        assert!(
            !text.contains("intruder-pw") && !text.contains("wrong"),
            "{text}"
        );
    }

    assert!(!guard.is_lost(), "the holder lost its lock");
    assert_eq!(mine.list_children(&lock).await.unwrap(), children);
    timeout(STEP, guard.release()).await.unwrap().unwrap();
}

/// Force-unlock needs the owner's identity: a second client of that identity frees the lock,
/// the holder's `lost()` fires, and another identity still cannot touch the next holder's
/// node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_by_the_owners_identity_frees_the_lock() {
    let base = own_base().await;
    let owner = as_user("ops", "ops-pw", &base);
    let holder = timeout(STEP, distlock::connect(&owner))
        .await
        .unwrap()
        .unwrap();
    let name = format!("job-{}", uuid::Uuid::new_v4().simple());
    let guard = timeout(STEP, holder.mutex(name.as_str()).unwrap().acquire())
        .await
        .unwrap()
        .unwrap();
    let operator = timeout(STEP, distlock::connect(&owner))
        .await
        .unwrap()
        .unwrap();
    assert!(
        timeout(STEP, operator.force_unlock(&name))
            .await
            .unwrap()
            .unwrap(),
        "the owner's identity could not force-unlock"
    );
    let lost = timeout(STEP, guard.lost())
        .await
        .expect("lost() did not fire after the force-unlock");
    assert!(lost.is_lock_lost(), "{lost}");
    let again = timeout(
        STEP,
        operator
            .mutex(name.as_str())
            .unwrap()
            .acquire_with(distlock::AcquireOptions::new().wait(STEP)),
    )
    .await
    .unwrap()
    .unwrap();
    let intruder = raw(Some("intruder:intruder-pw")).await;
    let lock = format!("{base}/{name}");
    let children = raw(Some("ops:ops-pw"))
        .await
        .list_children(&lock)
        .await
        .unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    assert_eq!(
        intruder
            .delete(&format!("{lock}/{}", children[0]), None)
            .await,
        Err(zkc::Error::NoAuth)
    );
    timeout(STEP, again.release()).await.unwrap().unwrap();
}

/// A session that ends (its connection cut for longer than its timeout) is replaced by one that
/// authenticates as the URL's identity again: it takes locks under the identity's base path,
/// and its nodes are the identity's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_authenticates_as_the_identity_again() {
    let base = own_base().await;
    let proxy = distlock::fault::FaultProxy::start(server().parse().unwrap())
        .await
        .expect("start a fault proxy");
    let url = format!(
        "zk://svc:svc-pw@{}{base}?session_timeout=2s",
        proxy.address()
    );
    let holder = timeout(STEP, distlock::connect(&url))
        .await
        .unwrap()
        .unwrap();
    let mut session = holder.session().expect("ZooKeeper has a session");
    let name = format!("renewed-{}", uuid::Uuid::new_v4().simple());
    let first = timeout(STEP, holder.mutex(name.as_str()).unwrap().acquire())
        .await
        .unwrap()
        .unwrap();
    proxy.partition();
    timeout(STEP, first.lost())
        .await
        .expect("lost() did not fire after the session was cut off");
    proxy.heal();
    timeout(
        STEP,
        session.wait_for(|s| s.state == distlock::SessionState::Connected && s.sessions_lost >= 1),
    )
    .await
    .expect("no new session after the cut healed")
    .unwrap();
    let again = timeout(
        STEP,
        holder
            .mutex(name.as_str())
            .unwrap()
            .acquire_with(distlock::AcquireOptions::new().wait(STEP)),
    )
    .await
    .expect("the new session's grant took too long")
    .expect("the new session could not lock under the identity's base path");
    assert!(again.fencing_token() > first.fencing_token());
    let lock = format!("{base}/{name}");
    let children = raw(Some("svc:svc-pw"))
        .await
        .list_children(&lock)
        .await
        .unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let (acl, _) = raw(Some("svc:svc-pw"))
        .await
        .get_acl(&format!("{lock}/{}", children[0]))
        .await
        .unwrap();
    assert!(
        acl.iter()
            .all(|entry| entry.scheme() == "digest" && entry.id().starts_with("svc:")),
        "the new session's node is not the identity's alone: {acl:?}"
    );
    timeout(STEP, again.release()).await.unwrap().unwrap();
}

/// A base path right under the open `/distlock-digest`, so that its parent lets any client
/// past `mkdir`: what refuses another identity there is the connect's own check.
async fn flat_base() -> String {
    let nested = own_base().await;
    nested.trim_end_matches("/locks").to_owned()
}

/// A base path that another identity made refuses a client at connect even where its parent
/// is open to all (another identity, or the owner's user with a wrong password:
/// `NotAuthorized`); a client without an identity connects there, as ZooKeeper lets it, and
/// is refused its first lock with `NotAuthorized`, not a hang; a base path open to every
/// client is refused to a client with an identity (`InvalidInput`), since its locks could
/// not be the identity's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_path_that_is_not_the_identitys_is_refused() {
    let base = flat_base().await;
    let owner = timeout(STEP, distlock::connect(&as_user("own", "own-pw", &base)))
        .await
        .unwrap()
        .unwrap();
    for (who, url) in [
        ("another identity", as_user("other", "other-pw", &base)),
        ("a wrong password", as_user("own", "wrong-pw", &base)),
    ] {
        let err = timeout(STEP, distlock::connect(&url))
            .await
            .unwrap_or_else(|_| panic!("{who}: the refused connect took too long"))
            .err()
            .unwrap_or_else(|| panic!("{who} was let in"));
        assert!(err.is_not_authorized(), "{who}: {err}");
    }
    let anonymous = timeout(STEP, distlock::connect(&format!("zk://{}{base}", server())))
        .await
        .unwrap()
        .expect("ZooKeeper lets a session without an identity past an existing base path");
    let name = format!("n-{}", uuid::Uuid::new_v4().simple());
    let err = timeout(STEP, anonymous.mutex(name.as_str()).unwrap().try_acquire())
        .await
        .expect("the refused try took too long")
        .expect_err("a client without an identity locked under the identity's base path");
    assert!(err.is_not_authorized(), "{err}");
    drop(owner);

    let open = flat_base().await;
    let made = timeout(STEP, distlock::connect(&format!("zk://{}{open}", server())))
        .await
        .unwrap()
        .unwrap();
    let err = timeout(STEP, distlock::connect(&as_user("own", "own-pw", &open)))
        .await
        .unwrap()
        .expect_err("an open base path was taken with an identity");
    assert!(err.is_invalid_input(), "{err}");
    assert!(err.to_string().contains("world:anyone"), "{err}");
    drop(made);
}
