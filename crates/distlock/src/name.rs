//! Lock names and how they map to backend keys.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

/// [`LockName::MAX_BYTES`].
pub(crate) const MAX_NAME_BYTES: usize = 1024;

/// A validated lock name: non-empty UTF-8 of at most [`LockName::MAX_BYTES`] bytes.
///
/// Any characters are allowed, including `/`, `{`, `}`, `:` and whitespace. Each backend maps
/// the name to its own key deterministically and injectively (two names never share a key),
/// under a `distlock` prefix; see [`LockName::escaped`].
///
/// A name also carries the [`LockKind`] it is locked as: a plain mutex's is
/// [`LockKind::Exclusive`]; the reader-writer lock and the election ask a backend that keeps
/// those recipes in its own layout ([`Backend::supports`](crate::backend::Backend::supports))
/// for the other kinds.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName {
    name: String,
    kind: LockKind,
}

/// What a [`LockName`] is locked as. Only [`LockKind::Exclusive`] reaches a backend unless
/// its [`Backend::supports`](crate::backend::Backend::supports) says it keeps the kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum LockKind {
    /// One holder at a time: the mutex.
    #[default]
    Exclusive,
    /// A reader of a reader-writer lock kept in the backend's own layout: held together
    /// with other readers, never with a writer, and not granted while a writer queued
    /// earlier waits.
    Read,
    /// The writer of such a reader-writer lock: held alone.
    Write,
    /// A candidate of an election kept in the backend's own layout: exclusive, and the
    /// value is stored with the candidate's place in line, so that anyone reading the
    /// first in line learns the leader's value ([`Backend::read_published`]).
    ///
    /// [`Backend::read_published`]: crate::backend::Backend::read_published
    Leader(Arc<str>),
}

impl LockKind {
    /// True for [`LockKind::Exclusive`], the one kind every backend keeps.
    pub fn is_exclusive(&self) -> bool {
        matches!(self, LockKind::Exclusive)
    }
}

impl LockName {
    /// The longest lock name accepted, in bytes of UTF-8.
    pub const MAX_BYTES: usize = MAX_NAME_BYTES;

