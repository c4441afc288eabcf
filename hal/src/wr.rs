//! Portable work requests (`struct ibv_send_wr` / `struct ibv_recv_wr`), as handed by the core
//! to a backend's queue object for encoding into its own WQE format.
//!
//! Data is described by scatter/gather entries that name registered memory by address and
//! lkey, exactly as in libibverbs; the device resolves and checks them. Inline data is the one
//! exception: it is an ordinary byte slice from the caller's memory, copied into the WQE at post
//! time (so the caller never needs a reference into device-visible memory to send small data).

use crate::attr::AddressVector;
use crate::types::{AccessFlags, MwType, QpType};

/// One scatter/gather entry (`struct ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address inside the memory region named by `lkey`.
    pub addr: u64,
    /// Length in bytes (0 is legal).
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

bitflags::bitflags! {
    /// Send flags (`enum ibv_send_flags` values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for prior RDMA reads and atomics to complete before starting (IBA 10.8.3.3).
        const FENCE = 1;
        /// Generate a completion even on a QP that does not signal all requests.
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit: the receiver's CQ fires a solicited notification.
        const SOLICITED = 1 << 2;
        /// The payload is carried inline (set automatically for [`Payload::Inline`]).
        const INLINE = 1 << 3;
    }
}

/// Remote memory target of an RDMA or atomic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteAddr {
    /// Remote virtual address (for atomics: 8-byte aligned).
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// Parameters of a memory-window bind (type 1 through `bind_mw`, type 2 through a work request).
/// The window is named by the index its key carries (bits 31..8), as on mlx4: a failed bind
/// leaves the window at its old key, and the next bind still finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The rkey the window will answer to after the bind: the window's index with a new tag
    /// byte (`ibv_inc_rkey`).
    pub new_rkey: u32,
    /// Window type.
    pub mw_type: MwType,
    /// lkey of the MR the window lies in (must have `MW_BIND`).
    pub mr_lkey: u32,
    /// Start address of the window (inside the MR).
    pub addr: u64,
    /// Length of the window; 0 unbinds (type 1 invalidation).
    pub length: u64,
    /// Remote rights granted through the window.
    pub access: AccessFlags,
}

/// What a send work request does (`enum ibv_wr_opcode` with its operands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND: consumes a receive WR at the peer.
    Send,
    /// SEND with 32-bit immediate data (opaque, delivered as given).
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// SEND that also invalidates `rkey` at the receiver (type-2 MW or MR).
    SendWithInv {
        /// rkey to invalidate at the responder.
        rkey: u32,
    },
    /// RDMA WRITE into remote memory.
    RdmaWrite {
        /// Target.
        remote: RemoteAddr,
    },
    /// RDMA WRITE with immediate: also consumes a receive WR at the peer.
    RdmaWriteWithImm {
        /// Target.
        remote: RemoteAddr,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ from remote memory into the local scatter list.
    RdmaRead {
        /// Source.
        remote: RemoteAddr,
    },
    /// 64-bit compare-and-swap; the original remote value lands in the local 8-byte SGE.
    ///
    /// Byte order, as with libibverbs: the remote 8 bytes are a `u64` in the responder
    /// host's order, `compare` and `swap` are this host's values (the wire's AtomicETH is
    /// big-endian; the devices convert), and the original value lands in the SGE in this
    /// host's order (`u64::from_ne_bytes`). So on the software device and the emulated
    /// ConnectX-3.
    AtomicCmpSwp {
        /// Target (8-byte aligned).
        remote: RemoteAddr,
        /// Value compared against.
        compare: u64,
        /// Value stored when equal.
        swap: u64,
    },
    /// 64-bit fetch-and-add; the original remote value lands in the local 8-byte SGE, in the
    /// byte order [`SendOp::AtomicCmpSwp`] describes.
    AtomicFetchAdd {
        /// Target (8-byte aligned).
        remote: RemoteAddr,
        /// Addend.
        add: u64,
    },
    /// Bind a memory window (type 1 via `bind_mw`, type 2 via `IBV_WR_BIND_MW`).
    BindMw {
        /// Bind parameters.
        bind: MwBind,
    },
    /// Invalidate a local key (type-2 MW).
    LocalInv {
        /// Key to invalidate.
        rkey: u32,
    },
}

bitflags::bitflags! {
    /// A set of send operations, one flag per [`SendOp`] variant: lets a queue check a request
    /// against what its transport allows with one AND ([`SendOp::kind`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendOps: u16 {
        /// [`SendOp::Send`].
        const SEND = 1;
        /// [`SendOp::SendWithImm`].
        const SEND_WITH_IMM = 1 << 1;
        /// [`SendOp::SendWithInv`].
        const SEND_WITH_INV = 1 << 2;
        /// [`SendOp::RdmaWrite`].
        const RDMA_WRITE = 1 << 3;
        /// [`SendOp::RdmaWriteWithImm`].
        const RDMA_WRITE_WITH_IMM = 1 << 4;
        /// [`SendOp::RdmaRead`].
        const RDMA_READ = 1 << 5;
        /// [`SendOp::AtomicCmpSwp`].
        const ATOMIC_CMP_SWP = 1 << 6;
        /// [`SendOp::AtomicFetchAdd`].
        const ATOMIC_FETCH_ADD = 1 << 7;
        /// [`SendOp::BindMw`].
        const BIND_MW = 1 << 8;
        /// [`SendOp::LocalInv`].
        const LOCAL_INV = 1 << 9;
        /// The operations whose data moves towards the requester (no inline data).
        const READ_OR_ATOMIC = Self::RDMA_READ.bits()
            | Self::ATOMIC_CMP_SWP.bits()
            | Self::ATOMIC_FETCH_ADD.bits();
        /// The operations executed locally, without a packet and without a payload.
        const LOCAL = Self::BIND_MW.bits() | Self::LOCAL_INV.bits();
    }
}

