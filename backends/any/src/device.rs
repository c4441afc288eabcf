//! [`AnyDevice`]: one device type for every backend, so that applications choose the backend at
//! run time (the facade's `portverbs::devices`) and never write generic code.

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
use portverbs_mlx4::Mlx4Device;
use portverbs_soft::SoftDevice;

use crate::queue::{AnyCq, AnyRq, AnySq, AnySrq};

/// A backend's QP resources with its queue objects wrapped in the facade's enums.
fn wrap<S, R>(
    r: QpResources<S, R>,
    sq: impl FnOnce(S) -> AnySq,
    rq: impl FnOnce(R) -> AnyRq,
) -> QpResources<AnySq, AnyRq> {
    QpResources {
        qpn: r.qpn,
        caps: r.caps,
        sq: sq(r.sq),
        rq: r.rq.map(rq),
    }
}

/// A device of any backend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyDevice {
    /// The software RDMA device.
    Soft(SoftDevice),
    /// An mlx4-class HCA (a VFIO-bound ConnectX-3, or the emulated one).
    Mlx4(Mlx4Device),
}

impl From<Mlx4Device> for AnyDevice {
    fn from(d: Mlx4Device) -> Self {
        Self::Mlx4(d)
    }
}

impl From<SoftDevice> for AnyDevice {
    fn from(d: SoftDevice) -> Self {
        Self::Soft(d)
    }
}

impl AnyDevice {
    /// The software device behind this handle, if it is one (for fault injection and
    /// stepping in tests).
    pub fn as_soft(&self) -> Option<&SoftDevice> {
        match self {
            Self::Soft(d) => Some(d),
            Self::Mlx4(_) => None,
        }
    }

    /// The mlx4 device behind this handle, if it is one.
    pub fn as_mlx4(&self) -> Option<&Mlx4Device> {
        match self {
            Self::Mlx4(d) => Some(d),
            Self::Soft(_) => None,
        }
    }

    /// What the device is, known without a command: its name, driver, transport, progress
    /// mode and quirks. The same as the HAL's `Device::info`, without the HAL's trait in
    /// scope (the prelude does not bring it).
    /// (`portverbs::devices().iter().map(|d| d.info().name.clone())` lists the names.)
    pub fn info(&self) -> &DeviceInfo {
        match self {
            Self::Soft(d) => d.info(),
            Self::Mlx4(d) => d.info(),
        }
    }
}

/// Forwards each command to the backend.
macro_rules! forward {
    ($self:ident, $d:ident => $e:expr) => {
        match $self {
            AnyDevice::Soft($d) => $e,
            AnyDevice::Mlx4($d) => $e,
        }
    };
}

impl Device for AnyDevice {
    type Sq = AnySq;
    type Rq = AnyRq;
    type Srq = AnySrq;
    type Cq = AnyCq;

    fn info(&self) -> &DeviceInfo {
        forward!(self, d => d.info())
    }

    #[inline]
    fn dispatch(&self) -> Option<std::time::Instant> {
        forward!(self, d => d.dispatch())
    }

    fn flush_owed(&self) {
        forward!(self, d => d.flush_owed());
    }

