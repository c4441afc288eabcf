//! `rxe-check [--cm | --sidr | --mcast] [--one-way] [--cnp] CAPTURE.pcap...`: the capture check of the
//! Soft-RoCE interop test (tests/rxe-guest/run.sh), also usable on any capture of RoCEv2
//! traffic.
//!
//! For every capture: every record is a whole Ethernet frame carrying a RoCEv2 packet whose
//! ICRC is good (our own parser, `portverbs-wire`); tshark decodes every frame as InfiniBand
//! over RoCEv2 with no malformed packet, and reads the same BTH opcodes in the same order;
//! both hosts sent something. Every datagram to QP 1 is a CM MAD that our parser
//! (`portverbs-cm`) reads, and tshark reads as the same CM attribute. With `--cm`, the
//! capture must hold a connection's MADs: REQ, REP, RTU, DREQ and DREP, and no CM MAD may be
//! a retransmission (the same sender, attribute and transaction ID twice: a REQ, REP or DREQ
//! whose answer came late, and what answers such a duplicate). With `--sidr`, the same for a
//! UD service resolution (IBTA 12.11): a SIDR_REQ and its SIDR_REP, none retransmitted
//! (`udaddy`: rdma_cm's UDP port space has no connection to tear down). With `--mcast`, the
//! capture of a UD multicast run (mckey): every frame is a UD SEND (with or without immediate
//! data) to the multicast QP 0xFFFFFF at an IP multicast group, and there is no MAD at all
//! (rdma_cm joins a group on RoCE without one: the IP group membership is IGMP's business,
//! which the capture does not hold); one host sending is then enough, as multicast datagrams
//! are not answered. One line per capture
//! says what it held; any failure names the capture and the frame, and the exit status is 1.
//! `--one-way` accepts frames from one host only: UC and UD bandwidth tests, whose receiver
//! sends nothing (no acknowledgements on unreliable transports). With `--cnp` (the ECN run,
//! whose sender's packets cross a queue that marks them), the capture must hold frames marked
//! Congestion Experienced (ECN `11` in the IP traffic class, RFC 3168) and at least one CNP
//! (BTH opcode 0x81, the RoCEv2 annex's congestion notification packet), which tshark must
//! read as the same opcode (tshark 4.0 shows no FECN/BECN field: the BECN bit is our parser's
//! reading); every CNP must have BECN set, come from a host that had received a CE-marked
//! frame from its destination before it, and go to a QP that the same host addressed with
//! other packets too (the QP whose packets were marked, not some QP number made up).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, ExitCode};

use pcap_file::DataLink;
use pcap_file::pcap::PcapReader;
use portverbs_cm::wire::{AttrId, Mad};
use portverbs_wire::parse_frame;

/// What one capture held.
#[derive(Debug, Default)]
struct Summary {
    /// BTH opcodes in capture order.
    opcodes: Vec<u8>,
    /// Frames per IP source address.
    by_source: BTreeMap<IpAddr, usize>,
    /// Per frame: the CM attribute ID of a MAD to QP 1 (our parser's reading).
    cm: Vec<Option<u16>>,
    /// Every CM MAD: (sender, attribute ID, transaction ID) and its frame number.
    cm_sent: Vec<(CmKey, usize)>,
    /// Per frame: the destination IP and QP, and the opcode.
    dests: Vec<(IpAddr, u32, u8)>,
    /// Per frame: the source IP, whether it arrived marked CE, and the BTH's BECN bit.
    ecn: Vec<(IpAddr, bool, bool)>,
}

/// BTH opcode of a RoCEv2 congestion notification packet.
const CNP_OPCODE: u8 = 0x81;

/// The ECN field's Congestion Experienced codepoint (RFC 3168), in the low two bits of the IP
/// traffic class.
const ECN_CE: u8 = 0b11;