impl SendOps {
    /// The operations a QP of type `t` may post (IBTA 10.7.3 / rdma-core): SEND with or
    /// without immediate on every transport; UC adds RDMA WRITE (± immediate), memory-window
    /// bind and local invalidate; RC allows everything.
    pub fn of_transport(t: QpType) -> Self {
        let send = Self::SEND | Self::SEND_WITH_IMM;
        match t {
            QpType::Ud => send,
            QpType::Uc => {
                send | Self::RDMA_WRITE
                    | Self::RDMA_WRITE_WITH_IMM
                    | Self::BIND_MW
                    | Self::LOCAL_INV
            }
            QpType::Rc => Self::all(),
        }
    }
}

impl SendOp {
    /// One request of every operation, with distinct non-zero immediates, keys and operands
    /// (`LocalInv` invalidates `bind.new_rkey`): for code that must handle them all, such as
    /// tests that walk every operation.
    pub fn one_of_each(remote: RemoteAddr, bind: MwBind) -> [Self; 10] {
        [
            Self::Send,
            Self::SendWithImm { imm: 7 },
            Self::SendWithInv { rkey: 9 },
            Self::RdmaWrite { remote },
            Self::RdmaWriteWithImm { remote, imm: 3 },
            Self::RdmaRead { remote },
            Self::AtomicCmpSwp {
                remote,
                compare: 1,
                swap: 2,
            },
            Self::AtomicFetchAdd { remote, add: 5 },
            Self::BindMw { bind },
            Self::LocalInv {
                rkey: bind.new_rkey,
            },
        ]
    }

    /// This operation's flag.
    #[inline]
    pub fn kind(&self) -> SendOps {
        match self {
            Self::Send => SendOps::SEND,
            Self::SendWithImm { .. } => SendOps::SEND_WITH_IMM,
            Self::SendWithInv { .. } => SendOps::SEND_WITH_INV,
            Self::RdmaWrite { .. } => SendOps::RDMA_WRITE,
            Self::RdmaWriteWithImm { .. } => SendOps::RDMA_WRITE_WITH_IMM,
            Self::RdmaRead { .. } => SendOps::RDMA_READ,
            Self::AtomicCmpSwp { .. } => SendOps::ATOMIC_CMP_SWP,
            Self::AtomicFetchAdd { .. } => SendOps::ATOMIC_FETCH_ADD,
            Self::BindMw { .. } => SendOps::BIND_MW,
            Self::LocalInv { .. } => SendOps::LOCAL_INV,
        }
    }

    /// True for RDMA READ and the atomics (they take responder resources and obey the fence).
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            Self::RdmaRead { .. } | Self::AtomicCmpSwp { .. } | Self::AtomicFetchAdd { .. }
        )
    }

    /// True for the operations that consume a receive WR at the peer.
    pub fn consumes_recv(&self) -> bool {
        matches!(
            self,
            Self::Send
                | Self::SendWithImm { .. }
                | Self::SendWithInv { .. }
                | Self::RdmaWriteWithImm { .. }
        )
    }

    /// True for operations executed locally without a packet (bind, local invalidate).
    pub fn is_local(&self) -> bool {
        matches!(self, Self::BindMw { .. } | Self::LocalInv { .. })
    }

    /// A short name in libibverbs style, for errors and traces.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Send => "SEND",
            Self::SendWithImm { .. } => "SEND_WITH_IMM",
            Self::SendWithInv { .. } => "SEND_WITH_INV",
            Self::RdmaWrite { .. } => "RDMA_WRITE",
            Self::RdmaWriteWithImm { .. } => "RDMA_WRITE_WITH_IMM",
            Self::RdmaRead { .. } => "RDMA_READ",
            Self::AtomicCmpSwp { .. } => "ATOMIC_CMP_AND_SWP",
            Self::AtomicFetchAdd { .. } => "ATOMIC_FETCH_AND_ADD",
            Self::BindMw { .. } => "BIND_MW",
            Self::LocalInv { .. } => "LOCAL_INV",
        }
    }
}

