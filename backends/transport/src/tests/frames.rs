//! A datagram from the wire is untrusted: `Packet::from_frame` never panics, and what it
//! accepts survives `to_frame` unchanged. The stable, every-run counterpart of the `frame`
//! fuzz target (fuzz/fuzz_targets/frame.rs).

use proptest::prelude::*;

use super::super::Packet;
use super::harness::{ack, pattern, request};
use crate::wire::{Opcode, TransportHdr, parse_frame};

/// Valid frames of a few shapes: a SEND with a padded payload, an ACK, a WRITE-only.
fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for pkt in [
        request(Opcode::SendOnly, 500, true, &pattern(37, 1)),
        ack(100),
        request(Opcode::UcSendOnly, 7, false, &pattern(256, 9)),
    ] {
        let mut f = Vec::new();
        pkt.to_frame(&mut f).expect("a test packet serialises");
        out.push(f);
    }
    out
}

/// `from_frame` on `bytes` does not panic, and an accepted packet round-trips.
fn check(bytes: &[u8]) {
    if let Ok(view) = parse_frame(bytes) {
        assert_eq!(view.transport(), TransportHdr::parse(view.ib));
    }
    let Ok(Some(pkt)) = Packet::from_frame(bytes) else {
        return;
    };
    let mut frame = Vec::new();
    pkt.to_frame(&mut frame)
        .expect("an accepted packet serialises");
    let again = Packet::from_frame(&frame)
        .expect("our own frame parses")
        .expect("our own ICRC matches");
    assert_eq!(again.hdr, pkt.hdr);
    assert_eq!((again.src_gid, again.dst_gid), (pkt.src_gid, pkt.dst_gid));
    assert_eq!(again.udp_sport, pkt.udp_sport);
    assert_eq!(
        (again.traffic_class, again.hop_limit, again.flow_label),
        (pkt.traffic_class, pkt.hop_limit, pkt.flow_label)
    );
    assert_eq!(again.payload.to_vec().ok(), pkt.payload.to_vec().ok());
}

#[test]
fn the_ip_header_carries_the_packets_class_hop_limit_and_flow_label() {
    let v6 = |last: u16| {
        portverbs_hal::types::Gid::from_ip(std::net::IpAddr::V6(std::net::Ipv6Addr::new(
            0xfd00, 0, 0, 0, 0, 0, 0, last,
        )))
    };
    let mut pkt = request(Opcode::SendOnly, 9, true, &pattern(20, 3));
    pkt.src_gid = v6(2);
    pkt.dst_gid = v6(1);
    pkt.traffic_class = 0x68;
    pkt.hop_limit = 17;
    pkt.flow_label = 0x1_2345;
    let mut f = Vec::new();
    pkt.to_frame(&mut f).expect("serialises");
    let view = parse_frame(&f).expect("parses");
    assert_eq!(
        (view.traffic_class, view.hop_limit, view.flow_label),
        (0x68, 17, 0x1_2345)
    );
    check(&f);
    // IPv4 has no flow label: the TOS and TTL travel, the label stays with the sender.
    let mut pkt = request(Opcode::SendOnly, 9, true, &pattern(20, 3));
    pkt.traffic_class = 0x20;
    pkt.hop_limit = 5;
    let mut f = Vec::new();
    pkt.to_frame(&mut f).expect("serialises");
    let back = Packet::from_frame(&f).expect("parses").expect("ICRC");
    assert_eq!(
        (back.traffic_class, back.hop_limit, back.flow_label),
        (0x20, 5, 0)
    );
}

#[test]
fn the_seed_frames_are_accepted_and_round_trip() {
    for f in seeds() {
        assert!(matches!(Packet::from_frame(&f), Ok(Some(_))));
        check(&f);
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        check(&bytes);
    }

    #[test]
    fn mutated_frames_never_panic_and_accepted_ones_round_trip(
        which in 0usize..3,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<Option<usize>>(),
    ) {
        let mut f = seeds().swap_remove(which);
        for (at, byte) in edits {
            let i = at % f.len();
            f[i] = byte;
        }
        if let Some(c) = cut {
            f.truncate(c % (f.len() + 1));
        }
        check(&f);
    }
}
