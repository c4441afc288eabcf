//! A bottleneck link model: every destination port of the fabric sits behind an output queue
//! of bounded size that drains at a fixed bit rate, like a switch's egress port towards that
//! host. Senders towards one port share its queue (and so its rate); a packet that does not
//! fit in the queue is dropped (tail drop), and ECN-capable packets may be marked Congestion
//! Experienced on a RED-like ramp of the queue depth (RFC 3168, section 5; the ramp is the
//! marking curve of Floyd and Jacobson's RED, "Random Early Detection Gateways for Congestion
//! Avoidance", 1993, without its averaging).
//!
//! Time is the fabric's: virtual nanoseconds in stepped mode, real ones when free-running. The
//! queue is kept as the instant its link becomes free (`busy_until`), exactly, in units of
//! `1 / rate` nanoseconds, so that back-to-back packets are spaced by their serialisation time
//! without rounding drift.

use portverbs_transport::Packet;

/// RED-like CE marking of ECN-capable packets by the depth of the queue they join.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EcnMarking {
    /// Below this many queued bytes, no packet is marked.
    pub min_bytes: u64,
    /// At this many queued bytes the probability reaches `max_probability`; above it, every
    /// ECN-capable packet is marked.
    pub max_bytes: u64,
    /// Marking probability at `max_bytes` (the ramp rises linearly from 0 at `min_bytes`).
    pub max_probability: f64,
}

impl EcnMarking {
    /// The probability that an ECN-capable packet arriving at a queue that holds `queued`
    /// bytes is marked: 0 below `min_bytes`, rising linearly to `max_probability` at
    /// `max_bytes`, 1 above `max_bytes`.
    pub fn probability(&self, queued: u64) -> f64 {
        if queued < self.min_bytes {
            0.0
        } else if queued > self.max_bytes {
            1.0
        } else if self.max_bytes == self.min_bytes {
            self.max_probability
        } else {
            let span = (self.max_bytes - self.min_bytes) as f64;
            self.max_probability * (queued - self.min_bytes) as f64 / span
        }
    }
}

/// A bottleneck in front of every destination port: a queue of `queue_bytes` that drains at
/// `rate_bps` ([`crate::FabricConfig::bottleneck`], [`crate::Fabric::set_bottleneck`]).
///
/// A packet routed to a port joins that port's queue: when the bytes still waiting there plus
/// its own frame would exceed `queue_bytes` it is dropped ([`crate::FabricStats::queue_drops`]);
/// otherwise it may be CE-marked (`ecn`, ECN-capable packets only), and it reaches the port
/// when the link has serialised everything before it and it, plus the links' fixed delay and
/// jitter ([`crate::LinkFaults::delay_ns`]). Responses travel through the queue of the port
/// they go to, with the same parameters. A fabric with a bottleneck carries no trains: each
/// packet is queued on its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bottleneck {
    /// Bit rate of the link into each destination port (0 is taken as 1 bit/s).
    pub rate_bps: u64,
    /// Bytes the queue in front of the link holds; a packet that does not fit is dropped (tail
    /// drop).
    pub queue_bytes: u64,
    /// RED-like CE marking of ECN-capable packets: `None` = never mark.
    pub ecn: Option<EcnMarking>,
}

/// Ethernet header (no VLAN tag, no FCS, as in a capture).
const ETHERNET: u64 = 14;
const IPV4: u64 = 20;
const IPV6: u64 = 40;
const UDP: u64 = 8;
const ICRC: u64 = 4;
const NS_PER_S: u128 = 1_000_000_000;

impl Bottleneck {
    /// The bytes `pkt` occupies on the wire as a RoCEv2 frame: Ethernet (14), IPv4 (20; IPv6,
    /// 40, when either GID is not IPv4-mapped), UDP (8), the transport headers, the payload,
    /// its pad and the ICRC (4) (IBA Annex A17, RoCEv2). A train counts all its packets.
    pub fn frame_len(pkt: &Packet) -> u64 {
        let ip = if pkt.src_gid.is_ipv4_mapped() && pkt.dst_gid.is_ipv4_mapped() {
            IPV4
        } else {
            IPV6
        };
        let per_packet = ETHERNET + ip + UDP + pkt.hdr.len() as u64 + ICRC;
        let n = u64::from(pkt.train.max(1));
        // A train's packets but its first carry no RETH, and all but its last no pad or
        // immediate: close enough for a train, exact for a single packet (the only kind a
        // bottleneck queues).
        n * per_packet + pkt.payload.len() as u64 + u64::from(pkt.hdr.bth.pad_count)
    }

