//! Arbitrary bytes as a session of two transport engines connected back to back: the input
//! picks the connection's settings and a sequence of posts, deliveries, drops, duplicates,
//! reorders, mutated or made-up packets, work turns, timers, QP errors and MR changes
//! (`portverbs_transport::fuzzing`). Besides "no panic": every engine call emits a bounded
//! number of packets, the timer heap and work lists stay bounded, and once the wire is clean
//! every posted send completes exactly once (on a clean run, successfully and with no
//! retransmission). `backends/transport/src/tests/fuzz.rs` runs the same driver on seeded
//! inputs in every `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    portverbs_transport::fuzzing::run(data);
});
