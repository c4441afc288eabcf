//! What the firmware reports, validated: QUERY_FW, QUERY_DEV_CAP and QUERY_PORT outboxes turned
//! into plain numbers the driver can rely on. Everything read from the device is checked: a
//! log size too large, an entry size that cannot hold the context, a reserved count above the
//! maximum, a missing capability the driver needs — each is a typed error naming the field.

use thiserror::Error;
use zerocopy::FromBytes;

use crate::layout::mailbox::{DevCap, ETH_SPEED_40G, ETH_SPEED_56G, QueryFw, QueryPort, dev_flag};

/// A capability the device reported that the driver cannot use.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("firmware reported an unusable {field}: {why}")]
pub struct CapsError {
    /// The outbox field.
    pub field: &'static str,
    /// What is wrong with it.
    pub why: String,
}

fn bad(field: &'static str, why: impl Into<String>) -> CapsError {
    CapsError {
        field,
        why: why.into(),
    }
}

fn log_in(field: &'static str, v: u8, max: u8) -> Result<u8, CapsError> {
    if v > max {
        return Err(bad(field, format!("log2 value {v} exceeds {max}")));
    }
    Ok(v)
}

/// Validated QUERY_FW output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FwInfo {
    /// Firmware area in 4 KiB pages.
    pub fw_pages: u32,
    /// Version (major, minor, sub-minor).
    pub version: (u16, u16, u16),
    /// Command interface revision.
    pub cmd_if_rev: u16,
    /// Outstanding commands allowed in event mode.
    pub max_cmds: u32,
    /// BAR0 offset of the catastrophic-error buffer (its first dword is non-zero after an
    /// internal error), when the firmware reports one in BAR0.
    pub catas_offset: Option<usize>,
}

/// Parses a QUERY_FW outbox.
///
/// # Errors
/// Too short, no firmware area, an interface revision this driver does not speak (it needs ≥ 3:
/// QUERY_PORT and INIT_PORT without a mailbox).
pub fn parse_fw(out: &[u8]) -> Result<FwInfo, CapsError> {
    let (f, _) = QueryFw::read_from_prefix(out).map_err(|_| bad("QUERY_FW outbox", "too short"))?;
    let fw_pages = u32::from(f.fw_pages.get());
    if fw_pages == 0 || fw_pages > 1 << 14 {
        return Err(bad("fw_pages", format!("{fw_pages} pages")));
    }
    let rev = f.cmd_if_rev.get();
    if rev < 3 {
        return Err(bad(
            "cmd_if_rev",
            format!("revision {rev}; this driver needs 3 or later"),
        ));
    }
    Ok(FwInfo {
        fw_pages,
        version: (f.fw_major.get(), f.fw_minor.get(), f.fw_subminor.get()),
        cmd_if_rev: rev,
        max_cmds: 1 << log_in("log_max_cmds", f.log_max_cmds, 8)?,
        catas_offset: (f.catas_size.get() > 0 && (f.catas_bar >> 6) * 2 == 0)
            .then(|| usize::try_from(f.catas_offset.get()).ok())
            .flatten()
            .filter(|o| o % 4 == 0 && *o < crate::layout::hcr::BAR0_MIN_LEN),
    })
}

