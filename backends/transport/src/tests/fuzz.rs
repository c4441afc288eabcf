//! The stateful fuzz driver (`crate::fuzzing`, run by the `engine` target in `fuzz/`) on a
//! few thousand seeded random inputs, so that every `cargo test` runs it: no panic, bounded
//! output per engine call, bounded queues, and every posted send completed exactly once
//! after the wire is clean.

use crate::fuzzing::{Report, run};

/// SplitMix64: the inputs are the same on every run.
fn input(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

#[test]
fn the_engine_survives_seeded_random_sequences() {
    let mut total = Report::default();
    for seed in 0..3000u64 {
        let len = 64 + (seed as usize * 37) % 1500;
        let data = input(seed, len);
        let Ok(r) = std::panic::catch_unwind(|| run(&data)) else {
            panic!("seed {seed}, {len} bytes: {data:02x?}");
        };
        total.actions += r.actions;
        total.delivered += r.delivered;
        total.injected += r.injected;
        total.posted += r.posted;
        total.succeeded += r.succeeded;
        total.partial_turns += r.partial_turns;
        total.psn_out_of_window += r.psn_out_of_window;
        total.dropped += r.dropped;
        total.failed += r.failed;
        total.most_per_call = total.most_per_call.max(r.most_per_call);
    }
    // The inputs reach the code: traffic flows, much of it succeeds and some fails, READ
    // responses span turns, made-up responses are dropped.
    assert!(total.delivered > 200_000, "{total:?}");
    assert!(total.injected > 5_000, "{total:?}");
    assert!(total.succeeded > 20_000, "{total:?}");
    assert!(total.failed > 1_000, "{total:?}");
    assert!(total.partial_turns > 5_000, "{total:?}");
    assert!(total.psn_out_of_window > 2_000, "{total:?}");
}

#[test]
fn empty_and_short_inputs_are_fine() {
    for data in [&[][..], &[0], &[0xff; 3], &[7; 40]] {
        run(data);
    }
}

/// Inputs the `engine` fuzz target found, kept as regressions.
const FOUND: &[&[u8]] = &[
    // An atomic's ACK lost, the SEND behind it out of RNR retries: the SEND failed and the
    // atomic was never asked for again (the retransmission timer was stopped).
    &[
        0x03, 0x62, 0x7a, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07,
        0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07,
        0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x40, 0x00, 0x00, 0x00, 0x07,
        0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x41, 0xff, 0x02, 0x04, 0x00, 0x00,
    ],
];

#[test]
fn inputs_the_fuzzer_found_pass() {
    for data in FOUND {
        run(data);
    }
}