/// What the CNPs of an ECN run (`--cnp`) say, or what is wrong with them: at least one; each
/// with BECN set, from a host that received a CE-marked frame from the CNP's destination
/// before it (frames are in capture order), to a QP that host addressed with other packets.
fn cnp_check(ecn: &[(IpAddr, bool, bool)], dests: &[(IpAddr, u32, u8)]) -> Result<String, String> {
    let mut first_ce: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for (i, (src, ce, _)) in ecn.iter().enumerate() {
        if *ce {
            first_ce.entry(*src).or_insert(i);
        }
    }
    if first_ce.is_empty() {
        return Err("no frame arrived marked CE (ECN 11): nothing for a CNP to answer".into());
    }
    // (sender, destination, QP) of every packet but a CNP.
    let addressed: std::collections::BTreeSet<(IpAddr, IpAddr, u32)> = ecn
        .iter()
        .zip(dests)
        .filter(|(_, (_, _, op))| *op != CNP_OPCODE)
        .map(|((src, _, _), (dst, qp, _))| (*src, *dst, *qp))
        .collect();
    let mut cnps: BTreeMap<(IpAddr, IpAddr, u32), usize> = BTreeMap::new();
    for (i, ((src, _, becn), (dst, qp, op))) in ecn.iter().zip(dests).enumerate() {
        if *op != CNP_OPCODE {
            continue;
        }
        let frame = i + 1;
        if !becn {
            return Err(format!("frame {frame}: a CNP without BECN"));
        }
        if first_ce.get(dst).is_none_or(|&ce| ce > i) {
            return Err(format!(
                "frame {frame}: a CNP from {src} to {dst} before any CE-marked frame from {dst}"
            ));
        }
        if !addressed.contains(&(*src, *dst, *qp)) {
            return Err(format!(
                "frame {frame}: a CNP from {src} to QP {qp:#x} at {dst}, a QP it sent nothing else to"
            ));
        }
        *cnps.entry((*src, *dst, *qp)).or_default() += 1;
    }
    if cnps.is_empty() {
        let marked: Vec<String> = first_ce
            .keys()
            .map(|ip| {
                let n = ecn.iter().filter(|(s, ce, _)| s == ip && *ce).count();
                format!("{n} from {ip}")
            })
            .collect();
        return Err(format!(
            "CE-marked frames ({}) but no CNP answered them",
            marked.join(", ")
        ));
    }
    let mut line = String::from("CE-marked");
    for ip in first_ce.keys() {
        let n = ecn.iter().filter(|(s, ce, _)| s == ip && *ce).count();
        let _ = write!(line, " from {ip}: {n}");
    }
    line.push_str("; CNPs (BECN)");
    for ((src, dst, qp), n) in &cnps {
        let _ = write!(line, " {src} to QP {qp:#x} at {dst}: {n}");
    }
    Ok(line)
}

/// How a capture is judged beyond every frame's own checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Unicast traffic between the two hosts.
    Plain,
    /// A CM-connected run (or a SIDR exchange): the MADs it needs, none retransmitted.
    Cm,
    /// UD multicast: every frame a SEND to a group's QP 0xFFFFFF, no MAD.
    Mcast,
}

/// The destination QP of a datagram to a multicast group (IBA 10.5.2.4).
const MCAST_QPN: u32 = 0x00FF_FFFF;

/// What is wrong with a multicast run's frames, if anything: each must be a UD SEND ONLY
/// (0x64) or SEND ONLY with immediate (0x65) to QP 0xFFFFFF at an IP multicast address.
fn mcast_violation(dests: &[(IpAddr, u32, u8)]) -> Option<String> {
    dests
        .iter()
        .enumerate()
        .find(|(_, (ip, qp, op))| !ip.is_multicast() || *qp != MCAST_QPN || !matches!(op, 0x64 | 0x65))
        .map(|(i, (ip, qp, op))| {
            format!(
                "frame {}: opcode {op:#04x} to QP {qp:#x} at {ip}: not a UD SEND to a multicast group",
                i + 1
            )
        })
}

/// What makes a CM MAD unique unless it is retransmitted.
type CmKey = (IpAddr, u16, u64);

/// What tshark read of one frame.
#[derive(Debug, PartialEq, Eq)]
struct Tshark {
    opcode: u8,
    /// The MAD's attribute ID when tshark decoded a CM MAD (management class 0x07).
    cm: Option<u16>,
}

