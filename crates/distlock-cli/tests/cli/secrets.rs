//! No secret in any output: a password or secret option of a backend URL never appears on
//! stdout or stderr, whatever fails (a refused connection, a parse error, masters out of
//! reach, a server or sentinel that refuses the secret), in text or `--json`; the URL is
//! shown with `***` in its place.

use std::time::{Duration, Instant};

use super::*;

const SECRET: &str = "s3cretpw";

/// Runs `distlock args`, failing the test if it takes over a minute (it is killed then).
fn distlock(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the distlock binary");
    let start = Instant::now();
    while child.try_wait().expect("wait for distlock").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{args:?} ran for over a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("distlock's output")
}

/// A URL of every networked scheme, each with the secret where its users put it (the user
/// info's password, a secret query option), naming servers that are not there or forms that
/// do not parse.
fn secret_urls() -> Vec<String> {
    [
        "redis://:{s}@127.0.0.1:1/",
        "rediss://app:{s}@127.0.0.1:1/",
        "redis+spin://:{s}@127.0.0.1:1/",
        "redis+sentinel://:{s}@127.0.0.1:1/mymaster",
        "redis+cluster://:{s}@127.0.0.1:1/",
        "redlock://:{s}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/",
        "zk://user:{s}@127.0.0.1:1/base",
        "zk+naive://user:{s}@127.0.0.1:0/base",
        "postgres://app:{s}@127.0.0.1:1/db",
        "postgresql://127.0.0.1:1/db?password={s}",
        "mysql://app:{s}@127.0.0.1:1/db",
        "mariadb://app:{s}@127.0.0.1:1/db?ssl-mode=bogus",
        "etcd://user:{s}@127.0.0.1:1/",
        "etcd://user:{s}@127.0.0.1/",
        "etcd://127.0.0.1:1/?password={s}",
        "sqlite:///no/such/dir/x.db?password={s}",
        "nosuchscheme://user:{s}@127.0.0.1:1/",
        "redis+sentinel://127.0.0.1:1/mymaster?sentinel_password={s}",
        // Secrets written with the characters URLs reserve, unescaped.
        "redis+sentinel://127.0.0.1:1/mymaster?sentinel_password=ab&{s}",
        "redis+sentinel://127.0.0.1:1/mymaster?sentinel_password=ab#{s}",
        "redis+sentinel://app:ab/{s}@127.0.0.1:1/mymaster",
        "redis+cluster://app:ab/{s}@127.0.0.1:1/",
        "redis://app:ab/{s}@127.0.0.1:1/",
        "postgres://127.0.0.1:1/db?password=ab&{s}",
    ]
    .iter()
    .map(|url| url.replace("{s}", SECRET))
    .chain(refused_urls())
    .collect()
}

/// URLs of the suite's password-protected Redis servers whose secret they refuse: the failure
/// path of a refused login (a standalone server's, a sentinel's, a Cluster node's).
fn refused_urls() -> Vec<String> {
    use distlock::conformance::servers;
    let address = |server: &servers::Server| servers::first_address(&server.url()).to_owned();
    vec![
        format!("redis://app:{SECRET}@{}/", address(&servers::REDIS_ACL)),
        format!(
            "redis+sentinel://app:app-pw@{}/distlock?sentinel_password={SECRET}",
            address(&servers::REDIS_SENTINEL_ACL)
        ),
        format!(
            "redis+sentinel://app:{SECRET}@{}/distlock?sentinel_password=sentinel-pw",
            address(&servers::REDIS_SENTINEL_ACL)
        ),
        format!(
            "redis+cluster://app:{SECRET}@{}/",
            address(&servers::REDIS_CLUSTER_ACL)
        ),
    ]
}

fn assert_no_secret(what: &str, output: &Output) {
    for (stream, text) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
        let text = String::from_utf8_lossy(text);
        assert!(
            !text.contains(SECRET),
            "{what}: the secret is on {stream}:\n{text}"
        );
    }
}

/// `status` and `list`, in text and JSON, with every URL: each fails (no server, or a bad
/// URL) and says so, and the secret is nowhere in what it printed.
#[test]
fn no_secret_is_printed_when_a_command_fails() {
    for url in secret_urls() {
        let separator = if url.contains('?') { '&' } else { '?' };
        let quick = format!("{url}{separator}connect_timeout=2");
        for args in [
            vec!["status", "--backend", &quick, "a-lock"],
            vec!["status", "--json", "--backend", &quick, "a-lock"],
            vec!["list", "--backend", &quick],
        ] {
            let output = distlock(&args);
            assert!(!output.status.success(), "{args:?} succeeded");
            assert!(!output.stderr.is_empty(), "{args:?} failed without a word");
            assert_no_secret(&format!("{args:?}"), &output);
        }
    }
}

/// The masked URL still names what was meant: an error about a bad URL quotes it with `***`
/// for the password and the rest as written.
#[test]
fn a_bad_url_is_quoted_masked() {
    let output = distlock(&[
        "status",
        "--backend",
        &format!("etcd://user:{SECRET}@127.0.0.1:1/?watch=later"),
        "x",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("etcd://user:***@127.0.0.1:1/?watch=later"),
        "the URL is not quoted masked: {stderr}"
    );
}

/// `check`, `bench` (text and `--json`) and the demo, each with a secret-bearing URL of a
/// server that is not there, and of servers that refuse the secret: each fails, and the
/// secret is nowhere in what it printed.
#[test]
fn no_secret_is_printed_by_check_bench_or_demo() {
    let refused = refused_urls();
    let urls = [
        format!("redis://:{SECRET}@127.0.0.1:1/?connect_timeout=2"),
        format!("redlock://:{SECRET}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/?connect_timeout=2"),
        format!("postgres://app:{SECRET}@127.0.0.1:1/db?connect_timeout=2"),
        format!("etcd://127.0.0.1:1/?password={SECRET}"),
        refused[0].clone(),
        refused[1].clone(),
    ];
    for url in &urls {
        for args in [
            vec!["check", "--backend", url, "--duration-s", "2"],
            vec![
                "check",
                "--json",
                "--backend",
                url,
                "--duration-s",
                "2",
                "--faults",
                "cut",
            ],
            vec!["bench", "--backend", url],
            vec!["bench", "--json", "--backend", url],
        ] {
            let output = distlock(&args);
            assert!(!output.status.success(), "{args:?} succeeded");
            assert_no_secret(&format!("{args:?}"), &output);
        }
    }
    let demo = distlock(&[
        "demo",
        "--strategy",
        "redis",
        "--orders",
        "4",
        "--redis",
        &urls[0],
    ]);
    let stdout = String::from_utf8_lossy(&demo.stdout);
    assert!(
        stdout.contains("unavailable"),
        "the demo did not report the server missing: {stdout}"
    );
    assert_no_secret("demo --redis", &demo);
}
