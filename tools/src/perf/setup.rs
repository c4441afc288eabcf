//! Resources of a `perf` run: both sides (client and in-process server), each with its PD,
//! CQs, QPs and one registered buffer, connected QP to QP; plus the device-dependent checks.
//! A cross-process run ([`super::remote`]) builds its one side with [`side`], [`resolve`],
//! [`slot_size`] and [`connect_options`], and connects it to the peer's exchanged addresses.
//!
//! Buffer layout of a side: for QP `i`, a send region at `2 i × slot` and a receive region
//! right after it, `slot` bytes each (the largest message, plus the 40-byte GRH area on UD,
//! rounded up to 64 bytes). RDMA writes and atomics target the peer's receive region, reads
//! read the peer's send region, receives land in the receive region.

use portverbs::hal::LinkLayer;
use portverbs::prelude::*;

use super::config::{ALL_MAX_SIZE, PerfConfig, Sizes};
use crate::error::{CliError, Context as _};
use crate::report::{TestKind, Verb};
use crate::verbs::{self, PortInfo};

/// Bytes of the GRH area at the start of every UD receive.
pub(crate) const GRH_BYTES: u64 = 40;

/// One end of the test.
#[derive(Debug)]
pub(crate) struct Side {
    /// The opened device.
    pub(crate) ctx: Context,
    /// Completions of sends, RDMA and atomics.
    pub(crate) send_cq: Cq,
    /// Completions of receives.
    pub(crate) recv_cq: Cq,
    /// The QPs, connected to the peer's QP of the same index.
    pub(crate) qps: Vec<Qp>,
    /// First PSN of each QP.
    pub(crate) psns: Vec<u32>,
    /// The buffer of every QP's regions.
    pub(crate) buf: Buffer,
    /// Its registration.
    pub(crate) mr: Mr,
    /// Bytes of each region.
    pub(crate) slot: usize,
    /// Port addressing.
    pub(crate) port: PortInfo,
    /// UD: the address handle toward the peer.
    pub(crate) ah: Option<AddressHandle>,
    /// The protection domain.
    pub(crate) pd: Pd,
}

impl Side {
    /// Offset of QP `i`'s send region.
    pub(crate) fn send_off(&self, i: usize) -> usize {
        2 * i * self.slot
    }

    /// Offset of QP `i`'s receive region.
    pub(crate) fn recv_off(&self, i: usize) -> usize {
        (2 * i + 1) * self.slot
    }

    /// The remote view of an offset of this side's buffer.
    pub(crate) fn remote(&self, offset: usize) -> RemoteAddr {
        RemoteAddr {
            addr: self.mr.addr() + offset as u64,
            rkey: self.mr.rkey().unwrap_or(0),
        }
    }

    /// An SGE over `len` bytes at `offset`.
    ///
    /// # Errors
    /// The range leaves the registered buffer (the regions are laid out inside it, so only a
    /// size that does not fit in memory gets here).
    pub(crate) fn sge(&self, offset: usize, len: u64) -> Result<Sge, CliError> {
        let len = usize::try_from(len)
            .map_err(|_| CliError::usage("the message size does not fit in memory"))?;
        self.mr
            .sge(offset, len)
            .ctx("building a scatter/gather entry")
    }

    /// The addressing the peer needs to reach QP `i`.
    pub(crate) fn remote_of(&self, i: usize) -> QpEndpoint {
        verbs::endpoint(&self.port, &self.qps[i], self.psns[i])
    }
}

/// Values resolved against the devices.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// Sizes to run, in order.
    pub(crate) sizes: Vec<u64>,
    /// Path MTU.
    pub(crate) mtu: Mtu,
    /// Outstanding reads/atomics.
    pub(crate) outs: u8,
}

/// Both sides, connected.
#[derive(Debug)]
pub(crate) struct Setup {
    /// The flags.
    pub(crate) cfg: PerfConfig,
    /// Device-dependent values.
    pub(crate) res: Resolved,
    /// The measuring side.
    pub(crate) client: Side,
    /// The peer.
    pub(crate) server: Side,
}

