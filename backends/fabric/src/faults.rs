//! The link-fault model: loss, duplication, reordering, corruption and delay, decided per
//! packet by a seeded generator. The fabric's links ([`crate::Fabric::set_faults`]) and the UDP
//! port's outgoing packets (`portverbs-udp`, which sits on the fabric) both draw a packet's
//! [`Fate`] here, so one seed and one [`LinkFaults`] mean the same thing on either.

use portverbs_transport::Packet;

use crate::rng::SplitMix64;

/// Fault and delay settings of a link.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinkFaults {
    /// Probability a packet is dropped.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability a packet is held back by 1 ns to `reorder_window_ns` (overtaken by later
    /// ones).
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

    /// Decides what the link does to one packet, drawing from `rng` in a fixed order (loss,
    /// duplication, then per copy: corruption, jitter, reordering), so that the same seed and
    /// the same packets give the same fates. Draws nothing for a setting that is zero.
    pub fn decide(&self, rng: &mut SplitMix64) -> Fate {
        if rng.chance(self.loss) {
            return Fate::Lost;
        }
        let duplicated = rng.chance(self.duplicate);
        let first = self.copy(rng);
        if duplicated {
            Fate::Twice(first, self.copy(rng))
        } else {
            Fate::Once(first)
        }
    }

    fn copy(&self, rng: &mut SplitMix64) -> CopyFate {
        let corrupt = rng.chance(self.corrupt).then(|| rng.next_u64());
        let mut delay_ns = self.delay_ns + rng.below(self.jitter_ns);
        let reordered = rng.chance(self.reorder);
        if reordered {
            delay_ns += 1 + rng.below(self.reorder_window_ns);
        }
        CopyFate {
            corrupt,
            delay_ns,
            reordered,
        }
    }
}

/// What a link does to one packet ([`LinkFaults::decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Dropped.
    Lost,
    /// Delivered once.
    Once(CopyFate),
    /// Delivered twice (the second copy is the duplicate).
    Twice(CopyFate, CopyFate),
}

impl Fate {
    /// The copies that go on, in order (none when lost).
    pub fn copies(self) -> impl Iterator<Item = CopyFate> {
        let (a, b) = match self {
            Self::Lost => (None, None),
            Self::Once(a) => (Some(a), None),
            Self::Twice(a, b) => (Some(a), Some(b)),
        };
        a.into_iter().chain(b)
    }
}

/// What happens to one copy of a packet that the link lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyFate {
    /// `Some(draw)`: one bit of the frame is flipped, bit `draw % (frame bits)`
    /// ([`corrupt_packet`]).
    pub corrupt: Option<u64>,
    /// When the copy arrives after it was sent, in nanoseconds: the fixed delay, the jitter
    /// and, when reordered, the hold.
    pub delay_ns: u64,
    /// The copy is held back by the reordering setting.
    pub reordered: bool,
}

