//! Cancel safety without a task per request.
//!
//! A backend request that changes state (an acquire that may grant, a release) must not be
//! cut in half by a caller who drops the future: a grant nobody knows of would hold the lock
//! until its lease ends. [`FinishOnDrop`] polls the request in place, which costs nothing on
//! the normal path; if it is dropped before the request completes, it moves the rest of the
//! request into a background task and hands the result to a clean-up step.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type CleanUp<T> = Box<dyn FnOnce(T) -> BoxFuture<()> + Send + 'static>;

/// A request that finishes even when its caller stops waiting for it.
pub(crate) struct FinishOnDrop<T: Send + 'static> {
    request: Option<BoxFuture<T>>,
    clean_up: Option<CleanUp<T>>,
}

impl<T: Send + 'static> FinishOnDrop<T> {
    /// `clean_up` receives the request's result when the caller dropped this future first.
    pub(crate) fn new<F, C, CF>(request: F, clean_up: C) -> Self
    where
        F: Future<Output = T> + Send + 'static,
        C: FnOnce(T) -> CF + Send + 'static,
        CF: Future<Output = ()> + Send + 'static,
    {
        FinishOnDrop {
            request: Some(Box::pin(request)),
            clean_up: Some(Box::new(move |result| Box::pin(clean_up(result)))),
        }
    }
}

impl<T: Send + 'static> Future for FinishOnDrop<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(request) = self.request.as_mut() else {
            // Polled after completion: a caller bug, never reached by this crate's callers.
            return Poll::Pending;
        };
        match request.as_mut().poll(cx) {
            Poll::Ready(result) => {
                self.request = None;
                self.clean_up = None;
                Poll::Ready(result)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        let (Some(request), Some(clean_up)) = (self.request.take(), self.clean_up.take()) else {
            return;
        };
        if !crate::cleanup::spawn(async move { clean_up(request.await).await }) {
            tracing::warn!(
                "a lock request was dropped outside a Tokio runtime; what it did stands until \
                 its lease ends"
            );
        }
    }
}
