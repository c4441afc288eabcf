//! perftest conventions (`ib_write_bw`, `ib_read_lat`, …): the banner printed before a test.
//!
//! A perftest run prints, in order: the banner ([`format_banner`]) between two 87-dash rules,
//! the local and remote address lines ([`format_address`]), the result table header
//! ([`bw_header`], [`lat_header`], [`lat_duration_header`]), one row per message size
//! ([`bw_row`], [`lat_row`], [`lat_duration_row`]) and a closing rule ([`result_rule`]).
//! With `--out_json` the rows are also written as a JSON document ([`json_document`] of
//! [`bw_results`], …).
//!
//! The banner follows perftest's `key : value` layout, two columns joined by two tabs on the
//! first lines. Lines that newer perftest releases added to the right column (`Lock-free`,
//! `Using Enhanced Reorder`) and `CQE Poll Batch` are printed only when the corresponding
//! field is set, so both the older and the current layout can be produced. Lines for features
//! Portverbs does not have (GPU memory, AES-XTS, DC streams, MAC forwarding, multicast, NUMA)
//! are not produced.

mod address;
mod json;
mod table;

use std::fmt::Write as _;

pub(crate) use address::{AddressSide, GidLine, PerftestDest, RdmaBuffer, format_address};
pub(crate) use json::{JsonResults, bw_results, json_document, lat_duration_results, lat_results};
pub(crate) use table::{
    RESULT_RULE, bw_header, bw_row, lat_duration_header, lat_duration_row, lat_header, lat_row,
    result_rule,
};

/// The operation a test measures (perftest's `testsStr` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    /// `Send` (`ib_send_*`).
    Send,
    /// `RDMA_Write` (`ib_write_*`).
    Write,
    /// `RDMA_Read` (`ib_read_*`).
    Read,
    /// `Atomic` (`ib_atomic_*`).
    Atomic,
}

impl Verb {
    /// The name perftest prints for the verb.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Send => "Send",
            Self::Write => "RDMA_Write",
            Self::Read => "RDMA_Read",
            Self::Atomic => "Atomic",
        }
    }

    /// Whether the receiver sees completions (and so has an RX depth).
    pub(crate) fn has_recv_comp(self) -> bool {
        matches!(self, Self::Send)
    }

    /// Whether the test is limited by outstanding reads/atomics instead of inline size.
    pub(crate) fn uses_outstanding_reads(self) -> bool {
        matches!(self, Self::Read | Self::Atomic)
    }
}

/// The atomic operation of an atomic test (`-A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtomicOp {
    /// `CMP_AND_SWAP`.
    CmpAndSwap,
    /// `FETCH_AND_ADD` (perftest's default).
    FetchAndAdd,
}

impl AtomicOp {
    /// The name perftest prints.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::CmpAndSwap => "CMP_AND_SWAP",
            Self::FetchAndAdd => "FETCH_AND_ADD",
        }
    }
}

/// Bandwidth or latency test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TestKind {
    /// Bandwidth (`*_bw`).
    Bw,
    /// Latency (`*_lat`).
    Lat,
}

/// Which side of the connection prints the banner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BannerRole {
    /// The side started with a server address.
    Client,
    /// The listening side.
    Server,
}

/// A banner value that is `ON`, `OFF` or `Unsupported`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Feature {
    /// Printed `ON`.
    On,
    /// Printed `OFF`.
    #[cfg_attr(
        not(test),
        allow(
            dead_code,
            reason = "the CLI prints ON or Unsupported; the layout is tested"
        )
    )]
    Off,
    /// Printed `Unsupported`.
    Unsupported,
}

impl Feature {
    /// The banner text.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::On => "ON",
            Self::Off => "OFF",
            Self::Unsupported => "Unsupported",
        }
    }
}

/// CQE polling batch shown by newer perftest BW banners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CqePoll {
    // The CLI uses the older layout without this line; both layouts are tested.
    /// Printed `Dynamic`.
    #[cfg_attr(
        not(test),
        allow(
            dead_code,
            reason = "only the newer perftest layout has this line; it is tested"
        )
    )]
    Dynamic,
    /// A fixed batch size.
    #[cfg_attr(
        not(test),
        allow(
            dead_code,
            reason = "only the newer perftest layout has this line; it is tested"
        )
    )]
    Batch(u16),
}