    /// Nanoseconds the link needs to serialise `bytes` (rounded up).
    pub fn serialisation_ns(&self, bytes: u64) -> u64 {
        let rate = u128::from(self.rate_bps.max(1));
        (u128::from(bytes) * 8 * NS_PER_S).div_ceil(rate) as u64
    }
}

/// Whether the packet is ECN-capable: ECT(0) or ECT(1) in the low two bits of its traffic
/// class / TOS byte (RFC 3168, section 5).
pub(crate) fn ecn_capable(pkt: &Packet) -> bool {
    matches!(pkt.traffic_class & 3, 0b01 | 0b10)
}

/// The CE codepoint (RFC 3168, section 5).
pub(crate) const CE: u8 = 0b11;

/// The output queue of one destination port.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PortQueue {
    /// When the link has serialised everything queued, in units of `1 / rate_bps` ns (that
    /// is, nanoseconds × rate): exact, so that serialisation times never round.
    busy_until: u128,
}

impl PortQueue {
    /// Bytes not yet serialised at `now` (a packet partly on the wire counts partly).
    pub(crate) fn backlog(&self, now: u64, b: &Bottleneck) -> u64 {
        let rate = u128::from(b.rate_bps.max(1));
        let now = u128::from(now) * rate;
        let bits_ns = self.busy_until.saturating_sub(now);
        // bits × 1e9 → bytes, rounded up.
        bits_ns.div_ceil(8 * NS_PER_S) as u64
    }

