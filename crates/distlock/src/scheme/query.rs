//! The one parser of the options in a backend URL's query, checked against its scheme.

// Each part is read by some of the backends behind cargo features; a build without all of
// them leaves some unread.
#![cfg_attr(
    not(all(
        feature = "sqlite",
        feature = "redis",
        feature = "zookeeper",
        feature = "postgres",
        feature = "mysql"
    )),
    allow(dead_code)
)]

use super::{Scheme, of_url};
use crate::error::{Error, Result};

/// A URL's query, checked against its scheme's keys.
#[derive(Debug)]
pub(crate) struct Query<'a> {
    scheme: &'static Scheme,
    own: Vec<(&'static str, &'a str)>,
    driver: Vec<&'a str>,
}

impl<'a> Query<'a> {
    /// Splits `url` at its first `?` into the part before it and the checked query: every
    /// key must be distlock's or the driver's (named once), or the answer is an error that
    /// names the keys the scheme takes.
    pub(crate) fn parse(url: &'a str) -> Result<(&'a str, Query<'a>)> {
        let (scheme, _) = of_url(url)?;
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut own: Vec<(&'static str, &'a str)> = Vec::new();
        let mut driver = Vec::new();
        let mut secret_before: Option<&str> = None;
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            // A word without `=` after a secret is most likely the rest of a password with a
            // raw `&` in it: say so without quoting it.
            if let Some(secret) = secret_before.filter(|_| !pair.contains('=')) {
                return Err(Error::invalid(
                    "URL",
                    format!(
                        "the value of {secret}= seems to hold a raw `&`: percent-encode `&` \
                         (%26) and `#` (%23) in it"
                    ),
                ));
            }
            let (raw_key, value) = pair.split_once('=').unwrap_or((pair, ""));
            secret_before = pair
                .contains('=')
                .then_some(raw_key)
                .filter(|key| crate::redact::names_a_secret(key));
            // Drivers decode percent-escaped keys (`options%5Bsearch_path%5D`): so is the check.
            let decoded = crate::percent::decoded(raw_key);
            let key = decoded.as_str();
            if let Some(option) = scheme.own_options().find(|o| o.key == key) {
                if own.iter().any(|(seen, _)| *seen == option.key) {
                    return Err(Error::invalid(
                        "URL",
                        format!("{key}= is given twice in {}://...", scheme.name),
                    ));
                }
                own.push((option.key, value));
            } else if scheme.is_driver_key(key) {
                driver.push(pair);
            } else {
                // A prefix key is shown as it is written: `options[NAME]`.
                let known: Vec<String> = scheme
                    .known_keys()
                    .into_iter()
                    .map(|key| match key.strip_suffix('[') {
                        Some(prefix) => format!("{prefix}[NAME]"),
                        None => key.to_owned(),
                    })
                    .collect();
                return Err(Error::invalid(
                    "URL",
                    if known.is_empty() {
                        format!("{}:// takes no options, and {key:?} was given", scheme.name)
                    } else {
                        format!(
                            "unknown {}:// option {key:?}; the options are {}",
                            scheme.name,
                            known.join(", ")
                        )
                    },
                ));
            }
        }
        Ok((
            base,
            Query {
                scheme,
                own,
                driver,
            },
        ))
    }

    /// The value of distlock's option `key`, if given.
    pub(crate) fn get(&self, key: &str) -> Option<&'a str> {
        self.own
            .iter()
            .find(|(seen, _)| *seen == key)
            .map(|(_, value)| *value)
    }

    /// The boolean option `key`, if given.
    pub(crate) fn flag(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|value| match value {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                other => Err(Error::invalid(
                    "URL",
                    format!("{key}={other:?} must be true or false"),
                )),
            })
            .transpose()
    }

    /// The option `key`, which must be one of `choices` (the first is the default).
    pub(crate) fn choice(&self, key: &str, choices: &[&'static str]) -> Result<&'static str> {
        let Some(value) = self.get(key) else {
            return Ok(choices.first().copied().unwrap_or_default());
        };
        choices
            .iter()
            .copied()
            .find(|choice| *choice == value)
            .ok_or_else(|| {
                Error::invalid(
                    "URL",
                    format!(
                        "{}://: {key}={value:?} is not one of {}",
                        self.scheme.name,
                        choices.join(", ")
                    ),
                )
            })
    }

    /// The duration option `key` (`10s`, `2500ms`), if given; it must lie in `range`.
    pub(crate) fn duration(
        &self,
        key: &str,
        range: std::ops::RangeInclusive<std::time::Duration>,
    ) -> Result<Option<std::time::Duration>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        parse_duration(value)
            .filter(|duration| range.contains(duration))
            .map(Some)
            .ok_or_else(|| {
                Error::invalid(
                    "URL",
                    format!(
                        "{}://: {key}={value:?} is not a duration such as 10s or 250ms \
                         between {:?} and {:?}",
                        self.scheme.name,
                        range.start(),
                        range.end()
                    ),
                )
            })
    }

    /// The decimal option `key`, if given; it must lie in `range`.
    pub(crate) fn fraction(
        &self,
        key: &str,
        range: std::ops::RangeInclusive<f64>,
    ) -> Result<Option<f64>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        value
            .parse::<f64>()
            .ok()
            .filter(|number| range.contains(number))
            .map(Some)
            .ok_or_else(|| {
                Error::invalid(
                    "URL",
                    format!(
                        "{}://: {key}={value:?} is not a number between {} and {}",
                        self.scheme.name,
                        range.start(),
                        range.end()
                    ),
                )
            })
    }

    /// `base` with the driver's options put back as its query.
    pub(crate) fn driver_url(&self, base: &str) -> String {
        if self.driver.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", self.driver.join("&"))
        }
    }
}

