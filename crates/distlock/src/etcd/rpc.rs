//! The connection to an etcd cluster: one gRPC channel balanced over the URL's servers (over
//! TLS where the URL asks, as its user where it names one), the calls of etcd's API the
//! backend makes, each asking for a server that has a leader, and what their failures mean.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream;
use tokio::sync::mpsc;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Response, Status, Streaming};

use super::api::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest,
    LeaseKeepAliveResponse, LeaseRevokeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp,
    ResponseOp, TxnRequest, TxnResponse, WatchCreateRequest, WatchRequest, WatchResponse, compare,
    kv_client::KvClient, lease_client::LeaseClient, range_request, request_op, response_op,
    watch_client::WatchClient, watch_request,
};
#[cfg(feature = "bench")]
use super::api::etcdserverpb::{DeleteRangeResponse, PutResponse};
use super::api::mvccpb::KeyValue;
use super::auth::{self, Auth, Token};
use super::url::{EtcdUrl, Tls};
use crate::error::Error;

/// A server's answer, or the gRPC status it failed with.
pub(crate) type Answer<T> = std::result::Result<T, Status>;

/// How many requests of one stream wait to be sent at most.
const STREAM_BUFFER: usize = 64;

/// How long connecting to a server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the connection to a server is checked while idle (HTTP/2 pings), and how long
/// a ping may go unanswered before the connection counts as broken.
const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// The gRPC channel to the cluster, and the user the client authenticates as; cheap to
/// clone.
#[derive(Clone)]
pub(crate) struct Rpc {
    channel: Channel,
    auth: Option<Arc<Auth>>,
    /// Whether the channel talks TLS, for the advice of a failed connection.
    tls: bool,
}

/// Marks a request so that a server without a leader refuses it (etcd's `hasleader`
/// metadata) instead of serving it from a member cut off from the cluster; a watch stream
/// so marked is ended by the server when it loses its leader. With a token, the request
/// carries it.
fn ask<T>(message: T, token: Option<&Token>) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("hasleader", MetadataValue::from_static("true"));
    if let Some(token) = token {
        token.sign(&mut request);
    }
    request
}

/// The sending half of a bidirectional stream. Dropping it ends the stream's requests.
pub(crate) struct Requests<T>(mpsc::Sender<T>);

/// The stream's requests cannot be sent any more: the stream has ended.
#[derive(Debug)]
pub(crate) struct StreamClosed;

impl<T> Requests<T> {
    pub(crate) async fn send(&self, message: T) -> Result<(), StreamClosed> {
        self.0.send(message).await.map_err(|_| StreamClosed)
    }
}

/// Opens a bidirectional stream whose first request is `first`: the requests go through a
/// channel whose sending half is answered with the stream of answers.
fn requests<T: Send + 'static>(
    first: T,
) -> (
    Requests<T>,
    impl futures_util::Stream<Item = T> + Send + 'static,
) {
    let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
    // Room for the first request: the channel is new and not full.
    let _ = sender.try_send(first);
    let messages = stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|message| (message, receiver))
    });
    (Requests(sender), messages)
}

/// The TLS configuration of `tls`: its files read, the servers checked against its CA or the
/// system's roots.
fn tls_config(tls: &Tls) -> Result<ClientTlsConfig, Error> {
    let read = |key: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            Error::invalid(
                "URL",
                format!("etcd://: {key}={}: cannot read it: {e}", path.display()),
            )
        })
    };
    let mut config = ClientTlsConfig::new();
    config = match &tls.ca {
        Some(ca) => config.ca_certificate(Certificate::from_pem(read("ca", ca)?)),
        None => config.with_native_roots(),
    };
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(Identity::from_pem(read("cert", cert)?, read("key", key)?));
    }
    Ok(config)
}

