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
    assert_eq!(again.payload.to_vec().ok(), pkt.payload.to_vec().ok());
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
