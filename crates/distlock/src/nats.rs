//! NATS JetStream: locks in a key-value bucket (`nats://host:4222/bucket`).
//!
//! Each lock is one key of the bucket (`l.<name>`, the name's bytes outside `[A-Za-z0-9_-]`
//! written `=XX`), whose value names the owner, its holds and its lease. Every change is
//! conditioned on the key's revision, the sequence of its last write in the bucket's stream:
//!
//! * a grant writes the key where it has no value (never written, or deleted), or where the
//!   value's lease has run out by the server's clock, on the revision it read; the fencing
//!   token is the revision of that write, which grows with every write to the stream;
//! * a renewal, a reentry and an extension rewrite the holder's value on its revision, the
//!   token kept in the value;
//! * a release deletes the key on the holder's revision (or lowers its holds).
//!
//! A lease is judged by the server's clock: an entry's timestamp is the moment the server
//! stored it, and a contender compares `timestamp + lease` with the timestamp of a write of
//! its own (a clock probe), so that the clients' clocks play no part. Waiters listen to the
//! key's subject (`$KV.<bucket>.l.<name>`) with a plain subscription and try again on every
//! change, or when the holder's lease runs out. `docs/backends/nats.md` says what this costs
//! and what the stream's replication means for safety.

#[cfg(feature = "bench")]
mod bare;
mod record;
mod url;
mod waiter;
mod written;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::kv::{self, Entry, Operation, UpdateErrorKind};
use async_trait::async_trait;
use futures_util::StreamExt;

use crate::backend::{
    Acquired, Backend, Extended, LockInfo, Owner, Published, ReleaseWaiter, Released, Renewing,
};
use crate::error::{Error, Result};
use crate::name::{LockKind, LockName};
use record::Grant;
use url::{Login, NatsUrl};
use written::{Writes, Written};

const SCHEME: &str = "nats";

/// How many times a request that lost a race for a key's revision reads it and tries again.
const RACES: usize = 8;

/// How long one JetStream request may take before it fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Locks in a NATS JetStream key-value bucket.
#[derive(Clone)]
pub struct NatsBackend {
    shared: Arc<Shared>,
}

struct Shared {
    client: async_nats::Client,
    jetstream: async_nats::jetstream::Context,
    store: kv::Store,
    /// The key of this client's clock probe.
    clock_key: String,
    /// The server's clock less this machine's, in nanoseconds, from the last probe.
    offset: StdMutex<Option<i128>>,
    /// This client's last write to each key it holds, for one-round-trip renewals, reentries
    /// and releases.
    writes: Writes,
}

impl std::fmt::Debug for NatsBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsBackend")
            .field("bucket", &self.shared.store.name)
            .finish_non_exhaustive()
    }
}

fn failed(operation: &'static str, error: impl std::fmt::Display) -> Error {
    Error::backend(SCHEME, operation, error.to_string())
}

fn now_nanos() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as i128)
}

