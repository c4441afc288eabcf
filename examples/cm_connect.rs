//! rdma_cm-style connection setup: a listener on soft1 accepts a connection from soft0, the
//! CM takes both QPs to RTS (no transition ladder in the application), one SEND crosses,
//! and a disconnect flushes what is still posted.
//!
//! Each side posts its receive before the connection is up (`init_qp` takes the QP to INIT,
//! as librdmacm's `rdma_create_qp` does), so a SEND the peer posts as soon as it is
//! connected always finds one. Before exiting, both devices flush their CM, so the last
//! DREQ/DREP leaves before the process goes.
//!
//! `cargo run --example cm_connect [ACTIVE_DEVICE PASSIVE_DEVICE]` (defaults: soft0 soft1).

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use portverbs::cm::{CmDevice, ConnParam, Connector, Listener};
use portverbs::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Opens `name` and its CM on the IP address of GID entry 0.
fn open(name: &str) -> Result<(Context, CmDevice<portverbs::AnyDevice>)> {
    let ctx = portverbs::open(portverbs::device(name)?)?;
    let ip = ctx.gid_table_blocking(1)?[0].1.gid.to_ip();
    let cm = CmDevice::open_blocking(&ctx, ip)?;
    Ok((ctx, cm))
}

/// An RC QP, its CQ and a registered buffer.
fn rc_qp(ctx: &Context) -> Result<(Cq, Qp, Mr)> {
    let pd = ctx.alloc_pd_blocking()?;
    let cq = ctx.create_cq_blocking(CqInit {
        entries: 16,
        ..CqInit::default()
    })?;
    let qp = pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq))?;
    let mr = pd.reg_vec_blocking(vec![0; 4096], AccessFlags::LOCAL_WRITE)?;
    Ok((cq, qp, mr))
}

fn wait(cq: &Cq) -> Result<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    while cq.poll(&mut wc)? == 0 {
        thread::yield_now();
    }
    Ok(wc[0])
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (a_ctx, a) = open(&args.next().unwrap_or_else(|| "soft0".into()))?;
    let (b_ctx, b) = open(&args.next().unwrap_or_else(|| "soft1".into()))?;
    let addr = SocketAddr::new(b.local_ip(), 7471);

    // Passive side: bind, listen, take a request, accept it on a fresh QP.
    let mut listener = Listener::bind(&b, addr)?;
    listener.listen(8)?;
    let server = thread::spawn(move || -> Result<String> {
        let (cq, qp, mr) = rc_qp(&b_ctx)?;
        let req = listener.get_request_blocking(None)?;
        let hello = String::from_utf8_lossy(req.private_data())
            .trim_end_matches('\0')
            .to_owned();
        let accept = ConnParam {
            private_data: b"welcome".to_vec(),
            ..ConnParam::default()
        };
        // The receive goes first: the client sends as soon as it is connected.
        req.init_qp_blocking(&qp)?;
        qp.post_recv(&[RecvWr {
            wr_id: 1,
            sges: &[mr.sge(0, 64)?],
        }])?;
        let conn = req.accept_blocking(&qp, &accept)?;
        let wc = wait(&cq)?;
        let mut got = vec![0; wc.byte_len as usize];
        mr.read(0, &mut got)?;
        conn.notify_disconnect_blocking(None)?;
        conn.disconnect(&qp)?;
        Ok(format!(
            "server: request said {hello:?}, received {:?}",
            String::from_utf8_lossy(&got)
        ))
    });

    // Active side: resolve, post a receive, connect with private data, send, disconnect.
    let (cq, qp, mr) = rc_qp(&a_ctx)?;
    let mut conn = Connector::new(&a)?;
    conn.resolve_blocking(addr)?;
    conn.init_qp_blocking(&qp)?;
    qp.post_recv(&[RecvWr {
        wr_id: 3,
        sges: &[mr.sge(64, 64)?],
    }])?;
    let request = ConnParam {
        private_data: b"hello".to_vec(),
        ..ConnParam::default()
    };
    let reply = conn.connect_blocking(&qp, &request)?;
    println!(
        "client: connected, reply {:?}",
        String::from_utf8_lossy(&reply).trim_end_matches('\0')
    );
    mr.write(0, b"ping")?;
    let sges = [mr.sge(0, 4)?];
    qp.post_send(&[SendWr::new(2, SendOp::Send).sges(&sges).signaled()])?;
    wait(&cq)?;
    conn.disconnect(&qp)?;
    println!(
        "client: after disconnect the receive completed with {}",
        wait(&cq)?.status
    );
    conn.notify_disconnect_blocking(None)?;
    println!("{}", server.join().map_err(|_| "server panicked")??);
    // The CM has no thread: what its last calls queued (the server's DREP) leaves now.
    for cm in [&a, &b] {
        if !cm.flush(Duration::from_secs(5))? {
            return Err("the CM's last messages did not leave".into());
        }
    }
    Ok(())
}
