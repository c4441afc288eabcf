//! The attacker of the hostile-peer suite: RoCEv2 packets forged from `portverbs-wire`'s
//! headers, and the two ways they reach a victim.
//!
//! An attack is IB transport bytes (BTH, extension headers, payload, pad; no ICRC) with the
//! source and destination address the attacker claims. [`Wire::Udp`] seals them with a
//! correct ICRC and sends them from a raw UDP socket bound to the claimed source address (on
//! loopback every `127.0.0.0/8` address is local, so a spoofed source is one `bind` away);
//! [`Wire::Fabric`] parses them into the fabric's packet type and injects them from a node
//! of its own on the victim's in-process fabric. Either way the victim sees exactly what a
//! peer on its network could send it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use portverbs::cm::wire::Mad;
use portverbs::hal::Gid;
use portverbs_fabric::{Fabric, Joining, Node, NodeConfig, NodeHandle};
use portverbs_transport::{Packet, PayloadData};
use portverbs_wire::{
    Aeth, AethSyndrome, AtomicEth, Bth, Deth, MASK_24, Opcode, Reth, TransportHdr, seal_datagram,
};

/// The GSI's well-known Q_Key (IBTA 13.4.6.1) and QP number.
pub const GSI_QKEY: u32 = 0x8001_0000;
pub const GSI_QPN: u32 = 1;

/// A small seeded generator (xorshift64*), so every attack can be replayed from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, n)` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// PSN arithmetic modulo 2^24.
pub fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & MASK_24
}

/// A PSN in the stale half of the space as seen from `window_start`: between 2^22 and 2^23
/// behind it, far from anything a live connection has in flight.
pub fn stale_psn(rng: &mut Rng, window_start: u32) -> u32 {
    let back = (1 << 22) + rng.below(1 << 22) as u32;
    window_start.wrapping_sub(back) & MASK_24
}

/// One forged packet: IB transport bytes and the addresses it claims.
#[derive(Debug, Clone)]
pub struct Forged {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub ib: Vec<u8>,
}

/// Builds the packets of an attacker who claims to be `src`, sent to `dst`.
#[derive(Debug, Clone, Copy)]
pub struct Forge {
    pub src: IpAddr,
    pub dst: IpAddr,
}

/// A BTH with the default P_Key and AckReq set.
pub fn bth(opcode: Opcode, dest_qp: u32, psn: u32) -> Bth {
    Bth {
        ack_req: true,
        ..Bth::new(opcode, dest_qp, psn & MASK_24)
    }
}

impl Forge {
    pub fn new(src: IpAddr, dst: IpAddr) -> Self {
        Self { src, dst }
    }

    /// The packet of `hdr` and `payload` (pad count from the payload's length).
    pub fn packet(&self, hdr: TransportHdr, payload: &[u8]) -> Forged {
        let mut ib = Vec::new();
        hdr.emit_packet(payload, &mut ib)
            .expect("a forged header consistent with its opcode");
        self.raw(ib)
    }

    /// Bytes as they are, however malformed.
    pub fn raw(&self, ib: Vec<u8>) -> Forged {
        Forged {
            src: self.src,
            dst: self.dst,
            ib,
        }
    }

    /// An RC ACKNOWLEDGE carrying `syndrome` for `psn`: an ACK, an RNR NAK or a NAK.
    pub fn ack(&self, dest_qp: u32, psn: u32, syndrome: AethSyndrome) -> Forged {
        let mut hdr = TransportHdr::new(bth(Opcode::Acknowledge, dest_qp, psn));
        hdr.bth.ack_req = false;
        hdr.aeth = Some(Aeth { syndrome, msn: 0 });
        self.packet(hdr, &[])
    }

    /// An RDMA READ request for `len` bytes at `va` under `rkey`.
    pub fn read(&self, dest_qp: u32, psn: u32, va: u64, rkey: u32, len: u32) -> Forged {
        let mut hdr = TransportHdr::new(bth(Opcode::ReadRequest, dest_qp, psn));
        hdr.reth = Some(Reth {
            va,
            rkey,
            dma_len: len,
        });
        self.packet(hdr, &[])
    }

    /// An RDMA WRITE ONLY of `data` to `va` under `rkey`.
    pub fn write(&self, dest_qp: u32, psn: u32, va: u64, rkey: u32, data: &[u8]) -> Forged {
        let mut hdr = TransportHdr::new(bth(Opcode::WriteOnly, dest_qp, psn));
        hdr.reth = Some(Reth {
            va,
            rkey,
            dma_len: data.len() as u32,
        });
        self.packet(hdr, data)
    }

    /// A FETCH_AND_ADD of `add` at `va` under `rkey`.
    pub fn fetch_add(&self, dest_qp: u32, psn: u32, va: u64, rkey: u32, add: u64) -> Forged {
        let mut hdr = TransportHdr::new(bth(Opcode::FetchAdd, dest_qp, psn));
        hdr.atomic = Some(AtomicEth {
            va,
            rkey,
            swap_add: add,
            compare: 0,
        });
        self.packet(hdr, &[])
    }

