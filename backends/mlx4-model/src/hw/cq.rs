//! Completion queues (Linux `mlx4/cq.c`, rdma-core `providers/mlx4/cq.c`): SW2HW_CQ / HW2SW_CQ /
//! QUERY_CQ / MODIFY_CQ (moderation, and resize with a RESIZE CQE), CQE writing with wrap-parity
//! ownership, overrun against the set_ci record, and arming through the CQ doorbell.

use portverbs_hal::event::{CqErrorSyndrome, DeviceEvent};
use portverbs_hal::wc::{Cqe, WcStatus};
use portverbs_mlx4_layout::cqe::{self, CQE_SIZE, OPCODE_RESIZE};
use portverbs_mlx4_layout::ctx::{CQ_FLAG_COLLAPSED, CQ_FLAG_OI, CqContext, mtt_join};
use portverbs_mlx4_layout::opcode as op;
use portverbs_mlx4_layout::status::Status;
use portverbs_mlx4_layout::uar::{CQ_REQ_NOT, CQ_REQ_NOT_SOL};
use zerocopy::{FromBytes, IntoBytes};

use portverbs_dma::queue::EventRing;
use portverbs_dma::ring::Geometry;

use super::mem::Buf;
use super::{CmdResult, Command, Hw, check_number};
use crate::caps;
use crate::shared::{CORRUPT_INDEX, CORRUPT_OPCODE, Stats};

/// CQ context state "armed" / "armed for solicited" / "fired" (flags bits 11:8).
const STATE_ARMED: u32 = 0x9 << 8;
const STATE_ARMED_SOL: u32 = 0x6 << 8;
const STATE_FIRED: u32 = 0xa << 8;
/// CQ context status "overflow" (flags bits 31:28).
const STATUS_OVERFLOW: u32 = 0x9 << 28;
/// An opcode no CQE ever carries in either direction (what a corrupted CQE gets).
const GARBAGE_OPCODE: u8 = 0x1d;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arm {
    None,
    Any,
    Solicited,
}

/// One CQ.
#[derive(Debug)]
pub(super) struct Cq {
    buf: Buf,
    log: u32,
    /// Producer counter (24 bits significant).
    prod: u32,
    /// The doorbell record: set_ci in dword 0, the arm word in dword 1.
    db: Buf,
    eqn: u32,
    uar: u32,
    arm: Arm,
    /// Counter of the latest solicited or error CQE.
    last_solicited: Option<u32>,
    /// Overrun: the CQ stopped.
    error: bool,
    overrun_ignore: bool,
}

fn mask24(v: u32) -> u32 {
    v & 0xff_ffff
}

impl Cq {
    pub(super) fn eqn(&self) -> u32 {
        self.eqn
    }

    fn ci(&self) -> u32 {
        self.db.be32(0).map_or(self.prod, mask24)
    }

    fn nent(&self) -> u32 {
        1 << self.log
    }

    /// Writes raw CQE bytes at counter `at` (owner bit set from its wrap parity), the owner byte
    /// last.
    fn put(buf: &Buf, log: u32, at: u32, mut bytes: [u8; CQE_SIZE]) {
        let geom = geometry(log);
        bytes[CQE_SIZE - 1] = CqOwner::with_owner(bytes[CQE_SIZE - 1], geom.parity(at));
        let off = geom.offset(at);
        buf.write(off, &bytes[..CQE_SIZE - 1]);
        buf.store_u8(off + CQE_SIZE - 1, bytes[CQE_SIZE - 1]);
    }
}

/// The CQE ownership rule (owner bit 7 of an entry's last byte), the driver's ring type used
/// for its rules only: the model reaches the buffer through [`Buf`], not through slots.
type CqOwner = EventRing<CQE_SIZE, { CQE_SIZE - 1 }, { cqe::OWNER_MASK }>;

/// The geometry of a CQ of `1 << log` entries.
fn geometry(log: u32) -> Geometry {
    Geometry {
        base: 0,
        shift: CQE_SIZE.trailing_zeros(),
        cnt: 1 << log,
    }
}

/// Marks every entry hardware-owned for the counters `first..first + nent` that will use it
/// next (a new buffer starts at 0, so that zero-filling drivers see no entry; a resized buffer
/// continues the old counters, so "pass 0" is not where it starts).
fn init_owner_from(buf: &Buf, log: u32, first: u32) {
    CqOwner::init_owner_with(geometry(log), first, |at, b| {
        buf.store_u8(at, b);
    });
}

impl Hw {
    fn cqc_addr(&self, cqn: u32) -> Result<u64, Status> {
        let l = self.layout()?;
        check_number(cqn, l.log_cq, 1 << caps::LOG_RSVD_CQ)?;
        Ok(l.cqc + u64::from(cqn) * u64::from(caps::CQC_ENTRY))
    }

