//! `portverbs rping`: librdmacm's rping. The connection manager (`portverbs::cm`)
//! connects an RC QP — the server listens on `-a`'s address and port `-p` (7174), the
//! client resolves and connects to it — and the ping loop ([`engine`]) runs over it with
//! rping's own buffer formats (`portverbs::oob::rping`), so either end can be the C tool: a
//! Portverbs server under `rping -c`, a Portverbs client against `rping -s`.
//!
//! Modes, as the other subcommands have them: `-s` a server, `-c` a client; with neither, on
//! a device of the embedded in-process fabric, both ends in this process (a server thread on
//! another device) and the client's lines printed.

pub(crate) mod engine;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use portverbs::AnyDevice;
use portverbs::cm::service::{
    CmDevice, ConnParam, ConnectionRequest, Connector, Listener, ServiceError,
};
use portverbs::oob::rping as proto;
use portverbs::prelude::*;

use crate::cmdev::{self, cm_device};
use crate::error::{CliError, Context as _};
use crate::events::{EventChannel, SLICE};
use crate::verbs;
use crate::wait::{DEFAULT_TIMEOUT, timeout_arg};
use engine::{CAPS, Link, Rping, Step};

/// rping's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(
    disable_version_flag = true,
    about = "rping (librdmacm's example): RC pings connected through the connection manager",
    long_about = "rping (librdmacm's example), with its flags and output: a client \
advertises a buffer, the server RDMA READs it, the client advertises its sink, the server \
RDMA WRITEs the ping back. The connection is made by Portverbs' connection manager (IB CM \
over QP1, rdma_cm addressing on the RDMA_PS_TCP port space), so either end can be rping \
itself.\n\nWith -s: a server on -a's address (any address of the device without -a). With \
-c: a client of the server at -a. With neither, on a device of the embedded in-process \
fabric: both ends in this process."
)]
pub(crate) struct RpingArgs {
    /// Server side
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Client side
    #[arg(short = 'c')]
    client: bool,
    /// Address: the server's to bind (default: any of the device), the client's to connect to
    #[arg(short = 'a', value_name = "ADDR")]
    addr: Option<IpAddr>,
    /// Source address the client binds to (picks the device)
    #[arg(short = 'I', value_name = "ADDR")]
    source: Option<IpAddr>,
    /// Port
    #[arg(short = 'p', default_value_t = proto::DEFAULT_PORT)]
    port: u16,
    /// Ping data size
    #[arg(short = 'S', default_value_t = proto::DEFAULT_SIZE)]
    size: usize,
    /// Ping count (0: until interrupted)
    #[arg(short = 'C', default_value_t = 0)]
    count: u64,
    /// Display ping data to stdout
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate ping data
    #[arg(short = 'V')]
    validate: bool,
    /// Debug output: the CM events, on stderr
    #[arg(short = 'd')]
    debug: bool,
    /// Persistent server: serve every client that comes, each on a thread of its own (a
    /// connection that fails is reported and the server goes on)
    #[arg(short = 'P')]
    persistent: bool,
    /// Self-created QP: accepted for rping's command lines; Portverbs always creates the QP
    /// itself and the CM moves it through INIT, RTR and RTS, so nothing changes on the wire
    #[arg(short = 'q')]
    self_create_qp: bool,
    /// Device (default: the one that owns the address)
    #[arg(long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Seconds a connected peer may stay silent (no completion, no disconnect) before this
    /// side gives up and fails naming it (0: wait for ever, as rping does). A server waits for
    /// its clients' connection requests without limit
    #[arg(long = "timeout", value_name = "SECS", default_value_t = DEFAULT_TIMEOUT.as_secs())]
    timeout: u64,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

/// One side's verbs objects and CM endpoint.
struct Conn {
    rping: Rping,
    cq: Cq,
    qp: Qp,
    /// The CQ's completion channel, which the waits sleep in (rping's own `cq_thread` does).
    channel: EventChannel,
}

fn make_side(ctx: &Context, size: usize, client: bool) -> Result<Conn, CliError> {
    let pd = ctx.alloc_pd_blocking().ctx("ibv_alloc_pd failed")?;
    let channel = EventChannel::new(ctx)?;
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 2 * CAPS.max_send_wr,
            comp_vector: 0,
            channel: Some(channel.channel()),
        })
        .ctx("ibv_create_cq failed")?;
    let qp = pd
        .create_qp_blocking(QpInit {
            caps: CAPS,
            ..QpInit::new(QpType::Rc, &cq)
        })
        .ctx("rdma_create_qp")?;
    // INIT with rdma_cm's access for RC (remote READ and WRITE: the server reads the
    // client's source and writes its sink), so that the receive is posted before the peer's
    // first SEND can arrive; the CM takes the QP on from INIT.
    let opts = ConnectOptions {
        port: 1,
        access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        ..ConnectOptions::default()
    };
    verbs::init(&qp, &opts)?;
    let rping = Rping::new(&pd, qp.clone(), size, client)?;
    rping.post_recv()?;
    Ok(Conn {
        rping,
        cq,
        qp,
        channel,
    })
}