impl NatsBackend {
    /// Connects to the servers a `nats://` URL names and opens its bucket, creating it (with
    /// one value per key, on file storage, with the URL's `replicas=`) where it is missing.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL or an unreadable file it names;
    /// [`Error::NotAuthorized`] when the server refuses the login; [`Error::Backend`] when no
    /// server answers or JetStream is off.
    pub async fn connect(url: &str) -> Result<Self> {
        let parsed = NatsUrl::parse(url)?;
        let mut options = match &parsed.login {
            Login::None => async_nats::ConnectOptions::new(),
            Login::Password(credentials) => async_nats::ConnectOptions::with_user_and_password(
                credentials.user.clone(),
                credentials.password.clone(),
            ),
            Login::Token(token) => async_nats::ConnectOptions::with_token(token.clone()),
            Login::CredentialsFile(path) => async_nats::ConnectOptions::with_credentials_file(
                path,
            )
            .await
            .map_err(|e| {
                Error::invalid(
                    "URL",
                    format!("nats://: creds={}: {e}", path.display()),
                )
            })?,
        };
        if let Some(tls) = &parsed.tls {
            options = options.require_tls(true);
            if let Some(ca) = &tls.ca {
                check_readable(ca, "ca")?;
                options = options.add_root_certificates(ca.clone());
            }
            if let Some((cert, key)) = &tls.identity {
                check_readable(cert, "cert")?;
                check_readable(key, "key")?;
                options = options.add_client_certificate(cert.clone(), key.clone());
            }
        }
        let servers: Vec<async_nats::ServerAddr> = parsed
            .servers
            .iter()
            .map(|server| {
                let scheme = if parsed.tls.is_some() { "tls" } else { "nats" };
                format!("{scheme}://{server}").parse().map_err(|e| {
                    Error::invalid("URL", format!("nats://: the server {server:?}: {e}"))
                })
            })
            .collect::<Result<_>>()?;
        let client = options
            .name("distlock")
            .request_timeout(Some(REQUEST_TIMEOUT))
            .connect(servers)
            .await
            .map_err(|e| match e.kind() {
                async_nats::ConnectErrorKind::Authentication
                | async_nats::ConnectErrorKind::AuthorizationViolation => Error::not_authorized(
                    SCHEME,
                    "connect",
                    format!(
                        "the server refused the login ({e}); check the user and password, \
                         token= or creds= of the URL"
                    ),
                ),
                async_nats::ConnectErrorKind::Tls | async_nats::ConnectErrorKind::Io
                    if parsed.tls.is_some() =>
                {
                    failed(
                    "connect",
                    format!(
                        "TLS failed ({e}); check that ca= names the CA that signed the \
                         servers' certificates, and cert= and key= where they ask for a \
                         client certificate"
                        ),
                    )
                }
                _ => failed("connect", e),
            })?;
        let jetstream = async_nats::jetstream::new(client.clone());
        let store = open_bucket(&jetstream, &parsed).await?;
        let backend = NatsBackend {
            shared: Arc::new(Shared {
                client,
                jetstream,
                store,
                clock_key: record::clock_key(&uuid::Uuid::new_v4().to_string()),
                offset: StdMutex::new(None),
                writes: Writes::default(),
            }),
        };
        backend.server_now().await?;
        Ok(backend)
    }

    async fn entry(&self, operation: &'static str, key: &str) -> Result<Option<Entry>> {
        self.shared
            .store
            .entry(key)
            .await
            .map_err(|e| failed(operation, e))
    }

    /// The server's clock now, in nanoseconds since the epoch: the timestamp of a write of
    /// this client's own clock probe (two round trips). Keeps the offset to this machine's
    /// clock for [`Self::estimate`].
    async fn server_now(&self) -> Result<i128> {
        let shared = &self.shared;
        let before = now_nanos();
        let revision = shared
            .store
            .put(&shared.clock_key, Default::default())
            .await
            .map_err(|e| failed("read the server's clock", e))?;
        let entry = self
            .entry("read the server's clock", &shared.clock_key)
            .await?
            .ok_or_else(|| failed("read the server's clock", "the probe's entry is missing"))?;
        let after = now_nanos();
        let stamped = entry.created.unix_timestamp_nanos();
        if entry.revision == revision {
            // The write happened between `before` and the answer to the put.
            let mid = before + (after - before) / 2;
            *shared.offset.lock().unwrap_or_else(|p| p.into_inner()) = Some(stamped - mid);
        }
        // A later write of the probe (another task of this client) was stored before the read
        // too: its timestamp is no later than the server's clock now, all a judge needs.
        Ok(stamped)
    }

    /// The server's clock now as this machine's clock and the last probe estimate it.
    fn estimate(&self) -> Option<i128> {
        let offset = *self.shared.offset.lock().unwrap_or_else(|p| p.into_inner());
        offset.map(|offset| now_nanos() + offset)
    }

