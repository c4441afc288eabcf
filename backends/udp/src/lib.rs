//! # Portverbs UDP port
//!
//! Puts a fabric on a real network: a [`UdpPort`] joins a [`portverbs_fabric::Fabric`] as a
//! node that owns one IP address's RoCEv2 traffic (UDP port 4791 on that address) and is the
//! fabric's uplink — every packet for a GID no device on the fabric owns leaves through the
//! kernel's UDP sockets, and every RoCEv2 datagram that arrives for the address enters the
//! fabric, routed to the device whose GID it names. A software device attached to the same
//! fabric with the same address is then what Linux's `rdma link add rxe0 type rxe netdev
//! eth0` makes: a RoCEv2 device other processes, other hosts and Linux rxe can reach.
//!
//! What it does on the wire (facts `ib-cm-and-rocev2.md` §5):
//! * **headers**: the kernel builds IP and UDP; sockets are unconnected with path MTU
//!   discovery on, so IPv4 packets carry DF and identification 0, the header the ICRC is
//!   computed for ([`portverbs_wire::seal_datagram`]);
//! * **source ports** follow each packet's flow-label hash (`0xC000 | …`, as rxe's
//!   `rdma_get_udp_sport`): a packet leaves from a socket bound to that port, made on first
//!   use, up to [`UdpConfig::max_source_ports`] of them; past that, or when a port is taken,
//!   from 4791 (counted in [`UdpStats::sport_fallbacks`]);
//! * **ICRC** checked on every datagram received, the IPv4 identification rxe chose solved
//!   for ([`portverbs_wire::open_datagram`]); a bad one is dropped and counted
//!   ([`UdpStats::icrc_drops`]), as is anything that does not parse ([`UdpStats::malformed`]);
//! * **batching**: `sendmmsg` for every packet a fabric step produced, UDP GSO for runs of
//!   equal-sized datagrams to one peer, `recvmmsg` and UDP GRO on receive, where the kernel
//!   has them;
//! * **captures** ([`UdpPort::start_capture`]): every datagram sent and received, as the
//!   frame that carried it, in the fabric's pcap format;
//! * **faults for tests** ([`PortFaults`]): seeded loss and reordering of outgoing packets.
//!
//! Two more pieces serve tests and figures: [`Lockstep`] runs several stepped fabrics whose
//! ports talk over real sockets on one virtual clock (the conformance suite's UDP backend),
//! and [`baseline`] measures the machine's raw UDP rates with the same system calls
//! (BENCHMARKS.md compares the port with them; `examples/udp_raw.rs`, `benches/udp.sh`).
//!
//! Threads: none of its own. The port is a node of its fabric and receives when the fabric
//! is stepped, on whichever thread steps it: the fabric's one engine thread when the device
//! progresses automatically, the application's calls in manual progress, the test's steps on
//! a stepped fabric. It lends the fabric an epoll set holding its socket, and a wake-up
//! (`io`, [`portverbs_fabric::PortIo`]): the engine thread sleeps in poll(2) on both, with
//! the timeout of the fabric's next deadline, so a datagram or a doorbell wakes it; manual
//! waits sleep on the set together with their event queue's sink. A step looks at the socket
//! when it may hold something (the set polled readable, or the last look filled every
//! buffer), else at most every 5 µs, with one nonblocking `recvmmsg` (GRO where the kernel
//! has it) of at most one batch: so a flood costs bounded memory — one batch of buffers,
//! 16 MiB of pooled payload (chunks reused once no packet refers to them) — and what the
//! kernel cannot queue it drops. Sending happens on the thread that steps the fabric, at the
//! end of each step, or sooner when 4 MiB of datagrams are queued: however much a step
//! produces, the sending side holds no more, and keeps no more room than that after a burst.

//! Layering: `wire` → `transport` → `fabric` → this crate. It must never know a device's
//! queues or formats (it only routes packets), never depend on `verbs-core` or a device crate,
//! and never panic on what arrives from the network. Its `unsafe` lives in `sys` (the
//! `sendmmsg`/`recvmmsg` calls and socket options std lacks). Linux only: on other targets
//! the crate is empty.
#![cfg_attr(not(target_os = "linux"), allow(unused))]
#![warn(missing_docs)]

#[cfg(target_os = "linux")]
pub mod baseline;
#[cfg(target_os = "linux")]
mod io;
#[cfg(target_os = "linux")]
mod lockstep;
#[cfg(target_os = "linux")]
mod port;
#[cfg(target_os = "linux")]
mod rx;
#[cfg(target_os = "linux")]
mod stats;
#[cfg(target_os = "linux")]
mod sys;
#[cfg(target_os = "linux")]
mod tx;

#[cfg(target_os = "linux")]
pub use lockstep::Lockstep;
#[cfg(target_os = "linux")]
pub use port::{PortFaults, UdpConfig, UdpError, UdpPort};
#[cfg(target_os = "linux")]
pub use stats::UdpStats;
