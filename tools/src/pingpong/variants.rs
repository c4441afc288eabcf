//! `portverbs uc_pingpong`, `ud_pingpong` and `srq_pingpong`: the options of rdma-core's
//! `ibv_uc_pingpong`, `ibv_ud_pingpong` and `ibv_srq_pingpong`
//! (`libibverbs/examples/uc_pingpong.c`, `ud_pingpong.c`, `srq_pingpong.c`). They run as
//! `portverbs pingpong` does (client, server, or both sides in this process) and print what
//! their C tools print.

use clap::Args;

use super::session::{PpConfig, Variant};
use super::{Shared, run_variant};
use crate::error::CliError;

/// `portverbs uc_pingpong`: the options of `ibv_uc_pingpong`.
#[derive(Debug, Args)]
#[command(
    about = "UC send ping-pong like ibv_uc_pingpong",
    long_about = "Ping-pong of sends over an unreliable connected (UC) QP in the manner of \
                  ibv_uc_pingpong: its options, QP parameters (no acknowledgements, so no \
                  retries: a lost packet stalls the run until --timeout), TCP exchange \
                  (LID:QPN:PSN:GID) and output. Client, server and in-process roles as for \
                  `portverbs pingpong`.",
    after_help = "Examples:\n  portverbs uc_pingpong -n 1000\n  \
                  portverbs uc_pingpong -d udp0               (server)\n  \
                  portverbs uc_pingpong -d udp1 127.0.0.1     (client)"
)]
pub(crate) struct UcPingpongArgs {
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

/// `portverbs ud_pingpong`: the options of `ibv_ud_pingpong`.
#[derive(Debug, Args)]
#[command(
    about = "UD send ping-pong like ibv_ud_pingpong",
    long_about = "Ping-pong of sends over an unreliable datagram (UD) QP in the manner of \
                  ibv_ud_pingpong: Q_Key 0x11111111, an address handle made from the peer's \
                  LID and GID, receive buffers with room for the 40-byte GRH in front of each \
                  message, the same TCP exchange (LID:QPN:PSN:GID) and output. A message must \
                  fit one packet: the size may not exceed the port's active MTU. Client, \
                  server and in-process roles as for `portverbs pingpong`.",
    after_help = "Examples:\n  portverbs ud_pingpong -n 1000\n  \
                  portverbs ud_pingpong -d udp0               (server)\n  \
                  portverbs ud_pingpong -d udp1 127.0.0.1     (client)"
)]
pub(crate) struct UdPingpongArgs {
    /// Message size in bytes, at most the port's active MTU (ud_pingpong.c's default is
    /// 1024, though its usage text says 2048).
    #[arg(short = 's', long = "size", default_value_t = 1024)]
    size: u32,
    #[command(flatten)]
    shared: Shared,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

/// `portverbs srq_pingpong`: the options of `ibv_srq_pingpong`.
#[derive(Debug, Args)]
#[command(
    about = "RC send ping-pong over several QPs sharing an SRQ, like ibv_srq_pingpong",
    long_about = "Ping-pong of RC sends in the manner of ibv_srq_pingpong: -q RC QPs whose \
                  receives all come from one shared receive queue of -r receives, each QP \
                  ping-ponging on its own. The TCP exchange is the C tool's: 256 \
                  LID:QPN:PSN:GID messages each way (the QPs', then zero ones), then \"done\"; \
                  both sides must use the same -q. -n counts the messages of all QPs together, \
                  as the C tool does. One local and one remote address line per QP. Client, \
                  server and in-process roles as for `portverbs pingpong`.",
    after_help = "Examples:\n  portverbs srq_pingpong -q 4 -n 1000\n  \
                  portverbs srq_pingpong -d udp0               (server)\n  \
                  portverbs srq_pingpong -d udp1 127.0.0.1     (client)"
)]
pub(crate) struct SrqPingpongArgs {
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Number of QPs (1..=255; at most the rx depth).
    #[arg(short = 'q', long = "num-qp", default_value_t = 16)]
    num_qp: u32,
    #[command(flatten)]
    shared: Shared,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}

impl UcPingpongArgs {
    fn config(&self) -> Result<PpConfig, CliError> {
        self.shared.config(Variant::Uc, self.size, self.mtu)
    }
}

impl UdPingpongArgs {
    fn config(&self) -> Result<PpConfig, CliError> {
        // UD has no path MTU; the size is checked against the port's active MTU.
        self.shared.config(Variant::Ud, self.size, 1024)
    }
}

impl SrqPingpongArgs {
    fn config(&self) -> Result<PpConfig, CliError> {
        let variant = Variant::Srq { qps: self.num_qp };
        self.shared.config(variant, self.size, self.mtu)
    }
}

/// Runs `portverbs uc_pingpong`; returns the client's report.
pub(crate) fn run_uc(args: &UcPingpongArgs) -> Result<String, CliError> {
    run_variant(&args.shared, args.config()?)
}

/// Runs `portverbs ud_pingpong`; returns the client's report.
pub(crate) fn run_ud(args: &UdPingpongArgs) -> Result<String, CliError> {
    run_variant(&args.shared, args.config()?)
}

/// Runs `portverbs srq_pingpong`; returns the client's report.
pub(crate) fn run_srq(args: &SrqPingpongArgs) -> Result<String, CliError> {
    run_variant(&args.shared, args.config()?)
}
