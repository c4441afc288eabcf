//! Device commands: the slow path. Every method is `async` so that a backend can complete it
//! through its command interface however the hardware does (an mlx4 HCR command in event mode
//! completes with a command-done EQE; in polling mode the future polls the go bit; the software
//! device completes at once). `trait-variant` generates [`Device`], whose futures are `Send`;
//! backends implement that, and generic code bounds on it. Every command also has a blocking form
//! in [`crate::blocking::BlockingDevice`].
//!
//! Numbers (PD, CQN, QPN, SRQN, MR/MW handles) are the device's own; `verbs-core` owns the
//! objects and their lifetimes and calls `destroy_*`/`dealloc_*` exactly once per object.

use std::sync::{Arc, Weak};
use std::time::Instant;

use crate::attr::{QpAttr, QpAttrMask, QpCaps};
use crate::caps::{DeviceAttr, DeviceInfo, GidEntry, PortAttr};
use crate::dma::{DmaError, DmaMemory, HostMemory, MapHostError};
use crate::error::CommandError;
use crate::notify::InterruptSink;
use crate::progress::{ProgressAgent, WaitSource};
use crate::queue::{CompletionQueue, EventQueue, RecvQueue, SendQueue, SharedRecvQueue};
use crate::types::{AccessFlags, Gid, MwType, QpType, SpecialQp};

/// What an event queue carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EqKind {
    /// Asynchronous (affiliated and unaffiliated) events of the whole device, and command
    /// completions. One per opened device.
    Async,
    /// Completion events of the CQs attached to it; `vector` is the completion vector.
    Completion {
        /// Completion vector (interrupt) number.
        vector: u32,
    },
}

/// Parameters of an event queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EqParams {
    /// Minimum number of entries.
    pub entries: u32,
    /// Kind.
    pub kind: EqKind,
}

/// Parameters of a completion queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqParams {
    /// Minimum number of usable entries.
    pub entries: u32,
    /// EQ that receives this CQ's completion events.
    pub eqn: u32,
}

/// Parameters of a shared receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqParams {
    /// Protection domain.
    pub pd: u32,
    /// Minimum usable slots.
    pub max_wr: u32,
    /// Scatter entries per WQE.
    pub max_sge: u32,
    /// Limit armed at creation (0 = not armed).
    pub limit: u32,
}

/// A change to a shared receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqModify {
    /// New size (needs `SRQ_RESIZE`).
    pub max_wr: Option<u32>,
    /// Arm the limit event: one-shot event when fewer than this many WQEs remain posted.
    pub limit: Option<u32>,
}

/// Parameters of a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCreateParams {
    /// Protection domain.
    pub pd: u32,
    /// Transport.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cqn: u32,
    /// CQ for receive completions.
    pub recv_cqn: u32,
    /// SRQ, when receives come from one (then `caps.max_recv_wr` is ignored).
    pub srqn: Option<u32>,
    /// Requested capacities.
    pub caps: QpCaps,
    /// Create this special QP (its number fixed, [`SpecialQp::qpn`]) instead of one from the
    /// pool; `qp_type` must be its [`SpecialQp::qp_type`]. A device without it answers
    /// [`CommandError::Unsupported`]; one whose special QP
    /// exists already, [`CommandError::Busy`].
    pub special: Option<SpecialQp>,
}

/// A created queue pair: its number, what was granted, and its hot-path queue objects (the
/// device's [`LocalDevice::Sq`] and [`LocalDevice::Rq`]).
#[derive(Debug)]
pub struct QpResources<S, R> {
    /// QP number.
    pub qpn: u32,
    /// Granted capacities (≥ requested).
    pub caps: QpCaps,
    /// Send queue.
    pub sq: S,
    /// Own receive queue (`None` with an SRQ).
    pub rq: Option<R>,
}

/// The [`QpResources`] of device type `D`.
pub type QpResourcesOf<D> = QpResources<<D as Device>::Sq, <D as Device>::Rq>;

/// Parameters of a memory registration.
#[derive(Debug, Clone)]
pub struct MrParams {
    /// Protection domain.
    pub pd: u32,
    /// The memory (allocated by this device).
    pub region: Arc<dyn DmaMemory>,
    /// Offset of the MR inside the region.
    pub offset: usize,
    /// Length of the MR.
    pub length: usize,
    /// Rights (already validated by the core: remote write/atomic imply local write).
    pub access: AccessFlags,
}

/// Keys and address of a registered MR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrKeys {
    /// Device handle of the registration (for rereg/dereg).
    pub handle: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key (meaningful only with remote access).
    pub rkey: u32,
    /// Virtual address of the first byte.
    pub addr: u64,
}

