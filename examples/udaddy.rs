//! librdmacm's `udaddy` (rdma-core `librdmacm/examples/udaddy.c`) with its defaults: the
//! client finds the server's UD QP through the connection manager's service ID resolution
//! (SIDR_REQ / SIDR_REP, IBTA 12.11) on port 7174 of rdma_cm's UDP port space, sends 10
//! datagrams of 100 bytes with its QPN as immediate data through the address handle the
//! resolution returns, and the server replies with 10 to the sender of the first one, through
//! an address handle made from that datagram's completion and GRH (`ibv_create_ah_from_wc`),
//! to the QPN in its immediate data. Both QPs use rdma_cm's Q_Key, `RDMA_UDP_QKEY`, which
//! the server's SIDR_REP names (`UdParam::default`).
//!
//! It runs on the UDP-bound device `PORTVERBS_UDP` makes (`udp0`), so the other end can be
//! another process, another host, or the C program against Linux Soft-RoCE:
//!
//!     PORTVERBS_UDP=10.0.0.1 cargo run --example udaddy -- server
//!     udaddy -s 10.0.0.1                       (on 10.0.0.2, an rxe device on its NIC)
//!
//!     udaddy                                   (on 10.0.0.2)
//!     PORTVERBS_UDP=10.0.0.1 cargo run --example udaddy -- client 10.0.0.2
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use portverbs::AnyDevice;
use portverbs::cm::{CmDevice, Connector, Listener, RDMA_UDP_QKEY, UdParam};
use portverbs::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const PORT: u16 = 7174;
const COUNT: usize = 10;
const SIZE: usize = 100;
/// The GRH area in front of every UD receive (IBA 11.4.1.2).
const GRH: usize = 40;

struct Node {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

/// A UD QP ready to send and receive with rdma_cm's Q_Key, its receives posted.
fn node(ctx: &Context) -> Result<Node> {
    let pd = ctx.alloc_pd_blocking()?;
    let cq = ctx.create_cq_blocking(CqInit {
        entries: 2 * COUNT as u32,
        ..CqInit::default()
    })?;
    let qp = pd.create_qp_blocking(QpInit::new(QpType::Ud, &cq))?;
    qp.ready_ud_blocking(&ConnectOptions {
        qkey: RDMA_UDP_QKEY,
        ..ConnectOptions::default()
    })?;
    let mr = pd.reg_vec_blocking(vec![0; GRH + SIZE], AccessFlags::LOCAL_WRITE)?;
    let sge = [mr.sge(0, GRH + SIZE)?];
    for _ in 0..COUNT {
        qp.post_recv(&[RecvWr {
            wr_id: 0,
            sges: &sge,
        }])?;
    }
    Ok(Node { pd, cq, qp, mr })
}

/// Waits for the next successful completion of `want`.
fn next(node: &Node, want: WcOpcode) -> Result<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    loop {
        while node.cq.poll(&mut wc)? == 0 {
            std::thread::yield_now();
        }
        if wc[0].status != WcStatus::Success {
            return Err(format!("completion failed: {}", wc[0].status).into());
        }
        if wc[0].opcode == want {
            return Ok(wc[0]);
        }
    }
}

/// Sends the datagrams through `ah` to `qpn` and waits for their completions.
fn send_all(node: &Node, ah: &AddressHandle, qpn: u32, qkey: u32) -> Result<()> {
    let sge = [node.mr.sge(0, SIZE)?];
    let imm = node.qp.qp_num();
    for _ in 0..COUNT {
        let wr = SendWr::new(0, SendOp::SendWithImm { imm })
            .sges(&sge)
            .ud(ah.dest(qpn, qkey))
            .signaled();
        node.qp.post_send(&[wr])?;
    }
    for _ in 0..COUNT {
        next(node, WcOpcode::Send)?;
    }
    Ok(())
}

fn server(ctx: &Context, cm: &CmDevice<AnyDevice>) -> Result<()> {
    let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), PORT);
    let mut listener = Listener::bind_udp(cm, any)?;
    listener.listen(1)?;
    let request = listener.get_service_request_blocking(None)?;
    let node = node(ctx)?;
    // The SIDR_REP: our QPN and rdma_cm's Q_Key.
    request.reply_with(&node.qp, &UdParam::default())?;
    let first = next(&node, WcOpcode::Recv)?;
    let mut grh = [0u8; GRH];
    node.mr.read(0, &mut grh)?;
    // The sender, from the GRH; its QP, from the immediate data.
    let ah = node.pd.create_ah_from_wc_blocking(&first, &grh, 1)?;
    let qpn = first.imm_data;
    for _ in 1..COUNT {
        next(&node, WcOpcode::Recv)?;
    }
    send_all(&node, &ah, qpn, RDMA_UDP_QKEY)?;
    println!(
        "server: {COUNT} datagrams from {} QP {qpn:#x}, as many back",
        ah.av().dgid.to_ip()
    );
    Ok(())
}

fn client(ctx: &Context, cm: &CmDevice<AnyDevice>, server: IpAddr) -> Result<()> {
    let node = node(ctx)?;
    let mut conn = Connector::new(cm)?;
    let service = conn.resolve_service_blocking(SocketAddr::new(server, PORT))?;
    // Ready to send: GRH to the server's GID, hop limit 64.
    let ah = service.create_ah_blocking(&node.pd)?;
    send_all(&node, &ah, service.qpn, service.qkey)?;
    for _ in 0..COUNT {
        next(&node, WcOpcode::Recv)?;
    }
    println!(
        "client: {COUNT} datagrams to QP {:#x} and back",
        service.qpn
    );
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
        _ => return Err("usage: udaddy server | udaddy client SERVER_IP".into()),
    }
    cm.flush(Duration::from_secs(1))?;
    Ok(())
}