    /// How long `grant` of `entry` still runs by the server's clock: `None` when it has run
    /// out. Judged first by the estimate; where that says it has run out (or is close), by a
    /// probe of the server's clock, so that only the server's clock frees a lock.
    async fn remaining(&self, entry: &Entry, grant: &Grant) -> Result<Option<Duration>> {
        let lease = i128::from(grant.lease_ms) * 1_000_000;
        let ends = entry.created.unix_timestamp_nanos() + lease;
        // Never more than the lease: an estimate off by its error could say so.
        let left = |now: i128| Duration::from_nanos((ends - now).min(lease) as u64);
        if let Some(now) = self.estimate()
            && ends - now > 0
        {
            return Ok(Some(left(now)));
        }
        let now = self.server_now().await?;
        Ok((ends > now).then(|| left(now)))
    }

    /// The live grant of `key`: its entry and value, `None` when the key is free (no value,
    /// deleted, or its lease run out).
    async fn live(
        &self,
        operation: &'static str,
        key: &str,
    ) -> Result<(Option<Entry>, Option<(Grant, Duration)>)> {
        let Some(entry) = self.entry(operation, key).await? else {
            return Ok((None, None));
        };
        if !matches!(entry.operation, Operation::Put) {
            return Ok((Some(entry), None));
        }
        let grant = decode(operation, &entry)?;
        let remaining = self.remaining(&entry, &grant).await?;
        Ok((Some(entry), remaining.map(|left| (grant, left))))
    }

    /// Writes `value` to `key` if its revision is still `revision` (0: the key was never
    /// written). `None` when another write came first.
    async fn write(
        &self,
        operation: &'static str,
        key: &str,
        value: Vec<u8>,
        revision: u64,
    ) -> Result<Option<u64>> {
        match self.shared.store.update(key, value.into(), revision).await {
            Ok(revision) => Ok(Some(revision)),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(e) => Err(failed(operation, e)),
        }
    }

    /// Writes `grant` to lock `key` if its revision is still `revision`, as [`Self::write`],
    /// and remembers the write for the next change of the grant; a write that failed or lost
    /// its race is forgotten, so that the next change reads the key again.
    async fn write_grant(
        &self,
        operation: &'static str,
        key: &str,
        grant: Grant,
        revision: u64,
    ) -> Result<Option<u64>> {
        let writes = &self.shared.writes;
        let (sent, sent_wall) = (Instant::now(), SystemTime::now());
        let written = self.write(operation, key, grant.encode(), revision).await;
        match written {
            Ok(Some(new)) => writes.remember(
                key,
                Written {
                    revision: new,
                    grant: Grant {
                        token: Some(grant.token_at(new)),
                        ..grant
                    },
                    sent,
                    sent_wall,
                    answered: Instant::now(),
                },
            ),
            _ => writes.forget(key, revision),
        }
        written
    }

