//! # Portverbs UDP port
//!
//! Puts a fabric on a real network: a [`UdpPort`] joins a [`portverbs_fabric::Fabric`] as a
//! node that owns one IP address's RoCEv2 traffic (UDP port 4791 on that address) and is the
//! fabric's uplink — every packet for a GID no device on the fabric owns leaves through the
//! system's UDP sockets, and every RoCEv2 datagram that arrives for the address enters the
//! fabric, routed to the device whose GID it names. A software device attached to the same
//! fabric with the same address is then what Linux's `rdma link add rxe0 type rxe netdev
//! eth0` makes: a RoCEv2 device other processes, other hosts and Linux rxe can reach. It runs
//! on Linux and on Windows.
//!
//! What it does on the wire (RoCEv2, IBTA Annex A17):
//! * **headers**: the system builds IP and UDP; sockets are unconnected with don't-fragment
//!   set. On Linux (path MTU discovery on) IPv4 packets carry DF and identification 0, the
//!   header the ICRC is computed for ([`portverbs_wire::seal_datagram`]); on Windows the
//!   identification is the stack's choice (see "The IPv4 identification on Windows");
//! * **hop limit and traffic class**: each packet's GRH hop limit becomes the IP TTL (IPv6
//!   hop limit) it leaves with, and its traffic class the TOS byte, as Linux's rxe writes
//!   them (`drivers/infiniband/sw/rxe/rxe_net.c`, `prepare4`/`prepare6`): unchanged. A hop
//!   limit of 0, which a zeroed address vector has, is sent as 1 (a socket sends no TTL 0);
//!   neither is forwarded by a router, so 0 is not read as "the default": what knows the
//!   route chooses the hop limit (rdma_cm and the CM service take 64, the IP route's; an
//!   address handle made from a completion takes 255). The TTL and traffic class a datagram
//!   arrived with are reported in the GRH area of its receive;
//! * **source ports** follow each packet's flow-label hash (`0xC000 | …`, as rxe's
//!   `rdma_get_udp_sport`): a packet leaves from a socket bound to that port, made on first
//!   use, up to [`UdpConfig::max_source_ports`] of them; past that, or when a port is taken,
//!   from 4791 (counted in [`UdpStats::sport_fallbacks`]);
//! * **ICRC** checked on every datagram received, the IPv4 identification the sender chose
//!   solved for ([`portverbs_wire::open_datagram`]); a bad one is dropped and counted
//!   ([`UdpStats::icrc_drops`]), as is anything that does not parse ([`UdpStats::malformed`]);
//! * **batching**: on Linux `sendmmsg` for every packet a fabric step produced, UDP GSO for
//!   runs of equal-sized datagrams to one peer, `recvmmsg` and UDP GRO on receive; on Windows
//!   one `WSASendMsg` per message, UDP send offload (USO, `UDP_SEND_MSG_SIZE`) for the same
//!   runs and receive offload (URO, `UDP_RECV_MAX_COALESCED_SIZE`) — each where the system has
//!   it. Where it does not, the port sends and receives datagram by datagram and says so in
//!   [`UdpStats::segmentation_fallback`] and [`UdpStats::coalescing_fallback`];
//! * **captures** ([`UdpPort::start_capture`]): every datagram sent and received, as the
//!   frame that carried it, in the fabric's pcap format;
//! * **faults for tests** ([`UdpConfig::faults`]): the fabric's link-fault model
//!   ([`portverbs_fabric::LinkFaults`]: seeded loss, duplication, reordering, corruption and
//!   delay) applied to outgoing packets;
//! * **multicast** (`mcast`): a UD multicast group the fabric's devices join is joined as
//!   the IP group rdma_cm maps its MGID to (`::ffff:239.a.b.c` ↔ 239.a.b.c), on a socket of
//!   its own bound to the group and 4791; packets to the group go to the group's address,
//!   looped back to the host's other members, the port's own copies dropped.
//!
//! Two more pieces serve tests and figures: [`Lockstep`] runs several stepped fabrics whose
//! ports talk over real sockets on one virtual clock (the conformance suite's UDP backend),
//! and [`baseline`] measures the machine's raw UDP rates with the same system calls
//! (BENCHMARKS.md compares the port with them; `examples/udp_raw.rs`, `benches/udp.sh`).
//!
//! ## Threads
//! None of its own. The port is a node of its fabric and receives when the fabric is
//! stepped, on whichever thread steps it: the fabric's one engine thread when the device
//! progresses automatically ([`portverbs_hal::Progress::Auto`]), the application's calls in
//! manual progress, the test's steps on a stepped fabric. It lends the fabric something to
//! sleep on ([`portverbs_fabric::PortIo`], in `io`) and receives with a look that never
//! waits:
//! * **Linux** — an epoll set holding the socket, and an eventfd as the wake-up: the engine
//!   thread sleeps in poll(2) on both, with the timeout of the fabric's next deadline, so a
//!   datagram or a doorbell wakes it; manual waits sleep on the set together with their event
//!   queue's sink. A look is one nonblocking `recvmmsg` (GRO where the kernel has it) of at
//!   most one batch.
//! * **Windows** — a fixed set of `WSARecvMsg` requests with OVERLAPPED blocks (64 of 9 KiB,
//!   or 16 of 64 KiB with URO) completing to an I/O completion port of the port's own, which
//!   also carries the fabric's wake-ups (`PostQueuedCompletionStatus`): the engine thread
//!   sleeps in `GetQueuedCompletionStatusEx` on it, with the timeout of the next deadline, and
//!   keeps the completions it dequeued for its next step. In manual progress each request's
//!   OVERLAPPED also signals an event, and a blocking wait sleeps in `WaitForMultipleObjects`
//!   on it and on an event its sink's raise signals ([`portverbs_hal::InputWait`]) — a
//!   completion port gives each packet to one thread only, so it could neither wake every
//!   waiter nor include the sink. A look takes the completions already there (kept, then
//!   queued on the port with a zero timeout), at most one batch, and reposts each request at
//!   once; in manual progress it then clears the event (issuing a request resets it anyway)
//!   and sets it again if the port still holds a completion, so the event is set exactly
//!   while input waits.
//!
//! A step looks when input may be there (the sleep saw it, or the last look filled every
//! buffer), else at most every 5 µs; so a flood costs bounded memory — one batch of buffers,
//! 16 MiB of pooled payload (chunks reused once no packet refers to them) — and what the
//! system cannot queue it drops. Sending happens on the thread that steps the fabric, at the
//! end of each step (in manual progress: at each dispatch, or on a post when the last send
//! was long enough ago), or sooner when 4 MiB of datagrams are queued: however much a step
//! produces, the sending side holds no more, and keeps no more room than that after a burst.
//! On Windows the sends are synchronous `WSASendMsg` calls.
//!
//! On Windows the requests, not a thread, are the unit: `RecvRing` (in
//! `sys_windows/recv.rs`) separates posting a receive, completing one (bytes, sender,
//! control messages) and reposting it, and none of them cares which thread calls it or which
//! port the socket is associated with. In auto progress the requests complete to the port's
//! own completion port, which the progress thread sleeps on. In manual progress they belong
//! to no port of ours: whichever thread drives the device takes the completed ones by their
//! OVERLAPPEDs' status, in the order they were issued, and every request also signals an
//! event that blocking waits and `portverbs-windows`' `block_on_port` sleep on. An
//! application that runs its own completion port associates the device with it
//! (`portverbs-windows`' `Completions::associate`), which joins the ring's socket to that
//! port under the application's key for the device: each completed receive then queues a
//! packet there that wakes the application's loop, and `Completions::dispatch` recognises it
//! (the hal's `InputWait::owns`, an address comparison) and makes the device progress. See
//! `sys_windows/port_io.rs`.
//!
//! ## Windows
//! The same port on Winsock (Microsoft Learn: "IPPROTO_IP socket options", "IPPROTO_IPV6
//! socket options", "IPPROTO_UDP socket options", "WSASendMsg function", "LPFN_WSARECVMSG
//! (WSARecvMsg) callback function"):
//! * don't-fragment with `IP_DONTFRAGMENT` / `IPV6_DONTFRAG`;
//! * received datagrams report their destination (`IP_PKTINFO`), traffic class (`IP_RECVTOS`,
//!   or only its ECN bits through `IP_RECVECN`) and hop limit (`IP_HOPLIMIT`), best effort;
//!   `SIO_UDP_CONNRESET` is turned off, so an ICMP port unreachable does not fail the next
//!   receive;
//! * the hop limit of outgoing datagrams is set per socket (`IP_TTL`, `IPV6_UNICAST_HOPS`);
//!   the traffic class too (`IP_TOS`, `IPV6_TCLASS`), best effort (Windows marks DSCP through
//!   its QoS API, which the port does not use); no Winsock option sets the IPv6 flow label.
//!   The ICRC masks all three, so they change nothing a receiver checks;
//! * USO and URO are used only where the option probe finds them (`getsockopt` of
//!   `UDP_SEND_MSG_SIZE`, `setsockopt` of `UDP_RECV_MAX_COALESCED_SIZE`).
//!
//! Under Wine (how CI runs the Windows build) the sockets are the Linux host's: the probes
//! find neither USO nor URO, and Wine passes no control message of `WSASendMsg` on to Linux,
//! so a USO message would leave as one datagram — which the probe keeps from happening.
//!
//! ## The IPv4 identification on Windows
//! The ICRC covers the IPv4 identification field. A Linux sender knows it: an unconnected
//! socket with path MTU discovery on sends DF datagrams with identification 0. A Windows
//! sender does not: no Winsock option sets or reports it ("IPPROTO_IP socket options"), raw
//! sockets that could supply the header need administrator rights and are restricted for UDP
//! ("TCP/IP raw sockets"), and RFC 6864 lets a sender put any value in a datagram that has DF
//! set and is not a fragment. Public analyses of the Windows stack describe identifications
//! drawn from counters — one global counter in older releases, per-path counters chosen by a
//! keyed Toeplitz hash of the addresses in current ones (the write-up of CVE-2018-8493,
//! "Windows TCP/IP Information Disclosure Vulnerability"; "How Windows Generates IP Header's
//! ID Field", CodeProject, 2018) — and none of them, nor any Microsoft page, an exception
//! that makes it 0 for don't-fragment datagrams. So on Windows the ICRC sealed for
//! identification 0 is, for IPv4, almost certainly wrong on the wire. What that means:
//! * **Portverbs ↔ Portverbs over IPv4 works**: the receiver solves for the identification
//!   ([`portverbs_wire::open_datagram`], `wire::gf2`), whatever the sender put there (with 15
//!   of the ICRC's 32 bits of protection left for such datagrams);
//! * **a receiver that checks the ICRC against the header it got** — Linux rxe, RoCE NICs —
//!   drops Windows's IPv4 datagrams. IPv6 has no identification and every field the ICRC
//!   covers is known: **use IPv6 on Windows** (`PORTVERBS_UDP=<an IPv6 address>`) whenever
//!   the peer is not Portverbs;
//! * **Wine is no evidence either way**: its datagrams leave through Linux sockets, with DF
//!   and identification 0, as a Linux sender's do (seen on the loopback interface, every
//!   datagram from a Wine process carried identification 0 and an ICRC that checks for it).
//!   No real Windows host was available to observe.
//!
//! Layering: `wire` → `transport` → `fabric` → this crate. It must never know a device's
//! queues or formats (it only routes packets), never depend on `verbs-core`, a device crate
//! or a platform crate, and never panic on what arrives from the network. Its `unsafe` lives
//! in `sys` (Linux: the `sendmmsg`/`recvmmsg` calls and socket options std lacks;
//! `sys_windows`: Winsock's). On other targets the crate is empty.
#![cfg_attr(not(any(target_os = "linux", windows)), allow(unused))]
#![warn(missing_docs)]

