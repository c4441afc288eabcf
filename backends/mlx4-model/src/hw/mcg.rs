//! The multicast group (MCG) table (Linux `drivers/net/ethernet/mellanox/mlx4/mcg.c` is the
//! driver side): MGID_HASH, READ_MCG and WRITE_MCG over the table INIT_HCA placed in ICM, and
//! the lookup the HCA does for a datagram to a group — hash the MGID to its bucket, walk the
//! chain of `next_gid_index` links to the entry with that GID, deliver to its QPs.
//!
//! The transport engine delivers multicast from its own group table, so after every
//! WRITE_MCG the model looks up each group the write touched (the GID the entry held and the
//! one it holds now) as the HCA would and makes the engine's members of that group equal what
//! the lookup finds. Only reachable entries count: an overflow entry the driver unlinked and
//! freed without clearing is not a group any more. The hash is the model's own (a ConnectX-3's
//! is not public): drivers only ever use what MGID_HASH answers.

use portverbs_hal::types::Gid;
use portverbs_mlx4_layout::mcg::Mgm;
use portverbs_mlx4_layout::opcode as op;
use portverbs_mlx4_layout::status::Status;
use portverbs_transport::Engine;

use super::fw::McgLayout;
use super::{CmdResult, Command, Hw};

/// The model's MGID hash: FNV-1a over the 16 bytes, folded to the bucket count.
fn hash(gid: &[u8; 16], l: &McgLayout) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in gid {
        h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    (h ^ (h >> 16)) & (l.buckets() - 1)
}

impl Hw {
    fn mcg_layout(&self) -> Result<McgLayout, Status> {
        self.layout()?.mcg.ok_or(Status::BadParam)
    }

    fn read_entry(&self, l: &McgLayout, index: u32) -> Result<Vec<u8>, Status> {
        if index >= l.entries() {
            return Err(Status::BadParam);
        }
        self.icm_read(l.base + u64::from(index) * l.entry() as u64, l.entry())
    }

    pub(super) fn mcg_command(&mut self, engine: &mut Engine, cmd: &Command) -> CmdResult {
        let l = self.mcg_layout()?;
        match cmd.opcode {
            op::MGID_HASH => {
                let b = self.mailbox(cmd.in_param, 16)?;
                let v = b.vec(0, 16).ok_or(Status::BadParam)?;
                let mut gid = [0u8; 16];
                gid.copy_from_slice(&v);
                Ok(Some(u64::from(hash(&gid, &l))))
            }
            op::READ_MCG => {
                let e = self.read_entry(&l, cmd.in_mod)?;
                self.outbox(cmd.out_param, &e)?;
                Ok(None)
            }
            op::WRITE_MCG => {
                // opmod 1 writes a port's promiscuous entry (Ethernet steering): not modelled.
                if cmd.opmod != 0 {
                    return Err(Status::BadParam);
                }
                let old = Mgm::decode(&self.read_entry(&l, cmd.in_mod)?);
                let new = self
                    .mailbox(cmd.in_param, l.entry())?
                    .vec(0, l.entry())
                    .ok_or(Status::BadParam)?;
                let decoded = Mgm::decode(&new).ok_or(Status::BadParam)?;
                if decoded.next >= l.entries() {
                    return Err(Status::BadParam);
                }
                self.icm_write(l.base + u64::from(cmd.in_mod) * l.entry() as u64, &new)?;
                let mut touched = vec![decoded.gid];
                if let Some(o) = old.filter(|o| o.gid != decoded.gid) {
                    touched.push(o.gid);
                }
                for gid in touched {
                    if gid != [0; 16] {
                        self.sync_group(engine, &l, gid);
                    }
                }
                Ok(None)
            }
            _ => Err(Status::BadOp),
        }
    }

    /// The members of `gid` as the HCA finds them: its bucket's chain, walked at most once
    /// round the table (a loop the driver wrote ends there).
    fn lookup(&self, l: &McgLayout, gid: &[u8; 16]) -> Vec<u32> {
        let mut index = hash(gid, l);
        for _ in 0..l.entries() {
            let Some(m) = self.read_entry(l, index).ok().and_then(|e| Mgm::decode(&e)) else {
                return Vec::new();
            };
            if m.members.is_empty() {
                // An empty bucket: no group hashes here (an empty overflow entry is an error
                // of the driver's; nothing is delivered either way).
                return Vec::new();
            }
            if m.gid == *gid {
                return m.qpns().collect();
            }
            if m.next == 0 {
                return Vec::new();
            }
            index = m.next;
        }
        Vec::new()
    }

    /// Makes the engine's members of `gid` what the table says.
    fn sync_group(&self, engine: &mut Engine, l: &McgLayout, gid: [u8; 16]) {
        let gid_t = Gid(gid);
        let want = self.lookup(l, &gid);
        let have: Vec<u32> = engine.mcast_members(&gid_t).to_vec();
        for q in have.iter().filter(|q| !want.contains(q)) {
            let _ = engine.mcast_detach(*q, gid_t);
        }
        for q in want.iter().filter(|q| !have.contains(q)) {
            // A QPN that is no UD QP of this HCA receives nothing, as on the hardware.
            let _ = engine.mcast_attach(*q, gid_t);
        }
    }
}
