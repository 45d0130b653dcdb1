//! The user info of a network URL (`scheme://user:password@hosts/...`): the user and password
//! a backend authenticates with, percent-decoded, whose `Debug` never shows the password.

use crate::error::{Error, Result};

/// A user and its password, from a URL's user info. Its `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({:?}:***)", self.user)
    }
}

impl Credentials {
    /// Splits the user info off `rest` (a URL after its `scheme://`): the credentials it
    /// names, if any, and the URL's rest after the `@`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`], quoting nothing of the URL, when the user info holds a raw
    /// `/`, `?`, `#` or `,` (the URL's parts, and the redaction of the password in messages,
    /// would start inside the password), or is not `user:password` with neither empty.
    pub(crate) fn split<'a>(scheme: &str, rest: &'a str) -> Result<(Option<Credentials>, &'a str)> {
        // The user info is what stands before the last `@`.
        let Some((user_info, after)) = rest.rsplit_once('@') else {
            return Ok((None, rest));
        };
        if user_info.contains(['/', '?', '#', ',']) {
            return Err(Error::invalid(
                "URL",
                format!(
                    "the user info of a {scheme}:// URL holds a raw `/`, `?`, `#` or `,` (or an \
                     `@` stands after the host list): percent-encode them in the user and the \
                     password (`/` is %2F, `?` %3F, `#` %23, `,` %2C, `@` %40)"
                ),
            ));
        }
        let (user, password) = user_info.split_once(':').unwrap_or((user_info, ""));
        let (user, password) = (
            crate::percent::decoded(user),
            crate::percent::decoded(password),
        );
        if user.is_empty() || password.is_empty() || user.contains(':') {
            return Err(Error::invalid(
                "URL",
                format!(
                    "the user info of a {scheme}:// URL must be user:password, neither empty \
                     (percent-encode `:`, `@`, `/` and `,` in them)"
                ),
            ));
        }
        Ok((Some(Credentials { user, password }), after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_info_is_split_decoded_and_its_password_never_shown() {
        let (credentials, rest) = Credentials::split("zk", "app:s3cr%40t@h1:1,h2/x?y=1").unwrap();
        let credentials = credentials.expect("credentials");
        assert_eq!(
            (credentials.user.as_str(), credentials.password.as_str()),
            ("app", "s3cr@t")
        );
        assert_eq!(rest, "h1:1,h2/x?y=1");
        let shown = format!("{credentials:?}");
        assert!(
            shown.contains("\"app\"") && !shown.contains("s3cr"),
            "{shown}"
        );
        assert_eq!(Credentials::split("etcd", "h/x").unwrap(), (None, "h/x"));
        for bad in ["app@h/", "app:@h/", ":pw@h/", "a%3Ab:pw@h/"] {
            let err = Credentials::split("etcd", bad).expect_err(bad);
            assert!(err.is_invalid_input(), "{bad}: {err}");
        }
        for raw in [
            "app:12/34@h/x",
            "app:s3,cret@h",
            "app:s3?cret@h",
            "app:s3#cret@h",
        ] {
            let err = Credentials::split("etcd", raw).expect_err(raw);
            let text = err.to_string();
            assert!(err.is_invalid_input(), "{raw}: {text}");
            for piece in ["34", "cret"] {
                assert!(!text.contains(piece), "{raw}: {text}");
            }
        }
    }
}
