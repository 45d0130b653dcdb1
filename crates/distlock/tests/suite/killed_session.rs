//! The killed-connection cases of the session locks (PostgreSQL advisory, MySQL named), which
//! each server's module runs with its own way of killing the connection that holds a lock,
//! as an administrator would.

use std::future::Future;
use std::time::Duration;

/// A session lock lives in its connection: when an administrator kills the connection that
/// holds `prefix/<id>` (`kill(url, name)`), the server frees the lock at once, another client
/// gets it with a larger token, and the holder's guard reports the loss at its next check.
pub(crate) async fn frees_the_lock_and_fires_lost<F: Future<Output = ()>>(
    url: &str,
    prefix: &str,
    kill: impl Fn(String, String) -> F,
) {
    let holder = distlock::connect_with(
        url,
        distlock::ConnectOptions::new().lease(Duration::from_millis(600)),
    )
    .await
    .unwrap();
    let name = format!("{prefix}/{}", uuid::Uuid::new_v4().simple());
    let guard = crate::common::hold(&holder, name.as_str()).await;
    let rival = distlock::connect(url).await.unwrap();
    let refused = rival.mutex(name.as_str()).unwrap().try_acquire().await;
    assert!(refused.unwrap().is_none(), "the lock was granted twice");

    kill(url.to_owned(), name.clone()).await;

    let granted = rival
        .mutex(name.as_str())
        .unwrap()
        .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(5)))
        .await
        .expect("the lock of the killed connection was not freed");
    assert!(granted.fencing_token() > guard.fencing_token());
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost() did not fire after the connection was killed");
    assert!(lost.is_lock_lost());
    granted.release().await.unwrap();
}

/// Promise 2 (as far as a session lock allows: the server frees it the moment its connection
/// dies): when the lock connection is killed, every lock it held fires `lost()` within a
/// second or two, fixed-lease and renewed alike, and another owner of the same client gets
/// the lock at once instead of waiting for the stale entry's lease.
pub(crate) async fn promise2_fires_lost_for_every_lease<F: Future<Output = ()>>(
    url: &str,
    prefix: &str,
    kill: impl Fn(String, String) -> F,
) {
    let holder = distlock::connect(url).await.unwrap();
    let id = uuid::Uuid::new_v4().simple();
    let (fixed_name, renewed_name) = (
        format!("{prefix}/{id}/fixed"),
        format!("{prefix}/{id}/renewed"),
    );
    let fixed = holder
        .mutex(fixed_name.as_str())
        .unwrap()
        .acquire_with(distlock::AcquireOptions::new().lease(Duration::from_secs(120)))
        .await
        .unwrap();
    let renewed = crate::common::hold(&holder, renewed_name.as_str()).await;

    kill(url.to_owned(), fixed_name.clone()).await;

    for (what, guard) in [("fixed-lease", &fixed), ("renewed", &renewed)] {
        let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .unwrap_or_else(|_| {
                panic!("the {what} lock's lost() did not fire after its connection was killed")
            });
        assert!(lost.is_lock_lost());
    }
    // Another owner of the same client is not held up by what the killed connection held.
    let again = holder
        .mutex(fixed_name.as_str())
        .unwrap()
        .acquire_with(distlock::AcquireOptions::new().wait(Duration::from_secs(3)))
        .await
        .expect("the same client could not take the lock its killed connection held");
    assert!(again.fencing_token() > fixed.fencing_token());
    again.release().await.unwrap();
}
