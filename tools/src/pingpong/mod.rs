//! `portverbs pingpong`: `ibv_rc_pingpong`, one side in this process or both; and its
//! siblings `uc_pingpong`, `ud_pingpong` and `srq_pingpong` (`ibv_uc_pingpong`,
//! `ibv_ud_pingpong`, `ibv_srq_pingpong`), which run the same way.
//!
//! * With SERVERNAME: the client; it connects to SERVERNAME:PORT (a `portverbs` or C tool
//!   server) and the two exchange `LID:QPN:PSN:GID` messages.
//! * Without SERVERNAME, on a device other processes can reach (or with the hidden
//!   `--server`): the server; it listens on PORT of every address for one client.
//! * Without SERVERNAME on a device of the embedded in-process fabric: both sides here; a
//!   server thread listens on localhost (`-p`, 18515 by default, or an ephemeral port when
//!   that one is taken), the client connects to it, and the two exchange their messages over
//!   that real TCP connection before ping-ponging sends over the embedded fabric.
//!
//! Each side prints what its C tool prints (both sides in one process: the client's).

mod exchange;
mod session;
mod variants;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use portverbs::prelude::{Mtu, QpEndpoint};

use crate::error::CliError;
use crate::report::PingpongSide;
use crate::report::pingpong::{format_address, format_results, format_ud_local_address};
use crate::verbs;
use session::{PpConfig, PpSide, Variant};
pub(crate) use variants::{
    SrqPingpongArgs, UcPingpongArgs, UdPingpongArgs, run_srq, run_uc, run_ud,
};

/// The options every pingpong tool has.
#[derive(Debug, Args)]
pub(crate) struct Shared {
    /// TCP port of the address exchange (server: listen on it; client: connect to it).
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Device (default: the first device). In-process, the client's; the server uses the other
    /// one.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    device: Option<String>,
    /// Port of the device.
    #[arg(
        short = 'i',
        long = "ib-port",
        value_name = "PORT",
        default_value_t = 1
    )]
    ib_port: u8,
    /// Receives kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Messages exchanged each way.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Service level.
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Wait for CQ events on a completion channel instead of polling the CQ (on Linux the
    /// thread sleeps on the channel's eventfd; elsewhere the channel is polled).
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Local GID index (RoCE always uses a GID; default 0 there).
    #[arg(short = 'g', long = "gid-idx", value_name = "INDEX")]
    gid_index: Option<u32>,
    /// Validate the buffer, as the C tools' -c: the first byte of every 4 KiB page of a
    /// message is 0, the rest 0x7b; here every received message is checked (the C tools check
    /// the server's last one) and a bad one fails the run with "invalid data in page N".
    #[arg(short = 'c', long = "chk")]
    validate: bool,
    /// Seconds to wait for the other side: in the TCP address exchange (connecting, each
    /// message) before giving up with "no reply from <host> within N s", and in the run for
    /// its next message (not in the C tools, which wait as long as the TCP stack does).
    /// A server waits for its client to connect as long as it takes, as the C tools' do.
    #[arg(long = "timeout", value_name = "SECS", default_value_t = 10)]
    timeout: u64,
    /// Connect to this server (portverbs or the C tool).
    #[arg(value_name = "SERVERNAME")]
    server: Option<String>,
    /// Testing: run the server role even on an in-process device.
    #[arg(long = "server", hide = true)]
    force_server: bool,
}

impl Shared {
    /// The run's configuration for `variant` with messages of `size` bytes and path MTU `mtu`
    /// (in bytes), checked.
    fn config(&self, variant: Variant, size: u32, mtu: u32) -> Result<PpConfig, CliError> {
        let mtu = Mtu::from_bytes(mtu).ok_or_else(|| {
            CliError::usage(format_args!(
                "invalid MTU {mtu}: use 256, 512, 1024, 2048 or 4096"
            ))
        })?;
        if size == 0 || size > 1 << 30 {
            return Err(CliError::usage("the size (-s) must be 1..=2^30 bytes"));
        }
        match variant {
            Variant::Srq { qps } => {
                if qps == 0 || qps as usize >= portverbs::oob::pingpong::SRQ_MESSAGES {
                    return Err(CliError::usage(format_args!(
                        "the number of QPs (-q) must be 1..={}",
                        portverbs::oob::pingpong::SRQ_MESSAGES - 1
                    )));
                }
                if qps > self.rx_depth {
                    return Err(CliError::usage(format_args!(
                        "rx_depth {} is too small for {qps} QPs -- must have at least one \
                         receive per QP.",
                        self.rx_depth
                    )));
                }
            }
            _ if self.rx_depth < 2 => {
                return Err(CliError::usage("the rx depth (-r) must be at least 2"));
            }
            _ => {}
        }
        if self.iters == 0 {
            return Err(CliError::usage(
                "the iteration count (-n) must be at least 1",
            ));
        }
        if self.sl > 15 {
            return Err(CliError::usage("the service level (-l) must be 0..=15"));
        }
        if self.timeout == 0 {
            return Err(CliError::usage(
                "the timeout (--timeout) must be at least 1 s",
            ));
        }
        Ok(PpConfig {
            variant,
            size: size as usize,
            mtu,
            rx_depth: self.rx_depth,
            iters: u64::from(self.iters),
            sl: self.sl,
            events: self.events,
            gid_index: self.gid_index,
            validate: self.validate,
            timeout: Duration::from_secs(self.timeout),
        })
    }
}

