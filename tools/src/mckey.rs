//! `portverbs mckey`: librdmacm's `mckey` (`librdmacm/examples/mckey.c` in rdma-core), UD
//! multicast through the connection manager's join. Each "connection" (`-c`) is a UD QP that
//! joins the group `-m` ([`CmDevice::join_multicast`]: rdma_cm's MGID, address handle, QPN
//! 0xFFFFFF and Q_Key on RoCEv2); after mckey's three-second pause the sender (`-s`) posts
//! `-C` SEND-with-immediate messages of `-S` bytes to the group from every QP, and a receiver
//! waits until every QP has received `-C` of them. Then every QP leaves the group. The lines
//! printed are mckey's, so either side can be the C tool on a RoCEv2 device (rxe): Linux's
//! rdma_cm joins an IPv4 group on RoCEv2 as this does (no MAD on the wire: the port's IP
//! group membership brings the datagrams).
//!
//! Flags of newer mckeys: `-o` joins as a send-only full member (the QPs are not attached);
//! `-l` (a join without multicast loopback) is refused.
//!
//! Differences: `-M` (an unmapped `AF_IB` group address) is refused, there being no `AF_IB`
//! on RoCE; so is `-p` with any port space but `RDMA_PS_UDP` (0x0111; mckey also takes
//! `RDMA_PS_IPOIB`, which needs an IPoIB interface). The sender signals its last send and
//! waits for it before leaving (mckey posts every send unsignaled and leaves at once), and a
//! receiver gives up after `--timeout` seconds without a message (mckey polls for ever).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use portverbs::AnyDevice;
use portverbs::cm::service::{CmDevice, McastJoin, RDMA_UDP_QKEY};
use portverbs::prelude::*;

use crate::error::{CliError, Context as _};
use crate::verbs;

/// `RDMA_PS_UDP` (librdmacm's `rdma_cma.h`).
const RDMA_PS_UDP: u32 = 0x0111;
/// `RDMA_PS_IPOIB`.
const RDMA_PS_IPOIB: u32 = 0x0002;
/// The GRH area in front of every UD receive.
const GRH: usize = 40;
/// mckey's pause between the joins and the transfers ("to give SM chance to configure
/// switches").
const PAUSE: Duration = Duration::from_secs(3);
/// The most QPs (`-c`) and messages (`-C`) accepted: each message is a posted work request.
const MAX_CONNECTIONS: usize = 64;
const MAX_COUNT: u32 = 1 << 16;