/// Where the data of a send comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// Gathered by the device from registered memory at execution time.
    Sges(&'a [Sge]),
    /// Copied into the WQE at post time (the slice may be reused as soon as post returns).
    Inline(&'a [u8]),
}

impl Payload<'_> {
    /// Total payload length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Self::Sges(sges) => sges.iter().map(|s| u64::from(s.length)).sum(),
            Self::Inline(bytes) => bytes.len() as u64,
        }
    }

    /// True when the payload carries no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// UD destination of a send (`wr.ud` in `struct ibv_send_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest<'a> {
    /// Address vector of the destination (from an address handle).
    pub av: &'a AddressVector,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Q_Key; if bit 31 is set the sending QP's own Q_Key is used (IBA 10.2.5).
    pub remote_qkey: u32,
    /// The protection domain of the address handle `av` belongs to, when it came from one
    /// (an address handle's `dest` fills it in): the post refuses a handle of a domain other
    /// than the QP's (IBA 10.2.3). `None` for a vector built by hand, which has no domain to
    /// check.
    pub ah_pd: Option<u32>,
}

/// One send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Operation and operands.
    pub op: SendOp,
    /// Data (gather list or inline bytes). For RDMA READ and atomics: the local scatter list.
    pub payload: Payload<'a>,
    /// Flags.
    pub flags: SendFlags,
    /// UD destination; must be `Some` exactly on UD QPs.
    pub ud: Option<UdDest<'a>>,
}

impl<'a> SendWr<'a> {
    /// A request with no payload and no flags.
    pub fn new(wr_id: u64, op: SendOp) -> Self {
        Self {
            wr_id,
            op,
            payload: Payload::Sges(&[]),
            flags: SendFlags::empty(),
            ud: None,
        }
    }

    /// Sets a gather list.
    pub fn sges(mut self, sges: &'a [Sge]) -> Self {
        self.payload = Payload::Sges(sges);
        self
    }

    /// Sets inline data (and the INLINE flag).
    pub fn inline(mut self, bytes: &'a [u8]) -> Self {
        self.payload = Payload::Inline(bytes);
        self.flags |= SendFlags::INLINE;
        self
    }

    /// Adds flags.
    pub fn flags(mut self, flags: SendFlags) -> Self {
        self.flags |= flags;
        self
    }

    /// Asks for a completion.
    pub fn signaled(self) -> Self {
        self.flags(SendFlags::SIGNALED)
    }

    /// Sets the UD destination.
    pub fn ud(mut self, dest: UdDest<'a>) -> Self {
        self.ud = Some(dest);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_length_sums_sges() {
        let sges = [
            Sge {
                addr: 0,
                length: 10,
                lkey: 1,
            },
            Sge {
                addr: 0,
                length: 22,
                lkey: 1,
            },
        ];
        assert_eq!(Payload::Sges(&sges).len(), 32);
        assert_eq!(Payload::Inline(b"abc").len(), 3);
        assert!(Payload::Sges(&[]).is_empty());
    }

    #[test]
    fn builder_sets_inline_flag() {
        let wr = SendWr::new(7, SendOp::Send).inline(b"hi").signaled();
        assert!(wr.flags.contains(SendFlags::INLINE | SendFlags::SIGNALED));
        assert_eq!(wr.wr_id, 7);
    }

    #[test]
    fn op_kinds_are_distinct_flags() {
        let remote = RemoteAddr::default();
        let bind = MwBind {
            new_rkey: 0,
            mw_type: MwType::Type1,
            mr_lkey: 0,
            addr: 0,
            length: 0,
            access: AccessFlags::empty(),
        };
        let ops = SendOp::one_of_each(remote, bind);
        let mut all = SendOps::empty();
        for op in ops {
            let k = op.kind();
            assert_eq!(k.bits().count_ones(), 1, "{op:?}");
            assert!(!all.intersects(k), "{op:?} shares a flag");
            assert_eq!(
                SendOps::READ_OR_ATOMIC.contains(k),
                op.is_read_or_atomic(),
                "{op:?}"
            );
            assert_eq!(SendOps::LOCAL.contains(k), op.is_local(), "{op:?}");
            all |= k;
        }
        assert_eq!(all, SendOps::all());
    }

    #[test]
    fn each_transport_allows_what_the_spec_gives_it() {
        let send = SendOps::SEND | SendOps::SEND_WITH_IMM;
        assert_eq!(SendOps::of_transport(QpType::Ud), send);
        let uc = SendOps::of_transport(QpType::Uc);
        assert_eq!(
            uc,
            send | SendOps::RDMA_WRITE
                | SendOps::RDMA_WRITE_WITH_IMM
                | SendOps::BIND_MW
                | SendOps::LOCAL_INV
        );
        assert!(!uc.intersects(SendOps::READ_OR_ATOMIC | SendOps::SEND_WITH_INV));
        assert_eq!(SendOps::of_transport(QpType::Rc), SendOps::all());
    }

    #[test]
    fn op_classes() {
        let remote = RemoteAddr::default();
        assert!(SendOp::RdmaRead { remote }.is_read_or_atomic());
        assert!(SendOp::RdmaWriteWithImm { remote, imm: 1 }.consumes_recv());
        assert!(!SendOp::RdmaWrite { remote }.consumes_recv());
        assert!(SendOp::LocalInv { rkey: 1 }.is_local());
    }
}
