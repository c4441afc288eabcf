//! The port's counters, shared by the port's handle and its node.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a [`crate::UdpPort`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams sent.
    pub tx_packets: u64,
    /// Bytes of those datagrams (ICRC included, IP/UDP headers not).
    pub tx_bytes: u64,
    /// Send calls: `sendmmsg` on Linux, `WSASendMsg` on Windows.
    pub tx_calls: u64,
    /// Datagrams handed to the kernel as GSO segments (part of `tx_packets`).
    pub tx_gso_segments: u64,
    /// Datagrams the kernel refused (dropped: the transport retransmits).
    pub tx_errors: u64,
    /// Packets that could not be serialised, or were for our own address (dropped).
    pub tx_dropped: u64,
    /// Packets sent from 4791 instead of their flow's source port.
    pub sport_fallbacks: u64,
    /// Datagrams received (after GRO is undone).
    pub rx_packets: u64,
    /// Bytes of those datagrams.
    pub rx_bytes: u64,
    /// Receive looks that returned data: `recvmmsg` calls on Linux, harvests of completed
    /// `WSARecvMsg` requests on Windows.
    pub rx_calls: u64,
    /// Datagrams dropped because their ICRC did not match.
    pub icrc_drops: u64,
    /// Datagrams dropped because they were not RoCEv2 this stack can parse.
    pub malformed: u64,
    /// Datagrams dropped after they were received, for want of room. Always 0: the socket is
    /// read by the thread that steps the fabric, one batch at a time, and what the fabric
    /// cannot take yet stays in the kernel's buffer.
    pub rx_overflow: u64,
    /// Outgoing packets the test faults dropped.
    pub injected_loss: u64,
    /// Outgoing packets the test faults held back for reordering.
    pub injected_reorder: u64,
    /// Outgoing packets the test faults sent twice.
    pub injected_duplicate: u64,
    /// Outgoing copies the test faults flipped a bit of (dropped at once when the ICRC
    /// then fails, as the receiver would drop them).
    pub injected_corrupt: u64,
    /// Receive buffer the kernel granted, in bytes.
    pub rcvbuf: u64,
    /// 1 when the port asked for send segmentation offload (UDP GSO on Linux, USO on
    /// Windows) and the system lacks it, so that every datagram is a send of its own; 0 when
    /// it is in use or was not asked for.
    pub segmentation_fallback: u64,
    /// 1 when the port asked for receive coalescing (UDP GRO on Linux, URO on Windows) and
    /// the system lacks it, so that every receive brings one datagram; 0 otherwise.
    pub coalescing_fallback: u64,
    /// Datagrams sent to an IP multicast group (part of `tx_packets`).
    pub tx_mcast: u64,
    /// Copies of those the other ports of this process that joined the group are to
    /// receive (a datagram to a group reaches every member; this counts the ones a process
    /// can know of, for settling).
    pub tx_mcast_local_copies: u64,
    /// Datagrams received on a multicast group's socket from another sender (part of
    /// `rx_packets`).
    pub rx_mcast: u64,
    /// The port's own multicast datagrams the system looped back to it, dropped (its own
    /// device had them from the fabric already; not in `rx_packets`).
    pub rx_mcast_loop: u64,
}

impl UdpStats {
    /// The datagrams ports of this process are to receive for what this port sent: one per
    /// unicast datagram, and one per other member of this process for each multicast one.
    /// Summed over the ports that talk to each other, it equals their summed `rx_packets`
    /// once nothing is in flight.
    pub fn expected_peer_rx(&self) -> u64 {
        (self.tx_packets + self.tx_mcast_local_copies).saturating_sub(self.tx_mcast)
    }
}

/// The live counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) tx_packets: AtomicU64,
    pub(crate) tx_bytes: AtomicU64,
    pub(crate) tx_calls: AtomicU64,
    pub(crate) tx_gso_segments: AtomicU64,
    pub(crate) tx_errors: AtomicU64,
    pub(crate) tx_dropped: AtomicU64,
    pub(crate) sport_fallbacks: AtomicU64,
    pub(crate) rx_packets: AtomicU64,
    pub(crate) rx_bytes: AtomicU64,
    pub(crate) rx_calls: AtomicU64,
    pub(crate) icrc_drops: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) rx_overflow: AtomicU64,
    pub(crate) injected_loss: AtomicU64,
    pub(crate) injected_reorder: AtomicU64,
    pub(crate) injected_duplicate: AtomicU64,
    pub(crate) injected_corrupt: AtomicU64,
    pub(crate) rcvbuf: AtomicU64,
    pub(crate) segmentation_fallback: AtomicU64,
    pub(crate) coalescing_fallback: AtomicU64,
    pub(crate) tx_mcast: AtomicU64,
    pub(crate) tx_mcast_local_copies: AtomicU64,
    pub(crate) rx_mcast: AtomicU64,
    pub(crate) rx_mcast_loop: AtomicU64,
    /// Datagrams the node is done with (handed to the fabric or dropped): with
    /// `tx_packets` of every port it tells when nothing is in flight ([`crate::Lockstep`]).
    pub(crate) rx_settled: AtomicU64,
}

/// Adds `n` to a counter.
#[inline]
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> UdpStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        UdpStats {
            tx_packets: g(&self.tx_packets),
            tx_bytes: g(&self.tx_bytes),
            tx_calls: g(&self.tx_calls),
            tx_gso_segments: g(&self.tx_gso_segments),
            tx_errors: g(&self.tx_errors),
            tx_dropped: g(&self.tx_dropped),
            sport_fallbacks: g(&self.sport_fallbacks),
            rx_packets: g(&self.rx_packets),
            rx_bytes: g(&self.rx_bytes),
            rx_calls: g(&self.rx_calls),
            icrc_drops: g(&self.icrc_drops),
            malformed: g(&self.malformed),
            rx_overflow: g(&self.rx_overflow),
            injected_loss: g(&self.injected_loss),
            injected_reorder: g(&self.injected_reorder),
            injected_duplicate: g(&self.injected_duplicate),
            injected_corrupt: g(&self.injected_corrupt),
            rcvbuf: g(&self.rcvbuf),
            segmentation_fallback: g(&self.segmentation_fallback),
            coalescing_fallback: g(&self.coalescing_fallback),
            tx_mcast: g(&self.tx_mcast),
            tx_mcast_local_copies: g(&self.tx_mcast_local_copies),
            rx_mcast: g(&self.rx_mcast),
            rx_mcast_loop: g(&self.rx_mcast_loop),
        }
    }
}
