//! URLs as distlock shows them (in errors, log lines and reports): the password of every
//! host's user info and the value of every query key that names a secret replaced by `***`,
//! everything else as written.

use std::fmt;

/// What stands for a secret.
const MASK: &str = "***";

/// Parts of query keys that name a secret (compared without case).
const SECRET_KEYS: &[&str] = &[
    "password",
    "passwd",
    "pwd",
    "token",
    "secret",
    "apikey",
    "api_key",
    "credential",
];

/// `url` with its secrets replaced by `***`: the password of each host's user info
/// (`user:***@host`, `:***@host`, for every host of a list) and the value of every query key
/// that names a secret (`password=***`, `auth_token=***`, `options[sslpassword]=***`, keys
/// percent-encoded or not). The scheme, user names, hosts, ports, path and every other query
/// value stay as written, so that the URL still says which server and which options were
/// meant. Text that is not a URL (no `://`) is shown up to its first `:`, then `***` up to
/// its last `@` if it has one, and its `key=value` words with secret values masked.
///
/// The user info ends at the last `@` that a host follows (text without `=` or `&` up to
/// the next `/`, `?` or `#`) and that no query (`?` then `key=`) comes before, so a raw `/`,
/// `?` or `@` in a password is masked with it. A secret query value runs on over a raw `&`
/// that no `key=` follows and over a raw `#`, which are masked with it. A raw `,` splits the
/// user info as it splits the host list, a raw `?` with a `=` after it starts the query, and
/// a raw `&` with `key=` after it starts another option: those must be percent-encoded, as
/// URL syntax asks anyway.
///
/// ```
/// assert_eq!(
///     distlock::redact_url("redis://app:s3cret@cache:6379/0?password=x&fair=true"),
///     "redis://app:***@cache:6379/0?password=***&fair=true",
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redact_text(url);
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    out.push_str("://");
    // The hosts end at the first `/`, `?` or `#` after the user info, if there is one.
    let hosts_from = user_info_end(rest).map_or(0, |at| at + 1);
    let hosts_end = rest[hosts_from..]
        .find(['/', '?', '#'])
        .map_or(rest.len(), |end| hosts_from + end);
    let hosts: Vec<String> = rest[..hosts_end].split(',').map(mask_user_info).collect();
    out.push_str(&hosts.join(","));
    let tail = &rest[hosts_end..];
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    out.push_str(path);
    if let Some(query) = query {
        out.push('?');
        let (query, fragment) = match query.split_once('#') {
            Some((query, fragment)) => (query, Some(fragment)),
            None => (query, None),
        };
        // A secret's value runs on over a raw `&` that no `key=` follows, and over a `#`: a
        // password written with them unescaped is masked whole.
        let mut pairs: Vec<String> = Vec::new();
        let mut in_secret = false;
        for pair in query.split('&') {
            if in_secret && !pair.contains('=') {
                continue;
            }
            in_secret = pair
                .split_once('=')
                .is_some_and(|(key, _)| names_a_secret(key));
            pairs.push(mask_pair(pair));
        }
        out.push_str(&pairs.join("&"));
        if let Some(fragment) = fragment.filter(|_| !in_secret) {
            out.push('#');
            out.push_str(fragment);
        }
    }
    out
}

/// The index in `rest` (a URL after `://`) of the `@` that ends the user info: the last one
/// that a host follows and that no query (`?` then `key=`) comes before.
pub(crate) fn user_info_end(rest: &str) -> Option<usize> {
    rest.match_indices('@').map(|(at, _)| at).rev().find(|&at| {
        let (before, after) = (&rest[..at], &rest[at + 1..]);
        let host = after.split(['/', '?', '#']).next().unwrap_or_default();
        let in_query = before
            .split_once('?')
            .is_some_and(|(_, query)| query.contains('='));
        !host.contains(['=', '&']) && !in_query
    })
}

/// Text that is not a URL: up to its first `:` as written, then `***` up to its last `@`,
/// and every `key=value` word with a secret key masked.
fn redact_text(text: &str) -> String {
    let text = match (text.split_once(':'), text.rfind('@')) {
        (Some((head, _)), Some(at)) if head.len() < at => {
            format!("{head}:{MASK}{}", &text[at..])
        }
        _ => text.to_owned(),
    };
    text.split(' ').map(mask_pair).collect::<Vec<_>>().join(" ")
}

/// `user:password@host` as `user:***@host`; a host without a password as written.
fn mask_user_info(host: &str) -> String {
    match host.rsplit_once('@') {
        Some((user_info, address)) => match user_info.split_once(':') {
            Some((user, _)) => format!("{user}:{MASK}@{address}"),
            None => host.to_owned(),
        },
        None => host.to_owned(),
    }
}

/// `key=value` with the value masked when the key names a secret.
fn mask_pair(pair: &str) -> String {
    match pair.split_once('=') {
        Some((key, _)) if names_a_secret(key) => format!("{key}={MASK}"),
        _ => pair.to_owned(),
    }
}

/// True when `key` (percent-encoded or not) names a secret.
pub(crate) fn names_a_secret(key: &str) -> bool {
    let key = crate::percent::decoded(key).to_ascii_lowercase();
    SECRET_KEYS.iter().any(|secret| key.contains(secret))
}

