//! The seam to the shared transport engine: [`Hca`] reads the driver's mlx4 WQEs and writes
//! CQEs and EQEs; [`DeviceSide`] is what the model adds to the engine the fabric steps (the
//! send doorbells, kicks, that BAR2 forwards; the receive doorbell records it watches).
//!
//! There is no send producer index on mlx4: `sq_head` discovers posted WQEs by scanning from
//! the last known one while owner bits match the counter's wrap parity (as rdma-core
//! `providers/mlx4/qp.c` sets it).

use portverbs_fabric::DeviceSide;
use portverbs_hal::event::DeviceEvent;
use portverbs_hal::types::{QpState, QpType};
use portverbs_hal::wc::Cqe;
use portverbs_mlx4_layout::wqe::ctrl;
use portverbs_transport::{Engine, Hca, Packet, RecvSource, RecvWqe, SendWqe, WqeFault};

use super::Hw;
use super::wqe::{decode_mlx_send, decode_scatter, decode_send};
use crate::shared::Stats;

/// Send WQEs discovered per `sq_head` call at most (bounded work under the lock).
const SCAN_BURST: u32 = 64;

fn fault(reason: &'static str) -> WqeFault {
    WqeFault { reason }
}

impl Hca for Hw {
    fn sq_head(&self, qpn: u32) -> Option<u32> {
        let qp = self.qps.get(qpn)?;
        let sq = qp.sq.as_ref()?;
        let mut c = qp.sq_valid.get();
        let mut n = 0;
        while n < SCAN_BURST && c.wrapping_sub(qp.sq_read) < sq.entries() && sq.send_ready(c) {
            c = c.wrapping_add(1);
            n += 1;
        }
        qp.sq_valid.set(c);
        Some(c)
    }

    fn read_send_wqe(&mut self, qpn: u32, counter: u32, out: &mut SendWqe) -> Result<(), WqeFault> {
        let Self {
            qps,
            scratch,
            gsi_gids,
            ..
        } = self;
        let qp = qps.get_mut(qpn).ok_or(fault("no such QP"))?;
        let (qp_type, mlx) = (qp.qp_type, qp.mlx);
        let sq = qp.sq.as_ref().ok_or(fault("QP has no send queue"))?;
        let off = sq.offset(counter);
        let mut head = [0u8; 8];
        if !sq.buf.read(off, &mut head) {
            return Err(fault("send WQE unreadable"));
        }
        if !sq.owner_matches(head[0], counter) {
            return Err(fault("owner bit does not match the WQE counter"));
        }
        let size = usize::from(head[7] & ctrl::DS_MASK) * 16;
        if size == 0 || size > sq.stride() {
            return Err(fault("WQE size (ds) outside its slot"));
        }
        scratch.resize(size, 0);
        if !sq.buf.read(off, scratch) {
            return Err(fault("send WQE unreadable"));
        }
        qp.sq_read = counter.wrapping_add(1);
        if mlx {
            decode_mlx_send(scratch, gsi_gids, out)
        } else {
            decode_send(scratch, qp_type, out)
        }
    }

    fn take_recv_wqe(&mut self, source: RecvSource, out: &mut RecvWqe) -> Result<bool, WqeFault> {
        match source {
            RecvSource::Srq { srqn } => self.srq_take(srqn, out),
            RecvSource::Rq { qpn } => {
                let Self { qps, scratch, .. } = self;
                let Some(qp) = qps.get_mut(qpn) else {
                    return Ok(false);
                };
                let (Some(rq), Some(db)) = (&qp.rq, &qp.db) else {
                    return Ok(false);
                };
                let posted = db.be32(0).ok_or(fault("RQ doorbell record unreadable"))?;
                if (posted as u16).wrapping_sub(qp.rq_ci as u16) == 0 {
                    return Ok(false);
                }
                let c = qp.rq_ci;
                scratch.resize(rq.stride(), 0);
                if !rq.buf.read(rq.offset(c), scratch) {
                    return Err(fault("receive WQE unreadable"));
                }
                decode_scatter(scratch, out)?;
                out.wqe_index = c & 0xffff;
                qp.rq_ci = c.wrapping_add(1);
                Ok(true)
            }
        }
    }

