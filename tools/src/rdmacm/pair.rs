//! `portverbs rdma_server` and `portverbs rdma_client`: librdmacm's smallest synchronous pair
//! (rdma-core `librdmacm/examples/rdma_server.c`, `rdma_client.c`). One RC connection on
//! port 7471: the client sends a 16-byte message, the server, once it has it, sends 16 bytes
//! back, and both disconnect. Each prints `<name>: start` and `<name>: end <status>`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use portverbs::cm::service::{ConnParam, Connector, Listener};
use portverbs::prelude::*;

use super::{Node, NodeSpec, event_of, linger, say};
use crate::cmdev::{self, cm_device};
use crate::error::{CliError, Context as _};
use crate::wait::{DEFAULT_TIMEOUT, timeout_arg};

/// The message each way.
const MSG_LEN: usize = 16;
/// The port both use unless told otherwise.
const PORT: u16 = 7471;

/// rdma_server's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(
    disable_version_flag = true,
    about = "rdma_server (librdmacm's example): accepts one RC connection, answers one message",
    long_about = "rdma_server (librdmacm's example), with its flag and output: listens on \
port -p of any address, accepts one connection through the connection manager, waits for \
the client's 16-byte message, sends 16 bytes back and disconnects. Its client can be \
rdma_client itself."
)]
pub(crate) struct ServerArgs {
    /// Port
    #[arg(short = 'p', default_value_t = PORT)]
    port: u16,
    /// Device (default: the first one other processes can reach)
    #[arg(long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Seconds the client may stay silent once connected (0: for ever, as rdma_server waits)
    #[arg(long = "timeout", value_name = "SECS", default_value_t = DEFAULT_TIMEOUT.as_secs())]
    timeout: u64,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

/// rdma_client's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(
    disable_version_flag = true,
    about = "rdma_client (librdmacm's example): one RC connection, one message each way",
    long_about = "rdma_client (librdmacm's example), with its flags and output: connects to \
the server at -s, port -p, through the connection manager, sends a 16-byte message, waits \
for the 16-byte answer and disconnects. Its server can be rdma_server itself."
)]
pub(crate) struct ClientArgs {
    /// Server address
    #[arg(short = 's', value_name = "ADDR", default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    server: IpAddr,
    /// Port
    #[arg(short = 'p', default_value_t = PORT)]
    port: u16,
    /// Device (default: the first one other processes can reach)
    #[arg(long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Seconds the server may stay silent once connected (0: for ever, as rdma_client waits)
    #[arg(long = "timeout", value_name = "SECS", default_value_t = DEFAULT_TIMEOUT.as_secs())]
    timeout: u64,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

fn spec(timeout: u64) -> NodeSpec {
    NodeSpec {
        qp_type: QpType::Rc,
        depth: 1,
        buf_len: MSG_LEN,
        limit: timeout_arg(timeout),
    }
}

/// The C programs' last line: `end 0`, or `end -1` (what they print for any failure).
fn finish(name: &str, result: Result<(), CliError>) -> Result<(), CliError> {
    say(format_args!(
        "{name}: end {}",
        if result.is_ok() { 0 } else { -1 }
    ));
    result
}

fn serve(args: &ServerArgs) -> Result<(), CliError> {
    let dev = cmdev::server_device(args.device.as_deref(), None)?;
    cmdev::reachable_server(&dev, "")?;
    let cm = cm_device(dev)?;
    let any = if cm.local_ip().is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    };
    let mut listener =
        Listener::bind(&cm, SocketAddr::new(any, args.port)).ctx("rdma_create_ep")?;
    listener.listen(1).ctx("rdma_listen")?;
    let req = listener
        .get_request_blocking(None)
        .ctx("rdma_get_request")?;
    let node = Node::new(cm.context(), spec(args.timeout), 0)?;
    node.post_recvs(1, MSG_LEN)?;
    let conn = req
        .accept_blocking(&node.qp, &ConnParam::default())
        .ctx("rdma_accept")?;
    let exchanged = node
        .complete(&node.recv_cq, 1, |_| true, |_| Ok(()))
        .and_then(|()| {
            node.post_sends(1, MSG_LEN, SendOp::Send, SendFlags::SIGNALED, None)?;
            node.complete(&node.send_cq, 1, |_| true, |_| Ok(()))
        });
    // rdma_server disconnects whatever happened; the client's DREQ may have come first.
    let _ = conn.disconnect(&node.qp);
    linger(&cm, &conn, Duration::from_secs(2));
    exchanged
}

fn connect(args: &ClientArgs) -> Result<(), CliError> {
    let dev = cmdev::client_device(args.device.as_deref(), None, Some(args.server))?;
    let cm = cm_device(dev)?;
    let server = SocketAddr::new(args.server, args.port);
    let mut conn = Connector::new(&cm).ctx("rdma_create_ep")?;
    conn.resolve_blocking(server).ctx("rdma_create_ep")?;
    let node = Node::new(cm.context(), spec(args.timeout), 0)?;
    node.post_recvs(1, MSG_LEN)?;
    conn.connect_blocking(&node.qp, &ConnParam::default())
        .map_err(|e| {
            let what =
                event_of(&e).map_or_else(|| e.to_string(), |(n, s)| format!("{n}, status {s}"));
            CliError::Failed(format!("rdma_connect: {what} (server {server})"))
        })?;
    let exchanged = node
        .post_sends(1, MSG_LEN, SendOp::Send, SendFlags::SIGNALED, None)
        .and_then(|()| node.complete(&node.send_cq, 1, |_| true, |_| Ok(())))
        .and_then(|()| node.complete(&node.recv_cq, 1, |_| true, |_| Ok(())));
    let _ = conn.disconnect(&node.qp);
    linger(&cm, &conn, Duration::from_secs(2));
    exchanged
}

/// `portverbs rdma_server`.
pub(crate) fn run_server(args: &ServerArgs) -> Result<(), CliError> {
    say("rdma_server: start");
    finish("rdma_server", serve(args))
}

/// `portverbs rdma_client`.
pub(crate) fn run_client(args: &ClientArgs) -> Result<(), CliError> {
    say("rdma_client: start");
    finish("rdma_client", connect(args))
}