impl Setup {
    /// Opens both devices, checks the flags against them, and connects the QPs.
    pub(crate) fn new(cfg: PerfConfig) -> Result<Self, CliError> {
        let (cdev, sdev) = verbs::pick_devices(cfg.device.as_deref())?;
        let cctx = verbs::open(cdev)?;
        let sctx = verbs::open(sdev)?;
        let cport = verbs::port_info(&cctx, cfg.ib_port, cfg.gid_index)?;
        // The server uses port 1 with the same GID index as the client.
        let sport = verbs::port_info(&sctx, 1, cport.gid_index.map(u32::from))?;
        let res = resolve(&cfg, &cctx, &sctx, &cport, &sport)?;
        let slot = slot_size(&cfg, &res, 0)?;
        let copts = connect_options(&cfg, &res, &cport);
        let mut client = side(&cfg, cctx, cport, slot)?;
        let mut server = side(&cfg, sctx, sport, slot)?;
        let sopts = ConnectOptions {
            port: sport.port,
            gid_index: sport.gid_index,
            ..copts
        };
        for (c, s) in client.qps.iter().zip(&server.qps) {
            verbs::init(c, &copts)?;
            verbs::init(s, &sopts)?;
        }
        for i in 0..client.qps.len() {
            let psn = |opts: &ConnectOptions, side: &Side| ConnectOptions {
                psn: side.psns[i],
                ..*opts
            };
            verbs::connect(&client.qps[i], &server.remote_of(i), &psn(&copts, &client))?;
            verbs::connect(&server.qps[i], &client.remote_of(i), &psn(&sopts, &server))?;
        }
        if cfg.conn == QpType::Ud {
            client.ah = Some(ah(&client, &copts, &server.remote_of(0))?);
            server.ah = Some(ah(&server, &sopts, &client.remote_of(0))?);
        }
        Ok(Self {
            cfg,
            res,
            client,
            server,
        })
    }
}

/// perftest's connection values: its access rights, `-u`'s ACK timeout, 7 retries, 7 RNR
/// retries, RNR timer 12, the resolved MTU and outstanding reads, hop limit 1.
pub(crate) fn connect_options(cfg: &PerfConfig, res: &Resolved, port: &PortInfo) -> ConnectOptions {
    ConnectOptions {
        mtu: Some(res.mtu),
        access: match cfg.conn {
            QpType::Rc => {
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC
            }
            QpType::Uc => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            QpType::Ud => AccessFlags::empty(),
        },
        sl: cfg.sl,
        hop_limit: 1,
        timeout: cfg.timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: res.outs,
        max_dest_rd_atomic: res.outs,
        ..verbs::options(port)
    }
}

/// The bytes of each buffer region for the largest of `res`' sizes (plus the GRH area on UD),
/// at least `min` bytes, rounded up to 64 bytes.
pub(crate) fn slot_size(cfg: &PerfConfig, res: &Resolved, min: u64) -> Result<usize, CliError> {
    let max = *res.sizes.iter().max().unwrap_or(&1);
    let grh = if cfg.conn == QpType::Ud { GRH_BYTES } else { 0 };
    usize::try_from((max + grh).max(64).max(min).next_multiple_of(64))
        .map_err(|_| CliError::usage("the message size does not fit in memory"))
}

pub(crate) fn ah(
    side: &Side,
    opts: &ConnectOptions,
    remote: &QpEndpoint,
) -> Result<AddressHandle, CliError> {
    side.pd
        .create_ah_blocking(opts.address_vector(remote, side.port.gid_index))
        .ctx("creating the address handle")
}

