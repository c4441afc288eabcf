//! The machine's raw UDP rates, measured with the same system calls the port uses: the
//! baseline the port's own figures are compared with (BENCHMARKS.md). [`blast`] sends
//! datagrams of one size to a peer as fast as `sendmmsg` (or one GSO message per batch)
//! goes; [`sink`] counts what arrives through `recvmmsg` (with GRO when asked); [`ping`] and
//! [`pong`] measure the one-way latency of one datagram each way.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use portverbs_fabric::{Mode, PortIo as _};

use crate::io::UdpIo;
use crate::sys::{self, GSO_MAX_SEGMENTS, IpFields, Outgoing};

/// Datagrams per `sendmmsg` (and segments per GSO message).
const BATCH: usize = GSO_MAX_SEGMENTS;

/// What one side of a raw run counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RawFigures {
    /// Datagrams (after GRO is undone on receive).
    pub datagrams: u64,
    /// Their bytes.
    pub bytes: u64,
    /// How long the side ran.
    pub elapsed: Duration,
}

impl RawFigures {
    /// Payload bits per second.
    pub fn gbit_per_s(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }

    /// Datagrams per second, in millions.
    pub fn mpps(&self) -> f64 {
        self.datagrams as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e6
    }
}

/// Sends `size`-byte datagrams from `from` to `to` for `duration`: batches of 64 through
/// `sendmmsg`, or with `gso` one 64-segment GSO message per call (fewer when 64 would pass
/// 63 KiB). Counts what the kernel accepted.
///
/// # Errors
/// The socket cannot be bound or set up.
pub fn blast(
    from: SocketAddr,
    to: SocketAddr,
    size: usize,
    gso: bool,
    duration: Duration,
) -> io::Result<RawFigures> {
    let sock = UdpSocket::bind(from)?;
    sys::set_dont_fragment(&sock, from.is_ipv6())?;
    sys::set_buffers(&sock, 8 << 20);
    let segs = if gso {
        (63 * 1024 / size.max(1)).clamp(1, BATCH)
    } else {
        1
    };
    let buf = vec![0x5au8; size * BATCH];
    let msgs: Vec<Outgoing<'_>> = if gso {
        vec![Outgoing {
            dst: to,
            bytes: buf.get(..size * segs).unwrap_or(&[]),
            segment: u16::try_from(size).ok(),
            ip: IpFields::default(),
        }]
    } else {
        buf.chunks(size.max(1))
            .map(|bytes| Outgoing {
                dst: to,
                bytes,
                segment: None,
                ip: IpFields::default(),
            })
            .collect()
    };
    let start = Instant::now();
    let mut fig = RawFigures::default();
    while start.elapsed() < duration {
        let sent = sys::send_batch(&sock, &msgs).unwrap_or(0);
        let n = if gso { sent * segs } else { sent };
        fig.datagrams += n as u64;
        fig.bytes += (n * size) as u64;
    }
    fig.elapsed = start.elapsed();
    Ok(fig)
}

/// Counts datagrams arriving at `at` until `stop` is set (or `limit` passes), from the first
/// one on; with `gro` the kernel may coalesce them.
///
/// # Errors
/// The socket cannot be bound or set up.
pub fn sink(
    at: SocketAddr,
    gro: bool,
    stop: Arc<AtomicBool>,
    limit: Duration,
) -> io::Result<RawFigures> {
    let sock = UdpSocket::bind(at)?;
    sys::set_buffers(&sock, 8 << 20);
    let gro = gro && sys::enable_gro(&sock);
    // The port's own way to sleep until a datagram is there (receives never wait).
    let io = UdpIo::new(&sock, Mode::Threaded)?;
    let (count, size) = if gro { (16, 1 << 16) } else { (64, 9216) };
    let mut bufs = io.recv_bufs(&sock, count, size)?;
    let begun = Instant::now();
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut fig = RawFigures::default();
    while !stop.load(Ordering::Acquire) && begun.elapsed() < limit {
        if sys::recv_batch(&sock, &mut bufs).unwrap_or(0) == 0 {
            io.wait(Duration::from_millis(20));
            continue;
        }
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        for got in &bufs.got {
            let seg = got.segment.unwrap_or(got.len).max(1);
            fig.datagrams += got.len.div_ceil(seg) as u64;
            fig.bytes += got.len as u64;
        }
    }
    fig.elapsed = first.map_or(Duration::ZERO, |f| last.duration_since(f));
    Ok(fig)
}

