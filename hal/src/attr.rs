//! Queue-pair attributes, the attribute mask, capabilities and address vectors, in the shape of
//! `struct ibv_qp_attr` / `enum ibv_qp_attr_mask` / `struct ibv_qp_cap` / `struct ibv_ah_attr`.

use crate::types::{AccessFlags, Gid, Mtu, QpState};

bitflags::bitflags! {
    /// Which fields of a [`QpAttr`] a modify (or query) concerns (`enum ibv_qp_attr_mask` values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `qp_state` (always required by modify).
        const STATE = 1;
        /// `cur_qp_state`.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `port_num`.
        const PORT = 1 << 5;
        /// `qkey`.
        const QKEY = 1 << 6;
        /// `ah_attr` (the primary address vector).
        const AV = 1 << 7;
        /// `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `timeout` (local ACK timeout).
        const TIMEOUT = 1 << 9;
        /// `retry_cnt`.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry`.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic` (initiator depth).
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr` and friends (automatic path migration).
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic` (responder resources).
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18;
        /// `cap`.
        const CAP = 1 << 19;
        /// `dest_qp_num`.
        const DEST_QPN = 1 << 20;
    }
}

/// Queue-pair capacities (`struct ibv_qp_cap`). On create these are requests; the device
/// answers with what it granted (always ≥ the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCaps {
    /// Send work requests that may be outstanding.
    pub max_send_wr: u32,
    /// Receive work requests that may be outstanding.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive WR.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WR.
    pub max_inline_data: u32,
}

/// An address vector (`struct ibv_ah_attr` plus its `ibv_global_route`): where a UD datagram
/// or a connected QP's packets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressVector {
    /// Destination GID (RoCE: the peer's IP as a GID).
    pub dgid: Gid,
    /// Index of the local GID to send from.
    pub sgid_index: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit (IPv4 TTL on RoCEv2), put in the packet as given, as Linux's rxe does. 0
    /// (what [`Default`] and a zeroed `ibv_ah_attr` give) lets no router forward the packet:
    /// an address vector for a routed peer needs one chosen from the route, as rdma_cm
    /// chooses 64 (the IP route's TTL) and `ibv_ud_pingpong` 1 (one subnet).
    pub hop_limit: u8,
    /// Traffic class / DSCP+ECN.
    pub traffic_class: u8,
    /// A GRH is present (mandatory on RoCE).
    pub is_global: bool,
    /// Destination LID (InfiniBand link layer only).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate (0 = port rate).
    pub static_rate: u8,
    /// Local port number (1-based).
    pub port_num: u8,
}

/// Queue-pair attributes (`struct ibv_qp_attr`, without the alternate path: automatic path
/// migration is not offered, see `QuirkId::NoAutomaticPathMigration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state of a modify; current state of a query.
    pub qp_state: QpState,
    /// Assumed current state (`CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Expected receive PSN (24 bits).
    pub rq_psn: u32,
    /// Next send PSN (24 bits).
    pub sq_psn: u32,
    /// Destination QP number (RC/UC).
    pub dest_qp_num: u32,
    /// Remote access rights granted by the QP (RC/UC).
    pub qp_access_flags: AccessFlags,
    /// Capacities (query only here).
    pub cap: QpCaps,
    /// Primary address vector.
    pub ah_attr: AddressVector,
    /// P_Key table index.
    pub pkey_index: u16,
    /// Ask for an SQ-drained async event when entering SQD.
    pub en_sqd_async_notify: bool,
    /// Query only: the send queue is still draining.
    pub sq_draining: bool,
    /// Outstanding RDMA reads/atomics as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (IBA table; 0 = 655.36 ms).
    pub min_rnr_timer: u8,
    /// Port number (1-based).
    pub port_num: u8,
    /// Local ACK timeout code: 4.096 µs × 2^timeout, 0 = infinite.
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        Self {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            cap: QpCaps::default(),
            ah_attr: AddressVector::default(),
            pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}

impl QpAttr {
    /// Copies the attributes that `mask` names from `attr` into `self` (what a modify changes;
    /// the state fields are left to the caller, which checks the transition first).
    pub fn apply(&mut self, attr: &Self, mask: QpAttrMask) {
        macro_rules! take {
            ($flag:ident, $field:ident) => {
                if mask.contains(QpAttrMask::$flag) {
                    self.$field = attr.$field;
                }
            };
        }
        take!(ACCESS_FLAGS, qp_access_flags);
        take!(PKEY_INDEX, pkey_index);
        take!(PORT, port_num);
        take!(QKEY, qkey);
        take!(AV, ah_attr);
        take!(PATH_MTU, path_mtu);
        take!(TIMEOUT, timeout);
        take!(RETRY_CNT, retry_cnt);
        take!(RNR_RETRY, rnr_retry);
        take!(RQ_PSN, rq_psn);
        take!(MAX_QP_RD_ATOMIC, max_rd_atomic);
        take!(MIN_RNR_TIMER, min_rnr_timer);
        take!(SQ_PSN, sq_psn);
        take!(MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
        take!(DEST_QPN, dest_qp_num);
        take!(EN_SQD_ASYNC_NOTIFY, en_sqd_async_notify);
    }
}

/// The retransmission timeout of an IB `timeout` code, in nanoseconds: 4.096 µs × 2^code;
/// `None` for code 0 (infinite).
pub fn ack_timeout_ns(code: u8) -> Option<u64> {
    if code == 0 {
        return None;
    }
    Some(4096u64 << u32::from(code.min(31)))
}

/// The minimum RNR delay of an RNR-timer code, in nanoseconds (IBA table 45; code 0 = 655.36 ms).
pub fn rnr_timer_ns(code: u8) -> u64 {
    // Entries are in units of 10 µs (code 1 = 0.01 ms); code 0 (655.36 ms) is special-cased.
    const TABLE_10US: [u64; 32] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    let code = usize::from(code & 31);
    if code == 0 {
        655_360_000
    } else {
        TABLE_10US[code] * 10_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_copies_only_the_masked_attributes() {
        let mut cached = QpAttr::default();
        let attr = QpAttr {
            qp_state: QpState::Rts,
            timeout: 14,
            retry_cnt: 7,
            sq_psn: 99,
            qkey: 5,
            ..QpAttr::default()
        };
        cached.apply(&attr, QpAttrMask::TIMEOUT | QpAttrMask::SQ_PSN);
        assert_eq!((cached.timeout, cached.sq_psn), (14, 99));
        assert_eq!((cached.retry_cnt, cached.qkey), (0, 0), "not in the mask");
        assert_eq!(cached.qp_state, QpState::Reset, "states are the caller's");
    }

    #[test]
    fn attr_mask_values_match_libibverbs() {
        assert_eq!(QpAttrMask::AV.bits(), 128);
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
        assert_eq!(QpAttrMask::MAX_DEST_RD_ATOMIC.bits(), 1 << 17);
    }

    #[test]
    fn ack_timeout_follows_4096ns_power_of_two() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(1), Some(8192));
        assert_eq!(ack_timeout_ns(14), Some(4096 << 14));
    }

    #[test]
    fn rnr_timer_table_matches_iba() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(12), 640_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
    }
}
