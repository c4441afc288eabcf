//! `portverbs ucmatose`: librdmacm's `ucmatose` (rdma-core `librdmacm/examples/cmatose.c`).
//!
//! With `-s ADDR` a client, else a server. The client opens `-c` RC connections to the
//! server's port (7471) through the CM, each with `-C` receives of `-S` bytes posted before
//! it connects; the server accepts as many, sends `-C` messages on each, then receives as
//! many back (the client answers once it has them all), and disconnects; the client answers
//! each DREQ with its own disconnect. Both print the C program's progress lines, then `test
//! complete` and `return status 0`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use portverbs::AnyDevice;
use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener};
use portverbs::prelude::*;

use super::{Node, NodeSpec, event_of, say};
use crate::error::{CliError, Context as _};
use crate::wait::{DEFAULT_TIMEOUT, timeout_arg};

/// ucmatose's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(
    disable_version_flag = true,
    about = "ucmatose (librdmacm's example): RC connections through the connection manager, \
messages both ways",
    long_about = "ucmatose (librdmacm's example), with its flags and output. Without -s: a \
server on -b's address (any address of the device without -b) that accepts -c connections, \
sends -C messages of -S bytes on each, receives as many back and disconnects. With -s: a \
client that opens -c connections to that server, receives the messages, sends them back and \
disconnects when the server does. Either end can be ucmatose itself."
)]
pub(crate) struct UcmatoseArgs {
    /// Server address: run as a client of it
    #[arg(short = 's', value_name = "ADDR")]
    server: Option<IpAddr>,
    /// Address to bind to (the server's listening address, the client's source; picks the
    /// device)
    #[arg(short = 'b', value_name = "ADDR")]
    bind: Option<IpAddr>,
    /// Connections
    #[arg(short = 'c', default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    connections: u32,
    /// Messages each way per connection
    #[arg(short = 'C', default_value_t = 10)]
    count: u32,
    /// Message size
    #[arg(short = 'S', default_value_t = 100)]
    size: usize,
    /// Port
    #[arg(short = 'p', default_value_t = 7471)]
    port: u16,
    /// Type of service: accepted for ucmatose's command lines; Portverbs' RoCEv2 packets
    /// always carry traffic class 0
    #[arg(short = 't', value_name = "TOS")]
    tos: Option<String>,
    /// Device (default: the one that owns the address)
    #[arg(long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Seconds a peer may stay silent (no completion, no CM event) before this side gives
    /// up (0: wait for ever, as ucmatose does). A server waits for its clients' connection
    /// requests without limit
    #[arg(long = "timeout", value_name = "SECS", default_value_t = DEFAULT_TIMEOUT.as_secs())]
    timeout: u64,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

impl UcmatoseArgs {
    /// The messages each way: none when the size is 0, as ucmatose has it.
    fn count(&self) -> u32 {
        if self.size == 0 { 0 } else { self.count }
    }

    fn spec(&self) -> NodeSpec {
        NodeSpec {
            qp_type: QpType::Rc,
            depth: self.count(),
            buf_len: self.size,
            limit: timeout_arg(self.timeout),
        }
    }

