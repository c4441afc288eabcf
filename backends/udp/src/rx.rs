//! The receiving side: the node itself receives, on whichever thread steps its fabric (the
//! engine thread in auto progress, the application's calls in manual progress, the test's
//! steps on a stepped fabric) — one nonblocking `recvmmsg` of at most one batch per look,
//! every datagram checked and parsed, its payload placed in a pool of reused chunks, the
//! packets handed to the fabric in the same step. A look happens when the socket may hold
//! something (the port's I/O saw it readable, or the last look filled every buffer), and at
//! least every [`RX_LOOK`] otherwise, so a busy loop of polls does not make a system call each.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use portverbs_dma::SoftDma;
use portverbs_hal::DmaMemory as _;
use portverbs_transport::{INLINE_PAYLOAD, MemSeg, Packet, PayloadData};
use portverbs_wire::{self as wire, WireError};

use crate::port::CaptureSlot;
use crate::stats::{Counters, add};
use crate::sys::{self, RecvBufs};

/// The longest the node goes without looking at its socket while something steps it.
pub(crate) const RX_LOOK: Duration = Duration::from_micros(5);

/// The node's receiving side.
#[derive(Debug)]
pub(crate) struct Rx {
    pub(crate) sock: UdpSocket,
    pub(crate) local: SocketAddr,
    pub(crate) bufs: RecvBufs,
    pub(crate) pool: PayloadPool,
    /// Input may be waiting (see the module docs).
    pub(crate) hint: Arc<AtomicBool>,
    /// The fabric time of the last look (ns; `None` before the first).
    pub(crate) last_look: Option<u64>,
    pub(crate) frame: Vec<u8>,
}

impl Rx {
    /// Receives at most one batch when input may be waiting (see the module docs), checks and
    /// parses every datagram, and puts the packets in `out`. Returns whether a datagram was
    /// taken.
    /// `now` is the fabric's time (virtual on a stepped fabric, whose driver sets the hint
    /// when it waits for the wire).
    pub(crate) fn receive(
        &mut self,
        now: u64,
        stats: &Counters,
        capture: &Mutex<CaptureSlot>,
        out: &mut Vec<Packet>,
    ) -> bool {
        let recent = self
            .last_look
            .is_some_and(|t| now >= t && now - t < RX_LOOK.as_nanos() as u64);
        if recent && !self.hint.load(Ordering::Acquire) {
            return false;
        }
        self.last_look = Some(now);
        // Nothing waits, or a transient error such as an ICMP error queued on the socket: go
        // on.
        let got = sys::recv_batch(&self.sock, &mut self.bufs).unwrap_or_default();
        // A full batch may have left more behind.
        self.hint
            .store(got > 0 && got == self.bufs.bufs.len(), Ordering::Release);
        if got == 0 {
            return false;
        }
        add(&stats.rx_calls, 1);
        let mut seen = 0u64;
        let mut cap = capture.lock().unwrap_or_else(|e| e.into_inner());
        for (got, buf) in self.bufs.got.iter().zip(&self.bufs.bufs) {
            let Some(src) = got.src else {
                add(&stats.malformed, 1);
                continue;
            };
            let bytes = buf.get(..got.len).unwrap_or(&[]);
            if bytes.is_empty() {
                // An empty datagram: nothing to parse.
                seen += 1;
                add(&stats.rx_packets, 1);
                add(&stats.malformed, 1);
                continue;
            }
            let seg = got.segment.unwrap_or(bytes.len()).max(1);
            for d in bytes.chunks(seg) {
                seen += 1;
                add(&stats.rx_packets, 1);
                add(&stats.rx_bytes, d.len() as u64);
                match accept(src, self.local, d, &mut self.pool) {
                    Ok((mut pkt, id, df)) => {
                        pkt.traffic_class = got.ip.traffic_class;
                        pkt.hop_limit = got.ip.hop_limit;
                        pkt.flow_label = got.ip.flow_label;
                        if cap.is_running() {
                            let opts = got.ip.frame_options(id);
                            if wire::datagram_frame(src, self.local, &opts, df, d, &mut self.frame)
                                .is_ok()
                            {
                                cap.write(&self.frame);
                            }
                        }
                        out.push(pkt);
                    }
                    Err(WireError::BadIcrc { .. }) => add(&stats.icrc_drops, 1),
                    Err(_) => add(&stats.malformed, 1),
                }
            }
        }
        cap.flush();
        add(&stats.rx_settled, seen);
        true
    }
}

/// Checks a datagram and parses its packet, its payload placed in `pool`; with the IPv4
/// identification and DF flag its sender used (for the capture).
pub(crate) fn accept(
    src: SocketAddr,
    local: SocketAddr,
    d: &[u8],
    pool: &mut PayloadPool,
) -> Result<(Packet, u16, bool), WireError> {
    let view = wire::open_datagram(src, local, d)?;
    let pkt = Packet::from_datagram_with(&view, |bytes| pool.place(bytes))?;
    Ok((pkt, view.ipv4_id.unwrap_or(0), view.ipv4_df))
}

/// Where received payloads live until the engine has copied them into their memory: chunks
/// of DMA memory filled one payload after the other and reused once no packet refers to them
/// any more — no allocation per packet, and a bounded amount of memory (beyond
/// [`POOL_CHUNKS`] chunks in use, payloads get one allocation each).
#[derive(Debug, Default)]
pub(crate) struct PayloadPool {
    chunks: Vec<Arc<SoftDma>>,
    /// The chunk being filled (an index into `chunks`) and the next free offset.
    current: Option<(usize, usize)>,
}

/// Bytes of one pool chunk.
const POOL_CHUNK: usize = 256 << 10;
/// Most chunks a pool holds (16 MiB).
const POOL_CHUNKS: usize = 64;

impl PayloadPool {
    fn place(&mut self, bytes: &[u8]) -> PayloadData {
        if bytes.len() <= INLINE_PAYLOAD || bytes.len() > POOL_CHUNK {
            return PayloadData::from_slice(bytes);
        }
        let Some((i, at)) = self.room(bytes.len()) else {
            return PayloadData::from_slice(bytes);
        };
        let Some(chunk) = self.chunks.get(i) else {
            return PayloadData::from_slice(bytes);
        };
        if chunk.write(at, bytes).is_err() {
            return PayloadData::from_slice(bytes);
        }
        self.current = Some((i, at + bytes.len().next_multiple_of(64)));
        PayloadData::Mem(smallvec::smallvec![MemSeg {
            mem: chunk.clone(),
            offset: at,
            len: bytes.len() as u32,
        }])
    }

    /// A chunk and offset with `len` bytes free: the current chunk, else a chunk no packet
    /// holds any more, else a new one (up to [`POOL_CHUNKS`]).
    fn room(&mut self, len: usize) -> Option<(usize, usize)> {
        if let Some((i, at)) = self.current {
            if at + len <= POOL_CHUNK {
                return Some((i, at));
            }
        }
        let current = self.current.map(|(i, _)| i);
        if let Some(i) = self
            .chunks
            .iter()
            .enumerate()
            .position(|(i, c)| Some(i) != current && Arc::strong_count(c) == 1)
        {
            return Some((i, 0));
        }
        if self.chunks.len() < POOL_CHUNKS {
            let chunk = SoftDma::alloc(POOL_CHUNK).ok()?;
            self.chunks.push(chunk);
            return Some((self.chunks.len() - 1, 0));
        }
        None
    }
}
