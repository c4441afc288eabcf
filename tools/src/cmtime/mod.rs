//! `portverbs cmtime`: librdmacm's cmtime, the connection-setup benchmark, on the embedded
//! fabric: `-c` connections made through the connection manager between two in-process
//! devices (a listener thread on one accepting every request, the client on the other),
//! each step timed per connection and over all of them, and printed as cmtime's table
//! ([`report`]).
//!
//! Portverbs' CM moves the QP through INIT, RTR and RTS itself while it connects, so the
//! steps cmtime times apart (`init qp attr` … `rts qp`) are inside `cm connect` here and
//! print as 0; `bind addr` and `resolve route` take no time on RoCEv2 (the route is the
//! device's port) and are timed anyway.

pub(crate) mod report;

use std::time::{Duration, Instant};

use portverbs::AnyDevice;
use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener};
use portverbs::prelude::*;

use crate::error::{CliError, Context as _};
use crate::verbs;
use report::{Step, Timings};

/// cmtime's flags that apply to one process.
#[derive(Debug, Clone, clap::Args)]
#[command(
    disable_version_flag = true,
    about = "cmtime (librdmacm's example): how long each step of connection setup and teardown takes",
    long_about = "cmtime (librdmacm's example): -c connections set up and torn down through the \
connection manager, every step timed per connection and over all of them, printed in cmtime's \
table (microseconds). Both ends run in this process on two devices of the embedded fabric: a \
listener thread accepts every request; the client connects them one after another."
)]
pub(crate) struct CmtimeArgs {
    /// Connections
    #[arg(short = 'c', default_value_t = 100)]
    connections: usize,
    /// Port of the listener
    #[arg(short = 'p', default_value_t = 7471)]
    port: u16,
    /// Client device (default: the first device; the listener uses another one)
    #[arg(long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
}

fn micros(start: Instant, t: Instant) -> u64 {
    t.duration_since(start).as_micros() as u64
}

fn cm_device(dev: AnyDevice) -> Result<CmDevice<AnyDevice>, CliError> {
    let ctx = verbs::open(dev)?;
    let ip = ctx
        .gid_table_blocking(1)
        .ctx("reading the GID table")?
        .first()
        .map(|(_, e)| e.gid.to_ip())
        .ok_or_else(|| CliError::Failed(format!("{} has no GID", ctx.name())))?;
    CmDevice::open_blocking(&ctx, ip).ctx(format_args!("opening the CM on {}", ctx.name()))
}

/// An RC QP with one of everything (cmtime's), on its own CQ.
fn rc_qp(pd: &Pd, cq: &Cq) -> Result<Qp, CliError> {
    let mut init = QpInit::new(QpType::Rc, cq);
    init.caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    pd.create_qp_blocking(init).ctx("ibv_create_qp")
}

