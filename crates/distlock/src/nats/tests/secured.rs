//! NATS's own logins and TLS, against servers that require them (each test starts its own):
//! a user and password over TLS, a client certificate, a token. A wrong secret is
//! `Error::NotAuthorized`, an untrusted server a backend error that names the options to
//! check, and no secret appears in an error, a `Debug` or a redacted URL.

use super::launch::{self, Servers};
use crate::Error;

const PASSWORD: &str = "app-pw-7f3a";
const TOKEN: &str = "tok-5e1d-9b";

/// Acquires and releases one lock through `url`: the login worked end to end.
async fn locks_work(url: &str) {
    let locks = crate::connect(url).await.unwrap_or_else(|e| panic!("{e}"));
    let name = format!("secured/{}", uuid::Uuid::new_v4().simple());
    let guard = locks.mutex(name.as_str()).unwrap().acquire().await.unwrap();
    assert!(guard.fencing_token() > 0);
    guard.release().await.unwrap();
    for secret in [PASSWORD, TOKEN] {
        assert!(!format!("{locks:?}").contains(secret), "{locks:?}");
    }
}

async fn refused(url: &str) -> Error {
    let err = crate::connect(url).await.expect_err("the login must be refused");
    for secret in [PASSWORD, TOKEN, "wrong-secret"] {
        assert!(!err.to_string().contains(secret), "{err}");
        assert!(!format!("{err:?}").contains(secret), "{err:?}");
    }
    err
}

fn tls_config(dir: &std::path::Path, verify_clients: bool) -> String {
    launch::certificates(dir);
    let verify = if verify_clients {
        format!(", ca_file: {:?}, verify: true", dir.join("ca.pem"))
    } else {
        String::new()
    };
    format!(
        "tls {{ cert_file: {:?}, key_file: {:?}{verify} }}",
        dir.join("server.pem"),
        dir.join("server-key.pem")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_over_tls_logs_in_and_wrong_secrets_or_an_untrusted_server_are_refused() {
    let servers = Servers::single(|dir| {
        format!(
            "{}\nauthorization {{ users = [ {{ user: app, password: {PASSWORD:?} }} ] }}",
            tls_config(dir, false)
        )
    });
    let ca = servers.path("ca.pem");
    let url = format!(
        "nats://app:{PASSWORD}@{}/secured?ca={}",
        servers.hosts(),
        ca.display()
    );
    locks_work(&url).await;
    assert!(!crate::redact_url(&url).contains(PASSWORD));

    let err = refused(&url.replace(PASSWORD, "wrong-secret")).await;
    assert!(err.is_not_authorized(), "{err}");
    let err = refused(&url.replace(&format!("app:{PASSWORD}@"), "")).await;
    assert!(err.is_not_authorized(), "without a login: {err}");

    // A CA that did not sign the server's certificate: the TLS error, with what to check.
    let other = url.replace("ca.pem", "other-ca.pem");
    let err = refused(&other).await;
    assert!(err.is_backend(), "{err}");
    assert!(err.to_string().contains("ca="), "{err}");
    // Without ca=, the system's roots do not know the test CA either.
    let err = refused(&url.replace(&format!("?ca={}", ca.display()), "?tls=true")).await;
    assert!(err.is_backend(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_verifies_clients_takes_the_client_certificate_of_cert_and_key() {
    let servers = Servers::single(|dir| tls_config(dir, true));
    let dir = servers.dir.path();
    launch::client_certificate(dir);
    let base = format!(
        "nats://{}/secured?ca={}",
        servers.hosts(),
        dir.join("ca.pem").display()
    );
    let with_identity = format!(
        "{base}&cert={}&key={}",
        dir.join("client.pem").display(),
        dir.join("client-key.pem").display()
    );
    locks_work(&with_identity).await;
    let err = refused(&base).await;
    assert!(err.is_backend(), "without a client certificate: {err}");
    let err = crate::connect(&format!("{base}&cert={}", dir.join("client.pem").display()))
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "cert= without key=: {err}");
    let err = crate::connect(&format!(
        "{base}&cert={}&key={}",
        dir.join("missing.pem").display(),
        dir.join("client-key.pem").display()
    ))
    .await
    .unwrap_err();
    assert!(
        err.is_invalid_input() && err.to_string().contains("cert="),
        "an unreadable cert=: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_logs_in_and_is_never_shown() {
    let servers = Servers::single(|_| format!("authorization {{ token: {TOKEN:?} }}"));
    let url = format!("nats://{}/tokens?token={TOKEN}", servers.hosts());
    locks_work(&url).await;
    assert!(!crate::redact_url(&url).contains(TOKEN), "{}", crate::redact_url(&url));

    let err = refused(&url.replace(TOKEN, "wrong-secret")).await;
    assert!(err.is_not_authorized(), "{err}");
    let err = refused(&format!("nats://{}/tokens", servers.hosts())).await;
    assert!(err.is_not_authorized(), "without the token: {err}");
    // A token written as user info would be shown by every tool that prints URLs: refused,
    // without quoting it.
    let err = refused(&format!("nats://{TOKEN}@{}/tokens", servers.hosts())).await;
    assert!(err.is_invalid_input(), "{err}");
}