/// rping's words for a failed connect.
fn connect_error(e: ServiceError) -> CliError {
    match e {
        ServiceError::Rejected { reason, .. } => CliError::Failed(format!(
            "cma event RDMA_CM_EVENT_REJECTED, error {}",
            reason.to_u16()
        )),
        ServiceError::Unreachable => {
            CliError::Failed("cma event RDMA_CM_EVENT_UNREACHABLE, error -110".into())
        }
        other => CliError::Failed(format!("rdma_connect: {other}")),
    }
}

/// Completions of the QP's CQ, and the disconnect from the CM. Between its looks at both it
/// sleeps in the CQ's completion channel; a peer silent for `limit` (it may have died without
/// a DREQ: a killed process sends none) ends the wait with an error.
struct CmLink<'a> {
    cq: &'a Cq,
    channel: &'a EventChannel,
    conn: &'a Connector<AnyDevice>,
    limit: Option<Duration>,
}

impl CmLink<'_> {
    fn poll(&self) -> Result<Option<WorkCompletion>, CliError> {
        let mut wc = [WorkCompletion::default()];
        let n = self
            .cq
            .poll(&mut wc)
            .map_err(|e| CliError::Failed(format!("ibv_poll_cq: {e}")))?;
        Ok((n == 1).then_some(wc[0]))
    }
}

impl Link for CmLink<'_> {
    fn next(&mut self) -> Result<Step, CliError> {
        let since = Instant::now();
        loop {
            if let Some(wc) = self.poll()? {
                return Ok(Step::Completion(wc));
            }
            match self.conn.notify_disconnect_blocking(Some(Duration::ZERO)) {
                Ok(()) => return Ok(Step::Disconnected),
                Err(ServiceError::TimedOut) => {}
                Err(e) => return Err(CliError::Failed(format!("rdma_get_cm_event: {e}"))),
            }
            if let Some(limit) = self.limit {
                if since.elapsed() >= limit {
                    return Err(CliError::Failed(format!(
                        "no completion and no disconnect for {} s: the peer stopped \
                         responding (--timeout)",
                        limit.as_secs_f64()
                    )));
                }
            }
            // Arm, look once more (a completion that came before the arm raises no event),
            // then sleep until one comes or it is time to look at the CM again.
            self.cq.req_notify(false);
            if let Some(wc) = self.poll()? {
                return Ok(Step::Completion(wc));
            }
            self.channel.sleep(SLICE)?;
        }
    }
}

fn debug(on: bool, what: impl std::fmt::Display) {
    if on {
        eprintln!("{what}");
    }
}

/// Clients a persistent server (`-P`) serves at once; the next request waits in the
/// listener's backlog until one of them is done.
const MAX_CLIENTS: usize = 16;

/// The server: listens, and serves one client; with `-P` every client, each on a thread of
/// its own as librdmacm's rping does, so that a connection that fails or hangs (a client that
/// vanished mid-connect, a forged request whose REP nobody answers) is logged and the next
/// client is served meanwhile. `listening` is called once the listener is up; a request is
/// awaited for `wait_for_client` (None: as long as it takes, as rping does).
fn serve(
    args: &RpingArgs,
    cm: &CmDevice<AnyDevice>,
    wait_for_client: Option<Duration>,
    listening: &dyn Fn(),
    out: &mut (dyn std::io::Write + Send),
) -> Result<(), CliError> {
    let ip = args.addr.unwrap_or(if cm.local_ip().is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    });
    let mut listener = Listener::bind(cm, SocketAddr::new(ip, args.port)).ctx("rdma_bind_addr")?;
    listener.listen(3).ctx("rdma_listen")?;
    listening();
    debug(
        args.debug,
        format_args!("rdma_listen on {}", listener.local_addr()),
    );
    let next = |listener: &Listener<AnyDevice>| {
        let req = listener
            .get_request_blocking(wait_for_client)
            .ctx("waiting for a connection request")?;
        debug(
            args.debug,
            format_args!(
                "cma_event type RDMA_CM_EVENT_CONNECT_REQUEST from {}",
                req.remote_addr()
            ),
        );
        Ok::<_, CliError>(req)
    };
    if !args.persistent {
        return serve_one(args, cm, next(&listener)?, out);
    }
    let out = std::sync::Mutex::new(out);
    std::thread::scope(|s| {
        let mut running = std::collections::VecDeque::new();
        loop {
            running.retain(|t: &std::thread::ScopedJoinHandle<'_, ()>| !t.is_finished());
            while running.len() >= MAX_CLIENTS {
                if let Some(t) = running.pop_front() {
                    let _ = t.join();
                }
            }
            let req = next(&listener)?;
            let (remote, out) = (req.remote_addr(), &out);
            running.push_back(s.spawn(move || {
                if let Err(e) = serve_one(args, cm, req, &mut Shared(out)) {
                    eprintln!("rping: the connection from {remote} failed: {e}");
                }
            }));
        }
    })
}