/// One-way latencies of a raw ping-pong: half of each round trip, as perftest reports.
#[derive(Debug, Clone, PartialEq)]
pub struct RawLatency {
    /// Round trips measured.
    pub iters: usize,
    /// The median (perftest's `t_typical`).
    pub typical: Duration,
    /// The 99.9th percentile.
    pub p99_9: Duration,
    /// The smallest.
    pub min: Duration,
}

/// How long either side of a ping-pong waits for the other before it gives up.
const PINGPONG_PATIENCE: Duration = Duration::from_secs(10);

/// Spins on a nonblocking `sock` until a datagram arrives (into `buf`); returns its length
/// and sender.
fn spin_recv(sock: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
    let since = Instant::now();
    loop {
        match sock.recv_from(buf) {
            Ok(got) => return Ok(got),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if since.elapsed() > PINGPONG_PATIENCE {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer is silent",
                    ));
                }
                std::hint::spin_loop();
            }
            Err(e) => return Err(e),
        }
    }
}

/// The answering side of [`ping`]: returns every datagram to its sender, `iters` times,
/// busy-polling a nonblocking socket as perftest's latency tests poll their CQ.
///
/// # Errors
/// The socket cannot be bound, or nothing arrived for 10 s.
pub fn pong(at: SocketAddr, iters: usize) -> io::Result<()> {
    let sock = UdpSocket::bind(at)?;
    sock.set_nonblocking(true)?;
    let mut buf = [0u8; 9216];
    for _ in 0..iters {
        let (len, from) = spin_recv(&sock, &mut buf)?;
        sock.send_to(&buf[..len], from)?;
    }
    Ok(())
}

/// Sends a `size`-byte datagram from `from` to a [`pong`] at `to` and busy-polls for its
/// return, `iters` times; returns the distribution of half of each round trip.
///
/// # Errors
/// The socket cannot be bound, or the peer stayed silent for 10 s.
pub fn ping(from: SocketAddr, to: SocketAddr, size: usize, iters: usize) -> io::Result<RawLatency> {
    let sock = UdpSocket::bind(from)?;
    sock.set_nonblocking(true)?;
    let msg = vec![0x5au8; size];
    let mut buf = [0u8; 9216];
    let mut half = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let t = Instant::now();
        sock.send_to(&msg, to)?;
        spin_recv(&sock, &mut buf)?;
        half.push(t.elapsed() / 2);
    }
    half.sort_unstable();
    let at = |q: f64| half[((half.len() as f64 * q).ceil() as usize).clamp(1, half.len()) - 1];
    Ok(RawLatency {
        iters: half.len(),
        typical: half[half.len() / 2],
        p99_9: at(0.999),
        min: half[0],
    })
}

#[cfg(test)]
mod pingpong_tests {
    use super::*;

    #[test]
    fn a_ping_pong_over_loopback_measures_every_round() {
        let server: SocketAddr = "127.0.0.1:0".parse().unwrap();
        // Bind the pong first to learn its port, then hand it to the thread.
        let probe = UdpSocket::bind(server).unwrap();
        let to = probe.local_addr().unwrap();
        drop(probe);
        let pong = std::thread::spawn(move || pong(to, 200));
        // The pong may not be bound yet: a datagram sent before is lost, so wait for it.
        std::thread::sleep(Duration::from_millis(100));
        let lat = ping("127.0.0.1:0".parse().unwrap(), to, 20, 200).unwrap();
        pong.join().unwrap().unwrap();
        assert_eq!(lat.iters, 200);
        assert!(
            lat.min <= lat.typical && lat.typical <= lat.p99_9,
            "{lat:?}"
        );
        assert!(lat.min > Duration::ZERO);
    }
}
