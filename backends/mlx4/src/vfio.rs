//! A real mlx4 function bound to vfio-pci, as the driver's [`PciFunction`] (Linux).
//!
//! Opening enables memory decoding and bus mastering; BARs are mapped once and shared, BAR0's
//! HCR and reset register reached through [`crate::regs`]' typed blocks and BAR2's doorbells
//! rung on its typed UAR pages (chosen by [`Mlx4Device::open_vfio`]); DMA memory comes from the
//! function's IOMMU container.
//!
//! Interrupts: an MSI-X vector can only be bound to an eventfd (`InterruptSink::eventfd`,
//! `VFIO_DEVICE_SET_IRQS`), which the kernel's handler signals without running any code of
//! ours; so [`PciFunction::raises_sinks`] is false and a sink without an eventfd leaves its
//! vector unrouted (the command EQ's: a command then looks at its EQ itself). The device's
//! shared EQ pool binds each of its vectors to an eventfd the driver owns, and one driver
//! thread per device sleeps in epoll over those eventfds and wakes every context's event
//! queue on the EQ that interrupted (`device/eq_waiter.rs`, described in
//! `device/eq_demux.rs`): every context and completion channel shares the pool's vectors, as
//! on the emulated HCA.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use portverbs_hal::dma::{DmaError, DmaMemory, HostMemory, MapHostError};
use portverbs_hal::mmio::Mmio;
use portverbs_hal::notify::InterruptSink;
use portverbs_vfio::{IrqKind, VfioDevice};

use crate::dma::HostMapped;
use crate::pci::{PciError, PciFunction};
use crate::regs::MappedBar2;
use crate::{Mlx4Config, Mlx4Device, OpenError};

/// A VFIO-bound PCI function.
#[derive(Debug)]
pub struct VfioFunction {
    dev: Arc<VfioDevice>,
    bars: [OnceLock<Arc<dyn Mmio>>; 3],
    /// BAR2's UAR pages, when BAR2 is mapped in one piece.
    uars: OnceLock<Option<Arc<MappedBar2>>>,
}

impl VfioFunction {
    /// Opens the function at `addr` (`0000:01:00.0`) and enables memory decoding and bus
    /// mastering.
    ///
    /// # Errors
    /// The VFIO error, naming the address, the step and the remedy.
    pub fn open(addr: &str) -> Result<Arc<Self>, portverbs_vfio::VfioError> {
        let dev = VfioDevice::open(addr)?;
        dev.enable_bus_master()?;
        Ok(Arc::new(Self {
            dev,
            bars: Default::default(),
            uars: OnceLock::new(),
        }))
    }

    /// BAR2's UAR pages for typed doorbells, when BAR2 is mapped in one piece.
    fn mapped_uars(&self) -> Option<Arc<MappedBar2>> {
        self.bar(2).ok()?;
        self.uars.get().cloned().flatten()
    }
}

impl PciFunction for VfioFunction {
    fn name(&self) -> String {
        self.dev.address().to_string()
    }

    fn ids(&self) -> (u16, u16) {
        self.dev.vendor_device().unwrap_or((0xffff, 0xffff))
    }

    fn bar(&self, index: u8) -> Result<Arc<dyn Mmio>, PciError> {
        let slot = self
            .bars
            .get(usize::from(index))
            .ok_or_else(|| PciError::Bar {
                function: self.name(),
                bar: index,
                reason: "mlx4 uses BAR0 and BAR2 only".into(),
            })?;
        if let Some(b) = slot.get() {
            return Ok(b.clone());
        }
        let bar = self.dev.map_bar(index).map_err(|e| PciError::Bar {
            function: self.name(),
            bar: index,
            reason: e.to_string(),
        })?;
        if index == 2 {
            // The doorbells go straight to the UAR pages' typed cells (`Mlx4Device::open_vfio`).
            let _ = self.uars.set(crate::regs::mapped_vfio_bar2(&bar));
        }
        // The HCR and reset register through their typed blocks.
        let bar = crate::regs::typed_vfio_bar(bar);
        Ok(slot.get_or_init(|| bar).clone())
    }

    fn config_read16(&self, offset: u16) -> Result<u16, PciError> {
        self.dev
            .config_read16(offset)
            .map_err(|e| PciError::Config {
                function: self.name(),
                offset,
                reason: e.to_string(),
            })
    }

    fn alloc_dma(&self, len: usize) -> Result<Arc<dyn HostMapped>, DmaError> {
        match self.dev.alloc_vfio_dma(len) {
            Ok(region) => Ok(region),
            Err(e) => Err(DmaError::AllocFailed {
                len,
                reason: e.to_string(),
            }),
        }
    }

    fn map_host(&self, memory: HostMemory) -> Result<Arc<dyn DmaMemory>, MapHostError> {
        Ok(self.dev.map_host(memory)?)
    }

    fn num_vectors(&self) -> u32 {
        self.dev.irq_count(IrqKind::Msix)
    }

    fn route_interrupt(&self, vector: u32, sink: Arc<dyn InterruptSink>) -> Result<(), PciError> {
        if sink.eventfd().is_none() {
            return Ok(());
        }
        self.dev
            .route_msix(vector, &sink)
            .map_err(|e| PciError::Interrupt {
                function: self.name(),
                vector,
                reason: e.to_string(),
            })
    }

    fn raises_sinks(&self) -> bool {
        // Interrupts reach eventfds only; nothing here calls `raise`.
        false
    }

    fn reset_settle(&self) -> Duration {
        Duration::from_millis(1000)
    }
}

impl Mlx4Device {
    /// Opens the VFIO-bound ConnectX-3 at `addr` and brings it up.
    ///
    /// # Errors
    /// VFIO could not open the function (the message says how to bind it), or bring-up failed.
    pub fn open_vfio(addr: &str, config: Mlx4Config) -> Result<Self, OpenError> {
        let f = VfioFunction::open(addr).map_err(|e| OpenError::Config {
            function: addr.to_string(),
            what: e.to_string(),
        })?;
        let mapped = f.mapped_uars();
        Self::open_with(f, mapped, config)
    }
}

/// VFIO-bound mlx4 physical functions on this machine (PCI addresses).
pub fn scan() -> Vec<String> {
    portverbs_vfio::scan(Some(crate::pci::MELLANOX_VENDOR))
        .into_iter()
        .filter(|f| crate::pci::is_mlx4_pf(f.vendor, f.device))
        .map(|f| f.address)
        .collect()
}
