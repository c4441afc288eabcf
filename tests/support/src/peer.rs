//! A soft device on a fabric with one of everything, driven through the HAL.

use std::sync::Arc;

use portverbs_hal::attr::QpCaps;
use portverbs_hal::device::{CqParams, EqKind, EqParams, MrParams, QpCreateParams};
use portverbs_hal::notify::NullSink;
use portverbs_hal::queue::{CompletionQueue, EventQueue};
use portverbs_hal::types::{AccessFlags, Gid, QpType};
use portverbs_hal::{BlockingDevice, Device, DmaMemory, QpResourcesOf};
use portverbs_soft::{DeviceConfig, Fabric, SoftCq, SoftDevice};

use crate::rts::{RtsParams, to_rts};

/// Length of a peer's registered buffer.
pub const PEER_MR_LEN: usize = 1 << 16;

/// A soft device with an async event queue, one CQ (both queues of the QP complete on it),
/// one QP (16 WRs each way, 1 SGE, 64 bytes inline) and one [`PEER_MR_LEN`]-byte buffer
/// registered with local write and every remote access.
#[derive(Debug)]
pub struct HalPeer {
    /// The device.
    pub dev: SoftDevice,
    /// The async event queue the CQ reports to; kept for as long as the peer lives.
    pub eq: Box<dyn EventQueue>,
    /// The CQ.
    pub cq: SoftCq,
    /// The QP's number and queues.
    pub qp: QpResourcesOf<SoftDevice>,
    /// The QP's transport.
    pub qp_type: QpType,
    /// The registered buffer.
    pub buf: Arc<dyn DmaMemory>,
    /// Its lkey.
    pub lkey: u32,
    /// Its rkey.
    pub rkey: u32,
    /// Its address in the MR.
    pub addr: u64,
    /// The port's GID.
    pub gid: Gid,
}

impl HalPeer {
    /// Attaches a soft device with address `ip` to `fabric` and creates the peer's objects.
    pub fn new(fabric: &Fabric, ip: &str, qp_type: QpType) -> Self {
        let dev = SoftDevice::attach(fabric, DeviceConfig::with_ip(ip.parse().expect("an IP")))
            .expect("the device attaches");
        let eq = dev
            .create_eq_blocking(
                EqParams {
                    entries: 64,
                    kind: EqKind::Async,
                },
                Arc::new(NullSink),
            )
            .expect("an EQ");
        let pd = dev.alloc_pd_blocking().expect("a PD");
        let cq = dev
            .create_cq_blocking(CqParams {
                entries: 64,
                eqn: eq.eqn(),
            })
            .expect("a CQ");
        let qp = dev
            .create_qp_blocking(QpCreateParams {
                pd,
                qp_type,
                send_cqn: cq.cqn(),
                recv_cqn: cq.cqn(),
                srqn: None,
                caps: QpCaps {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                special: None,
            })
            .expect("a QP");
        let buf = Device::alloc_dma(&dev, PEER_MR_LEN).expect("DMA memory");
        let keys = dev
            .register_mr_blocking(MrParams {
                pd,
                region: buf.clone(),
                offset: 0,
                length: PEER_MR_LEN,
                access: AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
            })
            .expect("an MR");
        Self {
            dev,
            eq,
            cq,
            qp,
            qp_type,
            buf,
            lkey: keys.lkey,
            rkey: keys.rkey,
            addr: keys.addr,
            gid: Gid::parse(ip).expect("a GID"),
        }
    }

    /// Brings the QP to RTS with `p` ([`to_rts`]).
    pub fn to_rts(&self, p: &RtsParams) {
        to_rts(self.qp_type, p, |a, m| {
            self.dev
                .modify_qp_blocking(self.qp.qpn, a, m)
                .expect("the modify is accepted");
        });
    }

    /// Brings the QP to RTS towards `dest_qpn` at `dgid` with PSN `psn` and the usual
    /// parameters ([`RtsParams::new`]).
    pub fn connect(&self, dest_qpn: u32, dgid: Gid, psn: u32) {
        self.to_rts(&RtsParams::new(dest_qpn, dgid, psn));
    }
}
