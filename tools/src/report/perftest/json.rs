//! perftest's `--out_json` document.
//!
//! perftest writes one object with two members: `test_info` (the banner as key/value pairs)
//! and `results` (the result row). It rewrites the file for every size, so after `-a` only the
//! last size is left; this document keeps `results` as that last size and, when more than one
//! size ran, adds `all_results`: an array with every size's `results` object, in the order they
//! ran. Keys and their order follow perftest; numbers are
//! rounded to the decimals perftest prints (`%.2f` for bandwidths and times, `%.6f` for the
//! message rate and for extended-accuracy Gb/s bandwidths), then written by serde_json, which
//! drops trailing zeros (`12.50` becomes `12.5`, the same JSON number).

use serde::ser::{Serialize, Serializer};
use serde_json::Value;

use super::table::bw_extended_accuracy;
use super::{BannerRole, PerftestBanner, TestKind};
use crate::report::numfmt::rounded;
use crate::report::stats::{BwResult, DurationLatency, LatencyStats};

/// A JSON object whose members keep their insertion order.
#[derive(Debug, Default)]
struct Ordered(Vec<(&'static str, Value)>);

impl Ordered {
    fn put(&mut self, key: &'static str, value: impl Into<Value>) {
        self.0.push((key, value.into()));
    }
}

impl Serialize for Ordered {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (*k, v)))
    }
}

/// The whole document.
#[derive(Debug, serde::Serialize)]
struct Document<'a> {
    test_info: Ordered,
    results: &'a Ordered,
    #[serde(skip_serializing_if = "Option::is_none")]
    all_results: Option<Vec<&'a Ordered>>,
}

/// The `results` member of one size (one result row).
#[derive(Debug)]
pub(crate) struct JsonResults(Ordered);

fn on_off(value: bool) -> &'static str {
    if value { "ON" } else { "OFF" }
}

/// The `test_info` member, built from the banner.
fn test_info(b: &PerftestBanner) -> Ordered {
    let mut o = Ordered::default();
    o.put("test", b.title_parts().join("_").replace(' ', "_"));
    if let Some(vector) = b.events_comp_vector {
        o.put(
            "Test with events",
            format!("Using_{}_comp{vector}", b.device),
        );
    }
    o.put("Dual_port", on_off(b.dual_port));
    o.put("Device", b.device.as_str());
    o.put("Number_of_qps", b.num_qps);
    o.put("Transport_type", b.transport.as_str());
    o.put("Connection_type", b.connection.as_str());
    o.put("Using_SRQ", on_off(b.use_srq));
    o.put("PCIe_relax_order", b.pcie_relax_order.as_str());
    o.put("ibv_wr_API", on_off(b.wr_api));
    if b.role == BannerRole::Client || b.bidirectional {
        o.put("TX_depth", b.tx_depth);
    }
    if b.post_list > 1 {
        o.put("Post_List", b.post_list);
    }
    if b.recv_post_list > 1 {
        o.put("Recv_Post_List", b.recv_post_list);
    }
    if b.verb.has_recv_comp() && (b.role == BannerRole::Server || b.bidirectional) {
        o.put("RX_depth", b.rx_depth);
    }
    if b.kind == TestKind::Bw {
        o.put("CQ_Moderation", b.cq_moderation);
    }
    o.put("Mtu", b.mtu);
    o.put("Link_type", b.link_type.as_str());
    if let Some(index) = b.gid_index {
        o.put("GID_index", index);
    }
    if b.verb.uses_outstanding_reads() {
        o.put("Outstand_reads", b.outstanding_reads);
    } else {
        o.put("Max_inline_data", b.max_inline);
    }
    o.put("rdma_cm_QPs", on_off(b.rdma_cm_qps));
    o.put("Use_ROCm_memory", "OFF");
    o.put("Use_MUSA_memory", "OFF");
    o.put(
        "Data_ex_method",
        if b.data_ex_rdma_cm {
            "rdma_cm"
        } else {
            "Ethernet"
        },
    );
    if b.rdma_cm_qps {
        if let Some(tos) = b.tos {
            o.put("TOS", tos);
        }
    }
    o
}

/// The `--out_json` document of a run: `test_info` from the banner, `results` the last of
/// `sizes` (perftest's member) and, when there are several, `all_results` with all of them.
/// An empty `sizes` gives `{}`.
pub(crate) fn json_document(banner: &PerftestBanner, sizes: &[JsonResults]) -> String {
    let Some(last) = sizes.last() else {
        return "{}\n".to_owned();
    };
    let doc = Document {
        test_info: test_info(banner),
        results: &last.0,
        all_results: (sizes.len() > 1).then(|| sizes.iter().map(|r| &r.0).collect()),
    };
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".to_owned());
    text.push('\n');
    text
}

fn finish(mut results: Ordered, cpu_util: Option<f64>) -> JsonResults {
    if let Some(cpu) = cpu_util {
        results.put("CPU_util", rounded(cpu, 2));
    }
    JsonResults(results)
}

/// The `results` of a BW test: `MsgSize`, `n_iterations`, `BW_peak`, `BW_average`, `MsgRate`
/// (and `CPU_util` when measured).
pub(crate) fn bw_results(result: &BwResult, cpu_util: Option<f64>) -> JsonResults {
    let bw_decimals = if bw_extended_accuracy(result) { 6 } else { 2 };
    let mut r = Ordered::default();
    r.put("MsgSize", result.msg_size);
    r.put("n_iterations", result.iterations);
    r.put("BW_peak", rounded(result.bw_peak, bw_decimals));
    r.put("BW_average", rounded(result.bw_average, bw_decimals));
    r.put("MsgRate", rounded(result.msg_rate_mpps, 6));
    finish(r, cpu_util)
}

/// The `results` of a latency test: `MsgSize`, `n_iterations`, `t_min`, `t_max`, `t_typical`,
/// `t_avg`, `t_stdev`, `percentile_99`, `percentile_99.9`.
pub(crate) fn lat_results(
    msg_size: u64,
    iterations: u64,
    stats: &LatencyStats,
    cpu_util: Option<f64>,
) -> JsonResults {
    let mut r = Ordered::default();
    r.put("MsgSize", msg_size);
    r.put("n_iterations", iterations);
    r.put("t_min", rounded(stats.t_min, 2));
    r.put("t_max", rounded(stats.t_max, 2));
    r.put("t_typical", rounded(stats.t_typical, 2));
    r.put("t_avg", rounded(stats.t_avg, 2));
    r.put("t_stdev", rounded(stats.t_stdev, 2));
    r.put("percentile_99", rounded(stats.p99, 2));
    r.put("percentile_99.9", rounded(stats.p99_9, 2));
    finish(r, cpu_util)
}

/// The `results` of a duration-mode latency test: `MsgSize`, `n_iterations`, `t_avg` and
/// `tps_average`.
pub(crate) fn lat_duration_results(
    msg_size: u64,
    result: &DurationLatency,
    cpu_util: Option<f64>,
) -> JsonResults {
    let mut r = Ordered::default();
    r.put("MsgSize", msg_size);
    r.put("n_iterations", result.iterations);
    r.put("t_avg", rounded(result.t_avg, 2));
    r.put("tps_average", rounded(result.tps, 2));
    finish(r, cpu_util)
}
