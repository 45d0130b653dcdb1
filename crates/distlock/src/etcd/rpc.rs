//! The connection to an etcd cluster: one gRPC channel balanced over the URL's servers, and
//! the calls of etcd's API the backend makes, each asking for a server that has a leader.

use std::time::Duration;

use futures_util::stream;
use tokio::sync::mpsc;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
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

/// A server's answer, or the gRPC status it failed with.
pub(crate) type Answer<T> = std::result::Result<T, Status>;

/// How many requests of one stream wait to be sent at most.
const STREAM_BUFFER: usize = 64;

/// How long connecting to a server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the connection to a server is checked while idle (HTTP/2 pings), and how long
/// a ping may go unanswered before the connection counts as broken.
const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// The gRPC channel to the cluster; cheap to clone.
#[derive(Clone)]
pub(crate) struct Rpc {
    channel: Channel,
}

/// Marks a request so that a server without a leader refuses it (etcd's `hasleader`
/// metadata) instead of serving it from a member cut off from the cluster; a watch stream
/// so marked is ended by the server when it loses its leader.
fn ask<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("hasleader", MetadataValue::from_static("true"));
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

impl Rpc {
    /// A channel balanced over `endpoints` (`http://host:port`). It connects lazily: the
    /// first request finds out whether a server answers.
    ///
    /// # Errors
    /// An endpoint that is not a valid URI, as text for the caller's error.
    pub(crate) fn new(endpoints: &[String]) -> Result<Rpc, String> {
        let (channel, changes) = Channel::balance_channel(endpoints.len().max(1));
        for endpoint in endpoints {
            let target = Endpoint::from_shared(endpoint.clone())
                .map_err(|e| format!("{endpoint}: {e}"))?
                .connect_timeout(CONNECT_TIMEOUT)
                .http2_keep_alive_interval(KEEP_ALIVE)
                .keep_alive_timeout(KEEP_ALIVE)
                .keep_alive_while_idle(true);
            changes
                .try_send(tonic::transport::channel::Change::Insert(
                    endpoint.clone(),
                    target,
                ))
                .map_err(|e| format!("{endpoint}: {e}"))?;
        }
        Ok(Rpc { channel })
    }

    pub(crate) async fn range(&self, request: RangeRequest) -> Answer<RangeResponse> {
        KvClient::new(self.channel.clone())
            .range(ask(request))
            .await
            .map(Response::into_inner)
    }

    #[cfg(feature = "bench")]
    pub(crate) async fn put(&self, request: PutRequest) -> Answer<PutResponse> {
        KvClient::new(self.channel.clone())
            .put(ask(request))
            .await
            .map(Response::into_inner)
    }

    #[cfg(feature = "bench")]
    pub(crate) async fn delete_range(
        &self,
        request: DeleteRangeRequest,
    ) -> Answer<DeleteRangeResponse> {
        KvClient::new(self.channel.clone())
            .delete_range(ask(request))
            .await
            .map(Response::into_inner)
    }

    pub(crate) async fn txn(&self, request: TxnRequest) -> Answer<TxnResponse> {
        KvClient::new(self.channel.clone())
            .txn(ask(request))
            .await
            .map(Response::into_inner)
    }

    pub(crate) async fn lease_grant(&self, ttl_seconds: i64) -> Answer<LeaseGrantResponse> {
        let request = LeaseGrantRequest {
            ttl: ttl_seconds,
            id: 0,
        };
        LeaseClient::new(self.channel.clone())
            .lease_grant(ask(request))
            .await
            .map(Response::into_inner)
    }

    pub(crate) async fn lease_revoke(&self, lease: i64) -> Answer<()> {
        LeaseClient::new(self.channel.clone())
            .lease_revoke(ask(LeaseRevokeRequest { id: lease }))
            .await
            .map(drop)
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
        let (sender, messages) = requests(LeaseKeepAliveRequest { id: lease });
        let answers = LeaseClient::new(self.channel.clone())
            .lease_keep_alive(ask(messages))
            .await?
            .into_inner();
        Ok((sender, answers))
    }

    /// Opens a watch stream with `first` as its first request and waits for the server to
    /// answer it (the watch is then set up: every later change is in the stream).
    ///
    /// # Errors
    /// The stream's failure; a stream that ends or answers something else first fails with
    /// `Status::unavailable`.
    pub(crate) async fn watch(
        &self,
        first: WatchRequest,
    ) -> Answer<(Requests<WatchRequest>, Streaming<WatchResponse>)> {
        let (sender, messages) = requests(first);
        let mut answers = WatchClient::new(self.channel.clone())
            .watch(ask(messages))
            .await?
            .into_inner();
        match answers.message().await? {
            Some(answer) if answer.created => Ok((sender, answers)),
            Some(answer) => Err(Status::unavailable(format!(
                "the server answered a new watch with no creation (cancelled: {}, {})",
                answer.canceled, answer.cancel_reason
            ))),
            None => Err(Status::unavailable("the watch stream ended at once")),
        }
    }
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