    /// Deletes lock `key` if its revision is still `revision`, as [`Self::delete`], forgets
    /// this client's write to it, and remembers the delete's revision for the next grant.
    async fn delete_grant(&self, operation: &'static str, key: &str, revision: u64) -> Result<bool> {
        let writes = &self.shared.writes;
        let deleted = self.delete_marked(operation, key, revision).await;
        writes.forget(key, revision);
        match deleted {
            Ok(Some(marker)) => {
                // Revision 0 stands for a marker of unknown revision (another domain's bucket).
                if marker > 0 {
                    writes.remember_deleted(key, marker);
                }
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes the delete marker of `key` on `revision`, as `kv::Store::delete_expect_revision`
    /// does, and answers the marker's revision (`None`: another write came first).
    async fn delete_marked(
        &self,
        operation: &'static str,
        key: &str,
        revision: u64,
    ) -> Result<Option<u64>> {
        use async_nats::jetstream::context::PublishErrorKind;
        let store = &self.shared.store;
        if store.use_jetstream_prefix {
            // A bucket of another JetStream domain: the store's own delete knows its subject.
            return Ok(self.delete(operation, key, revision).await?.then_some(0));
        }
        let subject = format!("{}{key}", store.put_prefix.as_ref().unwrap_or(&store.prefix));
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("KV-Operation", "DEL");
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            async_nats::HeaderValue::from(revision),
        );
        let acked = async {
            self.shared
                .jetstream
                .publish_with_headers(subject, headers, Default::default())
                .await?
                .await
        }
        .await;
        match acked {
            Ok(ack) => Ok(Some(ack.sequence)),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(None),
            Err(e) => Err(failed(operation, e)),
        }
    }

    /// Deletes `key` if its revision is still `revision`. False when another write came
    /// first.
    async fn delete(&self, operation: &'static str, key: &str, revision: u64) -> Result<bool> {
        match self
            .shared
            .store
            .delete_expect_revision(key, Some(revision))
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(false),
            Err(e) => Err(failed(operation, e)),
        }
    }

    /// Gives back one hold of `grant`, the value of lock `key` at `revision`: rewrites it
    /// with one hold fewer, or deletes the key for the last. The holds left; `None` when the
    /// key's revision changed first.
    async fn release_on(&self, key: &str, grant: Grant, revision: u64) -> Result<Option<u32>> {
        const OPERATION: &str = "release";
        if grant.holds > 1 {
            let remaining_holds = grant.holds - 1;
            let fewer = Grant {
                holds: remaining_holds,
                token: Some(grant.token_at(revision)),
                ..grant
            };
            Ok(self
                .write_grant(OPERATION, key, fewer, revision)
                .await?
                .map(|_| remaining_holds))
        } else {
            Ok(self
                .delete_grant(OPERATION, key, revision)
                .await?
                .then_some(0))
        }
    }

    /// Rewrites the grant of `owner` with `token` on `name`: `change` makes the new value
    /// from the grant and the time it still runs.
    async fn rewrite(
        &self,
        operation: &'static str,
        name: &LockName,
        owner: &Owner,
        token: u64,
        change: impl Fn(&Grant, Duration) -> Grant,
    ) -> Result<Extended> {
        let key = record::lock_key(name.as_str());
        if let Some(written) = self.shared.writes.live(&key, owner.as_str())
            && written.token() == token
        {
            let left = written.at_most_left(Instant::now());
            let new = Grant {
                token: Some(token),
                ..change(&written.grant, left)
            };
            if self
                .write_grant(operation, &key, new, written.revision)
                .await?
                .is_some()
            {
                return Ok(Extended::Extended);
            }
        }
        for _ in 0..RACES {
            let (entry, live) = self.live(operation, &key).await?;
            let seen = entry.as_ref().map_or(0, |entry| entry.revision);
            let (Some(entry), Some((grant, left))) = (entry, live) else {
                self.shared.writes.forget(&key, seen);
                return Ok(Extended::NotHeld);
            };
            if grant.owner != owner.as_str() {
                self.shared.writes.forget(&key, entry.revision);
                return Ok(Extended::HeldByOther);
            }
            if grant.token_at(entry.revision) != token {
                return Ok(Extended::NotHeld);
            }
            let new = Grant {
                token: Some(token),
                ..change(&grant, left)
            };
            if self
                .write_grant(operation, &key, new, entry.revision)
                .await?
                .is_some()
            {
                return Ok(Extended::Extended);
            }
        }
        Err(raced(operation))
    }
}

/// The URL's bucket, created where it is missing: the stream of a key-value bucket as NATS
/// lays it out (`KV_<bucket>` over `$KV.<bucket>.>`, one message per key, rollups allowed,
/// direct reads), made through the stream API because `async-nats`'s own bucket creation
/// first reads the account's information in a form NATS 2.9 does not answer.
async fn open_bucket(
    jetstream: &async_nats::jetstream::Context,
    url: &NatsUrl,
) -> Result<kv::Store> {
    use async_nats::jetstream::stream;
    let bucket = url.bucket.as_str();
    if let Ok(store) = jetstream.get_key_value(bucket).await {
        return Ok(store);
    }
    let created = jetstream
        .create_stream(stream::Config {
            name: format!("KV_{bucket}"),
            description: Some("distlock's locks".into()),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            storage: stream::StorageType::File,
            num_replicas: url.replicas,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: stream::DiscardPolicy::New,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await;
    // Another client may have created it meanwhile: opening it again settles both.
    jetstream.get_key_value(bucket).await.map_err(|e| {
        let why = created.err().map_or_else(|| e.to_string(), |c| c.to_string());
        failed(
            "connect",
            format!(
                "the bucket {bucket:?} could not be opened or created ({why}); check that \
                 the server runs with JetStream on (nats-server -js) and that the user may \
                 use it"
            ),
        )
    })
}

fn raced(operation: &'static str) -> Error {
    failed(
        operation,
        format!("the key changed under {RACES} attempts in a row; try again"),
    )
}

fn decode(operation: &'static str, entry: &Entry) -> Result<Grant> {
    Grant::decode(&entry.value).ok_or_else(|| {
        failed(
            operation,
            format!(
                "the key {:?} of the bucket holds a value distlock did not write; use a \
                 bucket of distlock's own",
                entry.key
            ),
        )
    })
}

fn lease_ms(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis().max(1)).unwrap_or(u64::MAX)
}

fn check_readable(path: &std::path::Path, key: &str) -> Result<()> {
    std::fs::metadata(path).map(drop).map_err(|e| {
        Error::invalid(
            "URL",
            format!("nats://: {key}={}: {e}", path.display()),
        )
    })
}

/// Opens the NATS backend a `nats://` URL names.
///
/// # Errors
/// As [`NatsBackend::connect`].
pub async fn connect(url: &str) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(NatsBackend::connect(url).await?))
}

