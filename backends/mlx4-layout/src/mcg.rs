//! The multicast group (MCG) table: entries the driver reads and writes with READ_MCG and
//! WRITE_MCG and the HCA looks groups up in (Linux `drivers/net/ethernet/mellanox/mlx4/mcg.c`,
//! `struct mlx4_mgm`). The table's first `2^log_mc_hash_sz` entries are the hash buckets
//! (MGMs) MGID_HASH indexes; the rest are overflow entries (AMGMs) that a bucket's chain
//! links to through `next_gid_index`.
//!
//! One entry, big-endian: the next entry of the chain (its index shifted left by 6; 0 ends
//! the chain) at 0x00; the member count (low 24 bits) and the protocol (bits 30–31) at 0x04;
//! the group's GID at 0x10; from 0x20 the members, one dword each (the QPN in the low 24
//! bits; bit 30 blocks multicast loopback to that QP). An entry of `n` bytes holds
//! `4 * (n / 16 - 2)` members.

/// The low 24 bits of a member dword: its QPN.
pub const QPN_MASK: u32 = 0x00ff_ffff;
/// A member dword's "block multicast loopback" bit.
pub const BLOCK_LOOPBACK: u32 = 1 << 30;
/// Protocol of an InfiniBand/RoCE group (Linux `MLX4_PROT_IB_IPV6`).
pub const PROT_IB_IPV6: u8 = 0;
/// Bytes before the first member.
pub const HEADER: usize = 0x20;
/// The smallest entry (room for 8 members) and the largest.
pub const MIN_ENTRY: usize = 64;
/// The largest entry.
pub const MAX_ENTRY: usize = 4096;

/// Members an entry of `entry_size` bytes holds.
pub fn members_per_entry(entry_size: usize) -> usize {
    4 * (entry_size / 16).saturating_sub(2)
}

/// One decoded entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mgm {
    /// Index of the next entry of the chain (0: none).
    pub next: u32,
    /// Protocol (bits 30–31 of the count dword).
    pub prot: u8,
    /// The group.
    pub gid: [u8; 16],
    /// Member dwords (QPN and flags), as many as the count says.
    pub members: Vec<u32>,
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    let w = b.get(at..at + 4)?;
    Some(u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
}

impl Mgm {
    /// Decodes an entry (all of `bytes`, the entry's size); `None` when it is shorter than
    /// [`MIN_ENTRY`] or its count is more than it holds.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < MIN_ENTRY {
            return None;
        }
        let next = be32(bytes, 0)? >> 6;
        let count_word = be32(bytes, 4)?;
        let count = (count_word & 0x00ff_ffff) as usize;
        if count > members_per_entry(bytes.len()) {
            return None;
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(bytes.get(0x10..0x20)?);
        let members = (0..count)
            .map(|i| be32(bytes, HEADER + 4 * i))
            .collect::<Option<Vec<u32>>>()?;
        Some(Self {
            next,
            prot: (count_word >> 30) as u8,
            gid,
            members,
        })
    }

    /// Encodes the entry into `out` (the entry's size, zeroed past the members); false when
    /// it does not fit.
    pub fn encode(&self, out: &mut [u8]) -> bool {
        if out.len() < MIN_ENTRY || self.members.len() > members_per_entry(out.len()) {
            return false;
        }
        out.fill(0);
        out[0..4].copy_from_slice(&(self.next << 6).to_be_bytes());
        let count = self.members.len() as u32 | (u32::from(self.prot & 3) << 30);
        out[4..8].copy_from_slice(&count.to_be_bytes());
        out[0x10..0x20].copy_from_slice(&self.gid);
        for (i, m) in self.members.iter().enumerate() {
            out[HEADER + 4 * i..HEADER + 4 * i + 4].copy_from_slice(&m.to_be_bytes());
        }
        true
    }

    /// The member QPNs.
    pub fn qpns(&self) -> impl Iterator<Item = u32> + '_ {
        self.members.iter().map(|m| m & QPN_MASK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_round_trips_and_a_bad_count_is_refused() {
        let m = Mgm {
            next: 9,
            prot: PROT_IB_IPV6,
            gid: [0xff; 16],
            members: vec![0x12, 0x34 | BLOCK_LOOPBACK],
        };
        let mut b = [0u8; 64];
        assert!(m.encode(&mut b));
        assert_eq!(&b[0..4], &(9u32 << 6).to_be_bytes());
        assert_eq!(Mgm::decode(&b), Some(m.clone()));
        assert_eq!(m.qpns().collect::<Vec<_>>(), [0x12, 0x34]);
        assert_eq!(members_per_entry(64), 8);
        b[4..8].copy_from_slice(&9u32.to_be_bytes());
        assert_eq!(Mgm::decode(&b), None, "9 members do not fit 64 bytes");
        assert_eq!(Mgm::decode(&b[..32]), None);
    }
}