/// Everything the perftest banner shows. Build with [`PerftestBanner::new`] and adjust fields.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PerftestBanner {
    /// Measured operation.
    pub(crate) verb: Verb,
    /// Atomic operation (shown only when `verb` is [`Verb::Atomic`]).
    pub(crate) atomic_op: AtomicOp,
    /// Bandwidth or latency.
    pub(crate) kind: TestKind,
    /// Client or server.
    pub(crate) role: BannerRole,
    /// `-b`: both directions.
    pub(crate) bidirectional: bool,
    /// `-l`: work requests per post (a `Post List` line when above 1).
    pub(crate) post_list: u32,
    /// Receive work requests per post (a `Recv Post List` line when above 1).
    pub(crate) recv_post_list: u32,
    /// `-e`: completion vector used for events (adds the "Test with events" line).
    pub(crate) events_comp_vector: Option<u32>,
    /// Dual-port mode.
    pub(crate) dual_port: bool,
    /// Device name (`mlx5_0`, `rxe0`, …).
    pub(crate) device: String,
    /// `-q`: number of QPs.
    pub(crate) num_qps: u32,
    /// Transport type as perftest names it: `IB`, `IW` or `Unknown`.
    pub(crate) transport: String,
    /// Connection type: `RC`, `UC`, `UD`, `XRC`, `DC`, `SRD`.
    pub(crate) connection: String,
    /// `--use-srq`.
    pub(crate) use_srq: bool,
    /// PCIe relaxed ordering.
    pub(crate) pcie_relax_order: Feature,
    /// Right column of the PCIe line in newer perftest (`Lock-free`); `None` omits it.
    pub(crate) lock_free: Option<Feature>,
    /// `ibv_wr* API` ON (the default) or OFF (`--use_old_post_send`).
    pub(crate) wr_api: bool,
    /// Right column of the API line in newer perftest (`Using Enhanced Reorder`).
    pub(crate) enhanced_reorder: Option<bool>,
    /// `-t`: send queue depth (shown on the client and in bidirectional runs).
    pub(crate) tx_depth: u32,
    /// `-r`: receive queue depth (shown on receivers of send-type tests).
    pub(crate) rx_depth: u32,
    /// `-Q`: CQ moderation (BW tests).
    pub(crate) cq_moderation: u32,
    /// CQE polling batch (BW tests, newer perftest); `None` omits the line.
    pub(crate) cqe_poll: Option<CqePoll>,
    /// Path MTU in bytes.
    pub(crate) mtu: u32,
    /// Link type as perftest names it: `IB` or `Ethernet`.
    pub(crate) link_type: String,
    /// `-x`: GID index, shown when set.
    pub(crate) gid_index: Option<u32>,
    /// Max inline data in bytes (shown unless the verb uses outstanding reads).
    pub(crate) max_inline: u32,
    /// `-o`: outstanding reads/atomics (shown for read and atomic tests).
    pub(crate) outstanding_reads: u32,
    /// `-R`: test QPs connected with rdma_cm.
    pub(crate) rdma_cm_qps: bool,
    /// The side channel runs over rdma_cm (`Data ex. method : rdma_cm`) instead of TCP.
    pub(crate) data_ex_rdma_cm: bool,
    /// Type of service, shown after the data exchange method when `rdma_cm_qps`.
    pub(crate) tos: Option<u8>,
}

impl PerftestBanner {
    /// A banner with perftest's defaults for a single-QP RC test on an IB link, client side:
    /// TX depth 128 (BW) or 1 (latency), RX depth 512, CQ moderation 100, MTU 4096, inline 0,
    /// one outstanding read, `ibv_wr*` API on, PCIe relaxed ordering on, TCP data exchange.
    pub(crate) fn new(verb: Verb, kind: TestKind, device: &str) -> Self {
        Self {
            verb,
            atomic_op: AtomicOp::FetchAndAdd,
            kind,
            role: BannerRole::Client,
            bidirectional: false,
            post_list: 1,
            recv_post_list: 1,
            events_comp_vector: None,
            dual_port: false,
            device: device.to_owned(),
            num_qps: 1,
            transport: "IB".to_owned(),
            connection: "RC".to_owned(),
            use_srq: false,
            pcie_relax_order: Feature::On,
            lock_free: None,
            wr_api: true,
            enhanced_reorder: None,
            tx_depth: if kind == TestKind::Bw { 128 } else { 1 },
            rx_depth: 512,
            cq_moderation: 100,
            cqe_poll: None,
            mtu: 4096,
            link_type: "IB".to_owned(),
            gid_index: None,
            max_inline: 0,
            outstanding_reads: 1,
            rdma_cm_qps: false,
            data_ex_rdma_cm: false,
            tos: None,
        }
    }

    /// The centred title without padding, e.g. `RDMA_Write BW Test`.
    pub(crate) fn title(&self) -> String {
        self.title_parts().join(" ")
    }