/// Checks a `nats://` URL without connecting.
fn check_url(url: &str) -> Result<()> {
    NatsUrl::parse(url).map(drop)
}

crate::driver::driver!(check_url: check_url, open: connect, bare: bare::open);

#[async_trait]
impl Backend for NatsBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    async fn ping(&self) -> Result<()> {
        self.entry("ping", &self.shared.clock_key).await.map(drop)
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Acquired> {
        const OPERATION: &str = "acquire";
        let key = record::lock_key(name.as_str());
        if let Some(marker) = self.shared.writes.take_deleted(&key) {
            // This client deleted the key last: unless something wrote it since, it is free.
            let fresh = Grant {
                owner: owner.as_str().to_owned(),
                holds: 1,
                lease_ms: lease_ms(lease),
                token: None,
            };
            if let Some(token) = self.write_grant(OPERATION, &key, fresh, marker).await? {
                return Ok(Acquired::Granted {
                    fencing_token: token,
                    holds: 1,
                });
            }
        }
        if let Some(written) = self.shared.writes.live(&key, owner.as_str()) {
            let token = written.token();
            let holds = written.grant.holds.saturating_add(1);
            let left = written.at_most_left(Instant::now());
            let again = Grant {
                holds,
                // Never shorter than what may be left of the lease.
                lease_ms: lease_ms(lease).max(lease_ms(left) + 1),
                token: Some(token),
                ..written.grant
            };
            if self
                .write_grant(OPERATION, &key, again, written.revision)
                .await?
                .is_some()
            {
                return Ok(Acquired::Granted {
                    fencing_token: token,
                    holds,
                });
            }
        }
        for _ in 0..RACES {
            let (entry, live) = self.live(OPERATION, &key).await?;
            let revision = entry.as_ref().map_or(0, |entry| entry.revision);
            let written = match live {
                Some((grant, left)) if grant.owner == owner.as_str() => {
                    let token = grant.token_at(revision);
                    let holds = grant.holds.saturating_add(1);
                    let again = Grant {
                        // Never shorter than what is left of the lease: `left` is an estimate
                        // that runs ahead when this machine's clock does, so the written lease
                        // is also at least the grant's own, which from a later timestamp ends
                        // no earlier whatever the clocks say.
                        lease_ms: lease_ms(lease)
                            .max(lease_ms(left) + 1)
                            .max(grant.lease_ms),
                        owner: grant.owner,
                        holds,
                        token: Some(token),
                    };
                    self.write_grant(OPERATION, &key, again, revision)
                        .await?
                        .map(|_| Acquired::Granted {
                            fencing_token: token,
                            holds,
                        })
                }
                Some((_, left)) => return Ok(Acquired::Held { ttl: Some(left) }),
                None => {
                    let fresh = Grant {
                        owner: owner.as_str().to_owned(),
                        holds: 1,
                        lease_ms: lease_ms(lease),
                        token: None,
                    };
                    self.write_grant(OPERATION, &key, fresh, revision)
                        .await?
                        .map(|token| Acquired::Granted {
                            fencing_token: token,
                            holds: 1,
                        })
                }
            };
            if let Some(acquired) = written {
                return Ok(acquired);
            }
        }
        Ok(Acquired::Held { ttl: None })
    }