/// A piece of `url` (a host, a port, a path) to name in an error: quoted when the URL has no
/// user info, else `instead` (a password written raw, with a `/` in it, may have been cut
/// into that piece).
#[cfg_attr(not(feature = "all-backends"), allow(dead_code))]
pub(crate) fn piece(url: &str, piece: &str, instead: impl FnOnce() -> String) -> String {
    if url.contains('@') {
        instead()
    } else {
        format!("{piece:?}")
    }
}

/// A URL to show: writes it as [`redact_url`] does; `{:?}` quotes it.
pub(crate) struct Shown(String);

/// `url`, to show in an error or a log line.
pub(crate) fn shown(url: &str) -> Shown {
    Shown(redact_url(url))
}

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scheme's forms: the secrets go, the rest stays as written.
    #[test]
    fn passwords_and_secret_values_are_masked_and_the_rest_kept() {
        for (url, shown) in [
            ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
            ("rediss://user:pw@h/", "rediss://user:***@h/"),
            ("redis://user@h/", "redis://user@h/"),
            (
                "redlock://:pw@a:1,b:2,c:3/?fair=false",
                "redlock://:***@a:1,b:2,c:3/?fair=false",
            ),
            (
                "redlock://:p1@a:1,:p2@b:2,u:p3@c:3/",
                "redlock://:***@a:1,:***@b:2,u:***@c:3/",
            ),
            (
                "redis+sentinel://:pw@s1:26379,s2:26379/mymaster?sentinel_password=x",
                "redis+sentinel://:***@s1:26379,s2:26379/mymaster?sentinel_password=***",
            ),
            (
                "postgres://app:s3cret@db:5432/test?sslmode=verify-full&options[sslpassword]=k",
                "postgres://app:***@db:5432/test?sslmode=verify-full&options[sslpassword]=***",
            ),
            ("mysql://root:@db/test", "mysql://root:***@db/test"),
            (
                "etcd://user:pw@e1:2379,e2:2379/p/",
                "etcd://user:***@e1:2379,e2:2379/p/",
            ),
            (
                "zk://z1:2181/base?auth_token=t#x",
                "zk://z1:2181/base?auth_token=***",
            ),
            (
                "sqlite:///tmp/x.db?busy_timeout_ms=5",
                "sqlite:///tmp/x.db?busy_timeout_ms=5",
            ),
            ("memory://", "memory://"),
            ("redis://:pa/ss@h/0", "redis://:***@h/0"),
            ("redis://:pa?ss@h:1/", "redis://:***@h:1/"),
            ("zk://u:pa/ss@h/base", "zk://u:***@h/base"),
            ("redis://:p#w@h/", "redis://:***@h/"),
            (
                "postgres://h/db?pass%77ord=pw&x=1",
                "postgres://h/db?pass%77ord=***&x=1",
            ),
            ("redis://h/?PASSWORD=pw", "redis://h/?PASSWORD=***"),
            ("postgres:/app:pw@db/x", "postgres:***@db/x"),
            ("redis//:pw@h", "redis//:***@h"),
            ("host=db password=pw user=u", "host=db password=*** user=u"),
            ("not a url", "not a url"),
            ("redis://h/?password", "redis://h/?password"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    /// Redaction keeps every other part intact: for random hosts, ports, paths and options
    /// around a random password, the masked URL is the URL written with `***` for it.
    #[test]
    fn redaction_keeps_every_other_part() {
        let word = |rng: &mut fastrand::Rng, len: usize| -> String {
            (0..len)
                .map(|_| rng.alphanumeric())
                .collect::<String>()
                .to_lowercase()
        };
        let mut rng = fastrand::Rng::with_seed(36);
        for _ in 0..2_000 {
            let user = if rng.bool() {
                word(&mut rng, 5)
            } else {
                String::new()
            };
            let password: String = (0..rng.usize(1..12))
                .map(|_| *rng.choice(b"aZ9!$%^*()-_.~:;/@&#".iter()).unwrap() as char)
                .collect();
            let hosts: Vec<String> = (0..rng.usize(1..4))
                .map(|_| format!("{}:{}", word(&mut rng, 6), rng.u16(1..)))
                .collect();
            let path = if rng.bool() {
                format!("/{}", word(&mut rng, 4))
            } else {
                String::new()
            };
            let plain = format!("opt{}={}", rng.u8(..), word(&mut rng, 3));
            let scheme = *rng
                .choice(["redis", "redlock", "zk", "etcd", "postgres", "mysql"].iter())
                .unwrap();
            let url = format!(
                "{scheme}://{user}:{password}@{}{path}?{plain}&password={password}",
                hosts.join(",")
            );
            let expected = format!(
                "{scheme}://{user}:***@{}{path}?{plain}&password=***",
                hosts.join(",")
            );
            assert_eq!(redact_url(&url), expected, "{url}");
            assert!(!redact_url(&url).contains(&format!(":{password}@")));
        }
    }

    #[test]
    fn shown_urls_quote_like_strings() {
        assert_eq!(
            format!("{:?}", shown("redis://:pw@h/")),
            "\"redis://:***@h/\""
        );
        assert_eq!(shown("redis://:pw@h/").to_string(), "redis://:***@h/");
    }
}
