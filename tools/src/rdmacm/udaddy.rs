//! `portverbs udaddy`: librdmacm's `udaddy` (rdma-core `librdmacm/examples/udaddy.c`): UD
//! datagrams between endpoints that found each other through the CM's service ID resolution
//! (SIDR, IBTA 12.11) in rdma_cm's UDP port space.
//!
//! With `-s ADDR` a client, else a server on port 7174. The client resolves the server's UD
//! service (a SIDR_REQ; the SIDR_REP names the server's QPN and Q_Key, and the address
//! handle goes to the server's address, the route rdma_cm resolved), then sends `-C`
//! datagrams of `-S` bytes, each with its own QPN as immediate data, and waits for as many
//! back. The server answers each SIDR_REQ with a UD QP of rdma_cm's Q_Key (`RDMA_UDP_QKEY`),
//! takes the client's datagrams, and replies to the sender it learns from the first one: the
//! GRH's source address and the immediate's QPN, with its own Q_Key — `udaddy`'s
//! `ibv_create_ah_from_wc` (`Pd::create_ah_from_wc`). The client's address handle is the one
//! the resolution returns (hop limit 64, as rdma_cm's route gives).

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use portverbs::AnyDevice;
use portverbs::cm::service::{CmDevice, Connector, Listener, RDMA_UDP_QKEY, UdParam};
use portverbs::prelude::*;

use super::{GRH_LEN, Node, NodeSpec, event_of, say};
use crate::error::{CliError, Context as _};
use crate::wait::{DEFAULT_TIMEOUT, timeout_arg};

/// udaddy's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(
    disable_version_flag = true,
    about = "udaddy (librdmacm's example): UD datagrams to a service resolved through the \
connection manager (SIDR)",
    long_about = "udaddy (librdmacm's example), with its flags and output. Without -s: a \
server on -b's address that answers -c service resolution requests (SIDR), receives -C \
datagrams of -S bytes from each client and sends as many back. With -s: a client that \
resolves the server's UD service, sends the datagrams and receives the replies. Either end \
can be udaddy itself. (udaddy's -p chooses the port space; the port is 7174, which --port \
changes.)"
)]
pub(crate) struct UdaddyArgs {
    /// Server address: run as a client of it
    #[arg(short = 's', value_name = "ADDR")]
    server: Option<IpAddr>,
    /// Address to bind to (picks the device)
    #[arg(short = 'b', value_name = "ADDR")]
    bind: Option<IpAddr>,
    /// Connections (service resolutions)
    #[arg(short = 'c', default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    connections: u32,
    /// Datagrams each way per connection
    #[arg(short = 'C', default_value_t = 10)]
    count: u32,
    /// Datagram size (at most the path MTU)
    #[arg(short = 'S', default_value_t = 100)]
    size: usize,
    /// Type of service: accepted for udaddy's command lines; Portverbs' RoCEv2 packets always
    /// carry traffic class 0
    #[arg(short = 't', value_name = "TOS")]
    tos: Option<String>,
    /// Port space: udp (the only one here; udaddy also knows ipoib)
    #[arg(short = 'P', value_name = "SPACE", default_value = "udp", value_parser = ["udp"])]
    port_space: String,
    /// UDP port-space port of the service
    #[arg(long = "port", default_value_t = 7174)]
    port: u16,
    /// Device (default: the one that owns the address)
    #[arg(long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Seconds a peer may stay silent before this side gives up (0: wait for ever, as udaddy
    /// does). A server waits for its clients' requests without limit
    #[arg(long = "timeout", value_name = "SECS", default_value_t = DEFAULT_TIMEOUT.as_secs())]
    timeout: u64,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

impl UdaddyArgs {
    fn count(&self) -> u32 {
        if self.size == 0 { 0 } else { self.count }
    }