/// `10s` or `2500ms`.
fn parse_duration(value: &str) -> Option<std::time::Duration> {
    if let Some(ms) = value.strip_suffix("ms") {
        Some(std::time::Duration::from_millis(ms.parse().ok()?))
    } else {
        Some(std::time::Duration::from_secs(
            value.strip_suffix('s')?.parse().ok()?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused_with_the_known_ones() {
        let err = Query::parse("redis://h/?fare=true")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"fare\"") && err.contains("fair, spin, ca, connect_timeout, protocol"),
            "{err}"
        );
        let err = Query::parse("memory://x?a=1").unwrap_err().to_string();
        assert!(err.contains("the options are connect_timeout"), "{err}");
        let err = Query::parse("zk://h/?fair=true&fair=false").unwrap_err();
        assert!(err.is_invalid_input(), "{err}");
        let err = Query::parse("sqlite:///x?fair=true&fair=false")
            .unwrap_err()
            .to_string();
        assert!(err.contains("twice"), "{err}");
        let err = Query::parse("ftp://x").unwrap_err().to_string();
        assert!(err.contains("known schemes are memory, sqlite"), "{err}");
        assert!(Query::parse("no scheme").unwrap_err().is_invalid_input());
    }

    #[test]
    fn driver_keys_pass_through_and_own_keys_do_not() {
        let url = "postgres://u@h/db?mode=table&sslmode=require&options[search_path]=x";
        let (base, query) = Query::parse(url).unwrap();
        assert_eq!(
            query
                .choice("mode", &["advisory", "table", "transaction"])
                .unwrap(),
            "table"
        );
        assert_eq!(
            query.driver_url(base),
            "postgres://u@h/db?sslmode=require&options[search_path]=x"
        );
        let (base, query) = Query::parse("redis://h/?fair=0").unwrap();
        assert_eq!(query.flag("fair").unwrap(), Some(false));
        assert_eq!(query.flag("spin").unwrap(), None);
        assert_eq!(query.driver_url(base), "redis://h/");
        let (_, query) = Query::parse("redis://h/?fair=maybe").unwrap();
        assert!(query.flag("fair").unwrap_err().is_invalid_input());
        // libpq's keys that sqlx ignores, and percent-escaped keys, still pass to the driver;
        // connect_timeout is distlock's on every scheme, in libpq's bare seconds too.
        let url = "postgresql://u@h/db?sslmode=require&channel_binding=require";
        let with_timeout = format!("{url}&connect_timeout=10");
        let (base, query) = Query::parse(&with_timeout).unwrap();
        assert_eq!(query.driver_url(base), url);
        for (url, seconds) in [
            ("postgresql://u@h/db?connect_timeout=10", 10.0),
            ("redis://h/?connect_timeout=2500ms", 2.5),
            ("zk://h/", 10.0),
        ] {
            let timeout = crate::scheme::connect_timeout(url).unwrap();
            assert_eq!(timeout.as_secs_f64(), seconds, "{url}");
        }
        let longest = crate::scheme::connect_timeout("postgres://h/db?connect_timeout=0").unwrap();
        assert_eq!(longest.as_secs(), 600, "libpq's 0 is no limit: the longest");
        for bad in [
            "etcd://h/?connect_timeout=0ms",
            "redis://h/?connect_timeout=1d",
        ] {
            assert!(
                crate::scheme::connect_timeout(bad)
                    .unwrap_err()
                    .is_invalid_input()
            );
        }
        let (base, query) = Query::parse("postgres://h/db?options%5Bsearch_path%5D=x").unwrap();
        assert_eq!(
            query.driver_url(base),
            "postgres://h/db?options%5Bsearch_path%5D=x"
        );
        let (_, query) = Query::parse("mysql://h/?mode=row").unwrap();
        assert!(query.choice("mode", &["named", "table"]).is_err());
    }
}
