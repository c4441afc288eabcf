//! Arbitrary bytes as a command outbox or a context read back from the device: every reader
//! must not panic, must return `Some` exactly when there are enough bytes and then the bytes
//! unchanged, and page-list chunks must be aligned powers of two. The driver's validated
//! parsers of the QUERY_FW / QUERY_DEV_CAP / QUERY_PORT outboxes (`caps`) get the same bytes
//! and, when they accept them, must keep their promises.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portverbs_mlx4::caps;
use portverbs_mlx4::layout::ctx::{CqContext, EqContext, Mpt, QpMailbox, SrqContext};
use portverbs_mlx4::layout::mailbox::{DevCap, PageListEntry, QueryFw, QueryPort, dev_flag};
use portverbs_mlx4::layout::read;
use zerocopy::{FromBytes, Immutable, IntoBytes};

fn check<T: FromBytes + IntoBytes + Immutable>(data: &[u8]) -> Option<T> {
    let v = read::<T>(data);
    let n = size_of::<T>();
    assert_eq!(v.is_some(), data.len() >= n);
    if let Some(v) = &v {
        assert_eq!(v.as_bytes(), &data[..n]);
    }
    v
}

fuzz_target!(|data: &[u8]| {
    check::<QueryFw>(data);
    check::<DevCap>(data);
    check::<QueryPort>(data);
    check::<QpMailbox>(data);
    check::<Mpt>(data);
    check::<CqContext>(data);
    check::<EqContext>(data);
    check::<SrqContext>(data);
    // A page list is a run of entries; check each one.
    for entry in data.chunks_exact(size_of::<PageListEntry>()) {
        let e = check::<PageListEntry>(entry).unwrap();
        if let Some((pa, bytes)) = e.chunk() {
            assert!(bytes.is_power_of_two() && bytes >= 4096);
            assert_eq!(pa % bytes, 0);
        }
    }
    if let Ok(f) = caps::parse_fw(data) {
        assert!((1..=1 << 14).contains(&f.fw_pages) && f.cmd_if_rev >= 3);
        assert!(f.max_cmds.is_power_of_two() && f.max_cmds <= 256);
    }
    if let Ok(c) = caps::parse_dev_cap(data) {
        for (reserved, log_max) in [
            (c.reserved_qps, c.log_max_qp),
            (c.reserved_srqs, c.log_max_srq),
            (c.reserved_cqs, c.log_max_cq),
            (c.reserved_mpts, c.log_max_mpt),
            (c.reserved_mtts, c.log_max_mtt),
        ] {
            assert!(log_max <= 30 && u64::from(reserved) < 1u64 << log_max);
        }
        assert!(c.reserved_eqs < (1u32 << c.log_max_eq).max(1));
        assert!(c.reserved_uars >= 1 && c.reserved_uars < c.num_uars);
        assert!((1..=2).contains(&c.num_ports));
        assert!(c.flags & dev_flag::RC != 0 && c.flags & dev_flag::UD != 0);
        for sz in [
            c.qpc_entry_sz,
            c.aux_entry_sz,
            c.altc_entry_sz,
            c.rdmarc_entry_sz,
            c.eqc_entry_sz,
            c.cqc_entry_sz,
            c.srq_entry_sz,
            c.cmpt_entry_sz,
            c.mtt_entry_sz,
            c.dmpt_entry_sz,
        ] {
            assert!(sz.is_power_of_two() && sz <= 4096);
        }
        assert!(u64::from(c.bf_reg_size) * u64::from(c.bf_regs_per_page) <= 4096);
        assert!(c.max_desc_sz_sq >= 64 && c.max_desc_sz_rq >= 16);
    }
    if let Ok(p) = caps::parse_port(data) {
        assert!((1..=5).contains(&p.max_mtu));
    }
});