    /// How long to wait for a CM event that should come at once (the peer's DREQ or DREP).
    fn cm_wait(&self) -> Duration {
        timeout_arg(self.timeout).unwrap_or(Duration::from_secs(3600))
    }
}

/// A connection's objects: its verbs node and its CM endpoint.
struct Conn {
    node: Node,
    cm_id: Connector<AnyDevice>,
}

/// ucmatose's line for a failed connection, then the error.
fn failed(e: portverbs::cm::service::ServiceError, peer: &str) -> CliError {
    match event_of(&e) {
        Some((name, status)) => {
            say(format_args!("cmatose: event: {name}, error: {status}"));
            CliError::Failed(format!("{name} (status {status}) from {peer}"))
        }
        None => CliError::Failed(format!("cmatose: {e} (peer {peer})")),
    }
}

fn serve(args: &UcmatoseArgs, cm: &CmDevice<AnyDevice>) -> Result<(), CliError> {
    let any = if cm.local_ip().is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    let addr = SocketAddr::new(args.bind.unwrap_or(any), args.port);
    let mut listener = Listener::bind(cm, addr).ctx("cmatose: bind address failed")?;
    listener
        .listen(args.connections as usize)
        .ctx("cmatose: failure trying to listen")?;
    let count = args.count();
    let mut conns = Vec::new();
    while conns.len() < args.connections as usize {
        let req = listener
            .get_request_blocking(None)
            .ctx("waiting for a connection request")?;
        let peer = req.remote_addr().to_string();
        let node = Node::new(cm.context(), args.spec(), 0)?;
        node.post_recvs(count, args.size)?;
        let cm_id = req
            .accept_blocking(&node.qp, &ConnParam::default())
            .map_err(|e| failed(e, &peer))?;
        conns.push(Conn { node, cm_id });
    }
    if count > 0 {
        say("initiating data transfers");
        for c in &conns {
            c.node
                .post_sends(count, args.size, SendOp::Send, SendFlags::SIGNALED, None)?;
        }
        say("completing sends");
        for c in &conns {
            c.node
                .complete(&c.node.send_cq, count, |_| true, |_| Ok(()))?;
        }
        say("receiving data transfers");
        for c in &conns {
            c.node
                .complete(&c.node.recv_cq, count, |_| true, |_| Ok(()))?;
        }
        say("data transfers complete");
    }
    say("cmatose: disconnecting");
    for c in &conns {
        c.cm_id.disconnect(&c.node.qp).ctx("rdma_disconnect")?;
    }
    for c in &conns {
        c.cm_id
            .notify_disconnect_blocking(Some(args.cm_wait()))
            .ctx("waiting for the client's DREP")?;
    }
    say("disconnected");
    drop(conns);
    let _ = cm.flush(Duration::from_secs(1));
    Ok(())
}

fn connect(args: &UcmatoseArgs, cm: &CmDevice<AnyDevice>, dst: IpAddr) -> Result<(), CliError> {
    let server = SocketAddr::new(dst, args.port);
    let peer = server.to_string();
    let count = args.count();
    say("cmatose: connecting");
    let mut conns = Vec::new();
    for _ in 0..args.connections {
        let mut cm_id = Connector::new(cm).ctx("rdma_create_id")?;
        cm_id
            .resolve_blocking(server)
            .ctx("cmatose: failure getting addr")?;
        let node = Node::new(cm.context(), args.spec(), 0)?;
        node.post_recvs(count, args.size)?;
        // ucmatose's connection parameters: one READ each way, 5 retries.
        let param = ConnParam {
            retry_count: 5,
            ..ConnParam::default()
        };
        cm_id
            .connect_blocking(&node.qp, &param)
            .map_err(|e| failed(e, &peer))?;
        conns.push(Conn { node, cm_id });
    }
    if count > 0 {
        say("receiving data transfers");
        for c in &conns {
            c.node
                .complete(&c.node.recv_cq, count, |_| true, |_| Ok(()))?;
        }
        say("sending replies");
        for c in &conns {
            c.node
                .post_sends(count, args.size, SendOp::Send, SendFlags::SIGNALED, None)?;
        }
        for c in &conns {
            c.node
                .complete(&c.node.send_cq, count, |_| true, |_| Ok(()))?;
        }
        say("data transfers complete");
    }
    // The server disconnects; each DREQ is answered with this side's disconnect (the DREP).
    for c in &conns {
        c.cm_id
            .notify_disconnect_blocking(Some(args.cm_wait()))
            .ctx("waiting for the server's disconnect")?;
        let _ = c.cm_id.disconnect(&c.node.qp);
    }
    drop(conns);
    let _ = cm.flush(Duration::from_secs(1));
    Ok(())
}

/// `portverbs ucmatose`.
pub(crate) fn run(args: &UcmatoseArgs) -> Result<(), CliError> {
    super::run_role(
        "cmatose",
        args.device.as_deref(),
        args.bind,
        args.server,
        |cm, dst| connect(args, cm, dst),
        |cm| serve(args, cm),
    )
}
