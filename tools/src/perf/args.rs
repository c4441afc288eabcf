//! The command line of `portverbs perf`: perftest's flag names, short and long.

use std::path::PathBuf;

use clap::Args;

/// `portverbs perf <TEST> [perftest flags]`.
#[derive(Debug, Args)]
#[command(
    about = "Measure bandwidth or latency like perftest (ib_write_bw, ib_send_lat, ...)",
    long_about = "Measure bandwidth or latency with perftest's flags, defaults and output \
                  (banner, address lines, result table, --out_json).\n\n\
                  Three modes, as perftest's: with HOST, a client that connects to a server \
                  (portverbs or perftest's own ib_write_bw ...) on HOST:PORT and exchanges the \
                  QP information over TCP in perftest's format; without HOST on a device other \
                  processes can reach (a UDP-bound device, VFIO hardware), a server that \
                  listens on port PORT of every address and waits for one client; without HOST \
                  on a device of the embedded in-process fabric (soft0, soft1, mlx4_0, mlx4_1), \
                  both ends in this process: the client on the first device (or -d), the server \
                  on the other device, a server thread playing the peer where the test needs one \
                  (ping-pong latency, receivers of send tests). Across processes every test \
                  runs, over the transports perftest allows (RC; UC for write and send; UD for \
                  send), with -a, -q, -A, -R (UD by SIDR), -b and --run_infinitely (BW tests) and \
                  -D; \
                  both sides must get the same flags, as with perftest. On the embedded \
                  fabric, -b and --run_infinitely run the two sides as two processes would, \
                  over loopback TCP.\n\n\
                  TEST is one of write_bw, write_lat, read_bw, read_lat, send_bw, send_lat, \
                  atomic_bw, atomic_lat (perftest program names such as ib_write_bw work too).\n\n\
                  BW tests keep up to --tx-depth requests outstanding per QP, ask for a \
                  completion every --cq-mod requests and report the average over the whole run \
                  (first post to last completion), the peak over completion intervals, and the \
                  message rate. Latency tests time every iteration: send and write report half \
                  the round trip of a ping-pong, read and atomic the whole operation.",
    after_help = "Examples:\n  portverbs perf write_bw\n  portverbs perf ib_send_lat -s 64 -n 10000\n  \
                  portverbs perf read_bw -a -n 100\n  portverbs perf send_bw -c UD -D 5 -f 1\n  \
                  portverbs perf write_bw -d udp0            (server)\n  \
                  portverbs perf write_bw -d udp1 127.0.0.1  (client)"
)]
pub(crate) struct PerfArgs {
    /// Test to run: write_bw, write_lat, read_bw, read_lat, send_bw, send_lat, atomic_bw,
    /// atomic_lat (or ib_write_bw, ...).
    #[arg(value_name = "TEST")]
    pub(crate) test: String,

    /// Run as a client of the server on HOST (portverbs or perftest).
    #[arg(value_name = "HOST")]
    pub(crate) host: Option<String>,

