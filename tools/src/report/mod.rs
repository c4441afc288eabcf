//! Output formatting and statistics for the `portverbs` CLI.
//!
//! Everything here is a pure function over plain data: the RDMA stack fills the input structs,
//! these functions return the text. The layouts follow the tools RDMA engineers already read
//! and parse, so that existing habits and scripts keep working:
//!
//! * [`devinfo`]: `portverbs devices`, laid out like rdma-core's `ibv_devinfo` (`-l`, `-v`).
//! * [`perftest`]: `portverbs perf`, laid out like linux-rdma/perftest (`ib_write_bw`, …):
//!   banner, address lines, result tables and the `--out_json` document.
//! * [`stats`]: the numbers behind the perftest tables (latency percentiles, bandwidth, peak),
//!   with perftest's semantics.
//! * [`pingpong`]: `portverbs pingpong`, laid out like `ibv_rc_pingpong` (address lines,
//!   result lines).
//! * [`progress`]: a throttled progress line on stderr for long runs.
//!
//! The module sees only numbers, strings and the library's plain types (`Gid`, `QpEndpoint`),
//! whose text forms the library has; the messages the tools exchange with their peers are
//! `portverbs::oob`'s.

pub(crate) mod devinfo;
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