/// Validated QUERY_DEV_CAP output (the subset this driver uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevCaps {
    /// log2 max QPs / reserved QPs.
    pub log_max_qp: u8,
    /// Firmware-owned QPs at the bottom of the QPN space.
    pub reserved_qps: u32,
    /// log2 max WQEs per QP.
    pub log_max_qp_sz: u8,
    /// log2 max SRQs.
    pub log_max_srq: u8,
    /// Reserved SRQs.
    pub reserved_srqs: u32,
    /// log2 max WQEs per SRQ.
    pub log_max_srq_sz: u8,
    /// log2 max CQs.
    pub log_max_cq: u8,
    /// Reserved CQs.
    pub reserved_cqs: u32,
    /// log2 max CQEs per CQ.
    pub log_max_cq_sz: u8,
    /// log2 max EQs.
    pub log_max_eq: u8,
    /// Reserved EQs.
    pub reserved_eqs: u32,
    /// log2 max MPTs.
    pub log_max_mpt: u8,
    /// Reserved MPTs.
    pub reserved_mpts: u32,
    /// log2 max MTT segments.
    pub log_max_mtt: u8,
    /// Reserved MTT segments.
    pub reserved_mtts: u32,
    /// log2 max MR size.
    pub log_max_mrw_sz: u8,
    /// log2 max outstanding RDMA-read/atomic per QP as requester / responder.
    pub log_max_ra_req_qp: u8,
    /// As responder.
    pub log_max_ra_res_qp: u8,
    /// Local CA ACK delay.
    pub ack_delay: u8,
    /// Number of ports.
    pub num_ports: u8,
    /// log2 max message size.
    pub log_max_msg: u8,
    /// Capability flags.
    pub flags: u64,
    /// BMME flags.
    pub bmme_flags: u32,
    /// Reserved UARs (count).
    pub reserved_uars: u32,
    /// UAR pages in BAR2.
    pub num_uars: u32,
    /// BlueFlame: register size in bytes (0 = none).
    pub bf_reg_size: u32,
    /// BlueFlame registers per page.
    pub bf_regs_per_page: u32,
    /// S/G entries per SQ / RQ WQE.
    pub max_sg_sq: u32,
    /// RQ.
    pub max_sg_rq: u32,
    /// Max SQ / RQ descriptor bytes.
    pub max_desc_sz_sq: u32,
    /// RQ.
    pub max_desc_sz_rq: u32,
    /// log2 max PDs / reserved PDs.
    pub log_max_pd: u8,
    /// Reserved PDs.
    pub reserved_pds: u32,
    /// Context entry sizes.
    pub qpc_entry_sz: u32,
    /// AUXC.
    pub aux_entry_sz: u32,
    /// ALTC.
    pub altc_entry_sz: u32,
    /// RDMARC.
    pub rdmarc_entry_sz: u32,
    /// EQC.
    pub eqc_entry_sz: u32,
    /// CQC.
    pub cqc_entry_sz: u32,
    /// SRQC.
    pub srq_entry_sz: u32,
    /// cMPT.
    pub cmpt_entry_sz: u32,
    /// MTT entry.
    pub mtt_entry_sz: u32,
    /// dMPT.
    pub dmpt_entry_sz: u32,
    /// Max total ICM bytes.
    pub max_icm_sz: u64,
    /// log2 multicast group (MCG) table entries the firmware takes (0: no multicast).
    pub log_max_mcg: u8,
    /// log2 QPs one MCG entry may list.
    pub log_max_qp_mcg: u8,
}

