//! `portverbs cmtime`: librdmacm's cmtime, the connection-setup benchmark: `-c` connections
//! made through the connection manager, each step timed per connection and over all of
//! them, and printed as cmtime's table ([`report`]).
//!
//! As rdma-core's cmtime does, every step is started for all connections at once: all
//! endpoints are created and resolved, all QPs created, then all connects started, and the
//! outcomes collected as they come (at most `-w` connects in flight; all of them by
//! default), and the same for the disconnects. One thread drives everything without
//! blocking ([`sides`]); the CM paces what it puts on the wire itself.
//!
//! Modes: with neither `-L` nor `-s`, both ends run in this process, on two devices of the
//! embedded fabric, driven by the same thread. `-L` is a server in this process (bound to
//! `-b`'s address, or any address of the first device other processes can reach) that
//! accepts `-c` connections, answers their disconnects, prints its table and exits; `-s
//! ADDR` is a client of such a server in another process (over the UDP device, for one).
//!
//! Portverbs' CM moves the QP through INIT, RTR and RTS itself while it connects, so the
//! steps cmtime times apart (`init qp attr` … `rts qp`) are inside `cm connect` here and
//! print as 0; `bind addr` and `resolve route` take no time on RoCEv2 (the route is the
//! device's port) and are timed anyway. `--stats` adds, on stderr, the CM's table bytes per
//! connection held and the process's resident memory growth, measured while every
//! connection is up.

pub(crate) mod report;
pub(crate) mod sides;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use portverbs::AnyDevice;
use portverbs::cm::service::{CmDevice, Connector};

use crate::cmdev::{cm_device, device_of, reachable_device};
use crate::error::{CliError, Context as _};
use crate::verbs;
use report::{Step, Timings};
use sides::{Await, Client, Server, micros, pd_cq, rc_qp};

