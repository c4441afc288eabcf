//! The seam between the transport engine and a device's queue formats.
//!
//! The engine knows nothing of how WQEs, CQEs and EQEs are laid out in memory. A device model
//! (the software device's own format, or the mlx4 model) implements [`Hca`]: it decodes work
//! requests out of its rings into the engine's [`SendWqe`]/[`RecvWqe`], writes the engine's
//! completions and events into its CQ/EQ formats, and applies its own arming and overrun rules.
//! The engine calls it with the device's lock held; implementations must not block.

use portverbs_hal::attr::AddressVector;
use portverbs_hal::event::DeviceEvent;
use portverbs_hal::types::QpType;
use portverbs_hal::wc::Cqe;
use portverbs_hal::wr::{SendFlags, SendOp, Sge};
use smallvec::SmallVec;

/// The UD destination carried by a send WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdTarget {
    /// Address vector.
    pub av: AddressVector,
    /// Destination QP.
    pub remote_qpn: u32,
    /// Q_Key (bit 31 set: use the sending QP's own Q_Key).
    pub remote_qkey: u32,
}

/// A send WQE as the engine sees it. The buffers are reused between WQEs (no allocation on the
/// data path): implementations `clear()` and refill them.
#[derive(Debug, Clone)]
pub struct SendWqe {
    /// Producer counter of the WQE in the send queue.
    pub counter: u32,
    /// Operation.
    pub op: SendOp,
    /// Flags (fence, solicited, inline, signaled as written by the host).
    pub flags: SendFlags,
    /// Generate a completion on success.
    pub signaled: bool,
    /// Gather (or, for reads and atomics, scatter) list; empty for inline data. Short lists
    /// live inside the WQE copy itself (no pointer to chase on the data path).
    pub sges: SmallVec<[Sge; 2]>,
    /// Inline payload, when `flags` contains `INLINE` (small ones kept in place too).
    pub inline_data: SmallVec<[u8; 64]>,
    /// UD destination.
    pub ud: Option<UdTarget>,
}

impl Default for SendWqe {
    fn default() -> Self {
        Self {
            counter: 0,
            op: SendOp::Send,
            flags: SendFlags::empty(),
            signaled: false,
            sges: SmallVec::new(),
            inline_data: SmallVec::new(),
            ud: None,
        }
    }
}

impl SendWqe {
    /// True when the payload is inline.
    pub fn is_inline(&self) -> bool {
        self.flags.contains(SendFlags::INLINE)
    }

    /// Payload length in bytes (for reads: bytes to read; for atomics: 8).
    #[inline(always)]
    pub fn payload_len(&self) -> u64 {
        match self.op {
            SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. } => 8,
            _ if self.is_inline() => self.inline_data.len() as u64,
            _ => self.sges.iter().map(|s| u64::from(s.length)).sum(),
        }
    }
}

/// A receive WQE as the engine sees it.
#[derive(Debug, Clone, Default)]
pub struct RecvWqe {
    /// Index reported in the completion: the SRQ slot for SRQ receives, the RQ counter otherwise.
    pub wqe_index: u32,
    /// The protection domain its scatter list is checked in. A receive taken from an SRQ
    /// belongs to the SRQ's domain, not the receiving QP's (IBA 10.2.9.2), so the device model
    /// sets it from the SRQ for [`RecvSource::Srq`]; for a QP's own receive queue the engine
    /// uses the QP's domain and ignores this field.
    pub pd: u32,
    /// Scatter list.
    pub sges: SmallVec<[Sge; 2]>,
}

impl RecvWqe {
    /// Capacity of the scatter list in bytes.
    pub fn capacity(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.length)).sum()
    }
}

/// A WQE the device could not make sense of (wrong owner bit, unknown opcode, too many SGEs):
/// the QP goes to the error state with a catastrophic-error event, as on hardware.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WqeFault {
    /// What was wrong.
    pub reason: &'static str,
}

/// Where a receive WQE comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvSource {
    /// The QP's own receive queue.
    Rq {
        /// QP number.
        qpn: u32,
    },
    /// A shared receive queue.
    Srq {
        /// SRQ number.
        srqn: u32,
    },
}

/// What the engine needs from a device model.
pub trait Hca {
    /// Counter one past the last send WQE the host has posted (doorbell record), or `None` if the
    /// QP has no send queue here.
    fn sq_head(&self, qpn: u32) -> Option<u32>;

    /// Decodes the send WQE with producer counter `counter` into `out`.
    ///
    /// # Errors
    /// The entry is malformed.
    fn read_send_wqe(&mut self, qpn: u32, counter: u32, out: &mut SendWqe) -> Result<(), WqeFault>;

    /// Takes the next posted receive WQE from `source` into `out`; `Ok(false)` when none is posted.
    ///
    /// # Errors
    /// The entry is malformed.
    fn take_recv_wqe(&mut self, source: RecvSource, out: &mut RecvWqe) -> Result<bool, WqeFault>;

    /// Number of receive WQEs posted and not yet taken.
    fn recv_posted(&self, source: RecvSource) -> u32;

    /// Writes a completion to CQ `cqn`. `solicited` marks receives of solicited messages (they
    /// satisfy a solicited-only arming, as error completions always do). Returns false when
    /// the completion could not be written: the CQ overran (the device then reports the CQ
    /// error event) or is already in error, or does not exist. The engine moves the QP whose
    /// completion was lost to ERR (IBA 11.4.2.1).
    #[must_use]
    fn post_completion(&mut self, cqn: u32, cqe: &Cqe, solicited: bool) -> bool;

    /// Delivers an asynchronous event to the device's async event queue.
    fn post_event(&mut self, event: DeviceEvent);

    /// The QP entered ERR: receives posted from now on must be flushed too (the device model
    /// arranges to be told about them).
    fn qp_error(&mut self, qpn: u32);

    /// Resets the device-side queue state of a QP (RESET transition): consumer counters to 0.
    fn reset_queues(&mut self, qpn: u32, qp_type: QpType);
}