    /// A UD SEND ONLY to the GSI (QP1) carrying `mad`, whatever its length.
    pub fn mad(&self, mad: &[u8]) -> Forged {
        let mut hdr = TransportHdr::new(bth(Opcode::UdSendOnly, GSI_QPN, 0));
        hdr.bth.ack_req = false;
        hdr.deth = Some(Deth {
            qkey: GSI_QKEY,
            src_qp: GSI_QPN,
        });
        self.packet(hdr, mad)
    }

    /// A mutation of a well-formed packet: `template` with some of its bytes flipped or
    /// overwritten, its length changed and its opcode replaced, then sealed again (the
    /// ICRC is computed afresh on the way out, so the mutation reaches the parser). The PSN
    /// is set to `psn` afterwards, so that the caller keeps it out of the receive window: a
    /// mutation that lands on the exact PSN, key and address of a live connection is a
    /// legitimate request (what RoCE cannot tell apart), not an attack this suite judges.
    pub fn mutate(&self, rng: &mut Rng, template: &[u8], psn: u32) -> Forged {
        let mut ib = template.to_vec();
        match rng.below(4) {
            0 => ib.truncate(rng.below(ib.len() as u64 + 1) as usize),
            1 => {
                let n = rng.below(2048) as usize;
                ib.extend(rng.bytes(n));
            }
            _ => {}
        }
        for _ in 0..rng.below(6) {
            if ib.is_empty() {
                break;
            }
            let i = rng.below(ib.len() as u64) as usize;
            ib[i] = rng.next() as u8;
        }
        if ib.len() >= 12 {
            if rng.chance(0.5) {
                ib[0] = rng.next() as u8; // opcode
            }
            let p = psn & MASK_24;
            ib[9..12].copy_from_slice(&p.to_be_bytes()[1..]);
        }
        self.raw(ib)
    }
}

/// Where an attack's packets enter the victim's network.
pub enum Wire {
    /// A node of the attacker's own on the victim's in-process fabric.
    Fabric(FabricAttacker),
    /// Raw UDP sockets on loopback, one bound to each claimed source address.
    Udp(UdpAttacker),
}

impl Wire {
    /// Sends `packets`. Returns how many left (on the fabric, bytes that do not parse as a
    /// packet cannot travel and are skipped, as a UDP port would drop them).
    pub fn send(&self, packets: &[Forged]) -> usize {
        match self {
            Self::Fabric(f) => f.send(packets),
            Self::Udp(u) => u.send(packets),
        }
    }
}

/// The fabric attacker: a node that injects packets and keeps whatever the fabric routes to
/// the addresses it claims: every packet is counted, and the first 4096 since the last
/// [`FabricAttacker::heard`] are kept in `seen`.
pub struct FabricAttacker {
    handle: NodeHandle<Sink>,
    pub seen: Arc<Mutex<Vec<Packet>>>,
}

impl FabricAttacker {
    /// Joins `fabric`, receiving the traffic for `claims` (addresses no device owns).
    pub fn join(fabric: &Fabric, claims: &[IpAddr]) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink {
            seen: seen.clone(),
            keep: 4096,
            count: 0,
        };
        let routes = claims.iter().map(|ip| (1u8, Gid::from_ip(*ip))).collect();
        let handle = fabric
            .attach("attacker", move |_: Joining| {
                (
                    NodeConfig {
                        name: "attacker".into(),
                        routes,
                    },
                    sink,
                )
            })
            .expect("the attacker joins the fabric");
        Self { handle, seen }
    }

    /// Injects `packets` (those that parse); returns how many.
    pub fn send(&self, packets: &[Forged]) -> usize {
        let pkts: Vec<Packet> = packets.iter().filter_map(to_packet).collect();
        let n = pkts.len();
        self.handle.with(|c| c.out.extend(pkts));
        n
    }

    /// Sends `mad` (a MAD, or fewer bytes) to `dst`'s QP1 from "QP1" at `src`.
    pub fn send_mad(&self, src: IpAddr, dst: IpAddr, mad: &[u8]) {
        self.send(&[Forge::new(src, dst).mad(mad)]);
    }

    /// Packets routed to the attacker so far (all of them are counted; the first 4096 kept).
    pub fn received(&self) -> u64 {
        self.handle.with(|c| c.node.count)
    }

    /// What the packets kept since the last call carried, per destination (each one's
    /// addresses and payload: on QP1, a MAD); they leave `seen`.
    pub fn heard(&self) -> Vec<Heard> {
        let kept = std::mem::take(&mut *self.seen.lock().unwrap());
        kept.iter()
            .map(|p| {
                let mut payload = vec![0u8; p.payload.len()];
                p.payload
                    .read(0, &mut payload)
                    .expect("a received packet's payload");
                Heard {
                    to: p.dst_gid,
                    from: p.src_gid,
                    mad: payload,
                }
            })
            .collect()
    }
}

/// What reached an address the fabric attacker claims.
#[derive(Debug, Clone)]
pub struct Heard {
    /// The address it was sent to.
    pub to: Gid,
    /// Its source address.
    pub from: Gid,
    /// The payload (on QP1, a MAD).
    pub mad: Vec<u8>,
}