impl Rpc {
    /// A channel balanced over the servers of `url`, over TLS where it asks for it, as its
    /// user where it names one. It connects lazily: the first request finds out whether a
    /// server answers (and takes the user's token).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an endpoint that is not a valid URI, or a TLS file that
    /// cannot be read or used.
    pub(crate) fn new(url: &EtcdUrl) -> Result<Rpc, Error> {
        let endpoints = &url.endpoints;
        let tls = url.tls.as_ref().map(tls_config).transpose()?;
        let invalid = |endpoint: &str, e: &dyn std::fmt::Display| {
            Error::invalid("URL", format!("etcd://: {endpoint}: {e}"))
        };
        let (channel, changes) = Channel::balance_channel(endpoints.len().max(1));
        for endpoint in endpoints {
            let mut target = Endpoint::from_shared(endpoint.clone())
                .map_err(|e| invalid(endpoint, &e))?
                .connect_timeout(CONNECT_TIMEOUT)
                .http2_keep_alive_interval(KEEP_ALIVE)
                .keep_alive_timeout(KEEP_ALIVE)
                .keep_alive_while_idle(true);
            if let Some(tls) = &tls {
                target = target
                    .tls_config(tls.clone())
                    .map_err(|e| invalid(endpoint, &e))?;
            }
            changes
                .try_send(tonic::transport::channel::Change::Insert(
                    endpoint.clone(),
                    target,
                ))
                .map_err(|e| invalid(endpoint, &e))?;
        }
        let auth = url
            .credentials
            .clone()
            .map(|user| Arc::new(Auth::new(user)));
        Ok(Rpc {
            channel,
            auth,
            tls: tls.is_some(),
        })
    }

    /// Sends `message` through `call`, with the user's token where the client has a user:
    /// when the cluster refuses the token (`again`), once more with a new one.
    async fn authorized<M: Clone, T, F, Fut>(
        &self,
        message: M,
        again: fn(&Status) -> bool,
        call: F,
    ) -> Answer<T>
    where
        F: Fn(M, Option<Token>) -> Fut,
        Fut: Future<Output = Answer<T>>,
    {
        let Some(auth) = &self.auth else {
            return call(message, None).await;
        };
        let token = auth.token(&self.channel).await?;
        let stale = token.generation();
        match call(message.clone(), Some(token)).await {
            Err(status) if again(&status) => {
                let token = auth.renew(&self.channel, Some(stale)).await?;
                call(message, Some(token)).await
            }
            answer => answer,
        }
    }

    pub(crate) async fn range(&self, request: RangeRequest) -> Answer<RangeResponse> {
        self.authorized(request, auth::token_refused, |request, token| {
            let mut client = KvClient::new(self.channel.clone());
            async move {
                client
                    .range(ask(request, token.as_ref()))
                    .await
                    .map(Response::into_inner)
            }
        })
        .await
    }

    #[cfg(feature = "bench")]
    pub(crate) async fn put(&self, request: PutRequest) -> Answer<PutResponse> {
        self.authorized(request, auth::token_refused, |request, token| {
            let mut client = KvClient::new(self.channel.clone());
            async move {
                client
                    .put(ask(request, token.as_ref()))
                    .await
                    .map(Response::into_inner)
            }
        })
        .await
    }

    #[cfg(feature = "bench")]
    pub(crate) async fn delete_range(
        &self,
        request: DeleteRangeRequest,
    ) -> Answer<DeleteRangeResponse> {
        self.authorized(request, auth::token_refused, |request, token| {
            let mut client = KvClient::new(self.channel.clone());
            async move {
                client
                    .delete_range(ask(request, token.as_ref()))
                    .await
                    .map(Response::into_inner)
            }
        })
        .await
    }

    pub(crate) async fn txn(&self, request: TxnRequest) -> Answer<TxnResponse> {
        self.authorized(request, auth::token_refused, |request, token| {
            let mut client = KvClient::new(self.channel.clone());
            async move {
                client
                    .txn(ask(request, token.as_ref()))
                    .await
                    .map(Response::into_inner)
            }
        })
        .await
    }

    pub(crate) async fn lease_grant(&self, ttl_seconds: i64) -> Answer<LeaseGrantResponse> {
        let request = LeaseGrantRequest {
            ttl: ttl_seconds,
            id: 0,
        };
        self.authorized(request, auth::token_refused, |request, token| {
            let mut client = LeaseClient::new(self.channel.clone());
            async move {
                client
                    .lease_grant(ask(request, token.as_ref()))
                    .await
                    .map(Response::into_inner)
            }
        })
        .await
    }

    pub(crate) async fn lease_revoke(&self, lease: i64) -> Answer<()> {
        let request = LeaseRevokeRequest { id: lease };
        self.authorized(request, auth::token_refused, |request, token| {
            let mut client = LeaseClient::new(self.channel.clone());
            async move {
                client
                    .lease_revoke(ask(request, token.as_ref()))
                    .await
                    .map(drop)
            }
        })
        .await
    }

