//! MLX-transport WQEs of the special QPs (QP0/QP1; Linux `hw/mlx4/qp.c`): the flags of the MLX
//! control segment, and the UD packet header software builds and the WQE carries as inline data
//! — LRH (8 B), an optional GRH (40 B), BTH (12 B) and DETH (8 B), in the IBA wire formats
//! (IBA 7.7, 8.3, 9.2, 9.3.3). The HCA appends only the ICRC/VCRC.
//!
//! [`UdHeader::encode`] is what a driver writes; [`UdHeader::decode`] is what an HCA checks
//! before it sends: every field is validated, and bad bytes are an [`MlxHeaderError`].

use thiserror::Error;

/// Bits of the MLX control segment's flags dword (offset 0x08).
pub mod flags {
    /// Send on VL15 (QP0 only).
    pub const VL15: u32 = 1 << 17;
    /// The HCA inserts the source LID into the LRH.
    pub const SLR: u32 = 1 << 16;
    /// Shift of the 4-bit service level (bits 11:8).
    pub const SL_SHIFT: u32 = 8;
    /// The HCA computes the ICRC.
    pub const ICRC: u32 = 1 << 4;
}

/// LRH length.
pub const LRH_LEN: usize = 8;
/// GRH length.
pub const GRH_LEN: usize = 40;
/// BTH length.
pub const BTH_LEN: usize = 12;
/// DETH length.
pub const DETH_LEN: usize = 8;
/// The longest header: LRH + GRH + BTH + DETH.
pub const MAX_HEADER: usize = LRH_LEN + GRH_LEN + BTH_LEN + DETH_LEN;
/// ICRC length, counted in the LRH packet length and the GRH payload length.
const ICRC_LEN: usize = 4;
/// LRH link next header: IBA local (BTH follows).
const LNH_LOCAL: u8 = 2;
/// LRH link next header: IBA global (GRH follows).
const LNH_GLOBAL: u8 = 3;
/// GRH next header for an IBA transport header.
const NEXT_HDR_IBA: u8 = 0x1b;
/// BTH opcode of a UD SEND-only.
pub const UD_SEND_ONLY: u8 = 0x64;
/// The largest payload a packet-length field of 11 bits (4-byte words) can describe.
pub const MAX_PAYLOAD: usize = (0x7ff * 4) - MAX_HEADER - ICRC_LEN;

/// What is wrong with a special-QP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum MlxHeaderError {
    /// Fewer bytes than the headers need.
    #[error("header of {got} bytes, {need} needed")]
    Short {
        /// Bytes there are.
        got: usize,
        /// Bytes the headers announce.
        need: usize,
    },
    /// The LRH names a next header that is not BTH or GRH.
    #[error("LRH link next header {0} is not IBA local or global")]
    LinkNextHeader(u8),
    /// The GRH is not IPv6-versioned or does not announce a BTH.
    #[error("GRH version {version} / next header {next:#x} (want 6 / 0x1b)")]
    Grh {
        /// IP version nibble.
        version: u8,
        /// Next header byte.
        next: u8,
    },
    /// A BTH opcode other than UD SEND-only, or a transport version other than 0.
    #[error("BTH opcode {opcode:#x}, version {version}: only UD SEND-only is sent on QP0/QP1")]
    Opcode {
        /// BTH opcode.
        opcode: u8,
        /// Transport header version.
        version: u8,
    },
    /// The LRH packet length or GRH payload length disagree with the payload.
    #[error("{field} says {said} bytes, the packet has {real}")]
    Length {
        /// Which length field.
        field: &'static str,
        /// What it says.
        said: usize,
        /// What the WQE carries.
        real: usize,
    },
    /// The payload is too long for one packet.
    #[error("payload of {0} bytes does not fit one packet")]
    TooLong(usize),
}

/// The global route of a packet (GRH fields software chooses).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Route {
    /// Traffic class.
    pub traffic_class: u8,
    /// 20-bit flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source GID.
    pub sgid: [u8; 16],
    /// Destination GID.
    pub dgid: [u8; 16],
}

/// The header of one UD SEND-only packet from a special QP.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdHeader {
    /// Service level (LRH).
    pub sl: u8,
    /// Destination LID.
    pub dlid: u16,
    /// Source LID.
    pub slid: u16,
    /// The GRH, when the packet is routed globally.
    pub grh: Option<Route>,
    /// Solicited event (BTH SE).
    pub solicited: bool,
    /// P_Key (BTH).
    pub pkey: u16,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Packet sequence number (24 bits).
    pub psn: u32,
    /// Q_Key (DETH).
    pub qkey: u32,
    /// Source QP (24 bits; 0 or 1 on a special QP).
    pub src_qp: u32,
}

fn pad(payload: usize) -> usize {
    (4 - payload % 4) % 4
}