    fn spec(&self) -> NodeSpec {
        NodeSpec {
            qp_type: QpType::Ud,
            depth: self.count(),
            buf_len: self.size + GRH_LEN,
            limit: timeout_arg(self.timeout),
        }
    }
}

/// udaddy's check: a datagram must fit the port's active MTU.
fn check_mtu(args: &UdaddyArgs, ctx: &Context) -> Result<(), CliError> {
    let mtu = ctx
        .query_port_blocking(1)
        .ctx("ibv_query_port")?
        .active_mtu
        .bytes() as usize;
    if args.count() > 0 && args.size > mtu {
        say(format_args!(
            "udaddy: message_size {} is larger than active mtu {mtu}",
            args.size
        ));
        return Err(CliError::usage(format_args!(
            "a {}-byte datagram is larger than the active MTU {mtu}",
            args.size
        )));
    }
    Ok(())
}

fn serve(args: &UdaddyArgs, cm: &CmDevice<AnyDevice>) -> Result<(), CliError> {
    let any = if cm.local_ip().is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    let addr = SocketAddr::new(args.bind.unwrap_or(any), args.port);
    let mut listener = Listener::bind_udp(cm, addr).ctx("udaddy: bind address failed")?;
    listener
        .listen(args.connections as usize)
        .ctx("udaddy: failure trying to listen")?;
    let count = args.count();
    let mut nodes = Vec::new();
    while nodes.len() < args.connections as usize {
        let req = listener
            .get_service_request_blocking(None)
            .ctx("waiting for a service request")?;
        check_mtu(args, cm.context())?;
        let node = Node::new(cm.context(), args.spec(), RDMA_UDP_QKEY)?;
        node.post_recvs(count, args.size + GRH_LEN)?;
        req.reply_with(&node.qp, &UdParam::default())
            .ctx("udaddy: failure accepting")?;
        nodes.push(node);
    }
    if count == 0 {
        return Ok(());
    }
    say("receiving data transfers");
    // Per node: the client, from its first datagram (source address, QPN in the immediate).
    let mut replies = Vec::new();
    for node in &nodes {
        let first: RefCell<Option<(WorkCompletion, [u8; GRH_LEN])>> = RefCell::new(None);
        node.complete(
            &node.recv_cq,
            count,
            |wc| wc.opcode == WcOpcode::Recv,
            |wc| {
                if first.borrow().is_some() {
                    return Ok(());
                }
                if !wc.wc_flags.contains(WcFlags::GRH) || !wc.wc_flags.contains(WcFlags::WITH_IMM) {
                    return Err(CliError::Failed(
                        "a datagram without a GRH or without immediate data: no sender to \
                         reply to"
                            .into(),
                    ));
                }
                let mut grh = [0u8; GRH_LEN];
                node.mr.read(0, &mut grh).ctx("reading the GRH")?;
                *first.borrow_mut() = Some((*wc, grh));
                Ok(())
            },
        )?;
        let (wc, grh) = first
            .into_inner()
            .ok_or_else(|| CliError::Failed("no datagram came".into()))?;
        let ah = node
            .pd
            .create_ah_from_wc_blocking(&wc, &grh, 1)
            .ctx("udaddy: failure creating address handle")?;
        replies.push((ah, wc.imm_data & 0x00ff_ffff));
    }
    say("sending replies");
    for (node, (ah, qpn)) in nodes.iter().zip(&replies) {
        let imm = node.qp.qp_num();
        node.post_sends(
            count,
            args.size,
            SendOp::SendWithImm { imm },
            SendFlags::SIGNALED,
            Some(ah.dest(*qpn, RDMA_UDP_QKEY)),
        )?;
    }
    for node in &nodes {
        node.complete(
            &node.send_cq,
            count,
            |wc| wc.opcode == WcOpcode::Send,
            |_| Ok(()),
        )?;
    }
    say("data transfers complete");
    Ok(())
}

fn connect(args: &UdaddyArgs, cm: &CmDevice<AnyDevice>, dst: IpAddr) -> Result<(), CliError> {
    let server = SocketAddr::new(dst, args.port);
    let count = args.count();
    say("udaddy: connecting");
    let mut peers = Vec::new();
    for _ in 0..args.connections {
        let mut cm_id = Connector::new(cm).ctx("rdma_create_id")?;
        check_mtu(args, cm.context())?;
        let node = Node::new(cm.context(), args.spec(), RDMA_UDP_QKEY)?;
        node.post_recvs(count, args.size + GRH_LEN)?;
        let svc = cm_id.resolve_service_blocking(server).map_err(|e| {
            match event_of(&e) {
                Some((name, status)) => say(format_args!("udaddy: event: {name}, error: {status}")),
                None => say(format_args!("udaddy: {e}")),
            }
            CliError::Failed(format!("resolving the UD service at {server}: {e}"))
        })?;
        let ah = svc
            .create_ah_blocking(&node.pd)
            .ctx("udaddy: failure creating address handle")?;
        peers.push((node, ah, svc, cm_id));
    }
    if count > 0 {
        say("initiating data transfers");
        for (node, ah, svc, _) in &peers {
            let imm = node.qp.qp_num();
            // Signalled (udaddy's are not): their completions are passed over below, and
            // nothing differs on the wire.
            node.post_sends(
                count,
                args.size,
                SendOp::SendWithImm { imm },
                SendFlags::SIGNALED,
                Some(ah.dest(svc.qpn, svc.qkey)),
            )?;
        }
        say("receiving data transfers");
        for (node, ..) in &peers {
            node.complete(
                &node.recv_cq,
                count,
                |wc| wc.opcode == WcOpcode::Recv,
                |_| Ok(()),
            )?;
        }
        say("data transfers complete");
    }
    drop(peers);
    let _ = cm.flush(Duration::from_secs(1));
    Ok(())
}

/// `portverbs udaddy`.
pub(crate) fn run(args: &UdaddyArgs) -> Result<(), CliError> {
    super::run_role(
        "udaddy",
        args.device.as_deref(),
        args.bind,
        args.server,
        |cm, dst| connect(args, cm, dst),
        |cm| serve(args, cm),
    )
}
