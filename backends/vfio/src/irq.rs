//! MSI and MSI-X: each vector signals the eventfd of an [`InterruptSink`].
//!
//! Routing hands the sink's eventfd ([`InterruptSink::eventfd`], platform-linux's `EventFdSink`)
//! to the kernel with `VFIO_DEVICE_SET_IRQS` (`DATA_EVENTFD | ACTION_TRIGGER`). From then on the
//! kernel's interrupt handler signals that eventfd itself: there is no thread of ours, no
//! polling, and the application waits on the fd exactly as it waits for a software device's
//! completion events (epoll, tokio, poll(2)).
//!
//! The kernel fixes the number of vectors when an index is first enabled (`start + count` of
//! that call) and, before Linux 6.5, refuses to grow it later. So routing a vector beyond the
//! enabled count re-enables the whole index with every route known so far: the device gets a
//! short window without MSI-X. Route every vector before the device can raise interrupts (at
//! the latest before its event queues are armed), highest vector first if possible.
//!
//! VFIO enables one of MSI and MSI-X at a time; routing one while the other is enabled is an
//! error ([`VfioError::IrqKindBusy`]) rather than a silent switch.

use std::sync::{Arc, MutexGuard, PoisonError};

use portverbs_hal::notify::InterruptSink;

use crate::device::VfioDevice;
use crate::error::{IrqKind, VfioError};
use crate::sys;

/// The routes of one IRQ index.
#[derive(Debug, Default)]
struct Routes {
    /// Vectors the kernel has enabled (0: the index is disabled).
    enabled: u32,
    /// Sink of each vector; the `Arc` keeps its eventfd open while the kernel may signal it,
    /// and lets a re-enable hand the same fd again.
    sinks: Vec<Option<Arc<dyn InterruptSink>>>,
}

impl Routes {
    /// The eventfds of vectors `0..n` (-1 where nothing is routed).
    fn fds(&self, n: u32) -> Vec<i32> {
        (0..n as usize)
            .map(|v| {
                self.sinks
                    .get(v)
                    .and_then(Option::as_ref)
                    .and_then(|s| s.eventfd())
                    .unwrap_or(-1)
            })
            .collect()
    }
}

/// MSI and MSI-X routes of a device.
#[derive(Debug, Default)]
pub(crate) struct IrqRoutes {
    msi: Routes,
    msix: Routes,
}

impl IrqRoutes {
    fn of(&mut self, kind: IrqKind) -> &mut Routes {
        match kind {
            IrqKind::Msi => &mut self.msi,
            IrqKind::Msix => &mut self.msix,
        }
    }
}

impl VfioDevice {
    fn routes(&self) -> MutexGuard<'_, IrqRoutes> {
        // Every update below leaves the table consistent before it can fail.
        self.irqs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many vectors of `kind` the function has (0 when it has no such capability).
    pub fn irq_count(&self, kind: IrqKind) -> u32 {
        self.inner
            .dev
            .get_irq_info(kind.index())
            .map_or(0, |irq| irq.count)
    }

    /// Routes MSI-X `vector` to `sink`'s eventfd. See the module documentation.
    ///
    /// # Errors
    /// [`VfioError::NoSuchVector`], [`VfioError::NoEventFd`] (the sink is not an eventfd),
    /// [`VfioError::IrqKindBusy`] (MSI is enabled), [`VfioError::SetIrqs`].
    pub fn route_msix(&self, vector: u32, sink: &Arc<dyn InterruptSink>) -> Result<(), VfioError> {
        self.route(IrqKind::Msix, vector, sink)
    }

    /// Routes MSI `vector` to `sink`'s eventfd. See the module documentation.
    ///
    /// # Errors
    /// As [`VfioDevice::route_msix`].
    pub fn route_msi(&self, vector: u32, sink: &Arc<dyn InterruptSink>) -> Result<(), VfioError> {
        self.route(IrqKind::Msi, vector, sink)
    }

    fn route(
        &self,
        kind: IrqKind,
        vector: u32,
        sink: &Arc<dyn InterruptSink>,
    ) -> Result<(), VfioError> {
        let addr = || self.inner.addr.clone();
        let count = self.irq_count(kind);
        if vector >= count {
            return Err(VfioError::NoSuchVector {
                addr: addr(),
                kind,
                vector,
                count,
            });
        }
        let fd = sink.eventfd().ok_or_else(|| VfioError::NoEventFd {
            addr: addr(),
            kind,
            vector,
        })?;
        let mut table = self.routes();
        if table.of(kind.other()).enabled > 0 {
            return Err(VfioError::IrqKindBusy {
                addr: addr(),
                kind,
                vector,
                active: kind.other(),
            });
        }
        let fd_of = sys::device_fd(&self.inner.dev);
        let routes = table.of(kind);
        let set_err = |start: u32, n: u32, source| VfioError::SetIrqs {
            addr: addr(),
            kind,
            start,
            count: n,
            source,
        };
        if vector < routes.enabled {
            sys::set_irq_eventfds(fd_of, kind.index(), vector, &[fd])
                .map_err(|e| set_err(vector, 1, e))?;
        } else {
            // Enable (or re-enable with more vectors): vectors 0..=vector, every known route.
            if routes.enabled > 0 {
                sys::disable_irq_index(fd_of, kind.index())
                    .map_err(|e| set_err(0, routes.enabled, e))?;
                routes.enabled = 0;
            }
            let n = vector + 1;
            let mut fds = routes.fds(n);
            fds[vector as usize] = fd;
            sys::set_irq_eventfds(fd_of, kind.index(), 0, &fds).map_err(|e| set_err(0, n, e))?;
            routes.enabled = n;
        }
        let slot = vector as usize;
        if routes.sinks.len() <= slot {
            routes.sinks.resize(slot + 1, None);
        }
        routes.sinks[slot] = Some(sink.clone());
        tracing::debug!(addr = %self.inner.addr, %kind, vector, fd, "routed interrupt");
        Ok(())
    }

    /// Disables every vector of `kind` and forgets its routes (done for both kinds when the
    /// handle is dropped). Nothing to do if it is not enabled.
    ///
    /// # Errors
    /// [`VfioError::SetIrqs`]; the routes then count as still enabled.
    pub fn disable_irqs(&self, kind: IrqKind) -> Result<(), VfioError> {
        let mut table = self.routes();
        let routes = table.of(kind);
        if routes.enabled == 0 {
            routes.sinks.clear();
            return Ok(());
        }
        sys::disable_irq_index(sys::device_fd(&self.inner.dev), kind.index()).map_err(
            |source| VfioError::SetIrqs {
                addr: self.inner.addr.clone(),
                kind,
                start: 0,
                count: routes.enabled,
                source,
            },
        )?;
        routes.enabled = 0;
        routes.sinks.clear();
        Ok(())
    }
}