    async fn subscribe(
        &self,
        name: &LockName,
        _owner: &Owner,
        _lease: Duration,
    ) -> Result<Box<dyn ReleaseWaiter>> {
        let subject = format!(
            "{}{}",
            self.shared.store.prefix,
            record::lock_key(name.as_str())
        );
        let subscriber = self
            .shared
            .client
            .subscribe(subject)
            .await
            .map_err(|e| failed("wait", e))?;
        Ok(Box::new(waiter::NatsWaiter::new(subscriber)))
    }

    async fn release(&self, name: &LockName, owner: &Owner) -> Result<Released> {
        const OPERATION: &str = "release";
        let key = record::lock_key(name.as_str());
        if let Some(written) = self.shared.writes.live(&key, owner.as_str())
            && let Some(remaining_holds) = self
                .release_on(&key, written.grant, written.revision)
                .await?
        {
            return Ok(Released::Released { remaining_holds });
        }
        for _ in 0..RACES {
            let (entry, live) = self.live(OPERATION, &key).await?;
            let seen = entry.as_ref().map_or(0, |entry| entry.revision);
            let (Some(entry), Some((grant, _))) = (entry, live) else {
                self.shared.writes.forget(&key, seen);
                return Ok(Released::NotHeld);
            };
            if grant.owner != owner.as_str() {
                self.shared.writes.forget(&key, entry.revision);
                return Ok(Released::HeldByOther);
            }
            if let Some(remaining_holds) = self.release_on(&key, grant, entry.revision).await? {
                return Ok(Released::Released { remaining_holds });
            }
        }
        Err(raced(OPERATION))
    }

    async fn extend(
        &self,
        name: &LockName,
        owner: &Owner,
        fencing_token: u64,
        lease: Duration,
    ) -> Result<Extended> {
        self.rewrite("extend", name, owner, fencing_token, |grant, _| Grant {
            lease_ms: lease_ms(lease),
            ..grant.clone()
        })
        .await
    }

    async fn renew(&self, locks: &[Renewing], lease: Duration) -> Result<Vec<bool>> {
        // One request stream: the client pipelines them on its connection.
        let renewals = locks.iter().map(|renewing| {
            let (name, owner) = &renewing.lock;
            self.rewrite("renew", name, owner, renewing.fencing_token, |grant, _| {
                Grant {
                    lease_ms: lease_ms(lease),
                    ..grant.clone()
                }
            })
        });
        let answers = futures_util::future::join_all(renewals).await;
        answers
            .into_iter()
            .map(|answer| answer.map(|extended| extended == Extended::Extended))
            .collect()
    }

    async fn is_locked(&self, name: &LockName) -> Result<bool> {
        let key = record::lock_key(name.as_str());
        Ok(self.live("is_locked", &key).await?.1.is_some())
    }

    async fn holds(&self, name: &LockName, owner: &Owner) -> Result<u32> {
        let key = record::lock_key(name.as_str());
        Ok(match self.live("holds", &key).await?.1 {
            Some((grant, _)) if grant.owner == owner.as_str() => grant.holds,
            _ => 0,
        })
    }

