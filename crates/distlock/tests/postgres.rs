//! The PostgreSQL backend on the real server `scripts/test` makes sure of: the conformance
//! suite on the table-record lock.

use distlock::conformance::Target;

/// The database the tests use: `DISTLOCK_POSTGRES_URL`, or the local default. Fails, never
/// skips, when the server does not answer.
fn table() -> Target {
    let url = std::env::var("DISTLOCK_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres:postgres@127.0.0.1:5432/test".into());
    let address = url
        .split_once('@')
        .map_or("", |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap_or_default()
        .to_owned();
    if std::net::TcpStream::connect(&address).is_err() {
        panic!("PostgreSQL is not reachable at {address} ({url}); start it with scripts/test");
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    Target::new(format!("{url}{separator}mode=table"))
}

distlock::conformance_suite!(postgres_table, table());

#[tokio::test]
async fn the_advisory_mode_is_refused_with_a_reason() {
    let url = table().url().replace("mode=table", "mode=advisory");
    let err = distlock::connect(&url).await.unwrap_err();
    assert!(err.is_unsupported(), "{err}");
    assert!(err.to_string().contains("mode=table"), "{err}");
}
