//! An echo server and its client as tokio tasks: no thread waits, every completion is awaited
//! through a CQ notify request ([`Cq::notified`]), armed before the CQ is drained so that
//! nothing slips between. On Linux the event queues' eventfds sit in tokio's reactor (feature
//! `tokio`), so hardware interrupts wake the tasks the same way.
//!
//!     cargo run --features tokio --example tokio_echo [-- CLIENT_DEVICE SERVER_DEVICE]
use portverbs::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const ROUNDS: u64 = 3;
const SLOT: usize = 64;

/// The next completion of `cq`, sleeping until there is one.
async fn next_completion(cq: &Cq) -> Result<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    loop {
        let notified = cq.notified(NotifyKind::Any); // arm …
        if cq.poll(&mut wc)? > 0 {
            // … then look: a completion that came before the arming is found here.
            return match wc[0].status {
                WcStatus::Success => Ok(wc[0]),
                status => Err(format!("work request {} failed: {status}", wc[0].wr_id).into()),
            };
        }
        notified.await?;
    }
}

struct End {
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn open(name: Option<String>, default: &str) -> Result<End> {
    let name = name.unwrap_or_else(|| default.into());
    let ctx = portverbs::open(portverbs::device(&name)?)?;
    let pd = ctx.alloc_pd_blocking()?;
    let cq = ctx.create_cq_blocking(CqInit {
        entries: 16,
        ..CqInit::default()
    })?;
    let qp = pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq))?;
    let mr = pd.reg_vec_blocking(vec![0; 2 * SLOT], AccessFlags::LOCAL_WRITE)?;
    Ok(End { cq, qp, mr })
}

fn post_recv(end: &End, slot: usize) -> Result<()> {
    let sges = [end.mr.sge(slot * SLOT, SLOT)?];
    Ok(end.qp.post_recv(&[RecvWr {
        wr_id: slot as u64,
        sges: &sges,
    }])?)
}

/// Sends each message back from the buffer it arrived in, then reposts that buffer.
async fn serve(server: End) -> Result<()> {
    for _ in 0..ROUNDS {
        let wc = next_completion(&server.cq).await?;
        let sges = [server
            .mr
            .sge(wc.wr_id as usize * SLOT, wc.byte_len as usize)?];
        let echo = SendWr::new(wc.wr_id, SendOp::Send).sges(&sges);
        server.qp.post_send(&[echo.flags(SendFlags::SIGNALED)])?;
        next_completion(&server.cq).await?; // the echo's send completion
        post_recv(&server, wc.wr_id as usize)?;
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let client = open(args.next(), "soft0")?;
    let server = open(args.next(), "soft1")?;
    let opts = ConnectOptions::default();
    server.qp.init_blocking(&opts)?; // receives can be posted from INIT on
    post_recv(&server, 0)?;
    let (to_c, to_s) = (
        client.qp.endpoint_blocking(&opts)?,
        server.qp.endpoint_blocking(&opts)?,
    );
    client.qp.connect_rc_blocking(&to_s, &opts)?;
    server.qp.connect_rc_blocking(&to_c, &opts)?;
    let server = tokio::spawn(serve(server));

    for round in 0..ROUNDS {
        post_recv(&client, 1)?; // for the echo
        let text = format!("ping {round}");
        client.mr.write(0, text.as_bytes())?;
        let sges = [client.mr.sge(0, text.len())?];
        client
            .qp
            .post_send(&[SendWr::new(0, SendOp::Send).sges(&sges)])?; // unsignaled
        let wc = next_completion(&client.cq).await?;
        let mut echo = vec![0; wc.byte_len as usize];
        client.mr.read(SLOT, &mut echo)?;
        println!("echo: {}", String::from_utf8(echo)?);
    }
    server.await??;
    Ok(())
}
