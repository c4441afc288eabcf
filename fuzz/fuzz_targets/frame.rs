//! Arbitrary bytes as a datagram from the wire: the RoCEv2 frame parser, the transport-header
//! parser and the engine's `Packet::from_frame` must not panic, and a frame the engine accepts
//! must come back unchanged (headers, payload, addresses, source port) through `to_frame`.
//! The same bytes as the payload of a UDP datagram (what the UDP port's socket receives):
//! `open_datagram` — the ICRC check that solves for the IPv4 identification — and
//! `Packet::from_datagram` must not panic either, and what they accept must seal again to the
//! same ICRC when it came with identification 0.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portverbs_transport::Packet;
use portverbs_wire::{TransportHdr, datagram_icrc, open_datagram, parse_frame};

fuzz_target!(|data: &[u8]| {
    let (src, dst) = (([10, 0, 0, 1], 0xc123).into(), ([10, 0, 0, 2], 4791).into());
    if let Ok(d) = open_datagram(src, dst, data) {
        let _ = Packet::from_datagram(&d);
        if let (Some(0), true, Ok(icrc)) = (d.ipv4_id, d.ipv4_df, datagram_icrc(src, dst, d.ib)) {
            assert_eq!(&icrc.to_le_bytes()[..], &data[data.len() - 4..]);
        }
    }
    if let Ok(view) = parse_frame(data) {
        let _ = view.check_icrc();
        assert_eq!(view.transport(), TransportHdr::parse(view.ib));
    }
    let Ok(Some(pkt)) = Packet::from_frame(data) else {
        return;
    };
    let mut frame = Vec::new();
    pkt.to_frame(&mut frame)
        .expect("a packet parsed from a frame serialises again");
    let again = Packet::from_frame(&frame)
        .expect("our own frame parses")
        .expect("our own ICRC is right");
    assert_eq!(again.hdr, pkt.hdr);
    assert_eq!((again.src_gid, again.dst_gid), (pkt.src_gid, pkt.dst_gid));
    assert_eq!(again.udp_sport, pkt.udp_sport);
    assert_eq!(
        again.payload.to_vec().expect("readable"),
        pkt.payload.to_vec().expect("readable")
    );
});