fn main() -> ExitCode {
    let mut paths: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| paths.iter().any(|a| a == flag);
    let one_way = has("--one-way");
    let cnp = has("--cnp");
    let mode = if has("--mcast") {
        Mode::Mcast
    } else if has("--cm") || has("--sidr") {
        Mode::Cm
    } else {
        Mode::Plain
    };
    let need: &[&str] = if has("--cm") {
        &["REQ", "REP", "RTU", "DREQ", "DREP"]
    } else if has("--sidr") {
        &["SIDR_REQ", "SIDR_REP"]
    } else {
        &[]
    };
    paths.retain(|a| {
        !matches!(
            a.as_str(),
            "--cm" | "--sidr" | "--mcast" | "--one-way" | "--cnp"
        )
    });
    if paths.is_empty() {
        eprintln!("usage: rxe-check [--cm | --sidr | --mcast] [--one-way] [--cnp] CAPTURE.pcap...");
        return ExitCode::from(2);
    }
    let mut failed = false;
    for path in &paths {
        match check(Path::new(path), mode, need, one_way, cnp) {
            Ok(line) => println!("rxe-check: {path}: {line}"),
            Err(e) => {
                eprintln!("rxe-check: {path}: FAILED: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn cm_name(attr: u16) -> &'static str {
    match AttrId::from_u16(attr) {
        Some(AttrId::Req) => "REQ",
        Some(AttrId::Mra) => "MRA",
        Some(AttrId::Rej) => "REJ",
        Some(AttrId::Rep) => "REP",
        Some(AttrId::Rtu) => "RTU",
        Some(AttrId::Dreq) => "DREQ",
        Some(AttrId::Drep) => "DREP",
        Some(AttrId::SidrReq) => "SIDR_REQ",
        Some(AttrId::SidrRep) => "SIDR_REP",
        Some(AttrId::Lap) => "LAP",
        Some(AttrId::Apr) => "APR",
        None => "?",
    }
}

/// Checks one capture; `need` names the CM MADs it must hold (with [`Mode::Cm`]).
fn check(
    path: &Path,
    mode: Mode,
    need: &[&str],
    one_way: bool,
    cnp: bool,
) -> Result<String, String> {
    let ours = read_capture(path)?;
    if ours.opcodes.is_empty() {
        return Err("the capture holds no frame".into());
    }
    if mode == Mode::Mcast {
        if let Some(e) = mcast_violation(&ours.dests) {
            return Err(e);
        }
    } else if ours.by_source.len() < 2 && !one_way {
        return Err(format!(
            "frames from one host only ({:?}): the peer never answered",
            ours.by_source
        ));
    }
    let theirs = tshark_frames(path)?;
    let mine: Vec<Tshark> = ours
        .opcodes
        .iter()
        .zip(&ours.cm)
        .map(|(&opcode, &cm)| Tshark { opcode, cm })
        .collect();
    if theirs != mine {
        let at = theirs
            .iter()
            .zip(&mine)
            .position(|(a, b)| a != b)
            .unwrap_or(theirs.len().min(mine.len()));
        return Err(format!(
            "tshark read {} frames, we read {}; first difference at frame {}: tshark {:?}, we {:?}",
            theirs.len(),
            mine.len(),
            at + 1,
            theirs.get(at),
            mine.get(at)
        ));
    }
    let mut mads: BTreeMap<&str, usize> = BTreeMap::new();
    for attr in ours.cm.iter().flatten() {
        *mads.entry(cm_name(*attr)).or_default() += 1;
    }
    if mode == Mode::Cm {
        let missing: Vec<&str> = need
            .iter()
            .copied()
            .filter(|m| !mads.contains_key(m))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "no CM {} in the capture (CM MADs: {mads:?})",
                missing.join(", ")
            ));
        }
        if let Some(e) = first_retransmission(&ours.cm_sent) {
            return Err(e);
        }
    }
    let cnps = if cnp {
        Some(cnp_check(&ours.ecn, &ours.dests)?)
    } else {
        None
    };
    let mut counts: BTreeMap<u8, usize> = BTreeMap::new();
    for op in &ours.opcodes {
        *counts.entry(*op).or_default() += 1;
    }
    let mut line = format!(
        "{} frames, every ICRC good, tshark: all InfiniBand over RoCEv2, none malformed; from",
        ours.opcodes.len()
    );
    for (ip, n) in &ours.by_source {
        let _ = write!(line, " {ip}: {n}");
    }
    if mode == Mode::Mcast {
        let groups: std::collections::BTreeSet<IpAddr> =
            ours.dests.iter().map(|(ip, _, _)| *ip).collect();
        let _ = write!(line, "; to QP 0xffffff of {groups:?}");
    }
    line.push_str("; opcodes");
    for (op, n) in &counts {
        let _ = write!(line, " 0x{op:02x}: {n}");
    }
    if !mads.is_empty() {
        line.push_str("; CM MADs (both parsers)");
        for (m, n) in &mads {
            let _ = write!(line, " {m}: {n}");
        }
    }
    if let Some(cnps) = cnps {
        let _ = write!(line, "; {cnps}");
    }
    Ok(line)
}

/// The first CM MAD sent again (same sender, attribute and TID), described.
fn first_retransmission(sent: &[(CmKey, usize)]) -> Option<String> {
    let mut seen: BTreeMap<CmKey, usize> = BTreeMap::new();
    for &(key, frame) in sent {
        if let Some(first) = seen.insert(key, frame) {
            let (src, attr, tid) = key;
            return Some(format!(
                "CM {} from {src} with TID {tid:#018x} sent again: frames {first} and {frame} \
                 (a retransmission)",
                cm_name(attr)
            ));
        }
    }
    None
}

/// Every record: a whole Ethernet frame whose RoCEv2 packet has a good ICRC and a transport
/// header that parses.
fn read_capture(path: &Path) -> Result<Summary, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let mut reader = PcapReader::new(file).map_err(|e| format!("not a pcap file: {e}"))?;
    if reader.header().datalink != DataLink::ETHERNET {
        return Err(format!(
            "link type {:?}, not Ethernet",
            reader.header().datalink
        ));
    }
    let mut summary = Summary::default();
    while let Some(record) = reader.next_packet() {
        let n = summary.opcodes.len() + 1;
        let record = record.map_err(|e| format!("frame {n}: {e}"))?;
        if record.orig_len as usize != record.data.len() {
            return Err(format!(
                "frame {n}: truncated ({} of {} bytes)",
                record.data.len(),
                record.orig_len
            ));
        }
        if record.data.len() < 14 {
            return Err(format!("frame {n}: shorter than an Ethernet header"));
        }
        let (eth, frame) = record.data.split_at(14);
        let ethertype = u16::from_be_bytes([eth[12], eth[13]]);
        if ethertype != 0x0800 && ethertype != 0x86dd {
            return Err(format!("frame {n}: ethertype {ethertype:#06x}, not IP"));
        }
        let view = parse_frame(frame).map_err(|e| format!("frame {n}: {e}"))?;
        view.check_icrc().map_err(|e| format!("frame {n}: {e}"))?;
        let parsed = view.transport().map_err(|e| format!("frame {n}: {e}"))?;
        summary.opcodes.push(parsed.hdr.bth.opcode.to_u8());
        let cm = if parsed.hdr.bth.dest_qp == 1 {
            // QP1 carries MADs; here every one must be the CM's.
            let mad = Mad::parse(parsed.payload)
                .map_err(|e| format!("frame {n}: a datagram to QP 1 that is no CM MAD: {e}"))?;
            let attr = mad.msg.attr().to_u16();
            summary.cm_sent.push(((view.src, attr, mad.tid), n));
            Some(attr)
        } else {
            None
        };
        summary.cm.push(cm);
        summary.dests.push((
            view.dst,
            parsed.hdr.bth.dest_qp,
            parsed.hdr.bth.opcode.to_u8(),
        ));
        summary.ecn.push((
            view.src,
            view.traffic_class & ECN_CE == ECN_CE,
            parsed.hdr.bth.becn,
        ));
        *summary.by_source.entry(view.src).or_default() += 1;
    }
    Ok(summary)
}

