//! The connection manager against a lying peer (DESIGN §3 decision 12: everything from the
//! wire is hostile). A node of the test's own on a private fabric ([`spoof::Spoofer`]) sends
//! crafted MADs to a device's QP1 under any source address, as a host that forges its IP
//! source can: MADs cut short, floods from thousands of addresses, requests with the longest
//! timers there are, and teardowns of other hosts' connections.

use std::time::Duration;

use portverbs::soft::Fabric;

mod cm_util;
#[path = "cm_util/spoof.rs"]
mod spoof;

use spoof::{Spoofer, cm_on, dreq, gid, pump_until_received};

/// QP1's receive buffers (as many as Linux's MAD layer posts).
const RECV_SLOTS: u64 = 512;

/// A MAD shorter than 256 bytes is not parsed with what an earlier MAD left in the buffer:
/// host A's DREQs fill every one of QP1's receive buffers, then a stranger sends only a DREQ's
/// 24-byte header. Its datagram lands in a buffer that held A's DREQ; read whole, it was a
/// DREQ carrying A's communication IDs, and the DREP that answered it told the stranger the
/// IDs of A's connection. It is dropped and counted as malformed, and nothing answers it.
#[test]
fn a_short_mad_is_dropped_and_leaks_nothing() {
    let fabric = Fabric::threaded();
    let victim = cm_on(&fabric, "10.91.0.1");
    let liar = Spoofer::attach(&fabric, &["10.91.0.2", "10.91.0.3"]);
    let (a, stranger, v) = (gid("10.91.0.2"), gid("10.91.0.3"), victim.local_gid());
    const A_LOCAL: u32 = 0xA1A1_A1A1;
    const A_REMOTE: u32 = 0xB2B2_B2B2;
    for n in 0..RECV_SLOTS {
        liar.send(a, v, &dreq(n, A_LOCAL, A_REMOTE, 0x00AB_CDEF));
        if n % 128 == 127 {
            pump_until_received(&victim, n + 1);
        }
    }
    assert!(victim.flush(Duration::from_secs(10)).unwrap());
    let to_a = liar.heard();
    assert_eq!(to_a.len(), RECV_SLOTS as usize, "a DREP answers each DREQ");
    assert!(to_a.iter().all(|h| h.to == a));
    let malformed = victim.stats().malformed;
    // The header alone, then a MAD cut after its first 200 bytes.
    let short = dreq(0x5555, 0x0101_0101, 0x0202_0202, 0x42);
    liar.send(stranger, v, &short[..24]);
    liar.send(stranger, v, &short[..200]);
    pump_until_received(&victim, RECV_SLOTS + 2);
    assert!(victim.flush(Duration::from_secs(10)).unwrap());
    let heard = liar.heard();
    let leaks: Vec<_> = heard
        .iter()
        .filter(|h| {
            h.mad
                .windows(4)
                .any(|w| w == A_LOCAL.to_be_bytes() || w == A_REMOTE.to_be_bytes())
        })
        .collect();
    assert!(
        leaks.is_empty(),
        "A's comm IDs reached the stranger: {leaks:?}"
    );
    assert!(heard.is_empty(), "nothing answers a short MAD: {heard:?}");
    assert_eq!(
        victim.stats().malformed,
        malformed + 2,
        "{:?}",
        victim.stats()
    );
}
