//! The etcd user a client authenticates as: its credentials, the token the cluster gave for
//! them (sent with every request), a new token when the cluster no longer takes the old one,
//! and what the cluster's refusals mean.

use std::sync::Mutex as StdMutex;

use tokio::sync::Mutex as AsyncMutex;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use super::api::etcdserverpb::{AuthenticateRequest, auth_client::AuthClient};
use super::rpc::Answer;
use crate::scheme::Credentials;

/// The metadata key etcd reads a request's token from.
const TOKEN_KEY: &str = "token";

/// A token the cluster gave, and its generation: how many tokens this client took before it.
#[derive(Clone)]
pub(crate) struct Token {
    generation: u64,
    value: AsciiMetadataValue,
}

impl Token {
    /// How many tokens the client took before this one.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Puts the token on `request`.
    pub(crate) fn sign<T>(&self, request: &mut Request<T>) {
        request.metadata_mut().insert(TOKEN_KEY, self.value.clone());
    }
}

/// A user of the cluster, and its current token.
pub(crate) struct Auth {
    credentials: Credentials,
    token: StdMutex<Option<Token>>,
    /// Held while a token is asked for, so that many refusals of one token make one request.
    renewing: AsyncMutex<()>,
}

impl Auth {
    pub(crate) fn new(credentials: Credentials) -> Auth {
        Auth {
            credentials,
            token: StdMutex::new(None),
            renewing: AsyncMutex::new(()),
        }
    }

    fn current(&self) -> Option<Token> {
        // Nothing panics while the lock is held: a poisoned lock is whole.
        self.token
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The current token, asked for when the client has none yet.
    pub(crate) async fn token(&self, channel: &Channel) -> Answer<Token> {
        match self.current() {
            Some(token) => Ok(token),
            None => self.renew(channel, None).await,
        }
    }

    /// A token other than the one of generation `stale` (which the cluster refused), asked
    /// for unless another request already has.
    pub(crate) async fn renew(&self, channel: &Channel, stale: Option<u64>) -> Answer<Token> {
        let _alone = self.renewing.lock().await;
        if let Some(token) = self.current()
            && stale != Some(token.generation)
        {
            return Ok(token);
        }
        let mut request = Request::new(AuthenticateRequest {
            name: self.credentials.user.clone(),
            password: self.credentials.password.clone(),
        });
        request.metadata_mut().insert(
            "hasleader",
            tonic::metadata::MetadataValue::from_static("true"),
        );
        let answer = AuthClient::new(channel.clone())
            .authenticate(request)
            .await?
            .into_inner();
        let mut value = AsciiMetadataValue::try_from(answer.token)
            .map_err(|_| Status::internal("the cluster answered a token that is not ASCII"))?;
        // Kept out of HTTP/2 header compression, and shown as "Sensitive" by `Debug`.
        value.set_sensitive(true);
        let mut slot = self
            .token
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let generation = slot.as_ref().map_or(0, |old| old.generation + 1);
        let token = Token { generation, value };
        *slot = Some(token.clone());
        Ok(token)
    }
}

/// True when `status` says the cluster no longer takes the request's token (a simple token
/// unused for its TTL, a JWT past its expiry, or a token older than a change to the users and
/// roles): a new token may pass.
pub(crate) fn token_refused(status: &Status) -> bool {
    status.code() == Code::Unauthenticated
        || status.message().contains("revision of auth store is old")
}

/// What a refusal of the cluster means for the user, and what to do: `None` when `status` is
/// no refusal.
pub(crate) fn refusal(status: &Status) -> Option<&'static str> {
    let message = status.message();
    let reason = if status.code() == Code::PermissionDenied || message.contains("permission denied")
    {
        "the user may not read or write these keys: grant its role readwrite on the URL's key \
         prefix (etcdctl role grant-permission ROLE --prefix=true readwrite PREFIX)"
    } else if message.contains("authentication failed") {
        "the cluster refused the user or the password of the URL"
    } else if message.contains("user name is empty") {
        "the cluster has authentication on: name a user in the URL \
         (etcd://user:password@host/...) or present a client certificate whose common name is one"
    } else if message.contains("user name not found") {
        "no user of the cluster has the name of the URL, or of the client certificate's \
         common name"
    } else if message.contains("role is not granted")
        || message.contains("permission is not granted")
    {
        "the user has no role that grants these keys"
    } else if message.contains("authentication is not enabled") {
        "the URL names a user, but the cluster has authentication off, so anyone who reaches it \
         may change the locks: turn it on (etcdctl auth enable) or drop the user from the URL"
    } else if status.code() == Code::Unauthenticated {
        "the cluster refused the client's token, and a new one too"
    } else {
        return None;
    };
    Some(reason)
}

#[cfg(test)]
mod tests {
    use super::super::api::etcdserverpb::{AuthenticateRequest, AuthenticateResponse};
    use super::*;

    #[test]
    fn the_messages_that_carry_secrets_show_none() {
        let request = AuthenticateRequest {
            name: "app".to_owned(),
            password: "s3cret".to_owned(),
        };
        let shown = format!("{request:?}");
        assert!(
            shown.contains("app") && !shown.contains("s3cret"),
            "{shown}"
        );
        let answer = AuthenticateResponse {
            header: None,
            token: "tok3n".to_owned(),
        };
        assert!(!format!("{answer:?}").contains("tok3n"));
    }

    #[test]
    fn refusals_say_what_to_change() {
        let wrong = Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password",
        );
        assert!(refusal(&wrong).is_some_and(|why| why.contains("password")));
        assert!(!token_refused(&wrong));
        let expired = Status::unauthenticated("etcdserver: invalid auth token");
        assert!(token_refused(&expired));
        let old = Status::invalid_argument("etcdserver: revision of auth store is old");
        assert!(token_refused(&old));
        let denied = Status::permission_denied("etcdserver: permission denied");
        assert!(refusal(&denied).is_some_and(|why| why.contains("grant-permission")));
        assert!(refusal(&Status::unavailable("connection refused")).is_none());
    }
}
