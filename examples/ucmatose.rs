//! librdmacm's `ucmatose` (rdma-core `librdmacm/examples/cmatose.c`) with its defaults: one
//! RC connection on port 7471 made by the connection manager, 10 messages of 100 bytes from
//! the server to the client, 10 back, then the server disconnects.
//!
//! It runs on the UDP-bound device `PORTVERBS_UDP` makes (`udp0`), so the other end can be
//! another process, another host, or the C program against Linux Soft-RoCE:
//!
//!     PORTVERBS_UDP=10.0.0.1 cargo run --example ucmatose -- server
//!     ucmatose -s 10.0.0.1                     (on 10.0.0.2, an rxe device on its NIC)
//!
//!     ucmatose                                 (on 10.0.0.2)
//!     PORTVERBS_UDP=10.0.0.1 cargo run --example ucmatose -- client 10.0.0.2
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use portverbs::AnyDevice;
use portverbs::cm::{CmDevice, ConnParam, Connector, Listener};
use portverbs::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const PORT: u16 = 7471;
const COUNT: usize = 10;
const SIZE: usize = 100;

/// A connection's verbs objects: the QP sends from a send CQ and receives into a receive CQ
/// (ucmatose has one of each), all messages through one buffer.
struct Node {
    send_cq: Cq,
    recv_cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn node(ctx: &Context) -> Result<Node> {
    let pd = ctx.alloc_pd_blocking()?;
    let cq = || {
        ctx.create_cq_blocking(CqInit {
            entries: COUNT as u32,
            ..CqInit::default()
        })
    };
    let (send_cq, recv_cq) = (cq()?, cq()?);
    let qp = pd.create_qp_blocking(QpInit {
        send_cq: &send_cq,
        ..QpInit::new(QpType::Rc, &recv_cq)
    })?;
    // INIT now, so that the receives are posted before the peer's first message can come;
    // the CM takes the QP on to RTR and RTS.
    qp.init_blocking(&ConnectOptions::default())?;
    let mr = pd.reg_vec_blocking(vec![0; SIZE], AccessFlags::LOCAL_WRITE)?;
    let sge = [mr.sge(0, SIZE)?];
    for _ in 0..COUNT {
        qp.post_recv(&[RecvWr {
            wr_id: 0,
            sges: &sge,
        }])?;
    }
    Ok(Node {
        send_cq,
        recv_cq,
        qp,
        mr,
    })
}

/// Waits for `n` completions of `cq`, each a success.
fn complete(cq: &Cq, n: usize) -> Result<()> {
    let mut wc = [WorkCompletion::default()];
    for _ in 0..n {
        while cq.poll(&mut wc)? == 0 {
            std::thread::yield_now();
        }
        if wc[0].status != WcStatus::Success {
            return Err(format!("completion failed: {}", wc[0].status).into());
        }
    }
    Ok(())
}

fn send_all(node: &Node) -> Result<()> {
    let sge = [node.mr.sge(0, SIZE)?];
    for _ in 0..COUNT {
        node.qp
            .post_send(&[SendWr::new(0, SendOp::Send).sges(&sge).signaled()])?;
    }
    complete(&node.send_cq, COUNT)
}

fn server(ctx: &Context, cm: &CmDevice<AnyDevice>) -> Result<()> {
    let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), PORT);
    let mut listener = Listener::bind(cm, any)?;
    listener.listen(1)?;
    let request = listener.get_request_blocking(None)?;
    let peer = request.remote_addr();
    let node = node(ctx)?;
    let conn = request.accept_blocking(&node.qp, &ConnParam::default())?;
    send_all(&node)?;
    complete(&node.recv_cq, COUNT)?;
    conn.disconnect(&node.qp)?; // DREQ; the client answers with its DREP
    conn.notify_disconnect_blocking(Some(Duration::from_secs(10)))?;
    println!("server: {COUNT} messages of {SIZE} bytes each way with {peer}, disconnected");
    Ok(())
}

fn client(ctx: &Context, cm: &CmDevice<AnyDevice>, server: IpAddr) -> Result<()> {
    let mut conn = Connector::new(cm)?;
    conn.resolve_blocking(SocketAddr::new(server, PORT))?;
    let node = node(ctx)?;
    conn.connect_blocking(&node.qp, &ConnParam::default())?;
    complete(&node.recv_cq, COUNT)?;
    send_all(&node)?;
    // The server disconnects: its DREQ, then this side's disconnect sends the DREP.
    conn.notify_disconnect_blocking(Some(Duration::from_secs(10)))?;
    conn.disconnect(&node.qp)?;
    println!("client: {COUNT} messages of {SIZE} bytes each way, disconnected");
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = portverbs::device("udp0")?;
    let ctx = portverbs::open(dev)?;
    let ip = ctx.gid_table_blocking(1)?[0].1.gid.to_ip();
    let cm = CmDevice::open_blocking(&ctx, ip)?;
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["server"] => server(&ctx, &cm)?,
        ["client", addr] => client(&ctx, &cm, addr.parse()?)?,
        _ => return Err("usage: ucmatose server | ucmatose client SERVER_IP".into()),
    }
    // The last MADs (the DREP) leave before the process does.
    cm.flush(Duration::from_secs(1))?;
    Ok(())
}
