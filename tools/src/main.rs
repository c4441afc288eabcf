//! The `portverbs` command-line tool.
//!
//! * `portverbs devices`: the devices and ports, laid out like `ibv_devinfo`.
//! * `portverbs perf <TEST>`: perftest's bandwidth and latency tests (`ib_write_bw` …).
//! * `portverbs pingpong`: `ibv_rc_pingpong`; `uc_pingpong`, `ud_pingpong`, `srq_pingpong`:
//!   `ibv_uc_pingpong`, `ibv_ud_pingpong`, `ibv_srq_pingpong`.
//! * `portverbs rping`: librdmacm's `rping`, connected through the connection manager.
//! * `portverbs cmtime`: librdmacm's `cmtime`, the connection-setup benchmark.
//! * `portverbs mckey`: librdmacm's `mckey`, UD multicast joined through the connection
//!   manager.
//! * `portverbs ucmatose`, `udaddy`, `rdma_server`, `rdma_client`: librdmacm's example
//!   programs of those names (RC connections, UD through SIDR, the minimal pair).
//!
//! `perf` and `pingpong` run one end of the connection, as the C tools do — a client with a
//! HOST/SERVERNAME, a server without one on a device other processes can reach (UDP-bound,
//! VFIO hardware) — exchanging the QP information over TCP in perftest's and
//! `ibv_rc_pingpong`'s formats, so either end can be the C tool. On a device of the embedded
//! in-process fabric (the default) and without a HOST they run both ends in this process.
//! Errors go to stderr with a non-zero exit code (2 for bad usage, 1 for failures while
//! running).

mod cmdev;
mod cmtime;
mod devices;
mod error;
mod events;
mod mckey;
mod perf;
mod pingpong;
mod progress_mode;
mod rdmacm;
mod report;
mod rping;
mod verbs;
mod wait;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use error::{CliError, IoContext as _};

/// Userspace RDMA tools over Portverbs: device information, perftest-style benchmarks and an
/// RC ping-pong.
#[derive(Debug, Parser)]
#[command(name = "portverbs", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands. Their help texts come from the argument structs (plain comments here:
/// a doc comment on a variant would replace them).
#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once at startup; boxing would only move the bytes"
)]
enum Command {
    // `portverbs devices`.
    Devices(devices::DevicesArgs),
    // `portverbs perf`.
    Perf(perf::PerfArgs),
    // `portverbs pingpong` (also `rc_pingpong`, next to its siblings).
    #[command(alias = "rc_pingpong")]
    Pingpong(pingpong::PingpongArgs),
    // `portverbs uc_pingpong`: the C tools' names, as `perf write_bw` has perftest's.
    #[command(name = "uc_pingpong")]
    UcPingpong(pingpong::UcPingpongArgs),
    // `portverbs ud_pingpong`.
    #[command(name = "ud_pingpong")]
    UdPingpong(pingpong::UdPingpongArgs),
    // `portverbs srq_pingpong`.
    #[command(name = "srq_pingpong")]
    SrqPingpong(pingpong::SrqPingpongArgs),
    // `portverbs rping`.
    Rping(rping::RpingArgs),
    // `portverbs cmtime`.
    Cmtime(cmtime::CmtimeArgs),
    // `portverbs mckey`.
    Mckey(mckey::MckeyArgs),
    // `portverbs ucmatose`.
    Ucmatose(rdmacm::ucmatose::UcmatoseArgs),
    // `portverbs udaddy`.
    Udaddy(rdmacm::udaddy::UdaddyArgs),
    // `portverbs rdma_server`.
    #[command(name = "rdma_server")]
    RdmaServer(rdmacm::pair::ServerArgs),
    // `portverbs rdma_client`.
    #[command(name = "rdma_client")]
    RdmaClient(rdmacm::pair::ClientArgs),
}

fn print(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .io_ctx("writing to stdout")
}

/// Refuses a malformed `PORTVERBS_*` variable (the library would list no VFIO devices and
/// could not say why).
fn check_environment() -> Result<(), CliError> {
    portverbs::hardware_env()
        .map(|_| ())
        .map_err(CliError::usage)?;
    #[cfg(any(target_os = "linux", windows))]
    portverbs::udp_env().map_err(CliError::usage)?;
    portverbs::progress_env().map_err(CliError::usage)?;
    portverbs::cc_env().map_err(CliError::usage)?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Devices(a) => a.mode,
        Command::Perf(a) => a.mode,
        Command::Pingpong(a) => a.mode,
        Command::UcPingpong(a) => a.mode,
        Command::UdPingpong(a) => a.mode,
        Command::SrqPingpong(a) => a.mode,
        Command::Rping(a) => a.mode,
        Command::Cmtime(a) => a.mode,
        Command::Mckey(a) => a.mode,
        Command::Ucmatose(a) => a.mode,
        Command::Udaddy(a) => a.mode,
        Command::RdmaServer(a) => a.mode,
        Command::RdmaClient(a) => a.mode,
    }
    .apply();
    // The flag overrides the variable; a malformed variable is refused all the same.
    let result = check_environment().and_then(|()| match &cli.command {
        Command::Devices(args) => devices::run(args),
        Command::Perf(args) => perf::run(args),
        Command::Pingpong(args) => pingpong::run(args).and_then(|t| print(&t)),
        Command::UcPingpong(args) => pingpong::run_uc(args).and_then(|t| print(&t)),
        Command::UdPingpong(args) => pingpong::run_ud(args).and_then(|t| print(&t)),
        Command::SrqPingpong(args) => pingpong::run_srq(args).and_then(|t| print(&t)),
        Command::Rping(args) => rping::run(args),
        Command::Cmtime(args) => cmtime::run(args).and_then(|t| print(&t)),
        Command::Mckey(args) => mckey::run(args),
        Command::Ucmatose(args) => rdmacm::ucmatose::run(args),
        Command::Udaddy(args) => rdmacm::udaddy::run(args),
        Command::RdmaServer(args) => rdmacm::pair::run_server(args),
        Command::RdmaClient(args) => rdmacm::pair::run_client(args),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("portverbs: {e}");
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}
