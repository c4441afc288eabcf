//! `portverbs pingpong`: `ibv_rc_pingpong` with both sides in this process.
//!
//! Without SERVERNAME a server thread listens on localhost (`-p`, 18515 by default, or an
//! ephemeral port when that one is taken), the client connects to it, and the two exchange
//! `LID:QPN:PSN:GID` messages over that real TCP connection before ping-ponging sends over
//! the embedded fabric. The client prints what `ibv_rc_pingpong` prints.

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
    about = "RC send ping-pong like ibv_rc_pingpong (both sides in this process)",
    long_about = "Ping-pong of RC sends in the manner of ibv_rc_pingpong, with its options, QP \
                  parameters and output.\n\nWithout SERVERNAME both sides run in this process: a \
                  server thread on the other device listens on localhost:PORT, the client (on \
                  -d, or the first device) connects to it, and the two exchange their \
                  LID:QPN:PSN:GID over that TCP connection, in the C tool's wire format. With \
                  SERVERNAME only the client runs and connects to SERVERNAME:PORT, which needs \
                  a device the server can reach (not the in-process soft devices)."
)]
pub(crate) struct PingpongArgs {
    /// TCP port of the address exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Client device (default: the first device); the server uses the other one.
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
    /// Validate the contents of every received message.
    #[arg(short = 'c', long = "chk")]
    validate: bool,
    /// Seconds to wait for the other side of the TCP address exchange (connecting, each
    /// message) before giving up with "no reply from <host> within N s" (not in
    /// ibv_rc_pingpong, which waits as long as the TCP stack does).
    #[arg(long = "timeout", value_name = "SECS", default_value_t = 10)]
    timeout: u64,
    /// Connect to this server instead of starting one in-process.
    #[arg(value_name = "SERVERNAME")]
    server: Option<String>,
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
        })
    }
}

/// Runs `portverbs pingpong` and returns the client's report.
pub(crate) fn run(args: &PingpongArgs) -> Result<String, CliError> {
    let cfg = args.config()?;
    let timeout = Duration::from_secs(args.timeout);
    let (cdev, sdev) = verbs::pick_devices(args.device.as_deref())?;
    if args.server.is_some() && cdev.as_soft().is_some() {
        return Err(CliError::usage(
            "SERVERNAME: a remote server cannot reach this client, because the soft devices \
             exist only inside this process; run without SERVERNAME to start both sides here",
        ));
    }
    let client = PpSide::new(&verbs::open(cdev)?, args.ib_port, cfg)?;
    let mine = client.dest();
    let mut out = format_address(PingpongSide::Local, &mine);
    let elapsed = match &args.server {
        Some(host) => {
            let remote = exchange::client(host, args.port, &mine, timeout)?;
            out += &format_address(PingpongSide::Remote, &remote);
            client.connect(&remote)?;
            client.run(true, &AtomicBool::new(false))?
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
                    let r = exchange::serve(&listener, &client_failed, timeout, |remote| {
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
