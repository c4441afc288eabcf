//! `portverbs devices`: `ibv_devinfo` for the devices Portverbs sees.
//!
//! Every value comes from a live query of the opened device (device attributes, each port, the
//! GID table); this module only maps the HAL's types to the report structs.

use std::fmt::Write as _;

use clap::Args;
use portverbs::hal::LinkLayer;
use portverbs::hal::caps::{DeviceAttr, GidType as HalGidType, PortAttr};

use crate::error::{CliError, Context as _};
use crate::report::{
    DevinfoDevice, DevinfoExtCaps, DevinfoGid, DevinfoLimits, DevinfoPort, DevinfoPortExtra,
    GidType, format_device, format_list,
};

/// `portverbs devices`: the options of `ibv_devinfo`.
#[derive(Debug, Args)]
#[command(
    about = "Show the RDMA devices and their ports, like ibv_devinfo",
    long_about = "Show the RDMA devices and their ports with ibv_devinfo's keys and layout \
                  (scripts that grep ibv_devinfo output work unchanged). Every value is queried \
                  live from the device.\n\nThe devices are those of Portverbs' embedded \
                  in-process fabric: soft0 (10.0.0.1) and soft1 (10.0.0.2), software \
                  devices, and mlx4_0 (10.0.0.3) and mlx4_1 (10.0.0.4), emulated ConnectX-3s \
                  driven by the mlx4 driver; then udp0, udp1 … for the addresses of \
                  PORTVERBS_UDP (one address serves one process); on Linux also mlx4 functions \
                  bound to vfio-pci. \
                  A device that could not be made is named on stderr with the reason, and a \
                  PORTVERBS_UDP address that would not bind makes the exit status 1."
)]
pub(crate) struct DevicesArgs {
    /// Show only this device (default: all).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Show only this port of the device(s).
    #[arg(short = 'i', long = "ib-port", value_name = "PORT")]
    port: Option<u8>,
    /// Only list the device names.
    #[arg(short = 'l', long = "list")]
    list: bool,
    /// Verbose: every device limit, the capability flags, port details and the GID table.
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

/// Runs `portverbs devices`: prints the report, and the devices that could not be made (with
/// the reason) on stderr. Fails when a device named with `-d`, or one `PORTVERBS_UDP` asks
/// for, could not be made.
pub(crate) fn run(args: &DevicesArgs) -> Result<(), CliError> {
    let text = report(args)?;
    crate::print(&text)?;
    if args.device.is_some() {
        return Ok(());
    }
    let skipped = portverbs::skipped_devices();
    for s in &skipped {
        eprintln!("portverbs: skipped {}: {}{}", s.name, s.reason, s.hint());
    }
    let unbound: Vec<String> = skipped
        .iter()
        .filter(|s| matches!(s.reason, portverbs::SkipReason::Udp(_)))
        .map(|s| {
            s.addr
                .map_or(s.name.clone(), |a| format!("{} ({a})", s.name))
        })
        .collect();
    if unbound.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "PORTVERBS_UDP: {} could not be made (see above)",
            unbound.join(", ")
        )))
    }
}

/// The report text: the device list (`-l`) or `ibv_devinfo`'s report of each device.
fn report(args: &DevicesArgs) -> Result<String, CliError> {
    let selected = match &args.device {
        // Only that device is made; why it could not be, if it could not.
        Some(name) => vec![portverbs::device(name)?],
        None => portverbs::devices(),
    };
    if args.list {
        let names: Vec<String> = selected.iter().map(|d| d.info().name.clone()).collect();
        return Ok(format_list(&names));
    }
    if selected.is_empty() {
        return Err(CliError::Failed("No IB devices found".into()));
    }
    let mut out = String::new();
    for dev in selected {
        let name = dev.info().name.clone();
        let ctx = portverbs::open(dev).ctx(format_args!("opening {name}"))?;
        let model = describe(&ctx, args.port, args.verbose)?;
        let _ = write!(out, "{}", format_device(&model, args.verbose));
    }
    Ok(out)
}

/// Queries one opened device into the report model.
fn describe(
    ctx: &portverbs::Context,
    only_port: Option<u8>,
    verbose: bool,
) -> Result<DevinfoDevice, CliError> {
    let name = ctx.name().to_owned();
    let attr = ctx
        .query_device_blocking()
        .ctx(format_args!("querying {name}"))?;
    let ports: Vec<u8> = match only_port {
        Some(p) if p == 0 || p > attr.phys_port_cnt => {
            return Err(CliError::usage(format_args!(
                "port {p} of {name} does not exist (the device has {} port(s))",
                attr.phys_port_cnt
            )));
        }
        Some(p) => vec![p],
        None => (1..=attr.phys_port_cnt).collect(),
    };
    let driver = ctx.device().info().driver;
    let mut model = DevinfoDevice {
        hca_id: name.clone(),
        transport: ctx.device().info().transport as i32,
        fw_ver: attr.fw_ver.clone(),
        node_guid: attr.node_guid,
        sys_image_guid: attr.sys_image_guid,
        vendor_id: attr.vendor_id,
        vendor_part_id: attr.vendor_part_id,
        hw_ver: attr.hw_ver,
        board_id: (!attr.board_id.is_empty()).then(|| attr.board_id.clone()),
        phys_port_cnt: attr.phys_port_cnt,
        progress: Some(ctx.progress().name()),
        limits: limits(&attr),
        ports: Vec::new(),
    };
    for port_num in ports {
        let pa = ctx
            .query_port_blocking(port_num)
            .ctx(format_args!("querying port {port_num} of {name}"))?;
        let gids = if verbose {
            ctx.gid_table_blocking(port_num)
                .ctx(format_args!(
                    "reading the GID table of {name} port {port_num}"
                ))?
                .into_iter()
                .map(|(index, e)| DevinfoGid {
                    index,
                    gid: e.gid,
                    gid_type: match e.gid_type {
                        HalGidType::Ib => GidType::IbRoceV1,
                        HalGidType::RoceV2 => GidType::RoceV2,
                    },
                })
                .collect()
        } else {
            Vec::new()
        };
        model.ports.push(port(port_num, &pa, gids, driver));
    }
    Ok(model)
}