    pub(super) fn cq_command(&mut self, cmd: &Command) -> CmdResult {
        let cqn = cmd.in_mod & 0xff_ffff;
        let at = self.cqc_addr(cqn)?;
        if cmd.opcode == op::SW2HW_CQ {
            return self.sw2hw_cq(cqn, at, cmd);
        }
        if !self.cqs.contains(cqn) {
            return Err(Status::BadResState);
        }
        match cmd.opcode {
            op::HW2SW_CQ => {
                if self.qps.iter().any(|(_, qp)| qp.uses_cq(cqn)) {
                    return Err(Status::ResourceBusy);
                }
                if cmd.opmod == 0 {
                    let ctx = self.cq_context(cqn, at)?;
                    self.outbox(cmd.out_param, &ctx)?;
                }
                self.cqs.remove(cqn);
                Ok(None)
            }
            op::QUERY_CQ => {
                let ctx = self.cq_context(cqn, at)?;
                self.outbox(cmd.out_param, &ctx).map(|()| None)
            }
            _ if cmd.opmod == 1 => Ok(None), // moderation: nothing to moderate in a model
            _ if cmd.opmod == 0 => self.resize_cq(cqn, cmd),
            _ => Err(Status::BadParam),
        }
    }

    fn sw2hw_cq(&mut self, cqn: u32, at: u64, cmd: &Command) -> CmdResult {
        if self.cqs.contains(cqn) {
            return Err(Status::BadResState);
        }
        if !self.icm.is_mapped(at) {
            return Err(Status::IcmError);
        }
        let ctx: CqContext = self.inbox(cmd.in_param)?;
        let flags = ctx.flags.get();
        let lu = ctx.logsize_usrpage.get();
        let log = (lu >> 24) & 0x1f;
        let uar = lu & 0xff_ffff;
        let eqn = ctx.comp_eqn.get() & 0x1ff;
        let db_addr = ctx.db_rec_addr.get();
        if flags & CQ_FLAG_COLLAPSED != 0
            || log > u32::from(caps::LOG_MAX_CQ_SZ)
            || uar as usize >= caps::NUM_UARS
            || db_addr % 8 != 0
        {
            return Err(Status::BadParam);
        }
        if !self.eqs.contains(eqn) {
            return Err(Status::BadResState);
        }
        let db = self.mailbox(db_addr, 8)?;
        let first = mtt_join(ctx.mtt_base_hi, ctx.mtt_base_lo.get());
        let buf = self.resolve(
            first,
            12 + u32::from(ctx.log_page_size),
            0,
            (CQE_SIZE as u64) << log,
        )?;
        init_owner_from(&buf, log, 0);
        self.icm_write(at, ctx.as_bytes())?;
        let arm = match flags & (0xf << 8) {
            STATE_ARMED => Arm::Any,
            STATE_ARMED_SOL => Arm::Solicited,
            _ => Arm::None,
        };
        self.cqs.insert(
            cqn,
            Cq {
                buf,
                log,
                prod: 0,
                db,
                eqn,
                uar,
                arm,
                last_solicited: None,
                error: false,
                overrun_ignore: flags & CQ_FLAG_OI != 0,
            },
        );
        Ok(None)
    }

    fn cq_context(&self, cqn: u32, at: u64) -> Result<Vec<u8>, Status> {
        let raw = self.icm_read(at, size_of::<CqContext>())?;
        let mut ctx = CqContext::read_from_bytes(&raw).map_err(|_| Status::IcmError)?;
        if let Some(cq) = self.cqs.get(cqn) {
            let state = match cq.arm {
                Arm::Any => STATE_ARMED,
                Arm::Solicited => STATE_ARMED_SOL,
                Arm::None => STATE_FIRED,
            };
            let status = if cq.error { STATUS_OVERFLOW } else { 0 };
            ctx.flags = ((ctx.flags.get() & !(0xf << 8) & 0x0fff_ffff) | state | status).into();
            ctx.logsize_usrpage = ((cq.log << 24) | cq.uar).into();
            ctx.consumer_index = cq.ci().into();
            ctx.producer_index = mask24(cq.prod).into();
        }
        Ok(ctx.as_bytes().to_vec())
    }

