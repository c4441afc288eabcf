//! Checks of pcap captures shared by the capture tests: every record an Ethernet frame with a
//! RoCEv2 packet whose ICRC is good, and (where tshark is installed) every frame decoded by
//! tshark as InfiniBand over RoCEv2 with no malformed packet.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use pcap_file::DataLink;
use pcap_file::pcap::PcapReader;
use portverbs_wire::{Opcode, parse_frame};

/// The ICRC checker: every record is Ethernet + a RoCEv2 frame with a good ICRC. Returns the
/// opcodes in order.
pub(crate) fn check_icrcs(path: &Path) -> Vec<Opcode> {
    let file = std::fs::File::open(path).expect("the capture exists");
    let mut reader = PcapReader::new(file).expect("a pcap header");
    assert_eq!(reader.header().datalink, DataLink::ETHERNET);
    let mut ops = Vec::new();
    let mut last = std::time::Duration::ZERO;
    while let Some(record) = reader.next_packet() {
        let record = record.expect("a whole record");
        let n = ops.len() + 1;
        assert_eq!(
            record.orig_len as usize,
            record.data.len(),
            "frame {n} whole"
        );
        assert!(record.timestamp >= last, "frame {n}: time runs forward");
        last = record.timestamp;
        let (eth, frame) = record.data.split_at(14);
        let ethertype = u16::from_be_bytes([eth[12], eth[13]]);
        match frame[0] >> 4 {
            4 => assert_eq!(ethertype, 0x0800, "frame {n}"),
            6 => assert_eq!(ethertype, 0x86dd, "frame {n}"),
            v => panic!("frame {n}: IP version {v}"),
        }
        let view = parse_frame(frame).unwrap_or_else(|e| panic!("frame {n}: {e}"));
        view.check_icrc()
            .unwrap_or_else(|e| panic!("frame {n}: {e}"));
        let parsed = view
            .transport()
            .unwrap_or_else(|e| panic!("frame {n}: {e}"));
        ops.push(parsed.hdr.bth.opcode);
    }
    ops
}

/// Runs tshark over the capture; every frame must be InfiniBand over RoCEv2 and not malformed.
/// Returns the opcodes in order.
pub(crate) fn tshark_opcodes(path: &Path) -> Vec<Opcode> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(path)
        // Port 4791 decodes as InfiniBand over RoCEv2 by default; `-d` says so anyway.
        .args([
            "-d",
            "udp.port==4791,infiniband",
            "-T",
            "fields",
            "-E",
            "separator=/t",
            "-e",
            "frame.number",
            "-e",
            "frame.protocols",
            "-e",
            "_ws.malformed",
            "-e",
            "infiniband.bth.opcode",
        ])
        .output()
        .expect("tshark runs (apt-get install tshark)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut ops = Vec::new();
    for line in stdout.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let [number, protocols, malformed, opcode] = fields[..] else {
            panic!("unexpected tshark line {line:?}");
        };
        assert!(
            protocols.contains("eth:ethertype:ip") && protocols.contains("udp:infiniband"),
            "frame {number} is not InfiniBand over RoCEv2: {protocols}"
        );
        assert!(malformed.is_empty(), "frame {number} is malformed: {line}");
        let op: u8 = opcode
            .parse()
            .unwrap_or_else(|_| panic!("frame {number}: opcode {opcode:?}"));
        ops.push(Opcode::from_u8(op));
    }
    ops
}
