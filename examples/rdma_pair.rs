//! librdmacm's `rdma_server` and `rdma_client` (rdma-core `librdmacm/examples/rdma_server.c`,
//! `rdma_client.c`), the smallest connection-manager exchange: one RC connection on port
//! 7471, the client sends 16 bytes, the server answers with 16 bytes, both disconnect.
//!
//! It runs on the UDP-bound device `PORTVERBS_UDP` makes (`udp0`), so the other end can be
//! another process, another host, or the C programs against Linux Soft-RoCE:
//!
//!     PORTVERBS_UDP=10.0.0.1 cargo run --example rdma_pair -- server
//!     rdma_client -s 10.0.0.1                  (on 10.0.0.2, an rxe device on its NIC)
//!
//!     rdma_server                              (on 10.0.0.2)
//!     PORTVERBS_UDP=10.0.0.1 cargo run --example rdma_pair -- client 10.0.0.2
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use portverbs::cm::{CmDevice, ConnParam, Connector, Listener};
use portverbs::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const PORT: u16 = 7471;
const LEN: usize = 16;

/// An RC QP in INIT with one receive posted, and its 16-byte buffer.
fn endpoint(ctx: &Context) -> Result<(Cq, Qp, Mr)> {
    let pd = ctx.alloc_pd_blocking()?;
    let cq = ctx.create_cq_blocking(CqInit {
        entries: 4,
        ..CqInit::default()
    })?;
    let qp = pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq))?;
    qp.init_blocking(&ConnectOptions::default())?;
    let mr = pd.reg_vec_blocking(vec![0; LEN], AccessFlags::LOCAL_WRITE)?;
    qp.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[mr.sge(0, LEN)?],
    }])?;
    Ok((cq, qp, mr))
}

/// Waits for the completion of `want` (passing over the other one).
fn wait(cq: &Cq, want: WcOpcode) -> Result<()> {
    let mut wc = [WorkCompletion::default()];
    loop {
        while cq.poll(&mut wc)? == 0 {
            std::thread::yield_now();
        }
        if wc[0].status != WcStatus::Success {
            return Err(format!("completion failed: {}", wc[0].status).into());
        }
        if wc[0].opcode == want {
            return Ok(());
        }
    }
}

fn send(qp: &Qp, mr: &Mr) -> Result<()> {
    let sge = [mr.sge(0, LEN)?];
    qp.post_send(&[SendWr::new(2, SendOp::Send).sges(&sge).signaled()])?;
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = portverbs::device("udp0")?;
    let ctx = portverbs::open(dev)?;
    let ip = ctx.gid_table_blocking(1)?[0].1.gid.to_ip();
    let cm = CmDevice::open_blocking(&ctx, ip)?;
    let (cq, qp, mr) = endpoint(&ctx)?;
    let conn = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["server"] => {
            let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), PORT);
            let mut listener = Listener::bind(&cm, any)?;
            listener.listen(1)?;
            let request = listener.get_request_blocking(None)?;
            let conn = request.accept_blocking(&qp, &ConnParam::default())?;
            wait(&cq, WcOpcode::Recv)?; // the client's message, then the answer
            send(&qp, &mr)?;
            wait(&cq, WcOpcode::Send)?;
            println!("server: answered {}", conn.remote_addr().ok_or("no peer")?);
            conn
        }
        ["client", addr] => {
            let mut conn = Connector::new(&cm)?;
            conn.resolve_blocking(SocketAddr::new(addr.parse()?, PORT))?;
            conn.connect_blocking(&qp, &ConnParam::default())?;
            send(&qp, &mr)?;
            wait(&cq, WcOpcode::Send)?;
            wait(&cq, WcOpcode::Recv)?;
            println!("client: sent {LEN} bytes, got {LEN} back");
            conn
        }
        _ => return Err("usage: rdma_pair server | rdma_pair client SERVER_IP".into()),
    };
    // Both sides disconnect (their DREQs may cross); the end of it, then the last MADs out.
    conn.disconnect(&qp)?;
    let _ = conn.notify_disconnect_blocking(Some(Duration::from_secs(2)));
    cm.flush(Duration::from_secs(1))?;
    Ok(())
}