/// The `-v` device limits, the multicast ones (`max_mcast_grp`, `max_mcast_qp_attach`,
/// `max_total_mcast_qp_attach`) as the device reports them. Fields the HAL does not model (EE
/// contexts, RDDs, raw QPs, FMRs, the timestamp mask, and the `ibv_query_device_ex` capabilities: ODP, TSO,
/// RSS, packet pacing, tag matching, CQ moderation, device memory) are a device without the
/// feature: they print as `ibv_devinfo` prints such a device (`0`, `NO SUPPORT`, `not
/// supported`). `device_cap_flags_ex` is every capability bit the HAL reports.
fn limits(a: &DeviceAttr) -> DevinfoLimits {
    DevinfoLimits {
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        max_qp: a.max_qp,
        max_qp_wr: a.max_qp_wr,
        // Every IBV_DEVICE_* bit the HAL knows lies in the low 32 bits.
        device_cap_flags: (a.device_cap_flags.bits() & u64::from(u32::MAX)) as u32,
        max_sge: a.max_sge,
        max_sge_rd: a.max_sge_rd,
        max_cq: a.max_cq,
        max_cqe: a.max_cqe,
        max_mr: a.max_mr,
        max_pd: a.max_pd,
        max_qp_rd_atom: a.max_qp_rd_atom,
        max_res_rd_atom: a.max_res_rd_atom,
        max_qp_init_rd_atom: a.max_qp_init_rd_atom,
        atomic_cap: a.atomic_cap as u32,
        max_mw: a.max_mw,
        max_mcast_grp: a.max_mcast_grp,
        max_mcast_qp_attach: a.max_mcast_qp_attach,
        max_total_mcast_qp_attach: a.max_total_mcast_qp_attach,
        max_ah: a.max_ah,
        max_srq: a.max_srq,
        max_srq_wr: a.max_srq_wr,
        max_srq_sge: a.max_srq_sge,
        max_pkeys: a.max_pkeys,
        local_ca_ack_delay: a.local_ca_ack_delay,
        hca_core_clock: a.hca_core_clock,
        num_comp_vectors: a.num_comp_vectors,
        ext: DevinfoExtCaps {
            device_cap_flags_ex: a.device_cap_flags.bits(),
            ..DevinfoExtCaps::default()
        },
        ..DevinfoLimits::default()
    }
}

/// The `max_vl_num` code of a port (the HAL has no VL capability): what the kernel driver of
/// that kind of device reports on its RoCE port. mlx4_ib's Ethernet ports say 2 (two VLs);
/// a software RoCE device (rxe) says 1.
fn max_vl_num(driver: &str) -> u8 {
    match driver {
        "mlx4" => 2,
        _ => 1,
    }
}

/// One port in the report model. The `-v` fields the HAL does not have (`port_cap_flags2`,
/// the P_Key and Q_Key violation counters, `sm_sl`, `subnet_timeout`, `init_type_reply`) are 0,
/// as on a RoCE port.
fn port(port_num: u8, p: &PortAttr, gids: Vec<DevinfoGid>, driver: &str) -> DevinfoPort {
    DevinfoPort {
        port_num: u32::from(port_num),
        state: p.state as u32,
        max_mtu: p.max_mtu as u32,
        active_mtu: p.active_mtu as u32,
        sm_lid: p.sm_lid,
        port_lid: p.lid,
        port_lmc: p.lmc,
        link_layer: match p.link_layer {
            LinkLayer::InfiniBand => 1,
            LinkLayer::Ethernet => 2,
        },
        extra: DevinfoPortExtra {
            max_msg_sz: p.max_msg_sz,
            port_cap_flags: p.port_cap_flags,
            max_vl_num: max_vl_num(driver),
            pkey_tbl_len: p.pkey_tbl_len,
            gid_tbl_len: p.gid_tbl_len,
            active_width: p.active_width,
            active_speed: u32::from(p.active_speed),
            phys_state: p.phys_state,
            bad_pkey_cntr: p.bad_pkey_cntr,
            qkey_viol_cntr: p.qkey_viol_cntr,
            gids,
            ..DevinfoPortExtra::default()
        },
    }
}