/// mckey's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(
    disable_version_flag = true,
    about = "mckey (librdmacm's example): UD multicast through the connection manager's join",
    long_about = "mckey (librdmacm's example), with its flags and output: every QP (-c) joins \
the multicast group -m as rdma_cm does on RoCEv2 (MGID ::ffff:a.b.c.d for an IPv4 group, \
QPN 0xFFFFFF, Q_Key 0x01234567), then the sender (-s) sends -C messages of -S bytes to the \
group from every QP and a receiver waits for -C messages on every QP. Either side can be \
mckey itself on a RoCEv2 device (rxe)."
)]
pub(crate) struct MckeyArgs {
    /// Multicast address to join
    #[arg(short = 'm', value_name = "ADDR", required_unless_present = "unmapped")]
    addr: Option<IpAddr>,
    /// Unmapped (AF_IB) multicast address: not available on RoCE, refused
    #[arg(short = 'M', value_name = "ADDR")]
    unmapped: Option<String>,
    /// Sender
    #[arg(short = 's')]
    sender: bool,
    /// Local address to bind to (picks the device; default: the first device other processes
    /// can reach)
    #[arg(short = 'b', value_name = "ADDR")]
    bind: Option<IpAddr>,
    /// Connections: QPs that join the group
    #[arg(short = 'c', default_value_t = 1)]
    connections: usize,
    /// Messages per QP
    #[arg(short = 'C', default_value_t = 10)]
    count: u32,
    /// Message size
    #[arg(short = 'S', default_value_t = 100)]
    size: u32,
    /// Join as a send-only full member: the QPs are not attached to the group
    #[arg(short = 'o')]
    send_only: bool,
    /// Join without multicast loopback: refused (a UDP-bound port's own datagrams to a group
    /// never reach its own QPs anyway; other devices of the host do get them)
    #[arg(short = 'l')]
    no_loopback: bool,
    /// Port space: 0x0111 for UDP (the default and the only one here)
    #[arg(short = 'p', value_parser = parse_ps, default_value = "0x0111")]
    port_space: u32,
    /// Device (default: the one that owns -b's address)
    #[arg(long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Seconds a receiver waits without a message before it gives up (0: for ever, as mckey)
    #[arg(long = "timeout", value_name = "SECS", default_value_t = 30)]
    timeout: u64,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

/// `strtol(optarg, NULL, 0)`: decimal, or hex with 0x, or octal with a leading 0.
fn parse_ps(s: &str) -> Result<u32, String> {
    let r = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u32::from_str_radix(h, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        u32::from_str_radix(&s[1..], 8)
    } else {
        s.parse()
    };
    r.map_err(|e| format!("{s:?}: {e}"))
}

/// One joined QP (mckey's `cmatest_node`).
struct Node {
    cq: Cq,
    qp: Qp,
    mr: Mr,
    ah: AddressHandle,
    join: McastJoin,
}

fn make_node(cm: &CmDevice<AnyDevice>, args: &MckeyArgs, group: IpAddr) -> Result<Node, CliError> {
    let ctx = cm.context();
    let count = args.count as usize;
    let pd = ctx
        .alloc_pd_blocking()
        .ctx("mckey: unable to allocate PD")?;
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: if args.count > 0 { args.count * 2 } else { 2 },
            ..CqInit::default()
        })
        .ctx("mckey: unable to create CQ")?;
    let depth = u32::try_from(count.max(1)).unwrap_or(u32::MAX);
    let qp = pd
        .create_qp_blocking(QpInit {
            caps: QpCaps {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..QpInit::new(QpType::Ud, &cq)
        })
        .ctx("mckey: unable to create QP")?;
    // rdma_cm brings a RDMA_PS_UDP id's QP up with RDMA_UDP_QKEY.
    qp.ready_ud_blocking(&ConnectOptions {
        qkey: RDMA_UDP_QKEY,
        ..ConnectOptions::default()
    })
    .ctx("mckey: unable to create QP")?;
    let mr = pd
        .reg_vec_blocking(
            vec![0u8; args.size as usize + GRH],
            AccessFlags::LOCAL_WRITE,
        )
        .ctx("failed to reg MR")?;
    if !args.sender {
        for i in 0..count {
            let sge = [mr.sge(0, args.size as usize + GRH).ctx("receive buffer")?];
            qp.post_recv(&[RecvWr {
                wr_id: i as u64,
                sges: &sge,
            }])
            .map_err(|e| CliError::Failed(format!("failed to post receives: {e}")))?;
        }
    }
    let join = if args.send_only {
        cm.join_multicast_send_only(&qp, group)
    } else {
        cm.join_multicast_blocking(&qp, group)
    }
    .map_err(|e| CliError::Failed(format!("mckey: failure joining: {e}")))?;
    println!(
        "mckey: joined dgid: {} mlid 0x{:x} sl {}",
        std::net::Ipv6Addr::from(join.av.dgid.0),
        join.av.dlid,
        join.av.sl
    );
    let ah = pd
        .create_ah_blocking(join.av)
        .map_err(|e| CliError::Failed(format!("mckey: failure creating address handle: {e}")))?;
    Ok(Node {
        cq,
        qp,
        mr,
        ah,
        join,
    })
}

/// Posts `count` SENDs with the QP number as immediate data, the last one signaled, and waits
/// for its completion.
fn post_sends(node: &Node, args: &MckeyArgs, limit: Option<Duration>) -> Result<(), CliError> {
    let sge = [node.mr.sge(0, args.size as usize).ctx("send buffer")?];
    let dest = UdDest {
        ah_pd: None,
        av: node.ah.av(),
        remote_qpn: node.join.remote_qpn,
        remote_qkey: node.join.qkey,
    };
    for i in 0..args.count {
        let mut wr = SendWr::new(
            u64::from(i),
            SendOp::SendWithImm {
                imm: node.qp.qp_num(),
            },
        )
        .sges(&sge)
        .ud(dest);
        if i + 1 == args.count {
            wr = wr.signaled();
        }
        node.qp
            .post_send(&[wr])
            .map_err(|e| CliError::Failed(format!("failed to post sends: {e}")))?;
    }
    let wc = completions(&node.cq, 1, limit, "the last send's completion")?;
    if let Some(w) = wc.iter().find(|w| w.status != WcStatus::Success) {
        return Err(CliError::Failed(format!(
            "mckey: send completed with {}",
            w.status
        )));
    }
    Ok(())
}

