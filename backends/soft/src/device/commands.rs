//! The HAL command interface of the software device. Commands complete synchronously (the
//! returned futures are ready on first poll); they validate every argument a firmware would and
//! answer with typed errors.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::engine::Membership;
use portverbs_hal::attr::{QpAttr, QpAttrMask, QpCaps};
use portverbs_hal::caps::{DeviceAttr, DeviceInfo, GidEntry, GidType, PortAttr};
use portverbs_hal::device::{
    CqParams, Device, EqKind, EqParams, MrKeys, MrParams, MrRereg, MwKeys, QpCreateParams,
    QpResources, SrqModify, SrqParams,
};
use portverbs_hal::dma::{DmaError, DmaMemory, HostMemory, MapHostError};
use portverbs_hal::error::CommandError;
use portverbs_hal::notify::InterruptSink;
use portverbs_hal::queue::EventQueue;
use portverbs_hal::types::{Gid, MwType, QpType};

use super::SoftDevice;
use super::doorbell::{CqDoorbell, EqDoorbell, RqDoorbell, SqDoorbell, SrqDoorbell};
use super::format::{
    self, CQE_SIZE, DATAGRAM_SEG, EQE_SIZE, RECV_HEADER, RECV_MIN, RecvFormat, SEND_HEADER,
    SGE_SIZE, SendFormat,
};
use super::hw::{HwCq, HwEq, HwQp, HwSrq, HwWq};
use super::queues::{CqRing, EqRing, SoftCq, SoftEq, SoftRq, SoftSq, SoftSrq};
use super::state::limits::*;
use crate::dma::SoftDma;
use crate::dma::queue::WorkRing;
use crate::dma::ring::{Geometry, Producer, Ring, Slots};
use crate::engine::QpInit;
use crate::engine::memory::MrSpec;

fn invalid(what: impl Into<String>) -> CommandError {
    CommandError::InvalidArgument { what: what.into() }
}

fn no(object: &'static str, number: u32) -> CommandError {
    CommandError::NoSuchObject { object, number }
}

impl SoftDevice {
    fn check_alive(&self) -> Result<(), CommandError> {
        if self.is_fatal() {
            Err(CommandError::DeviceFatal)
        } else {
            Ok(())
        }
    }

    fn ring(&self, bytes: usize) -> Result<Arc<SoftDma>, CommandError> {
        Ok(SoftDma::alloc_tracked(bytes, Some(self.dma.clone()))?)
    }

    /// A ring of at least `entries` entries of at least `stride` bytes (both rounded up to
    /// powers of two), its geometry checked once here.
    fn slots<const MIN: usize>(
        &self,
        entries: u32,
        stride: usize,
    ) -> Result<Slots<MIN>, CommandError> {
        let bad = || invalid(format!("a ring of {entries} entries of {stride} bytes"));
        let geom = Geometry::for_at_least(entries, stride).ok_or_else(bad)?;
        Slots::new(Ring::new(self.ring(geom.bytes())?), geom).ok_or_else(bad)
    }

    /// The same ring seen with another `MIN` (the device side's view of a work queue).
    fn view<const A: usize, const B: usize>(slots: &Slots<A>) -> Result<Slots<B>, CommandError> {
        Slots::new(slots.ring().clone(), slots.geom())
            .ok_or_else(|| invalid(format!("a ring of {}-byte slots", slots.geom().stride())))
    }

    fn downcast(region: &Arc<dyn DmaMemory>) -> Result<Arc<SoftDma>, CommandError> {
        region
            .clone()
            .into_any_arc()
            .downcast::<SoftDma>()
            .map_err(|_| CommandError::Dma(DmaError::Foreign))
    }