    /// The title words; the JSON `test` value joins them with `_`.
    fn title_parts(&self) -> Vec<&'static str> {
        let mut parts = vec![self.verb.name()];
        if self.verb == Verb::Atomic {
            parts.push(self.atomic_op.name());
        }
        match self.kind {
            TestKind::Bw => {
                if self.bidirectional {
                    parts.push("Bidirectional");
                }
                if self.post_list > 1 {
                    parts.push("Post List");
                }
                parts.push("BW");
            }
            TestKind::Lat => parts.push("Latency"),
        }
        parts.push("Test");
        parts
    }

    /// Whether the `TX depth` line appears (client side, or any side when bidirectional).
    fn shows_tx_depth(&self) -> bool {
        self.role == BannerRole::Client || self.bidirectional
    }

    /// Whether the `RX depth` line appears (receivers of tests with receive completions).
    fn shows_rx_depth(&self) -> bool {
        self.verb.has_recv_comp() && (self.role == BannerRole::Server || self.bidirectional)
    }
}

fn on_off(value: bool) -> &'static str {
    if value { "ON" } else { "OFF" }
}

/// Formats the perftest banner, from the opening rule to the closing rule (each line ends
/// with `\n`).
pub(crate) fn format_banner(b: &PerftestBanner) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{RESULT_RULE}");
    let _ = writeln!(o, "{:20}{}", "", b.title());
    if let Some(vector) = b.events_comp_vector {
        let _ = writeln!(o, " Test with events. Using {}_comp{vector}", b.device);
    }
    let _ = writeln!(
        o,
        " Dual-port       : {}\t\tDevice         : {}",
        on_off(b.dual_port),
        b.device
    );
    let _ = writeln!(
        o,
        " Number of qps   : {}\t\tTransport type : {}",
        b.num_qps, b.transport
    );
    let _ = writeln!(
        o,
        " Connection type : {}\t\tUsing SRQ      : {}",
        b.connection,
        on_off(b.use_srq)
    );
    let _ = write!(o, " PCIe relax order: {}", b.pcie_relax_order.as_str());
    if let Some(lock_free) = b.lock_free {
        let _ = write!(o, "\t\tLock-free      : {}", lock_free.as_str());
    }
    let _ = write!(o, "\n ibv_wr* API     : {}", on_off(b.wr_api));
    if let Some(reorder) = b.enhanced_reorder {
        let _ = write!(o, "\t\tUsing Enhanced Reorder      : {}", on_off(reorder));
    }
    o.push('\n');
    if b.shows_tx_depth() {
        let _ = writeln!(o, " TX depth        : {}", b.tx_depth);
    }
    if b.post_list > 1 {
        let _ = writeln!(o, " Post List       : {}", b.post_list);
    }
    if b.recv_post_list > 1 {
        let _ = writeln!(o, " Recv Post List  : {}", b.recv_post_list);
    }
    if b.shows_rx_depth() {
        let _ = writeln!(o, " RX depth        : {}", b.rx_depth);
    }
    if b.kind == TestKind::Bw {
        let _ = writeln!(o, " CQ Moderation   : {}", b.cq_moderation);
        match b.cqe_poll {
            Some(CqePoll::Dynamic) => o.push_str(" CQE Poll Batch  : Dynamic\n"),
            Some(CqePoll::Batch(n)) => {
                let _ = writeln!(o, " CQE Poll Batch  : {n}");
            }
            None => {}
        }
    }
    let _ = writeln!(o, " Mtu             : {}[B]", b.mtu);
    let _ = writeln!(o, " Link type       : {}", b.link_type);
    if let Some(index) = b.gid_index {
        let _ = writeln!(o, " GID index       : {index}");
    }
    if b.verb.uses_outstanding_reads() {
        let _ = writeln!(o, " Outstand reads  : {}", b.outstanding_reads);
    } else {
        let _ = writeln!(o, " Max inline data : {}[B]", b.max_inline);
    }
    let _ = writeln!(o, " rdma_cm QPs\t : {}", on_off(b.rdma_cm_qps));
    let method = if b.data_ex_rdma_cm {
        "rdma_cm"
    } else {
        "Ethernet"
    };
    let _ = write!(o, " Data ex. method : {method}");
    if b.rdma_cm_qps {
        if let Some(tos) = b.tos {
            let _ = write!(o, " \tTOS    : {tos}");
        }
        if b.role == BannerRole::Server {
            let _ = write!(
                o,
                "\n{RESULT_RULE}\n Waiting for client rdma_cm QP to connect\n \
                 Please run the same command with the IB/RoCE interface IP"
            );
        }
    }
    o.push('\n');
    let _ = writeln!(o, "{RESULT_RULE}");
    o
}

#[cfg(test)]
mod tests;