/// Polls `cq` until `n` completions came; fails after `limit` without one.
fn completions(
    cq: &Cq,
    n: usize,
    limit: Option<Duration>,
    what: &str,
) -> Result<Vec<WorkCompletion>, CliError> {
    let mut out = Vec::with_capacity(n);
    let mut wc = [WorkCompletion::default(); 8];
    let mut last = Instant::now();
    while out.len() < n {
        let got = cq
            .poll(&mut wc)
            .map_err(|e| CliError::Failed(format!("mckey: failed polling CQ: {e}")))?;
        if got > 0 {
            out.extend_from_slice(&wc[..got]);
            last = Instant::now();
            continue;
        }
        if limit.is_some_and(|l| last.elapsed() > l) {
            return Err(CliError::Failed(format!(
                "mckey: {} of {n} completions, then nothing for {:?} while waiting for {what}",
                out.len(),
                limit.unwrap_or_default()
            )));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(out)
}

/// The device and its CM: -b's device (or `--ib-dev`), else the first reachable device.
fn open_cm(args: &MckeyArgs) -> Result<CmDevice<AnyDevice>, CliError> {
    let dev = match (&args.device, args.bind) {
        (Some(name), _) => verbs::pick_device(Some(name))?,
        (None, Some(ip)) => crate::cmdev::device_of(ip)
            .map_err(|e| CliError::Failed(format!("mckey: addr bind failure: {e}")))?,
        (None, None) => crate::cmdev::reachable_device()?,
    };
    match args.bind {
        Some(ip) => {
            let ctx = verbs::open(dev)?;
            CmDevice::open_blocking(&ctx, ip).ctx("mckey: addr bind failure")
        }
        None => crate::cmdev::cm_device(dev),
    }
}

fn run_test(args: &MckeyArgs, group: IpAddr, limit: Option<Duration>) -> Result<(), CliError> {
    let cm = open_cm(args)?;
    println!("mckey: joining");
    let port = cm.context().query_port_blocking(1).ctx("ibv_query_port")?;
    let mtu = port.active_mtu.bytes();
    if args.count > 0 && args.size > mtu {
        return Err(CliError::Failed(format!(
            "mckey: message_size {} is larger than active mtu {mtu}",
            args.size
        )));
    }
    let nodes = (0..args.connections)
        .map(|_| make_node(&cm, args, group))
        .collect::<Result<Vec<_>, _>>()?;
    std::thread::sleep(PAUSE);
    let result = if args.count > 0 && args.size > 0 {
        if args.sender {
            println!("initiating data transfers");
            nodes.iter().try_for_each(|n| post_sends(n, args, limit))
        } else {
            println!("receiving data transfers");
            nodes.iter().try_for_each(|n| {
                let wc = completions(&n.cq, args.count as usize, limit, "the group's messages")?;
                match wc.iter().find(|w| w.status != WcStatus::Success) {
                    Some(w) => Err(CliError::Failed(format!(
                        "mckey: receive completed with {}",
                        w.status
                    ))),
                    None => Ok(()),
                }
            })
        }
        .map(|()| println!("data transfers complete"))
    } else {
        Ok(())
    };
    let mut left = Ok(());
    for n in nodes.iter().filter(|_| !args.send_only) {
        if let Err(e) = cm.leave_multicast_blocking(&n.qp, group) {
            left = Err(CliError::Failed(format!("mckey: failure leaving: {e}")));
        }
    }
    result.and(left)
}

/// Runs mckey.
pub(crate) fn run(args: &MckeyArgs) -> Result<(), CliError> {
    if args.unmapped.is_some() {
        return Err(CliError::usage(
            "-M: an unmapped (AF_IB) multicast address needs an InfiniBand port; use -m",
        ));
    }
    if args.no_loopback {
        return Err(CliError::usage(
            "-l: joining without multicast loopback is not supported",
        ));
    }
    if args.port_space != RDMA_PS_UDP {
        let what = if args.port_space == RDMA_PS_IPOIB {
            "RDMA_PS_IPOIB needs an IPoIB interface"
        } else {
            "not a multicast port space"
        };
        return Err(CliError::usage(format!(
            "-p {:#x}: {what}; only {RDMA_PS_UDP:#x} (RDMA_PS_UDP) is supported",
            args.port_space
        )));
    }
    if !(1..=MAX_CONNECTIONS).contains(&args.connections) {
        return Err(CliError::usage(format!(
            "-c {}: between 1 and {MAX_CONNECTIONS}",
            args.connections
        )));
    }
    if args.count > MAX_COUNT {
        return Err(CliError::usage(format!(
            "-C {}: at most {MAX_COUNT}",
            args.count
        )));
    }
    let Some(group) = args.addr else {
        return Err(CliError::usage("-m multicast_address is required"));
    };
    if !group.is_multicast() {
        return Err(CliError::usage(format!(
            "-m {group}: not a multicast address"
        )));
    }
    println!(
        "mckey: starting {}",
        if args.sender { "client" } else { "server" }
    );
    let limit = crate::wait::timeout_arg(args.timeout);
    let ret = run_test(args, group, limit);
    println!("test complete");
    println!("return status {}", if ret.is_ok() { 0 } else { -1 });
    ret
}