/// One writer for the connections of a persistent server: each write takes it whole.
struct Shared<'a, 'w>(&'a std::sync::Mutex<&'w mut (dyn std::io::Write + Send)>);

impl std::io::Write for Shared<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut w = self.0.lock().unwrap_or_else(|e| e.into_inner());
        w.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}

/// Accepts `req` and serves its client until it disconnects.
fn serve_one(
    args: &RpingArgs,
    cm: &CmDevice<AnyDevice>,
    req: ConnectionRequest<AnyDevice>,
    out: &mut dyn std::io::Write,
) -> Result<(), CliError> {
    let client = req.remote_addr().to_string();
    let side = make_side(cm.context(), args.size, false)?;
    let conn = req
        .accept_blocking(&side.qp, &ConnParam::default())
        .map_err(|e| connect_error(e).with_peer(&client))?;
    debug(args.debug, "cma_event type RDMA_CM_EVENT_ESTABLISHED");
    let mut link = CmLink {
        cq: &side.cq,
        channel: &side.channel,
        conn: &conn,
        limit: timeout_arg(args.timeout),
    };
    let served = side
        .rping
        .serve(&mut link, args.verbose, out)
        .map_err(|e| e.with_peer(&client));
    eprintln!("server DISCONNECT EVENT...");
    // rping disconnects its side too; the peer's DREQ may have ended it already.
    if let Err(e) = conn.disconnect(&side.qp) {
        debug(
            args.debug,
            format_args!("rdma_disconnect: {e} (CM state {:?})", conn.cm_state()),
        );
    }
    // The DREP must leave before this process does (nothing of ours sends it after that).
    drop(conn);
    if !cm.flush(Duration::from_secs(1)).unwrap_or(false) {
        debug(args.debug, "QP1 still had MADs to send after 1 s");
    }
    served.map(|_| ())
}

/// The client: resolves, connects, pings, disconnects.
fn ping(
    args: &RpingArgs,
    cm: &CmDevice<AnyDevice>,
    dst: IpAddr,
    out: &mut dyn std::io::Write,
) -> Result<u64, CliError> {
    let server = SocketAddr::new(dst, args.port);
    let peer = server.to_string();
    let mut conn = Connector::new(cm).ctx("rdma_create_id")?;
    conn.resolve_blocking(server)
        .ctx("rdma_resolve_addr")
        .map_err(|e| e.with_peer(&peer))?;
    debug(args.debug, "cma_event type RDMA_CM_EVENT_ADDR_RESOLVED");
    debug(args.debug, "cma_event type RDMA_CM_EVENT_ROUTE_RESOLVED");
    let side = make_side(cm.context(), args.size, true)?;
    conn.connect_blocking(&side.qp, &ConnParam::default())
        .map_err(|e| connect_error(e).with_peer(&peer))?;
    debug(args.debug, "cma_event type RDMA_CM_EVENT_ESTABLISHED");
    let mut link = CmLink {
        cq: &side.cq,
        channel: &side.channel,
        conn: &conn,
        limit: timeout_arg(args.timeout),
    };
    let pinged = side
        .rping
        .ping(&mut link, args.count, args.verbose, args.validate, out)
        .map_err(|e| e.with_peer(&peer));
    let _ = conn.disconnect(&side.qp);
    // The end of our disconnect: the server's DREP. rping's client does not wait for it (its
    // kernel's CM retries the DREQ after the process is gone); this layer has no thread
    // that outlives the process, so it lingers a little for the DREP.
    match conn.notify_disconnect_blocking(Some(Duration::from_secs(2))) {
        Ok(()) => eprintln!("client DISCONNECT EVENT..."),
        Err(e) => debug(
            args.debug,
            format_args!(
                "no DISCONNECTED event: {e} (CM state {:?})",
                conn.cm_state()
            ),
        ),
    }
    drop(conn);
    if !cm.flush(Duration::from_secs(1)).unwrap_or(false) {
        debug(args.debug, "QP1 still had MADs to send after 1 s");
    }
    pinged
}

