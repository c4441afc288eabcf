//! The sending side: packets serialised into one arena as RoCEv2 datagrams, the sockets
//! they leave from (one per flow-label source port), and the batched sends.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};

use portverbs_transport::Packet;
use portverbs_wire::{self as wire, ICRC_LEN};

use crate::stats::{Counters, add};
use crate::sys::{self, GSO_MAX_SEGMENTS, IpFields, Outgoing};

/// The sockets packets leave from: index 0 is the port's own (bound to 4791), the others are
/// bound to flow-label source ports on first use.
#[derive(Debug)]
pub(crate) struct Sockets {
    ip: IpAddr,
    list: Vec<(u16, UdpSocket)>,
    by_port: HashMap<u16, usize>,
    max: usize,
}

impl Sockets {
    pub(crate) fn new(main: UdpSocket, port: u16, max: usize) -> io::Result<Self> {
        let ip = main.local_addr()?.ip();
        Ok(Self {
            ip,
            list: vec![(port, main)],
            by_port: HashMap::new(),
            max,
        })
    }

    /// The socket for source port `sport` and the port it really has: made on first use;
    /// the main socket when `sport` is 0, when `max` sockets exist already, or when the port
    /// cannot be bound (the latter two counted).
    fn for_port(&mut self, sport: u16, stats: &Counters) -> (usize, u16) {
        let main = (0, self.list.first().map_or(0, |s| s.0));
        if sport == 0 || sport == main.1 {
            return main;
        }
        if let Some(&i) = self.by_port.get(&sport) {
            return (i, sport);
        }
        if self.list.len() > self.max {
            add(&stats.sport_fallbacks, 1);
            return main;
        }
        let made = UdpSocket::bind(SocketAddr::new(self.ip, sport)).and_then(|s| {
            sys::set_dont_fragment(&s, self.ip.is_ipv6())?;
            sys::enable_ip_fields(&s, self.ip.is_ipv6())?;
            Ok(s)
        });
        match made {
            Ok(s) => {
                self.list.push((sport, s));
                let i = self.list.len() - 1;
                self.by_port.insert(sport, i);
                (i, sport)
            }
            Err(_) => {
                // Remember the failure: the flow keeps using the main socket.
                self.by_port.insert(sport, 0);
                add(&stats.sport_fallbacks, 1);
                main
            }
        }
    }

    fn get(&self, i: usize) -> Option<&UdpSocket> {
        self.list.get(i).map(|s| &s.1)
    }

    /// Our address with the source port of socket `i`.
    fn source(&self, i: usize) -> SocketAddr {
        SocketAddr::new(self.ip, self.list.get(i).map_or(0, |s| s.0))
    }
}

/// Where [`TxQueue::flush`] hands each frame when a capture runs.
pub(crate) type FrameSink<'a> = dyn FnMut(&[u8]) + 'a;

#[derive(Debug, Clone, Copy)]
struct Entry {
    sock: usize,
    dst: SocketAddr,
    ip: IpFields,
    start: usize,
    len: usize,
}

/// Datagrams waiting for the end of the fabric step.
#[derive(Debug, Default)]
pub(crate) struct TxQueue {
    arena: Vec<u8>,
    entries: Vec<Entry>,
    /// The GSO messages of a flush: (first entry, datagrams it carries).
    runs: Vec<(usize, usize)>,
    frame: Vec<u8>,
}

/// Most bytes one GSO message carries (UDP's 16-bit length, less headers, with room).
const GSO_MAX_BYTES: usize = 63 * 1024;

/// Most bytes of serialised datagrams the queue holds, and keeps room for between flushes:
/// the port sends what is queued as soon as another datagram might not fit
/// ([`TxQueue::is_full`]), and a flush gives back capacity above it. However much a fabric
/// step produces (a READ's responses, a burst of many QPs), the port holds at most this much.
pub(crate) const ARENA_MAX: usize = 4 << 20;

