//! The seam between the driver and the PCI function it drives.
//!
//! The driver reaches the HCA only through [`PciFunction`]: two mapped BARs (BAR0 = the HCR and
//! the reset registers, BAR2 = UAR doorbell pages followed by BlueFlame pages), DMA memory the
//! device can reach at a bus address (IOVA), config-space reads, and interrupt routing (MSI-X
//! vector → the event queue's [`InterruptSink`]). Two implementations exist: a VFIO-bound real
//! function (Linux) and the emulated HCA (`portverbs-mlx4-model`), so the whole driver runs in
//! every test.

use std::fmt::Debug;
use std::sync::{Arc, Weak};
use std::time::Duration;

use portverbs_hal::dma::{DmaError, DmaMemory, HostMemory, MapHostError};

use portverbs_dma::HostMapped;
use portverbs_hal::mmio::Mmio;
use portverbs_hal::notify::InterruptSink;
use portverbs_hal::{Progress, ProgressAgent};
use thiserror::Error;

/// Mellanox's PCI vendor ID.
pub const MELLANOX_VENDOR: u16 = 0x15b3;
/// ConnectX-3 (MT27500 family) physical function.
pub const CONNECTX3: u16 = 0x1003;
/// ConnectX-3 Pro.
pub const CONNECTX3_PRO: u16 = 0x1007;

/// Whether a PCI device ID is an mlx4-class physical function this driver handles (Linux
/// `mlx4/main.c`; virtual functions need the SR-IOV command channel and are refused).
pub fn is_mlx4_pf(vendor: u16, device: u16) -> bool {
    vendor == MELLANOX_VENDOR
        && matches!(
            device,
            0x6340
                | 0x634a
                | 0x6354
                | 0x6732
                | 0x673c
                | 0x6368
                | 0x6750
                | 0x6372
                | 0x675a
                | 0x6764
                | 0x6746
                | 0x676e
                | 0x1003
                | 0x1005..=0x1010
        )
}

/// Failures of the PCI seam.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PciError {
    /// The BAR does not exist or cannot be mapped.
    #[error("{function}: BAR{bar} cannot be mapped: {reason}")]
    Bar {
        /// PCI address or model name.
        function: String,
        /// BAR index.
        bar: u8,
        /// Why.
        reason: String,
    },
    /// An interrupt vector cannot be routed.
    #[error("{function}: interrupt vector {vector} cannot be routed: {reason}")]
    Interrupt {
        /// PCI address or model name.
        function: String,
        /// Vector.
        vector: u32,
        /// Why.
        reason: String,
    },
    /// Config space access failed.
    #[error("{function}: config space access at {offset:#x} failed: {reason}")]
    Config {
        /// PCI address or model name.
        function: String,
        /// Offset.
        offset: u16,
        /// Why.
        reason: String,
    },
}

/// The doorbells of BAR2's UAR pages (Linux `include/linux/mlx4/doorbell.h`) as calls, each
/// with the effect of the store it stands for. A function that offers them (see
/// [`PciFunction::doorbells`]) is spared decoding offsets; every BAR2 store the driver makes
/// otherwise keeps working through [`PciFunction::bar`]. Doorbells have no answer: an
/// implementation drops what it cannot take (a page it does not have, a removed device).
pub trait UarDoorbells: Send + Sync + Debug {
    /// The send doorbell of UAR page `page` for hardware QP `qpn` (the store of `qpn << 8` at
    /// offset [`SEND_DOORBELL`](crate::uar::SEND_DOORBELL)).
    fn send(&self, page: u32, qpn: u32);

    /// The CQ doorbell of UAR page `page`: one 64-bit store of `dword0` (see
    /// [`cq_arm_word`](crate::uar::cq_arm_word)) and the consumer index `ci`.
    fn arm_cq(&self, page: u32, dword0: u32, ci: u32);

    /// The doorbell of the EQ in slot `slot` (0..4) of UAR page `page`, that is EQ
    /// `4 × page + slot`: its consumer index, with [`EQ_ARM`](crate::uar::EQ_ARM) to arm it.
    fn eq(&self, page: u32, slot: u32, value: u32);

