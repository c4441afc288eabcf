//! What the fabric does to packets on their way: loss, duplication, reordering, corruption and
//! delay, each decided by the fabric's seeded generator.

/// Fault and delay settings of the fabric's links.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinkFaults {
    /// Probability a packet is dropped.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet is held back by up to `reorder_window_ns` (overtaken by later ones).
    pub reorder: f64,
    /// Probability one bit of the frame is flipped (the receiver's ICRC check then drops it,
    /// unless the bit is in a field the ICRC masks).
    pub corrupt: f64,
    /// Fixed one-way delay in nanoseconds.
    pub delay_ns: u64,
    /// Extra random delay, uniform in `[0, jitter_ns)`.
    pub jitter_ns: u64,
    /// How far a reordered packet may be held back.
    pub reorder_window_ns: u64,
}

impl LinkFaults {
    /// A perfect, instantaneous link.
    pub const NONE: Self = Self {
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        corrupt: 0.0,
        delay_ns: 0,
        jitter_ns: 0,
        reorder_window_ns: 0,
    };

    /// The same probability `p` of loss, duplication, reordering and corruption, with 1 µs of
    /// delay, 1 µs of jitter and a 20 µs reordering window.
    pub fn lossy(p: f64) -> Self {
        Self {
            loss: p,
            duplicate: p,
            reorder: p,
            corrupt: p,
            delay_ns: 1_000,
            jitter_ns: 1_000,
            reorder_window_ns: 20_000,
        }
    }

    /// True when packets must be serialised to frames (so corruption hits real bytes).
    pub fn corrupts(&self) -> bool {
        self.corrupt > 0.0
    }
}

/// What happened to packets on the fabric.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Packets handed to a device.
    pub delivered: u64,
    /// Packets dropped by the loss setting.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Packets held back for reordering.
    pub reordered: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
    /// Frames the receiver dropped because the ICRC did not match.
    pub icrc_drops: u64,
    /// Packets whose destination GID no port owns.
    pub unroutable: u64,
    /// Packets dropped because their destination port's queue was full
    /// ([`crate::Bottleneck`]).
    pub queue_drops: u64,
    /// ECN-capable packets the bottleneck marked Congestion Experienced
    /// ([`crate::EcnMarking`]).
    pub ce_marked: u64,
    /// The most bytes any port's queue held (the packet that joined included): never more
    /// than [`crate::Bottleneck::queue_bytes`].
    pub max_queue_bytes: u64,
}