/// Most datagrams the queue holds (and keeps room for) between sends.
pub(crate) const ENTRIES_MAX: usize = 4096;

/// Room one datagram may need: the largest IB MTU, headers and ICRC, with margin.
const DATAGRAM_MAX: usize = 9216;

impl TxQueue {
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when the next datagram might not fit within [`ARENA_MAX`] or [`ENTRIES_MAX`]:
    /// flush first.
    pub(crate) fn is_full(&self) -> bool {
        self.arena.len() + DATAGRAM_MAX > ARENA_MAX || self.entries.len() >= ENTRIES_MAX
    }

    /// Serialises `pkt` (not a train) for `dst_port` on the peer.
    pub(crate) fn push(
        &mut self,
        pkt: &Packet,
        dst_port: u16,
        sockets: &mut Sockets,
        stats: &Counters,
    ) {
        let dst = SocketAddr::new(pkt.dst_gid.to_ip(), dst_port);
        if dst.ip() == sockets.ip || dst.is_ipv4() != sockets.ip.is_ipv4() {
            // Our own address (no device here owns it) or the other IP family.
            add(&stats.tx_dropped, 1);
            return;
        }
        let (sock, sport) = if dst.ip().is_multicast() {
            // To a group: from the port's own socket, set up for multicast
            // (`crate::mcast::prepare_sender`), and counted for settling.
            add(&stats.tx_mcast, 1);
            add(
                &stats.tx_mcast_local_copies,
                crate::mcast::local_copies(dst, sockets.ip),
            );
            (0, sockets.list.first().map_or(0, |s| s.0))
        } else {
            sockets.for_port(pkt.udp_sport, stats)
        };
        self.make_room();
        let start = self.arena.len();
        let sealed = pkt.write_datagram(&mut self.arena).and_then(|()| {
            let body = self.arena.get(start..).unwrap_or(&[]);
            wire::datagram_icrc(SocketAddr::new(sockets.ip, sport), dst, body)
        });
        match sealed {
            Ok(crc) => {
                self.arena.extend_from_slice(&crc.to_le_bytes());
                let len = self.arena.len() - start;
                let ip = IpFields {
                    traffic_class: pkt.traffic_class,
                    hop_limit: pkt.hop_limit,
                    flow_label: pkt.flow_label,
                };
                self.entries.push(Entry {
                    sock,
                    dst,
                    ip,
                    start,
                    len,
                });
            }
            Err(_) => {
                self.arena.truncate(start);
                add(&stats.tx_dropped, 1);
            }
        }
    }

    /// Grows the arena for one more datagram as a `Vec` would, by doubling, but up to
    /// [`ARENA_MAX`] exactly, so that a queue kept within it by [`Self::is_full`] never holds
    /// more memory than that (past it, for a caller that does not check, it doubles again).
    fn make_room(&mut self) {
        let (len, cap) = (self.arena.len(), self.arena.capacity());
        if len + DATAGRAM_MAX <= cap {
            return;
        }
        if cap < ARENA_MAX {
            let want = (cap * 2).clamp(64 << 10, ARENA_MAX).max(len + DATAGRAM_MAX);
            self.arena.reserve_exact(want - len);
        } else {
            self.arena.reserve(DATAGRAM_MAX);
        }
    }