impl UdHeader {
    /// Bytes [`UdHeader::encode`] writes.
    pub fn len(&self) -> usize {
        LRH_LEN + self.grh.map_or(0, |_| GRH_LEN) + BTH_LEN + DETH_LEN
    }

    /// Always false: a header is never empty (clippy's `len` companion).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the header of a packet carrying `payload` bytes into `out`; returns its length.
    pub fn encode(
        &self,
        payload: usize,
        out: &mut [u8; MAX_HEADER],
    ) -> Result<usize, MlxHeaderError> {
        if payload > MAX_PAYLOAD {
            return Err(MlxHeaderError::TooLong(payload));
        }
        let len = self.len();
        let pad = pad(payload);
        let words = (len + payload + pad + ICRC_LEN) / 4;
        *out = [0; MAX_HEADER];
        // LRH: VL 0, LVer 0; SL and LNH; DLID; packet length; SLID.
        let lnh = if self.grh.is_some() {
            LNH_GLOBAL
        } else {
            LNH_LOCAL
        };
        out[1] = ((self.sl & 0xf) << 4) | lnh;
        out[2..4].copy_from_slice(&self.dlid.to_be_bytes());
        out[4..6].copy_from_slice(&(words as u16 & 0x7ff).to_be_bytes());
        out[6..8].copy_from_slice(&self.slid.to_be_bytes());
        let mut at = LRH_LEN;
        if let Some(g) = &self.grh {
            let w0 = (6 << 28) | (u32::from(g.traffic_class) << 20) | (g.flow_label & 0xf_ffff);
            out[at..at + 4].copy_from_slice(&w0.to_be_bytes());
            let paylen = (BTH_LEN + DETH_LEN + payload + pad + ICRC_LEN) as u16;
            out[at + 4..at + 6].copy_from_slice(&paylen.to_be_bytes());
            out[at + 6] = NEXT_HDR_IBA;
            out[at + 7] = g.hop_limit;
            out[at + 8..at + 24].copy_from_slice(&g.sgid);
            out[at + 24..at + 40].copy_from_slice(&g.dgid);
            at += GRH_LEN;
        }
        // BTH: opcode; SE, M 0, pad count, TVer 0; P_Key; DestQP; AckReq 0; PSN.
        out[at] = UD_SEND_ONLY;
        out[at + 1] = (u8::from(self.solicited) << 7) | ((pad as u8) << 4);
        out[at + 2..at + 4].copy_from_slice(&self.pkey.to_be_bytes());
        out[at + 4..at + 8].copy_from_slice(&(self.dest_qp & 0xff_ffff).to_be_bytes());
        out[at + 8..at + 12].copy_from_slice(&(self.psn & 0xff_ffff).to_be_bytes());
        at += BTH_LEN;
        // DETH: Q_Key; SrcQP.
        out[at..at + 4].copy_from_slice(&self.qkey.to_be_bytes());
        out[at + 4..at + 8].copy_from_slice(&(self.src_qp & 0xff_ffff).to_be_bytes());
        Ok(len)
    }