/// A change to an existing registration (`ibv_rereg_mr`); `None` fields stay as they are.
#[derive(Debug, Clone, Default)]
pub struct MrRereg {
    /// New protection domain.
    pub pd: Option<u32>,
    /// New memory: region, offset, length.
    pub range: Option<(Arc<dyn DmaMemory>, usize, usize)>,
    /// New rights.
    pub access: Option<AccessFlags>,
}

/// Keys of an allocated memory window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwKeys {
    /// Device handle of the window.
    pub handle: u32,
    /// Its current rkey.
    pub rkey: u32,
}

/// The command interface of an RDMA device. See the module documentation.
#[trait_variant::make(Device: Send)]
pub trait LocalDevice: Send + Sync + 'static {
    /// The send-queue object of this device's QPs. The hot-path queue objects are associated
    /// types, not trait objects: verbs-core's post and poll paths are compiled per device type,
    /// so the backend's encoder and decoder inline into them with no indirect call. A facade
    /// that picks its backend at run time makes these enums over the backends' types.
    type Sq: SendQueue + 'static;

    /// The receive-queue object of this device's QPs.
    type Rq: RecvQueue + 'static;

    /// The shared-receive-queue object.
    type Srq: SharedRecvQueue + 'static;

    /// The completion-queue object.
    type Cq: CompletionQueue + 'static;

    /// Static identity (no command needed), its progress mode included
    /// ([`DeviceInfo::progress`]).
    fn info(&self) -> &DeviceInfo;

    /// Manual progress ([`crate::Progress::Manual`]): does on the calling thread what is due
    /// now — receives what arrived, runs the transport and its timers, sends, and runs the
    /// attached agents ([`LocalDevice::attach_agent`]) — and returns when the device next
    /// has timed work. Cheap when there is nothing to do, and safe to call from any thread,
    /// concurrently and from inside an agent (the inner call then does not run the agents
    /// again). Devices that progress on their own (auto) do nothing and return `None`.
    fn dispatch(&self) -> Option<Instant> {
        None
    }

    /// Sends, before returning, what the device owes its peers and would otherwise send on
    /// its next round — an ACK coalesced behind the last burst, packets batched for the wire —
    /// without waiting on any peer. verbs-core calls it when a context closes, so that a
    /// process that ends right after its last completion has acknowledged what it received
    /// (hardware has long sent its ACKs by then). Nothing by default.
    fn flush_owed(&self) {}

    /// Manual progress: what the device's input arrives on, for a blocking wait or an
    /// `await` to sleep on together with an event queue's sink
    /// ([`crate::notify::InterruptSink::wait_with`]). [`WaitSource::none`] by default.
    fn wait_source(&self) -> WaitSource<'_> {
        WaitSource::none()
    }

    /// Asks the device to run `agent` whenever it progresses (after rounds with work, and
    /// when the agent's deadline passes), on its progress thread (auto) or inside the
    /// application's calls (manual), never with a lock of the device held. The device keeps
    /// only the weak reference: dropping the agent detaches it. False when the device cannot
    /// (nothing of its own progresses it: the caller keeps driving the agent's work itself).
    fn attach_agent(&self, agent: Weak<dyn ProgressAgent>) -> bool {
        let _ = agent;
        false
    }

    /// Allocates DMA-visible memory usable by this device (queue rings, registered buffers).
    ///
    /// # Errors
    /// Allocation or IOMMU mapping failed.
    fn alloc_dma(&self, len: usize) -> Result<Arc<dyn DmaMemory>, DmaError>;

    /// Maps memory the application owns for DMA by this device (through the IOMMU where
    /// there is one). The region owns `memory` until it is dropped or gives it back
    /// ([`DmaMemory::into_host`]); its host address is the memory's own address.
    ///
    /// # Errors
    /// The mapping failed; the memory comes back in the error.
    fn map_host(&self, memory: HostMemory) -> Result<Arc<dyn DmaMemory>, MapHostError>;

    /// Queries device attributes.
    async fn query_device(&self) -> Result<DeviceAttr, CommandError>;

    /// Queries a port (1-based).
    async fn query_port(&self, port: u8) -> Result<PortAttr, CommandError>;

    /// Reads a GID-table entry.
    async fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry, CommandError>;

    /// Reads a P_Key-table entry.
    async fn query_pkey(&self, port: u8, index: u16) -> Result<u16, CommandError>;

    /// Allocates a protection domain.
    async fn alloc_pd(&self) -> Result<u32, CommandError>;

    /// Frees a protection domain (the core guarantees it has no children).
    async fn dealloc_pd(&self, pd: u32) -> Result<(), CommandError>;

    /// Creates an event queue whose interrupts go to `sink`. The EQ starts armed.
    async fn create_eq(
        &self,
        params: EqParams,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError>;

    /// Destroys an event queue (the core guarantees no CQ uses it).
    async fn destroy_eq(&self, eqn: u32) -> Result<(), CommandError>;

    /// Creates a completion queue.
    async fn create_cq(&self, params: CqParams) -> Result<Self::Cq, CommandError>;

    /// Resizes a completion queue, keeping unpolled completions.
    async fn resize_cq(&self, cq: &mut Self::Cq, entries: u32) -> Result<(), CommandError>;

    /// Destroys a completion queue (no QP uses it any more).
    async fn destroy_cq(&self, cqn: u32) -> Result<(), CommandError>;

    /// Creates a shared receive queue.
    async fn create_srq(&self, params: SrqParams) -> Result<Self::Srq, CommandError>;

    /// Changes an SRQ (size, limit arming).
    async fn modify_srq(&self, srqn: u32, change: SrqModify) -> Result<(), CommandError>;

    /// Destroys an SRQ (no QP uses it any more).
    async fn destroy_srq(&self, srqn: u32) -> Result<(), CommandError>;

    /// Creates a queue pair in RESET.
    async fn create_qp(
        &self,
        params: QpCreateParams,
    ) -> Result<QpResources<Self::Sq, Self::Rq>, CommandError>;

    /// Modifies a queue pair. The core has already checked the transition and the attribute
    /// mask against the IBTA table. `attr` is the QP's whole attribute record as it is to be
    /// after this modify — the core keeps the one record per QP and applies `mask` to it
    /// before the call, so a device that needs earlier attributes (a context command carries
    /// them all) reads them here rather than keeping a copy. `mask` names what this modify
    /// changes; `attr.cur_qp_state` is the state the core believes current and `attr.qp_state`
    /// the target.
    async fn modify_qp(&self, qpn: u32, attr: QpAttr, mask: QpAttrMask)
    -> Result<(), CommandError>;

    /// Queries a queue pair: `known` is the core's record, and the device returns it with
    /// what the device itself knows laid over it — at least the state it really is in (ERR
    /// after a fatal error, SQE), and whatever its context reports (PSNs …).
    async fn query_qp(&self, qpn: u32, known: QpAttr) -> Result<QpAttr, CommandError>;

    /// Destroys a queue pair.
    async fn destroy_qp(&self, qpn: u32) -> Result<(), CommandError>;

    /// Registers memory.
    async fn register_mr(&self, params: MrParams) -> Result<MrKeys, CommandError>;

    /// Changes a registration; keys may change.
    async fn rereg_mr(&self, handle: u32, change: MrRereg) -> Result<MrKeys, CommandError>;

    /// Deregisters memory.
    async fn deregister_mr(&self, handle: u32) -> Result<(), CommandError>;

    /// Allocates a memory window.
    async fn alloc_mw(&self, pd: u32, mw_type: MwType) -> Result<MwKeys, CommandError>;

    /// Frees a memory window (invalidating any binding).
    async fn dealloc_mw(&self, handle: u32) -> Result<(), CommandError>;

    /// Attaches UD QP `qpn` to the multicast group `gid` (`ibv_attach_mcast`; IBA 10.5.2.4
    /// and 11.3.1.1): from now on a UD datagram to the group (destination QP 0xFFFFFF, the
    /// group's GID and LID) is delivered to the QP too. The core has checked the QP type and
    /// that `gid` is a multicast GID, and never attaches a QP to a group twice. `lid` is the
    /// group's multicast LID on an InfiniBand port; RoCE ports ignore it. A device without
    /// multicast (`max_mcast_grp == 0`) answers [`CommandError::Unsupported`]; past one of its
    /// limits (`max_mcast_grp`, `max_mcast_qp_attach`, `max_total_mcast_qp_attach`),
    /// [`CommandError::ResourceExhausted`].
    async fn attach_mcast(&self, qpn: u32, gid: Gid, lid: u16) -> Result<(), CommandError>;

    /// Detaches QP `qpn` from the multicast group `gid` (`ibv_detach_mcast`). The core only
    /// detaches what it attached; a device that does not know the attachment answers
    /// [`CommandError::NoSuchObject`]. Destroying a QP detaches it from every group.
    async fn detach_mcast(&self, qpn: u32, gid: Gid, lid: u16) -> Result<(), CommandError>;
}