/// `portverbs pingpong`: the options of `ibv_rc_pingpong`.
#[derive(Debug, Args)]
#[command(
    about = "RC send ping-pong like ibv_rc_pingpong",
    long_about = "Ping-pong of RC sends in the manner of ibv_rc_pingpong, with its options, QP \
                  parameters, TCP exchange (LID:QPN:PSN:GID, in the C tool's wire format) and \
                  output.\n\nWith SERVERNAME: a client that connects to SERVERNAME:PORT (a \
                  portverbs pingpong or ibv_rc_pingpong server). Without SERVERNAME on a device \
                  other processes can reach (a UDP-bound device, VFIO hardware): a server that \
                  listens on PORT of every address for one client. Without SERVERNAME on a \
                  device of the embedded in-process fabric (soft0, soft1, mlx4_0, mlx4_1): both \
                  sides in this process, a server thread on the other device listening on \
                  localhost:PORT and the client (on -d, or the first device) connecting to it; \
                  the client's lines are printed.\n\nSiblings: uc_pingpong, ud_pingpong and \
                  srq_pingpong.",
    after_help = "Examples:\n  portverbs pingpong -n 1000 -c\n  \
                  portverbs pingpong -d udp0 -c               (server)\n  \
                  portverbs pingpong -d udp1 -c 127.0.0.1     (client)"
)]
pub(crate) struct PingpongArgs {
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    #[command(flatten)]
    shared: Shared,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

impl PingpongArgs {
    fn config(&self) -> Result<PpConfig, CliError> {
        self.shared.config(Variant::Rc, self.size, self.mtu)
    }
}

/// Runs `portverbs pingpong` and returns the client's report.
pub(crate) fn run(args: &PingpongArgs) -> Result<String, CliError> {
    run_variant(&args.shared, args.config()?)
}

/// The endpoint messages this side sends: its QPs', then zero endpoints up to its tool's
/// count.
fn messages(side: &PpSide, variant: Variant) -> Vec<QpEndpoint> {
    let mut all = side.dests().to_vec();
    all.resize(variant.messages().max(all.len()), QpEndpoint::default());
    all
}

/// The local address lines: one per QP (`ud_pingpong` has a colon before its GID).
fn local_lines(variant: Variant, mine: &[QpEndpoint]) -> String {
    mine.iter()
        .map(|ep| match variant {
            Variant::Ud => format_ud_local_address(ep),
            _ => format_address(PingpongSide::Local, ep),
        })
        .collect()
}

/// The remote address lines: one per QP of this side.
fn remote_lines(variant: Variant, remote: &[QpEndpoint]) -> String {
    remote
        .iter()
        .take(variant.qp_count())
        .map(|ep| format_address(PingpongSide::Remote, ep))
        .collect()
}

/// Runs one of the pingpong tools with `shared`'s options and `cfg`; returns the client's
/// report (a server prints its local address lines itself, before it waits).
fn run_variant(shared: &Shared, cfg: PpConfig) -> Result<String, CliError> {
    let timeout = Duration::from_secs(shared.timeout);
    let variant = cfg.variant;
    if shared.server.is_none() {
        let dev = verbs::pick_device(shared.device.as_deref())?;
        if shared.force_server || !verbs::in_process(&dev) {
            let listener = exchange::listen_all(shared.port)?;
            // The local address right away, as the C tools print it before they wait.
            return serve(
                shared,
                cfg,
                dev,
                &listener,
                &AtomicBool::new(false),
                &mut |t| crate::print(t),
            );
        }
    }
    let (cdev, sdev) = match &shared.server {
        Some(_) => {
            let dev = verbs::pick_device(shared.device.as_deref())?;
            (dev.clone(), dev)
        }
        None => verbs::pick_devices(shared.device.as_deref())?,
    };
    let client = PpSide::new(&verbs::open(cdev)?, shared.ib_port, cfg)?;
    let mine = messages(&client, variant);
    let mut out = local_lines(variant, client.dests());
    let elapsed = match &shared.server {
        Some(host) => {
            let remote = exchange::client(host, shared.port, &mine, timeout)?;
            out += &remote_lines(variant, &remote);
            client.connect(&remote)?;
            client
                .run(true, &AtomicBool::new(false))
                .map_err(|e| e.with_peer(host))?
        }
        None => {
            let server = PpSide::new(&verbs::open(sdev)?, 1, cfg)?;
            let answer = messages(&server, variant);
            let (listener, port) = exchange::listen(shared.port)?;
            // Each side gives up when the other failed (a side that finished normally may
            // still be reaping its last completion while the other is done).
            let client_failed = AtomicBool::new(false);
            let server_failed = AtomicBool::new(false);
            let count = variant.messages();
            let (c, s) = std::thread::scope(|sc| {
                let peer = sc.spawn(|| {
                    let accept = Some(timeout);
                    let r = exchange::serve(
                        &listener,
                        &client_failed,
                        accept,
                        timeout,
                        count,
                        |remote| {
                            server.connect(remote)?;
                            Ok(answer)
                        },
                    )
                    .and_then(|_| server.run(false, &client_failed));
                    server_failed.store(r.is_err(), Ordering::Release);
                    r
                });
                let c = exchange::client("127.0.0.1", port, &mine, timeout).and_then(|remote| {
                    out += &remote_lines(variant, &remote);
                    client.connect(&remote)?;
                    client.run(true, &server_failed)
                });
                client_failed.store(c.is_err(), Ordering::Release);
                let s = peer
                    .join()
                    .unwrap_or_else(|_| Err(CliError::Failed("the server thread panicked".into())));
                (c, s)
            });
            CliError::merge(c, s)?
        }
    };
    out += &format_results(cfg.size as u64, cfg.iters, elapsed);
    Ok(out)
}

/// The server role: gives `early` its local address lines, waits on `listener` for one client
/// (until `abort` is set), connects to it and answers its messages; returns the rest of what
/// the C tool's server prints.
fn serve(
    shared: &Shared,
    cfg: PpConfig,
    dev: portverbs::AnyDevice,
    listener: &std::net::TcpListener,
    abort: &AtomicBool,
    early: &mut dyn FnMut(&str) -> Result<(), CliError>,
) -> Result<String, CliError> {
    let timeout = Duration::from_secs(shared.timeout);
    let variant = cfg.variant;
    let side = PpSide::new(&verbs::open(dev)?, shared.ib_port, cfg)?;
    let mine = messages(&side, variant);
    early(&local_lines(variant, side.dests()))?;
    let remote = exchange::serve(
        listener,
        abort,
        None,
        timeout,
        variant.messages(),
        |remote| {
            side.connect(remote)?;
            Ok(mine)
        },
    )?;
    let mut out = remote_lines(variant, &remote);
    // The client as its address message names it (its TCP source may be another address).
    let peer = remote
        .first()
        .filter(|r| !r.gid.is_zero())
        .map(|r| r.gid.to_ip().to_string());
    let elapsed = side
        .run(false, &AtomicBool::new(false))
        .map_err(|e| match &peer {
            Some(p) => e.with_peer(p),
            None => e,
        })?;
    out += &format_results(cfg.size as u64, cfg.iters, elapsed);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: PingpongArgs,
    }