/// Serialises `pkt` to a RoCEv2 frame (in `scratch`), flips the bit `draw` picks, and parses it
/// back as a receiver would: `None` when the ICRC (or the frame parser) rejects it, as the
/// receiving device would drop it. The IP fields the ICRC does not cover keep their values.
pub fn corrupt_packet(pkt: &Packet, draw: u64, scratch: &mut Vec<u8>) -> Option<Packet> {
    match pkt.to_frame(scratch) {
        Ok(()) if !scratch.is_empty() => {
            let bit = draw % (scratch.len() as u64 * 8);
            scratch[(bit / 8) as usize] ^= 1 << (bit % 8);
            match Packet::from_frame(scratch) {
                Ok(Some(mut p)) => {
                    p.flow_label = pkt.flow_label;
                    p.traffic_class = pkt.traffic_class;
                    p.hop_limit = pkt.hop_limit;
                    Some(p)
                }
                _ => None,
            }
        }
        _ => None,
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

#[cfg(test)]
mod tests {
    use portverbs_hal::types::Gid;
    use portverbs_transport::PayloadData;
    use portverbs_wire::{Bth, Opcode, TransportHdr, pad_len};

    use super::*;

    fn fates(faults: LinkFaults, seed: u64, n: usize) -> Vec<Fate> {
        let mut rng = SplitMix64::new(seed);
        (0..n).map(|_| faults.decide(&mut rng)).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_fates_and_another_seed_others() {
        let f = LinkFaults::lossy(0.3);
        assert_eq!(fates(f, 7, 200), fates(f, 7, 200));
        assert_ne!(fates(f, 7, 200), fates(f, 8, 200));
    }

    #[test]
    fn a_perfect_link_draws_nothing_and_delivers_each_packet_once_at_once() {
        let mut rng = SplitMix64::new(3);
        let fate = LinkFaults::NONE.decide(&mut rng);
        let once = CopyFate {
            corrupt: None,
            delay_ns: 0,
            reordered: false,
        };
        assert_eq!(fate, Fate::Once(once));
        assert_eq!(fate.copies().collect::<Vec<_>>(), [once]);
        // The generator did not move.
        assert_eq!(rng.next_u64(), SplitMix64::new(3).next_u64());
    }

    #[test]
    fn certain_settings_always_happen() {
        let lost = LinkFaults {
            loss: 1.0,
            ..LinkFaults::lossy(1.0)
        };
        assert!(fates(lost, 1, 50).iter().all(|f| *f == Fate::Lost));
        assert_eq!(Fate::Lost.copies().count(), 0);
        let every = LinkFaults {
            loss: 0.0,
            ..LinkFaults::lossy(1.0)
        };
        for fate in fates(every, 1, 50) {
            let Fate::Twice(a, b) = fate else {
                panic!("{fate:?}: not duplicated");
            };
            for c in [a, b] {
                assert!(c.corrupt.is_some() && c.reordered, "{c:?}");
                // 1 µs delay, under 1 µs of jitter, a hold of 1 ns to 20 µs.
                assert!((1_001..=22_000).contains(&c.delay_ns), "{c:?}");
            }
        }
    }

    #[test]
    fn the_rates_come_out_near_the_probabilities() {
        let f = LinkFaults {
            loss: 0.1,
            duplicate: 0.2,
            ..LinkFaults::NONE
        };
        let all = fates(f, 11, 10_000);
        let lost = all.iter().filter(|f| **f == Fate::Lost).count();
        let twice = all.iter().filter(|f| matches!(f, Fate::Twice(..))).count();
        assert!((800..1_200).contains(&lost), "{lost}");
        // 20% of the 90% that get through.
        assert!((1_600..2_000).contains(&twice), "{twice}");
    }

    fn gid(ip: &str) -> Gid {
        Gid::from_ip(ip.parse().unwrap())
    }

    fn send_only(payload: &[u8]) -> Packet {
        let mut hdr = TransportHdr::new(Bth::new(Opcode::SendOnly, 0x11, 0x12_3456));
        hdr.bth.pad_count = pad_len(payload.len());
        Packet::new(
            gid("10.0.0.1"),
            gid("10.0.0.2"),
            hdr,
            PayloadData::from_slice(payload),
        )
    }

    #[test]
    fn a_flipped_bit_the_icrc_covers_drops_the_packet() {
        let pkt = send_only(b"hello");
        let mut scratch = Vec::new();
        // IPv4 20 + UDP 8 + BTH 12: bit 0 of the payload's first byte.
        let bit = 40 * 8;
        assert!(corrupt_packet(&pkt, bit, &mut scratch).is_none());
        // The draw is taken modulo the frame's bits.
        let bits = scratch.len() as u64 * 8;
        assert!(corrupt_packet(&pkt, bits + bit, &mut scratch).is_none());
    }

    #[test]
    fn a_flipped_bit_the_icrc_masks_leaves_the_packet_as_it_was() {
        let pkt = send_only(b"hello");
        let mut scratch = Vec::new();
        // The IPv4 TTL (byte 8): masked by the ICRC, and set back from the original.
        let got = corrupt_packet(&pkt, 8 * 8, &mut scratch).expect("the ICRC masks the TTL");
        assert_eq!(got.hdr, pkt.hdr);
        assert_eq!(got.payload.to_vec().unwrap(), b"hello");
        assert_eq!(got.hop_limit, pkt.hop_limit);
    }
}