    /// A BlueFlame copy: `block` (a WQE, a multiple of 8 bytes, in device byte order) written
    /// with write-combining stores to BAR2 `offset`, a register half in the BlueFlame page of
    /// UAR page `page`.
    fn blueflame(&self, page: u32, offset: usize, block: &[u8]);
}

/// What the driver needs from the PCI function. Implementations must be cheap to call from the
/// data path for [`PciFunction::bar`] results (the driver keeps the `Arc`s).
pub trait PciFunction: Send + Sync + Debug + 'static {
    /// PCI address (`0000:01:00.0`) or the model's name.
    fn name(&self) -> String;

    /// Vendor and device ID.
    fn ids(&self) -> (u16, u16);

    /// A mapped BAR (0 or 2 for mlx4).
    ///
    /// # Errors
    /// The BAR does not exist or cannot be mapped.
    fn bar(&self, index: u8) -> Result<Arc<dyn Mmio>, PciError>;

    /// The UAR doorbells as calls, for a function that offers them (the emulated HCA): the
    /// driver then rings its doorbells through these instead of storing to BAR2 offsets the
    /// function would have to decode. `None` (the default): the driver stores to BAR2.
    fn doorbells(&self) -> Option<Arc<dyn UarDoorbells>> {
        None
    }

    /// Reads a 16-bit config-space register (the driver polls the vendor ID after a reset).
    ///
    /// # Errors
    /// The access failed.
    fn config_read16(&self, offset: u16) -> Result<u16, PciError>;

    /// Allocates DMA memory the device can reach: page aligned, length rounded up to pages,
    /// `device_addr()` is the bus address (IOVA) to hand to the device — never assume it equals
    /// the host address.
    ///
    /// # Errors
    /// Out of memory, IOVA space or locked-memory allowance.
    /// The region must be [`HostMapped`]: the driver writes its rings through raw pointers.
    fn alloc_dma(&self, len: usize) -> Result<Arc<dyn HostMapped>, DmaError>;

    /// Maps memory the application owns so the device can reach it (the IOMMU mapping of a
    /// registered buffer); `device_addr()` keeps the memory's offset in its page.
    ///
    /// # Errors
    /// The mapping failed; the memory comes back.
    fn map_host(&self, memory: HostMemory) -> Result<Arc<dyn DmaMemory>, MapHostError>;

    /// Number of MSI-X vectors.
    fn num_vectors(&self) -> u32;

    /// Routes MSI-X `vector` to `sink` (a VFIO function binds the vector to the sink's eventfd;
    /// the model calls `raise`).
    ///
    /// # Errors
    /// No such vector, or the platform refused.
    fn route_interrupt(&self, vector: u32, sink: Arc<dyn InterruptSink>) -> Result<(), PciError>;

    /// Whether the function itself calls [`InterruptSink::raise`] on a routed sink, also on one
    /// without an eventfd (the emulated HCA does). A VFIO function answers `false`: its
    /// interrupts reach only a sink's eventfd, in the kernel, so a driver-owned sink without
    /// one is never raised and whoever waits on it must look for itself.
    fn raises_sinks(&self) -> bool {
        true
    }

    /// How long the function needs after the mlx4 reset register is written before config space
    /// answers again (about a second on hardware, nothing for the model).
    fn reset_settle(&self) -> Duration;

    /// Who makes the function progress: hardware does by itself ([`Progress::Auto`], the
    /// default); the emulated HCA says what its fabric does.
    fn progress(&self) -> Progress {
        Progress::Auto
    }

    /// Runs a layer's agent whenever the function progresses (see
    /// [`portverbs_hal::device::Device::attach_agent`]): the emulated HCA's fabric does; a
    /// VFIO function has no progress of its own to run it in and refuses (the default).
    fn attach_agent(&self, agent: Weak<dyn ProgressAgent>) -> bool {
        let _ = agent;
        false
    }
}
