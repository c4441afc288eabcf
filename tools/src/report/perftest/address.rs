//! perftest's ` local address:` / ` remote address:` lines and the ` GID:` line below them.
//!
//! Layout: ` <side> address: LID <lid> QPN <qpn> PSN <psn>`, then ` OUT <n>` for read tests,
//! ` RKey <rkey> VAddr <vaddr>` for RDMA read/write tests, ` SRQn <n>` for XRC/DC, and a line
//! ` GID: <16 decimal bytes>` (or ` MGID: …` for multicast) when a GID is in use.
//!
//! perftest prints the numbers with C's alternate hex form, where the width includes `0x` and a
//! zero value is printed as zeros without the prefix: LID `%#04x`, QPN and PSN `%#06x`, OUT
//! `%#04x`, RKey and SRQn `%#08x`, VAddr `%#016llx`. So a RoCE port shows `LID 0000` and QPN
//! 0x11 shows as `QPN 0x0011`.

use std::fmt::Write as _;

use portverbs::hal::Gid;

use crate::report::numfmt::c_alt_hex;

/// Which end an address line describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddressSide {
    /// ` local address:`.
    Local,
    /// ` remote address:`.
    Remote,
}

/// The remote buffer advertised by RDMA read/write tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RdmaBuffer {
    /// Remote key.
    pub(crate) rkey: u32,
    /// Virtual address of the buffer.
    pub(crate) vaddr: u64,
}

/// The GID line under an address line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GidLine {
    /// No GID line (IB without `-x`).
    None,
    /// ` GID: …`.
    Gid(Gid),
    /// ` MGID: …` (multicast group).
    #[cfg_attr(
        not(test),
        allow(
            dead_code,
            reason = "no multicast tests in the CLI; the layout is tested"
        )
    )]
    Mgid(Gid),
}

/// One side's connection data as perftest prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PerftestDest {
    /// Port LID (0 on RoCE).
    pub(crate) lid: u16,
    /// Queue pair number.
    pub(crate) qpn: u32,
    /// Initial packet sequence number.
    pub(crate) psn: u32,
    /// Outstanding reads (perftest prints ` OUT` only for RDMA read tests).
    pub(crate) out_reads: Option<u32>,
    /// Remote buffer (perftest prints it for RDMA read and write tests).
    pub(crate) rdma: Option<RdmaBuffer>,
    /// SRQ number for XRC and DC.
    pub(crate) srqn: Option<u32>,
    /// The GID line.
    pub(crate) gid: GidLine,
}

/// Formats one side's address line (and GID line when present); every line ends with `\n`.
///
/// Example: ` local address: LID 0000 QPN 0x0011 PSN 0x3c1e52 RKey 0x1fefe2 VAddr
/// 0x007f3c8a000000` followed by ` GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:01`.
pub(crate) fn format_address(side: AddressSide, dest: &PerftestDest) -> String {
    let side = match side {
        AddressSide::Local => "local",
        AddressSide::Remote => "remote",
    };
    let mut o = format!(
        " {side} address: LID {} QPN {} PSN {}",
        c_alt_hex(u64::from(dest.lid), 4),
        c_alt_hex(u64::from(dest.qpn), 6),
        c_alt_hex(u64::from(dest.psn), 6),
    );
    if let Some(out) = dest.out_reads {
        let _ = write!(o, " OUT {}", c_alt_hex(u64::from(out), 4));
    }
    if let Some(buf) = dest.rdma {
        let _ = write!(
            o,
            " RKey {} VAddr {}",
            c_alt_hex(u64::from(buf.rkey), 8),
            c_alt_hex(buf.vaddr, 16)
        );
    }
    if let Some(srqn) = dest.srqn {
        let _ = write!(o, " SRQn {}", c_alt_hex(u64::from(srqn), 8));
    }
    o.push('\n');
    match dest.gid {
        GidLine::None => {}
        GidLine::Gid(gid) => {
            let _ = writeln!(o, " GID: {}", gid.decimal_bytes());
        }
        GidLine::Mgid(gid) => {
            let _ = writeln!(o, " MGID: {}", gid.decimal_bytes());
        }
    }
    o
}