    /// Grants send-queue capacities: what was asked, plus whatever else fits the power-of-two
    /// slot, within the device limits.
    fn grant_send(qp_type: QpType, caps: &QpCaps) -> (usize, u32, u32) {
        let stride = format::send_stride(qp_type, caps.max_send_sge.max(1), caps.max_inline_data);
        let fixed = SEND_HEADER
            + if qp_type == QpType::Ud {
                DATAGRAM_SEG
            } else {
                0
            };
        let room = stride - fixed;
        let sge = ((room / SGE_SIZE) as u32).min(MAX_SGE);
        let inline = (room as u32).min(MAX_INLINE);
        (stride, sge, inline)
    }
}

impl Device for SoftDevice {
    type Sq = SoftSq;
    type Rq = SoftRq;
    type Srq = SoftSrq;
    type Cq = SoftCq;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn dispatch(&self) -> Option<std::time::Instant> {
        self.fabric().dispatch()
    }

    fn flush_owed(&self) {
        self.fabric().flush_owed();
    }

    fn wait_source(&self) -> portverbs_hal::WaitSource<'_> {
        self.fabric().wait_source()
    }

    fn attach_agent(&self, agent: std::sync::Weak<dyn portverbs_hal::ProgressAgent>) -> bool {
        self.fabric().attach_agent(agent)
    }

    fn alloc_dma(&self, len: usize) -> Result<Arc<dyn DmaMemory>, DmaError> {
        Ok(SoftDma::alloc_tracked(len, Some(self.dma.clone()))?)
    }

    fn map_host(&self, memory: HostMemory) -> Result<Arc<dyn DmaMemory>, MapHostError> {
        // No IOMMU: the engine reaches the application's bytes where they are.
        Ok(SoftDma::from_host(memory, Some(self.dma.clone()))?)
    }

    async fn query_device(&self) -> Result<DeviceAttr, CommandError> {
        self.check_alive()?;
        Ok(self.with(|d, _, _| d.state.attr.clone()))
    }

    async fn query_port(&self, port: u8) -> Result<PortAttr, CommandError> {
        self.check_alive()?;
        self.with(|d, _, _| {
            d.state
                .ports
                .get(usize::from(port).wrapping_sub(1))
                .map(|p| {
                    let v = d.engine.port_violations(port);
                    let sat = |n: u64| u16::try_from(n).unwrap_or(u16::MAX);
                    PortAttr {
                        bad_pkey_cntr: sat(v.bad_pkey),
                        qkey_viol_cntr: sat(v.bad_qkey),
                        ..p.attr.clone()
                    }
                })
                .ok_or_else(|| invalid(format!("port {port} does not exist")))
        })
    }

    async fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry, CommandError> {
        self.check_alive()?;
        self.with(|d, _, _| {
            let p = d
                .state
                .ports
                .get(usize::from(port).wrapping_sub(1))
                .ok_or_else(|| invalid(format!("port {port} does not exist")))?;
            if index >= p.attr.gid_tbl_len {
                return Err(invalid(format!(
                    "GID index {index} beyond a table of {}",
                    p.attr.gid_tbl_len
                )));
            }
            match p.gids.get(index as usize) {
                Some(gid) => Ok(GidEntry {
                    gid: *gid,
                    gid_type: GidType::RoceV2,
                }),
                None => Err(no("GID entry", index)),
            }
        })
    }

    async fn query_pkey(&self, port: u8, index: u16) -> Result<u16, CommandError> {
        self.check_alive()?;
        let ports = self.with(|d, _, _| d.state.ports.len());
        if port == 0 || usize::from(port) > ports {
            return Err(invalid(format!("port {port} does not exist")));
        }
        match index {
            0 => Ok(0xffff),
            _ => Err(invalid(format!("P_Key index {index} beyond a table of 1"))),
        }
    }

    async fn alloc_pd(&self) -> Result<u32, CommandError> {
        self.check_alive()?;
        self.with(|d, _, _| {
            if d.state.pds.len() >= MAX_PD as usize {
                return Err(CommandError::ResourceExhausted { resource: "PDs" });
            }
            let mut pd = d.state.next_pd;
            while pd == 0 || d.state.pds.contains(&pd) {
                pd = pd.wrapping_add(1) & 0x00ff_ffff;
            }
            d.state.next_pd = pd.wrapping_add(1) & 0x00ff_ffff;
            d.state.pds.insert(pd);
            Ok(pd)
        })
    }

    async fn dealloc_pd(&self, pd: u32) -> Result<(), CommandError> {
        self.with(|d, _, _| {
            if d.state.pds.remove(&pd) {
                Ok(())
            } else {
                Err(no("PD", pd))
            }
        })
    }

    async fn create_eq(
        &self,
        params: EqParams,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError> {
        self.check_alive()?;
        if params.entries == 0 || params.entries > 1 << 16 {
            return Err(invalid(format!("{} EQ entries", params.entries)));
        }
        let ring = self.slots::<EQE_SIZE>(params.entries, EQE_SIZE)?;
        let geom = ring.geom();
        EqRing::init_owner(&ring, 0);
        let db = Arc::new(EqDoorbell::default());
        db.armed.store(true, Ordering::Release);
        self.with(|d, _, _| {
            let eqn = d.hw.eqs.free_number(0);
            d.hw.eqs.insert(
                eqn,
                HwEq {
                    ring: ring.clone(),
                    producer: Producer::new(geom),
                    db: db.clone(),
                    sink: sink.clone(),
                },
            );
            if params.kind == EqKind::Async {
                d.hw.async_eqn = Some(eqn);
            }
            Ok(Box::new(SoftEq {
                eqn,
                ring: EqRing::new(ring, 0),
                db,
                sink,
            }) as Box<dyn EventQueue>)
        })
    }

    async fn destroy_eq(&self, eqn: u32) -> Result<(), CommandError> {
        self.with(|d, _, _| {
            if d.hw.cqs.iter_mut().any(|(_, cq)| cq.eqn == eqn) {
                return Err(CommandError::Busy {
                    object: "EQ",
                    reason: "completion queues still report to it".into(),
                });
            }
            d.hw.eqs.remove(eqn).ok_or_else(|| no("EQ", eqn))?;
            if d.hw.async_eqn == Some(eqn) {
                d.hw.async_eqn = None;
            }
            Ok(())
        })
    }

    async fn create_cq(&self, params: CqParams) -> Result<SoftCq, CommandError> {
        self.check_alive()?;
        if params.entries == 0 || params.entries > MAX_CQE {
            return Err(invalid(format!(
                "{} CQ entries (1..={MAX_CQE})",
                params.entries
            )));
        }
        let ring = self.slots::<CQE_SIZE>(params.entries + 1, CQE_SIZE)?;
        let geom = ring.geom();
        CqRing::init_owner(&ring, 0);
        let db = Arc::new(CqDoorbell::default());
        let kicker = self.kicker.clone();
        self.with(|d, _, _| {
            if d.hw.eqs.get(params.eqn).is_none() {
                return Err(no("EQ", params.eqn));
            }
            if d.hw.cqs.len() >= MAX_CQ as usize {
                return Err(CommandError::ResourceExhausted { resource: "CQs" });
            }
            let cqn = d.hw.cqs.free_number(1);
            d.hw.cqs.insert(
                cqn,
                HwCq {
                    ring: ring.clone(),
                    producer: Producer::new(geom),
                    db: db.clone(),
                    eqn: params.eqn,
                    last_solicited: None,
                    in_error: false,
                },
            );
            Ok(SoftCq {
                cqn,
                ring: CqRing::new(ring, 0),
                depth: geom.entries() - 1,
                db,
                kicker,
            })
        })
    }

    async fn resize_cq(&self, host: &mut SoftCq, entries: u32) -> Result<(), CommandError> {
        self.check_alive()?;
        if entries == 0 || entries > MAX_CQE {
            return Err(invalid(format!("{entries} CQ entries (1..={MAX_CQE})")));
        }
        let ring = self.slots::<CQE_SIZE>(entries + 1, CQE_SIZE)?;
        let geom = ring.geom();
        CqRing::init_owner(&ring, 0);
        self.with(|d, _, _| {
            let hw =
                d.hw.cqs
                    .get_mut(host.cqn)
                    .ok_or_else(|| no("CQ", host.cqn))?;
            let tail = host.ring.tail();
            let pending = hw.producer.head().wrapping_sub(tail);
            if pending > geom.entries() - 1 {
                return Err(invalid(format!(
                    "{pending} unpolled completions do not fit {entries} entries"
                )));
            }
            // Move the unpolled entries to the start of the new ring, re-owned for pass 0.
            let mut producer = Producer::new(geom);
            for i in 0..pending {
                let mut raw = hw.ring.at(tail.wrapping_add(i)).read::<0, CQE_SIZE>();
                raw[CQE_SIZE - 1] = CqRing::with_owner(raw[CQE_SIZE - 1], producer.owner_bit());
                ring.at(producer.head()).put::<0, CQE_SIZE>(raw);
                producer.advance(1);
            }
            hw.ring = ring.clone();
            hw.producer = producer;
            hw.last_solicited = None;
            hw.db.ci.store(0, Ordering::Release);
            host.ring = CqRing::new(ring, 0);
            host.depth = geom.entries() - 1;
            Ok(())
        })
    }

    async fn destroy_cq(&self, cqn: u32) -> Result<(), CommandError> {
        self.with(|d, _, _| {
            d.hw.cqs
                .remove(cqn)
                .map(|_| ())
                .ok_or_else(|| no("CQ", cqn))
        })
    }

    async fn create_srq(&self, params: SrqParams) -> Result<SoftSrq, CommandError> {
        self.check_alive()?;
        if params.max_wr == 0 || params.max_wr > MAX_SRQ_WR {
            return Err(invalid(format!(
                "SRQ max_wr {} (1..={MAX_SRQ_WR})",
                params.max_wr
            )));
        }
        if params.max_sge == 0 || params.max_sge > MAX_SGE {
            return Err(invalid(format!(
                "SRQ max_sge {} (1..={MAX_SGE})",
                params.max_sge
            )));
        }
        if params.limit > params.max_wr {
            return Err(invalid("SRQ limit above max_wr"));
        }
        let stride = format::recv_stride(params.max_sge);
        let ring = self.slots::<RECV_MIN>(params.max_wr, stride)?;
        let geom = ring.geom();
        let hw_ring = Self::view::<RECV_MIN, RECV_MIN>(&ring)?;
        let index_ring = self.ring(geom.entries() as usize * 4)?;
        let db = Arc::new(SrqDoorbell::default());
        let max_sge = (((stride - RECV_HEADER) / SGE_SIZE) as u32).min(MAX_SGE);
        self.with(|d, _, _| {
            if !d.state.pds.contains(&params.pd) {
                return Err(no("PD", params.pd));
            }
            if d.hw.srqs.len() >= MAX_SRQ as usize {
                return Err(CommandError::ResourceExhausted { resource: "SRQs" });
            }
            let srqn = d.hw.srqs.free_number(1);
            d.hw.srqs.insert(
                srqn,
                HwSrq {
                    wq: HwWq::new(hw_ring, db.clone()),
                    index_ring: index_ring.clone(),
                    limit: params.limit,
                    pd: params.pd,
                },
            );
            Ok(SoftSrq {
                srqn,
                ring,
                index_ring,
                fmt: RecvFormat { max_sge },
                free: (0..geom.entries()).rev().collect(),
                head: Producer::new(geom),
                db,
                scratch: vec![0; stride],
            })
        })
    }

    async fn modify_srq(&self, srqn: u32, change: SrqModify) -> Result<(), CommandError> {
        self.check_alive()?;
        if change.max_wr.is_some() {
            return Err(CommandError::Unsupported {
                what: "SRQ resize (QuirkId::NoSrqResize)",
            });
        }
        self.with(|d, _, _| {
            let srq = d.hw.srqs.get_mut(srqn).ok_or_else(|| no("SRQ", srqn))?;
            if let Some(limit) = change.limit {
                if limit > srq.wq.geom().entries() {
                    return Err(invalid("SRQ limit above its size"));
                }
                srq.limit = limit;
            }
            Ok(())
        })
    }

    async fn destroy_srq(&self, srqn: u32) -> Result<(), CommandError> {
        self.with(|d, _, _| {
            d.hw.srqs
                .remove(srqn)
                .map(|_| ())
                .ok_or_else(|| no("SRQ", srqn))
        })
    }

    async fn create_qp(
        &self,
        params: QpCreateParams,
    ) -> Result<QpResources<SoftSq, SoftRq>, CommandError> {
        self.check_alive()?;
        let caps = params.caps;
        if let Some(special) = params.special {
            if params.qp_type != special.qp_type() {
                return Err(invalid(format!(
                    "a {special:?} QP is {}, not {}",
                    special.qp_type(),
                    params.qp_type
                )));
            }
        }
        if caps.max_send_wr > MAX_QP_WR || caps.max_recv_wr > MAX_QP_WR {
            return Err(invalid(format!(
                "max_send_wr {} / max_recv_wr {} above {MAX_QP_WR}",
                caps.max_send_wr, caps.max_recv_wr
            )));
        }
        if caps.max_send_sge > MAX_SGE || caps.max_recv_sge > MAX_SGE {
            return Err(invalid(format!(
                "max_send_sge {} / max_recv_sge {} above {MAX_SGE}",
                caps.max_send_sge, caps.max_recv_sge
            )));
        }
        if caps.max_inline_data > MAX_INLINE {
            return Err(invalid(format!(
                "max_inline_data {} above {MAX_INLINE}",
                caps.max_inline_data
            )));
        }
        let (stride, send_sge, inline) = Self::grant_send(params.qp_type, &caps);
        let sq_ring = WorkRing::new(self.slots::<SEND_HEADER>(caps.max_send_wr.max(1), stride)?);
        let sq_geom = sq_ring.geom();
        let sq_hw = Self::view::<SEND_HEADER, RECV_MIN>(&sq_ring)?;
        SoftSq::init_slots(&sq_ring);
        let rq = if params.srqn.is_none() {
            let rstride = format::recv_stride(caps.max_recv_sge.max(1));
            let ring = self.slots::<RECV_MIN>(caps.max_recv_wr.max(1), rstride)?;
            let hw = Self::view::<RECV_MIN, RECV_MIN>(&ring)?;
            let geom = ring.geom();
            Some((ring, hw, geom, rstride))
        } else {
            None
        };
        let recv_sge = rq.as_ref().map_or(0, |(_, _, _, s)| {
            (((s - RECV_HEADER) / SGE_SIZE) as u32).min(MAX_SGE)
        });
        let granted = QpCaps {
            max_send_wr: sq_geom.entries(),
            max_recv_wr: rq.as_ref().map_or(0, |(_, _, g, _)| g.entries()),
            max_send_sge: send_sge,
            max_recv_sge: recv_sge,
            max_inline_data: inline,
        };
        let sq_db = Arc::new(SqDoorbell::default());
        let rq_db = Arc::new(RqDoorbell::default());
        let kicker = self.kicker.clone();
        self.with(|d, _, _| {
            if !d.state.pds.contains(&params.pd) {
                return Err(no("PD", params.pd));
            }
            for cqn in [params.send_cqn, params.recv_cqn] {
                if d.hw.cqs.get(cqn).is_none() {
                    return Err(no("CQ", cqn));
                }
            }
            if let Some(srqn) = params.srqn {
                if d.hw.srqs.get(srqn).is_none() {
                    return Err(no("SRQ", srqn));
                }
            }
            // The pool lies above the special QPs' numbers and is handed out round from the
            // device's cursor (random at first); a special QP takes its own number.
            let qpn = match params.special {
                None => {
                    d.hw.qps
                        .next_free_in(FIRST_QPN..MAX_QP, d.state.next_qpn)
                        .ok_or(CommandError::ResourceExhausted { resource: "QPs" })?
                }
                Some(special) if d.hw.qps.contains(special.qpn()) => {
                    return Err(CommandError::Busy {
                        object: "GSI QP",
                        reason: format!("QP {:#x} exists; destroy it first", special.qpn()),
                    });
                }
                Some(special) => special.qpn(),
            };
            d.engine.create_qp(
                qpn,
                QpInit {
                    qp_type: params.qp_type,
                    pd: params.pd,
                    send_cqn: params.send_cqn,
                    recv_cqn: params.recv_cqn,
                    srqn: params.srqn,
                    sq_entries: sq_geom.entries(),
                    caps: granted,
                },
            )?;
            if params.special.is_none() {
                d.state.next_qpn = qpn + 1;
            }
            d.hw.qps.insert(
                qpn,
                HwQp {
                    qp_type: params.qp_type,
                    sq: HwWq::new(sq_hw, sq_db.clone()),
                    rq: rq
                        .as_ref()
                        .map(|(_, hw, _, _)| HwWq::new(hw.clone(), rq_db.clone())),
                },
            );
            let sq = SoftSq {
                qpn,
                qp_type: params.qp_type,
                ring: sq_ring,
                fmt: SendFormat {
                    stride,
                    max_sge: send_sge,
                    max_inline: inline,
                },
                depth: sq_geom.entries(),
                db: sq_db,
                kicker: kicker.clone(),
                fatal: self.fatal.clone(),
            };
            let rq = rq.map(|(ring, _, geom, rstride)| SoftRq {
                qpn,
                ring: WorkRing::new(ring),
                fmt: RecvFormat { max_sge: recv_sge },
                depth: geom.entries(),
                db: rq_db,
                kicker,
                scratch: vec![0; rstride],
            });
            Ok(QpResources {
                qpn,
                caps: granted,
                sq,
                rq,
            })
        })
    }

    async fn modify_qp(
        &self,
        qpn: u32,
        attr: QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), CommandError> {
        self.check_alive()?;
        self.with(|d, now, out| {
            if mask.contains(QpAttrMask::PORT)
                && (attr.port_num == 0 || usize::from(attr.port_num) > d.state.ports.len())
            {
                return Err(invalid(format!("port {} does not exist", attr.port_num)));
            }
            d.engine.modify_qp(now, qpn, &attr, mask, &mut d.hw, out)
        })
    }

    /// The engine holds the QP's whole context, as an HCA does: `known` adds nothing.
    async fn query_qp(&self, qpn: u32, _known: QpAttr) -> Result<QpAttr, CommandError> {
        self.check_alive()?;
        self.with(|d, _, _| d.engine.query_qp(qpn))
    }

    async fn destroy_qp(&self, qpn: u32) -> Result<(), CommandError> {
        self.node.with(|ctx| {
            let left = ctx.node.engine.mcast_forget_qp(qpn);
            let ports = ctx.node.state.ports.len() as u8;
            for gid in left {
                for port in 1..=ports {
                    ctx.leave_mcast(port, gid);
                }
            }
            ctx.node.engine.destroy_qp(qpn)?;
            ctx.node.hw.qps.remove(qpn);
            Ok(())
        })
    }

    async fn attach_mcast(&self, qpn: u32, gid: Gid, _lid: u16) -> Result<(), CommandError> {
        self.check_alive()?;
        if !gid.is_multicast() {
            return Err(invalid(format!("{gid} is not a multicast GID")));
        }
        self.node.with(|ctx| {
            if ctx.node.engine.mcast_attach(qpn, gid)? != Membership::Joined {
                return Ok(());
            }
            // The device's first QP in the group: its ports join it on the fabric (and the
            // fabric's uplink on its network). A refusal undoes the attach.
            let ports = ctx.node.state.ports.len() as u8;
            for port in 1..=ports {
                if let Err(e) = ctx.join_mcast(port, gid) {
                    for p in 1..port {
                        ctx.leave_mcast(p, gid);
                    }
                    let _ = ctx.node.engine.mcast_detach(qpn, gid);
                    return Err(invalid(e.to_string()));
                }
            }
            Ok(())
        })
    }

    async fn detach_mcast(&self, qpn: u32, gid: Gid, _lid: u16) -> Result<(), CommandError> {
        self.check_alive()?;
        self.node.with(|ctx| {
            if ctx.node.engine.mcast_detach(qpn, gid)? == Membership::Left {
                let ports = ctx.node.state.ports.len() as u8;
                for port in 1..=ports {
                    ctx.leave_mcast(port, gid);
                }
            }
            Ok(())
        })
    }

    async fn register_mr(&self, params: MrParams) -> Result<MrKeys, CommandError> {
        self.check_alive()?;
        let mem = Self::downcast(&params.region)?;
        portverbs_hal::dma::check_range(params.offset, params.length, mem.len())?;
        let addr = mem.host_addr() + params.offset as u64;
        self.with(|d, _, _| {
            if !d.state.pds.contains(&params.pd) {
                return Err(no("PD", params.pd));
            }
            let key = d.engine.memory_mut().register(MrSpec {
                pd: params.pd,
                access: params.access,
                va: addr,
                len: params.length as u64,
                mem,
                mem_offset: params.offset,
            })?;
            d.state.mrs.insert(key);
            Ok(MrKeys {
                handle: key,
                lkey: key,
                rkey: key,
                addr,
            })
        })
    }

    async fn rereg_mr(&self, handle: u32, change: MrRereg) -> Result<MrKeys, CommandError> {
        self.check_alive()?;
        let range = match &change.range {
            Some((region, off, len)) => {
                let mem = Self::downcast(region)?;
                portverbs_hal::dma::check_range(*off, *len, mem.len())?;
                let va = mem.host_addr() + *off as u64;
                Some((va, *len as u64, mem, *off))
            }
            None => None,
        };
        self.with(|d, _, _| {
            if !d.state.mrs.contains(&handle) {
                return Err(no("MR", handle));
            }
            if let Some(pd) = change.pd {
                if !d.state.pds.contains(&pd) {
                    return Err(no("PD", pd));
                }
            }
            let addr = range.as_ref().map(|r| r.0);
            let key = d
                .engine
                .memory_mut()
                .rereg(handle, change.pd, change.access, range)?;
            let addr = match addr {
                Some(a) => a,
                None => d
                    .engine
                    .memory()
                    .local_addr(key)
                    .ok_or_else(|| no("MR", handle))?,
            };
            Ok(MrKeys {
                handle: key,
                lkey: key,
                rkey: key,
                addr,
            })
        })
    }

    async fn deregister_mr(&self, handle: u32) -> Result<(), CommandError> {
        self.with(|d, _, _| {
            d.engine.memory_mut().deregister(handle)?;
            d.state.mrs.remove(&handle);
            Ok(())
        })
    }

    async fn alloc_mw(&self, pd: u32, mw_type: MwType) -> Result<MwKeys, CommandError> {
        self.check_alive()?;
        self.with(|d, _, _| {
            if !d.state.pds.contains(&pd) {
                return Err(no("PD", pd));
            }
            let rkey = d.engine.memory_mut().alloc_mw(pd, mw_type)?;
            d.state.mws.insert(rkey >> 8);
            Ok(MwKeys {
                handle: rkey >> 8,
                rkey,
            })
        })
    }

    async fn dealloc_mw(&self, handle: u32) -> Result<(), CommandError> {
        self.with(|d, _, _| {
            if !d.state.mws.remove(&handle) {
                return Err(no("MW", handle));
            }
            d.engine.memory_mut().dealloc_mw_index(handle)
        })
    }
}
