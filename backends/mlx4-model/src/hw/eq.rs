//! Event queues (Linux `mlx4/eq.c`): SW2HW_EQ / HW2SW_EQ / QUERY_EQ / MAP_EQ, EQE writing
//! with wrap-parity ownership, arming through the EQ doorbell, interrupts and overflow.

use portverbs_hal::event::DeviceEvent;
use portverbs_mlx4_layout::ctx::{EQ_STATE_ARMED, EQ_STATE_FIRED, EqContext, mtt_join};
use portverbs_mlx4_layout::eqe::{self, EQE_SIZE, event_type};
use portverbs_mlx4_layout::opcode as op;
use portverbs_mlx4_layout::status::Status;
use zerocopy::{FromBytes, IntoBytes};

use portverbs_dma::queue::EventRing;
use portverbs_dma::ring::Geometry;

use super::mem::Buf;

/// The EQE ownership rule (owner bit 7 of an entry's last byte), the driver's ring type used
/// for its rules only: the model reaches the buffer through [`Buf`], not through slots.
type EqOwner = EventRing<EQE_SIZE, { EQE_SIZE - 1 }, { eqe::OWNER_MASK }>;

/// The geometry of an EQ of `1 << log` entries.
fn geometry(log: u32) -> Geometry {
    Geometry {
        base: 0,
        shift: EQE_SIZE.trailing_zeros(),
        cnt: 1 << log,
    }
}
use super::{CmdResult, Command, Hw, check_number};
use crate::caps;
use crate::shared::Stats;

/// EQ state "always armed".
const EQ_STATE_ALWAYS: u32 = 0xb << 8;

/// One EQ.
#[derive(Debug)]
pub(super) struct Eq {
    buf: Buf,
    log: u32,
    /// Producer counter (24 bits significant).
    prod: u32,
    /// Consumer index from the last doorbell.
    ci: u32,
    armed: bool,
    always: bool,
    intr: u32,
}

fn mask24(v: u32) -> u32 {
    v & 0xff_ffff
}

impl Hw {
    fn eqc_addr(&self, eqn: u32) -> Result<u64, Status> {
        let l = self.layout()?;
        check_number(eqn, l.log_eq, u32::from(caps::RSVD_EQ))?;
        Ok(l.eqc + u64::from(eqn) * u64::from(caps::EQC_ENTRY))
    }

    pub(super) fn eq_command(&mut self, cmd: &Command) -> CmdResult {
        match cmd.opcode {
            op::SW2HW_EQ => self.sw2hw_eq(cmd),
            op::HW2SW_EQ => {
                let eqn = cmd.in_mod & 0x3ff;
                let at = self.eqc_addr(eqn)?;
                if !self.eqs.contains(eqn) {
                    return Err(Status::BadResState);
                }
                if self.cqs.iter().any(|(_, cq)| cq.eqn() == eqn) {
                    return Err(Status::ResourceBusy);
                }
                if cmd.opmod == 0 {
                    let ctx = self.eq_context(eqn, at)?;
                    self.outbox(cmd.out_param, &ctx)?;
                }
                self.eqs.remove(eqn);
                for e in &mut self.event_eq {
                    if *e == Some(eqn) {
                        *e = None;
                    }
                }
                Ok(None)
            }
            op::QUERY_EQ => {
                let eqn = cmd.in_mod & 0x3ff;
                let at = self.eqc_addr(eqn)?;
                if !self.eqs.contains(eqn) {
                    return Err(Status::BadResState);
                }
                let ctx = self.eq_context(eqn, at)?;
                self.outbox(cmd.out_param, &ctx).map(|()| None)
            }
            _ => self.map_eq(cmd),
        }
    }

    fn sw2hw_eq(&mut self, cmd: &Command) -> CmdResult {
        let eqn = cmd.in_mod;
        let at = self.eqc_addr(eqn)?;
        if self.eqs.contains(eqn) {
            return Err(Status::BadResState);
        }
        if !self.icm.is_mapped(at) {
            return Err(Status::IcmError);
        }
        let ctx: EqContext = self.inbox(cmd.in_param)?;
        let log = u32::from(ctx.log_eq_size & 0x1f);
        let intr = u32::from(ctx.intr.get() & 0x3ff);
        if log > u32::from(caps::LOG_MAX_EQ_SZ) || intr >= self.vectors {
            return Err(Status::BadParam);
        }
        let shift = 12 + u32::from(ctx.log_page_size);
        let first = mtt_join(ctx.mtt_base_hi, ctx.mtt_base_lo.get());
        let buf = self.resolve(first, shift, 0, (EQE_SIZE as u64) << log)?;
        // Every entry starts hardware-owned for pass 0 (drivers that zero-fill rely on it).
        EqOwner::init_owner_with(geometry(log), 0, |at, b| {
            buf.store_u8(at, b);
        });
        let state = ctx.flags.get() & (0xf << 8);
        self.icm_write(at, ctx.as_bytes())?;
        self.eqs.insert(
            eqn,
            Eq {
                buf,
                log,
                prod: 0,
                ci: 0,
                armed: state == EQ_STATE_ARMED || state == EQ_STATE_ALWAYS,
                always: state == EQ_STATE_ALWAYS,
                intr,
            },
        );
        Ok(None)
    }