    fn wait_source(&self) -> portverbs_hal::WaitSource<'_> {
        forward!(self, d => d.wait_source())
    }

    fn attach_agent(&self, agent: std::sync::Weak<dyn portverbs_hal::ProgressAgent>) -> bool {
        forward!(self, d => d.attach_agent(agent))
    }

    fn alloc_dma(&self, len: usize) -> Result<Arc<dyn DmaMemory>, DmaError> {
        forward!(self, d => d.alloc_dma(len))
    }

    fn map_host(&self, memory: HostMemory) -> Result<Arc<dyn DmaMemory>, MapHostError> {
        forward!(self, d => d.map_host(memory))
    }

    async fn query_device(&self) -> Result<DeviceAttr, CommandError> {
        forward!(self, d => d.query_device().await)
    }

    async fn query_port(&self, port: u8) -> Result<PortAttr, CommandError> {
        forward!(self, d => d.query_port(port).await)
    }

    async fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry, CommandError> {
        forward!(self, d => d.query_gid(port, index).await)
    }

    async fn query_pkey(&self, port: u8, index: u16) -> Result<u16, CommandError> {
        forward!(self, d => d.query_pkey(port, index).await)
    }

    async fn alloc_pd(&self) -> Result<u32, CommandError> {
        forward!(self, d => d.alloc_pd().await)
    }

    async fn dealloc_pd(&self, pd: u32) -> Result<(), CommandError> {
        forward!(self, d => d.dealloc_pd(pd).await)
    }

    async fn create_eq(
        &self,
        params: EqParams,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError> {
        forward!(self, d => d.create_eq(params, sink).await)
    }

    async fn destroy_eq(&self, eqn: u32) -> Result<(), CommandError> {
        forward!(self, d => d.destroy_eq(eqn).await)
    }

    async fn create_cq(&self, params: CqParams) -> Result<AnyCq, CommandError> {
        match self {
            Self::Soft(d) => d.create_cq(params).await.map(AnyCq::Soft),
            Self::Mlx4(d) => d.create_cq(params).await.map(AnyCq::Mlx4),
        }
    }

    async fn resize_cq(&self, cq: &mut AnyCq, entries: u32) -> Result<(), CommandError> {
        match (self, cq) {
            (Self::Soft(d), AnyCq::Soft(cq)) => d.resize_cq(cq, entries).await,
            (Self::Mlx4(d), AnyCq::Mlx4(cq)) => d.resize_cq(cq, entries).await,
            _ => Err(CommandError::InvalidArgument {
                what: "CQ belongs to another device".into(),
            }),
        }
    }

    async fn destroy_cq(&self, cqn: u32) -> Result<(), CommandError> {
        forward!(self, d => d.destroy_cq(cqn).await)
    }

    async fn create_srq(&self, params: SrqParams) -> Result<AnySrq, CommandError> {
        match self {
            Self::Soft(d) => d.create_srq(params).await.map(AnySrq::Soft),
            Self::Mlx4(d) => d.create_srq(params).await.map(AnySrq::Mlx4),
        }
    }

    async fn modify_srq(&self, srqn: u32, change: SrqModify) -> Result<(), CommandError> {
        forward!(self, d => d.modify_srq(srqn, change).await)
    }

    async fn destroy_srq(&self, srqn: u32) -> Result<(), CommandError> {
        forward!(self, d => d.destroy_srq(srqn).await)
    }

    async fn create_qp(
        &self,
        params: QpCreateParams,
    ) -> Result<QpResources<AnySq, AnyRq>, CommandError> {
        match self {
            Self::Soft(d) => d
                .create_qp(params)
                .await
                .map(|r| wrap(r, AnySq::Soft, AnyRq::Soft)),
            Self::Mlx4(d) => d
                .create_qp(params)
                .await
                .map(|r| wrap(r, AnySq::Mlx4, AnyRq::Mlx4)),
        }
    }

    async fn modify_qp(
        &self,
        qpn: u32,
        attr: QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), CommandError> {
        forward!(self, d => d.modify_qp(qpn, attr, mask).await)
    }

    async fn query_qp(&self, qpn: u32, known: QpAttr) -> Result<QpAttr, CommandError> {
        forward!(self, d => d.query_qp(qpn, known).await)
    }

    async fn destroy_qp(&self, qpn: u32) -> Result<(), CommandError> {
        forward!(self, d => d.destroy_qp(qpn).await)
    }

    async fn register_mr(&self, params: MrParams) -> Result<MrKeys, CommandError> {
        forward!(self, d => d.register_mr(params).await)
    }

    async fn rereg_mr(&self, handle: u32, change: MrRereg) -> Result<MrKeys, CommandError> {
        forward!(self, d => d.rereg_mr(handle, change).await)
    }

    async fn deregister_mr(&self, handle: u32) -> Result<(), CommandError> {
        forward!(self, d => d.deregister_mr(handle).await)
    }

    async fn alloc_mw(&self, pd: u32, mw_type: MwType) -> Result<MwKeys, CommandError> {
        forward!(self, d => d.alloc_mw(pd, mw_type).await)
    }

    async fn dealloc_mw(&self, handle: u32) -> Result<(), CommandError> {
        forward!(self, d => d.dealloc_mw(handle).await)
    }

    async fn attach_mcast(&self, qpn: u32, gid: Gid, lid: u16) -> Result<(), CommandError> {
        forward!(self, d => d.attach_mcast(qpn, gid, lid).await)
    }

    async fn detach_mcast(&self, qpn: u32, gid: Gid, lid: u16) -> Result<(), CommandError> {
        forward!(self, d => d.detach_mcast(qpn, gid, lid).await)
    }
}
