//! The multicast group (MCG) table commands: MGID_HASH names a bucket, WRITE_MCG and READ_MCG
//! round-trip an entry, and every entry or index a driver could get wrong is refused with a
//! status (a member count beyond the entry, a chain link outside the table, an index outside
//! it, the promiscuous-entry write the model does not have).

mod util;

use portverbs_mlx4::layout::mcg::{Mgm, PROT_IB_IPV6};
use portverbs_mlx4::layout::opcode as op;
use portverbs_mlx4::layout::status::Status;
use portverbs_soft::Fabric;
use util::*;

const ENTRY: usize = 1 << LOG_MCG_ENTRY;

fn entry(m: &Mgm) -> Vec<u8> {
    let mut b = vec![0u8; ENTRY];
    assert!(m.encode(&mut b));
    b
}

#[test]
fn mcg_entries_round_trip_and_bad_ones_are_refused() {
    let fabric = Fabric::stepped(1);
    let mut d = Dev::new(&fabric, 1);
    d.bring_up();
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[239, 1, 2, 3]);
    d.inbox.fill(0, 4096, 0).unwrap();
    d.inbox.write(0, &gid).unwrap();
    let addr = d.inbox.device_addr();
    let (s, hash) = d.cmd(op::MGID_HASH, 0, addr, 0, 0);
    assert_eq!(s, 0);
    assert!(hash < 1 << (LOG_MCG - 1), "a bucket: {hash}");
    let (s, again) = d.cmd(op::MGID_HASH, 0, addr, 0, 0);
    assert_eq!((s, again), (0, hash), "the same GID, the same bucket");

    let good = Mgm {
        next: 9,
        prot: PROT_IB_IPV6,
        gid,
        members: vec![0x48, 0x49],
    };
    assert_eq!(d.cmd_in(op::WRITE_MCG, 0, hash as u32, &entry(&good)), 0);
    let (s, back) = d.cmd_out(op::READ_MCG, 0, hash as u32);
    assert_eq!(s, 0);
    assert_eq!(Mgm::decode(&back[..ENTRY]), Some(good.clone()));

    let bad_param = Status::BadParam as u8;
    let other = if hash == 1 { 2 } else { 1 };
    // 25 members in an entry that holds 24.
    let mut full = entry(&good);
    full[4..8].copy_from_slice(&25u32.to_be_bytes());
    assert_eq!(d.cmd_in(op::WRITE_MCG, 0, other, &full), bad_param);
    // A link past the table's 16 entries.
    let far = Mgm {
        next: 16,
        ..good.clone()
    };
    assert_eq!(d.cmd_in(op::WRITE_MCG, 0, other, &entry(&far)), bad_param);
    // An index past the table, for both commands.
    assert_eq!(d.cmd_in(op::WRITE_MCG, 0, 16, &entry(&good)), bad_param);
    assert_eq!(d.cmd_out(op::READ_MCG, 0, u32::MAX).0, bad_param);
    // The promiscuous-entry form (opmod 1).
    assert_eq!(
        d.cmd_in(op::WRITE_MCG, 0x1, other, &entry(&good)),
        bad_param
    );
    // Nothing of those reached the table.
    let (_, back) = d.cmd_out(op::READ_MCG, 0, other);
    assert_eq!(Mgm::decode(&back[..ENTRY]), Some(Mgm::default()));
    // A chain whose links loop (bucket → 9 → 9 …): the lookups each write makes (for the
    // GIDs the entry held and holds) walk it at most once round the table.
    let mut g4 = gid;
    g4[15] = 4;
    let mut g3 = gid;
    g3[15] = 5;
    let self_loop = Mgm {
        next: 9,
        gid: g4,
        members: vec![0x50],
        ..good.clone()
    };
    assert_eq!(d.cmd_in(op::WRITE_MCG, 0, 9, &entry(&self_loop)), 0);
    let into_loop = Mgm {
        next: 9,
        gid: g3,
        members: vec![0x51],
        ..good
    };
    assert_eq!(
        d.cmd_in(op::WRITE_MCG, 0, hash as u32, &entry(&into_loop)),
        0
    );
    fabric.run_until_idle().unwrap();
}
