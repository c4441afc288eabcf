//! MLX-transport WQEs of the special QPs (QP0/QP1; Linux `hw/mlx4/qp.c`): the flags of the MLX
//! control segment, and the UD packet header software builds and the WQE carries as inline data
//! — LRH (8 B), an optional GRH (40 B), BTH (12 B) and DETH (8 B), in the IBA wire formats
//! (IBA 7.7, 8.3, 9.2, 9.3.3). The HCA appends only the ICRC/VCRC.
//!
//! Each header has one encoding, `portverbs-wire`'s ([`Lrh`], [`Grh`], [`Bth`], [`Deth`]); this
//! module composes them. [`UdHeader::encode`] is what a driver writes; [`UdHeader::decode`] is what an HCA checks
//! before it sends: every field is validated, and bad bytes are an [`MlxHeaderError`].

use portverbs_wire::{Bth, Deth, Grh, Lrh, Opcode, WireError, lnh, pad_len};
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
pub const LRH_LEN: usize = Lrh::LEN;
/// GRH length.
pub const GRH_LEN: usize = Grh::LEN;
/// BTH length.
pub const BTH_LEN: usize = Bth::LEN;
/// DETH length.
pub const DETH_LEN: usize = Deth::LEN;
/// The longest header: LRH + GRH + BTH + DETH.
pub const MAX_HEADER: usize = LRH_LEN + GRH_LEN + BTH_LEN + DETH_LEN;
/// ICRC length, counted in the LRH packet length and the GRH payload length.
const ICRC_LEN: usize = portverbs_wire::ICRC_LEN;
/// BTH opcode of a UD SEND-only.
pub const UD_SEND_ONLY: u8 = Opcode::UdSendOnly.to_u8();
/// The largest payload a packet-length field of 11 bits (4-byte words) can describe.
pub const MAX_PAYLOAD: usize = (Lrh::MAX_PKT_WORDS as usize * 4) - MAX_HEADER - ICRC_LEN;

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
    usize::from(pad_len(payload))
}

/// Any wire error of a header read out of a buffer of the checked length is a short buffer.
fn short(got: usize, need: usize) -> impl Fn(WireError) -> MlxHeaderError {
    move |_| MlxHeaderError::Short { got, need }
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
    /// Each header is `portverbs-wire`'s encoding: [`Lrh`], [`Grh`], [`Bth`], [`Deth`].
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
        let too_long = |_| MlxHeaderError::TooLong(payload);
        Lrh {
            sl: self.sl,
            lnh: if self.grh.is_some() {
                lnh::IBA_GLOBAL
            } else {
                lnh::IBA_LOCAL
            },
            dlid: self.dlid,
            pkt_len: words as u16,
            slid: self.slid,
            ..Lrh::default()
        }
        .emit(out)
        .map_err(too_long)?;
        let mut at = LRH_LEN;
        if let Some(g) = &self.grh {
            Grh {
                ip_version: Grh::IP_VERSION,
                traffic_class: g.traffic_class,
                flow_label: g.flow_label,
                pay_len: (BTH_LEN + DETH_LEN + payload + pad + ICRC_LEN) as u16,
                next_header: Grh::NEXT_HEADER_IBA,
                hop_limit: g.hop_limit,
                sgid: g.sgid,
                dgid: g.dgid,
            }
            .emit(&mut out[at..])
            .map_err(too_long)?;
            at += GRH_LEN;
        }
        Bth {
            solicited: self.solicited,
            pad_count: pad as u8,
            pkey: self.pkey,
            ..Bth::new(Opcode::UdSendOnly, self.dest_qp, self.psn)
        }
        .emit(&mut out[at..])
        .map_err(too_long)?;
        at += BTH_LEN;
        Deth {
            qkey: self.qkey,
            src_qp: self.src_qp,
        }
        .emit(&mut out[at..])
        .map_err(too_long)?;
        Ok(len)
    }

    /// Reads and checks the header at the front of `b` for a packet whose payload (the WQE's
    /// gather list) is `payload` bytes; returns it and its length.
    pub fn decode(b: &[u8], payload: usize) -> Result<(Self, usize), MlxHeaderError> {
        let lrh = Lrh::parse(b).map_err(short(b.len(), LRH_LEN))?;
        let global = match lrh.lnh {
            lnh::IBA_LOCAL => false,
            lnh::IBA_GLOBAL => true,
            other => return Err(MlxHeaderError::LinkNextHeader(other)),
        };
        let len = LRH_LEN + if global { GRH_LEN } else { 0 } + BTH_LEN + DETH_LEN;
        let short = short(b.len(), len);
        let b = b.get(..len).ok_or(MlxHeaderError::Short {
            got: b.len(),
            need: len,
        })?;
        let mut h = Self {
            sl: lrh.sl,
            dlid: lrh.dlid,
            slid: lrh.slid,
            ..Self::default()
        };
        if payload > MAX_PAYLOAD {
            return Err(MlxHeaderError::TooLong(payload));
        }
        let pad = pad(payload);
        let words = usize::from(lrh.pkt_len);
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
            let g = Grh::parse(&b[at..]).map_err(&short)?;
            if g.ip_version != Grh::IP_VERSION || g.next_header != Grh::NEXT_HEADER_IBA {
                return Err(MlxHeaderError::Grh {
                    version: g.ip_version,
                    next: g.next_header,
                });
            }
            let said = usize::from(g.pay_len);
            let real = real - LRH_LEN - GRH_LEN;
            if said != real {
                return Err(MlxHeaderError::Length {
                    field: "GRH payload length",
                    said,
                    real,
                });
            }
            h.grh = Some(Route {
                traffic_class: g.traffic_class,
                flow_label: g.flow_label,
                hop_limit: g.hop_limit,
                sgid: g.sgid,
                dgid: g.dgid,
            });
            at += GRH_LEN;
        }
        let bth = Bth::parse(&b[at..]).map_err(&short)?;
        let (opcode, version) = (bth.opcode.to_u8(), bth.tver);
        if bth.opcode != Opcode::UdSendOnly || version != 0 {
            return Err(MlxHeaderError::Opcode { opcode, version });
        }
        if usize::from(bth.pad_count) != pad {
            return Err(MlxHeaderError::Length {
                field: "BTH pad count",
                said: usize::from(bth.pad_count),
                real: pad,
            });
        }
        h.solicited = bth.solicited;
        h.pkey = bth.pkey;
        h.dest_qp = bth.dest_qp;
        h.psn = bth.psn;
        at += BTH_LEN;
        let deth = Deth::parse(&b[at..]).map_err(&short)?;
        h.qkey = deth.qkey;
        h.src_qp = deth.src_qp;
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