/// The listener: accepts `n` requests on QPs of its own, then waits for each to be
/// disconnected and tears it down.
fn listen(
    cm: &CmDevice<AnyDevice>,
    listener: &Listener<AnyDevice>,
    n: usize,
) -> Result<(), CliError> {
    let ctx = cm.context();
    let pd = ctx.alloc_pd_blocking().ctx("ibv_alloc_pd")?;
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 16,
            ..CqInit::default()
        })
        .ctx("ibv_create_cq")?;
    let wait = Some(Duration::from_secs(30));
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let req = listener
            .get_request_blocking(wait)
            .ctx("waiting for a connection request")?;
        let qp = rc_qp(&pd, &cq)?;
        let conn = req
            .accept_blocking(&qp, &ConnParam::default())
            .ctx("rdma_accept")?;
        conns.push((conn, qp));
    }
    // Answer each DREQ as it arrives, in whatever order (cmtime's server does the same from
    // its event channel): a listener that waited for them in connection order would leave
    // the others unanswered, their DREQs retransmitted, and the storm would swamp QP1.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !conns.is_empty() {
        let before = conns.len();
        conns.retain(
            |(conn, qp)| match conn.notify_disconnect_blocking(Some(Duration::ZERO)) {
                Ok(()) => {
                    let _ = conn.disconnect(qp);
                    false
                }
                Err(_) => true,
            },
        );
        if conns.len() == before {
            if std::time::Instant::now() > deadline {
                return Err(CliError::Failed(format!(
                    "{} connections were never disconnected by the client",
                    conns.len()
                )));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    Ok(())
}

/// `portverbs cmtime`.
pub(crate) fn run(args: &CmtimeArgs) -> Result<String, CliError> {
    let n = args.connections;
    if n == 0 {
        return Err(CliError::usage("cmtime needs at least one connection (-c)"));
    }
    let (client_dev, server_dev) = verbs::pick_devices(args.device.as_deref())?;
    if !verbs::in_process(&client_dev) || !verbs::in_process(&server_dev) {
        return Err(CliError::usage(
            "cmtime runs both ends in this process, on devices of the embedded fabric",
        ));
    }
    let server = cm_device(server_dev)?;
    let client = cm_device(client_dev)?;
    let dst = std::net::SocketAddr::new(server.local_ip(), args.port);
    let mut listener = Listener::bind(&server, dst).ctx("rdma_bind_addr")?;
    listener.listen(n).ctx("rdma_listen")?;
    let ctx = client.context();
    let pd = ctx.alloc_pd_blocking().ctx("ibv_alloc_pd")?;
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 16,
            ..CqInit::default()
        })
        .ctx("ibv_create_cq")?;
    let mut t = Timings::new(n);
    let t0 = Instant::now();
    let at = |i: Instant| micros(t0, i);
    std::thread::scope(|s| {
        let passive = s.spawn(|| listen(&server, &listener, n));
        let r = (|| {
            // Each step for every connection, the wall span of the step over all of them.
            let step = |step: Step,
                        t: &mut Timings,
                        f: &mut dyn FnMut(usize) -> Result<(), CliError>|
             -> Result<(), CliError> {
                let start = Instant::now();
                for i in 0..n {
                    let a = Instant::now();
                    f(i)?;
                    t.conn(i, step, (at(a), at(Instant::now())));
                }
                t.wall(step, (at(start), at(Instant::now())));
                Ok(())
            };
            let mut ids: Vec<Connector<AnyDevice>> = Vec::with_capacity(n);
            let full = Instant::now();
            step(Step::CreateId, &mut t, &mut |_| {
                ids.push(Connector::new(&client).ctx("rdma_create_id")?);
                Ok(())
            })?;
            // Binding is implicit on RoCEv2 (the device's address).
            step(Step::Bind, &mut t, &mut |_| Ok(()))?;
            step(Step::ResolveAddr, &mut t, &mut |i| {
                ids[i].resolve_blocking(dst).ctx("rdma_resolve_addr")
            })?;
            step(Step::ResolveRoute, &mut t, &mut |_| Ok(()))?;
            let mut qps: Vec<Qp> = Vec::with_capacity(n);
            step(Step::CreateQp, &mut t, &mut |_| {
                qps.push(rc_qp(&pd, &cq)?);
                Ok(())
            })?;
            step(Step::Connect, &mut t, &mut |i| {
                ids[i]
                    .connect_blocking(&qps[i], &ConnParam::default())
                    .map(|_| ())
                    .ctx("rdma_connect")
            })?;
            for i in 0..n {
                let (a, b) = (at(full), at(Instant::now()));
                t.conn(i, Step::FullConnect, (a, b));
            }
            t.wall(Step::FullConnect, (at(full), at(Instant::now())));
            step(Step::Disconnect, &mut t, &mut |i| {
                ids[i].disconnect(&qps[i]).ctx("rdma_disconnect")
            })?;
            // Every disconnect ends (the listener's DREP, or the DREQ's retries) before the
            // endpoints go: a DREQ lost in a burst larger than the listener's QP1 receive
            // queue is sent again only by an endpoint that still exists.
            for id in &ids {
                id.notify_disconnect_blocking(Some(Duration::from_secs(60)))
                    .ctx("waiting for the end of a disconnect")?;
            }
            let mut qps = qps.into_iter();
            step(Step::DestroyQp, &mut t, &mut |_| {
                drop(qps.next());
                Ok(())
            })?;
            let mut ids = ids.into_iter();
            step(Step::DestroyId, &mut t, &mut |_| {
                drop(ids.next());
                Ok(())
            })?;
            Ok::<_, CliError>(())
        })();
        // This layer has no thread: the client's device answers (and sends what its
        // disconnects queued beyond QP1's send queue) only while someone calls it.
        while !passive.is_finished() {
            if let Err(e) = client.progress() {
                return Err(CliError::Failed(format!("driving the client's CM: {e}")));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let passive = passive
            .join()
            .map_err(|_| CliError::Failed("the listener thread panicked".into()))?;
        CliError::merge(r, passive)
    })?;
    Ok(t.render(true, 1))
}