    /// Sends everything queued: one `sendmmsg` per run of datagrams leaving from the same
    /// socket, runs of equal-sized datagrams to one peer merged into GSO messages when `gso`.
    /// With a `capture`, each datagram is first handed to it as the frame that carries it.
    pub(crate) fn flush(
        &mut self,
        sockets: &Sockets,
        gso: bool,
        stats: &Counters,
        mut capture: Option<&mut FrameSink<'_>>,
    ) {
        // The messages: (first entry, datagrams it carries).
        self.runs.clear();
        let mut i = 0;
        while i < self.entries.len() {
            let segs = if gso { self.gso_run(i) } else { 1 };
            self.runs.push((i, segs));
            i += segs;
        }
        self.number_segments();
        if let Some(cap) = capture.as_mut() {
            for &(first, segs) in &self.runs {
                for (k, e) in self.entries.iter().skip(first).take(segs).enumerate() {
                    let bytes = self.arena.get(e.start..e.start + e.len).unwrap_or(&[]);
                    let src = sockets.source(e.sock);
                    let opts = e.ip.frame_options(k as u16);
                    if wire::datagram_frame(src, e.dst, &opts, true, bytes, &mut self.frame).is_ok()
                    {
                        cap(&self.frame);
                    }
                }
            }
        }
        let mut msgs: Vec<Outgoing<'_>> = Vec::new();
        let mut counts: Vec<usize> = Vec::new();
        let mut r = 0;
        while let Some(&(head, _)) = self.runs.get(r) {
            let Some(sock) = self.entries.get(head).map(|e| e.sock) else {
                break;
            };
            msgs.clear();
            counts.clear();
            while let Some(&(first, segs)) = self.runs.get(r) {
                let Some(e) = self.entries.get(first).filter(|e| e.sock == sock) else {
                    break;
                };
                let total: usize = self
                    .entries
                    .iter()
                    .skip(first)
                    .take(segs)
                    .map(|e| e.len)
                    .sum();
                msgs.push(Outgoing {
                    dst: e.dst,
                    ip: e.ip,
                    bytes: self.arena.get(e.start..e.start + total).unwrap_or(&[]),
                    segment: (segs > 1).then_some(e.len as u16),
                });
                counts.push(segs);
                add(&stats.tx_bytes, total as u64);
                r += 1;
            }
            if let Some(sock) = sockets.get(sock) {
                send_all(sock, &msgs, &counts, stats);
            }
        }
        self.entries.clear();
        self.arena.clear();
        self.runs.clear();
        // A burst queued without `is_full` checks (or a capture frame) may have grown the
        // buffers: give the excess back rather than keep it for the life of the port.
        self.arena.shrink_to(ARENA_MAX);
        self.entries.shrink_to(ENTRIES_MAX);
        self.runs.shrink_to(ENTRIES_MAX);
        self.frame.shrink_to(DATAGRAM_MAX * 2);
    }

    /// The kernel numbers the IPv4 packets a GSO message becomes: segment `k` of a message
    /// sent with identification 0 (an unconnected socket with DF) leaves with identification
    /// `k`. Each segment's ICRC was sealed for 0 in [`Self::push`]; correct it for `k`
    /// ([`wire::Ipv4IdShift`]). IPv6 has no identification.
    fn number_segments(&mut self) {
        for &(first, segs) in &self.runs {
            let Some(head) = self.entries.get(first) else {
                continue;
            };
            if segs < 2 || !head.dst.is_ipv4() {
                continue;
            }
            let mut shift = (head.len, wire::Ipv4IdShift::new(head.len));
            for (k, e) in self
                .entries
                .iter()
                .enumerate()
                .skip(first)
                .take(segs)
                .skip(1)
            {
                if e.len != shift.0 {
                    shift = (e.len, wire::Ipv4IdShift::new(e.len));
                }
                let at = e.start + e.len - ICRC_LEN;
                let Some(slot) = self.arena.get_mut(at..at + ICRC_LEN) else {
                    continue;
                };
                let mut icrc = [0u8; ICRC_LEN];
                icrc.copy_from_slice(slot);
                let id = (k - first) as u16;
                slot.copy_from_slice(&shift.1.icrc(u32::from_le_bytes(icrc), id).to_le_bytes());
            }
        }
    }

