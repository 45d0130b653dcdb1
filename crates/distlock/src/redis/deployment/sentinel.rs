//! A Sentinel deployment: the master the sentinels name, followed across failovers.

use super::*;

/// A connection that follows a Sentinel group's master.
///
/// The `redis` crate's connection manager reconnects to the address it was given, which after
/// a failover is a replica (or nothing). This asks the sentinels for the master, checks that
/// the server it reaches calls itself master, and asks again whenever the connection breaks or
/// the server answers READONLY (it was demoted). A command refused with READONLY changed
/// nothing, so it is sent once more to the new master; a command whose connection broke may
/// or may not have run, so its error goes to the caller (retrying an acquire could take a
/// second hold).
#[derive(Clone)]
pub(crate) struct Following {
    pub(crate) shared: Arc<FollowingShared>,
    pub(crate) db: i64,
}

pub(crate) struct FollowingShared {
    pub(crate) sentinel: tokio::sync::Mutex<SentinelClient>,
    /// How each sentinel is reached, its login included: asked directly when a refusal could
    /// be the sentinels' or the master's.
    sentinels: Vec<redis::ConnectionInfo>,
    /// The current master: its client (for pub/sub) and command connection, with a number
    /// that changes at each rediscovery.
    pub(crate) current: StdMutex<Option<Master>>,
}

#[derive(Clone)]
pub(crate) struct Master {
    pub(crate) generation: u64,
    pub(crate) client: redis::Client,
    pub(crate) connection: MultiplexedConnection,
}

pub(crate) fn is_demoted(error: &redis::RedisError) -> bool {
    matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

pub(crate) fn is_broken(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
        || error.is_timeout()
}

impl Following {
    /// Follows the master of `service` that the `sentinels` (`redis://host:port` each, logged
    /// in to with `sentinel_login`) name, logging in to it with `login`.
    pub(crate) fn new(
        sentinels: Vec<String>,
        service: &str,
        db: i64,
        login: &Login,
        sentinel_login: &Login,
    ) -> Result<Self> {
        let info = login.apply(redis::RedisConnectionInfo::default().set_db(db));
        let node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(info)
            .set_tcp_settings(tcp_settings());
        let sentinels = sentinels
            .iter()
            .map(|url| {
                let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())?;
                Ok(info
                    .set_redis_settings(sentinel_login.apply(redis::RedisConnectionInfo::default()))
                    .set_tcp_settings(tcp_settings()))
            })
            .collect::<redis::RedisResult<Vec<_>>>()
            .map_err(bad_url)?;
        let sentinel = SentinelClient::build(
            sentinels.clone(),
            service,
            Some(node),
            SentinelServerType::Master,
        )
        .map_err(bad_url)?;
        Ok(Following {
            shared: Arc::new(FollowingShared {
                sentinel: tokio::sync::Mutex::new(sentinel),
                sentinels,
                current: StdMutex::new(None),
            }),
            db,
        })
    }

    /// The sentinels' refusal of this client's login to them, when every sentinel that
    /// answers refuses what the sentinel client asks (`ROLE`, `SENTINEL MASTERS`): tells a
    /// refused `sentinel_password=` (or `sentinel_user=`'s rights) from a refused master
    /// login, which the sentinel client reports alike.
    pub(crate) async fn sentinel_refusal(&self) -> Option<redis::RedisError> {
        refusal_of_all(
            self.shared.sentinels.clone(),
            &[&["ROLE"], &["SENTINEL", "MASTERS"]],
        )
        .await
    }

    pub(crate) fn current(&self) -> Option<Master> {
        self.shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The current master, asking the sentinels when there is none.
    pub(crate) async fn master(&self) -> redis::RedisResult<Master> {
        if let Some(master) = self.current() {
            return Ok(master);
        }
        // One discovery at a time; whoever waited behind it uses its result.
        let mut sentinel = self.shared.sentinel.lock().await;
        if let Some(master) = self.current() {
            return Ok(master);
        }
        // During a failover the sentinels may name no usable master for a moment (the old
        // one flagged down, the new one not yet announced): ask again for a while.
        let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        let client = loop {
            match sentinel.async_get_client().await {
                Ok(client) => break client,
                // Refusals too: the client reports any error reply to AUTH as one (a server
                // out of connections among them), and the last sentinel's error as the answer.
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "no redis master yet; asking the sentinels again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let mut slot = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let generation = slot.as_ref().map_or(0, |m| m.generation) + 1;
        let master = Master {
            generation,
            client,
            connection,
        };
        *slot = Some(master.clone());
        tracing::debug!(generation, "found the redis master through the sentinels");
        Ok(master)
    }

    /// Forgets the master of `generation` (not a newer one found meanwhile).
    pub(crate) fn forget(&self, generation: u64) {
        let mut slot = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|m| m.generation == generation) {
            tracing::info!("lost the redis master; asking the sentinels again");
            *slot = None;
        }
    }

    /// Forgets the current master, whichever it is.
    pub(crate) fn forget_current(&self) {
        if let Some(master) = self.current() {
            self.forget(master.generation);
        }
    }

    /// A client for the current master (for pub/sub connections).
    pub(crate) async fn master_client(&self) -> redis::RedisResult<redis::Client> {
        Ok(self.master().await?.client)
    }

    pub(crate) async fn command(&self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let mut master = self.master().await?;
        match master.connection.req_packed_command(cmd).await {
            Err(e) if is_demoted(&e) => {
                self.forget(master.generation);
                let mut master = self.master().await?;
                master.connection.req_packed_command(cmd).await
            }
            Err(e) => {
                if is_broken(&e) {
                    self.forget(master.generation);
                }
                Err(e)
            }
            ok => ok,
        }
    }

    pub(crate) async fn commands(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<Value>> {
        let mut master = self.master().await?;
        let result = master
            .connection
            .req_packed_commands(pipeline, offset, count)
            .await;
        if let Err(e) = &result
            && (is_broken(e) || is_demoted(e))
        {
            self.forget(master.generation);
        }
        result
    }
}
