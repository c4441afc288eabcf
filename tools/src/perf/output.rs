//! Building the perftest report inputs (banner, address lines) from a connected setup.

use portverbs::hal::LinkLayer;

use super::setup::{Setup, Side};
use crate::report::{Feature, GidLine, PerftestBanner, PerftestDest, RdmaBuffer, TestKind, Verb};

/// The banner of this run (client role).
pub(crate) fn banner(setup: &Setup) -> PerftestBanner {
    let cfg = &setup.cfg;
    let port = &setup.client.port;
    let mut b = PerftestBanner::new(cfg.test.verb, cfg.test.kind, setup.client.ctx.name());
    b.atomic_op = cfg.atomic;
    b.num_qps = cfg.qps;
    b.connection = cfg.conn.to_string();
    // No PCIe between this process and the soft device; posting uses ibv_post_send-style
    // work-request lists, not the ibv_wr_* API.
    b.pcie_relax_order = Feature::Unsupported;
    b.wr_api = false;
    b.tx_depth = cfg.tx_depth;
    b.rx_depth = cfg.rx_depth;
    b.post_list = if cfg.test.kind == TestKind::Bw {
        cfg.post_list
    } else {
        1
    };
    b.cq_moderation = cfg.cq_mod;
    b.mtu = setup.res.mtu.bytes();
    b.link_type = match port.link_layer {
        LinkLayer::Ethernet => "Ethernet".to_owned(),
        LinkLayer::InfiniBand => "IB".to_owned(),
    };
    b.gid_index = port.gid_index.map(u32::from);
    b.max_inline = cfg.inline;
    b.outstanding_reads = u32::from(setup.res.outs);
    b
}

/// The address line data of QP `i` of `side`.
pub(crate) fn dest(setup: &Setup, side: &Side, i: usize) -> PerftestDest {
    let verb = setup.cfg.test.verb;
    PerftestDest {
        lid: side.port.lid,
        qpn: side.qps[i].qp_num(),
        psn: side.psns[i],
        out_reads: (verb == Verb::Read).then_some(u32::from(setup.res.outs)),
        rdma: matches!(verb, Verb::Read | Verb::Write).then(|| RdmaBuffer {
            rkey: side.mr.rkey().unwrap_or(0),
            vaddr: side.mr.addr() + side.send_off(i) as u64,
        }),
        srqn: None,
        gid: match side.port.gid_index {
            Some(_) => GidLine::Gid(side.port.gid.0),
            None => GidLine::None,
        },
    }
}
