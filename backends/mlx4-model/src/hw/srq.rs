//! Shared receive queues (Linux `mlx4/srq.c`, rdma-core `providers/mlx4/srq.c`): SW2HW_SRQ /
//! HW2SW_SRQ / QUERY_SRQ / ARM_SRQ, and consumption along the free list that starts at WQE 0, with
//! the one-shot limit event.

use portverbs_hal::event::{DeviceEvent, SrqEventKind};
use portverbs_mlx4_layout::ctx::{SrqContext, mtt_join};
use portverbs_mlx4_layout::opcode as op;
use portverbs_mlx4_layout::status::Status;
use portverbs_transport::{RecvWqe, WqeFault};
use zerocopy::{FromBytes, IntoBytes};

use super::mem::Buf;
use super::wqe::decode_scatter;
use super::{CmdResult, Command, Hw, check_number};
use crate::caps;

/// One SRQ.
#[derive(Debug)]
pub(super) struct Srq {
    buf: Buf,
    log: u32,
    shift: u32,
    /// Doorbell record: bits 15:0 = WQEs posted.
    db: Buf,
    /// Next WQE to consume (follows `next_wqe_index`).
    head: u32,
    /// WQEs consumed (16 bits significant).
    counter: u16,
    /// Armed limit (0 = not armed).
    limit: u16,
    /// Protection domain of the SRQ's receives (context `pd`, 24 bits).
    pd: u32,
}

impl Srq {
    fn posted(&self) -> u16 {
        self.db
            .be32(0)
            .map_or(0, |v| (v as u16).wrapping_sub(self.counter))
    }
}

impl Hw {
    fn srqc_addr(&self, srqn: u32) -> Result<u64, Status> {
        let l = self.layout()?;
        check_number(srqn, l.log_srq, 1 << caps::LOG_RSVD_SRQ)?;
        Ok(l.srqc + u64::from(srqn) * u64::from(caps::SRQC_ENTRY))
    }

    pub(super) fn srq_command(&mut self, cmd: &Command) -> CmdResult {
        let srqn = cmd.in_mod & 0xff_ffff;
        let at = self.srqc_addr(srqn)?;
        if cmd.opcode == op::SW2HW_SRQ {
            return self.sw2hw_srq(srqn, at, cmd);
        }
        if !self.srqs.contains(srqn) {
            return Err(Status::BadResState);
        }
        match cmd.opcode {
            op::HW2SW_SRQ => {
                if self.qps.iter().any(|(_, qp)| qp.srqn() == Some(srqn)) {
                    return Err(Status::ResourceBusy);
                }
                if cmd.opmod == 0 {
                    let ctx = self.srq_context(srqn, at)?;
                    self.outbox(cmd.out_param, &ctx)?;
                }
                self.srqs.remove(srqn);
                Ok(None)
            }
            op::QUERY_SRQ => {
                let ctx = self.srq_context(srqn, at)?;
                self.outbox(cmd.out_param, &ctx).map(|()| None)
            }
            _ => {
                let limit = u16::try_from(cmd.in_param).map_err(|_| Status::BadParam)?;
                if let Some(srq) = self.srqs.get_mut(srqn) {
                    if u32::from(limit) > 1 << srq.log {
                        return Err(Status::BadParam);
                    }
                    srq.limit = limit;
                }
                Ok(None)
            }
        }
    }

    fn sw2hw_srq(&mut self, srqn: u32, at: u64, cmd: &Command) -> CmdResult {
        if self.srqs.contains(srqn) {
            return Err(Status::BadResState);
        }
        if !self.icm.is_mapped(at) {
            return Err(Status::IcmError);
        }
        let ctx: SrqContext = self.inbox(cmd.in_param)?;
        let log = (ctx.state_logsize_srqn.get() >> 24) & 0xf;
        let shift = u32::from(ctx.logstride & 7) + 4;
        let db_addr = ctx.db_rec_addr.get();
        if log > u32::from(caps::LOG_MAX_SRQ_SZ) || shift < 5 || db_addr % 4 != 0 {
            return Err(Status::BadParam);
        }
        let db = self.mailbox(db_addr, 4)?;
        let first = mtt_join(ctx.mtt_base_hi, ctx.mtt_base_lo.get());
        let buf = self.resolve(
            first,
            12 + u32::from(ctx.log_page_size),
            0,
            1u64 << (log + shift),
        )?;
        self.icm_write(at, ctx.as_bytes())?;
        self.srqs.insert(
            srqn,
            Srq {
                buf,
                log,
                shift,
                db,
                head: 0,
                counter: 0,
                limit: ctx.limit_watermark.get(),
                pd: ctx.pd.get() & 0xff_ffff,
            },
        );
        Ok(None)
    }

    fn srq_context(&self, srqn: u32, at: u64) -> Result<Vec<u8>, Status> {
        let raw = self.icm_read(at, size_of::<SrqContext>())?;
        let mut ctx = SrqContext::read_from_bytes(&raw).map_err(|_| Status::IcmError)?;
        if let Some(srq) = self.srqs.get(srqn) {
            ctx.limit_watermark = srq.limit.into();
            ctx.wqe_counter = srq.counter.into();
        }
        Ok(ctx.as_bytes().to_vec())
    }

    pub(super) fn srq_posted(&self, srqn: u32) -> u32 {
        self.srqs.get(srqn).map_or(0, |s| u32::from(s.posted()))
    }

    /// Takes the SRQ WQE at the head of the free list; reports its index.
    pub(super) fn srq_take(&mut self, srqn: u32, out: &mut RecvWqe) -> Result<bool, WqeFault> {
        let Some(srq) = self.srqs.get_mut(srqn) else {
            return Ok(false);
        };
        if srq.posted() == 0 {
            return Ok(false);
        }
        let stride = 1usize << srq.shift;
        let at = srq.head as usize * stride;
        let mut wqe = std::mem::take(&mut self.scratch);
        wqe.resize(stride, 0);
        let ok = srq.buf.read(at, &mut wqe);
        let result = if ok {
            let next = u32::from(u16::from_be_bytes([wqe[2], wqe[3]]));
            decode_scatter(&wqe[16..], out).map(|()| next)
        } else {
            Err(WqeFault {
                reason: "SRQ WQE unreadable",
            })
        };
        self.scratch = wqe;
        let next = result?;
        out.wqe_index = srq.head;
        out.pd = srq.pd;
        srq.head = next & ((1 << srq.log) - 1);
        srq.counter = srq.counter.wrapping_add(1);
        if srq.limit > 0 && srq.posted() < srq.limit {
            srq.limit = 0;
            self.post_event(DeviceEvent::Srq {
                srqn,
                kind: SrqEventKind::LimitReached,
            });
        }
        Ok(true)
    }
}