/// Parses a QUERY_DEV_CAP outbox.
///
/// # Errors
/// A field out of range, or a capability the driver needs is absent (RC, UD, 1–2 ports, context
/// entries at least as large as the contexts it writes).
pub fn parse_dev_cap(out: &[u8]) -> Result<DevCaps, CapsError> {
    let (d, _) =
        DevCap::read_from_prefix(out).map_err(|_| bad("QUERY_DEV_CAP outbox", "too short"))?;
    let reserved = |field, log: u8, max_log: u8| -> Result<u32, CapsError> {
        let l = log_in(field, log, 31)?;
        if l >= max_log {
            return Err(bad(field, format!("2^{l} reserved of 2^{max_log}")));
        }
        Ok(1 << l)
    };
    let log_max_qp = log_in("log_max_qp", d.log_max_qp & 0x1f, 24)?;
    let log_max_srq = log_in("log_max_srq", d.log_max_srq & 0x1f, 24)?;
    let log_max_cq = log_in("log_max_cq", d.log_max_cq & 0x1f, 24)?;
    let log_max_eq = log_in("log_max_eq", d.log_max_eq & 0xf, 10)?;
    let log_max_mpt = log_in("log_max_mpt", d.log_max_mpt & 0x3f, 24)?;
    let log_max_mtt = log_in("log_max_mtt", d.log_max_mtt & 0x3f, 30)?;
    let entry = |field, v: u16, min: u32| -> Result<u32, CapsError> {
        let v = u32::from(v);
        if v < min || !v.is_power_of_two() || v > 4096 {
            return Err(bad(
                field,
                format!("{v} bytes (needs a power of two ≥ {min})"),
            ));
        }
        Ok(v)
    };
    let num_ports = d.vl_ports & 0xf;
    if !(1..=2).contains(&num_ports) {
        return Err(bad("number of ports", format!("{num_ports}")));
    }
    let flags = (u64::from(d.flags_hi.get()) << 32) | u64::from(d.flags_lo.get());
    for (bit, name) in [(dev_flag::RC, "RC"), (dev_flag::UD, "UD")] {
        if flags & bit == 0 {
            return Err(bad("device flags", format!("no {name} support")));
        }
    }
    let uar_log = u32::from(d.uar_size & 0x3f);
    if uar_log > 10 {
        return Err(bad("uar_size", format!("2^{} bytes", uar_log + 20)));
    }
    let num_uars = (1u32 << (uar_log + 20)) / 4096;
    let reserved_uars = u32::from(d.rsvd_uar >> 4).max(1).min(num_uars - 1);
    let (bf_reg_size, bf_regs_per_page) = if d.bf & 0x80 != 0 {
        let sz = log_in("log_bf_reg_sz", d.log_bf_reg_sz & 0x1f, 12)?;
        let per = log_in("log_max_bf_per_page", d.log_max_bf_per_page & 0x3f, 6)?;
        if (1u32 << sz) * (1 << per) > 4096 || sz < 6 {
            return Err(bad(
                "BlueFlame geometry",
                format!("2^{per} registers of 2^{sz} bytes"),
            ));
        }
        (1 << sz, 1 << per)
    } else {
        (0, 0)
    };
    let max_desc_sz_sq = u32::from(d.max_desc_sz_sq.get());
    if max_desc_sz_sq < 64 {
        return Err(bad("max_desc_sz_sq", format!("{max_desc_sz_sq} bytes")));
    }
    let max_desc_sz_rq = u32::from(d.max_desc_sz_rq.get());
    if max_desc_sz_rq < 16 {
        return Err(bad("max_desc_sz_rq", format!("{max_desc_sz_rq} bytes")));
    }
    Ok(DevCaps {
        log_max_qp,
        reserved_qps: reserved("log_rsvd_qp", d.log_rsvd_qp & 0xf, log_max_qp)?,
        log_max_qp_sz: log_in("log_max_qp_sz", d.log_max_qp_sz, 16)?,
        log_max_srq,
        reserved_srqs: reserved("log_rsvd_srq", d.log_rsvd_srq >> 4, log_max_srq)?,
        log_max_srq_sz: log_in("log_max_srq_sz", d.log_max_srq_sz, 16)?,
        log_max_cq,
        reserved_cqs: reserved("log_rsvd_cq", d.log_rsvd_cq & 0xf, log_max_cq)?,
        log_max_cq_sz: log_in("log_max_cq_sz", d.log_max_cq_sz, 24)?,
        log_max_eq,
        reserved_eqs: u32::from(d.rsvd_eq & 0xf).min((1 << log_max_eq) - 1),
        log_max_mpt,
        reserved_mpts: reserved("log_rsvd_mrw", d.log_rsvd_mrw & 0xf, log_max_mpt)?,
        log_max_mtt,
        reserved_mtts: reserved("log_rsvd_mtt", d.log_rsvd_mtt >> 4, log_max_mtt)?,
        log_max_mrw_sz: log_in("log_max_mrw_sz", d.log_max_mrw_sz, 64)?,
        log_max_ra_req_qp: log_in("log_max_ra_req_qp", d.log_max_ra_req_qp & 0x3f, 8)?,
        log_max_ra_res_qp: log_in("log_max_ra_res_qp", d.log_max_ra_res_qp & 0x3f, 8)?,
        ack_delay: d.ack_delay & 0x1f,
        num_ports,
        log_max_msg: log_in("log_max_msg", d.log_max_msg & 0x1f, 31)?,
        flags,
        bmme_flags: d.bmme_flags.get(),
        reserved_uars,
        num_uars,
        bf_reg_size,
        bf_regs_per_page,
        max_sg_sq: u32::from(d.max_sg_sq).max(1),
        max_sg_rq: u32::from(d.max_sg_rq).max(1),
        max_desc_sz_sq,
        max_desc_sz_rq,
        log_max_pd: log_in("log_max_pd", d.log_max_pd & 0x3f, 24)?,
        reserved_pds: u32::from(d.rsvd_pd >> 4),
        qpc_entry_sz: entry("qpc_entry_sz", d.qpc_entry_sz.get(), 256)?,
        aux_entry_sz: entry("aux_entry_sz", d.aux_entry_sz.get(), 1)?,
        altc_entry_sz: entry("altc_entry_sz", d.altc_entry_sz.get(), 1)?,
        rdmarc_entry_sz: entry("rdmarc_entry_sz", d.rdmarc_entry_sz.get(), 1)?,
        eqc_entry_sz: entry("eqc_entry_sz", d.eqc_entry_sz.get(), 64)?,
        cqc_entry_sz: entry("cqc_entry_sz", d.cqc_entry_sz.get(), 64)?,
        srq_entry_sz: entry("srq_entry_sz", d.srq_entry_sz.get(), 48)?,
        cmpt_entry_sz: entry("cmpt_entry_sz", d.cmpt_entry_sz.get(), 1)?,
        mtt_entry_sz: entry("mtt_entry_sz", d.mtt_entry_sz.get(), 8)?,
        dmpt_entry_sz: entry("dmpt_entry_sz", d.dmpt_entry_sz.get(), 64)?,
        max_icm_sz: d.max_icm_sz.get(),
        log_max_mcg: log_in("log_max_mcg", d.log_max_mcg & 0x3f, 24)?,
        log_max_qp_mcg: log_in("log_max_qp_mcg", d.log_max_qp_mcg & 0x3f, 16)?,
    })
}

