//! The completion channel of `pingpong -e`. On Linux it is an eventfd (platform-linux's
//! [`CompChannel`](portverbs::linux::CompChannel)) and waiting blocks in poll(2), as
//! `ibv_get_cq_event` does on a blocking channel; elsewhere, until the Windows platform layer
//! exists, the channel is read in a polling loop.

use portverbs::prelude::*;

use crate::error::{CliError, Context as _};
use crate::wait::Waiter;

/// How long one blocking wait lasts before the stall and peer checks run.
#[cfg(target_os = "linux")]
const SLICE: std::time::Duration = std::time::Duration::from_millis(100);

/// A completion channel to wait on.
#[derive(Debug)]
pub(crate) struct EventChannel {
    #[cfg(target_os = "linux")]
    inner: portverbs::linux::CompChannel<AnyDevice>,
    #[cfg(not(target_os = "linux"))]
    inner: CompletionChannel,
}

impl EventChannel {
    /// A channel on `ctx`.
    pub(crate) fn new(ctx: &Context) -> Result<Self, CliError> {
        #[cfg(target_os = "linux")]
        let inner = portverbs::linux::CompChannel::new(ctx)
            .ctx("creating the completion channel (eventfd)")?;
        #[cfg(not(target_os = "linux"))]
        let inner = ctx
            .create_comp_channel(std::sync::Arc::new(portverbs::hal::NullSink))
            .ctx("creating the completion channel")?;
        Ok(Self { inner })
    }

    /// The verbs channel, for [`CqInit::channel`].
    pub(crate) fn channel(&self) -> &CompletionChannel {
        #[cfg(target_os = "linux")]
        return self.inner.channel();
        #[cfg(not(target_os = "linux"))]
        return &self.inner;
    }

    /// Waits for the next CQ event and returns its CQ (not yet acknowledged).
    pub(crate) fn next(&self, waiter: &mut Waiter<'_>) -> Result<Cq, CliError> {
        loop {
            #[cfg(target_os = "linux")]
            match self.inner.wait(Some(SLICE)) {
                Ok(cq) => return Ok(cq),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => waiter.check_now()?,
                Err(e) => return Err(e).ctx("waiting on the completion channel"),
            }
            #[cfg(not(target_os = "linux"))]
            match self
                .inner
                .get_event()
                .ctx("reading the completion channel")?
            {
                Some(cq) => return Ok(cq),
                None => waiter.idle()?,
            }
        }
    }
}
