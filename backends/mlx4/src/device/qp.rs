//! Queue pairs: the send-queue shape, the QP's ring, MTT range, doorbell record and BlueFlame
//! register, the state-transition commands with a QP context (Linux `mlx4_qp_modify`), QUERY_QP,
//! and RST_QP.

use portverbs_hal::attr::{QpAttr, QpAttrMask, QpCaps};
use portverbs_hal::device::{QpCreateParams, QpResources};
use portverbs_hal::error::CommandError;
use portverbs_hal::types::QpType;
use zerocopy::{FromBytes, IntoBytes};

use super::Mlx4Device;
use super::commands::{invalid, no};
use super::objects::QpRec;
use super::qp_ctx::{self, QpEnv};
use crate::cmd::Cmd;
use crate::dma::WorkRing;
use crate::layout::ctx::QpMailbox;
use crate::layout::mailbox::MAILBOX_SIZE;
use crate::layout::mlx::MAX_HEADER;
use crate::layout::opcode;
use crate::layout::wqe::{queue_offsets, sq_spare};
use crate::queues::Geometry;
use crate::queues::rq::Mlx4Rq;
use crate::queues::sq::{BfReg, MAX_INLINE, Mlx4Sq};
use crate::queues::sq_mlx::{DEFAULT_PKEY, MlxSend};

/// The send-queue stride and what it grants: (wqe_shift, max_sge, max_inline).
fn sq_shape(qp_type: QpType, caps: &QpCaps, max_sg: u32) -> Result<(u32, u32, u32), CommandError> {
    let seg = if qp_type == QpType::Ud { 48 } else { 32 };
    let inline = caps.max_inline_data as usize;
    // Inline data plus one 4-byte header per 64-byte block it may touch.
    let inline_room = if inline == 0 {
        0
    } else {
        inline + 4 * (inline.div_ceil(60) + 1)
    };
    let need = 16 + seg + (caps.max_send_sge.max(1) as usize * 16).max(inline_room);
    if need > 1008 || caps.max_inline_data > MAX_INLINE || caps.max_send_sge > max_sg {
        return Err(invalid(format!(
            "send queue with {} SGEs and {} inline bytes does not fit a WQE",
            caps.max_send_sge, caps.max_inline_data
        )));
    }
    let stride = need.next_power_of_two().max(64);
    let usable = stride.min(1008) - 16 - seg;
    let sge = ((usable / 16) as u32).min(max_sg);
    let inl = ((usable - 4 * usable.div_ceil(64)) as u32).min(MAX_INLINE);
    Ok((stride.trailing_zeros(), sge, inl))
}

fn gsi_busy() -> CommandError {
    CommandError::Busy {
        object: "GSI QP",
        reason: "QP 0x1 exists; destroy it first".into(),
    }
}

/// The GSI QP's send-queue shape: the MLX control segment, up to two inline headers around
/// the 68-byte LRH+GRH+BTH+DETH (split at the 64-byte boundary), then the MAD's gather list;
/// no inline payload.
fn gsi_sq_shape(caps: &QpCaps, max_sg: u32) -> Result<(u32, u32, u32), CommandError> {
    let head = (16 + 2 * 4 + MAX_HEADER).next_multiple_of(16);
    let need = head + caps.max_send_sge.max(1) as usize * 16;
    if need > 1008 || caps.max_inline_data > 0 || caps.max_send_sge > max_sg {
        return Err(invalid(format!(
            "QP1 send queue with {} SGEs and {} inline bytes",
            caps.max_send_sge, caps.max_inline_data
        )));
    }
    let stride = need.next_power_of_two().max(64);
    let sge = (((stride.min(1008) - head) / 16) as u32).min(max_sg);
    Ok((stride.trailing_zeros(), sge, 0))
}

impl Mlx4Device {
    pub(super) fn bf_reg(&self) -> Option<BfReg> {
        let bf = self.0.bf?;
        let mut n = self.0.nums();
        let i = n.bf_next % bf.regs;
        n.bf_next += 1;
        Some(BfReg {
            offset: bf.page + i * bf.half * 2,
            half: bf.half,
        })
    }

    /// The hardware QPN of the QP verbs know as `qpn`.
    pub(super) fn hw_qpn(&self, qpn: u32) -> Result<u32, CommandError> {
        let o = self.0.objects();
        Ok(o.qps.get(&qpn).ok_or_else(|| no("QP", qpn))?.hw_qpn)
    }

    pub(super) fn qp_env(&self, qpn: u32, rec: &QpRec) -> QpEnv {
        QpEnv {
            qpn,
            uar: self.0.uar,
            db_addr: rec.db.bus_addr(),
            mtt_first: rec.mtt.first,
            log_max_msg: self.0.caps.log_max_msg,
        }
    }