impl Heard {
    /// The MAD, parsed.
    pub fn parsed(&self) -> Option<Mad> {
        Mad::parse(&self.mad).ok()
    }
}

/// The parsed form of a forged packet, as a UDP port would hand it to its fabric.
fn to_packet(f: &Forged) -> Option<Packet> {
    let parsed = TransportHdr::parse(&f.ib).ok()?;
    Some(Packet::new(
        Gid::from_ip(f.src),
        Gid::from_ip(f.dst),
        parsed.hdr,
        PayloadData::from_slice(parsed.payload),
    ))
}

/// The attacker's node: it never answers anything.
#[derive(Debug)]
struct Sink {
    seen: Arc<Mutex<Vec<Packet>>>,
    keep: usize,
    count: u64,
}

impl Node for Sink {
    fn kick(&mut self, _now: u64, _what: u32, _out: &mut Vec<Packet>) {}
    fn rescan(&mut self, _now: u64, _out: &mut Vec<Packet>) {}
    fn run_work(&mut self, _now: u64, _out: &mut Vec<Packet>) -> bool {
        false
    }
    fn receive(&mut self, _now: u64, _port: u8, pkt: &Packet, _out: &mut Vec<Packet>) {
        self.count += u64::from(pkt.psn_count());
        let mut seen = self.seen.lock().unwrap();
        if seen.len() < self.keep {
            seen.push(pkt.clone());
        }
    }
    fn run_timers(&mut self, _now: u64, _out: &mut Vec<Packet>) -> bool {
        false
    }
    fn next_deadline(&self) -> Option<u64> {
        None
    }
    fn set_max_train(&mut self, _n: u32) {}
}

/// The UDP attacker: one socket per claimed source address, each sending to the victim's
/// RoCEv2 port.
pub struct UdpAttacker {
    port: u16,
    sockets: Mutex<HashMap<IpAddr, UdpSocket>>,
}

impl UdpAttacker {
    /// Sends to UDP port `port` (4791 for RoCEv2) of each packet's destination.
    pub fn new(port: u16) -> Self {
        Self {
            port,
            sockets: Mutex::new(HashMap::new()),
        }
    }

    /// Sends `packets`, sealed; returns how many.
    pub fn send(&self, packets: &[Forged]) -> usize {
        let mut sockets = self.sockets.lock().unwrap();
        for f in packets {
            let sock = sockets.entry(f.src).or_insert_with(|| {
                UdpSocket::bind(SocketAddr::new(f.src, 0)).expect("a loopback source address")
            });
            let from = sock.local_addr().unwrap();
            let to = SocketAddr::new(f.dst, self.port);
            let mut d = f.ib.clone();
            // Bytes too short to carry a BTH cannot be sealed: they go out as they are.
            let _ = seal_datagram(from, to, &mut d);
            sock.send_to(&d, to).expect("sendto on loopback");
        }
        packets.len()
    }

    /// Sends raw bytes (garbage, a bad ICRC) from `src` to the victim, unsealed.
    pub fn send_raw(&self, src: IpAddr, dst: IpAddr, bytes: &[u8]) {
        let mut sockets = self.sockets.lock().unwrap();
        let sock = sockets.entry(src).or_insert_with(|| {
            UdpSocket::bind(SocketAddr::new(src, 0)).expect("a loopback source address")
        });
        sock.send_to(bytes, SocketAddr::new(dst, self.port))
            .expect("sendto on loopback");
    }

    /// Forgets the sockets (a flood from many addresses closes each after use).
    pub fn close_all(&self) {
        self.sockets.lock().unwrap().clear();
    }
}

/// An impostor over UDP: a socket on an address the victim sends to (its QP is connected
/// there, or it answers MADs from there), port 4791, that sends forged packets from that
/// address and counts whatever comes back.
pub struct UdpImpostor {
    sock: UdpSocket,
    pub received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpImpostor {
    pub fn bind(ip: IpAddr) -> Self {
        let sock = UdpSocket::bind(SocketAddr::new(ip, portverbs_wire::ROCEV2_UDP_PORT)).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let rx = sock.try_clone().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Acquire) {
                    if rx.recv(&mut buf).is_ok() {
                        received.fetch_add(1, Ordering::AcqRel);
                    }
                }
            })
        };
        Self {
            sock,
            received,
            stop,
            thread: Some(thread),
        }
    }

    pub fn send(&self, victim: SocketAddr, packets: &[Forged]) {
        let from = self.sock.local_addr().unwrap();
        for f in packets {
            let mut d = f.ib.clone();
            seal_datagram(from, victim, &mut d).unwrap();
            self.sock.send_to(&d, victim).unwrap();
        }
    }

    /// Waits until the responses stop coming (nothing for 3 s), `expect` arrived,
    /// or 60 s passed.
    pub fn drain(&self, expect: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = (0, Instant::now());
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let n = self.received.load(Ordering::Acquire);
            if n != last.0 {
                last = (n, Instant::now());
            }
            if n >= expect || last.1.elapsed() > Duration::from_secs(3) || Instant::now() > deadline
            {
                return n;
            }
        }
    }
}

impl Drop for UdpImpostor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