/// Checks `-S` as rping does.
fn check_size(size: usize) -> Result<(), CliError> {
    if (proto::MIN_SIZE..=proto::MAX_SIZE).contains(&size) {
        Ok(())
    } else {
        Err(CliError::usage(format_args!(
            "Invalid size {size} (valid range is {} to {})",
            proto::MIN_SIZE,
            proto::MAX_SIZE + 1
        )))
    }
}

/// `portverbs rping`.
pub(crate) fn run(args: &RpingArgs) -> Result<(), CliError> {
    check_size(args.size)?;
    if args.server {
        let dev = cmdev::server_device(args.device.as_deref(), args.addr)?;
        cmdev::reachable_server(&dev, ", or run rping without -s and -c: both ends here")?;
        // Not locked: a persistent server's connections write from threads of their own.
        return serve(args, &cm_device(dev)?, None, &|| {}, &mut std::io::stdout());
    }
    let dst = args.addr;
    let dev = cmdev::client_device(args.device.as_deref(), args.source, dst)?;
    if args.client {
        let dst = dst.ok_or_else(|| CliError::usage("rping -c needs the server's address (-a)"))?;
        ping(args, &cm_device(dev)?, dst, &mut std::io::stdout().lock())?;
        return Ok(());
    }
    if !verbs::in_process(&dev) {
        return Err(CliError::usage(
            "rping needs -s (server) or -c (client); both ends in one process only on the embedded fabric",
        ));
    }
    in_process(args, dev, &mut std::io::stdout().lock())
}

