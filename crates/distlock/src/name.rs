//! Lock names and how they map to backend keys.

use std::fmt;

use crate::error::{Error, Result};

/// The longest lock name accepted, in bytes of UTF-8.
pub const MAX_NAME_BYTES: usize = 1024;

/// A validated lock name: non-empty UTF-8 of at most [`MAX_NAME_BYTES`] bytes.
///
/// Any characters are allowed, including `/`, `{`, `}`, `:` and whitespace. Each backend maps
/// the name to its own key deterministically and injectively (two names never share a key),
/// under a `distlock` prefix; see [`LockName::escaped`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(String);

impl LockName {
    /// Validates a name.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the name is empty or longer than [`MAX_NAME_BYTES`].
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::invalid(
                "lock name",
                "the name is empty; give a non-empty name such as \"orders/42\"",
            ));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(Error::invalid(
                "lock name",
                format!(
                    "the name is {} bytes long; the limit is {MAX_NAME_BYTES} bytes of UTF-8 \
                     (hash long identifiers before using them as lock names)",
                    name.len()
                ),
            ));
        }
        Ok(LockName(name))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name with every byte outside `[A-Za-z0-9._-]` percent-encoded (`%2F` for `/`,
    /// `%7B` for `{`, `%25` for `%`). The mapping is injective and uses only characters that
    /// every backend accepts in a key or a node name, so backends build their keys from it.
    pub fn escaped(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let mut out = String::with_capacity(self.0.len());
        for &byte in self.0.as_bytes() {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-') {
                out.push(char::from(byte));
            } else {
                out.push('%');
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0xf)]));
            }
        }
        out
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_long_names_are_rejected() {
        assert!(LockName::new("").unwrap_err().is_invalid_input());
        assert!(LockName::new("x".repeat(MAX_NAME_BYTES)).is_ok());
        assert!(
            LockName::new("x".repeat(MAX_NAME_BYTES + 1))
                .unwrap_err()
                .is_invalid_input()
        );
    }

    #[test]
    fn escaping_is_injective_on_tricky_names() {
        let names = [
            "a/b", "a%2Fb", "a{b}", "a:b", "a b", "ä", "%C3%A4", "a.b-c_d",
        ];
        let escaped: std::collections::HashSet<String> = names
            .iter()
            .map(|n| LockName::new(*n).unwrap().escaped())
            .collect();
        assert_eq!(escaped.len(), names.len());
        assert_eq!(LockName::new("a/b{c}").unwrap().escaped(), "a%2Fb%7Bc%7D");
        assert_eq!(LockName::new("ä").unwrap().escaped(), "%C3%A4");
    }
}