#[cfg(any(target_os = "linux", windows))]
pub mod baseline;
#[cfg(target_os = "linux")]
mod io;
#[cfg(any(target_os = "linux", windows))]
mod lockstep;
#[cfg(any(target_os = "linux", windows))]
mod mcast;
#[cfg(any(target_os = "linux", windows))]
mod msg;
#[cfg(any(target_os = "linux", windows))]
mod port;
#[cfg(any(target_os = "linux", windows))]
mod rx;
#[cfg(any(target_os = "linux", windows))]
mod stats;
#[cfg(target_os = "linux")]
mod sys;
#[cfg(windows)]
#[path = "sys_windows/mod.rs"]
mod sys;
#[cfg(windows)]
use sys::port_io as io;
#[cfg(any(target_os = "linux", windows))]
mod tx;

#[cfg(any(target_os = "linux", windows))]
pub use lockstep::Lockstep;
#[cfg(any(target_os = "linux", windows))]
pub use port::{UdpConfig, UdpError, UdpPort};
/// The link-fault model [`UdpConfig::faults`] takes (the fabric's).
#[cfg(any(target_os = "linux", windows))]
pub use portverbs_fabric::LinkFaults;
#[cfg(any(target_os = "linux", windows))]
pub use portverbs_transport::CcConfig;
#[cfg(any(target_os = "linux", windows))]
pub use stats::UdpStats;
