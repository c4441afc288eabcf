//! Shared receive queues: SW2HW_SRQ, ARM_SRQ (the limit) and HW2SW_SRQ.

use portverbs_hal::device::{Device, SrqModify, SrqParams};
use portverbs_hal::error::CommandError;

use super::Mlx4Device;
use super::commands::{invalid, log2, no};
use super::objects::SrqRec;
use crate::cmd::Cmd;
use crate::dma::Producer;
use crate::layout::ctx::{SrqContext, mtt_split};
use crate::layout::opcode;
use crate::queues::Geometry;
use crate::queues::srq::{Mlx4Srq, SRQ_WQE_MIN};

impl Mlx4Device {
    pub(super) async fn do_create_srq(&self, params: SrqParams) -> Result<Mlx4Srq, CommandError> {
        self.0.check_alive()?;
        let max_wr = (1u32 << self.0.caps.log_max_srq_sz.min(15)) - 1;
        if params.max_wr == 0 || params.max_wr > max_wr {
            return Err(invalid(format!("{} SRQ WRs (1..={max_wr})", params.max_wr)));
        }
        if params.max_sge == 0 || params.max_sge > self.0.caps.max_sg_rq.min(32) {
            return Err(invalid(format!("{} SRQ SGEs", params.max_sge)));
        }
        if params.limit > params.max_wr {
            return Err(invalid(format!(
                "SRQ limit {} above max_wr {}",
                params.limit, params.max_wr
            )));
        }
        let cnt = (params.max_wr + 1).next_power_of_two();
        let shift = (16 + 16 * params.max_sge)
            .next_power_of_two()
            .max(SRQ_WQE_MIN as u32)
            .trailing_zeros();
        let geom = Geometry {
            base: 0,
            shift,
            cnt,
        };
        let buf = self.dma((cnt as usize) << shift)?;
        let slots = Self::slots(&buf, geom)?;
        let db = self.0.dbs.alloc(&*self.0.pci)?;
        let Some(srqn) = self.0.nums().srq.alloc() else {
            self.0.dbs.free(&db);
            return Err(CommandError::ResourceExhausted { resource: "SRQs" });
        };
        let mut srq = Mlx4Srq {
            srqn,
            buf: slots,
            max_sge: (geom.stride() as u32 - 16) / 16,
            db: db.clone(),
            next: vec![0; cnt as usize].into_boxed_slice(),
            head: 0,
            tail: 0,
            posted: Producer::new(geom),
            in_use: vec![false; cnt as usize].into_boxed_slice(),
        };
        srq.init();
        let cmd = Cmd::new(opcode::SW2HW_SRQ).in_mod(srqn);
        let r = self
            .sw2hw(cmd, buf.mem(), 0, buf.mem().len(), |first| {
                let (hi, lo) = mtt_split(first);
                SrqContext {
                    state_logsize_srqn: ((u32::from(log2(cnt)) << 24) | srqn).into(),
                    logstride: (shift - 4) as u8,
                    mtt_base_hi: hi,
                    mtt_base_lo: lo.into(),
                    pd: params.pd.into(),
                    db_rec_addr: db.bus_addr().into(),
                    ..Default::default()
                }
            })
            .await;
        let mtt = match r {
            Ok(m) => m,
            Err(e) => {
                self.0.nums().srq.free(srqn);
                self.0.dbs.free(&db);
                return Err(e);
            }
        };
        self.0
            .objects()
            .srqs
            .insert(srqn, SrqRec { mtt, _buf: buf, db });
        if params.limit > 0 {
            if let Err(e) = self
                .cmd(
                    Cmd::new(opcode::ARM_SRQ)
                        .in_param(u64::from(params.limit))
                        .in_mod(srqn),
                )
                .await
            {
                let _ = self.destroy_srq(srqn).await;
                return Err(e);
            }
        }
        Ok(srq)
    }

    pub(super) async fn do_modify_srq(
        &self,
        srqn: u32,
        change: SrqModify,
    ) -> Result<(), CommandError> {
        if !self.0.objects().srqs.contains_key(&srqn) {
            return Err(no("SRQ", srqn));
        }
        if change.max_wr.is_some() {
            return Err(CommandError::Unsupported { what: "SRQ resize" });
        }
        if let Some(limit) = change.limit {
            self.cmd(
                Cmd::new(opcode::ARM_SRQ)
                    .in_param(u64::from(limit))
                    .in_mod(srqn),
            )
            .await?;
        }
        Ok(())
    }

    pub(super) async fn do_destroy_srq(&self, srqn: u32) -> Result<(), CommandError> {
        if !self.0.objects().srqs.contains_key(&srqn) {
            return Err(no("SRQ", srqn));
        }
        self.hw2sw(
            Cmd::new(opcode::HW2SW_SRQ)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(srqn),
        )
        .await?;
        if let Some(rec) = self.0.objects().srqs.remove(&srqn) {
            self.0.mtts.free(rec.mtt);
            self.0.dbs.free(&rec.db);
        }
        self.0.nums().srq.free(srqn);
        Ok(())
    }
}
