//! What every blocking guard shares: the async guard it holds on the runtime, its loss
//! signal as a blocking wait, its release, and its release on drop.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::runtime::Runtime;
use crate::error::{Error, LossReason, Result};

/// An async guard of any primitive: what a blocking guard needs of it.
pub(crate) trait Hold: fmt::Debug + Send + Sync + 'static {
    /// Resolves when the hold is known lost.
    fn lost(&self) -> impl Future<Output = Error> + Send + '_;
    /// Why it was lost, once known.
    fn loss_reason(&self) -> Option<LossReason>;
    /// Gives the hold up and reports how it went.
    fn release(self) -> impl Future<Output = Result<()>> + Send + 'static;
}

/// `Hold` for async guards whose methods carry its names; `release` is the one that ends it.
macro_rules! hold {
    ($($guard:ident => $release:ident),+ $(,)?) => {$(
        impl Hold for crate::$guard {
            fn lost(&self) -> impl Future<Output = Error> + Send + '_ {
                crate::$guard::lost(self)
            }
            fn loss_reason(&self) -> Option<LossReason> {
                crate::$guard::loss_reason(self)
            }
            fn release(self) -> impl Future<Output = Result<()>> + Send + 'static {
                crate::$guard::$release(self)
            }
        }
    )+};
}

hold!(
    Guard => release,
    ReadGuard => release,
    WriteGuard => release,
    MultiGuard => release,
    Leadership => resign,
);

/// Declares a blocking guard that holds the async guard `$inner`: the struct (with the
/// attributes given), its `Debug`, and the loss methods every such guard has, documented for
/// `$what` (what is lost: "the read lock", "a part"), with `$after_loss` said after the loss
/// where there is more to say. The caller's module imports `Duration`,
/// `Error` and `LossReason`. [`Guard`](super::Guard) writes its own, with the long form of
/// their docs.
macro_rules! blocking_guard {
    ($(#[$attr:meta])* $name:ident($inner:ty), $what:literal $(, $after_loss:literal)?) => {
        $(#[$attr])*
        pub struct $name {
            held: $crate::blocking::held::Held<$inner>,
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                self.held.fmt(f)
            }
        }

        impl $name {
            #[doc = concat!("Blocks until ", $what, " is known lost.", $(" ", $after_loss,)?
                " See [`Guard::lost`](super::Guard::lost).")]
            pub fn lost(&self) -> Error {
                self.held.lost()
            }

            #[doc = concat!("Blocks at most `limit` until ", $what, " is known lost; `None` ",
                "when the limit passed first.")]
            pub fn lost_timeout(&self, limit: Duration) -> Option<Error> {
                self.held.lost_timeout(limit)
            }

            #[doc = concat!("True once the client knows ", $what, " is lost. Does not block.")]
            pub fn is_lost(&self) -> bool {
                self.held.loss_reason().is_some()
            }

            #[doc = concat!("Why ", $what, " was lost, once known. Does not block.")]
            pub fn loss_reason(&self) -> Option<LossReason> {
                self.held.loss_reason()
            }
        }
    };
}
pub(crate) use blocking_guard;

/// An async guard shared with the runtime's requests, which keeps the runtime running while
/// it lives. A request takes a clone of the `Arc` and gives it back before it answers (see
/// [`Runtime::call`]), so a release, which needs the caller to own the guard, finds it
/// unshared.
pub(crate) struct Held<G: Hold> {
    /// `None` once released or dropped.
    value: Option<Arc<G>>,
    runtime: Arc<Runtime>,
}

impl<G: Hold> fmt::Debug for Held<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(value) => value.fmt(f),
            None => f.write_str("(released)"),
        }
    }
}

impl<G: Hold> Held<G> {
    pub(crate) fn new(value: G, runtime: Arc<Runtime>) -> Self {
        Held {
            value: Some(Arc::new(value)),
            runtime,
        }
    }

    pub(crate) fn get(&self) -> &G {
        self.shared()
    }

    fn shared(&self) -> &Arc<G> {
        // Taken only by `finish(self)` and `Drop`, after which no method can be called.
        self.value
            .as_ref()
            .expect("the guard is present until it is released or dropped")
    }

    pub(crate) fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// Runs `request` on the runtime with a share of the guard, and waits for its answer.
    pub(crate) fn call<T, F, Fut>(&self, operation: &'static str, request: F) -> Result<T>
    where
        F: FnOnce(Arc<G>) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        self.runtime
            .call(operation, request(Arc::clone(self.shared())))
    }

    /// Waits without a limit until the hold is known lost.
    pub(crate) fn lost(&self) -> Error {
        self.call("wait for the lock's loss", |held| async move {
            Ok(held.lost().await)
        })
        .unwrap_or_else(|error| error)
    }

    /// Waits at most `limit` for the hold to be known lost.
    pub(crate) fn lost_timeout(&self, limit: Duration) -> Option<Error> {
        let waited = self.call("wait for the lock's loss", move |held| async move {
            Ok(tokio::time::timeout(limit, held.lost()).await.ok())
        });
        waited.unwrap_or_else(Some)
    }

    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        self.get().loss_reason()
    }

    /// Ends the hold with `finish` (a release) on the runtime, and waits for its answer.
    pub(crate) fn finish<F, Fut>(mut self, operation: &'static str, finish: F) -> Result<()>
    where
        F: FnOnce(G) -> Fut,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let Some(shared) = self.value.take() else {
            return Ok(());
        };
        match Arc::try_unwrap(shared) {
            Ok(held) => self.runtime.call(operation, finish(held)),
            // Not reached (every request gives its share back before it answers), but if it
            // were, the last share drops the guard, which releases in the background.
            Err(shared) => {
                self.runtime.drop_in(shared);
                Err(Error::backend(
                    self.runtime.scheme(),
                    operation,
                    "a request that did not finish still holds the guard; it is released in \
                     the background once that request ends",
                ))
            }
        }
    }

    /// Releases the hold and reports how it went.
    pub(crate) fn release(self, operation: &'static str) -> Result<()> {
        self.finish(operation, G::release)
    }
}

impl<G: Hold> Drop for Held<G> {
    fn drop(&mut self) {
        let Some(shared) = self.value.take() else {
            return;
        };
        match Arc::try_unwrap(shared) {
            Ok(held) => self.runtime.spawn_background(async move {
                match held.release().await {
                    Ok(()) => tracing::debug!("released on drop"),
                    Err(error) if error.is_lock_lost() || error.is_not_owner() => {
                        tracing::debug!(%error, "dropped a guard whose lock was lost");
                    }
                    Err(error) => tracing::warn!(
                        %error,
                        "release on drop failed; the lock frees when its lease ends"
                    ),
                }
            }),
            Err(shared) => self.runtime.drop_in(shared),
        }
    }
}
