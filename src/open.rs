//! Opening a device so that its event queues interrupt the host OS's own mechanism.

use std::sync::Arc;

use portverbs_verbs::{ContextOptions, OpenError, SinkFactory};

use crate::{AnyDevice, Context};

/// The interrupt sinks of this OS: an eventfd per event queue on Linux
/// (`portverbs::linux::LinuxSinks`), so that threads block in poll(2), tasks
/// wake from tokio's reactor (feature `tokio`) and VFIO hardware signals the same fds; a
/// private I/O completion port per event queue on Windows (`portverbs_windows::WindowsSinks`),
/// so that threads sleep in `GetQueuedCompletionStatusEx`; a latch per event queue elsewhere
/// ([`portverbs_verbs::LatchSinks`]), which blocks and wakes with the software and emulated
/// devices.
///
/// # Errors
/// The OS could not provide them ([`OpenError::Sinks`]: out of file descriptors or handles).
pub fn platform_sinks() -> Result<Arc<dyn SinkFactory>, OpenError> {
    #[cfg(target_os = "linux")]
    {
        Ok(portverbs_linux::LinuxSinks::new().map_err(OpenError::Sinks)?)
    }
    #[cfg(windows)]
    {
        Ok(portverbs_windows::WindowsSinks::new().map_err(OpenError::Sinks)?)
    }
    #[cfg(not(any(target_os = "linux", windows)))]
    {
        Ok(Arc::new(portverbs_verbs::LatchSinks))
    }
}

/// The options [`open`] uses: [`platform_sinks`] and the default event-queue size. For
/// opening from `async` code:
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # portverbs::backends::hal::block_on(async {
/// let dev = portverbs::device("soft0").expect("the embedded fabric has soft0");
/// let ctx = portverbs::Context::open(dev, portverbs::context_options()?).await?;
/// assert_eq!(ctx.name(), "soft0");
/// # Ok(()) })
/// # }
/// ```
///
/// # Errors
/// As [`platform_sinks`].
pub fn context_options() -> Result<ContextOptions, OpenError> {
    Ok(ContextOptions {
        sinks: platform_sinks()?,
        ..ContextOptions::default()
    })
}

/// Opens a device (`ibv_open_device`) with [`platform_sinks`]: its completion channels,
/// notify requests and asynchronous events can be read without blocking, waited for on the
/// calling thread, or awaited, on any OS. Blocking; see [`context_options`] for `async` code.
///
/// ```
/// use std::time::Duration;
/// use portverbs::verbs::WaitError;
///
/// let ctx = portverbs::open(portverbs::device("soft1").unwrap()).unwrap();
/// let chan = ctx.create_comp_channel().unwrap();
/// // Nothing is armed, so the wait runs out.
/// let idle = chan.wait_cq_event(Some(Duration::from_millis(1)));
/// assert!(matches!(idle, Err(WaitError::TimedOut)));
/// ```
///
/// # Errors
/// The OS could not provide the sinks, or a device command failed.
pub fn open(dev: impl Into<AnyDevice>) -> Result<Context, OpenError> {
    Context::open_blocking(dev.into(), context_options()?)
}
