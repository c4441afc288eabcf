//! Building the perftest report inputs (banner, address lines) from a connected setup.

use portverbs::hal::LinkLayer;
use portverbs::oob::perftest::Dest;

use super::config::PerfConfig;
use super::setup::{Resolved, Setup, Side};
use crate::report::{Feature, GidLine, PerftestBanner, PerftestDest, RdmaBuffer, TestKind, Verb};

/// The banner of this run (client role).
pub(crate) fn banner(setup: &Setup) -> PerftestBanner {
    banner_of(&setup.cfg, &setup.res, &setup.client)
}

/// The banner of a run whose local side is `side` (client role; the caller sets the role).
pub(crate) fn banner_of(cfg: &PerfConfig, res: &Resolved, side: &Side) -> PerftestBanner {
    let port = &side.port;
    let mut b = PerftestBanner::new(cfg.test.verb, cfg.test.kind, side.ctx.name());
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
    b.mtu = res.mtu.bytes();
    b.link_type = match port.link_layer {
        LinkLayer::Ethernet => "Ethernet".to_owned(),
        LinkLayer::InfiniBand => "IB".to_owned(),
    };
    b.gid_index = port.gid_index.map(u32::from);
    b.max_inline = cfg.inline;
    b.outstanding_reads = u32::from(res.outs);
    b
}

/// The address line data of QP `i` of `side`.
pub(crate) fn dest(setup: &Setup, side: &Side, i: usize) -> PerftestDest {
    dest_at(
        setup.cfg.test.verb,
        setup.res.outs,
        side,
        i,
        side.send_off(i),
    )
}

/// The address line data of QP `i` of `side`, showing the buffer at `offset`.
pub(crate) fn dest_at(verb: Verb, outs: u8, side: &Side, i: usize, offset: usize) -> PerftestDest {
    PerftestDest {
        lid: side.port.lid,
        qpn: side.qps[i].qp_num(),
        psn: side.psns[i],
        out_reads: (verb == Verb::Read).then_some(u32::from(outs)),
        rdma: matches!(verb, Verb::Read | Verb::Write).then(|| RdmaBuffer {
            rkey: side.mr.rkey().unwrap_or(0),
            vaddr: side.mr.addr() + offset as u64,
        }),
        srqn: None,
        gid: match side.port.gid_index {
            Some(_) => GidLine::Gid(side.port.gid),
            None => GidLine::None,
        },
    }
}

/// The address line data of a peer's destination message.
pub(crate) fn remote_dest(verb: Verb, k: &Dest) -> PerftestDest {
    PerftestDest {
        lid: k.lid,
        qpn: k.qpn,
        psn: k.psn,
        out_reads: (verb == Verb::Read).then_some(u32::from(k.out_reads)),
        rdma: matches!(verb, Verb::Read | Verb::Write).then_some(RdmaBuffer {
            rkey: k.rkey,
            vaddr: k.vaddr,
        }),
        srqn: None,
        gid: match k.gid {
            Some(g) => GidLine::Gid(g),
            None => GidLine::None,
        },
    }
}
