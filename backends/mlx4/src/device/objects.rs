//! What the driver remembers about each object it created on the HCA: the memory it gave the
//! HCA (queue buffers, MTT ranges, doorbell records), so that destroying the object gives it
//! all back, and the software state QP modifies need.

use std::collections::HashMap;
use std::sync::Arc;

use portverbs_hal::queue::EventQueue;
use portverbs_hal::types::QpType;

use portverbs_hal::dma::DmaMemory;

use crate::dma::Ring;
use crate::doorbell::{DbPages, DbRecord};
use crate::mtt::{MttRange, Mtts};
use crate::queues::Geometry;

/// An EQ's memory.
#[derive(Debug)]
pub(crate) struct EqRec {
    pub(crate) mtt: MttRange,
    pub(crate) _ring: Ring,
}

/// A CQ's memory.
#[derive(Debug)]
pub(crate) struct CqRec {
    pub(crate) mtt: MttRange,
    pub(crate) _ring: Ring,
    pub(crate) db: DbRecord,
}

/// An SRQ's memory.
#[derive(Debug)]
pub(crate) struct SrqRec {
    pub(crate) mtt: MttRange,
    pub(crate) _buf: Ring,
    pub(crate) db: DbRecord,
}

/// A QP: its memory and what its contexts are built from.
#[derive(Debug)]
pub(crate) struct QpRec {
    pub(crate) qp_type: QpType,
    /// The hardware QPN: the key this record is filed under, except for the GSI QP, which
    /// verbs see as QP 1 and the HCA knows as the special block's base + 2 (Linux `mlx4/qp.c`).
    pub(crate) hw_qpn: u32,
    /// A special QP (service type MLX).
    pub(crate) special: bool,
    pub(crate) pd: u32,
    pub(crate) send_cqn: u32,
    pub(crate) recv_cqn: u32,
    pub(crate) srqn: Option<u32>,
    pub(crate) sq: Geometry,
    pub(crate) rq: Option<Geometry>,
    pub(crate) mtt: MttRange,
    pub(crate) _buf: Ring,
    pub(crate) db: DbRecord,
}

/// A memory registration as last written.
#[derive(Debug, Clone)]
pub(crate) struct MrRec {
    pub(crate) key: u32,
    pub(crate) pd: u32,
    pub(crate) region: Arc<dyn DmaMemory>,
    pub(crate) offset: usize,
    pub(crate) length: usize,
    pub(crate) access: portverbs_hal::types::AccessFlags,
    /// Its MTT range while the HCA holds the MPT.
    pub(crate) mtt: Option<MttRange>,
}

/// All objects.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    pub(crate) eqs: HashMap<u32, EqRec>,
    pub(crate) cqs: HashMap<u32, CqRec>,
    pub(crate) srqs: HashMap<u32, SrqRec>,
    pub(crate) qps: HashMap<u32, QpRec>,
    /// Memory registrations by handle (MPT index).
    pub(crate) mrs: HashMap<u32, MrRec>,
    /// Memory-window handles (MPT index) and their PD.
    pub(crate) mws: HashMap<u32, u32>,
    /// The command EQ while commands poll (kept alive, not used).
    pub(crate) parked_eqs: Vec<Box<dyn EventQueue>>,
}

impl Objects {
    pub(crate) fn release_eq(&mut self, eqn: u32, mtts: &Mtts, _dbs: &DbPages) {
        if let Some(r) = self.eqs.remove(&eqn) {
            mtts.free(r.mtt);
        }
        self.parked_eqs.retain(|e| e.eqn() != eqn);
    }
}