    fn args(line: &[&str]) -> PingpongArgs {
        use clap::Parser as _;
        let argv = std::iter::once("pingpong").chain(line.iter().copied());
        Cli::try_parse_from(argv).expect("flags parse").args
    }

    /// A server thread on soft1 and a client thread on soft0 (both on the in-process fabric)
    /// over a real TCP connection on 127.0.0.1; returns the client's and the server's output.
    fn pair(line: &[&str]) -> (String, String) {
        let _alone = crate::perf::DEVICE_TRAFFIC
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().expect("bound").port().to_string();
        let mut sline = line.to_vec();
        sline.extend(["-d", "soft1", "--server"]);
        let server_args = args(&sline);
        let mut cline = line.to_vec();
        cline.extend(["-d", "soft0", "-p", &port, "127.0.0.1"]);
        let client_args = args(&cline);
        let client_done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let server = s.spawn(|| {
                let cfg = server_args.config()?;
                let dev = verbs::pick_device(Some("soft1"))?;
                let mut out = String::new();
                let rest = serve(
                    &server_args.shared,
                    cfg,
                    dev,
                    &listener,
                    &client_done,
                    &mut |t| {
                        out += t;
                        Ok(())
                    },
                )?;
                Ok::<_, CliError>(out + &rest)
            });
            let c = run(&client_args);
            client_done.store(true, Ordering::Release);
            let s = server.join().expect("the server thread ends");
            (c.expect("the client runs"), s.expect("the server runs"))
        })
    }

    #[test]
    fn server_and_client_exchange_and_ping_pong() {
        let (client, server) = pair(&["-n", "100", "-s", "10000", "-c"]);
        let lines = |out: &str| out.lines().map(str::to_owned).collect::<Vec<_>>();
        let (c, s) = (lines(&client), lines(&server));
        assert_eq!(c.len(), 4, "{client}");
        assert_eq!(s.len(), 4, "{server}");
        // Each side's local address is the other's remote address.
        assert_eq!(
            c[0].replace("local address: ", ""),
            s[1].replace("remote address:", "")
        );
        assert_eq!(
            s[0].replace("local address: ", ""),
            c[1].replace("remote address:", "")
        );
        for out in [&c, &s] {
            assert!(out[2].starts_with("2000000 bytes in "), "{out:?}");
            assert!(out[3].starts_with("100 iters in "), "{out:?}");
        }
    }
}