    fn recv_posted(&self, source: RecvSource) -> u32 {
        match source {
            RecvSource::Srq { srqn } => self.srq_posted(srqn),
            RecvSource::Rq { qpn } => self.qps.get(qpn).map_or(0, |qp| {
                qp.db
                    .as_ref()
                    .and_then(|db| db.be32(0))
                    .map_or(0, |v| u32::from((v as u16).wrapping_sub(qp.rq_ci as u16)))
            }),
        }
    }

    fn post_completion(&mut self, cqn: u32, cqe: &Cqe, solicited: bool) -> bool {
        if cqe.wqe.is_send {
            // WQEs completed without being read (flushed in ERR) count as consumed for the
            // "at most one ring ahead" bound of `sq_head`.
            if let Some(qp) = self.qps.get_mut(cqe.wc.qp_num) {
                let ahead = cqe
                    .wqe
                    .index
                    .wrapping_add(1)
                    .wrapping_sub(qp.sq_read as u16) as i16;
                if ahead > 0 {
                    qp.sq_read = qp.sq_read.wrapping_add(ahead as u32);
                }
            }
        }
        // CQEs carry the hardware QPN; the engine knows the GSI QP as QP 1.
        let hw = self.hw_qpn(cqe.wc.qp_num);
        if hw != cqe.wc.qp_num {
            let mut c = *cqe;
            c.wc.qp_num = hw;
            return self.write_cqe(cqn, &c, solicited);
        }
        self.write_cqe(cqn, cqe, solicited)
    }

    fn post_event(&mut self, event: DeviceEvent) {
        Self::post_event(self, event);
    }

    fn qp_error(&mut self, qpn: u32) {
        // mlx4 has no receive doorbell: the HCA watches the doorbell record of a QP in ERR and
        // flushes what is posted there (`Hw::poll`).
        if !self.errored.contains(&qpn) {
            self.errored.push(qpn);
        }
    }

    fn reset_queues(&mut self, qpn: u32, _qp_type: QpType) {
        self.errored.retain(|&q| q != qpn);
        if let Some(qp) = self.qps.get_mut(qpn) {
            qp.sq_valid.set(0);
            qp.sq_read = 0;
            qp.rq_ci = 0;
        }
    }
}

impl DeviceSide for Hw {
    /// A send doorbell BAR2 forwarded: `what` is the UAR page (bits 31:24) and the QPN.
    fn kick(&mut self, engine: &mut Engine, now: u64, what: u32, out: &mut Vec<Packet>) {
        if self.shared.removed() {
            return;
        }
        let hw = what & 0xff_ffff;
        let page = what >> 24;
        // The GSI QP rings with its hardware QPN; its engine number (1) is no doorbell's.
        let qpn = if hw == portverbs_hal::types::SpecialQp::GSI_QPN {
            u32::MAX
        } else {
            self.engine_qpn(hw)
        };
        match self.qps.get(qpn) {
            Some(qp) if qp.in_engine && qp.usr_page == page => {
                engine.doorbell(now, qpn, self, out);
            }
            _ => {
                Stats::bump(&self.shared.stats.ignored_doorbells);
                tracing::warn!(
                    qpn,
                    uar = page,
                    "send doorbell for a QP not in use or from another UAR page"
                );
            }
        }
    }

    /// The kick channel overflowed: look at every QP in the engine once.
    fn rescan(&mut self, engine: &mut Engine, now: u64, out: &mut Vec<Packet>) {
        if self.shared.removed() {
            return;
        }
        for qpn in self.qps.numbers() {
            if self.qps.get(qpn).is_some_and(|q| q.in_engine) {
                engine.doorbell(now, qpn, self, out);
            }
        }
    }

    /// Receives posted to a QP in ERR (mlx4 has no receive doorbell): found by watching the
    /// doorbell records, looked for on every step. Returns whether it did anything.
    fn watch(&mut self, engine: &mut Engine, now: u64, out: &mut Vec<Packet>) -> bool {
        if self.errored.is_empty() || self.shared.removed() {
            return false;
        }
        let mut did = false;
        let mut i = 0;
        while let Some(&qpn) = self.errored.get(i) {
            let watched = engine.qp_state(qpn) == Some(QpState::Err)
                && self.qps.get(qpn).is_some_and(|q| q.in_engine);
            if !watched {
                self.errored.swap_remove(i);
                continue;
            }
            if self.recv_posted(RecvSource::Rq { qpn }) > 0 {
                engine.doorbell(now, qpn, self, out);
                did = true;
            }
            i += 1;
        }
        did
    }
}
