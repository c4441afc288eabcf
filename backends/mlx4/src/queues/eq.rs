//! The event queue (Linux `mlx4/eq.c`): 32-byte EQEs with wrap-parity ownership; the consumer index
//! (and the arm bit) go to the EQ's doorbell in the UAR page ⌊eqn / 4⌋.

use portverbs_hal::barrier;
use portverbs_hal::error::EqeError;
use portverbs_hal::event::DeviceEvent;
use portverbs_hal::queue::EventQueue;
use portverbs_hal::types::SpecialQp;

use crate::dma::{EventRing, Slots};
use crate::layout::eqe::{self, EQE_SIZE};
use crate::layout::uar::EQ_ARM;
use crate::uar::Uar;

/// An EQ's ring: 32-byte EQEs whose owner bit is bit 7 of their last byte, and the consumer
/// index (the device produces, the host consumes).
type EqRing = EventRing<EQE_SIZE, { EQE_SIZE - 1 }, { eqe::OWNER_MASK }>;

/// Host side of an EQ.
#[derive(Debug)]
pub(crate) struct Mlx4Eq {
    pub(crate) eqn: u32,
    /// The EQE ring (32-byte slots, geometry checked when the EQ was made) and its consumer.
    pub(crate) buf: EqRing,
    /// The doorbells of UAR page ⌊eqn / 4⌋, where this EQ's is slot eqn mod 4.
    pub(crate) uar: Uar,
    /// The hardware QPN of the GSI QP, which verbs know as QP 1 (Linux `mlx4/qp.c`).
    pub(crate) gsi_qpn: u32,
}

impl Mlx4Eq {
    /// The EQ on `buf`, consuming from counter 0, with `uar` the doorbells of its UAR page.
    pub(crate) fn new(eqn: u32, buf: Slots<EQE_SIZE>, uar: Uar, gsi_qpn: u32) -> Self {
        Self {
            eqn,
            buf: EqRing::new(buf, 0),
            uar,
            gsi_qpn,
        }
    }

    fn doorbell(&self, arm: bool) {
        let v = (self.buf.tail() & 0xff_ffff) | if arm { EQ_ARM } else { 0 };
        self.uar.eq(self.eqn % 4, v);
    }
}

impl EventQueue for Mlx4Eq {
    fn eqn(&self) -> u32 {
        self.eqn
    }

    fn poll_one(&mut self) -> Result<Option<DeviceEvent>, EqeError> {
        let Some(slot) = self.buf.poll() else {
            return Ok(None);
        };
        barrier::from_device();
        let index = self.buf.tail();
        let raw = slot.read::<0, EQE_SIZE>();
        self.buf.advance(1);
        // Keep the HCA from seeing the EQ as full during long bursts (as Linux `mlx4/eq.c` does).
        if self.buf.tail() % 128 == 0 {
            self.doorbell(false);
        }
        eqe::decode(&raw, self.eqn, index).map(|ev| match ev {
            // The GSI QP's events name its hardware QPN; verbs know it as QP 1.
            DeviceEvent::Qp { qpn, kind } if qpn == self.gsi_qpn => Some(DeviceEvent::Qp {
                qpn: SpecialQp::GSI_QPN,
                kind,
            }),
            ev => Some(ev),
        })
    }

    fn publish_ci(&mut self) {
        self.doorbell(false);
    }

    fn arm(&mut self) {
        self.doorbell(true);
    }
}
