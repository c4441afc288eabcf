//! [`ObjectCounts`]: how many objects of each kind are alive, the one shape in which a device
//! (the soft device, the mlx4 driver) and a verbs context report them for leak checks.

/// Live objects by kind: every count is zero once an application has released everything. A
/// layer that has no objects of a kind leaves its count at zero: devices have no address
/// handles or completion channels, a verbs context no event queues or DMA regions of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectCounts {
    /// Protection domains.
    pub pds: usize,
    /// Memory regions.
    pub mrs: usize,
    /// Memory windows.
    pub mws: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Queue pairs.
    pub qps: usize,
    /// Shared receive queues.
    pub srqs: usize,
    /// Event queues.
    pub eqs: usize,
    /// Address handles.
    pub ahs: usize,
    /// Completion channels.
    pub channels: usize,
    /// DMA regions (rings and buffers) a device allocated.
    pub dma_regions: usize,
}

impl ObjectCounts {
    /// True when nothing is alive.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::ObjectCounts;

    #[test]
    fn any_live_object_makes_the_counts_non_zero() {
        assert!(ObjectCounts::default().is_zero());
        let one = |f: fn(&mut ObjectCounts)| {
            let mut c = ObjectCounts::default();
            f(&mut c);
            c.is_zero()
        };
        assert!(!one(|c| c.pds = 1));
        assert!(!one(|c| c.channels = 1));
        assert!(!one(|c| c.dma_regions = 1));
    }
}
