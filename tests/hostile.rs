//! The hostile-peer suite: what a peer on the same network can and cannot do to a Portverbs
//! device, its connections and its connection manager, with the attacker written in Rust on
//! `portverbs-wire` (`attacks/attacker.rs`) and reaching the victim both over UDP on
//! loopback (raw sockets, any source address) and on the in-process fabric (a node of its
//! own).
//!
//! Every attack asserts that nothing panics, that a legitimate transfer running alongside
//! completes with its data (where IBTA lets it survive), that no byte of a registered region
//! changes that the transfer did not write, and how much memory the victim may grow by (a
//! bound per attack, with its reason, in the attack's doc comment; each test prints its
//! measured peak and held growth). The areas:
//!
//! * `transport`: garbage, resealed mutations, spoofed sources, requests outside the receive
//!   window, and stale responses (ACK, sequence / RNR / error NAKs, reserved syndromes),
//!   including the benign case of a NAK delivered late;
//! * `reads`: RDMA READs of hundreds of MiB, READs beyond the granted depth, duplicate READs;
//! * `mads`: truncated and short MADs, REQ and DREQ floods from many source addresses,
//!   forged DREQs for live connections, REQs proposing the longest timeouts.
//!
//! The tests take turns (`rss::turn`) so that each one's memory figures are its own. Linux
//! only: the memory figures come from `/proc/self/status`.
#![cfg(target_os = "linux")]
#![allow(unreachable_pub)]

#[allow(dead_code)]
mod conformance {
    pub mod env;
    pub mod util;
}

mod attacks {
    pub mod attacker;
    pub mod rss;

    mod mads;
    mod reads;
    mod transport;
}
