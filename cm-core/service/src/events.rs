//! Events in librdmacm's vocabulary.

use portverbs_cm::wire::{RejReason, SidrStatus};

/// What happened to a connection endpoint, named after librdmacm's `RDMA_CM_EVENT_*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdmaCmEvent {
    /// `ADDR_RESOLVED`: the destination IP has a GID and a local device/port was chosen.
    AddrResolved,
    /// `ROUTE_RESOLVED`: the path to the destination is known (RoCE: immediate).
    RouteResolved,
    /// `CONNECT_REQUEST`: a listener got a request (see [`crate::Listener::get_request`]).
    ConnectRequest,
    /// `ESTABLISHED`: the connection is up; the REP's private data (active side) or the
    /// RTU's (passive side).
    Established {
        /// Private data that came with it.
        private_data: Vec<u8>,
    },
    /// `REJECTED`: the peer refused.
    Rejected {
        /// The REJ reason.
        reason: RejReason,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// `ESTABLISHED` of a UD (`RDMA_PS_UDP`) endpoint: the SIDR_REP's answer.
    ServiceResolved {
        /// The SIDR_REP status.
        status: SidrStatus,
        /// The service's UD QPN.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// The SIDR_REP's private data (136 bytes).
        private_data: Vec<u8>,
    },
    /// `UNREACHABLE`: no answer after every CM retransmission.
    Unreachable,
    /// `CONNECT_ERROR`: a QP transition the CM asked for failed.
    ConnectError {
        /// The verbs error.
        detail: String,
    },
    /// `DISCONNECTED`: the connection ended (DREQ received or ours completed).
    Disconnected,
    /// `TIMEWAIT_EXIT`: the QP may be reused.
    TimewaitExit,
    /// `DEVICE_REMOVAL`: QP1's CQ failed; the device is gone.
    DeviceRemoval,
}