    /// Opens a keep-alive stream for `lease` and sends its first keep-alive; each request
    /// sent on it renews the lease once and is answered with the TTL left (0: the lease is
    /// gone).
    pub(crate) async fn lease_keep_alive(
        &self,
        lease: i64,
    ) -> Answer<(
        Requests<LeaseKeepAliveRequest>,
        Streaming<LeaseKeepAliveResponse>,
    )> {
        let first = LeaseKeepAliveRequest { id: lease };
        self.authorized(first, auth::token_refused, |first, token| {
            let mut client = LeaseClient::new(self.channel.clone());
            async move {
                let (sender, messages) = requests(first);
                let answers = client
                    .lease_keep_alive(ask(messages, token.as_ref()))
                    .await?
                    .into_inner();
                Ok((sender, answers))
            }
        })
        .await
    }

    /// Opens a watch stream with `first` as its first request and waits for the server to
    /// answer it (the watch is then set up: every later change is in the stream).
    ///
    /// # Errors
    /// The stream's failure; a watch the server refuses fails with `Status::permission_denied`
    /// (etcd answers a watch of keys the user may not read as created and cancelled at once,
    /// as it does a watch whose token it no longer takes: a count-only read of the key with
    /// the same token tells the two apart, and only the second takes a new token); a stream
    /// that ends or answers something else first fails with `Status::unavailable`.
    pub(crate) async fn watch(
        &self,
        first: WatchRequest,
    ) -> Answer<(Requests<WatchRequest>, Streaming<WatchResponse>)> {
        let Some(auth) = &self.auth else {
            return self.open_watch(first, None).await;
        };
        let token = auth.token(&self.channel).await?;
        match self.open_watch(first.clone(), Some(&token)).await {
            Err(status)
                if auth::token_refused(&status)
                    || (status.code() == tonic::Code::PermissionDenied
                        && self.token_refused_for(&first, &token).await) =>
            {
                let token = auth.renew(&self.channel, Some(token.generation())).await?;
                self.open_watch(first, Some(&token)).await
            }
            answer => answer,
        }
    }

    async fn open_watch(
        &self,
        first: WatchRequest,
        token: Option<&Token>,
    ) -> Answer<(Requests<WatchRequest>, Streaming<WatchResponse>)> {
        let (sender, messages) = requests(first);
        let mut answers = WatchClient::new(self.channel.clone())
            .watch(ask(messages, token))
            .await?
            .into_inner();
        match answers.message().await? {
            Some(answer) if answer.created && !answer.canceled => Ok((sender, answers)),
            Some(answer) if answer.cancel_reason.contains("permission denied") => {
                Err(Status::permission_denied(answer.cancel_reason))
            }
            Some(answer) => Err(Status::unavailable(format!(
                "the server answered a new watch with no creation (cancelled: {}, {})",
                answer.canceled, answer.cancel_reason
            ))),
            None => Err(Status::unavailable("the watch stream ended at once")),
        }
    }

    /// True when the cluster refuses `token` itself for a count-only read of the key `watch`
    /// sets up (rather than the user's right to read it).
    async fn token_refused_for(&self, watch: &WatchRequest, token: &Token) -> bool {
        let Some(watch_request::RequestUnion::CreateRequest(create)) = &watch.request_union else {
            return false;
        };
        let read = RangeRequest {
            key: create.key.clone(),
            count_only: true,
            ..RangeRequest::default()
        };
        matches!(
            KvClient::new(self.channel.clone())
                .range(ask(read, Some(token)))
                .await,
            Err(status) if auth::token_refused(&status)
        )
    }
}

impl Rpc {
    /// The error of a call that failed with `status` while the backend tried to
    /// `operation`: [`Error::NotAuthorized`] when the cluster refused the user, else
    /// [`Error::Backend`] with the causes of a connection that failed (a certificate not
    /// trusted, a handshake refused) and, over TLS, the options to check.
    pub(crate) fn failed(&self, operation: &'static str, status: Status) -> Error {
        if let Some(reason) = auth::refusal(&status) {
            return Error::not_authorized(
                "etcd",
                operation,
                format!("{reason} (etcd said: {})", status.message()),
            );
        }
        let mut causes = String::new();
        let mut source = std::error::Error::source(&status);
        while let Some(cause) = source {
            let cause = cause.to_string();
            if !causes.contains(&cause) && !status.message().contains(&cause) {
                causes.push_str(": ");
                causes.push_str(&cause);
            }
            source = cause_of(source);
        }
        let text = format!("{}{causes}", status.message());
        let hint = if self.tls && text.contains("transport error") {
            " (over TLS: ca= names the CA that signed the servers' certificates, whose names \
             must be the URL's hosts; a cluster with --client-cert-auth drops a client without \
             the cert= and key= of a certificate its CA signed)"
        } else if !self.tls
            && ["broken pipe", "connection reset", "connection closed"]
                .iter()
                .any(|cause| text.contains(cause))
        {
            " (a member that talks TLS drops a client that does not: add tls=true or ca= to the \
             URL if the cluster takes TLS)"
        } else {
            ""
        };
        Error::backend(
            "etcd",
            operation,
            format!("{:?}: {text}{hint}", status.code()),
        )
    }
}

