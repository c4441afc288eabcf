//! The HAL command interface of the mlx4 driver: every verbs object becomes firmware commands
//! with the contexts of the layouts' `ctx`, and every hot-path queue object gets its memory, MTT
//! range and doorbell record.
//!
//! This file holds what every object shares (the command helpers, rings, the error
//! constructors) and the [`Device`] impl, whose methods hand over to the per-object files:
//! [`query`](super::query), [`eq`](super::eq), [`cq`](super::cq), [`srq`](super::srq),
//! [`qp`](super::qp) and [`pd_mr`](super::pd_mr) (PDs, MRs, MWs).

use std::sync::Arc;

use portverbs_hal::attr::{QpAttr, QpAttrMask};
use portverbs_hal::caps::{DeviceAttr, DeviceInfo, GidEntry, PortAttr};
use portverbs_hal::device::{
    CqParams, Device, EqParams, MrKeys, MrParams, MrRereg, MwKeys, QpCreateParams, QpResources,
    SrqModify, SrqParams,
};
use portverbs_hal::dma::{DmaError, DmaMemory, HostMemory, MapHostError};
use portverbs_hal::error::CommandError;
use portverbs_hal::notify::InterruptSink;
use portverbs_hal::queue::EventQueue;
use portverbs_hal::types::{Gid, MwType};
use zerocopy::{Immutable, IntoBytes};

use super::Mlx4Device;
use crate::cmd::Cmd;
use crate::dma::{Ring, Slots};
use crate::mtt::MttRange;
use crate::queues::Geometry;
use crate::queues::cq::{CqRing, Mlx4Cq};
use crate::queues::rq::Mlx4Rq;
use crate::queues::sq::Mlx4Sq;
use crate::queues::srq::Mlx4Srq;

pub(super) fn invalid(what: impl Into<String>) -> CommandError {
    CommandError::InvalidArgument { what: what.into() }
}

pub(super) fn no(object: &'static str, number: u32) -> CommandError {
    CommandError::NoSuchObject { object, number }
}

pub(super) fn log2(n: u32) -> u8 {
    n.trailing_zeros() as u8
}

impl Mlx4Device {
    pub(super) fn exec_err(&self, r: Result<u64, CommandError>) -> Result<u64, CommandError> {
        self.0.note(&r);
        r
    }

    pub(super) async fn cmd(&self, cmd: Cmd) -> Result<u64, CommandError> {
        self.0.check_alive()?;
        let r = self.0.hcr.exec(cmd).await;
        self.exec_err(r)
    }

    pub(super) async fn cmd_in(&self, cmd: Cmd, inbox: &[u8]) -> Result<u64, CommandError> {
        self.0.check_alive()?;
        let r = self.0.hcr.exec_in(cmd, inbox).await;
        self.exec_err(r)
    }

    pub(super) async fn cmd_out(&self, cmd: Cmd, out: &mut [u8]) -> Result<(), CommandError> {
        self.0.check_alive()?;
        let r = self.0.hcr.exec_out(cmd, out).await;
        self.exec_err(r.map(|()| 0)).map(|_| ())
    }

    /// Writes the MTT range of `mem[offset..offset + len]`, then runs `cmd` with the inbox
    /// `ctx` builds from the range's first entry; the range goes back to the allocator if the
    /// command fails.
    pub(super) async fn sw2hw<C: IntoBytes + Immutable + Send>(
        &self,
        cmd: Cmd,
        mem: &dyn DmaMemory,
        offset: usize,
        len: usize,
        ctx: impl FnOnce(u64) -> C + Send,
    ) -> Result<MttRange, CommandError> {
        let mtt = self.0.mtts.write(&self.0.hcr, mem, offset, len).await?;
        let inbox = ctx(mtt.first);
        if let Err(e) = self.cmd_in(cmd, inbox.as_bytes()).await {
            self.0.mtts.free(mtt);
            return Err(e);
        }
        Ok(mtt)
    }

    /// Takes an object back from the HCA with `cmd`. A failed device counts as success: it
    /// holds nothing any more, and the driver's own bookkeeping must still be released.
    pub(super) async fn hw2sw(&self, cmd: Cmd) -> Result<(), CommandError> {
        match self.cmd(cmd).await {
            Err(e) if !self.is_fatal() => Err(e),
            _ => Ok(()),
        }
    }

    /// A zeroed ring (queue buffer) of `len` bytes.
    pub(super) fn dma(&self, len: usize) -> Result<Ring, CommandError> {
        let mem = self.0.pci.alloc_dma(len)?;
        mem.fill(0, mem.len(), 0)?;
        Ok(Ring::new(mem))
    }

    /// A zeroed ring of `cnt` 32-byte entries (CQEs or EQEs), each marked hardware-owned for
    /// the counter `first..first + cnt` that will use it next (ownership by wrap parity), and its
    /// geometry.
    pub(super) fn entry_ring(
        &self,
        cnt: u32,
        first: u32,
    ) -> Result<(Ring, Geometry), CommandError> {
        let geom = Geometry {
            base: 0,
            shift: 5,
            cnt,
        };
        let ring = self.dma(cnt as usize * 32)?;
        CqRing::init_owner(&Self::slots(&ring, geom)?, first);
        Ok((ring, geom))
    }

