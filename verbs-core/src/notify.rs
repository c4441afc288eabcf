//! CQ notification requests with NetworkDirect semantics (Microsoft Learn,
//! `IND2CompletionQueue::Notify`): "complete when this CQ gets an event — any completion, a
//! solicited one, or an error — or is destroyed".
//!
//! * All pending requests complete on the next event; a CQ error satisfies every kind.
//! * [`NotifyKind::Errors`] requests complete only on a CQ error (or destroy, or device failure).
//! * An `Any` request upgrades a pending solicited-only arming.
//! * Destroying the CQ completes every pending request with [`NotifyError::Cancelled`].
//!
//! A [`NotifyRequest`] is a `Future`; it is completed by whoever processes the CQ's event queue
//! (a platform layer reacting to the interrupt, or [`crate::Cq::process_events`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::context::lock;
use crate::error::NotifyError;

/// What a request waits for (ND `ND_CQ_NOTIFY_*` / WinVerbs `WvCq*` types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotifyKind {
    /// Only a CQ error.
    Errors,
    /// The next completion.
    Any,
    /// The next solicited receive (or error) completion.
    Solicited,
}

#[derive(Debug, Default)]
struct ReqState {
    result: Option<Result<(), NotifyError>>,
    waker: Option<Waker>,
}

/// The shared half of a request, held by the CQ until it completes.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) kind: NotifyKind,
    state: Mutex<ReqState>,
}

impl Request {
    pub(crate) fn new(kind: NotifyKind) -> Arc<Self> {
        Arc::new(Self {
            kind,
            state: Mutex::new(ReqState::default()),
        })
    }

    pub(crate) fn done(kind: NotifyKind, result: Result<(), NotifyError>) -> Arc<Self> {
        let r = Self::new(kind);
        r.complete(result);
        r
    }

    /// Completes the request (first completion wins) and wakes its waiter.
    pub(crate) fn complete(&self, result: Result<(), NotifyError>) {
        let waker = {
            let mut s = lock(&self.state);
            if s.result.is_some() {
                return;
            }
            s.result = Some(result);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A pending CQ notification; resolves to `Ok(())` when the CQ got an event.
#[must_use = "a notification request does nothing unless awaited or checked"]
pub struct NotifyRequest {
    pub(crate) req: Arc<Request>,
}

impl fmt::Debug for NotifyRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotifyRequest")
            .field("kind", &self.req.kind)
            .field("result", &self.try_result())
            .finish()
    }
}

impl NotifyRequest {
    /// What the request waits for.
    pub fn kind(&self) -> NotifyKind {
        self.req.kind
    }

    /// The outcome, once complete.
    pub fn try_result(&self) -> Option<Result<(), NotifyError>> {
        lock(&self.req.state).result
    }

    /// True once complete.
    pub fn is_complete(&self) -> bool {
        self.try_result().is_some()
    }
}

impl Future for NotifyRequest {
    type Output = Result<(), NotifyError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = lock(&self.req.state);
        match s.result {
            Some(r) => Poll::Ready(r),
            None => {
                match &s.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => s.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}
