//! REQ, ConnectRequest (attribute 0x0010, IBA chapter 12; Linux `include/rdma/ibta_vol1_c12.h`).

use super::bits::{
    Payload, array_at, bits_at, put_bits, put_bytes, put_u16, put_u24, put_u32, put_u64, u16_at,
    u24_at, u32_at, u64_at,
};
use portverbs_hal::Gid;

/// Byte offsets of the REQ fields (relative to the CM payload).
mod field {
    pub(super) const LOCAL_COMM_ID: usize = 0;
    pub(super) const VENDOR_ID: usize = 5;
    pub(super) const SERVICE_ID: usize = 8;
    pub(super) const LOCAL_CA_GUID: usize = 16;
    pub(super) const LOCAL_QKEY: usize = 28;
    pub(super) const LOCAL_QPN: usize = 32;
    pub(super) const RESPONDER_RESOURCES: usize = 35;
    pub(super) const LOCAL_EECN: usize = 36;
    pub(super) const INITIATOR_DEPTH: usize = 39;
    pub(super) const REMOTE_EECN: usize = 40;
    /// Remote CM response timeout (7..3), transport type (2..1), end-to-end flow control (0).
    pub(super) const BYTE43: usize = 43;
    pub(super) const STARTING_PSN: usize = 44;
    /// Local CM response timeout (7..3), retry count (2..0).
    pub(super) const BYTE47: usize = 47;
    pub(super) const PKEY: usize = 48;
    /// Path MTU (7..4), RDC exists (3), RNR retry count (2..0).
    pub(super) const BYTE50: usize = 50;
    /// Max CM retries (7..4), SRQ (3), extended transport type (2..0).
    pub(super) const BYTE51: usize = 51;
    pub(super) const PRIMARY: usize = 52;
    pub(super) const ALTERNATE: usize = 96;
    /// Alternate local ACK timeout (7..3) and SAP supported (2).
    pub(super) const BYTE139: usize = 139;
    pub(super) const PRIVATE_DATA: usize = 140;
}

/// Offsets inside one path block (primary at 52, alternate at 96).
mod path {
    pub(super) const LOCAL_LID: usize = 0;
    pub(super) const REMOTE_LID: usize = 2;
    pub(super) const LOCAL_GID: usize = 4;
    pub(super) const REMOTE_GID: usize = 20;
    /// 32-bit word: flow label in bits 31..12.
    pub(super) const FLOW_WORD: usize = 36;
    pub(super) const PACKET_RATE: usize = 39;
    pub(super) const TRAFFIC_CLASS: usize = 40;
    pub(super) const HOP_LIMIT: usize = 41;
    /// SL (7..4), subnet local (3).
    pub(super) const SL_BYTE: usize = 42;
    /// Local ACK timeout (7..3).
    pub(super) const ACK_TIMEOUT: usize = 43;
}

/// Private data bytes a REQ carries.
pub const REQ_PRIVATE_DATA: usize = 92;

/// One path of a REQ (primary or alternate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReqPath {
    /// Local port LID (0xFFFF, permissive, on RoCEv2).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// The sender's GID.
    pub local_gid: Gid,
    /// The receiver's GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits, masked on emit).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits, 4.096 µs·2^x).
    pub local_ack_timeout: u8,
}

impl ReqPath {
    fn parse(p: &Payload, base: usize) -> Self {
        Self {
            local_lid: u16_at(p, base + path::LOCAL_LID),
            remote_lid: u16_at(p, base + path::REMOTE_LID),
            local_gid: Gid(array_at(p, base + path::LOCAL_GID)),
            remote_gid: Gid(array_at(p, base + path::REMOTE_GID)),
            flow_label: u32_at(p, base + path::FLOW_WORD) >> 12,
            packet_rate: p[base + path::PACKET_RATE] & 0x3F,
            traffic_class: p[base + path::TRAFFIC_CLASS],
            hop_limit: p[base + path::HOP_LIMIT],
            sl: bits_at(p, base + path::SL_BYTE, 7, 4),
            subnet_local: bits_at(p, base + path::SL_BYTE, 3, 1) != 0,
            local_ack_timeout: bits_at(p, base + path::ACK_TIMEOUT, 7, 5),
        }
    }

    fn emit(&self, p: &mut Payload, base: usize) {
        put_u16(p, base + path::LOCAL_LID, self.local_lid);
        put_u16(p, base + path::REMOTE_LID, self.remote_lid);
        put_bytes(p, base + path::LOCAL_GID, &self.local_gid.0);
        put_bytes(p, base + path::REMOTE_GID, &self.remote_gid.0);
        put_u32(
            p,
            base + path::FLOW_WORD,
            (self.flow_label & 0xF_FFFF) << 12,
        );
        p[base + path::PACKET_RATE] |= self.packet_rate & 0x3F;
        p[base + path::TRAFFIC_CLASS] = self.traffic_class;
        p[base + path::HOP_LIMIT] = self.hop_limit;
        put_bits(p, base + path::SL_BYTE, 7, 4, self.sl);
        put_bits(p, base + path::SL_BYTE, 3, 1, self.subnet_local.into());
        put_bits(p, base + path::ACK_TIMEOUT, 7, 5, self.local_ack_timeout);
    }
}

