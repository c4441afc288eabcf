//! One-line human-readable packet summaries for tracing, tests and fuzzing.
//!
//! Example: `RC SEND_ONLY qp=0x000011 psn=0x123456 A SE pad=3 len=5`, followed by the
//! extension headers, e.g. ` reth va=0x0000000000001000 rkey=0x00000abc len=4096` or
//! ` aeth NAK(PSN sequence error) msn=0x000007`.

use core::fmt;

use super::{Bth, DEFAULT_PKEY, ParsedPacket, TransportHdr};

impl fmt::Display for Bth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} qp=0x{:06x} psn=0x{:06x}",
            self.opcode, self.dest_qp, self.psn
        )?;
        for (on, label) in [
            (self.ack_req, " A"),
            (self.solicited, " SE"),
            (self.mig_req, " M"),
            (self.fecn, " FECN"),
            (self.becn, " BECN"),
        ] {
            if on {
                f.write_str(label)?;
            }
        }
        if self.pkey != DEFAULT_PKEY {
            write!(f, " pkey=0x{:04x}", self.pkey)?;
        }
        if self.tver != 0 {
            write!(f, " tver={}", self.tver)?;
        }
        write!(f, " pad={}", self.pad_count)
    }
}

/// Writes the extension headers of `h`, each preceded by a space.
fn write_ext(h: &TransportHdr, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    if let Some(d) = &h.deth {
        write!(f, " deth qkey=0x{:08x} src_qp=0x{:06x}", d.qkey, d.src_qp)?;
    }
    if let Some(r) = &h.reth {
        write!(
            f,
            " reth va=0x{:016x} rkey=0x{:08x} len={}",
            r.va, r.rkey, r.dma_len
        )?;
    }
    if let Some(a) = &h.atomic {
        write!(
            f,
            " atomic va=0x{:016x} rkey=0x{:08x} swap_add=0x{:016x} compare=0x{:016x}",
            a.va, a.rkey, a.swap_add, a.compare
        )?;
    }
    if let Some(a) = &h.aeth {
        write!(f, " aeth {} msn=0x{:06x}", a.syndrome, a.msn)?;
    }
    if let Some(a) = &h.atomic_ack {
        write!(f, " atomic_ack orig=0x{:016x}", a.orig)?;
    }
    if let Some(v) = h.imm {
        write!(f, " imm=0x{v:08x}")?;
    }
    if let Some(v) = h.ieth {
        write!(f, " ieth rkey=0x{v:08x}")?;
    }
    Ok(())
}

impl fmt::Display for TransportHdr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bth)?;
        write_ext(self, f)
    }
}

impl fmt::Display for ParsedPacket<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} len={}", self.hdr.bth, self.payload.len())?;
        write_ext(&self.hdr, f)
    }
}

/// One-line summary of a parsed packet (same text as its `Display`).
pub fn pretty(packet: &ParsedPacket<'_>) -> String {
    packet.to_string()
}
