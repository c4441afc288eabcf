//! The text destination of perftest's TCP exchange (its `KEY_PRINT_FMT` and
//! `KEY_PRINT_FMT_GID`).

use std::fmt::Write as _;

use portverbs_hal::Gid;

use super::{DecodeError, Dest, TEXT_LEN, TEXT_LEN_GID};
use crate::oob::{c_text, hex_field};

/// Fields before the GID (or the SRQ number, without one).
const HEAD: usize = 6;

/// Fields of the GID form: the head, 16 GID bytes, the SRQ number.
const FIELDS_GID: usize = HEAD + 16 + 1;

impl Dest {
    /// The text destination, NUL included: [`TEXT_LEN`] bytes, or [`TEXT_LEN_GID`] with a
    /// GID. The text is `LLLL:OOOO:QQQQQQ:PPPPPP:RRRRRRRR:VVVVVVVVVVVVVVVV:SSSSSSSS` (LID,
    /// outstanding reads, QPN, PSN, R_Key, address and SRQ number in zero-padded lowercase
    /// hex), or with a GID `LLLL:OOOO:QQQQQQ:PPPPPP:RRRRRRRR:VVVVVVVVVVVVVVVV:gg:…:gg:SSSSSSSS:`
    /// (the 16 GID bytes as two hex digits each, the SRQ number, a closing `:`). QPN and PSN
    /// are taken modulo 2^24, so that the message has its exact size.
    pub fn encode_text(&self) -> Vec<u8> {
        let mut text = String::with_capacity(TEXT_LEN_GID);
        let _ = write!(
            text,
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        match self.gid {
            None => {
                let _ = write!(text, "{:08x}", self.srqn);
            }
            Some(gid) => {
                for b in gid.0 {
                    let _ = write!(text, "{b:02x}:");
                }
                let _ = write!(text, "{:08x}:", self.srqn);
            }
        }
        let mut bytes = text.into_bytes();
        bytes.push(0);
        bytes
    }

    /// The length of the text destination of the form with or without GID.
    pub fn text_len(with_gid: bool) -> usize {
        if with_gid { TEXT_LEN_GID } else { TEXT_LEN }
    }

    /// Reads a text destination of the form `with_gid` says (the reader's own). The text ends
    /// at the first NUL; every field is hex and must fit its width.
    ///
    /// # Errors
    /// A message longer than its form, or a missing or malformed field.
    pub fn decode_text(msg: &[u8], with_gid: bool) -> Result<Self, DecodeError> {
        let max = Self::text_len(with_gid);
        if msg.len() > max {
            return Err(DecodeError::TextLength {
                max,
                found: msg.len(),
            });
        }
        let text = c_text(msg);
        let want = if with_gid { FIELDS_GID } else { HEAD + 1 };
        let mut fields = [""; FIELDS_GID];
        let (mut found, mut last) = (0, "");
        for field in text.split(':') {
            if let Some(slot) = fields.get_mut(found) {
                *slot = field;
            }
            found += 1;
            last = field;
        }
        // The GID form ends with a `:`, which leaves an empty last field.
        if with_gid && last.is_empty() {
            found -= 1;
        }
        if found != want {
            return Err(DecodeError::Fields { want, found });
        }
        let num = |i: usize, name: &'static str, max: u64| {
            hex_field(fields[i])
                .filter(|&v| v <= max)
                .ok_or(DecodeError::Field(name))
        };
        let gid = if with_gid {
            let mut g = [0u8; 16];
            for (j, b) in g.iter_mut().enumerate() {
                *b = num(HEAD + j, "GID", 0xff)? as u8;
            }
            Some(Gid(g))
        } else {
            None
        };
        // Each value is at most its type's largest: the casts keep it.
        Ok(Self {
            lid: num(0, "LID", 0xffff)? as u16,
            out_reads: num(1, "OUT_READS", 0xffff)? as u16,
            qpn: num(2, "QPN", 0xff_ffff)? as u32,
            psn: num(3, "PSN", 0xff_ffff)? as u32,
            rkey: num(4, "RKEY", 0xffff_ffff)? as u32,
            vaddr: num(5, "VADDR", u64::MAX)?,
            gid,
            srqn: num(want - 1, "SRQN", 0xffff_ffff)? as u32,
        })
    }
}