    /// Queues `len` bytes at `now`; returns when their last bit leaves the link (ns, rounded
    /// up).
    pub(crate) fn push(&mut self, now: u64, len: u64, b: &Bottleneck) -> u64 {
        let rate = u128::from(b.rate_bps.max(1));
        let start = self.busy_until.max(u128::from(now) * rate);
        self.busy_until = start + u128::from(len) * 8 * NS_PER_S;
        self.busy_until.div_ceil(rate) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{Node, NodeConfig};
    use crate::{Fabric, FabricConfig, LinkFaults, Mode, NodeHandle};
    use portverbs_hal::types::Gid;
    use portverbs_transport::PayloadData;
    use portverbs_wire::{Bth, Opcode, TransportHdr};

    /// A node that keeps what it receives, with the time it arrived.
    #[derive(Debug, Default)]
    struct Sink {
        got: Vec<(u64, Packet)>,
        max_train: u32,
    }

    impl Node for Sink {
        fn kick(&mut self, _: u64, _: u32, _: &mut Vec<Packet>) {}
        fn rescan(&mut self, _: u64, _: &mut Vec<Packet>) {}
        fn run_work(&mut self, _: u64, _: &mut Vec<Packet>) -> bool {
            false
        }
        fn receive(&mut self, now: u64, _: u8, pkt: &Packet, _: &mut Vec<Packet>) {
            self.got.push((now, pkt.clone()));
        }
        fn run_timers(&mut self, _: u64, _: &mut Vec<Packet>) -> bool {
            false
        }
        fn next_deadline(&self) -> Option<u64> {
            None
        }
        fn set_max_train(&mut self, n: u32) {
            self.max_train = n;
        }
    }

    fn gid(ip: &str) -> Gid {
        Gid::parse(ip).unwrap()
    }

    fn sink(fabric: &Fabric, ip: &str) -> NodeHandle<Sink> {
        fabric
            .attach("sink", |j| {
                let config = NodeConfig {
                    name: format!("sink{}", j.ordinal),
                    routes: vec![(1, gid(ip))],
                };
                let node = Sink {
                    max_train: j.max_train,
                    ..Sink::default()
                };
                (config, node)
            })
            .unwrap()
    }

    /// An RDMA WRITE Only of `len` bytes (a multiple of 4: no pad) with traffic class `tc`.
    fn write(psn: u32, len: usize, tc: u8) -> Packet {
        let hdr = TransportHdr::new(Bth::new(Opcode::WriteOnly, 0x11, psn));
        let mut hdr = hdr;
        hdr.reth = Some(portverbs_wire::Reth {
            va: 0x1000,
            rkey: 0x22,
            dma_len: len as u32,
        });
        let mut p = Packet::new(
            gid("10.7.0.1"),
            gid("10.7.0.2"),
            hdr,
            PayloadData::from_slice(&vec![psn as u8; len]),
        );
        p.traffic_class = tc;
        p
    }

    const GBPS10: u64 = 10_000_000_000;

    fn fabric(b: Bottleneck) -> (Fabric, NodeHandle<Sink>, NodeHandle<Sink>) {
        let fabric = Fabric::new(FabricConfig {
            mode: Mode::Stepped,
            seed: 9,
            bottleneck: Some(b),
            ..FabricConfig::default()
        });
        let a = sink(&fabric, "10.7.0.1");
        let b = sink(&fabric, "10.7.0.2");
        (fabric, a, b)
    }

    fn plain(rate_bps: u64, queue_bytes: u64) -> Bottleneck {
        Bottleneck {
            rate_bps,
            queue_bytes,
            ecn: None,
        }
    }

    #[test]
    fn frame_length_counts_every_header() {
        let p = write(1, 1024, 0);
        // Ethernet 14, IPv4 20, UDP 8, BTH 12 + RETH 16, 1024 payload, ICRC 4.
        assert_eq!(Bottleneck::frame_len(&p), 14 + 20 + 8 + 28 + 1024 + 4);
        let mut v6 = p.clone();
        v6.dst_gid = gid("fe80::2");
        assert_eq!(Bottleneck::frame_len(&v6), Bottleneck::frame_len(&p) + 20);
    }

    #[test]
    fn back_to_back_packets_are_spaced_by_their_serialisation_time() {
        let b = plain(GBPS10, 1 << 20);
        let (fabric, a, rx) = fabric(b);
        assert_eq!(
            a.with(|c| c.node.max_train),
            1,
            "no trains behind a bottleneck"
        );
        fabric.run_for(5_000).unwrap();
        let t0 = fabric.now_ns();
        a.with(|c| c.out.extend((0..10).map(|i| write(i, 996, 0))));
        fabric.run_until_idle().unwrap();
        let got = rx.with(|c| std::mem::take(&mut c.node.got));
        assert_eq!(got.len(), 10);
        let len = Bottleneck::frame_len(&write(0, 996, 0));
        // 1070 bytes at 10 Gbit/s: 856 ns each, exactly.
        assert_eq!(b.serialisation_ns(len), 856);
        for (i, (t, p)) in got.iter().enumerate() {
            assert_eq!(p.hdr.bth.psn, i as u32, "in order");
            assert_eq!(*t, t0 + (i as u64 + 1) * 856, "packet {i}");
        }
        let s = fabric.stats();
        assert_eq!((s.queue_drops, s.ce_marked), (0, 0));
        assert_eq!(s.max_queue_bytes, 10 * len);
    }

    #[test]
    fn fractional_serialisation_times_do_not_drift() {
        // 1070 bytes at 3 Gbit/s: 2853.33 ns each; 30 of them exactly 85 600 ns.
        let b = plain(3_000_000_000, 1 << 20);
        let (fabric, a, rx) = fabric(b);
        a.with(|c| c.out.extend((0..30).map(|i| write(i, 996, 0))));
        fabric.run_until_idle().unwrap();
        let got = rx.with(|c| std::mem::take(&mut c.node.got));
        assert_eq!(got.len(), 30);
        assert_eq!(got[29].0, 85_600);
        assert_eq!(got[0].0, 2_854);
    }

    #[test]
    fn the_link_delay_comes_after_the_queue() {
        let b = plain(GBPS10, 1 << 20);
        let (fabric, a, rx) = fabric(b);
        fabric.set_faults(LinkFaults {
            delay_ns: 10_000,
            ..LinkFaults::NONE
        });
        a.with(|c| c.out.extend((0..3).map(|i| write(i, 996, 0))));
        fabric.run_until_idle().unwrap();
        let times: Vec<u64> = rx.with(|c| c.node.got.iter().map(|g| g.0).collect());
        assert_eq!(times, vec![10_856, 11_712, 12_568]);
    }

    #[test]
    fn a_full_queue_drops_the_tail_and_counts_it() {
        let len = Bottleneck::frame_len(&write(0, 996, 0));
        // Room for 4 whole frames and a bit.
        let b = plain(GBPS10, 4 * len + 100);
        let (fabric, a, rx) = fabric(b);
        a.with(|c| c.out.extend((0..10).map(|i| write(i, 996, 0))));
        fabric.run_until_idle().unwrap();
        let psns: Vec<u32> = rx.with(|c| c.node.got.iter().map(|g| g.1.hdr.bth.psn).collect());
        assert_eq!(psns, vec![0, 1, 2, 3]);
        let s = fabric.stats();
        assert_eq!(s.queue_drops, 6);
        assert_eq!(s.delivered, 4);
        assert!(s.max_queue_bytes <= b.queue_bytes);
        assert_eq!(s.max_queue_bytes, 4 * len);
        // Once the queue has drained (in part), it takes packets again.
        fabric.run_for(2_000).unwrap();
        a.with(|c| c.out.extend((10..13).map(|i| write(i, 996, 0))));
        fabric.run_until_idle().unwrap();
        assert_eq!(rx.with(|c| c.node.got.len()), 7);
    }

    #[test]
    fn the_queue_drains_while_packets_trickle_in_at_the_link_rate() {
        let len = Bottleneck::frame_len(&write(0, 996, 0));
        let b = plain(GBPS10, 2 * len);
        let (fabric, a, rx) = fabric(b);
        for i in 0..20 {
            a.with(|c| c.out.push(write(i, 996, 0)));
            fabric.run_for(b.serialisation_ns(len)).unwrap();
        }
        fabric.run_until_idle().unwrap();
        assert_eq!(rx.with(|c| c.node.got.len()), 20);
        assert_eq!(fabric.stats().queue_drops, 0);
        assert_eq!(fabric.stats().max_queue_bytes, len);
    }

    fn marking(min: u64, max: u64, p: f64) -> Bottleneck {
        Bottleneck {
            rate_bps: GBPS10,
            queue_bytes: 1 << 20,
            ecn: Some(EcnMarking {
                min_bytes: min,
                max_bytes: max,
                max_probability: p,
            }),
        }
    }

    #[test]
    fn marking_probability_follows_the_ramp() {
        let m = EcnMarking {
            min_bytes: 1000,
            max_bytes: 3000,
            max_probability: 0.2,
        };
        assert_eq!(m.probability(0), 0.0);
        assert_eq!(m.probability(999), 0.0);
        assert_eq!(m.probability(1000), 0.0);
        assert!((m.probability(2000) - 0.1).abs() < 1e-12);
        assert!((m.probability(3000) - 0.2).abs() < 1e-12);
        assert_eq!(m.probability(3001), 1.0);
    }

    #[test]
    fn ect_packets_above_the_ramp_are_all_marked_and_none_below_it() {
        let len = Bottleneck::frame_len(&write(0, 996, 0));
        // The first 3 packets find fewer than 3 frames queued; from the 5th on, more than 4.
        let (fabric, a, rx) = fabric(marking(3 * len, 4 * len - 1, 0.5));
        // ECT(0), then ECT(1) under DSCP bits.
        a.with(|c| c.out.extend((0..10).map(|i| write(i, 996, 0b10))));
        fabric.run_until_idle().unwrap();
        let tcs: Vec<u8> = rx.with(|c| c.node.got.drain(..).map(|g| g.1.traffic_class).collect());
        assert_eq!(tcs[..3], [0b10; 3], "below min_bytes: never marked");
        assert_eq!(tcs[4..], [0b11; 6], "above max_bytes: always marked");
        a.with(|c| c.out.extend((0..10).map(|i| write(i, 996, 0b01 | 0x68))));
        fabric.run_until_idle().unwrap();
        let tcs: Vec<u8> = rx.with(|c| c.node.got.drain(..).map(|g| g.1.traffic_class).collect());
        assert_eq!(tcs[..3], [0x69; 3]);
        assert_eq!(tcs[4..], [0x6b; 6], "CE keeps the DSCP bits");
        // The 4th finds exactly min_bytes queued: probability 0.
        assert_eq!(tcs[3], 0x69);
        let s = fabric.stats();
        assert_eq!((s.ce_marked, s.queue_drops), (12, 0));
    }

    #[test]
    fn packets_that_are_not_ecn_capable_are_never_marked() {
        let (fabric, a, rx) = fabric(marking(0, 1, 1.0));
        // Not-ECT, and CE already set (left as it is, not counted).
        a.with(|c| c.out.extend((0..10).map(|i| write(i, 996, 0x68))));
        a.with(|c| c.out.extend((10..20).map(|i| write(i, 996, 0b11))));
        fabric.run_until_idle().unwrap();
        let tcs: Vec<u8> = rx.with(|c| c.node.got.iter().map(|g| g.1.traffic_class).collect());
        assert_eq!(tcs[..10], [0x68; 10]);
        assert_eq!(tcs[10..], [0b11; 10]);
        assert_eq!(fabric.stats().ce_marked, 0);
    }

    #[test]
    fn marking_in_the_ramp_is_random_and_seeded() {
        let len = Bottleneck::frame_len(&write(0, 996, 0));
        let run = || {
            let (fabric, a, rx) = fabric(marking(0, 1000 * len, 1.0));
            a.with(|c| c.out.extend((0..400).map(|i| write(i, 996, 0b10))));
            fabric.run_until_idle().unwrap();
            let marks: Vec<bool> =
                rx.with(|c| c.node.got.iter().map(|g| g.1.traffic_class == 3).collect());
            (marks, fabric.stats().ce_marked)
        };
        let (marks, n) = run();
        assert_eq!(marks.iter().filter(|&&m| m).count() as u64, n);
        // Packet i finds i frames queued: probability i / 1000; about 80 of 400 expected.
        assert!((40..=120).contains(&n), "{n} marked");
        assert_eq!(run(), (marks, n), "the same seed marks the same packets");
    }

    #[test]
    fn trains_are_split_before_they_are_queued() {
        let (fabric, a, rx) = fabric(plain(GBPS10, 1 << 20));
        let mut hdr = TransportHdr::new(Bth::new(Opcode::WriteFirst, 0x11, 100));
        hdr.reth = Some(portverbs_wire::Reth {
            va: 0x1000,
            rkey: 0x22,
            dma_len: 4096,
        });
        let mut train = Packet::new(
            gid("10.7.0.1"),
            gid("10.7.0.2"),
            hdr,
            PayloadData::from_slice(&[7u8; 4096]),
        );
        train.train = 4;
        train.train_mtu = 1024;
        train.train_last = Opcode::WriteLast;
        a.with(|c| c.out.push(train));
        fabric.run_until_idle().unwrap();
        let got = rx.with(|c| std::mem::take(&mut c.node.got));
        assert_eq!(got.len(), 4);
        let first = Bottleneck::frame_len(&got[0].1);
        let middle = Bottleneck::frame_len(&got[1].1);
        assert_eq!(first, middle + 16, "only the first carries the RETH");
        let b = plain(GBPS10, 1 << 20);
        let mut t = 0;
        for (i, (at, p)) in got.iter().enumerate() {
            assert_eq!(p.train, 1);
            assert_eq!(p.hdr.bth.psn, 100 + i as u32);
            t += b.serialisation_ns(Bottleneck::frame_len(p));
            assert!(at.abs_diff(t) <= 1, "packet {i} at {at}, expected {t}");
        }
        assert_eq!(fabric.stats().delivered, 4);
    }

    #[test]
    fn a_free_running_fabric_queues_on_the_real_clock() {
        let len = Bottleneck::frame_len(&write(0, 996, 0));
        let fabric = Fabric::threaded();
        fabric.set_bottleneck(Some(plain(GBPS10, 4 * len + 100)));
        let a = sink(&fabric, "10.7.0.1");
        let rx = sink(&fabric, "10.7.0.2");
        assert_eq!(a.with(|c| c.node.max_train), 1);
        // Routed together at one instant: 4 fit, whatever the clock says.
        a.with(|c| c.out.extend((0..10).map(|i| write(i, 996, 0))));
        let patience = std::time::Instant::now();
        while rx.with(|c| c.node.got.len()) < 4 && patience.elapsed().as_secs() < 20 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let got: Vec<(u64, u32)> =
            rx.with(|c| c.node.got.iter().map(|g| (g.0, g.1.hdr.bth.psn)).collect());
        assert_eq!(
            got.iter().map(|g| g.1).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        assert!(got.windows(2).all(|w| w[1].0 >= w[0].0), "{got:?}");
        let s = fabric.stats();
        assert_eq!((s.queue_drops, s.max_queue_bytes), (6, 4 * len));
    }

    #[test]
    fn removing_the_bottleneck_lets_trains_form_again() {
        let (fabric, a, _rx) = fabric(plain(GBPS10, 1 << 20));
        assert_eq!(a.with(|c| c.node.max_train), 1);
        fabric.set_bottleneck(None);
        assert_eq!(a.with(|c| c.node.max_train), crate::sim::MAX_TRAIN);
        fabric.set_bottleneck(Some(plain(GBPS10, 1 << 20)));
        assert_eq!(a.with(|c| c.node.max_train), 1);
    }

    #[test]
    fn responses_queue_at_the_senders_port_independently() {
        let len = Bottleneck::frame_len(&write(0, 996, 0));
        let (fabric, a, rx) = fabric(plain(GBPS10, 3 * len));
        let mut back = write(50, 996, 0);
        back.src_gid = gid("10.7.0.2");
        back.dst_gid = gid("10.7.0.1");
        a.with(|c| c.out.extend((0..3).map(|i| write(i, 996, 0))));
        rx.with(|c| c.out.extend(std::iter::repeat_n(back, 3)));
        fabric.run_until_idle().unwrap();
        assert_eq!(rx.with(|c| c.node.got.len()), 3);
        assert_eq!(a.with(|c| c.node.got.len()), 3);
        assert_eq!(fabric.stats().queue_drops, 0);
    }
}
