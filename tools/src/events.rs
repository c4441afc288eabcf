//! Completion channels: `pingpong -e` sleeps in one as `ibv_get_cq_event` does on a blocking
//! channel, and the waits of `rping` and of `perf -R`'s side channel sleep in one between
//! their looks at the peer instead of spinning. The facade opens contexts with the platform's
//! sinks (an eventfd in poll(2) on Linux, a latch elsewhere), so the same call blocks
//! everywhere.

use std::time::Duration;

use portverbs::prelude::*;
use portverbs::verbs::WaitError;

use crate::error::{CliError, Context as _};
use crate::wait::Waiter;

/// How long one blocking wait lasts before the stall and peer checks run.
pub(crate) const SLICE: Duration = Duration::from_millis(100);

/// A completion channel to wait on.
#[derive(Debug)]
pub(crate) struct EventChannel {
    inner: CompletionChannel,
}

impl EventChannel {
    /// A channel on `ctx`.
    pub(crate) fn new(ctx: &Context) -> Result<Self, CliError> {
        let inner = ctx
            .create_comp_channel()
            .ctx("creating the completion channel")?;
        Ok(Self { inner })
    }

    /// The verbs channel, for [`CqInit::channel`].
    pub(crate) fn channel(&self) -> &CompletionChannel {
        &self.inner
    }

    /// Sleeps until one of the channel's CQs gets a completion (after `cq.req_notify`, and a
    /// poll that found nothing) or `slice` has passed; acknowledges the event.
    ///
    /// # Errors
    /// The channel failed.
    pub(crate) fn sleep(&self, slice: Duration) -> Result<(), CliError> {
        match self.inner.wait_cq_event(Some(slice)) {
            Ok(cq) => {
                cq.ack_events(1);
                Ok(())
            }
            Err(WaitError::TimedOut) => Ok(()),
            Err(e) => Err(e).ctx("waiting on the completion channel"),
        }
    }

    /// Waits for the next CQ event and returns its CQ (not yet acknowledged).
    pub(crate) fn next(&self, waiter: &mut Waiter<'_>) -> Result<Cq, CliError> {
        loop {
            match self.inner.wait_cq_event(Some(SLICE)) {
                Ok(cq) => return Ok(cq),
                Err(WaitError::TimedOut) => waiter.check_now()?,
                Err(e) => return Err(e).ctx("waiting on the completion channel"),
            }
        }
    }
}
