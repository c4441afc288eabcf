//! `portverbs pingpong`: `ibv_rc_pingpong`, one side in this process or both.
//!
//! * With SERVERNAME: the client; it connects to SERVERNAME:PORT (a `portverbs pingpong` or
//!   `ibv_rc_pingpong` server) and the two exchange `LID:QPN:PSN:GID` messages.
//! * Without SERVERNAME, on a device other processes can reach (or with the hidden
//!   `--server`): the server; it listens on PORT of every address for one client.
//! * Without SERVERNAME on a device of the embedded in-process fabric: both sides here; a
//!   server thread listens on localhost (`-p`, 18515 by default, or an ephemeral port when
//!   that one is taken), the client connects to it, and the two exchange their messages over
//!   that real TCP connection before ping-ponging sends over the embedded fabric.
//!
//! Each side prints what `ibv_rc_pingpong` prints (both sides in one process: the client's).

mod exchange;
mod session;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use portverbs::prelude::Mtu;

use crate::error::CliError;
use crate::report::PingpongSide;
use crate::report::pingpong::{format_address, format_results};
use crate::verbs;
use session::{PpConfig, PpSide};

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
                  the client's lines are printed.",
    after_help = "Examples:\n  portverbs pingpong -n 1000 -c\n  \
                  portverbs pingpong -d udp0 -c               (server)\n  \
                  portverbs pingpong -d udp1 -c 127.0.0.1     (client)"
)]
pub(crate) struct PingpongArgs {
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
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
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
    /// Validate the buffer, as ibv_rc_pingpong -c: the first byte of every 4 KiB page of a
    /// message is 0, the rest 0x7b; here every received message is checked (the C tool checks
    /// the server's last one) and a bad one fails the run with "invalid data in page N".
    #[arg(short = 'c', long = "chk")]
    validate: bool,
    /// Seconds to wait for the other side: in the TCP address exchange (connecting, each
    /// message) before giving up with "no reply from <host> within N s", and in the run for
    /// its next message (not in ibv_rc_pingpong, which waits as long as the TCP stack does).
    /// A server waits for its client to connect as long as it takes, as ibv_rc_pingpong's
    /// does.
    #[arg(long = "timeout", value_name = "SECS", default_value_t = 10)]
    timeout: u64,
    /// Connect to this server (portverbs or ibv_rc_pingpong).
    #[arg(value_name = "SERVERNAME")]
    server: Option<String>,
    /// Testing: run the server role even on an in-process device.
    #[arg(long = "server", hide = true)]
    force_server: bool,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

impl PingpongArgs {
    fn config(&self) -> Result<PpConfig, CliError> {
        let mtu = Mtu::from_bytes(self.mtu).ok_or_else(|| {
            CliError::usage(format_args!(
                "invalid MTU {}: use 256, 512, 1024, 2048 or 4096",
                self.mtu
            ))
        })?;
        if self.size == 0 || self.size > 1 << 30 {
            return Err(CliError::usage("the size (-s) must be 1..=2^30 bytes"));
        }
        if self.rx_depth < 2 {
            return Err(CliError::usage("the rx depth (-r) must be at least 2"));
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
            size: self.size as usize,
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

/// Runs `portverbs pingpong` and returns the client's report.
pub(crate) fn run(args: &PingpongArgs) -> Result<String, CliError> {
    let cfg = args.config()?;
    let timeout = Duration::from_secs(args.timeout);
    if args.server.is_none() {
        let dev = verbs::pick_device(args.device.as_deref())?;
        if args.force_server || !verbs::in_process(&dev) {
            let listener = exchange::listen_all(args.port)?;
            // The local address right away, as ibv_rc_pingpong prints it before it waits.
            return serve(
                args,
                cfg,
                dev,
                &listener,
                &AtomicBool::new(false),
                &mut |t| crate::print(t),
            );
        }
    }
    let (cdev, sdev) = match &args.server {
        Some(_) => {
            let dev = verbs::pick_device(args.device.as_deref())?;
            (dev.clone(), dev)
        }
        None => verbs::pick_devices(args.device.as_deref())?,
    };
    let client = PpSide::new(&verbs::open(cdev)?, args.ib_port, cfg)?;
    let mine = client.dest();
    let mut out = format_address(PingpongSide::Local, &mine);
    let elapsed = match &args.server {
        Some(host) => {
            let remote = exchange::client(host, args.port, &mine, timeout)?;
            out += &format_address(PingpongSide::Remote, &remote);
            client.connect(&remote)?;
            client
                .run(true, &AtomicBool::new(false))
                .map_err(|e| e.with_peer(host))?
        }
        None => {
            let server = PpSide::new(&verbs::open(sdev)?, 1, cfg)?;
            let (listener, port) = exchange::listen(args.port)?;
            // Each side gives up when the other failed (a side that finished normally may
            // still be reaping its last completion while the other is done).
            let client_failed = AtomicBool::new(false);
            let server_failed = AtomicBool::new(false);
            let (c, s) = std::thread::scope(|sc| {
                let peer = sc.spawn(|| {
                    let accept = Some(timeout);
                    let r = exchange::serve(&listener, &client_failed, accept, timeout, |remote| {
                        server.connect(remote)?;
                        Ok(server.dest())
                    })
                    .and_then(|_| server.run(false, &client_failed));
                    server_failed.store(r.is_err(), Ordering::Release);
                    r
                });
                let c = exchange::client("127.0.0.1", port, &mine, timeout).and_then(|remote| {
                    out += &format_address(PingpongSide::Remote, &remote);
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

/// The server role: gives `early` its local address line, waits on `listener` for one client
/// (until `abort` is set), connects to it and answers its messages; returns the rest of what
/// `ibv_rc_pingpong`'s server prints.
fn serve(
    args: &PingpongArgs,
    cfg: PpConfig,
    dev: portverbs::AnyDevice,
    listener: &std::net::TcpListener,
    abort: &AtomicBool,
    early: &mut dyn FnMut(&str) -> Result<(), CliError>,
) -> Result<String, CliError> {
    let timeout = Duration::from_secs(args.timeout);
    let side = PpSide::new(&verbs::open(dev)?, args.ib_port, cfg)?;
    let mine = side.dest();
    early(&format_address(PingpongSide::Local, &mine))?;
    let remote = exchange::serve(listener, abort, None, timeout, |remote| {
        side.connect(remote)?;
        Ok(mine)
    })?;
    let mut out = format_address(PingpongSide::Remote, &remote);
    // The client as its address message names it (its TCP source may be another address).
    let peer = (!remote.gid.is_zero()).then(|| remote.gid.to_ip().to_string());
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
                let rest = serve(&server_args, cfg, dev, &listener, &client_done, &mut |t| {
                    out += t;
                    Ok(())
                })?;
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
