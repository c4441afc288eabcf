//! The software device's doorbells: records shared between the host-side queue objects and the
//! device, and the "kick" that tells the device to look at a queue.
//!
//! Records are atomics (the soft device's equivalent of mlx4's doorbell records in host memory).
//! A kick is the fabric's lock-free doorbell ([`portverbs_fabric::Kicker`]) carrying a QP or
//! CQ number; the send doorbell deduplicates kicks with a `scheduled` flag, so a burst of posts
//! costs one channel message. Nothing on this path allocates or takes a lock shared with
//! another queue.

use std::sync::atomic::{AtomicBool, AtomicU32};

/// Send-queue doorbell record.
#[derive(Debug, Default)]
pub(crate) struct SqDoorbell {
    /// The doorbell value: WQEs before this counter are posted. A record the host writes for
    /// the device to read (as mlx4's doorbell record in host memory), not a producer counter
    /// anyone reasons from on the host: verbs-core keeps the one send producer counter and
    /// hands it to `ring_doorbell`, which only copies it here.
    pub(crate) head: AtomicU32,
    /// A kick is queued and not yet taken by the engine.
    pub(crate) scheduled: AtomicBool,
}

/// Receive-queue doorbell record.
#[derive(Debug, Default)]
pub(crate) struct RqDoorbell {
    /// The doorbell value, a copy of verbs-core's receive producer counter made by
    /// `ring_doorbell` for the device to read (a record, not a second producer).
    pub(crate) head: AtomicU32,
    /// Set by the device while the QP is in ERR: new receives must be kicked to be flushed.
    pub(crate) in_error: AtomicBool,
}

/// SRQ doorbell record.
#[derive(Debug, Default)]
pub(crate) struct SrqDoorbell {
    /// Producer counter of the SRQ's index ring.
    pub(crate) head: AtomicU32,
}

/// Arm register bits of a CQ.
pub(crate) const ARM_ANY: u32 = 1;
/// Solicited-only arming.
pub(crate) const ARM_SOLICITED: u32 = 2;

/// CQ doorbell record.
#[derive(Debug, Default)]
pub(crate) struct CqDoorbell {
    /// Consumer index published by the host.
    pub(crate) ci: AtomicU32,
    /// Arm request ([`ARM_ANY`] or [`ARM_SOLICITED`]), cleared by the device when it fires.
    pub(crate) arm: AtomicU32,
    /// Set by the device on overrun.
    pub(crate) error: AtomicBool,
}

/// EQ doorbell record.
#[derive(Debug, Default)]
pub(crate) struct EqDoorbell {
    /// Consumer index published by the host.
    pub(crate) ci: AtomicU32,
    /// Armed: the next EQE raises the interrupt.
    pub(crate) armed: AtomicBool,
}

/// What a kick asks the device to look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KickKind {
    /// New send WQEs (or receives on a QP in error).
    Qp(u32),
    /// A CQ was armed: fire at once if completions are already waiting.
    Cq(u32),
}

/// Marks a CQ kick in the fabric's 32-bit kick value (QP and CQ numbers are below 2^24).
const CQ_KICK: u32 = 1 << 31;

impl KickKind {
    /// The value the fabric carries.
    #[inline]
    fn encode(self) -> u32 {
        match self {
            Self::Qp(qpn) => qpn & !CQ_KICK,
            Self::Cq(cqn) => cqn | CQ_KICK,
        }
    }

    /// What the device makes of a kick value.
    #[inline]
    pub(crate) fn decode(what: u32) -> Self {
        if what & CQ_KICK == 0 {
            Self::Qp(what)
        } else {
            Self::Cq(what & !CQ_KICK)
        }
    }
}

/// The host side's handle for kicking the device.
#[derive(Debug, Clone)]
pub(crate) struct Kicker(pub(crate) portverbs_fabric::Kicker);

impl Kicker {
    #[inline]
    pub(crate) fn kick(&self, kind: KickKind) {
        self.0.kick(kind.encode());
    }
}

#[cfg(test)]
mod tests {
    use super::KickKind;

    #[test]
    fn kick_values_round_trip() {
        for k in [
            KickKind::Qp(0),
            KickKind::Qp(0xff_ffff),
            KickKind::Cq(0),
            KickKind::Cq(0xff_ffff),
        ] {
            assert_eq!(KickKind::decode(k.encode()), k);
        }
    }
}
