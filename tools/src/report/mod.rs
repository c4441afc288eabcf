//! Output formatting and statistics for the `portverbs` CLI.
//!
//! Everything here is a pure function over plain data: the RDMA stack fills the input structs,
//! these functions return the text. The layouts follow the tools RDMA engineers already read
//! and parse, so that existing habits and scripts keep working:
//!
//! * [`devinfo`]: `portverbs devices`, laid out like rdma-core's `ibv_devinfo` (`-l`, `-v`).
//! * [`perftest`]: `portverbs perf`, laid out like linux-rdma/perftest (`ib_write_bw`, …):
//!   banner, address lines, result tables and the `--out_json` document; and the messages of
//!   perftest's TCP side channel ([`perftest::wire`]), so that a perftest program can be the
//!   other end.
//! * [`stats`]: the numbers behind the perftest tables (latency percentiles, bandwidth, peak),
//!   with perftest's semantics.
//! * [`pingpong`]: `portverbs pingpong`, interoperable with `ibv_rc_pingpong` (TCP exchange
//!   message, address lines, result lines).
//! * [`progress`]: a throttled progress line on stderr for long runs.
//!
//! The module has no dependency on the other Portverbs crates; it only sees numbers and strings.

pub(crate) mod devinfo;
pub(crate) mod gid;
pub(crate) mod numfmt;
pub(crate) mod perftest;
pub(crate) mod pingpong;
pub(crate) mod progress;
pub(crate) mod stats;

pub(crate) use devinfo::{
    DevinfoDevice, DevinfoExtCaps, DevinfoGid, DevinfoLimits, DevinfoPort, DevinfoPortExtra,
    GidType, format_device, format_list,
};
pub(crate) use perftest::{
    AddressSide, AtomicOp, Feature, GidLine, PerftestBanner, PerftestDest, RdmaBuffer, TestKind,
    Verb, bw_header, bw_results, bw_row, format_address, format_banner, json_document,
    lat_duration_header, lat_duration_results, lat_duration_row, lat_header, lat_results, lat_row,
    result_rule,
};
pub(crate) use pingpong::PingpongSide;
pub(crate) use progress::Progress;
pub(crate) use stats::{
    BwResult, BwUnits, CompletionMark, DurationLatency, bw_result, duration_latency, latency_stats,
};
