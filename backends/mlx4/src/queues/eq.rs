//! The event queue (facts §7): 32-byte EQEs with wrap-parity ownership; the consumer index (and
//! the arm bit) go to the EQ's doorbell in the UAR page ⌊eqn / 4⌋.

use std::sync::Arc;

use portverbs_hal::barrier;
use portverbs_hal::error::EqeError;
use portverbs_hal::event::DeviceEvent;
use portverbs_hal::mmio::Mmio;
use portverbs_hal::queue::EventQueue;

use super::Geometry;
use crate::dma::Ring;
use crate::layout::eqe::{self, EQE_SIZE};
use crate::layout::uar::{EQ_ARM, eq_doorbell};

/// Host side of an EQ.
#[derive(Debug)]
pub(crate) struct Mlx4Eq {
    pub(crate) eqn: u32,
    pub(crate) buf: Ring,
    pub(crate) geom: Geometry,
    pub(crate) ci: u32,
    pub(crate) bar2: Arc<dyn Mmio>,
}

impl Mlx4Eq {
    fn owned(&self) -> Option<[u8; 8]> {
        let off = self.geom.offset(self.ci) + EQE_SIZE - 8;
        let t = self.buf.load8(off)?;
        ((t[7] & 0x80 != 0) == self.geom.parity(self.ci)).then_some(t)
    }

    fn doorbell(&self, arm: bool) {
        let v = (self.ci & 0xff_ffff) | if arm { EQ_ARM } else { 0 };
        let _ = self.bar2.write32(eq_doorbell(self.eqn), v);
    }
}

impl EventQueue for Mlx4Eq {
    fn eqn(&self) -> u32 {
        self.eqn
    }

    fn poll_one(&mut self) -> Result<Option<DeviceEvent>, EqeError> {
        let Some(tail) = self.owned() else {
            return Ok(None);
        };
        barrier::from_device();
        let mut raw = [0u8; EQE_SIZE];
        let _ = self
            .buf
            .read_into(self.geom.offset(self.ci), &mut raw[..EQE_SIZE - 8]);
        raw[EQE_SIZE - 8..].copy_from_slice(&tail);
        let index = self.ci;
        self.ci = self.ci.wrapping_add(1);
        // Keep the HCA from seeing the EQ as full during long bursts (facts §7.3).
        if self.ci % 128 == 0 {
            self.doorbell(false);
        }
        eqe::decode(&raw, self.eqn, index).map(Some)
    }

    fn publish_ci(&mut self) {
        self.doorbell(false);
    }

    fn arm(&mut self) {
        self.doorbell(true);
    }
}
