//! The backend's ZooKeeper session as the requests see it: the current one, its errors,
//! waiting for it to connect, and catching its server up with the leader before a read.

use super::*;

impl Shared {
    pub(super) fn session(&self) -> Arc<Session> {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub(super) fn err(&self, operation: &'static str, error: zk::Error) -> Error {
        zk_error(self.scheme, operation, error)
    }

    /// Makes this session's server catch up with the leader before a read (`sync`). Reads
    /// are answered by the server a session talks to, which may be a follower behind: a read
    /// about another session's nodes needs this to see what that session was told is done.
    /// A missing `path` is no error: the read that follows will say so.
    pub(super) async fn catch_up(
        &self,
        session: &Session,
        path: &str,
        operation: &'static str,
    ) -> Result<()> {
        match session.client.sync(path).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(self.err(operation, e)),
        }
    }

    /// Waits until `session` is connected, at most a session timeout.
    pub(super) async fn connected(&self, session: &Session) -> Result<()> {
        let mut watcher = session.client.state_watcher();
        let deadline = Instant::now() + session.client.session_timeout();
        loop {
            match watcher.state() {
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                    return Ok(());
                }
                zk::SessionState::Disconnected => {
                    if tokio::time::timeout_at(deadline, watcher.changed())
                        .await
                        .is_err()
                    {
                        return Err(self.err("reconnect", zk::Error::ConnectionLoss));
                    }
                }
                state => return Err(self.err("reconnect", state_error(state))),
            }
        }
    }
}
