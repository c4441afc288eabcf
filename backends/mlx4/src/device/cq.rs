//! Completion queues: SW2HW_CQ, RESIZE_CQ (MODIFY_CQ) and HW2SW_CQ, with each CQ's ring, MTT
//! range and doorbell record.

use portverbs_hal::device::CqParams;
use portverbs_hal::error::CommandError;
use portverbs_hal::queue::CompletionQueue;

use super::Mlx4Device;
use super::commands::{invalid, log2, no};
use super::objects::CqRec;
use crate::cmd::Cmd;
use crate::layout::ctx::{CqContext, mtt_split};
use crate::layout::opcode;
use crate::queues::cq::{CqRing, Mlx4Cq};

impl Mlx4Device {
    pub(super) async fn do_create_cq(&self, params: CqParams) -> Result<Mlx4Cq, CommandError> {
        self.0.check_alive()?;
        let max = (1u32 << self.0.caps.log_max_cq_sz.min(22)) - 1;
        if params.entries == 0 || params.entries > max {
            return Err(invalid(format!(
                "{} CQ entries (1..={max})",
                params.entries
            )));
        }
        let demux = self.demux()?;
        let Some(hw_eqn) = demux.hw_eqn(params.eqn) else {
            return Err(no("EQ", params.eqn));
        };
        let cnt = (params.entries + 1).next_power_of_two();
        let (ring, geom) = self.entry_ring(cnt, 0)?;
        let slots = Self::slots(&ring, geom)?;
        let db = self.0.dbs.alloc(&*self.0.pci)?;
        let Some(cqn) = self.0.nums().cq.alloc() else {
            self.0.dbs.free(&db);
            return Err(CommandError::ResourceExhausted { resource: "CQs" });
        };
        let cmd = Cmd::new(opcode::SW2HW_CQ).in_mod(cqn);
        let r = self
            .sw2hw(cmd, ring.mem(), 0, ring.mem().len(), |first| {
                let (hi, lo) = mtt_split(first);
                CqContext {
                    logsize_usrpage: ((u32::from(log2(cnt)) << 24) | self.0.uar).into(),
                    comp_eqn: hw_eqn.into(),
                    mtt_base_hi: hi,
                    mtt_base_lo: lo.into(),
                    db_rec_addr: db.bus_addr().into(),
                    ..Default::default()
                }
            })
            .await;
        let mtt = match r {
            Ok(m) => m,
            Err(e) => {
                self.0.nums().cq.free(cqn);
                self.0.dbs.free(&db);
                return Err(e);
            }
        };
        self.0.objects().cqs.insert(
            cqn,
            CqRec {
                mtt,
                _ring: ring.clone(),
                db: db.clone(),
            },
        );
        demux.bind_cq(cqn, params.eqn);
        Ok(Mlx4Cq {
            cqn,
            buf: CqRing::new(slots, 0),
            db,
            uar: self.0.doorbells.page(self.0.uar),
            arm_sn: 1,
            gsi_qpn: self.0.gsi_hw_qpn(),
        })
    }

    pub(super) async fn do_resize_cq(
        &self,
        cq: &mut Mlx4Cq,
        entries: u32,
    ) -> Result<(), CommandError> {
        self.0.check_alive()?;
        let max = (1u32 << self.0.caps.log_max_cq_sz.min(22)) - 1;
        if entries == 0 || entries > max {
            return Err(invalid(format!("{entries} CQ entries (1..={max})")));
        }
        let cnt = (entries + 1).next_power_of_two();
        let pending = cq.pending();
        if pending + 1 >= cnt {
            return Err(invalid(format!(
                "{pending} unpolled completions do not fit {entries} entries"
            )));
        }
        // The new buffer continues the counters: the first CQE in it is ci + 1.
        let (ring, geom) = self.entry_ring(cnt, cq.buf.tail().wrapping_add(1))?;
        let slots = Self::slots(&ring, geom)?;
        let cmd = Cmd::new(opcode::MODIFY_CQ)
            .opmod(opcode::OPMOD_CQ_RESIZE)
            .in_mod(cq.cqn);
        let uar = self.0.uar;
        let mtt = self
            .sw2hw(cmd, ring.mem(), 0, ring.mem().len(), |first| {
                let (hi, lo) = mtt_split(first);
                CqContext {
                    logsize_usrpage: ((u32::from(log2(cnt)) << 24) | uar).into(),
                    mtt_base_hi: hi,
                    mtt_base_lo: lo.into(),
                    ..Default::default()
                }
            })
            .await?;
        // The HCA wrote a RESIZE CQE into the old buffer where it switched; the unpolled CQEs
        // before it move to the new buffer one counter later (Linux `hw/mlx4/cq.c`, resize).
        let deadline = std::time::Instant::now() + self.0.hcr.timeout;
        loop {
            match cq.switch_to(slots.clone()) {
                Some(_) => break,
                // An async fn never blocks its executor's thread: yield to it between looks.
                None if std::time::Instant::now() < deadline => crate::cmd::yield_now().await,
                None => {
                    return Err(CommandError::Timeout {
                        opcode: opcode::MODIFY_CQ,
                        millis: self.0.hcr.timeout.as_millis() as u64,
                    });
                }
            }
        }
        let old = self.0.objects().cqs.get_mut(&cq.cqn).map(|rec| {
            rec._ring = ring;
            std::mem::replace(&mut rec.mtt, mtt)
        });
        if let Some(old) = old {
            self.0.mtts.free(old);
        }
        cq.publish_ci();
        Ok(())
    }

    pub(super) async fn do_destroy_cq(&self, cqn: u32) -> Result<(), CommandError> {
        if !self.0.objects().cqs.contains_key(&cqn) {
            return Err(no("CQ", cqn));
        }
        self.hw2sw(
            Cmd::new(opcode::HW2SW_CQ)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(cqn),
        )
        .await?;
        if let Ok(d) = self.demux() {
            d.unbind_cq(cqn);
        }
        if let Some(rec) = self.0.objects().cqs.remove(&cqn) {
            self.0.mtts.free(rec.mtt);
            self.0.dbs.free(&rec.db);
        }
        self.0.nums().cq.free(cqn);
        Ok(())
    }
}