    /// The EQ context as QUERY_EQ / HW2SW_EQ return it: what SW2HW_EQ stored, with the live
    /// state and indices.
    fn eq_context(&self, eqn: u32, at: u64) -> Result<Vec<u8>, Status> {
        let raw = self.icm_read(at, size_of::<EqContext>())?;
        let mut ctx = EqContext::read_from_bytes(&raw).map_err(|_| Status::IcmError)?;
        if let Some(eq) = self.eqs.get(eqn) {
            let state = if eq.always {
                EQ_STATE_ALWAYS
            } else if eq.armed {
                EQ_STATE_ARMED
            } else {
                EQ_STATE_FIRED
            };
            ctx.flags = ((ctx.flags.get() & !(0xf << 8)) | state).into();
            ctx.consumer_index = mask24(eq.ci).into();
            ctx.producer_index = mask24(eq.prod).into();
        }
        Ok(ctx.as_bytes().to_vec())
    }

    fn map_eq(&mut self, cmd: &Command) -> CmdResult {
        let eqn = cmd.in_mod & 0x3ff;
        let unmap = cmd.in_mod & (1 << 31) != 0;
        self.eqc_addr(eqn)?;
        if !self.eqs.contains(eqn) {
            return Err(Status::BadResState);
        }
        for t in 0..64 {
            if cmd.in_param & (1 << t) == 0 {
                continue;
            }
            let slot = &mut self.event_eq[t];
            if !unmap {
                *slot = Some(eqn);
            } else if *slot == Some(eqn) {
                *slot = None;
            }
        }
        Ok(None)
    }

    /// Writes one EQE; raises the EQ's interrupt when it is armed. False when the EQ does not
    /// exist, is full, or the device is gone.
    pub(crate) fn write_eqe(&mut self, eqn: u32, ev: &DeviceEvent) -> bool {
        if self.shared.removed() {
            return false;
        }
        let Some(eq) = self.eqs.get_mut(eqn) else {
            Stats::bump(&self.shared.stats.lost_events);
            return false;
        };
        let nent = 1u32 << eq.log;
        if mask24(eq.prod.wrapping_sub(eq.ci)) >= nent {
            Stats::bump(&self.shared.stats.eq_overflows);
            Stats::bump(&self.shared.stats.lost_events);
            tracing::warn!(eqn, "EQ overrun: event dropped");
            let report = self.event_eq[usize::from(event_type::EQ_OVERFLOW)];
            if let Some(other) = report.filter(|&o| o != eqn) {
                self.write_eqe(
                    other,
                    &DeviceEvent::Unknown {
                        event_type: event_type::EQ_OVERFLOW,
                        subtype: 0,
                    },
                );
            }
            return false;
        }
        let geom = geometry(eq.log);
        let bytes = eqe::encode(ev, geom.parity(eq.prod));
        let off = geom.offset(eq.prod);
        eq.buf.write(off, &bytes[..EQE_SIZE - 1]);
        eq.buf.store_u8(off + EQE_SIZE - 1, bytes[EQE_SIZE - 1]);
        eq.prod = mask24(eq.prod.wrapping_add(1));
        if eq.armed {
            eq.armed = eq.always;
            let v = eq.intr;
            self.shared.raise(v);
        }
        true
    }

    /// EQ doorbell: consumer index, and re-arm when bit 31 is set. An EQ armed while EQEs
    /// beyond the index are waiting interrupts at once.
    pub(crate) fn eq_doorbell(&mut self, eqn: u32, value: u32) {
        let Some(eq) = self.eqs.get_mut(eqn) else {
            Stats::bump(&self.shared.stats.ignored_doorbells);
            return;
        };
        eq.ci = mask24(value);
        if value & (1 << 31) != 0 {
            eq.armed = true;
            if eq.prod != eq.ci && !self.shared.removed() {
                eq.armed = eq.always;
                let v = eq.intr;
                self.shared.raise(v);
            }
        }
    }
}
