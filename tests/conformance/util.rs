//! Helpers shared by the conformance cases: QP bring-up with the library's connect calls (and
//! the masks rdma-core's pyverbs uses, for the cases that step through the transitions by
//! hand), and a connected RC/UC pair with registered buffers on both sides.

#![allow(dead_code)]

use portverbs::prelude::*;
use portverbs::verbs::{ConnectOptions, QpEndpoint};

use super::env::Env;

/// Attribute masks of rdma-core's `QP.to_init/to_rtr/to_rts` (`pyverbs/qp.pyx`), for the cases that
/// modify by hand.
pub fn init_mask(t: QpType) -> QpAttrMask {
    match t {
        QpType::Ud => {
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY
        }
        _ => {
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS
        }
    }
}

pub fn rtr_mask(t: QpType) -> QpAttrMask {
    match t {
        QpType::Ud => QpAttrMask::STATE,
        QpType::Uc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
        }
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER
        }
    }
}

pub fn rts_mask(t: QpType) -> QpAttrMask {
    match t {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::SQ_PSN
                | QpAttrMask::MAX_QP_RD_ATOMIC
        }
        _ => QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    }
}

pub const QKEY: u32 = 0x1111_2222;

/// Connection parameters (what `ibv_rc_pingpong` uses unless a test changes them).
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub access: AccessFlags,
    pub mtu: Mtu,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub rd_atomic: u8,
    pub psn: u32,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: 4,
            psn: 0x1234,
        }
    }
}

impl Params {
    /// The same values as connection options for `Qp::connect_rc` and its siblings.
    pub fn options(&self) -> ConnectOptions {
        ConnectOptions {
            psn: self.psn,
            mtu: Some(self.mtu),
            access: self.access,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            min_rnr_timer: self.min_rnr_timer,
            max_rd_atomic: self.rd_atomic,
            max_dest_rd_atomic: self.rd_atomic,
            qkey: QKEY,
            ..ConnectOptions::default()
        }
    }
}

/// Connects `qp` to `remote` with the library's ladder (`connect_rc`, `connect_uc`, or
/// `ready_ud`, which ignores `remote`).
pub fn connect_qp(qp: &Qp, remote: &QpEndpoint, p: &Params) {
    let opts = p.options();
    match qp.qp_type() {
        QpType::Rc => qp.connect_rc_blocking(remote, &opts),
        QpType::Uc => qp.connect_uc_blocking(remote, &opts),
        QpType::Ud => qp.ready_ud_blocking(&opts),
    }
    .unwrap();
}

/// The endpoint of `qp` (as its peer must see it) with the parameters `p`.
pub fn endpoint(qp: &Qp, p: &Params) -> QpEndpoint {
    qp.endpoint_blocking(&p.options()).unwrap()
}

/// RESET → INIT with the library's `Qp::init` (the options of `p`), so that receives can be
/// posted before the peer is connected.
pub fn to_init(qp: &Qp, p: &Params) {
    qp.init_blocking(&p.options()).unwrap();
}

/// INIT → RTR → RTS toward `remote_qpn` at `remote_gid` with the library's ladder (the peer
/// is taken to send from `p.psn` too).
pub fn to_rts(qp: &Qp, remote_qpn: u32, remote_gid: Gid, p: &Params) {
    let remote = QpEndpoint {
        lid: 0,
        qpn: remote_qpn,
        psn: p.psn,
        gid: remote_gid,
    };
    connect_qp(qp, &remote, p);
}

/// One side of a connected pair.
pub struct Side {
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub buf: Buffer,
    pub mr: Mr,
}

impl Side {
    pub fn new(
        ctx: &Context,
        t: QpType,
        caps: QpCaps,
        buf_len: usize,
        access: AccessFlags,
    ) -> Self {
        let pd = ctx.alloc_pd_blocking().unwrap();
        let cq = ctx
            .create_cq_blocking(CqInit {
                entries: 256,
                ..CqInit::default()
            })
            .unwrap();
        let qp = pd
            .create_qp_blocking(QpInit {
                qp_type: t,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps,
                sq_sig_all: false,
                special: None,
            })
            .unwrap();
        let buf = ctx.alloc_buffer(buf_len).unwrap();
        let mr = pd.reg_mr_blocking(&buf, 0..buf_len, access).unwrap();
        Self {
            pd,
            cq,
            qp,
            buf,
            mr,
        }
    }

    /// An SGE over `len` bytes at `offset` of the side's MR.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        self.mr
            .sge(offset as usize, len as usize)
            .expect("an SGE inside the side's MR")
    }

    /// This side's buffer as a remote target.
    pub fn remote(&self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.mr.addr() + offset,
            rkey: self.mr.rkey().expect("remote access"),
        }
    }

    pub fn post_recv(&self, wr_id: u64, offset: u64, len: u32) {
        self.qp
            .post_recv(&[RecvWr {
                wr_id,
                sges: &[self.sge(offset, len)],
            }])
            .unwrap();
    }
}

pub const CAPS: QpCaps = QpCaps {
    max_send_wr: 64,
    max_recv_wr: 64,
    max_send_sge: 4,
    max_recv_sge: 4,
    max_inline_data: 128,
};

pub const FULL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC)
    .union(AccessFlags::MW_BIND);

/// A connected pair of the given transport with 64 KiB registered on each side.
pub struct Pair {
    pub a: Side,
    pub b: Side,
}

impl Pair {
    pub fn new(env: &Env, t: QpType) -> Self {
        Self::with(env, t, &Params::default(), FULL_ACCESS)
    }

    pub fn with(env: &Env, t: QpType, p: &Params, mr_access: AccessFlags) -> Self {
        let a = Side::new(env.a(), t, CAPS, 1 << 16, mr_access);
        let b = Side::new(env.b(), t, CAPS, 1 << 16, mr_access);
        let (ea, eb) = (endpoint(&a.qp, p), endpoint(&b.qp, p));
        connect_qp(&a.qp, &eb, p);
        connect_qp(&b.qp, &ea, p);
        Self { a, b }
    }
}

/// `Mr::sge` with the suite's integer types, for an entry known to lie inside the MR.
pub trait SgeAt {
    fn sge_at(&self, offset: u64, len: u32) -> Sge;
}

impl SgeAt for Mr {
    fn sge_at(&self, offset: u64, len: u32) -> Sge {
        self.sge(offset as usize, len as usize)
            .expect("an SGE inside the MR")
    }
}

/// Deterministic test data.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A CQ of `entries` entries without a completion channel.
pub fn cq(ctx: &Context, entries: u32) -> Cq {
    ctx.create_cq_blocking(CqInit {
        entries,
        ..CqInit::default()
    })
    .unwrap()
}

/// A CQ of `entries` entries whose events go to `ch`.
pub fn channel_cq(ctx: &Context, ch: &CompletionChannel, entries: u32) -> Cq {
    ctx.create_cq_blocking(CqInit {
        entries,
        comp_vector: 0,
        channel: Some(ch),
    })
    .unwrap()
}

/// Whether the context's device lists `id` in its quirks table.
pub fn has_quirk(ctx: &Context, id: portverbs::hal::QuirkId) -> bool {
    ctx.device().info().quirks.iter().any(|q| q.id == id)
}