    /// Reads and checks the header at the front of `b` for a packet whose payload (the WQE's
    /// gather list) is `payload` bytes; returns it and its length.
    pub fn decode(b: &[u8], payload: usize) -> Result<(Self, usize), MlxHeaderError> {
        let short = |need: usize| MlxHeaderError::Short { got: b.len(), need };
        let lrh = b.get(..LRH_LEN).ok_or(short(LRH_LEN))?;
        let lnh = lrh[1] & 3;
        let global = match lnh {
            LNH_LOCAL => false,
            LNH_GLOBAL => true,
            other => return Err(MlxHeaderError::LinkNextHeader(other)),
        };
        let len = LRH_LEN + if global { GRH_LEN } else { 0 } + BTH_LEN + DETH_LEN;
        let b = b.get(..len).ok_or(short(len))?;
        let be16 = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        let be32 = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let mut h = Self {
            sl: lrh[1] >> 4,
            dlid: be16(2),
            slid: be16(6),
            ..Self::default()
        };
        if payload > MAX_PAYLOAD {
            return Err(MlxHeaderError::TooLong(payload));
        }
        let pad = pad(payload);
        let words = usize::from(be16(4) & 0x7ff);
        let real = len + payload + pad + ICRC_LEN;
        if words * 4 != real {
            return Err(MlxHeaderError::Length {
                field: "LRH packet length",
                said: words * 4,
                real,
            });
        }
        let mut at = LRH_LEN;
        if global {
            let w0 = be32(at);
            let (version, next) = ((w0 >> 28) as u8, b[at + 6]);
            if version != 6 || next != NEXT_HDR_IBA {
                return Err(MlxHeaderError::Grh { version, next });
            }
            let said = usize::from(be16(at + 4));
            let real = real - LRH_LEN - GRH_LEN;
            if said != real {
                return Err(MlxHeaderError::Length {
                    field: "GRH payload length",
                    said,
                    real,
                });
            }
            let mut g = Route {
                traffic_class: (w0 >> 20) as u8,
                flow_label: w0 & 0xf_ffff,
                hop_limit: b[at + 7],
                ..Route::default()
            };
            g.sgid.copy_from_slice(&b[at + 8..at + 24]);
            g.dgid.copy_from_slice(&b[at + 24..at + 40]);
            h.grh = Some(g);
            at += GRH_LEN;
        }
        let (opcode, version) = (b[at], b[at + 1] & 0xf);
        if opcode != UD_SEND_ONLY || version != 0 {
            return Err(MlxHeaderError::Opcode { opcode, version });
        }
        let said_pad = usize::from((b[at + 1] >> 4) & 3);
        if said_pad != pad {
            return Err(MlxHeaderError::Length {
                field: "BTH pad count",
                said: said_pad,
                real: pad,
            });
        }
        h.solicited = b[at + 1] & 0x80 != 0;
        h.pkey = be16(at + 2);
        h.dest_qp = be32(at + 4) & 0xff_ffff;
        h.psn = be32(at + 8) & 0xff_ffff;
        at += BTH_LEN;
        h.qkey = be32(at);
        h.src_qp = be32(at + 4) & 0xff_ffff;
        Ok((h, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(global: bool) -> UdHeader {
        UdHeader {
            sl: 3,
            dlid: 0x12,
            slid: 0x34,
            grh: global.then_some(Route {
                traffic_class: 0x20,
                flow_label: 0x1_2345,
                hop_limit: 64,
                sgid: [0xfe; 16],
                dgid: [0xab; 16],
            }),
            solicited: true,
            pkey: 0xffff,
            dest_qp: 1,
            psn: 0x12_3456,
            qkey: 0x8001_0000,
            src_qp: 1,
        }
    }

    #[test]
    fn round_trips_with_and_without_grh() {
        for global in [false, true] {
            let h = sample(global);
            let mut b = [0u8; MAX_HEADER];
            for payload in [0, 1, 255, 256] {
                let n = h.encode(payload, &mut b).unwrap();
                assert_eq!(n, if global { 68 } else { 28 });
                assert_eq!(UdHeader::decode(&b[..n], payload), Ok((h, n)));
            }
        }
    }

    #[test]
    fn wire_fields_sit_where_iba_puts_them() {
        let mut b = [0u8; MAX_HEADER];
        sample(true).encode(256, &mut b).unwrap();
        assert_eq!(b[1], 0x33, "SL 3, LNH global");
        // (68 + 256 + 4) / 4 words.
        assert_eq!(u16::from_be_bytes([b[4], b[5]]), 82);
        assert_eq!(b[8] >> 4, 6);
        assert_eq!(u16::from_be_bytes([b[12], b[13]]), 12 + 8 + 256 + 4);
        assert_eq!(b[14], 0x1b);
        assert_eq!(b[48], UD_SEND_ONLY);
        assert_eq!(&b[52..56], &[0, 0, 0, 1]);
        assert_eq!(&b[60..64], &0x8001_0000u32.to_be_bytes());
    }

    #[test]
    fn bad_headers_are_typed_errors() {
        let mut b = [0u8; MAX_HEADER];
        let n = sample(true).encode(256, &mut b).unwrap();
        assert!(matches!(
            UdHeader::decode(&b[..20], 256),
            Err(MlxHeaderError::Short { need: 68, .. })
        ));
        assert!(matches!(
            UdHeader::decode(&b[..n], 200),
            Err(MlxHeaderError::Length { .. })
        ));
        let mut bad = b;
        bad[1] = 0x30;
        assert_eq!(
            UdHeader::decode(&bad, 256),
            Err(MlxHeaderError::LinkNextHeader(0))
        );
        let mut bad = b;
        bad[14] = 0x11;
        assert!(matches!(
            UdHeader::decode(&bad, 256),
            Err(MlxHeaderError::Grh { next: 0x11, .. })
        ));
        let mut bad = b;
        bad[48] = 0x04;
        assert!(matches!(
            UdHeader::decode(&bad, 256),
            Err(MlxHeaderError::Opcode { opcode: 4, .. })
        ));
        assert_eq!(
            sample(false).encode(MAX_PAYLOAD + 1, &mut b),
            Err(MlxHeaderError::TooLong(MAX_PAYLOAD + 1))
        );
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..80 {
            for fill in [0u8, 0xff, 0x33, 0x02] {
                let _ = UdHeader::decode(&vec![fill; len], len);
            }
        }
    }
}