    /// `geom`'s slots of `ring` (a region too small for its geometry is refused, not used).
    pub(super) fn slots<const MIN: usize>(
        ring: &Ring,
        geom: Geometry,
    ) -> Result<Slots<MIN>, CommandError> {
        Slots::new(ring.clone(), geom).ok_or_else(|| {
            invalid(format!(
                "{} slots of {} bytes do not fit a {}-byte DMA region",
                geom.cnt,
                geom.stride(),
                ring.mem().len()
            ))
        })
    }
}

impl Device for Mlx4Device {
    type Sq = Mlx4Sq;
    type Rq = Mlx4Rq;
    type Srq = Mlx4Srq;
    type Cq = Mlx4Cq;

    fn info(&self) -> &DeviceInfo {
        &self.0.info
    }

    fn attach_agent(&self, agent: std::sync::Weak<dyn portverbs_hal::ProgressAgent>) -> bool {
        self.0.pci.attach_agent(agent)
    }

    fn alloc_dma(&self, len: usize) -> Result<Arc<dyn DmaMemory>, DmaError> {
        Ok(self.0.pci.alloc_dma(len)?)
    }

    fn map_host(&self, memory: HostMemory) -> Result<Arc<dyn DmaMemory>, MapHostError> {
        self.0.pci.map_host(memory)
    }

    async fn query_device(&self) -> Result<DeviceAttr, CommandError> {
        self.do_query_device().await
    }

    async fn query_port(&self, port: u8) -> Result<PortAttr, CommandError> {
        self.do_query_port(port).await
    }

    async fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry, CommandError> {
        self.do_query_gid(port, index).await
    }

    async fn query_pkey(&self, port: u8, index: u16) -> Result<u16, CommandError> {
        self.do_query_pkey(port, index).await
    }

    async fn alloc_pd(&self) -> Result<u32, CommandError> {
        self.do_alloc_pd().await
    }

    async fn dealloc_pd(&self, pd: u32) -> Result<(), CommandError> {
        self.do_dealloc_pd(pd).await
    }

    async fn create_eq(
        &self,
        params: EqParams,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError> {
        self.do_create_eq(params, sink).await
    }

    async fn destroy_eq(&self, eqn: u32) -> Result<(), CommandError> {
        self.do_destroy_eq(eqn).await
    }

    async fn create_cq(&self, params: CqParams) -> Result<Mlx4Cq, CommandError> {
        self.do_create_cq(params).await
    }

    async fn resize_cq(&self, cq: &mut Mlx4Cq, entries: u32) -> Result<(), CommandError> {
        self.do_resize_cq(cq, entries).await
    }

    async fn destroy_cq(&self, cqn: u32) -> Result<(), CommandError> {
        self.do_destroy_cq(cqn).await
    }

    async fn create_srq(&self, params: SrqParams) -> Result<Mlx4Srq, CommandError> {
        self.do_create_srq(params).await
    }

    async fn modify_srq(&self, srqn: u32, change: SrqModify) -> Result<(), CommandError> {
        self.do_modify_srq(srqn, change).await
    }

    async fn destroy_srq(&self, srqn: u32) -> Result<(), CommandError> {
        self.do_destroy_srq(srqn).await
    }

    async fn create_qp(
        &self,
        params: QpCreateParams,
    ) -> Result<QpResources<Mlx4Sq, Mlx4Rq>, CommandError> {
        self.do_create_qp(params).await
    }

    async fn modify_qp(
        &self,
        qpn: u32,
        attr: QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), CommandError> {
        self.do_modify_qp(qpn, attr, mask).await
    }

    async fn query_qp(&self, qpn: u32, known: QpAttr) -> Result<QpAttr, CommandError> {
        self.do_query_qp(qpn, known).await
    }

    /// Detaches the QP from its multicast groups first: the MCG table must not list a QPN
    /// that a later QP may get.
    async fn destroy_qp(&self, qpn: u32) -> Result<(), CommandError> {
        if let Err(e) = self.detach_all_mcast(qpn).await {
            tracing::warn!(qpn, error = %e, "detaching a destroyed QP from its groups failed");
        }
        self.do_destroy_qp(qpn).await
    }

    async fn register_mr(&self, params: MrParams) -> Result<MrKeys, CommandError> {
        self.do_register_mr(params).await
    }

    async fn rereg_mr(&self, handle: u32, change: MrRereg) -> Result<MrKeys, CommandError> {
        self.do_rereg_mr(handle, change).await
    }

    async fn deregister_mr(&self, handle: u32) -> Result<(), CommandError> {
        self.do_deregister_mr(handle).await
    }

    async fn alloc_mw(&self, pd: u32, mw_type: MwType) -> Result<MwKeys, CommandError> {
        self.do_alloc_mw(pd, mw_type).await
    }

    /// Takes the window's MPT back and frees its number. When the HCA refuses (a live device
    /// that still owns the MPT), the window stays recorded and its number reserved, so no new
    /// MPT is ever written over one the HCA uses; closing the device releases both.
    async fn dealloc_mw(&self, handle: u32) -> Result<(), CommandError> {
        self.do_dealloc_mw(handle).await
    }

    /// Through the HCA's MCG table (`device::mcg`); RoCE ports ignore the LID.
    async fn attach_mcast(&self, qpn: u32, gid: Gid, _lid: u16) -> Result<(), CommandError> {
        self.do_attach_mcast(qpn, gid).await
    }

    async fn detach_mcast(&self, qpn: u32, gid: Gid, _lid: u16) -> Result<(), CommandError> {
        self.do_detach_mcast(qpn, gid).await
    }
}