fn cause_of<'a>(
    error: Option<&'a (dyn std::error::Error + 'static)>,
) -> Option<&'a (dyn std::error::Error + 'static)> {
    error.and_then(std::error::Error::source)
}

// How requests and answers are written and read.

/// The end of the range of keys that start with `prefix`: `prefix` with its last byte below
/// 0xff raised by one (etcd's `\0`, "every key from the start on", when there is none).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A read of `key` alone.
pub(crate) fn get(key: impl Into<Vec<u8>>) -> RangeRequest {
    RangeRequest {
        key: key.into(),
        ..RangeRequest::default()
    }
}

/// A read of every key that starts with `prefix`.
pub(crate) fn get_prefix(prefix: impl Into<Vec<u8>>) -> RangeRequest {
    let key = prefix.into();
    RangeRequest {
        range_end: prefix_end(&key),
        key,
        ..RangeRequest::default()
    }
}

/// A read of the contender with the lowest (`Ascend`) or highest (`Descend`) create
/// revision among `read`'s keys.
pub(crate) fn by_creation(read: RangeRequest, order: range_request::SortOrder) -> RangeRequest {
    RangeRequest {
        sort_target: range_request::SortTarget::Create.into(),
        sort_order: order.into(),
        limit: 1,
        ..read
    }
}

/// A put of `key` with `value`, under `lease` (0: none).
pub(crate) fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> PutRequest {
    PutRequest {
        key: key.into(),
        value: value.into(),
        lease,
        ..PutRequest::default()
    }
}

/// A deletion of `key` alone.
pub(crate) fn delete(key: impl Into<Vec<u8>>) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: key.into(),
        ..DeleteRangeRequest::default()
    }
}

/// A request of a watch stream that sets up a watch.
pub(crate) fn watch_create(watch: WatchCreateRequest) -> WatchRequest {
    WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(watch)),
    }
}

pub(crate) fn op_get(read: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(read)),
    }
}

pub(crate) fn op_put(write: PutRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(write)),
    }
}

pub(crate) fn op_delete(delete: DeleteRangeRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(delete)),
    }
}

/// A comparison of `key`'s create revision with `revision` (0: the key is absent).
pub(crate) fn created(
    key: impl Into<Vec<u8>>,
    result: compare::CompareResult,
    revision: i64,
) -> Compare {
    Compare {
        result: result.into(),
        target: compare::CompareTarget::Create.into(),
        key: key.into(),
        target_union: Some(compare::TargetUnion::CreateRevision(revision)),
        range_end: Vec::new(),
    }
}

/// A comparison of `key`'s modification revision with `revision` (0: the key is absent).
pub(crate) fn modified(
    key: impl Into<Vec<u8>>,
    result: compare::CompareResult,
    revision: i64,
) -> Compare {
    Compare {
        result: result.into(),
        target: compare::CompareTarget::Mod.into(),
        key: key.into(),
        target_union: Some(compare::TargetUnion::ModRevision(revision)),
        range_end: Vec::new(),
    }
}

/// A transaction: `then` when every one of `when` holds, else `otherwise`.
pub(crate) fn txn(
    when: impl IntoIterator<Item = Compare>,
    then: impl IntoIterator<Item = RequestOp>,
    otherwise: impl IntoIterator<Item = RequestOp>,
) -> TxnRequest {
    TxnRequest {
        compare: when.into_iter().collect(),
        success: then.into_iter().collect(),
        failure: otherwise.into_iter().collect(),
    }
}

/// The first key-value of the `index`th answer of a transaction, if that answer is a read
/// that found one.
pub(crate) fn read_kv(responses: &[ResponseOp], index: usize) -> Option<&KeyValue> {
    match responses.get(index)?.response.as_ref()? {
        response_op::Response::ResponseRange(read) => read.kvs.first(),
        _ => None,
    }
}

/// The revision of the store an answer was made at (0 without a header).
pub(crate) fn revision_of(header: Option<&super::api::etcdserverpb::ResponseHeader>) -> i64 {
    header.map_or(0, |header| header.revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_end_after_their_prefix() {
        assert_eq!(prefix_end(b"ab"), b"ac");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b""), b"\0");
    }
}
