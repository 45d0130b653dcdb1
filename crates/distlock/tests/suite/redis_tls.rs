//! Redis over TLS (the suite's TLS-only server, trusted through a CA of its own): a
//! certificate the client does not trust, and plain text to the TLS port, each fail the
//! connect with an error that says what to check; the conformance suite over TLS is in
//! `conformance::redis_tls`.

use std::time::Duration;

use distlock::conformance::servers;
use tokio::time::timeout;

/// How long one refused connect may take on a loaded machine.
const STEP: Duration = Duration::from_secs(30);

/// The text of the error connecting to `url` gives, which must be a refusal.
async fn refused(url: &str) -> String {
    let err = timeout(STEP, distlock::connect(url))
        .await
        .unwrap_or_else(|_| panic!("{url}: the refused connect took too long"))
        .err()
        .unwrap_or_else(|| panic!("{url} was let in"));
    assert!(err.is_backend(), "{url}: {err}");
    err.to_string()
}

/// Security: without the server's CA (the system's roots do not hold it), and with another
/// CA (the Redlock TLS masters'), the server's certificate is refused as untrusted, naming
/// `ca=`; a `redis://` URL to the TLS port is told to write `rediss://`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_or_plain_text_is_refused_saying_what_to_check() {
    let url = servers::REDIS_TLS.url();
    let address = servers::first_address(&url).to_owned();
    let other_ca = servers::REDLOCK_TLS
        .configured_url()
        .split("ca=")
        .nth(1)
        .map(str::to_owned)
        .expect("the Redlock TLS masters' URL names their CA");
    for (what, url) in [
        ("the system's roots", format!("rediss://{address}/")),
        ("another CA", format!("rediss://{address}/?ca={other_ca}")),
    ] {
        let text = refused(&url).await;
        assert!(
            text.contains("certificate") && text.contains("ca="),
            "{what}: not refused as an untrusted certificate naming ca=: {text}"
        );
    }
    let text = refused(&format!("redis://{address}/")).await;
    assert!(
        text.contains("rediss://"),
        "plain text to the TLS port is not told to use rediss://: {text}"
    );
}