    /// MODIFY_CQ opmod 0: switch to a new buffer. A RESIZE CQE goes into the old buffer at the
    /// producer counter; the CQEs not yet consumed are copied to the new buffer one counter
    /// later (where Linux's resize copy puts them too); new CQEs follow them.
    fn resize_cq(&mut self, cqn: u32, cmd: &Command) -> CmdResult {
        let ctx: CqContext = self.inbox(cmd.in_param)?;
        let log = (ctx.logsize_usrpage.get() >> 24) & 0x1f;
        if log > u32::from(caps::LOG_MAX_CQ_SZ) {
            return Err(Status::BadParam);
        }
        let first = mtt_join(ctx.mtt_base_hi, ctx.mtt_base_lo.get());
        let new = self.resolve(
            first,
            12 + u32::from(ctx.log_page_size),
            0,
            (CQE_SIZE as u64) << log,
        )?;
        let Some(cq) = self.cqs.get_mut(cqn) else {
            return Err(Status::BadResState);
        };
        let ci = cq.ci();
        let pending = mask24(cq.prod.wrapping_sub(ci));
        if pending + 1 >= 1 << log {
            return Err(Status::BadSize);
        }
        init_owner_from(&new, log, mask24(ci.wrapping_add(1)));
        let mut raw = [0u8; CQE_SIZE];
        for i in 0..pending {
            let c = mask24(ci.wrapping_add(i));
            if cq.buf.read(geometry(cq.log).offset(c), &mut raw) {
                Cq::put(&new, log, mask24(c.wrapping_add(1)), raw);
            }
        }
        let mut resize = [0u8; CQE_SIZE];
        resize[CQE_SIZE - 1] = OPCODE_RESIZE;
        if !self.shared.removed() {
            Cq::put(&cq.buf, cq.log, cq.prod, resize);
        }
        cq.prod = mask24(cq.prod.wrapping_add(1));
        cq.buf = new;
        cq.log = log;
        cq.last_solicited = None;
        Ok(None)
    }

    /// Writes a completion (the engine's `post_completion`).
    pub(super) fn write_cqe(&mut self, cqn: u32, c: &Cqe, solicited: bool) -> bool {
        if self.shared.removed() {
            return false;
        }
        let Some(cq) = self.cqs.get_mut(cqn) else {
            Stats::bump(&self.shared.stats.lost_events);
            return false;
        };
        if cq.error {
            return false;
        }
        let ci = cq.ci();
        if !cq.overrun_ignore && mask24(cq.prod.wrapping_sub(ci)) >= cq.nent() {
            cq.error = true;
            tracing::warn!(cqn, "CQ overrun");
            self.post_event(DeviceEvent::CqError {
                cqn,
                syndrome: CqErrorSyndrome::Overrun,
            });
            return false;
        }
        let mut bytes = cqe::encode(c, false);
        let corrupt = self
            .shared
            .corrupt_cqe
            .swap(0, std::sync::atomic::Ordering::AcqRel);
        if corrupt == CORRUPT_INDEX {
            // The WQE counter half the 16-bit space away from the one completed.
            bytes[24] ^= 0x80;
        } else if corrupt != 0 {
            // QPN 0xffffff, and for CORRUPT_OPCODE an opcode that exists in neither direction.
            bytes[1..4].copy_from_slice(&[0xff, 0xff, 0xff]);
            if corrupt == CORRUPT_OPCODE {
                bytes[CQE_SIZE - 1] = (bytes[CQE_SIZE - 1] & 0xc0) | GARBAGE_OPCODE;
            }
        }
        let at = cq.prod;
        Cq::put(&cq.buf, cq.log, at, bytes);
        cq.prod = mask24(at.wrapping_add(1));
        let satisfies_solicited = solicited || c.wc.status != WcStatus::Success;
        if satisfies_solicited {
            cq.last_solicited = Some(at);
        }
        let fire = match cq.arm {
            Arm::Any => true,
            Arm::Solicited => satisfies_solicited,
            Arm::None => false,
        };
        if fire {
            cq.arm = Arm::None;
            let eqn = cq.eqn;
            self.write_eqe(eqn, &DeviceEvent::Completion { cqn });
        }
        true
    }

    /// The CQ doorbell of UAR page `uar`: arm (cmd 1 = solicited, 2 = any) with consumer index
    /// `ci`, firing at once when a qualifying CQE is already beyond it.
    pub(crate) fn cq_doorbell(&mut self, uar: u32, dword0: u32, ci: u32) {
        let cqn = mask24(dword0);
        let cmd = (dword0 >> 24) & 0xf;
        let Some(cq) = self.cqs.get_mut(cqn).filter(|cq| cq.uar == uar) else {
            Stats::bump(&self.shared.stats.ignored_doorbells);
            tracing::warn!(
                cqn,
                uar,
                "CQ doorbell for an unknown CQ or from another UAR page"
            );
            return;
        };
        let ci = mask24(ci);
        let pending = mask24(cq.prod.wrapping_sub(ci));
        let due = match cmd {
            CQ_REQ_NOT => {
                cq.arm = Arm::Any;
                pending > 0
            }
            CQ_REQ_NOT_SOL => {
                cq.arm = Arm::Solicited;
                cq.last_solicited
                    .is_some_and(|s| mask24(s.wrapping_sub(ci)) < pending)
            }
            _ => {
                Stats::bump(&self.shared.stats.ignored_doorbells);
                return;
            }
        };
        if due {
            cq.arm = Arm::None;
            let eqn = cq.eqn;
            self.write_eqe(eqn, &DeviceEvent::Completion { cqn });
        }
    }
}
