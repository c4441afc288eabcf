//! The receiving side: one thread per port, blocked in `recvmmsg`, that checks and parses
//! every datagram and hands the packets to the fabric.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Sender, TrySendError};
use portverbs_fabric::Kicker;
use portverbs_transport::Packet;
use portverbs_wire::{self as wire, WireError};

use crate::port::CaptureSlot;
use crate::stats::{Counters, add};
use crate::sys::{self, RecvBufs};

/// What the receive thread needs.
pub(crate) struct Receiver {
    pub(crate) sock: UdpSocket,
    pub(crate) local: SocketAddr,
    pub(crate) to_fabric: Sender<Vec<Packet>>,
    pub(crate) kicker: Kicker,
    pub(crate) stats: Arc<Counters>,
    pub(crate) capture: Arc<Mutex<CaptureSlot>>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) bufs: RecvBufs,
}

impl Receiver {
    /// Runs until `stop` is set (the socket's read timeout bounds how long that takes to be
    /// seen).
    pub(crate) fn run(mut self) {
        let mut frame = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            match sys::recv_batch(&self.sock, &mut self.bufs) {
                Ok(0) => continue,
                Ok(_) => add(&self.stats.rx_calls, 1),
                // Timeouts (to look at `stop`) and transient errors such as an ICMP error
                // queued on the socket: go on.
                Err(_) => continue,
            }
            let mut batch = Vec::with_capacity(self.bufs.got.len());
            let mut seen = 0u64;
            let mut cap = self.capture.lock().unwrap_or_else(|e| e.into_inner());
            for (got, buf) in self.bufs.got.iter().zip(&self.bufs.bufs) {
                let Some(src) = got.src else {
                    add(&self.stats.malformed, 1);
                    continue;
                };
                let bytes = buf.get(..got.len).unwrap_or(&[]);
                if bytes.is_empty() {
                    // An empty datagram: nothing to parse.
                    seen += 1;
                    add(&self.stats.rx_packets, 1);
                    add(&self.stats.malformed, 1);
                    continue;
                }
                let seg = got.segment.unwrap_or(bytes.len()).max(1);
                for d in bytes.chunks(seg) {
                    seen += 1;
                    add(&self.stats.rx_packets, 1);
                    add(&self.stats.rx_bytes, d.len() as u64);
                    match accept(src, self.local, d) {
                        Ok((mut pkt, id, df)) => {
                            pkt.traffic_class = got.ip.traffic_class;
                            pkt.hop_limit = got.ip.hop_limit;
                            pkt.flow_label = got.ip.flow_label;
                            if cap.is_running() {
                                let opts = got.ip.frame_options(id);
                                if wire::datagram_frame(src, self.local, &opts, df, d, &mut frame)
                                    .is_ok()
                                {
                                    cap.write(&frame);
                                }
                            }
                            batch.push(pkt);
                        }
                        Err(WireError::BadIcrc { .. }) => add(&self.stats.icrc_drops, 1),
                        Err(_) => add(&self.stats.malformed, 1),
                    }
                }
            }
            cap.flush();
            drop(cap);
            let n = batch.len() as u64;
            if n > 0 {
                match self.to_fabric.try_send(batch) {
                    Ok(()) => self.kicker.kick(0),
                    Err(TrySendError::Full(_)) => add(&self.stats.rx_overflow, n),
                    Err(TrySendError::Disconnected(_)) => return,
                }
            }
            add(&self.stats.rx_settled, seen);
        }
    }
}

/// Checks a datagram and parses its packet; with the IPv4 identification and DF flag its
/// sender used (for the capture).
fn accept(src: SocketAddr, local: SocketAddr, d: &[u8]) -> Result<(Packet, u16, bool), WireError> {
    let view = wire::open_datagram(src, local, d)?;
    let pkt = Packet::from_datagram(&view)?;
    Ok((pkt, view.ipv4_id.unwrap_or(0), view.ipv4_df))
}