/// cmtime's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(
    disable_version_flag = true,
    about = "cmtime (librdmacm's example): how long each step of connection setup and teardown takes",
    long_about = "cmtime (librdmacm's example): -c connections set up and torn down through the \
connection manager, every step started for all connections at once and timed per connection \
and over all of them, printed in cmtime's table (microseconds).\n\nWith neither -L nor -s, both \
ends run in this process on two devices of the embedded fabric, driven by one thread. -L: a \
server that accepts -c connections on -b's address (or a reachable device's), then exits. -s: \
a client of that server in another process."
)]
pub(crate) struct CmtimeArgs {
    /// Connections
    #[arg(short = 'c', default_value_t = 100)]
    connections: usize,
    /// Port of the listener
    #[arg(short = 'p', default_value_t = 7471)]
    port: u16,
    /// Run as the listening server
    #[arg(short = 'L', conflicts_with = "server")]
    listen: bool,
    /// The server's address (run as its client)
    #[arg(short = 's', value_name = "ADDR")]
    server: Option<IpAddr>,
    /// The address to bind (picks the device)
    #[arg(short = 'b', value_name = "ADDR")]
    bind: Option<IpAddr>,
    /// Connects (and disconnects) in flight at once (default: all)
    #[arg(short = 'w', long = "window")]
    window: Option<usize>,
    /// Also print, on stderr, the CM's bytes per connection and the memory growth
    #[arg(long = "stats")]
    stats: bool,
    /// Client device of the in-process run (default: the first device; the listener uses
    /// another one)
    #[arg(long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Seconds a step may go without any connection completing before the run fails naming
    /// the peer (default: 30 s plus 0.1 ms per connection)
    #[arg(long = "timeout", value_name = "SECS")]
    timeout: Option<u64>,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

/// The resident set of this process in bytes, where the OS says (Linux).
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The CM on the device that owns `bind`, or on the first device other processes reach.
fn reachable_cm(bind: Option<IpAddr>) -> Result<CmDevice<AnyDevice>, CliError> {
    let dev = match bind {
        Some(ip) => device_of(ip).map_err(|e| CliError::Failed(e.to_string()))?,
        None => reachable_device()?,
    };
    cm_device(dev)
}

/// How long a step may go without any progress before the run fails: `--timeout`, else 30 s
/// plus 0.1 ms per connection (a step of many connections sets them up in turns).
fn stall_limit(args: &CmtimeArgs) -> Duration {
    args.timeout.map_or_else(
        || Duration::from_secs(30) + Duration::from_millis(args.connections as u64 / 10),
        Duration::from_secs,
    )
}

/// Lets the CPU go while nothing happens: a few yields first (a connection rate is being
/// measured), then short sleeps (the CM offers no wait for "any of these connections", and a
/// peer that stopped must not cost a whole core until the deadline).
pub(crate) fn idle_pause(idle: Duration) {
    if idle < Duration::from_millis(1) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `portverbs cmtime`.
pub(crate) fn run(args: &CmtimeArgs) -> Result<String, CliError> {
    let n = args.connections;
    if n == 0 {
        return Err(CliError::usage("cmtime needs at least one connection (-c)"));
    }
    if args.window == Some(0) {
        return Err(CliError::usage("the window (-w) must be at least 1"));
    }
    if args.listen {
        return run_server(args);
    }
    if args.bind.is_some() && args.server.is_none() {
        return Err(CliError::usage(
            "-b picks the device of a server (-L) or a client (-s); the in-process run \
             uses two devices of the embedded fabric",
        ));
    }
    let (client, server, dst) = match args.server {
        Some(ip) => (
            reachable_cm(args.bind)?,
            None,
            SocketAddr::new(ip, args.port),
        ),
        None => {
            let (client_dev, server_dev) = verbs::pick_devices(args.device.as_deref())?;
            if !verbs::in_process(&client_dev) || !verbs::in_process(&server_dev) {
                return Err(CliError::usage(
                    "without -s or -L, cmtime runs both ends in this process, on devices of \
                     the embedded fabric",
                ));
            }
            let server_cm = cm_device(server_dev)?;
            let client_cm = cm_device(client_dev)?;
            let dst = SocketAddr::new(server_cm.local_ip(), args.port);
            let server = Server::new(server_cm, dst, n)?;
            (client_cm, Some(server), dst)
        }
    };
    run_client(args, client, server, dst)
}

fn run_client(
    args: &CmtimeArgs,
    cm: CmDevice<AnyDevice>,
    mut server: Option<Server>,
    dst: SocketAddr,
) -> Result<String, CliError> {
    let n = args.connections;
    let window = args.window.unwrap_or(n);
    let rss0 = rss_bytes();
    let (pd, cq) = pd_cq(&cm)?;
    let mut client = Client::new(cm.clone());
    let mut t = Timings::new(n);
    let t0 = Instant::now();
    let at = |i: Instant| micros(t0, i);
    // Each step for every connection in turn, the wall span of the step over all of them.
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
    let full = Instant::now();
    let mut ids = Vec::with_capacity(n);
    step(Step::CreateId, &mut t, &mut |_| {
        ids.push(Connector::new(&cm).ctx("rdma_create_id")?);
        Ok(())
    })?;
    // Binding is implicit on RoCEv2 (the device's address).
    step(Step::Bind, &mut t, &mut |_| Ok(()))?;
    step(Step::ResolveAddr, &mut t, &mut |i| {
        ids[i].resolve_blocking(dst).ctx("rdma_resolve_addr")
    })?;
    step(Step::ResolveRoute, &mut t, &mut |_| Ok(()))?;
    for id in ids {
        client.push(id);
    }
    let mut qps = Vec::with_capacity(n);
    step(Step::CreateQp, &mut t, &mut |_| {
        qps.push(rc_qp(&pd, &cq)?);
        Ok(())
    })?;
    if let Some(s) = server.as_mut() {
        // The listener in this process makes its QPs now too, outside `cm connect`.
        s.pool_qps(n)?;
    }
    client.qps = qps;
    let limit = stall_limit(args);
    let peer = dst.to_string();
    let start = Instant::now();
    client
        .run_step(
            Await::Connect,
            window,
            server.as_mut(),
            t0,
            &mut |i, a, b| t.conn(i, Step::Connect, (a, b)),
            limit,
        )
        .map_err(|e| e.with_peer(&peer))?;
    let end = Instant::now();
    t.wall(Step::Connect, (at(start), at(end)));
    for i in 0..n {
        t.conn(i, Step::FullConnect, (at(full), at(end)));
    }
    t.wall(Step::FullConnect, (at(full), at(end)));
    if args.stats {
        let client_bytes = client.cm.state_bytes() / n;
        let server_bytes = server.as_ref().map(Server::state_per_conn);
        let rss = rss_bytes().zip(rss0).map(|(b, a)| b.saturating_sub(a));
        eprintln!(
            "connections/s   {:.0}",
            n as f64 / end.duration_since(start).as_secs_f64()
        );
        eprintln!("cm bytes/conn   {client_bytes} (client)");
        if let Some(b) = server_bytes {
            eprintln!("cm bytes/conn   {b} (server)");
        }
        let retransmits =
            client.cm.stats().retransmits + server.as_ref().map_or(0, |s| s.cm.stats().retransmits);
        let paced =
            client.cm.mad_counts().paced + server.as_ref().map_or(0, |s| s.cm.mad_counts().paced);
        eprintln!("cm retransmits  {retransmits}");
        eprintln!("mads paced      {paced}");
        if let Some(r) = rss {
            let ends = if server.is_some() {
                "both ends"
            } else {
                "client"
            };
            eprintln!("rss bytes/conn  {} ({ends}, QPs included)", r / n as u64);
        }
    }
    let start = Instant::now();
    client
        .run_step(
            Await::Disconnect,
            window,
            server.as_mut(),
            t0,
            &mut |i, a, b| t.conn(i, Step::Disconnect, (a, b)),
            limit,
        )
        .map_err(|e| e.with_peer(&peer))?;
    t.wall(Step::Disconnect, (at(start), at(Instant::now())));
    let mut qps = std::mem::take(&mut client.qps).into_iter();
    step(Step::DestroyQp, &mut t, &mut |_| {
        drop(qps.next());
        Ok(())
    })?;
    let mut ids = std::mem::take(&mut client.ids).into_iter();
    step(Step::DestroyId, &mut t, &mut |_| {
        drop(ids.next());
        Ok(())
    })?;
    // The last DREPs and REJs leave before this process does.
    cm.flush(Duration::from_secs(5)).ctx("flushing the CM")?;
    if let Some(s) = &server {
        s.cm.flush(Duration::from_secs(5)).ctx("flushing the CM")?;
    }
    Ok(t.render(true, 1))
}

/// `-L`: accepts `-c` connections, answers their disconnects, and prints the server's
/// table (create qp, cm connect: accept → RTU, disconnect: DREQ → DREP).
fn run_server(args: &CmtimeArgs) -> Result<String, CliError> {
    let n = args.connections;
    let cm = reachable_cm(args.bind)?;
    crate::cmdev::reachable_server(
        cm.context().device(),
        ", or run cmtime without -L and -s: both ends here",
    )?;
    let ip = args.bind.unwrap_or_else(|| cm.local_ip());
    let mut server = Server::new(cm, SocketAddr::new(ip, args.port), n)?;
    // On stderr, so that the table alone is on stdout: a script (or a test) starts the client
    // once it has seen this line.
    eprintln!("cmtime: listening on {}", SocketAddr::new(ip, args.port));
    let t0 = Instant::now();
    // The client may take a while to start: no limit until the first request.
    let mut last: Option<Instant> = None;
    let limit = stall_limit(args);
    let mut idle_since = Instant::now();
    while server.disconnected < n {
        server.cm.progress().ctx("driving the server's CM")?;
        if server.step(t0)? {
            last = Some(Instant::now());
            idle_since = Instant::now();
        } else if last.is_some_and(|l| l.elapsed() > limit) {
            let e = CliError::Failed(format!(
                "{} of {n} connections were not set up and torn down within {limit:?}",
                n - server.disconnected
            ));
            return Err(match server.peer {
                Some(p) => e.with_peer(&p.to_string()),
                None => e,
            });
        } else {
            idle_pause(idle_since.elapsed());
        }
    }
    server
        .cm
        .flush(Duration::from_secs(5))
        .ctx("flushing the CM")?;
    let mut t = Timings::new(n);
    for (step, spans) in [
        (Step::Connect, &server.connect_spans),
        (Step::Disconnect, &server.disconnect_spans),
    ] {
        for (i, &s) in spans.iter().enumerate() {
            t.conn(i, step, s);
        }
        let first = spans.iter().map(|s| s.0).min().unwrap_or(0);
        let last = spans.iter().map(|s| s.1).max().unwrap_or(0);
        t.wall(step, (first, last));
    }
    Ok(t.render(true, 1))
}
