//! Packet capture: RoCEv2 frames written to a pcap file that Wireshark and tshark read.
//!
//! [`PcapCapture`] takes what a port puts on the wire — a RoCEv2 frame from its IP header on
//! ([`PcapCapture::write_frame`]), or an engine [`Packet`], serialised with
//! [`Packet::to_frame`] ([`PcapCapture::write_packet`]) — and writes it as one record of a
//! classic pcap file (link type Ethernet, nanosecond timestamps, little-endian, so a capture
//! of a stepped fabric is the same bytes on every host). A port of ours has no Ethernet
//! header, so each record gets a synthetic Ethernet II one: locally administered MAC addresses
//! made from the IP addresses (`02:00:a:b:c:d` for IPv4 `a.b.c.d`, `02:` and the last five
//! bytes for IPv6) and the EtherType of the IP version (0x0800 / 0x86DD). Everything after it
//! (IP, UDP to port 4791, the InfiniBand headers, payload, pad, ICRC) is the frame as built.
//!
//! The writer only needs frames and a clock, so a port that sends real UDP datagrams can use
//! it as the in-process fabric does ([`crate::Fabric::start_capture`]). Errors are typed
//! ([`CaptureError`]); nothing here panics.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use byteorder::LittleEndian;
use pcap_file::pcap::{PcapHeader, PcapPacket};
use pcap_file::{DataLink, Endianness, PcapError, TsResolution};
use portverbs_transport::Packet;
use thiserror::Error;

/// Length of the synthetic Ethernet II header in front of every frame.
pub const ETHERNET_HEADER_LEN: usize = 14;

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;

/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;

/// Largest record the capture writes (the pcap snapshot length): an Ethernet header and the
/// largest IPv6 datagram (40-byte header, 65535 bytes of payload).
pub const SNAPLEN: u32 = (ETHERNET_HEADER_LEN + 40 + 65_535) as u32;

/// Why a capture could not start, or stopped.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The capture file could not be created.
    #[error("creating the capture file {}: {source}", path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// Writing to (or flushing) the capture failed; nothing more is written.
    #[error("writing the capture: {0}")]
    Write(#[source] Arc<std::io::Error>),
    /// The pcap writer refused a record or the header (a timestamp past 2106, a frame longer
    /// than the snapshot length).
    #[error("the pcap writer refused a record: {0}")]
    Record(&'static str),
    /// A frame does not start with an IPv4 or IPv6 header ([`PcapCapture::write_frame`]).
    #[error("a {len}-byte frame does not start with an IPv4 or IPv6 header")]
    NotIp {
        /// The frame's length.
        len: usize,
    },
    /// A capture is already running on this fabric.
    #[error("a capture is already running")]
    AlreadyRunning,
}

impl From<PcapError> for CaptureError {
    fn from(e: PcapError) -> Self {
        match e {
            PcapError::IoError(io) => Self::Write(Arc::new(io)),
            PcapError::InvalidField(what) => Self::Record(what),
            // The writer reports nothing else; keep any future kind as a write failure.
            other => Self::Write(Arc::new(std::io::Error::other(other.to_string()))),
        }
    }
}

/// What a capture wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Records (frames) written.
    pub frames: u64,
    /// Bytes of those records, synthetic Ethernet headers included.
    pub bytes: u64,
    /// Packets that could not be serialised to a frame ([`Packet::to_frame`] failed: mixed IP
    /// families, payload memory that can no longer be read) and were left out.
    pub skipped: u64,
}

/// A pcap writer of RoCEv2 frames (see the module docs).
#[derive(Debug)]
pub struct PcapCapture<W: Write> {
    out: W,
    /// The record being built: Ethernet header, then the frame.
    record: Vec<u8>,
    /// Scratch for [`Packet::to_frame`].
    frame: Vec<u8>,
    stats: CaptureStats,
}