/// Validated QUERY_PORT output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortCaps {
    /// Link up.
    pub link_up: bool,
    /// Ethernet (RoCE) supported.
    pub eth: bool,
    /// IB supported.
    pub ib: bool,
    /// Max MTU, IB encoding 1..=5.
    pub max_mtu: u8,
    /// GID table entries.
    pub gid_table_len: u32,
    /// P_Key table entries.
    pub pkey_table_len: u32,
    /// Active width and speed in IB encodings (`ibv_port_attr`), derived from the Ethernet
    /// link speed as mlx4_ib does: 40 GbE = 4X QDR, 56 GbE = 4X FDR, otherwise 1X QDR (10 GbE).
    pub active_width: u8,
    /// See `active_width`.
    pub active_speed: u16,
}

/// IB width encoding 1X.
const WIDTH_1X: u8 = 1;
/// IB width encoding 4X.
const WIDTH_4X: u8 = 2;
/// IB speed encoding QDR (10 Gb/s per lane).
const SPEED_QDR: u16 = 4;
/// IB speed encoding FDR (14 Gb/s per lane).
const SPEED_FDR: u16 = 16;

/// Parses a QUERY_PORT outbox.
///
/// # Errors
/// Too short, or an MTU outside the IB encodings.
pub fn parse_port(out: &[u8]) -> Result<PortCaps, CapsError> {
    let (p, _) =
        QueryPort::read_from_prefix(out).map_err(|_| bad("QUERY_PORT outbox", "too short"))?;
    let max_mtu = p.ib_mtu & 0xf;
    if !(1..=5).contains(&max_mtu) {
        return Err(bad("max IB MTU", format!("encoding {max_mtu}")));
    }
    let (active_width, active_speed) = match p.eth_speed {
        ETH_SPEED_40G => (WIDTH_4X, SPEED_QDR),
        ETH_SPEED_56G => (WIDTH_4X, SPEED_FDR),
        _ => (WIDTH_1X, SPEED_QDR),
    };
    Ok(PortCaps {
        active_width,
        active_speed,
        link_up: p.link & 0x80 != 0,
        eth: p.link & 2 != 0,
        ib: p.link & 1 != 0,
        max_mtu,
        gid_table_len: 1 << (p.log_gid_pkey >> 4),
        pkey_table_len: 1 << (p.log_gid_pkey & 0xf),
    })
}

#[cfg(test)]
mod tests {
    use zerocopy::IntoBytes;

    use super::*;

    #[test]
    fn port_speed_follows_the_ethernet_link_as_mlx4_ib_reads_it() {
        let port = |eth_speed| {
            let p = QueryPort {
                ib_mtu: 5,
                eth_speed,
                ..QueryPort::default()
            };
            let c = parse_port(p.as_bytes()).unwrap();
            (c.active_width, c.active_speed)
        };
        assert_eq!(port(ETH_SPEED_40G), (WIDTH_4X, SPEED_QDR), "40 GbE");
        assert_eq!(port(ETH_SPEED_56G), (WIDTH_4X, SPEED_FDR), "56 GbE");
        assert_eq!(port(0), (WIDTH_1X, SPEED_QDR), "10 GbE");
    }
}