    /// How many datagrams from `i` on one GSO message can carry: the same socket and peer,
    /// the same size (the last may be shorter), within the kernel's limits.
    fn gso_run(&self, i: usize) -> usize {
        let Some(e) = self.entries.get(i) else {
            return 1;
        };
        let mut n = 1;
        let mut total = e.len;
        while let Some(next) = self.entries.get(i + n) {
            let fits = next.sock == e.sock
                && next.dst == e.dst
                && next.ip == e.ip
                && next.len <= e.len
                && n < GSO_MAX_SEGMENTS
                && total + next.len <= GSO_MAX_BYTES;
            if !fits {
                break;
            }
            n += 1;
            total += next.len;
            if next.len < e.len {
                break; // a shorter datagram ends a GSO message
            }
        }
        n
    }
}

/// Sends `msgs` (each standing for `counts[i]` datagrams), skipping over a message the kernel
/// refuses so that one bad datagram does not take the rest of the batch with it.
fn send_all(sock: &UdpSocket, msgs: &[Outgoing<'_>], counts: &[usize], stats: &Counters) {
    let mut pos = 0;
    while pos < msgs.len() {
        add(&stats.tx_calls, 1);
        let sent = sys::send_batch(sock, msgs.get(pos..).unwrap_or(&[])).unwrap_or(0);
        for &c in counts.iter().skip(pos).take(sent) {
            add(&stats.tx_packets, c as u64);
            if c > 1 {
                add(&stats.tx_gso_segments, c as u64);
            }
        }
        pos += sent;
        if let Some(&c) = counts.get(pos).filter(|_| pos < msgs.len()) {
            // The kernel refused this message (too big for the path, no buffer …).
            add(&stats.tx_errors, c as u64);
            pos += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portverbs_hal::types::Gid;
    use portverbs_transport::PayloadData;
    use portverbs_wire::{Bth, Opcode, TransportHdr};

    /// A 4 KiB READ response to 127.0.0.2, with PSN `psn`.
    fn response(psn: u32) -> Packet {
        let hdr = TransportHdr::new(Bth::new(Opcode::ReadResponseMiddle, 0x11, psn));
        Packet::new(
            Gid::from_ip("127.0.0.1".parse().unwrap()),
            Gid::from_ip("127.0.0.2".parse().unwrap()),
            hdr,
            PayloadData::Bytes(vec![0x5a; 4096]),
        )
    }

    fn queue() -> (TxQueue, Sockets, Counters) {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sock.local_addr().unwrap().port();
        let sockets = Sockets::new(sock, port, 0).unwrap();
        (TxQueue::default(), sockets, Counters::default())
    }

    /// Nothing listens on the discard port of 127.0.0.2: the kernel drops what arrives.
    const PEER_PORT: u16 = 9;

    #[test]
    fn a_flush_gives_back_what_a_large_burst_grew() {
        let (mut q, mut sockets, stats) = queue();
        // 16 MiB of responses queued in one go, as one engine step could produce them.
        for psn in 0..4096 {
            q.push(&response(psn), PEER_PORT, &mut sockets, &stats);
        }
        assert!(q.arena.capacity() > 4 * ARENA_MAX);
        q.flush(&sockets, false, &stats, None);
        assert!(q.is_empty());
        assert!(q.arena.capacity() <= ARENA_MAX, "{}", q.arena.capacity());
        assert!(q.entries.capacity() <= ENTRIES_MAX);
        assert!(q.runs.capacity() <= ENTRIES_MAX);
    }

    #[test]
    fn flushing_when_full_keeps_the_arena_within_its_bound() {
        let (mut q, mut sockets, stats) = queue();
        let mut most = 0;
        for psn in 0..8192 {
            if q.is_full() {
                q.flush(&sockets, true, &stats, None);
            }
            q.push(&response(psn), PEER_PORT, &mut sockets, &stats);
            most = most.max(q.arena.capacity());
        }
        q.flush(&sockets, true, &stats, None);
        assert!(most <= ARENA_MAX, "{most}");
        let sent = stats.snapshot();
        assert_eq!(sent.tx_packets + sent.tx_errors + sent.tx_dropped, 8192);
    }
}