impl PcapCapture<BufWriter<File>> {
    /// Creates (or truncates) the file at `path` and writes the pcap header.
    ///
    /// # Errors
    /// [`CaptureError::Create`] when the file cannot be created, [`CaptureError::Write`] when
    /// the header cannot be written.
    pub fn create(path: &Path) -> Result<Self, CaptureError> {
        let file = File::create(path).map_err(|e| CaptureError::Create {
            path: path.to_path_buf(),
            source: Arc::new(e),
        })?;
        Self::new(BufWriter::with_capacity(1 << 16, file))
    }
}

impl<W: Write> PcapCapture<W> {
    /// Writes the pcap header to `out`.
    ///
    /// # Errors
    /// [`CaptureError::Write`] when `out` fails.
    pub fn new(mut out: W) -> Result<Self, CaptureError> {
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::Little,
        };
        header.write_to(&mut out)?;
        Ok(Self {
            out,
            record: Vec::with_capacity(4200),
            frame: Vec::with_capacity(4200),
            stats: CaptureStats::default(),
        })
    }

    /// What was written so far.
    pub fn stats(&self) -> CaptureStats {
        self.stats
    }

    /// Writes one RoCEv2 frame (starting at its IP header) sent at `at_ns` nanoseconds (the
    /// port's clock), behind a synthetic Ethernet header.
    ///
    /// # Errors
    /// [`CaptureError::NotIp`] for bytes that are not an IP datagram (nothing is written);
    /// [`CaptureError::Write`] or [`CaptureError::Record`] when the writer fails.
    pub fn write_frame(&mut self, at_ns: u64, frame: &[u8]) -> Result<(), CaptureError> {
        let eth = ethernet_header(frame).ok_or(CaptureError::NotIp { len: frame.len() })?;
        self.record.clear();
        self.record.extend_from_slice(&eth);
        self.record.extend_from_slice(frame);
        let len = u32::try_from(self.record.len())
            .map_err(|_| CaptureError::Record("frame longer than 4 GiB"))?;
        let packet = PcapPacket::new(Duration::from_nanos(at_ns), len, &self.record);
        // Written with pcap-file's record layout; the writer is ours so that it can be
        // flushed between records (`PcapWriter` lends no access to it).
        packet.write_to::<_, LittleEndian>(&mut self.out, TsResolution::NanoSecond, SNAPLEN)?;
        self.stats.frames += 1;
        self.stats.bytes += u64::from(len);
        Ok(())
    }

    /// Writes an engine packet as the frames it stands for (a train as its individual
    /// packets), each serialised with [`Packet::to_frame`]. A packet that cannot be serialised
    /// is left out and counted ([`CaptureStats::skipped`]).
    ///
    /// # Errors
    /// [`CaptureError::Write`] or [`CaptureError::Record`] when the writer fails.
    pub fn write_packet(&mut self, at_ns: u64, pkt: &Packet) -> Result<(), CaptureError> {
        if pkt.train > 1 {
            for part in pkt.clone().split() {
                self.write_one(at_ns, &part)?;
            }
            Ok(())
        } else {
            self.write_one(at_ns, pkt)
        }
    }

    fn write_one(&mut self, at_ns: u64, pkt: &Packet) -> Result<(), CaptureError> {
        let mut frame = std::mem::take(&mut self.frame);
        let result = match pkt.to_frame(&mut frame) {
            Ok(()) => self.write_frame(at_ns, &frame),
            Err(_) => {
                self.stats.skipped += 1;
                Ok(())
            }
        };
        self.frame = frame;
        result
    }

    /// Pushes buffered records to the underlying writer.
    ///
    /// # Errors
    /// [`CaptureError::Write`] when the underlying writer fails.
    pub fn flush(&mut self) -> Result<(), CaptureError> {
        self.out
            .flush()
            .map_err(|e| CaptureError::Write(Arc::new(e)))
    }

    /// Flushes and hands back the underlying writer with the final counts.
    ///
    /// # Errors
    /// [`CaptureError::Write`] when the final flush fails.
    pub fn finish(mut self) -> Result<(W, CaptureStats), CaptureError> {
        self.flush()?;
        Ok((self.out, self.stats))
    }
}