    async fn force_unlock(&self, name: &LockName) -> Result<bool> {
        const OPERATION: &str = "force_unlock";
        let key = record::lock_key(name.as_str());
        for _ in 0..RACES {
            let (entry, live) = self.live(OPERATION, &key).await?;
            let (Some(entry), Some(_)) = (entry, live) else {
                return Ok(false);
            };
            if self.delete_grant(OPERATION, &key, entry.revision).await? {
                return Ok(true);
            }
        }
        Err(raced(OPERATION))
    }

    async fn publish(&self, key: &LockName, record: &Published) -> Result<Published> {
        const OPERATION: &str = "publish";
        let key = record::published_key(key.as_str());
        for _ in 0..RACES {
            let entry = self.entry(OPERATION, &key).await?;
            let revision = entry.as_ref().map_or(0, |entry| entry.revision);
            let stored = entry
                .filter(|entry| matches!(entry.operation, Operation::Put))
                .and_then(|entry| record::decode_published(&entry.value));
            let winner = record.clone().winner(stored);
            if &winner != record {
                return Ok(winner);
            }
            if self
                .write(OPERATION, &key, record::encode_published(record), revision)
                .await?
                .is_some()
            {
                return Ok(winner);
            }
        }
        Err(raced(OPERATION))
    }

    async fn read_published(&self, key: &LockName) -> Result<Option<Published>> {
        let key = record::published_key(key.as_str());
        Ok(self
            .entry("read_published", &key)
            .await?
            .filter(|entry| matches!(entry.operation, Operation::Put))
            .and_then(|entry| record::decode_published(&entry.value))
            .and_then(Published::live))
    }

    async fn withdraw(&self, key: &LockName, term: u64) -> Result<bool> {
        const OPERATION: &str = "withdraw";
        let key = record::published_key(key.as_str());
        for _ in 0..RACES {
            let Some(entry) = self.entry(OPERATION, &key).await? else {
                return Ok(false);
            };
            let stored = matches!(entry.operation, Operation::Put)
                .then(|| record::decode_published(&entry.value))
                .flatten();
            if !stored.is_some_and(|stored| stored.term == term && !stored.is_withdrawn()) {
                return Ok(false);
            }
            let withdrawn = record::encode_published(&Published::withdrawn(term));
            if self
                .write(OPERATION, &key, withdrawn, entry.revision)
                .await?
                .is_some()
            {
                return Ok(true);
            }
        }
        Err(raced(OPERATION))
    }

    async fn list_held(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        const OPERATION: &str = "list";
        let mut keys = match self.shared.store.keys().await {
            Ok(keys) => keys,
            // An empty bucket has no consumer to list from on some servers.
            Err(e) => return Err(failed(OPERATION, e)),
        };
        let mut names = BTreeSet::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| failed(OPERATION, e))?;
            if let Some(name) = record::name_of_key(&key).filter(|name| name.starts_with(prefix)) {
                names.insert(name);
            }
        }
        let mut held = Vec::new();
        for name in names {
            if held.len() >= limit {
                break;
            }
            if self
                .live(OPERATION, &record::lock_key(&name))
                .await?
                .1
                .is_some()
            {
                held.push(name);
            }
        }
        Ok(held)
    }

    async fn inspect(&self, name: &LockName) -> Result<LockInfo> {
        let key = record::lock_key(name.as_str());
        let (entry, live) = self.live("inspect", &key).await?;
        let (Some(entry), Some((grant, left))) = (entry, live) else {
            return Ok(LockInfo::new(false));
        };
        let mut info = LockInfo::new(true);
        info.fencing_token = Some(grant.token_at(entry.revision));
        info.holder = Some(grant.owner);
        info.holds = Some(grant.holds);
        info.remaining_lease = Some(left);
        Ok(info)
    }

    fn supports(&self, kind: &LockKind) -> bool {
        kind.is_exclusive()
    }
}

#[cfg(all(test, feature = "conformance"))]
mod tests;