/// Checks the flags against both devices and resolves sizes, MTU and outstanding reads (a
/// cross-process run passes its one device as both).
pub(crate) fn resolve(
    cfg: &PerfConfig,
    cctx: &Context,
    sctx: &Context,
    cport: &PortInfo,
    sport: &PortInfo,
) -> Result<Resolved, CliError> {
    let (ca, sa) = (cctx.attr(), sctx.attr());
    let mtu = match cfg.mtu {
        Some(bytes) => Mtu::from_bytes(bytes)
            .ok_or_else(|| CliError::usage(format_args!("invalid MTU {bytes}")))?,
        None => cport.active_mtu.min(sport.active_mtu),
    };
    let port_max = cport.max_mtu.min(sport.max_mtu);
    if mtu > port_max {
        return Err(CliError::usage(format_args!(
            "MTU {mtu} is above the port's maximum {port_max}"
        )));
    }
    let ud_limit = (cfg.conn == QpType::Ud).then(|| u64::from(cport.active_mtu.bytes()));
    let sizes = match (cfg.sizes, ud_limit) {
        (Sizes::All, limit) => {
            let top = limit.unwrap_or(ALL_MAX_SIZE).min(ALL_MAX_SIZE);
            (1..=23).map(|p| 1u64 << p).filter(|&s| s <= top).collect()
        }
        (Sizes::One { size, explicit }, Some(limit)) if size > limit => {
            if explicit {
                return Err(CliError::usage(format_args!(
                    "the largest message on UD is the MTU ({limit} bytes); -s {size} is too large"
                )));
            }
            eprintln!(" Max msg size in UD is MTU {limit}; changing to this MTU");
            vec![limit]
        }
        (Sizes::One { size, .. }, _) => vec![size],
    };
    let max_inline = ca.max_inline_data.min(sa.max_inline_data);
    if cfg.inline > max_inline {
        return Err(CliError::usage(format_args!(
            "inline size {} exceeds the device maximum of {max_inline} bytes",
            cfg.inline
        )));
    }
    let max_outs = ca
        .max_qp_init_rd_atom
        .min(sa.max_qp_rd_atom)
        .min(u32::from(u8::MAX));
    let outs = cfg.outs.unwrap_or(max_outs);
    if outs > max_outs {
        return Err(CliError::usage(format_args!(
            "{outs} outstanding reads/atomics requested, the devices allow {max_outs}"
        )));
    }
    let max_wr = ca.max_qp_wr.min(sa.max_qp_wr);
    for (what, v) in [("TX depth", cfg.tx_depth), ("RX depth", cfg.rx_depth)] {
        if v > max_wr {
            return Err(CliError::usage(format_args!(
                "{what} {v} exceeds the device limit of {max_wr} work requests"
            )));
        }
    }
    let max_cqe = u64::from(ca.max_cqe.min(sa.max_cqe));
    let need = u64::from(cfg.tx_depth.max(cfg.rx_depth)) * u64::from(cfg.qps);
    if need > max_cqe {
        return Err(CliError::usage(format_args!(
            "{} QPs x depth {} need {need} CQ entries, the device allows {max_cqe}",
            cfg.qps,
            cfg.tx_depth.max(cfg.rx_depth)
        )));
    }
    if cport.link_layer == LinkLayer::Ethernet && cport.gid_index.is_none() {
        return Err(CliError::usage("RoCE needs a GID index (-x)"));
    }
    Ok(Resolved {
        sizes,
        mtu,
        outs: u8::try_from(outs).unwrap_or(u8::MAX),
    })
}

/// Creates one side's objects (QPs in RESET).
pub(crate) fn side(
    cfg: &PerfConfig,
    ctx: Context,
    port: PortInfo,
    slot: usize,
) -> Result<Side, CliError> {
    let name = ctx.device().info().name.clone();
    let qps = cfg.qps as usize;
    let receives = cfg.test.verb == Verb::Send;
    let pd = ctx
        .alloc_pd_blocking()
        .ctx(format_args!("allocating a PD on {name}"))?;
    let cq = |entries: u32| {
        ctx.create_cq_blocking(CqInit {
            entries: entries.max(1),
            ..CqInit::default()
        })
        .ctx(format_args!("creating a CQ on {name}"))
    };
    let send_depth = cfg.tx_depth;
    let recv_depth = if receives { cfg.rx_depth } else { 1 };
    let send_cq = cq(send_depth * cfg.qps)?;
    let recv_cq = cq(recv_depth * cfg.qps)?;
    let len = 2 * qps * slot;
    let buf = ctx
        .alloc_buffer(len)
        .ctx(format_args!("allocating {len} bytes on {name}"))?;
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd
        .reg_mr_blocking(&buf, 0..len, access)
        .ctx(format_args!("registering {len} bytes on {name}"))?;
    let caps = QpCaps {
        max_send_wr: send_depth,
        max_recv_wr: recv_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: cfg.inline,
    };
    let mut qp_list = Vec::with_capacity(qps);
    let mut psns = Vec::with_capacity(qps);
    for _ in 0..qps {
        let qp = pd
            .create_qp_blocking(QpInit {
                qp_type: cfg.conn,
                send_cq: &send_cq,
                recv_cq: &recv_cq,
                srq: None,
                caps,
                sq_sig_all: false,
                special: None,
            })
            .ctx(format_args!("creating a {} QP on {name}", cfg.conn))?;
        qp_list.push(qp);
        psns.push(verbs::random_psn());
    }
    if cfg.test.kind == TestKind::Lat || receives {
        buf.fill(0, len, 0).ctx("clearing the buffer")?;
    }
    Ok(Side {
        ctx,
        send_cq,
        recv_cq,
        qps: qp_list,
        psns,
        buf,
        mr,
        slot,
        port,
        ah: None,
        pd,
    })
}
