//! PostgreSQL that takes only TLS connections with a password (`scripts/postgres-deployment
//! secured`, started by `scripts/test`): the conformance suite over `sslmode=verify-full`
//! with the server's CA, in both lock modes; and what a client that gets the password, the
//! TLS or the certificate wrong is told.

use std::time::Duration;

use distlock::conformance::{Target, servers};
use tokio::time::timeout;

use crate::common::with_option;

/// How long one step may take on a loaded machine.
const STEP: Duration = Duration::from_secs(30);

fn secured() -> String {
    servers::POSTGRES_SECURED.url()
}

distlock::conformance_suite!(postgres_secured_advisory, Target::new(secured()));
distlock::conformance_suite!(
    postgres_secured_table,
    Target::new(servers::with_query(&secured(), "mode=table"))
);

/// The error of connecting to `url`, which must fail within a step.
async fn refused(url: &str) -> distlock::Error {
    let url = servers::with_query(url, "connect_timeout=10s");
    timeout(STEP, distlock::connect(&url))
        .await
        .expect("the refused connect took too long")
        .err()
        .unwrap_or_else(|| panic!("{} was let in", distlock::redact_url(&url)))
}

/// A wrong password and a connection without TLS are `Error::NotAuthorized`, saying which
/// (28P01, or pg_hba's "no encryption"); a server certificate that the URL's CA did not sign
/// (no `sslrootcert`, so the system's roots) is refused as untrusted. No message holds the
/// password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_no_tls_or_an_untrusted_certificate_is_refused() {
    let url = secured();
    let wrong = url.replacen(":app-pw@", ":not-the-pw@", 1);
    assert_ne!(wrong, url, "the secured URL has no app-pw password");
    let err = refused(&wrong).await;
    assert!(err.is_not_authorized(), "{err}");
    assert!(err.to_string().contains("28P01"), "{err}");

    let plain = with_option(&url, "sslmode", "sslmode=disable");
    let err = refused(&plain).await;
    assert!(err.is_not_authorized(), "{err}");
    assert!(err.to_string().contains("no encryption"), "{err}");

    let untrusted = with_option(
        &with_option(&url, "sslrootcert", ""),
        "sslmode",
        "sslmode=verify-full",
    );
    let err = refused(&untrusted).await;
    let text = format!("{err} {:?}", std::error::Error::source(&err));
    assert!(
        text.contains("certificate") || text.contains("UnknownIssuer"),
        "not refused as an untrusted certificate: {text}"
    );
    for err in [refused(&wrong).await, refused(&plain).await] {
        assert!(
            !err.to_string().contains("not-the-pw") && !err.to_string().contains("app-pw"),
            "{err}"
        );
    }
}