/// Both ends in this process: a server thread on another in-process device, the client on
/// `dev`.
fn in_process(
    args: &RpingArgs,
    dev: AnyDevice,
    out: &mut dyn std::io::Write,
) -> Result<(), CliError> {
    let (client_dev, server_dev) = verbs::pick_devices(Some(&dev.info().name.clone()))?;
    let server_cm = cm_device(server_dev)?;
    let client_cm = cm_device(client_dev)?;
    let server_ip = server_cm.local_ip();
    let server_args = RpingArgs {
        addr: Some(server_ip),
        verbose: false,
        persistent: false,
        ..args.clone()
    };
    // The server says when it listens; if it fails first, its end of the channel goes away.
    let (up, listening) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let server = s.spawn(move || {
            // The client is this process: if it fails before connecting, the server gives up.
            let wait = Some(Duration::from_secs(20));
            let say = || {
                let _ = up.send(());
            };
            serve(&server_args, &server_cm, wait, &say, &mut std::io::sink())
        });
        if listening.recv().is_err() {
            return server
                .join()
                .map_err(|_| CliError::Failed("the server thread panicked".into()))?;
        }
        let pinged = ping(args, &client_cm, server_ip, out);
        let served = server
            .join()
            .map_err(|_| CliError::Failed("the server thread panicked".into()))?;
        CliError::merge(pinged, served).map(|_| ())
    })?;
    let _ = out.flush();
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use portverbs::oob::rping as proto;
    use portverbs::prelude::*;

    use super::check_size;
    use super::engine::{CAPS, Link, Rping, Step, c_str};
    use crate::error::CliError;
    use crate::verbs;

    /// Polls a CQ; the peer's "disconnect" is a flag (the CM's event in the real tool).
    struct PollLink<'a> {
        cq: Cq,
        disconnected: &'a AtomicBool,
        deadline: Instant,
    }

    impl Link for PollLink<'_> {
        fn next(&mut self) -> Result<Step, CliError> {
            loop {
                let mut wc = [WorkCompletion::default()];
                if self
                    .cq
                    .poll(&mut wc)
                    .map_err(|e| CliError::Failed(e.to_string()))?
                    == 1
                {
                    return Ok(Step::Completion(wc[0]));
                }
                if self.disconnected.load(Ordering::Acquire) {
                    return Ok(Step::Disconnected);
                }
                if Instant::now() > self.deadline {
                    return Err(CliError::Failed("no completion within 20 s".into()));
                }
                std::thread::yield_now();
            }
        }
    }

    struct Side {
        _ctx: Context,
        pd: Pd,
        cq: Cq,
        qp: Qp,
        opts: ConnectOptions,
        me: QpEndpoint,
    }

    fn side(name: &str) -> Side {
        let ctx = verbs::open(verbs::pick_device(Some(name)).unwrap()).unwrap();
        let port = verbs::port_info(&ctx, 1, None).unwrap();
        let pd = ctx.alloc_pd_blocking().unwrap();
        let cq = ctx
            .create_cq_blocking(CqInit {
                entries: 32,
                ..CqInit::default()
            })
            .unwrap();
        let qp = pd
            .create_qp_blocking(QpInit {
                caps: CAPS,
                ..QpInit::new(QpType::Rc, &cq)
            })
            .unwrap();
        let opts = ConnectOptions {
            access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            ..verbs::options(&port)
        };
        let me = verbs::endpoint(&port, &qp, verbs::random_psn());
        Side {
            _ctx: ctx,
            pd,
            cq,
            qp,
            opts: ConnectOptions {
                psn: me.psn,
                ..opts
            },
            me,
        }
    }

    /// A client on soft0 and a server on soft1, their QPs connected out of band; returns
    /// the client's and the server's results and output.
    fn run(
        client_size: usize,
        server_size: usize,
        count: u64,
    ) -> (Result<u64, CliError>, Result<u64, CliError>, String, String) {
        let _alone = crate::perf::DEVICE_TRAFFIC
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (c, s) = (side("soft0"), side("soft1"));
        verbs::connect(&c.qp, &s.me, &c.opts).unwrap();
        verbs::connect(&s.qp, &c.me, &s.opts).unwrap();
        let client = Rping::new(&c.pd, c.qp.clone(), client_size, true).unwrap();
        let server = Rping::new(&s.pd, s.qp.clone(), server_size, false).unwrap();
        client.post_recv().unwrap();
        server.post_recv().unwrap();
        // Each side's end reaches the other as a disconnect.
        let (client_done, server_done) = (AtomicBool::new(false), AtomicBool::new(false));
        let deadline = Instant::now() + Duration::from_secs(20);
        std::thread::scope(|scope| {
            let srv = scope.spawn(|| {
                let mut link = PollLink {
                    cq: s.cq.clone(),
                    disconnected: &client_done,
                    deadline,
                };
                let mut out = Vec::new();
                let r = server.serve(&mut link, true, &mut out);
                server_done.store(true, Ordering::Release);
                (r, String::from_utf8(out).unwrap())
            });
            let mut link = PollLink {
                cq: c.cq.clone(),
                disconnected: &server_done,
                deadline,
            };
            let mut out = Vec::new();
            let r = client.ping(&mut link, count, true, true, &mut out);
            client_done.store(true, Ordering::Release);
            let (sr, sout) = srv.join().unwrap();
            (r, sr, String::from_utf8(out).unwrap(), sout)
        })
    }

    #[test]
    fn pings_travel_and_come_back_as_rping_prints_them() {
        let (c, s, cout, sout) = run(64, 64, 3);
        assert_eq!(c.unwrap(), 3);
        assert_eq!(
            s.unwrap(),
            3,
            "the server echoed every ping, then saw the disconnect"
        );
        let mut expect = String::new();
        for n in 0..3 {
            let mut buf = vec![0u8; 64];
            proto::fill_ping(&mut buf, n);
            let text = String::from_utf8(c_str(&buf).to_vec()).unwrap();
            expect += &format!("ping data: {text}\n");
        }
        assert_eq!(cout, expect);
        assert_eq!(sout, expect.replace("ping data", "server ping data"));
        assert!(cout.starts_with(
            "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\n"
        ));
    }

    #[test]
    fn a_ping_larger_than_the_servers_buffer_is_refused_by_the_server() {
        let (_, s, _, _) = run(128, 64, 1);
        let e = s.unwrap_err();
        assert!(
            e.to_string().contains("larger than this server's 64"),
            "{e}"
        );
    }

    #[test]
    fn the_largest_ping_travels() {
        let (c, s, _, _) = run(proto::MAX_SIZE, proto::MAX_SIZE, 2);
        assert_eq!((c.unwrap(), s.unwrap()), (2, 2));
    }

    #[test]
    fn sizes_outside_rpings_range_are_refused() {
        assert!(check_size(proto::MIN_SIZE).is_ok());
        assert!(check_size(proto::MAX_SIZE).is_ok());
        let e = check_size(proto::MIN_SIZE - 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Invalid size 25 (valid range is 26 to 65536)"
        );
        assert!(check_size(proto::MAX_SIZE + 1).is_err());
    }
}