    pub(super) async fn do_create_qp(
        &self,
        params: QpCreateParams,
    ) -> Result<QpResources<Mlx4Sq, Mlx4Rq>, CommandError> {
        self.0.check_alive()?;
        let special = params.special.is_some();
        if let Some(sp) = params.special {
            if params.qp_type != sp.qp_type() {
                return Err(invalid(format!("a {sp:?} QP is {}", sp.qp_type())));
            }
            if self.0.nums().gsi {
                return Err(gsi_busy());
            }
        }
        let caps = &self.0.caps;
        let c = params.caps;
        let max_wr = (1u32 << caps.log_max_qp_sz.min(15)) - 64;
        // 0 send WRs is allowed (a receive-only QP): the queue still gets its spare WQEs and
        // reports what it grants, as ibv_create_qp(3) says.
        if c.max_send_wr > max_wr {
            return Err(invalid(format!(
                "{} send WRs (at most {max_wr})",
                c.max_send_wr
            )));
        }
        if params.srqn.is_none() && (c.max_recv_wr > max_wr || c.max_recv_sge > caps.max_sg_rq) {
            return Err(invalid(format!(
                "{} receive WRs with {} SGEs",
                c.max_recv_wr, c.max_recv_sge
            )));
        }
        {
            let o = self.0.objects();
            for cqn in [params.send_cqn, params.recv_cqn] {
                if !o.cqs.contains_key(&cqn) {
                    return Err(no("CQ", cqn));
                }
            }
            if let Some(s) = params.srqn {
                if !o.srqs.contains_key(&s) {
                    return Err(no("SRQ", s));
                }
            }
        }
        let (sq_shift, max_sge, max_inline) = if special {
            gsi_sq_shape(&c, caps.max_sg_sq)?
        } else {
            sq_shape(params.qp_type, &c, caps.max_sg_sq)?
        };
        let spare = sq_spare(sq_shift);
        let sq_cnt = (c.max_send_wr + spare).next_power_of_two();
        let rq = params.srqn.is_none().then(|| {
            let slots = c.max_recv_sge.max(1).next_power_of_two();
            let shift = (slots * 16).trailing_zeros().max(4);
            (c.max_recv_wr.max(1).next_power_of_two(), shift)
        });
        let (rq_cnt, rq_shift) = rq.unwrap_or((0, 4));
        let (sq_off, rq_off) = queue_offsets(sq_cnt, sq_shift, rq_cnt, rq_shift);
        let bytes = ((sq_cnt as usize) << sq_shift) + ((rq_cnt as usize) << rq_shift);
        let buf = self.dma(bytes.next_multiple_of(4096))?;
        let sq_geom = Geometry {
            base: sq_off,
            shift: sq_shift,
            cnt: sq_cnt,
        };
        let rq_geom = rq.map(|(cnt, shift)| Geometry {
            base: rq_off,
            shift,
            cnt,
        });
        // Both rings' geometry is checked here, once, before anything is allocated on the HCA.
        let sq_slots = Self::slots(&buf, sq_geom)?;
        let rq_slots = rq_geom.map(|g| Self::slots(&buf, g)).transpose()?;
        let db = self.0.dbs.alloc(&*self.0.pci)?;
        // The GSI QP is port 1's QP1 of the special block; verbs see it as QP 1.
        let (qpn, hw_qpn) = match params.special {
            Some(sp) => {
                // Taken under the lock, so that two creations cannot both pass the check.
                let mut n = self.0.nums();
                if n.gsi {
                    drop(n);
                    self.0.dbs.free(&db);
                    return Err(gsi_busy());
                }
                n.gsi = true;
                (sp.qpn(), self.0.gsi_hw_qpn())
            }
            None => {
                // Round the range from the device's cursor (random at first).
                let mut nums = self.0.nums();
                let cursor = nums.next_qpn;
                let Some(n) = nums.qp.alloc_round(cursor) else {
                    drop(nums);
                    self.0.dbs.free(&db);
                    return Err(CommandError::ResourceExhausted { resource: "QPs" });
                };
                nums.next_qpn = n + 1;
                drop(nums);
                (n, n)
            }
        };
        let mtt = match self
            .0
            .mtts
            .write(&self.0.hcr, buf.mem(), 0, buf.mem().len())
            .await
        {
            Ok(m) => m,
            Err(e) => {
                if special {
                    self.0.nums().gsi = false;
                } else {
                    self.0.nums().qp.free(qpn);
                }
                self.0.dbs.free(&db);
                return Err(e);
            }
        };
        let granted = QpCaps {
            max_send_wr: sq_cnt - spare,
            max_recv_wr: rq_cnt,
            max_send_sge: max_sge,
            max_recv_sge: rq_geom.map_or(0, |g| (g.stride() / 16) as u32),
            max_inline_data: max_inline,
        };
        self.0.objects().qps.insert(
            qpn,
            QpRec {
                qp_type: params.qp_type,
                hw_qpn,
                special,
                pd: params.pd,
                send_cqn: params.send_cqn,
                recv_cqn: params.recv_cqn,
                srqn: params.srqn,
                sq: sq_geom,
                rq: rq_geom,
                mtt,
                _buf: buf.clone(),
                db: db.clone(),
            },
        );
        let mlx = special.then(|| {
            Box::new(MlxSend {
                gids: self.0.gids.first().cloned().unwrap_or_default(),
                pkey: DEFAULT_PKEY,
            })
        });
        let mut sq = Mlx4Sq {
            qpn: hw_qpn,
            qp_type: params.qp_type,
            buf: WorkRing::new(sq_slots),
            spare,
            max_sge,
            max_inline,
            uar: self.0.doorbells.page(self.0.uar),
            bf: self.bf_reg(),
            bf_half: 0,
            fatal: self.0.fatal.clone(),
            bf_len: 0,
            mlx,
        };
        sq.init_slots();
        let rq = rq_slots.map(|buf| Mlx4Rq {
            buf: WorkRing::new(buf),
            max_sge: granted.max_recv_sge,
            db: db.clone(),
        });
        Ok(QpResources {
            qpn,
            caps: granted,
            sq,
            rq,
        })
    }