/// REQ: the active side asks for a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// ECE vendor ID (24 bits; 0 when unused).
    pub vendor_id: u32,
    /// Service ID (rdma_cm's: port space << 16 | port, as Linux `cma.c` builds it).
    pub service_id: u64,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key (0 for RC/UC).
    pub local_qkey: u32,
    /// The sender's QPN (24 bits).
    pub local_qpn: u32,
    /// READ/ATOMIC the sender accepts as responder.
    pub responder_resources: u8,
    /// Local EECN (24 bits, RD only).
    pub local_eecn: u32,
    /// READ/ATOMIC the sender issues at once.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Time the receiver may take to answer (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits: 0 RC, 1 UC, 2 RD, 3 extended).
    pub transport: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The PSN the receiver starts sending with (24 bits).
    pub starting_psn: u32,
    /// Time the sender takes to answer a REP (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (IB enum, 4 bits).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count the receiver's QP uses (3 bits).
    pub rnr_retry_count: u8,
    /// CM retransmissions (4 bits).
    pub max_cm_retries: u8,
    /// The sender uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport: u8,
    /// The primary path.
    pub primary: ReqPath,
    /// The alternate path (all zero when there is none).
    pub alternate: ReqPath,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data.
    pub private_data: [u8; REQ_PRIVATE_DATA],
}

impl Req {
    pub(super) fn parse(p: &Payload) -> Self {
        Self {
            local_comm_id: u32_at(p, field::LOCAL_COMM_ID),
            vendor_id: u24_at(p, field::VENDOR_ID),
            service_id: u64_at(p, field::SERVICE_ID),
            local_ca_guid: u64_at(p, field::LOCAL_CA_GUID),
            local_qkey: u32_at(p, field::LOCAL_QKEY),
            local_qpn: u24_at(p, field::LOCAL_QPN),
            responder_resources: p[field::RESPONDER_RESOURCES],
            local_eecn: u24_at(p, field::LOCAL_EECN),
            initiator_depth: p[field::INITIATOR_DEPTH],
            remote_eecn: u24_at(p, field::REMOTE_EECN),
            remote_cm_response_timeout: bits_at(p, field::BYTE43, 7, 5),
            transport: bits_at(p, field::BYTE43, 2, 2),
            end_to_end_flow_control: bits_at(p, field::BYTE43, 0, 1) != 0,
            starting_psn: u24_at(p, field::STARTING_PSN),
            local_cm_response_timeout: bits_at(p, field::BYTE47, 7, 5),
            retry_count: bits_at(p, field::BYTE47, 2, 3),
            pkey: u16_at(p, field::PKEY),
            path_mtu: bits_at(p, field::BYTE50, 7, 4),
            rdc_exists: bits_at(p, field::BYTE50, 3, 1) != 0,
            rnr_retry_count: bits_at(p, field::BYTE50, 2, 3),
            max_cm_retries: bits_at(p, field::BYTE51, 7, 4),
            srq: bits_at(p, field::BYTE51, 3, 1) != 0,
            extended_transport: bits_at(p, field::BYTE51, 2, 3),
            primary: ReqPath::parse(p, field::PRIMARY),
            alternate: ReqPath::parse(p, field::ALTERNATE),
            sap_supported: bits_at(p, field::BYTE139, 2, 1) != 0,
            private_data: array_at(p, field::PRIVATE_DATA),
        }
    }

    pub(super) fn emit(&self, p: &mut Payload) {
        put_u32(p, field::LOCAL_COMM_ID, self.local_comm_id);
        put_u24(p, field::VENDOR_ID, self.vendor_id);
        put_u64(p, field::SERVICE_ID, self.service_id);
        put_u64(p, field::LOCAL_CA_GUID, self.local_ca_guid);
        put_u32(p, field::LOCAL_QKEY, self.local_qkey);
        put_u24(p, field::LOCAL_QPN, self.local_qpn);
        p[field::RESPONDER_RESOURCES] = self.responder_resources;
        put_u24(p, field::LOCAL_EECN, self.local_eecn);
        p[field::INITIATOR_DEPTH] = self.initiator_depth;
        put_u24(p, field::REMOTE_EECN, self.remote_eecn);
        put_bits(p, field::BYTE43, 7, 5, self.remote_cm_response_timeout);
        put_bits(p, field::BYTE43, 2, 2, self.transport);
        put_bits(p, field::BYTE43, 0, 1, self.end_to_end_flow_control.into());
        put_u24(p, field::STARTING_PSN, self.starting_psn);
        put_bits(p, field::BYTE47, 7, 5, self.local_cm_response_timeout);
        put_bits(p, field::BYTE47, 2, 3, self.retry_count);
        put_u16(p, field::PKEY, self.pkey);
        put_bits(p, field::BYTE50, 7, 4, self.path_mtu);
        put_bits(p, field::BYTE50, 3, 1, self.rdc_exists.into());
        put_bits(p, field::BYTE50, 2, 3, self.rnr_retry_count);
        put_bits(p, field::BYTE51, 7, 4, self.max_cm_retries);
        put_bits(p, field::BYTE51, 3, 1, self.srq.into());
        put_bits(p, field::BYTE51, 2, 3, self.extended_transport);
        self.primary.emit(p, field::PRIMARY);
        self.alternate.emit(p, field::ALTERNATE);
        put_bits(p, field::BYTE139, 2, 1, self.sap_supported.into());
        put_bytes(p, field::PRIVATE_DATA, &self.private_data);
    }
}