    /// TCP port of the QP information exchange (server: listen on it; client: connect to it).
    #[arg(
        short = 'p',
        long = "port",
        value_name = "PORT",
        default_value_t = 18515
    )]
    pub(crate) port: u16,

    /// Connect the test's QPs with the connection manager (rdma_cm), and run the exchange
    /// over an RC QP of its own instead of TCP: perftest's rdma_cm mode. The server listens
    /// on PORT of the CM's RDMA_PS_TCP port space; RC only.
    #[arg(short = 'R', long = "rdma_cm")]
    pub(crate) rdma_cm: bool,

    /// Testing: run the server role even on an in-process device.
    #[arg(long = "server", hide = true)]
    pub(crate) server: bool,

    /// Device (default: the first device). In-process, the client's; the server uses the other
    /// one.
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub(crate) device: Option<String>,

    /// Port of the device.
    #[arg(
        short = 'i',
        long = "ib-port",
        value_name = "PORT",
        default_value_t = 1
    )]
    pub(crate) ib_port: u8,

    /// Message size in bytes, as perftest reads it: decimal, 0x hex or 0-prefixed octal, with
    /// an optional K (x1024) or M (x1048576) suffix: 4096, 64K, 1M, 0x1000 (default 65536 for BW,
    /// 2 for latency, 8 for atomics; 1 ..= 2147483647).
    #[arg(short = 's', long = "size", value_name = "BYTES")]
    pub(crate) size: Option<String>,

    /// Run every size from 2 to 2^23 bytes (up to the MTU on UD).
    #[arg(short = 'a', long = "all")]
    pub(crate) all: bool,

    /// Iterations per size (default 1000; 5000 for write_bw; at least 5).
    #[arg(short = 'n', long = "iters", value_name = "N")]
    pub(crate) iters: Option<u64>,

    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration", value_name = "SECS")]
    pub(crate) duration: Option<u64>,

    /// Duration mode: seconds left out of the measurement at the start and at the end
    /// (default: a quarter of the duration, in whole seconds, as perftest).
    #[arg(short = 'f', long = "margin", value_name = "SECS")]
    pub(crate) margin: Option<u64>,

    /// Number of QPs (BW tests).
    #[arg(short = 'q', long = "qp", value_name = "N", default_value_t = 1)]
    pub(crate) qps: u32,

    /// Connection type: RC, UC or UD.
    #[arg(
        short = 'c',
        long = "connection",
        value_name = "TYPE",
        default_value = "RC"
    )]
    pub(crate) connection: String,

    /// Send queue depth: requests outstanding per QP (default 128 for BW, 1 for latency).
    #[arg(short = 't', long = "tx-depth", value_name = "N")]
    pub(crate) tx_depth: Option<u32>,

    /// Receive queue depth of send tests (read and atomic tests accept only 1).
    #[arg(short = 'r', long = "rx-depth", value_name = "N")]
    pub(crate) rx_depth: Option<u32>,

    /// Ask for a completion every N requests (BW tests).
    #[arg(short = 'Q', long = "cq-mod", value_name = "N")]
    pub(crate) cq_mod: Option<u32>,

    /// Post this many requests per post call (BW tests).
    #[arg(short = 'l', long = "post_list", value_name = "N", default_value_t = 1)]
    pub(crate) post_list: u32,

    /// Largest message sent inline, 0 ..= 1024 (default 0 for BW, 220 for write_lat, 236 for
    /// send_lat over RC/UC, 188 over UD; not for read and atomic tests).
    #[arg(short = 'I', long = "inline_size", value_name = "BYTES")]
    pub(crate) inline_size: Option<u32>,

    /// Path MTU: 256, 512, 1024, 2048 or 4096 (default: the port's active MTU).
    #[arg(short = 'm', long = "mtu", value_name = "BYTES")]
    pub(crate) mtu: Option<u32>,

    /// GID index of the local port (RoCE needs one; default 0).
    #[arg(short = 'x', long = "gid-index", value_name = "INDEX")]
    pub(crate) gid_index: Option<u32>,

    /// Service level.
    #[arg(short = 'S', long = "sl", value_name = "SL", default_value_t = 0)]
    pub(crate) sl: u8,

    /// QP timeout code (4.096 us x 2^code).
    #[arg(
        short = 'u',
        long = "qp-timeout",
        value_name = "CODE",
        default_value_t = 14
    )]
    pub(crate) qp_timeout: u8,

    /// Atomic operation of atomic tests: CMP_AND_SWAP or FETCH_AND_ADD (default FETCH_AND_ADD).
    #[arg(short = 'A', long = "atomic_type", value_name = "TYPE")]
    pub(crate) atomic_type: Option<String>,

    /// Outstanding reads/atomics of read and atomic tests (default: the device maximum).
    #[arg(short = 'o', long = "outs", value_name = "N")]
    pub(crate) outs: Option<u32>,

    /// Do not compute the peak bandwidth (BW tests).
    #[arg(short = 'N', long = "noPeak")]
    pub(crate) no_peak: bool,

    /// Accepted for perftest compatibility (there is no CPU-frequency check to silence).
    #[arg(short = 'F', long = "CPU-freq")]
    pub(crate) cpu_freq: bool,

    /// Bidirectional BW: both sides run the test toward each other at the same time, and
    /// each prints the sum of both directions.
    #[arg(short = 'b', long = "bidirectional")]
    pub(crate) bidirectional: bool,

    /// BW tests: run until stopped, printing a row for every -D seconds (default 5) of
    /// traffic.
    #[arg(long = "run_infinitely")]
    pub(crate) run_infinitely: bool,

    /// Report bandwidth in Gb/s instead of MiB/s.
    #[arg(long = "report_gbits")]
    pub(crate) report_gbits: bool,

    /// Save the report in perftest's JSON document, perftest_out.json in the working directory
    /// (every size's results with -a).
    #[arg(long = "out_json")]
    pub(crate) out_json: bool,

    /// Name of the JSON report file (default perftest_out.json; implies --out_json). It is
    /// created before the test starts, so a path that cannot be written fails at once.
    #[arg(long = "out_json_file", value_name = "FILE")]
    pub(crate) out_json_file: Option<PathBuf>,

    /// Latency histogram: not implemented (refused; perftest has it on latency tests only).
    #[arg(short = 'H', long = "report-histogram")]
    pub(crate) histogram: bool,

    /// Seconds the peer may show no sign of life before this side gives up and fails naming
    /// it (0: wait for ever, as perftest does). Not -u (--qp-timeout), the QP's ACK timeout.
    #[arg(long = "timeout", value_name = "SECS", default_value_t = crate::wait::DEFAULT_TIMEOUT.as_secs())]
    pub(crate) peer_timeout: u64,
    /// `--progress manual|auto`.
    #[command(flatten)]
    pub(crate) mode: crate::progress_mode::ProgressArg,
}
