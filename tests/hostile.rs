//! The hostile-peer suite: what a peer on the same network can and cannot do to a Portverbs
//! device, its connections and its connection manager, with the attacker written in Rust on
//! `portverbs-wire` (`attacks/attacker.rs`) and reaching the victim both over UDP on
//! loopback (raw sockets, any source address) and on the in-process fabric (a node of its
//! own).
//!
//! Every attack of `transport`, `reads` and `mads` asserts that nothing panics, that a
//! legitimate transfer running alongside completes with its data (where IBTA lets it
//! survive), that no byte of a registered region changes that the transfer did not write, and
//! how much memory the victim may grow by (a bound per attack, with its reason, in the
//! attack's doc comment; each test prints its measured peak and held growth). The areas:
//!
//! * `transport`: garbage, resealed mutations, spoofed sources, requests outside the receive
//!   window, and stale responses (ACK, sequence / RNR / error NAKs, reserved syndromes),
//!   including the benign case of a NAK delivered late;
//! * `reads`: RDMA READs of hundreds of MiB, READs beyond the granted depth, duplicate READs;
//! * `mads`: truncated and short MADs, REQ and DREQ floods from many source addresses,
//!   forged DREQs for live connections, REQs proposing the longest timeouts;
//! * `cm_liar`: the CM against a lying node on its fabric: a short MAD read with an earlier
//!   MAD's bytes, what thousands of strangers leave behind, the longest timers a REQ can
//!   propose, a forged request holding a listener's backlog, disconnects in a peer's name.
//!
//! Two defences against a lying peer are tested where their subject lives: the CLI's deadline
//! on every wait for a peer whose process died (`tools/tests/peer_gone.rs`), and identifiers
//! a peer could guess (key bytes, QP numbers, PSNs, comm IDs) drawn from the OS's randomness
//! (`tests/identifiers.rs`).
//!
//! The CM attacks build their MADs in one place (`attacks/cm_mads.rs`). The tests take turns
//! (`rss::turn`) so that each one's memory figures are its own. The memory figures come from
//! `/proc/self/status` and the UDP attacks bind any `127.0.0.0/8` address, so `transport`,
//! `reads` and `mads` run on Linux only; `cm_liar` stays on the fabric and runs everywhere,
//! bounding memory by the CM's own count of its tables where it does.
#![allow(unreachable_pub)]

#[cfg(target_os = "linux")]
#[allow(dead_code)]
mod conformance {
    pub mod env;
    pub mod util;
}

#[path = "util/cm/mod.rs"]
mod cm_util;

mod attacks {
    pub mod attacker;
    pub mod cm_mads;
    pub mod rss;

    mod cm_liar;
    #[cfg(target_os = "linux")]
    mod mads;
    #[cfg(target_os = "linux")]
    mod reads;
    #[cfg(target_os = "linux")]
    mod transport;
}
