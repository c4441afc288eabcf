//! UAR pages and doorbells (Linux `include/linux/mlx4/doorbell.h`, rdma-core `providers/mlx4/`):
//! send doorbell, CQ arm doorbell, EQ doorbells, BlueFlame registers, and the doorbell records in
//! host memory.

/// Bytes per UAR page.
pub const UAR_PAGE: usize = 4096;
/// UAR offset of the send doorbell (`qpn << 8`).
pub const SEND_DOORBELL: usize = 0x14;
/// UAR offset of the CQ doorbell (8 bytes).
pub const CQ_DOORBELL: usize = 0x20;
/// UAR offset of the first EQ doorbell.
pub const EQ_DOORBELL: usize = 0x800;
/// EQ doorbell: arm bit.
pub const EQ_ARM: u32 = 1 << 31;
/// CQ doorbell command: arm for solicited and error completions.
pub const CQ_REQ_NOT_SOL: u32 = 1;
/// CQ doorbell command: arm for the next completion.
pub const CQ_REQ_NOT: u32 = 2;

/// BAR2 offset of EQ `eqn`'s doorbell (UAR page eqn / 4, offset 0x800 + 8 × (eqn mod 4)).
pub fn eq_doorbell(eqn: u32) -> usize {
    (eqn as usize / 4) * UAR_PAGE + EQ_DOORBELL + 8 * (eqn as usize % 4)
}

/// Dword 0 of the CQ doorbell and of the arm record: sn << 28 | cmd << 24 | cqn.
pub fn cq_arm_word(sn: u32, cmd: u32, cqn_or_ci: u32) -> u32 {
    ((sn & 3) << 28) | ((cmd & 3) << 24) | (cqn_or_ci & 0xff_ffff)
}

/// BAR2 offset of the BlueFlame page of UAR `uar` when the device has `num_uars` UAR pages.
pub fn bf_page(num_uars: usize, uar: usize) -> usize {
    (num_uars + uar) * UAR_PAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_encodings_of_facts_10_1() {
        // CQ 0x85, arm_sn 1, ci 0, "next".
        assert_eq!(cq_arm_word(1, CQ_REQ_NOT, 0x85), 0x1200_0085);
        assert_eq!(cq_arm_word(1, CQ_REQ_NOT, 0), 0x1200_0000);
        // After one event (sn 2), ci 0x10, solicited.
        assert_eq!(cq_arm_word(2, CQ_REQ_NOT_SOL, 0x85), 0x2100_0085);
        assert_eq!(cq_arm_word(2, CQ_REQ_NOT_SOL, 0x10), 0x2100_0010);
        // EQ 5 lives in UAR page 1 at 0x808.
        assert_eq!(eq_doorbell(5), 4096 + 0x808);
        assert_eq!(EQ_ARM | 0x10, 0x8000_0010);
    }
}