/// tshark's reading of the capture: every frame InfiniBand over RoCEv2, none malformed; the
/// BTH opcodes in order, and the attribute of every CM MAD.
fn tshark_frames(path: &Path) -> Result<Vec<Tshark>, String> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args(["-d", "udp.port==4791,infiniband", "-T", "fields"])
        // tshark's heuristic takes some SEND payloads (perftest -R's exchange messages) for
        // RPC over RDMA and calls them malformed: they are not NFS, so it stays out.
        .args(["--disable-protocol", "rpcordma"])
        .args(["-E", "separator=/t", "-e", "frame.number", "-e"])
        .args(["frame.protocols", "-e", "_ws.malformed", "-e"])
        .args([
            "infiniband.bth.opcode",
            "-e",
            "infiniband.mad.mgmtclass",
            "-e",
        ])
        .arg("infiniband.mad.attributeid")
        .output()
        .map_err(|e| format!("cannot run tshark (apt-get install tshark): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "tshark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let hex = |f: &str| u16::from_str_radix(f.trim_start_matches("0x"), 16).ok();
    let mut frames = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let [number, protocols, malformed, opcode, class, attr] = fields[..] else {
            return Err(format!("unexpected tshark line {line:?}"));
        };
        if !(protocols.contains("eth:ethertype:ip") && protocols.contains("udp:infiniband")) {
            return Err(format!(
                "tshark frame {number} is not InfiniBand over RoCEv2: {protocols}"
            ));
        }
        if !malformed.is_empty() {
            return Err(format!("tshark frame {number} is malformed: {line}"));
        }
        let opcode = opcode
            .parse()
            .map_err(|_| format!("tshark frame {number}: opcode {opcode:?}"))?;
        let cm = match hex(class) {
            Some(0x07) => hex(attr),
            _ => None,
        };
        frames.push(Tshark { opcode, cm });
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multicast_run_holds_only_sends_to_a_group() {
        let group: IpAddr = "239.77.0.1".parse().unwrap();
        let host: IpAddr = "10.77.0.1".parse().unwrap();
        assert_eq!(
            mcast_violation(&[(group, MCAST_QPN, 0x64), (group, MCAST_QPN, 0x65)]),
            None
        );
        for bad in [
            (host, MCAST_QPN, 0x64),
            (group, 1, 0x64),
            (group, MCAST_QPN, 0x04),
        ] {
            assert!(
                mcast_violation(&[(group, MCAST_QPN, 0x65), bad])
                    .is_some_and(|e| e.starts_with("frame 2: "))
            );
        }
    }

    #[test]
    fn a_cnp_answers_ce_marks_on_a_qp_of_the_connection() {
        let (h, g): (IpAddr, IpAddr) = ("10.77.0.1".parse().unwrap(), "10.77.0.2".parse().unwrap());
        // The guest's WRITEs to the host's QP 0x11 (the second marked CE), the host's ACK and
        // then its CNP to the guest's QP 0x22.
        let ecn = [
            (g, false, false),
            (g, true, false),
            (h, false, false),
            (h, false, true),
        ];
        let dests = [
            (h, 0x11, 0x0a),
            (h, 0x11, 0x0a),
            (g, 0x22, 0x11),
            (g, 0x22, CNP_OPCODE),
        ];
        let line = cnp_check(&ecn, &dests).expect("a good CNP");
        assert!(line.contains("from 10.77.0.2: 1"), "{line}");
        assert!(
            line.contains("10.77.0.1 to QP 0x22 at 10.77.0.2: 1"),
            "{line}"
        );
        // No CNP at all, or none marked.
        let e = cnp_check(&ecn[..3], &dests[..3]).unwrap_err();
        assert!(e.contains("no CNP"), "{e}");
        let unmarked = [
            (g, false, false),
            (g, false, false),
            (h, false, false),
            (h, false, true),
        ];
        assert!(
            cnp_check(&unmarked, &dests)
                .unwrap_err()
                .contains("no frame arrived marked")
        );
        // Without BECN; to another QP; before the mark.
        let mut no_becn = ecn;
        no_becn[3].2 = false;
        assert!(
            cnp_check(&no_becn, &dests)
                .unwrap_err()
                .contains("without BECN")
        );
        let mut other_qp = dests;
        other_qp[3].1 = 0x23;
        assert!(
            cnp_check(&ecn, &other_qp)
                .unwrap_err()
                .contains("sent nothing else to")
        );
        let early = [
            (g, false, false),
            (h, false, false),
            (h, false, true),
            (g, true, false),
        ];
        let early_dests = [dests[0], dests[2], dests[3], dests[1]];
        assert!(
            cnp_check(&early, &early_dests)
                .unwrap_err()
                .contains("before any CE-marked")
        );
    }

    #[test]
    fn the_same_mad_twice_from_one_sender_is_a_retransmission() {
        let (a, b): (IpAddr, IpAddr) = ("10.77.0.1".parse().unwrap(), "10.77.0.2".parse().unwrap());
        let dreq = AttrId::Dreq.to_u16();
        let drep = AttrId::Drep.to_u16();
        // Crossing DREQs, each answered once: different senders or TIDs, no retransmission.
        let crossing = [
            ((b, dreq, 7), 1),
            ((a, dreq, 9), 2),
            ((b, drep, 9), 3),
            ((a, drep, 7), 4),
        ];
        assert_eq!(first_retransmission(&crossing), None);
        let resent = [((a, dreq, 9), 1), ((b, dreq, 7), 2), ((a, dreq, 9), 5)];
        let e = first_retransmission(&resent).expect("a retransmission");
        assert!(e.contains("CM DREQ from 10.77.0.1"), "{e}");
        assert!(e.contains("frames 1 and 5"), "{e}");
    }
}