    pub(super) async fn do_modify_qp(
        &self,
        qpn: u32,
        attr: QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), CommandError> {
        let from = attr.cur_qp_state;
        let to = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            from
        };
        let t = {
            let o = self.0.objects();
            o.qps.get(&qpn).ok_or_else(|| no("QP", qpn))?.qp_type
        };
        let Some(op) = qp_ctx::transition_opcode(t, from, to) else {
            return Err(CommandError::BadState {
                object: "QP",
                number: qpn,
                reason: format!("no HCA command for {from:?} -> {to:?}"),
            });
        };
        let (inbox, qpn): (QpMailbox, u32) = {
            let o = self.0.objects();
            let rec = o.qps.get(&qpn).ok_or_else(|| no("QP", qpn))?;
            let env = self.qp_env(rec.hw_qpn, rec);
            (qp_ctx::build(rec, &attr, &env, mask), rec.hw_qpn)
        };
        let r = match op {
            opcode::RST_QP => {
                self.cmd(Cmd::new(op).opmod(opcode::OPMOD_RST_NO_OUTBOX).in_mod(qpn))
                    .await
            }
            opcode::ERR_QP => self.cmd(Cmd::new(op).in_mod(qpn)).await,
            opcode::RTS2SQD_QP => {
                let notify = u32::from(attr.en_sqd_async_notify) << 31;
                self.cmd(Cmd::new(op).in_mod(qpn | notify)).await
            }
            _ => {
                self.cmd_in(Cmd::new(op).in_mod(qpn), inbox.as_bytes())
                    .await
            }
        };
        r.map(|_| ())
    }

    pub(super) async fn do_query_qp(
        &self,
        qpn: u32,
        known: QpAttr,
    ) -> Result<QpAttr, CommandError> {
        let hw_qpn = self.hw_qpn(qpn)?;
        let mut out = vec![0u8; size_of::<QpMailbox>()];
        self.cmd_out(Cmd::new(opcode::QUERY_QP).in_mod(hw_qpn), &mut out)
            .await?;
        let (mb, _) =
            QpMailbox::read_from_prefix(&out).map_err(|_| invalid("QUERY_QP outbox too short"))?;
        qp_ctx::parse_query(&mb.ctx, &known).ok_or(CommandError::Firmware {
            opcode: opcode::QUERY_QP,
            status: 0,
            meaning: "QUERY_QP returned an unknown QP state",
        })
    }

    pub(super) async fn do_destroy_qp(&self, qpn: u32) -> Result<(), CommandError> {
        let hw_qpn = self.hw_qpn(qpn)?;
        self.hw2sw(
            Cmd::new(opcode::RST_QP)
                .opmod(opcode::OPMOD_RST_NO_OUTBOX)
                .in_mod(hw_qpn),
        )
        .await?;
        let special = match self.0.objects().qps.remove(&qpn) {
            Some(rec) => {
                self.0.mtts.free(rec.mtt);
                self.0.dbs.free(&rec.db);
                rec.special
            }
            None => false,
        };
        if special {
            self.0.nums().gsi = false;
        } else {
            self.0.nums().qp.free(qpn);
        }
        Ok(())
    }
}

const _: () = assert!(MAILBOX_SIZE >= size_of::<QpMailbox>());
