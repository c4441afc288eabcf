//! Errors of the CM service layer.

use std::net::{IpAddr, SocketAddr};

use thiserror::Error;

use portverbs_cm::CmError;
use portverbs_cm::wire::RejReason;

/// Why a CM service call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The protocol core refused the call (wrong state, bad parameter, service in use …).
    #[error(transparent)]
    Cm(#[from] CmError),
    /// The CMA header could not be written.
    #[error(transparent)]
    Cma(#[from] portverbs_cm::CmaError),
    /// A verbs call on QP1, its CQ, an address handle or the application's QP failed.
    #[error("{op}: {detail}")]
    Verbs {
        /// What was being done.
        op: &'static str,
        /// The verbs error, rendered.
        detail: String,
    },
    /// No GID table entry of the device holds the RoCE GID of this IP address.
    #[error("{0} is not an address of this device")]
    AddressNotLocal(IpAddr),
    /// Source and destination addresses are of different IP versions.
    #[error("address families differ: {0} and {1}")]
    FamilyMismatch(IpAddr, IpAddr),
    /// Another listener of this device is bound to the address's port in the same port
    /// space, and still lives (librdmacm's `rdma_bind_addr` fails with `EADDRINUSE`).
    #[error("address {0} is already in use")]
    AddressInUse(SocketAddr),
    /// A connection parameter is out of range: above the device's limit (a depth above
    /// `max_qp_rd_atom` or `max_qp_init_rd_atom`) or its field's (librdmacm's `EINVAL`).
    /// Checked before anything is sent.
    #[error("{name} = {value} is invalid: at most {max}")]
    InvalidParam {
        /// The parameter.
        name: &'static str,
        /// What was asked.
        value: u32,
        /// The largest value allowed.
        max: u32,
    },
    /// A listener needs a port (0 is not assigned automatically).
    #[error("listening needs a non-zero port")]
    PortZero,
    /// `connect` before `resolve`.
    #[error("no destination resolved: call resolve first")]
    NotResolved,
    /// The QP is already associated with a connection of this device.
    #[error("QP {0:#x} already belongs to a connection")]
    QpInUse(u32),
    /// The QP given is not the one this connection uses.
    #[error("QP {0:#x} is not this connection's QP")]
    WrongQp(u32),
    /// A UD service is answered with a UD QP.
    #[error("QP {0:#x} is not a UD QP")]
    NotUd(u32),
    /// The SIDR_REP refused (no listener, or the listener declined).
    #[error("service resolution refused: {0:?}")]
    ServiceRejected(portverbs_cm::wire::SidrStatus),
    /// Only RC QPs are connected by this layer.
    #[error("QP {0:#x} is not an RC QP")]
    NotRc(u32),
    /// The peer refused (REJ), with its reason and private data.
    #[error("rejected by the peer: {reason:?}")]
    Rejected {
        /// The REJ reason.
        reason: RejReason,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// The CM gave up: no answer after every retransmission.
    #[error("the peer did not answer")]
    Unreachable,
    /// Applying a QP transition the CM asked for failed; the connection was abandoned.
    #[error("QP transition failed: {0}")]
    ConnectError(String),
    /// The connection ended before the awaited event.
    #[error("the connection is closed")]
    Closed,
    /// Private data longer than the message holds after the CMA header.
    #[error("{len} bytes of private data; at most {max} fit")]
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes that fit.
        max: usize,
    },
    /// The address given to a multicast join is not an IP multicast group (224.0.0.0/4,
    /// ff00::/8).
    #[error("{0} is not a multicast address")]
    NotMulticast(IpAddr),
    /// Attaching the QP to the group or detaching it failed (the device has no multicast, a
    /// device limit, a group the QP is not in).
    #[error(transparent)]
    Multicast(portverbs_verbs::McastError),
    /// Nothing arrived before the caller's timeout.
    #[error("timed out")]
    TimedOut,
}

impl ServiceError {
    pub(crate) fn verbs(op: &'static str, e: impl std::fmt::Display) -> Self {
        Self::Verbs {
            op,
            detail: e.to_string(),
        }
    }
}