/// The synthetic Ethernet II header of an IP frame: MACs from the addresses, EtherType from
/// the version. `None` when the frame is too short for its IP header or not IP.
pub fn ethernet_header(frame: &[u8]) -> Option<[u8; ETHERNET_HEADER_LEN]> {
    let version = frame.first()? >> 4;
    let (ethertype, src, dst) = match version {
        4 => {
            let src = frame.get(12..16)?;
            let dst = frame.get(16..20)?;
            let mac = |a: &[u8]| {
                let mut m = [0x02, 0x00, 0, 0, 0, 0];
                m[2..].copy_from_slice(a);
                m
            };
            (ETHERTYPE_IPV4, mac(src), mac(dst))
        }
        6 => {
            let src = frame.get(8..24)?;
            let dst = frame.get(24..40)?;
            let mac = |a: &[u8]| {
                let mut m = [0x02, 0, 0, 0, 0, 0];
                m[1..].copy_from_slice(a.get(11..16).unwrap_or(&[0; 5]));
                m
            };
            (ETHERTYPE_IPV6, mac(src), mac(dst))
        }
        _ => return None,
    };
    let mut h = [0u8; ETHERNET_HEADER_LEN];
    h[..6].copy_from_slice(&dst);
    h[6..12].copy_from_slice(&src);
    h[12..].copy_from_slice(&ethertype.to_be_bytes());
    Some(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fabric, FabricConfig, Mode, Node, NodeConfig};
    use pcap_file::pcap::PcapReader;
    use portverbs_hal::types::Gid;
    use portverbs_transport::PayloadData;
    use portverbs_wire::{Bth, Deth, Opcode, Reth, TransportHdr, pad_len, parse_frame};

    fn gid(ip: &str) -> Gid {
        Gid::parse(ip).unwrap()
    }

    fn send_only(src: &str, dst: &str, payload: &[u8]) -> Packet {
        let mut hdr = TransportHdr::new(Bth::new(Opcode::SendOnly, 0x11, 0x12_3456));
        hdr.bth.solicited = true;
        hdr.bth.ack_req = true;
        hdr.bth.pad_count = pad_len(payload.len());
        let mut p = Packet::new(gid(src), gid(dst), hdr, PayloadData::from_slice(payload));
        p.udp_sport = 0xc000;
        p
    }

    /// Every record of a pcap in memory: (timestamp, original length, bytes).
    fn records(pcap: &[u8]) -> (PcapHeader, Vec<(Duration, u32, Vec<u8>)>) {
        let mut r = PcapReader::new(pcap).unwrap();
        let header = r.header();
        let mut v = Vec::new();
        while let Some(p) = r.next_packet() {
            let p = p.unwrap();
            v.push((p.timestamp, p.orig_len, p.data.into_owned()));
        }
        (header, v)
    }

    /// The record's frame, checked like a receiver would, back as a packet.
    fn frame_of(record: &[u8]) -> Packet {
        let frame = &record[ETHERNET_HEADER_LEN..];
        let view = parse_frame(frame).unwrap();
        view.check_icrc().unwrap();
        Packet::from_frame(frame).unwrap().expect("ICRC ok")
    }

    fn same(a: &Packet, b: &Packet) {
        assert_eq!((a.src_gid, a.dst_gid), (b.src_gid, b.dst_gid));
        assert_eq!(a.udp_sport, b.udp_sport);
        assert_eq!(a.hdr, b.hdr);
        assert_eq!(a.payload.to_vec().unwrap(), b.payload.to_vec().unwrap());
    }

    #[test]
    fn a_captured_frame_parses_back_to_the_packet_behind_an_ethernet_header() {
        let pkt = send_only("192.168.1.1", "192.168.1.2", b"hello");
        let mut cap = PcapCapture::new(Vec::new()).unwrap();
        cap.write_packet(1_500_000_123, &pkt).unwrap();
        let stats = cap.stats();
        let (bytes, end) = cap.finish().unwrap();
        assert_eq!(stats, end);

        let (header, recs) = records(&bytes);
        assert_eq!(header.datalink, DataLink::ETHERNET);
        assert_eq!(header.ts_resolution, TsResolution::NanoSecond);
        assert_eq!(header.endianness, Endianness::Little);
        assert_eq!((header.version_major, header.version_minor), (2, 4));
        assert_eq!(header.snaplen, SNAPLEN);
        // The nanosecond magic, little-endian.
        assert_eq!(bytes[..4], [0x4d, 0x3c, 0xb2, 0xa1]);

        assert_eq!(recs.len(), 1);
        let (ts, orig_len, rec) = &recs[0];
        assert_eq!(*ts, Duration::new(1, 500_000_123));
        assert_eq!(*orig_len as usize, rec.len());
        // IPv4 20 + UDP 8 + BTH 12 + "hello" + 3 pad + ICRC 4.
        assert_eq!(rec.len(), ETHERNET_HEADER_LEN + 52);
        assert_eq!(stats.frames, 1);
        assert_eq!(stats.bytes, rec.len() as u64);
        assert_eq!(rec[..6], [0x02, 0x00, 192, 168, 1, 2], "destination MAC");
        assert_eq!(rec[6..12], [0x02, 0x00, 192, 168, 1, 1], "source MAC");
        assert_eq!(rec[12..14], [0x08, 0x00]);
        same(&frame_of(rec), &pkt);
        // The hand-built frame of `portverbs-wire`'s tests has this packet with another IP
        // ID; ours is 0, so only the shape is compared: the ICRC closes the frame.
        assert_eq!(rec.len() - ETHERNET_HEADER_LEN, 0x34);
    }

    #[test]
    fn ipv6_frames_get_the_ipv6_ethertype_and_macs_from_the_address_tail() {
        let pkt = send_only("fd00::1:2:3:4:5", "fd00::a:b:c:d:e", &[7u8; 40]);
        let mut cap = PcapCapture::new(Vec::new()).unwrap();
        cap.write_packet(0, &pkt).unwrap();
        let (bytes, _) = cap.finish().unwrap();
        let (_, recs) = records(&bytes);
        let rec = &recs[0].2;
        assert_eq!(rec[12..14], [0x86, 0xdd]);
        // fd00:0:0:a:b:c:d:e ends in 0c 00 0d 00 0e.
        assert_eq!(rec[..6], [0x02, 0x0c, 0x00, 0x0d, 0x00, 0x0e]);
        assert_eq!(rec[6..12], [0x02, 0x03, 0x00, 0x04, 0x00, 0x05]);
        assert_eq!(rec[14] >> 4, 6);
        same(&frame_of(rec), &pkt);
    }

    #[test]
    fn a_train_is_written_as_its_packets() {
        let mut hdr = TransportHdr::new(Bth::new(Opcode::WriteFirst, 0x22, 10));
        hdr.reth = Some(Reth {
            va: 0x1000,
            rkey: 9,
            dma_len: 2600,
        });
        hdr.bth.ack_req = true;
        let data: Vec<u8> = (0..2600u32).map(|i| i as u8).collect();
        let pkt = Packet {
            train: 3,
            train_last: Opcode::WriteLast,
            train_mtu: 1024,
            ..Packet::new(
                gid("10.0.0.1"),
                gid("10.0.0.2"),
                hdr,
                PayloadData::Bytes(data.clone()),
            )
        };
        let mut cap = PcapCapture::new(Vec::new()).unwrap();
        cap.write_packet(42, &pkt).unwrap();
        let (bytes, stats) = cap.finish().unwrap();
        assert_eq!(stats.frames, 3);
        let (_, recs) = records(&bytes);
        let parts: Vec<Packet> = recs.iter().map(|r| frame_of(&r.2)).collect();
        let ops: Vec<Opcode> = parts.iter().map(|p| p.hdr.bth.opcode).collect();
        assert_eq!(
            ops,
            [Opcode::WriteFirst, Opcode::WriteMiddle, Opcode::WriteLast]
        );
        let psns: Vec<u32> = parts.iter().map(|p| p.hdr.bth.psn).collect();
        assert_eq!(psns, [10, 11, 12]);
        let joined: Vec<u8> = parts
            .iter()
            .flat_map(|p| p.payload.to_vec().unwrap())
            .collect();
        assert_eq!(joined, data);
        for (split, read) in pkt.split().iter().zip(&parts) {
            same(split, read);
        }
    }

    #[test]
    fn a_packet_that_cannot_be_framed_is_counted_not_written() {
        let mut hdr = TransportHdr::new(Bth::new(Opcode::UdSendOnly, 1, 0));
        hdr.deth = Some(Deth { qkey: 1, src_qp: 1 });
        let mixed = Packet::new(
            gid("10.0.0.1"),
            gid("fd00::2"),
            hdr,
            PayloadData::from_slice(&[0; 4]),
        );
        let mut cap = PcapCapture::new(Vec::new()).unwrap();
        cap.write_packet(0, &mixed).unwrap();
        let (bytes, stats) = cap.finish().unwrap();
        assert_eq!(
            stats,
            CaptureStats {
                frames: 0,
                bytes: 0,
                skipped: 1
            }
        );
        assert!(records(&bytes).1.is_empty());
    }

    #[test]
    fn bytes_that_are_not_ip_are_refused() {
        let mut cap = PcapCapture::new(Vec::new()).unwrap();
        for bad in [&[][..], &[0x45, 0, 0][..], &[0x50; 60][..]] {
            assert!(matches!(
                cap.write_frame(0, bad),
                Err(CaptureError::NotIp { len }) if len == bad.len()
            ));
        }
        assert_eq!(cap.stats().frames, 0);
    }

    /// A writer whose disk is full.
    #[derive(Debug)]
    struct Full;

    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn write_errors_are_typed() {
        assert!(matches!(
            PcapCapture::new(Full),
            Err(CaptureError::Write(_))
        ));
        let err = PcapCapture::create(Path::new("/nonexistent-dir/x.pcap")).unwrap_err();
        assert!(matches!(err, CaptureError::Create { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent-dir/x.pcap"));
        let big = Duration::from_secs(u64::from(u32::MAX) + 1);
        let mut cap = PcapCapture::new(Vec::new()).unwrap();
        let pkt = send_only("10.0.0.1", "10.0.0.2", b"x");
        assert!(matches!(
            cap.write_packet(big.as_nanos() as u64, &pkt),
            Err(CaptureError::Record(_))
        ));
    }

    /// A node that sends what the test hands it and keeps what it receives.
    #[derive(Debug, Default)]
    struct Wire {
        got: Vec<Packet>,
    }

    impl Node for Wire {
        fn kick(&mut self, _: u64, _: u32, _: &mut Vec<Packet>) {}
        fn rescan(&mut self, _: u64, _: &mut Vec<Packet>) {}
        fn run_work(&mut self, _: u64, _: &mut Vec<Packet>) -> bool {
            false
        }
        fn receive(&mut self, _: u64, _: u8, pkt: &Packet, _: &mut Vec<Packet>) {
            self.got.push(pkt.clone());
        }
        fn run_timers(&mut self, _: u64, _: &mut Vec<Packet>) -> bool {
            false
        }
        fn next_deadline(&self) -> Option<u64> {
            None
        }
        fn set_max_train(&mut self, _: u32) {}
    }

    fn wire(fabric: &Fabric, ip: &str) -> crate::NodeHandle<Wire> {
        fabric
            .attach("wire", |j| {
                let config = NodeConfig {
                    name: format!("wire{}", j.ordinal),
                    routes: vec![(1, gid(ip))],
                };
                (config, Wire::default())
            })
            .unwrap()
    }

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "portverbs-fabric-{}-{name}.pcap",
            std::process::id()
        ))
    }

    #[test]
    fn the_fabric_captures_what_leaves_a_node_once_before_faults() {
        let path = temp("fabric");
        let fabric = Fabric::new(FabricConfig {
            mode: Mode::Stepped,
            seed: 5,
            faults: crate::LinkFaults {
                loss: 0.5,
                duplicate: 0.5,
                ..crate::LinkFaults::NONE
            },
            capture: Some(path.clone()),
            bottleneck: None,
        });
        assert!(fabric.is_capturing());
        let a = wire(&fabric, "10.9.0.1");
        let b = wire(&fabric, "10.9.0.2");
        let sent: Vec<Packet> = (0..20u8)
            .map(|i| send_only("10.9.0.1", "10.9.0.2", &[i; 9]))
            .collect();
        fabric.run_for(1_000).unwrap();
        a.with(|c| c.out.extend(sent.iter().cloned()));
        fabric.run_until_idle().unwrap();
        assert_eq!(fabric.capture_stats().map(|s| s.frames), Some(20));
        let stats = fabric.stop_capture().unwrap().unwrap();
        assert_eq!(stats.frames, 20);
        assert!(!fabric.is_capturing());
        let f = fabric.stats();
        assert!(f.lost > 0 && f.duplicated > 0, "{f:?}");
        assert_ne!(b.with(|c| c.node.got.len()), 20);

        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let (_, recs) = records(&bytes);
        assert_eq!(recs.len(), 20, "each packet once, lost ones too");
        for ((ts, _, rec), pkt) in recs.iter().zip(&sent) {
            assert_eq!(
                *ts,
                Duration::from_nanos(1_000),
                "the fabric's virtual clock"
            );
            same(&frame_of(rec), pkt);
        }
        assert!(fabric.stop_capture().unwrap().is_none(), "nothing runs");
    }

    #[test]
    fn captures_start_once_and_a_missing_directory_is_reported() {
        let fabric = Fabric::new(FabricConfig {
            mode: Mode::Stepped,
            capture: Some("/nonexistent-dir/c.pcap".into()),
            ..FabricConfig::default()
        });
        assert!(!fabric.is_capturing());
        assert!(matches!(
            fabric.capture_error(),
            Some(CaptureError::Create { .. })
        ));
        let path = temp("twice");
        fabric.start_capture(&path).unwrap();
        assert!(fabric.capture_error().is_none(), "a new start clears it");
        assert!(matches!(
            fabric.start_capture(&path),
            Err(CaptureError::AlreadyRunning)
        ));
        assert_eq!(
            fabric.stop_capture().unwrap(),
            Some(CaptureStats::default())
        );
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(bytes.len(), 24, "the pcap header alone");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_write_error_ends_the_capture_not_the_fabric() {
        let fabric = Fabric::stepped(1);
        let a = wire(&fabric, "10.8.0.1");
        let b = wire(&fabric, "10.8.0.2");
        // The header waits in the buffer; the first flush meets the full disk.
        fabric.start_capture("/dev/full").unwrap();
        a.with(|c| c.out.push(send_only("10.8.0.1", "10.8.0.2", b"one")));
        assert!(!fabric.is_capturing());
        assert!(matches!(
            fabric.capture_error(),
            Some(CaptureError::Write(_))
        ));
        a.with(|c| c.out.push(send_only("10.8.0.1", "10.8.0.2", b"two")));
        fabric.run_until_idle().unwrap();
        assert_eq!(b.with(|c| c.node.got.len()), 2, "the fabric ran on");
        assert!(matches!(fabric.stop_capture(), Err(CaptureError::Write(_))));
        assert!(fabric.capture_error().is_none());
        assert!(fabric.stop_capture().unwrap().is_none());
    }
}
