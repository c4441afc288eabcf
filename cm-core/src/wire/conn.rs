//! MRA, REP, RTU, DREQ and DREP (IBA chapter 12; Linux `include/rdma/ibta_vol1_c12.h`).

use super::MsgKind;
use super::bits::{
    Payload, array_at, bits_at, put_bits, put_bytes, put_u24, put_u32, put_u64, u24_at, u32_at,
    u64_at,
};

/// MRA, MsgRcptAck: "your message arrived, give me longer to answer".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged (0 REQ, 1 REP, 2 LAP/other).
    pub msg_mraed: MsgKind,
    /// Service timeout (5 bits, 4.096 µs·2^x).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; 222],
}

impl Mra {
    pub(super) fn parse(p: &Payload) -> Self {
        Self {
            local_comm_id: u32_at(p, 0),
            remote_comm_id: u32_at(p, 4),
            msg_mraed: MsgKind::from_bits(bits_at(p, 8, 7, 2)),
            service_timeout: bits_at(p, 9, 7, 5),
            private_data: array_at(p, 10),
        }
    }

    pub(super) fn emit(&self, p: &mut Payload) {
        put_u32(p, 0, self.local_comm_id);
        put_u32(p, 4, self.remote_comm_id);
        put_bits(p, 8, 7, 2, self.msg_mraed.to_bits());
        put_bits(p, 9, 7, 5, self.service_timeout);
        put_bytes(p, 10, &self.private_data);
    }
}

/// Private data bytes a REP carries.
pub const REP_PRIVATE_DATA: usize = 196;

/// REP, ConnectReply: the passive side accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The REQ sender's communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key (0 for RC/UC).
    pub local_qkey: u32,
    /// The sender's QPN (24 bits).
    pub local_qpn: u32,
    /// Local EE context number (24 bits).
    pub local_eecn: u32,
    /// The PSN the REQ sender starts sending with (24 bits).
    pub starting_psn: u32,
    /// ECE vendor ID (24 bits, split over bytes 15, 19 and 23).
    pub vendor_id: u32,
    /// READ/ATOMIC the sender accepts as responder.
    pub responder_resources: u8,
    /// READ/ATOMIC the sender issues at once.
    pub initiator_depth: u8,
    /// The sender's CA ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits, 0 = accepted).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count the REQ sender's QP uses (3 bits).
    pub rnr_retry_count: u8,
    /// The sender uses an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; REP_PRIVATE_DATA],
}

impl Rep {
    pub(super) fn parse(p: &Payload) -> Self {
        Self {
            local_comm_id: u32_at(p, 0),
            remote_comm_id: u32_at(p, 4),
            local_qkey: u32_at(p, 8),
            local_qpn: u24_at(p, 12),
            local_eecn: u24_at(p, 16),
            starting_psn: u24_at(p, 20),
            vendor_id: u32::from_be_bytes([0, p[15], p[19], p[23]]),
            responder_resources: p[24],
            initiator_depth: p[25],
            target_ack_delay: bits_at(p, 26, 7, 5),
            failover_accepted: bits_at(p, 26, 2, 2),
            end_to_end_flow_control: bits_at(p, 26, 0, 1) != 0,
            rnr_retry_count: bits_at(p, 27, 7, 3),
            srq: bits_at(p, 27, 4, 1) != 0,
            local_ca_guid: u64_at(p, 28),
            private_data: array_at(p, 36),
        }
    }

    pub(super) fn emit(&self, p: &mut Payload) {
        put_u32(p, 0, self.local_comm_id);
        put_u32(p, 4, self.remote_comm_id);
        put_u32(p, 8, self.local_qkey);
        put_u24(p, 12, self.local_qpn);
        put_u24(p, 16, self.local_eecn);
        put_u24(p, 20, self.starting_psn);
        let [_, v0, v1, v2] = self.vendor_id.to_be_bytes();
        (p[15], p[19], p[23]) = (v0, v1, v2);
        p[24] = self.responder_resources;
        p[25] = self.initiator_depth;
        put_bits(p, 26, 7, 5, self.target_ack_delay);
        put_bits(p, 26, 2, 2, self.failover_accepted);
        put_bits(p, 26, 0, 1, self.end_to_end_flow_control.into());
        put_bits(p, 27, 7, 3, self.rnr_retry_count);
        put_bits(p, 27, 4, 1, self.srq.into());
        put_u64(p, 28, self.local_ca_guid);
        put_bytes(p, 36, &self.private_data);
    }
}

/// RTU, ReadyToUse: the active side confirms the REP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rtu {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; 224],
}

impl Rtu {
    pub(super) fn parse(p: &Payload) -> Self {
        Self {
            local_comm_id: u32_at(p, 0),
            remote_comm_id: u32_at(p, 4),
            private_data: array_at(p, 8),
        }
    }

    pub(super) fn emit(&self, p: &mut Payload) {
        put_u32(p, 0, self.local_comm_id);
        put_u32(p, 4, self.remote_comm_id);
        put_bytes(p, 8, &self.private_data);
    }
}

/// DREQ, DisconnectRequest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dreq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QPN (24 bits); Linux ignores a DREQ where it differs.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; 220],
}

impl Dreq {
    pub(super) fn parse(p: &Payload) -> Self {
        Self {
            local_comm_id: u32_at(p, 0),
            remote_comm_id: u32_at(p, 4),
            remote_qpn: u24_at(p, 8),
            private_data: array_at(p, 12),
        }
    }

    pub(super) fn emit(&self, p: &mut Payload) {
        put_u32(p, 0, self.local_comm_id);
        put_u32(p, 4, self.remote_comm_id);
        put_u24(p, 8, self.remote_qpn);
        put_bytes(p, 12, &self.private_data);
    }
}

/// DREP, DisconnectReply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; 224],
}

impl Drep {
    pub(super) fn parse(p: &Payload) -> Self {
        Self {
            local_comm_id: u32_at(p, 0),
            remote_comm_id: u32_at(p, 4),
            private_data: array_at(p, 8),
        }
    }

    pub(super) fn emit(&self, p: &mut Payload) {
        put_u32(p, 0, self.local_comm_id);
        put_u32(p, 4, self.remote_comm_id);
        put_bytes(p, 8, &self.private_data);
    }
}