    /// Validates a name.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the name is empty or longer than [`LockName::MAX_BYTES`].
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
        Ok(LockName {
            name,
            kind: LockKind::Exclusive,
        })
    }

    /// The same name, locked as `kind`.
    pub fn with_kind(mut self, kind: LockKind) -> Self {
        self.kind = kind;
        self
    }

    /// What the name is locked as.
    pub fn kind(&self) -> &LockKind {
        &self.kind
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The name with every byte outside `[A-Za-z0-9._-]` percent-encoded (`%2F` for `/`,
    /// `%7B` for `{`, `%25` for `%`). The mapping is injective and uses only characters that
    /// every backend accepts in a key or a node name, so backends build their keys from it.
    pub fn escaped(&self) -> String {
        escape(&self.name)
    }
}

/// [`LockName::escaped`] of any text, such as a prefix of names: the escaped prefix of a name
/// is a prefix of the escaped name, since every byte is escaped on its own.
pub(crate) fn escape(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
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

/// The name whose [`escape`] is `escaped`; `None` when `escaped` is not one (a stray `%`, a
/// lowercase hex digit, a byte that is escaped in names, or bytes that are not UTF-8). Used to
/// read names back from the keys a backend lists.
#[cfg(any(feature = "redis", feature = "zookeeper", feature = "etcd"))]
pub(crate) fn unescape(escaped: &str) -> Option<String> {
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            if hex.bytes().any(|b| b.is_ascii_lowercase()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let name = String::from_utf8(out).ok()?;
    // Only the one spelling `escape` gives reads back (no `%41` for `A`, no raw `/`).
    (escape(&name) == escaped).then_some(name)
}

/// The smallest names seen, at most `keep` of them, and whether any were left out: a listing
/// that visits keys in another order than its names' keeps what it answers and no more.
#[cfg(any(feature = "redis", feature = "etcd"))]
pub(crate) struct Smallest {
    names: std::collections::BTreeSet<String>,
    keep: usize,
    pub(crate) left_out: bool,
}

#[cfg(any(feature = "redis", feature = "etcd"))]
impl Smallest {
    pub(crate) fn new(keep: usize) -> Self {
        Smallest {
            names: std::collections::BTreeSet::new(),
            keep,
            left_out: false,
        }
    }

    pub(crate) fn add(&mut self, name: String) {
        if self.names.len() >= self.keep && self.names.last().is_none_or(|largest| &name >= largest)
        {
            self.left_out |= !self.names.contains(&name);
            return;
        }
        if self.names.insert(name) && self.names.len() > self.keep {
            self.names.pop_last();
            self.left_out = true;
        }
    }

    pub(crate) fn into_sorted(self) -> Vec<String> {
        self.names.into_iter().collect()
    }
}

/// The least string above every string that starts with `prefix`, in byte order (which for
/// UTF-8 is code-point order): `prefix` with its last character replaced by the next one.
/// `None` when there is none (an empty prefix, or one of `char::MAX` only). The backends
/// (SQLite, MySQL) list the names in `prefix <= name < prefix_end(prefix)`, a range their
/// index can serve.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn prefix_end(prefix: &str) -> Option<String> {
    let mut end = prefix.to_owned();
    while let Some(last) = end.pop() {
        let next = match u32::from(last) + 1 {
            // The surrogates are not characters: U+D7FF is followed by U+E000.
            0xD800 => Some('\u{E000}'),
            code => char::from_u32(code),
        };
        if let Some(next) = next {
            end.push(next);
            return Some(end);
        }
    }
    None
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.name, f)?;
        match &self.kind {
            LockKind::Exclusive => Ok(()),
            // A candidate's value can be long: the kind is enough here.
            LockKind::Leader(_) => f.write_str(" (Leader)"),
            kind => write!(f, " ({kind:?})"),
        }
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
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

    #[cfg(any(feature = "sqlite", feature = "mysql"))]
    #[test]
    fn prefix_ends_bound_the_names_with_the_prefix() {
        assert_eq!(prefix_end("ab/").as_deref(), Some("ab0"));
        assert_eq!(prefix_end("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        assert_eq!(prefix_end(""), None);
        for (prefix, name) in [
            ("a/", "a/\u{10FFFF}x"),
            ("é", "é\u{10FFFF}"),
            ("x\u{10FFFF}", "x\u{10FFFF}\u{10FFFF}"),
        ] {
            let end = prefix_end(prefix).unwrap();
            assert!(prefix.as_bytes() <= name.as_bytes() && name.as_bytes() < end.as_bytes());
        }
        assert!("a0".as_bytes() >= prefix_end("a/").unwrap().as_bytes());
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

    #[cfg(any(feature = "redis", feature = "zookeeper", feature = "etcd"))]
    #[test]
    fn escaped_names_read_back_and_other_spellings_do_not() {
        for name in ["a/b", "a%2Fb", "a{b}", "ä", "plain.name-1_x", ""] {
            assert_eq!(unescape(&escape(name)).as_deref(), Some(name), "{name}");
        }
        for bad in ["a/b", "a%2fb", "%41", "a%", "a%2", "%ZZ", "%FF", "a b"] {
            assert_eq!(unescape(bad), None, "{bad}");
        }
    }

    #[cfg(any(feature = "redis", feature = "etcd"))]
    #[test]
    fn only_the_smallest_names_are_kept() {
        let mut found = Smallest::new(2);
        for name in ["d", "b", "c", "b", "a"] {
            found.add(name.to_owned());
        }
        assert!(found.left_out);
        assert_eq!(found.into_sorted(), ["a", "b"]);
        let mut found = Smallest::new(2);
        for name in ["b", "a", "b"] {
            found.add(name.to_owned());
        }
        assert!(!found.left_out);
    }
}
