//! What the NATS backend stores in its bucket: the keys it builds from lock names, and the
//! value of each key (a grant, a published record).

use crate::backend::Published;

/// The prefix of a lock's key.
const LOCK: &str = "l.";
/// The prefix of a published record's key (an election's leader).
const PUBLISHED: &str = "p.";
/// The prefix of a client's clock probe.
const CLOCK: &str = "c.";

/// `text` in the characters a NATS key takes in one token: every byte outside
/// `[A-Za-z0-9_-]` as `=XX` (upper-case hex), so that dots, slashes and spaces in a lock name
/// neither split nor break the key, and the mapping can be read back.
pub(crate) fn encode(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-') {
            out.push(char::from(byte));
        } else {
            out.push('=');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
    }
    out
}

/// The text [`encode`] made `encoded` from; `None` for anything else.
pub(crate) fn decode(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            if hex.bytes().any(|b| b.is_ascii_lowercase()) {
                return None;
            }
            let byte = u8::from_str_radix(hex, 16).ok()?;
            if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-') {
                return None;
            }
            out.push(byte);
            i += 3;
        } else if bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'_' | b'-') {
            out.push(bytes[i]);
            i += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

/// The key of lock `name`.
pub(crate) fn lock_key(name: &str) -> String {
    format!("{LOCK}{}", encode(name))
}

/// The lock name of a key [`lock_key`] made; `None` for any other key.
pub(crate) fn name_of_key(key: &str) -> Option<String> {
    decode(key.strip_prefix(LOCK)?)
}

/// The key of the record published under `name`.
pub(crate) fn published_key(name: &str) -> String {
    format!("{PUBLISHED}{}", encode(name))
}

/// The key a client writes to read the server's clock.
pub(crate) fn clock_key(client: &str) -> String {
    format!("{CLOCK}{}", encode(client))
}

/// A grant, as the value of a lock's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    /// The owner, as [`Owner::as_str`](crate::backend::Owner::as_str).
    pub(crate) owner: String,
    pub(crate) holds: u32,
    /// The lease, from the entry's timestamp (the server's clock when it stored it).
    pub(crate) lease_ms: u64,
    /// The grant's fencing token; `None` in the write that made the grant, whose revision it
    /// is.
    pub(crate) token: Option<u64>,
}

/// The first line of every value: the layout's version.
const VERSION: &str = "distlock-1";

impl Grant {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let token = self.token.map(|t| t.to_string()).unwrap_or_default();
        format!(
            "{VERSION}\n{}\n{}\n{}\n{token}",
            self.owner, self.holds, self.lease_ms
        )
        .into_bytes()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Grant> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.split('\n');
        if lines.next()? != VERSION {
            return None;
        }
        let owner = lines.next()?.to_owned();
        let holds = lines.next()?.parse().ok().filter(|holds| *holds > 0)?;
        let lease_ms = lines.next()?.parse().ok()?;
        let token = match lines.next()? {
            "" => None,
            token => Some(token.parse().ok()?),
        };
        if lines.next().is_some() || owner.is_empty() {
            return None;
        }
        Some(Grant {
            owner,
            holds,
            lease_ms,
            token,
        })
    }

    /// The grant's fencing token, for the entry of `revision` that holds it.
    pub(crate) fn token_at(&self, revision: u64) -> u64 {
        self.token.unwrap_or(revision)
    }
}

/// A published record as a value: `<term>\n<holder>\n<value>`.
pub(crate) fn encode_published(record: &Published) -> Vec<u8> {
    format!("{}\n{}\n{}", record.term, record.holder, record.value).into_bytes()
}

/// The record [`encode_published`] wrote; `None` for anything else.
pub(crate) fn decode_published(bytes: &[u8]) -> Option<Published> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut parts = text.splitn(3, '\n');
    let term = parts.next()?.parse().ok()?;
    let holder = parts.next()?;
    let value = parts.next()?;
    Some(Published::new(term, value, holder))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_keys_and_back() {
        for name in ["a", "orders/42", "a..b", ".x.", "tab\there", "ünï", "=3D", "A-b_c"] {
            let key = lock_key(name);
            assert!(
                key[2..]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'=')),
                "{key}"
            );
            assert_eq!(name_of_key(&key).as_deref(), Some(name));
        }
        assert_eq!(lock_key("a.b/c"), "l.a=2Eb=2Fc");
        for bad in ["l.a=2e", "l.=41", "l.a=", "l.a b", "p.a", "l.=FF"] {
            assert_eq!(name_of_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn grants_round_trip_and_refuse_other_values() {
        let grant = Grant {
            owner: "host/1/u:3".into(),
            holds: 2,
            lease_ms: 30_000,
            token: Some(17),
        };
        assert_eq!(Grant::decode(&grant.encode()), Some(grant.clone()));
        let fresh = Grant {
            token: None,
            ..grant
        };
        assert_eq!(Grant::decode(&fresh.encode()).map(|g| g.token_at(9)), Some(9));
        for bad in [
            &b""[..],
            b"hello",
            b"distlock-1\n\n1\n1\n",
            b"distlock-1\no\n0\n1\n",
            b"distlock-1\no\n1\nx\n",
            b"distlock-1\no\n1\n1\n\nmore",
            b"distlock-2\no\n1\n1\n",
        ] {
            assert_eq!(Grant::decode(bad), None, "{bad:?}");
        }
        let record = Published::new(4, "v\nw", "me");
        assert_eq!(decode_published(&encode_published(&record)), Some(record));
    }
}
