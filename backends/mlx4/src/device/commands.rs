//! The HAL command interface of the mlx4 driver: every verbs object becomes firmware commands
//! with the contexts of facts §3, and every hot-path queue object gets its memory, MTT range
//! and doorbell record here.

use std::sync::Arc;

use portverbs_hal::attr::{QpAttr, QpAttrMask, QpCaps};
use portverbs_hal::caps::{DeviceAttr, DeviceInfo, GidEntry, GidType, PortAttr};
use portverbs_hal::device::{
    CqParams, Device, EqKind, EqParams, MrKeys, MrParams, MrRereg, MwKeys, QpCreateParams,
    QpResources, SrqModify, SrqParams,
};
use portverbs_hal::dma::{DmaError, DmaMemory, HostMemory, MapHostError};
use portverbs_hal::error::CommandError;
use portverbs_hal::notify::{InterruptSink, NullSink};
use portverbs_hal::queue::{CompletionQueue, EventQueue};
use portverbs_hal::types::{AccessFlags, LinkLayer, Mtu, MwType, PortState, QpState, QpType};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::Mlx4Device;
use super::objects::{CqRec, EqRec, MrRec, QpRec, SrqRec};
use super::qp_ctx::{self, QpEnv};
use crate::caps;
use crate::cmd::Cmd;
use crate::dma::{Ring, Slots};
use crate::layout::ctx::{
    CqContext, EQ_STATE_ARMED, EqContext, Mpt, QpMailbox, SrqContext, mpt_flag, mtt_split,
};
use crate::layout::eqe::ASYNC_EVENT_MASK;
use crate::layout::mailbox::MAILBOX_SIZE;
use crate::layout::opcode;
use crate::layout::uar::{EQ_ARM, eq_doorbell};
use crate::layout::wqe::{queue_offsets, sq_spare};
use crate::mtt::MttRange;
use crate::queues::Geometry;
use crate::queues::cq::Mlx4Cq;
use crate::queues::eq::Mlx4Eq;
use crate::queues::rq::Mlx4Rq;
use crate::queues::sq::{BfReg, MAX_INLINE, Mlx4Sq, doorbell_offset};
use crate::queues::srq::Mlx4Srq;

fn invalid(what: impl Into<String>) -> CommandError {
    CommandError::InvalidArgument { what: what.into() }
}

fn no(object: &'static str, number: u32) -> CommandError {
    CommandError::NoSuchObject { object, number }
}

fn log2(n: u32) -> u8 {
    n.trailing_zeros() as u8
}

/// The send-queue stride and what it grants: (wqe_shift, max_sge, max_inline).
fn sq_shape(qp_type: QpType, caps: &QpCaps, max_sg: u32) -> Result<(u32, u32, u32), CommandError> {
    let seg = if qp_type == QpType::Ud { 48 } else { 32 };
    let inline = caps.max_inline_data as usize;
    // Inline data plus one 4-byte header per 64-byte block it may touch.
    let inline_room = if inline == 0 {
        0
    } else {
        inline + 4 * (inline.div_ceil(60) + 1)
    };
    let need = 16 + seg + (caps.max_send_sge.max(1) as usize * 16).max(inline_room);
    if need > 1008 || caps.max_inline_data > MAX_INLINE || caps.max_send_sge > max_sg {
        return Err(invalid(format!(
            "send queue with {} SGEs and {} inline bytes does not fit a WQE",
            caps.max_send_sge, caps.max_inline_data
        )));
    }
    let stride = need.next_power_of_two().max(64);
    let usable = stride.min(1008) - 16 - seg;
    let sge = ((usable / 16) as u32).min(max_sg);
    let inl = ((usable - 4 * usable.div_ceil(64)) as u32).min(MAX_INLINE);
    Ok((stride.trailing_zeros(), sge, inl))
}

impl Mlx4Device {
    fn exec_err(&self, r: Result<u64, CommandError>) -> Result<u64, CommandError> {
        self.0.note(&r);
        r
    }

    async fn cmd(&self, cmd: Cmd) -> Result<u64, CommandError> {
        self.0.check_alive()?;
        let r = self.0.hcr.exec(cmd).await;
        self.exec_err(r)
    }

    async fn cmd_in(&self, cmd: Cmd, inbox: &[u8]) -> Result<u64, CommandError> {
        self.0.check_alive()?;
        let r = self.0.hcr.exec_in(cmd, inbox).await;
        self.exec_err(r)
    }

    async fn cmd_out(&self, cmd: Cmd, out: &mut [u8]) -> Result<(), CommandError> {
        self.0.check_alive()?;
        let r = self.0.hcr.exec_out(cmd, out).await;
        self.exec_err(r.map(|()| 0)).map(|_| ())
    }

    /// Writes the MTT range of `mem[offset..offset + len]`, then runs `cmd` with the inbox
    /// `ctx` builds from the range's first entry; the range goes back to the allocator if the
    /// command fails.
    async fn sw2hw<C: IntoBytes + Immutable + Send>(
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
    async fn hw2sw(&self, cmd: Cmd) -> Result<(), CommandError> {
        match self.cmd(cmd).await {
            Err(e) if !self.is_fatal() => Err(e),
            _ => Ok(()),
        }
    }

    /// A zeroed ring (queue buffer) of `len` bytes.
    fn dma(&self, len: usize) -> Result<Ring, CommandError> {
        let mem = self.0.pci.alloc_dma(len)?;
        mem.fill(0, mem.len(), 0)?;
        Ok(Ring::new(mem))
    }

    /// A zeroed ring of `cnt` 32-byte entries (CQEs or EQEs), each marked hardware-owned for
    /// the counter `first..first + cnt` that will use it next (facts §6.4), and its geometry.
    fn entry_ring(&self, cnt: u32, first: u32) -> Result<(Ring, Geometry), CommandError> {
        let geom = Geometry {
            base: 0,
            shift: 5,
            cnt,
        };
        let ring = self.dma(cnt as usize * 32)?;
        Mlx4Cq::init_owner_from(ring.mem(), geom, first);
        Ok((ring, geom))
    }

    /// `geom`'s slots of `ring` (a region too small for its geometry is refused, not used).
    fn slots<const MIN: usize>(ring: &Ring, geom: Geometry) -> Result<Slots<MIN>, CommandError> {
        Slots::new(ring.clone(), geom).ok_or_else(|| {
            invalid(format!(
                "{} slots of {} bytes do not fit a {}-byte DMA region",
                geom.cnt,
                geom.stride(),
                ring.mem().len()
            ))
        })
    }

    /// Creates an EQ routed to MSI-X `vector` (also used for the driver's command EQ).
    pub(crate) async fn create_eq_internal(
        &self,
        entries: u32,
        vector: u32,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError> {
        let cnt = (entries.max(1) + 1).next_power_of_two().max(64);
        let (ring, geom) = self.entry_ring(cnt, 0)?;
        let eqn = self
            .0
            .nums()
            .eq
            .alloc()
            .ok_or(CommandError::ResourceExhausted { resource: "EQs" })?;
        let cmd = Cmd::new(opcode::SW2HW_EQ).in_mod(eqn);
        let r = self
            .sw2hw(cmd, ring.mem(), 0, ring.mem().len(), |first| {
                let (hi, lo) = mtt_split(first);
                EqContext {
                    flags: EQ_STATE_ARMED.into(),
                    log_eq_size: log2(cnt),
                    intr: (vector as u16).into(),
                    mtt_base_hi: hi,
                    mtt_base_lo: lo.into(),
                    ..Default::default()
                }
            })
            .await;
        let mtt = match r {
            Ok(m) => m,
            Err(e) => {
                self.0.nums().eq.free(eqn);
                return Err(e);
            }
        };
        if let Err(e) = self.0.pci.route_interrupt(vector, sink) {
            tracing::warn!(%e, "interrupt routing failed; the EQ can still be polled");
        }
        self.0.objects().eqs.insert(
            eqn,
            EqRec {
                mtt,
                vector,
                _ring: ring.clone(),
            },
        );
        let _ = self.0.bar2.write32(eq_doorbell(eqn), EQ_ARM);
        Ok(Box::new(Mlx4Eq {
            eqn,
            buf: ring,
            geom,
            ci: 0,
            bar2: self.0.bar2.clone(),
        }))
    }

    fn bf_reg(&self) -> Option<BfReg> {
        let bf = self.0.bf?;
        let mut n = self.0.nums();
        let i = n.bf_next % bf.regs;
        n.bf_next += 1;
        Some(BfReg {
            offset: bf.page + i * bf.half * 2,
            half: bf.half,
        })
    }

    fn qp_env(&self, qpn: u32, rec: &QpRec) -> QpEnv {
        QpEnv {
            qpn,
            uar: self.0.uar,
            db_addr: rec.db.bus_addr(),
            mtt_first: rec.mtt.first,
            log_max_msg: self.0.caps.log_max_msg,
        }
    }

    fn mpt_key(&self, index: u32) -> u32 {
        let mut n = self.0.nums();
        let tag = &mut n.mpt_tag[index as usize];
        *tag = tag.wrapping_add(1);
        crate::layout::keys::index_to_key(index) | u32::from(*tag)
    }

    fn access_flags(a: AccessFlags) -> u32 {
        let mut f = mpt_flag::LOCAL_READ;
        if a.contains(AccessFlags::LOCAL_WRITE) {
            f |= mpt_flag::LOCAL_WRITE;
        }
        if a.contains(AccessFlags::REMOTE_WRITE) {
            f |= mpt_flag::REMOTE_WRITE;
        }
        if a.contains(AccessFlags::REMOTE_READ) {
            f |= mpt_flag::REMOTE_READ;
        }
        if a.contains(AccessFlags::REMOTE_ATOMIC) {
            f |= mpt_flag::ATOMIC;
        }
        if a.contains(AccessFlags::MW_BIND) {
            f |= mpt_flag::BIND_ENABLE;
        }
        f
    }

    /// Writes the MTT range and the MPT of a registration; returns its keys and the range (which
    /// the caller keeps in the registration's record).
    async fn write_mr(
        &self,
        index: u32,
        key: u32,
        mr: &MrRec,
    ) -> Result<(MrKeys, MttRange), CommandError> {
        let MrRec {
            pd,
            ref region,
            offset,
            length,
            access,
            ..
        } = *mr;
        if offset
            .checked_add(length)
            .is_none_or(|end| end > region.len())
        {
            return Err(CommandError::Dma(DmaError::OutOfBounds {
                offset,
                len: length,
                region_len: region.len(),
            }));
        }
        let addr = region.host_addr() + offset as u64;
        let cmd = Cmd::new(opcode::SW2HW_MPT).in_mod(index);
        let mtt = self
            .sw2hw(cmd, region.as_ref(), offset, length, |first| Mpt {
                flags: (mpt_flag::STATUS_SW
                    | mpt_flag::MIO
                    | mpt_flag::REGION
                    | Self::access_flags(access))
                .into(),
                key: crate::layout::keys::key_to_hw(key).into(),
                pd_flags: (pd | mpt_flag::EN_INV).into(),
                start: addr.into(),
                length: (length as u64).into(),
                mtt_addr: (first * 8).into(),
                entity_size: 12.into(),
                ..Default::default()
            })
            .await?;
        let keys = MrKeys {
            handle: index,
            lkey: key,
            rkey: key,
            addr,
        };
        Ok((keys, mtt))
    }

    /// Frees the MTT range of registration `index` (the HCA no longer uses it).
    fn take_mr_range(&self, index: u32) {
        let r = self
            .0
            .objects()
            .mrs
            .get_mut(&index)
            .and_then(|m| m.mtt.take());
        if let Some(r) = r {
            self.0.mtts.free(r);
        }
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

    fn alloc_dma(&self, len: usize) -> Result<Arc<dyn DmaMemory>, DmaError> {
        Ok(self.0.pci.alloc_dma(len)?)
    }

    fn map_host(&self, memory: HostMemory) -> Result<Arc<dyn DmaMemory>, MapHostError> {
        self.0.pci.map_host(memory)
    }

    async fn query_device(&self) -> Result<DeviceAttr, CommandError> {
        self.0.check_alive()?;
        Ok(self.0.attr.clone())
    }

    async fn query_port(&self, port: u8) -> Result<PortAttr, CommandError> {
        if port == 0 || port > self.0.caps.num_ports {
            return Err(invalid(format!("port {port} does not exist")));
        }
        let mut out = vec![0u8; 64];
        self.cmd_out(
            Cmd::new(opcode::QUERY_PORT).in_mod(u32::from(port)),
            &mut out,
        )
        .await?;
        let p = caps::parse_port(&out).map_err(|e| invalid(e.to_string()))?;
        let max_mtu = Mtu::from_code(p.max_mtu).unwrap_or(Mtu::Mtu1024);
        Ok(PortAttr {
            state: if p.link_up {
                PortState::Active
            } else {
                PortState::Down
            },
            max_mtu,
            active_mtu: max_mtu,
            gid_tbl_len: p.gid_table_len.min(super::bringup::GID_TABLE_LEN as u32),
            // IB_PORT_CM_SUP | IB_PORT_IP_BASED_GIDS
            port_cap_flags: (1 << 16) | (1 << 26),
            max_msg_sz: 1u32 << self.0.caps.log_max_msg.min(31),
            pkey_tbl_len: 1,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            active_width: p.active_width,
            active_speed: p.active_speed,
            phys_state: if p.link_up { 5 } else { 3 },
            link_layer: LinkLayer::Ethernet,
        })
    }

    async fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry, CommandError> {
        self.0.check_alive()?;
        if port == 0 || port > self.0.caps.num_ports {
            return Err(invalid(format!("port {port} does not exist")));
        }
        let len = super::bringup::GID_TABLE_LEN as u32;
        if index >= len {
            return Err(invalid(format!(
                "GID index {index} beyond a table of {len}"
            )));
        }
        self.0
            .gids
            .get(usize::from(port) - 1)
            .and_then(|g| g.get(index as usize))
            .map(|gid| GidEntry {
                gid: *gid,
                gid_type: GidType::RoceV2,
            })
            .ok_or_else(|| no("GID entry", index))
    }

    async fn query_pkey(&self, port: u8, index: u16) -> Result<u16, CommandError> {
        self.0.check_alive()?;
        if port == 0 || port > self.0.caps.num_ports {
            return Err(invalid(format!("port {port} does not exist")));
        }
        match index {
            0 => Ok(0xffff),
            _ => Err(invalid(format!("P_Key index {index} beyond a table of 1"))),
        }
    }

    async fn alloc_pd(&self) -> Result<u32, CommandError> {
        self.0.check_alive()?;
        self.0
            .nums()
            .pd
            .alloc()
            .ok_or(CommandError::ResourceExhausted { resource: "PDs" })
    }

    async fn dealloc_pd(&self, pd: u32) -> Result<(), CommandError> {
        self.0.nums().pd.free(pd);
        Ok(())
    }

    async fn create_eq(
        &self,
        params: EqParams,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError> {
        self.0.check_alive()?;
        // An MSI-X vector of its own, whatever the kind (a completion-vector number is a
        // hint of CPU affinity in libibverbs; here it only names the EQ).
        let vector = {
            let mut nums = self.0.nums();
            let in_use = nums.vectors.in_use();
            nums.vectors
                .alloc()
                .ok_or(CommandError::ResourceExhausted {
                    resource: "MSI-X vectors (one per event queue; destroy a completion \
                               channel or context)",
                })
                .inspect_err(|_| {
                    tracing::warn!(in_use, "every MSI-X vector has an event queue already")
                })?
        };
        let eq = match self.create_eq_internal(params.entries, vector, sink).await {
            Ok(eq) => eq,
            Err(e) => {
                self.0.nums().vectors.free(vector);
                return Err(e);
            }
        };
        if params.kind == EqKind::Async {
            let eqn = eq.eqn();
            if let Err(e) = self
                .cmd(
                    Cmd::new(opcode::MAP_EQ)
                        .in_param(ASYNC_EVENT_MASK)
                        .in_mod(eqn),
                )
                .await
            {
                let _ = self.destroy_eq(eqn).await;
                return Err(e);
            }
            self.0.objects().async_eqn = Some(eqn);
        }
        Ok(eq)
    }

    async fn destroy_eq(&self, eqn: u32) -> Result<(), CommandError> {
        let is_async = self.0.objects().async_eqn == Some(eqn);
        if is_async {
            let _ = self
                .cmd(
                    Cmd::new(opcode::MAP_EQ)
                        .in_param(ASYNC_EVENT_MASK)
                        .in_mod(eqn | 1 << 31),
                )
                .await;
            self.0.objects().async_eqn = None;
        }
        self.hw2sw(
            Cmd::new(opcode::HW2SW_EQ)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(eqn),
        )
        .await?;
        let vector = self.0.objects().eqs.get(&eqn).map(|r| r.vector);
        self.0.objects().release_eq(eqn, &self.0.mtts, &self.0.dbs);
        self.0.nums().eq.free(eqn);
        if let Some(v) = vector.filter(|&v| v != 0) {
            // Forget the sink (the model would raise it again); a VFIO route stays bound
            // until the vector is handed to the next EQ.
            let _ = self.0.pci.route_interrupt(v, Arc::new(NullSink));
            self.0.nums().vectors.free(v);
        }
        Ok(())
    }

    async fn create_cq(&self, params: CqParams) -> Result<Mlx4Cq, CommandError> {
        self.0.check_alive()?;
        let max = (1u32 << self.0.caps.log_max_cq_sz.min(22)) - 1;
        if params.entries == 0 || params.entries > max {
            return Err(invalid(format!(
                "{} CQ entries (1..={max})",
                params.entries
            )));
        }
        if !self.0.objects().eqs.contains_key(&params.eqn) {
            return Err(no("EQ", params.eqn));
        }
        let cnt = (params.entries + 1).next_power_of_two();
        let (ring, geom) = self.entry_ring(cnt, 0)?;
        let slots = Self::slots(&ring, geom)?;
        let db = self.0.dbs.alloc(&*self.0.pci)?;
        let Some(cqn) = self.0.nums().cq.alloc() else {
            self.0.dbs.free(&db);
            return Err(CommandError::ResourceExhausted { resource: "CQs" });
        };
        let cmd = Cmd::new(opcode::SW2HW_CQ).in_mod(cqn);
        let r = self
            .sw2hw(cmd, ring.mem(), 0, ring.mem().len(), |first| {
                let (hi, lo) = mtt_split(first);
                CqContext {
                    logsize_usrpage: ((u32::from(log2(cnt)) << 24) | self.0.uar).into(),
                    comp_eqn: params.eqn.into(),
                    mtt_base_hi: hi,
                    mtt_base_lo: lo.into(),
                    db_rec_addr: db.bus_addr().into(),
                    ..Default::default()
                }
            })
            .await;
        let mtt = match r {
            Ok(m) => m,
            Err(e) => {
                self.0.nums().cq.free(cqn);
                self.0.dbs.free(&db);
                return Err(e);
            }
        };
        self.0.objects().cqs.insert(
            cqn,
            CqRec {
                mtt,
                _ring: ring.clone(),
                db: db.clone(),
            },
        );
        Ok(Mlx4Cq {
            cqn,
            buf: slots,
            ci: 0,
            db,
            bar2: self.0.bar2.clone(),
            uar_base: self.0.uar_base(),
            arm_sn: 1,
        })
    }

    async fn resize_cq(&self, cq: &mut Mlx4Cq, entries: u32) -> Result<(), CommandError> {
        self.0.check_alive()?;
        let max = (1u32 << self.0.caps.log_max_cq_sz.min(22)) - 1;
        if entries == 0 || entries > max {
            return Err(invalid(format!("{entries} CQ entries (1..={max})")));
        }
        let cnt = (entries + 1).next_power_of_two();
        let pending = cq.pending();
        if pending + 1 >= cnt {
            return Err(invalid(format!(
                "{pending} unpolled completions do not fit {entries} entries"
            )));
        }
        // The new buffer continues the counters: the first CQE in it is ci + 1.
        let (ring, geom) = self.entry_ring(cnt, cq.ci.wrapping_add(1))?;
        let slots = Self::slots(&ring, geom)?;
        let cmd = Cmd::new(opcode::MODIFY_CQ)
            .opmod(opcode::OPMOD_CQ_RESIZE)
            .in_mod(cq.cqn);
        let uar = self.0.uar;
        let mtt = self
            .sw2hw(cmd, ring.mem(), 0, ring.mem().len(), |first| {
                let (hi, lo) = mtt_split(first);
                CqContext {
                    logsize_usrpage: ((u32::from(log2(cnt)) << 24) | uar).into(),
                    mtt_base_hi: hi,
                    mtt_base_lo: lo.into(),
                    ..Default::default()
                }
            })
            .await?;
        // The HCA wrote a RESIZE CQE into the old buffer where it switched; the unpolled CQEs
        // before it move to the new buffer one counter later (facts §3.2, §6.1).
        let deadline = std::time::Instant::now() + self.0.hcr.timeout;
        let next = loop {
            match cq.switch_to(slots.clone()) {
                Some(next) => break next,
                None if std::time::Instant::now() < deadline => std::thread::yield_now(),
                None => {
                    return Err(CommandError::Timeout {
                        opcode: opcode::MODIFY_CQ,
                        millis: self.0.hcr.timeout.as_millis() as u64,
                    });
                }
            }
        };
        let old = self.0.objects().cqs.get_mut(&cq.cqn).map(|rec| {
            rec._ring = ring;
            std::mem::replace(&mut rec.mtt, mtt)
        });
        if let Some(old) = old {
            self.0.mtts.free(old);
        }
        cq.ci = next;
        cq.publish_ci();
        Ok(())
    }

    async fn destroy_cq(&self, cqn: u32) -> Result<(), CommandError> {
        if !self.0.objects().cqs.contains_key(&cqn) {
            return Err(no("CQ", cqn));
        }
        self.hw2sw(
            Cmd::new(opcode::HW2SW_CQ)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(cqn),
        )
        .await?;
        if let Some(rec) = self.0.objects().cqs.remove(&cqn) {
            self.0.mtts.free(rec.mtt);
            self.0.dbs.free(&rec.db);
        }
        self.0.nums().cq.free(cqn);
        Ok(())
    }

    async fn create_srq(&self, params: SrqParams) -> Result<Mlx4Srq, CommandError> {
        self.0.check_alive()?;
        let max_wr = (1u32 << self.0.caps.log_max_srq_sz.min(15)) - 1;
        if params.max_wr == 0 || params.max_wr > max_wr {
            return Err(invalid(format!("{} SRQ WRs (1..={max_wr})", params.max_wr)));
        }
        if params.max_sge == 0 || params.max_sge > self.0.caps.max_sg_rq.min(32) {
            return Err(invalid(format!("{} SRQ SGEs", params.max_sge)));
        }
        if params.limit > params.max_wr {
            return Err(invalid(format!(
                "SRQ limit {} above max_wr {}",
                params.limit, params.max_wr
            )));
        }
        let cnt = (params.max_wr + 1).next_power_of_two();
        let shift = (16 + 16 * params.max_sge)
            .next_power_of_two()
            .max(32)
            .trailing_zeros();
        let geom = Geometry {
            base: 0,
            shift,
            cnt,
        };
        let buf = self.dma((cnt as usize) << shift)?;
        let db = self.0.dbs.alloc(&*self.0.pci)?;
        let Some(srqn) = self.0.nums().srq.alloc() else {
            self.0.dbs.free(&db);
            return Err(CommandError::ResourceExhausted { resource: "SRQs" });
        };
        let mut srq = Mlx4Srq {
            srqn,
            buf: buf.clone(),
            geom,
            max_sge: (geom.stride() as u32 - 16) / 16,
            db: db.clone(),
            next: vec![0; cnt as usize].into_boxed_slice(),
            head: 0,
            tail: 0,
            counter: 0,
            in_use: vec![false; cnt as usize].into_boxed_slice(),
            scratch: vec![0; geom.stride()].into_boxed_slice(),
        };
        srq.init();
        let cmd = Cmd::new(opcode::SW2HW_SRQ).in_mod(srqn);
        let r = self
            .sw2hw(cmd, buf.mem(), 0, buf.mem().len(), |first| {
                let (hi, lo) = mtt_split(first);
                SrqContext {
                    state_logsize_srqn: ((u32::from(log2(cnt)) << 24) | srqn).into(),
                    logstride: (shift - 4) as u8,
                    mtt_base_hi: hi,
                    mtt_base_lo: lo.into(),
                    pd: params.pd.into(),
                    db_rec_addr: db.bus_addr().into(),
                    ..Default::default()
                }
            })
            .await;
        let mtt = match r {
            Ok(m) => m,
            Err(e) => {
                self.0.nums().srq.free(srqn);
                self.0.dbs.free(&db);
                return Err(e);
            }
        };
        self.0
            .objects()
            .srqs
            .insert(srqn, SrqRec { mtt, _buf: buf, db });
        if params.limit > 0 {
            if let Err(e) = self
                .cmd(
                    Cmd::new(opcode::ARM_SRQ)
                        .in_param(u64::from(params.limit))
                        .in_mod(srqn),
                )
                .await
            {
                let _ = self.destroy_srq(srqn).await;
                return Err(e);
            }
        }
        Ok(srq)
    }

    async fn modify_srq(&self, srqn: u32, change: SrqModify) -> Result<(), CommandError> {
        if !self.0.objects().srqs.contains_key(&srqn) {
            return Err(no("SRQ", srqn));
        }
        if change.max_wr.is_some() {
            return Err(CommandError::Unsupported { what: "SRQ resize" });
        }
        if let Some(limit) = change.limit {
            self.cmd(
                Cmd::new(opcode::ARM_SRQ)
                    .in_param(u64::from(limit))
                    .in_mod(srqn),
            )
            .await?;
        }
        Ok(())
    }

    async fn destroy_srq(&self, srqn: u32) -> Result<(), CommandError> {
        if !self.0.objects().srqs.contains_key(&srqn) {
            return Err(no("SRQ", srqn));
        }
        self.hw2sw(
            Cmd::new(opcode::HW2SW_SRQ)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(srqn),
        )
        .await?;
        if let Some(rec) = self.0.objects().srqs.remove(&srqn) {
            self.0.mtts.free(rec.mtt);
            self.0.dbs.free(&rec.db);
        }
        self.0.nums().srq.free(srqn);
        Ok(())
    }

    async fn create_qp(
        &self,
        params: QpCreateParams,
    ) -> Result<QpResources<Mlx4Sq, Mlx4Rq>, CommandError> {
        self.0.check_alive()?;
        let caps = &self.0.caps;
        let c = params.caps;
        let max_wr = (1u32 << caps.log_max_qp_sz.min(15)) - 64;
        // 0 send WRs is allowed (a receive-only QP): the queue still gets its spare WQEs and
        // reports what it grants, as ibv_create_qp(3) says.
        if c.max_send_wr > max_wr {
            return Err(invalid(format!(
                "{} send WRs (at most {max_wr})",
                c.max_send_wr
            )));
        }
        if params.srqn.is_none() && (c.max_recv_wr > max_wr || c.max_recv_sge > caps.max_sg_rq) {
            return Err(invalid(format!(
                "{} receive WRs with {} SGEs",
                c.max_recv_wr, c.max_recv_sge
            )));
        }
        {
            let o = self.0.objects();
            for cqn in [params.send_cqn, params.recv_cqn] {
                if !o.cqs.contains_key(&cqn) {
                    return Err(no("CQ", cqn));
                }
            }
            if let Some(s) = params.srqn {
                if !o.srqs.contains_key(&s) {
                    return Err(no("SRQ", s));
                }
            }
        }
        let (sq_shift, max_sge, max_inline) = sq_shape(params.qp_type, &c, caps.max_sg_sq)?;
        let spare = sq_spare(sq_shift);
        let sq_cnt = (c.max_send_wr + spare).next_power_of_two();
        let rq = params.srqn.is_none().then(|| {
            let slots = c.max_recv_sge.max(1).next_power_of_two();
            let shift = (slots * 16).trailing_zeros().max(4);
            (c.max_recv_wr.max(1).next_power_of_two(), shift)
        });
        let (rq_cnt, rq_shift) = rq.unwrap_or((0, 4));
        let (sq_off, rq_off) = queue_offsets(sq_cnt, sq_shift, rq_cnt, rq_shift);
        let bytes = ((sq_cnt as usize) << sq_shift) + ((rq_cnt as usize) << rq_shift);
        let buf = self.dma(bytes.next_multiple_of(4096))?;
        let db = self.0.dbs.alloc(&*self.0.pci)?;
        let Some(qpn) = self.0.nums().qp.alloc() else {
            self.0.dbs.free(&db);
            return Err(CommandError::ResourceExhausted { resource: "QPs" });
        };
        let mtt = match self
            .0
            .mtts
            .write(&self.0.hcr, buf.mem(), 0, buf.mem().len())
            .await
        {
            Ok(m) => m,
            Err(e) => {
                self.0.nums().qp.free(qpn);
                self.0.dbs.free(&db);
                return Err(e);
            }
        };
        let sq_geom = Geometry {
            base: sq_off,
            shift: sq_shift,
            cnt: sq_cnt,
        };
        let rq_geom = rq.map(|(cnt, shift)| Geometry {
            base: rq_off,
            shift,
            cnt,
        });
        let granted = QpCaps {
            max_send_wr: sq_cnt - spare,
            max_recv_wr: rq_cnt,
            max_send_sge: max_sge,
            max_recv_sge: rq_geom.map_or(0, |g| (g.stride() / 16) as u32),
            max_inline_data: max_inline,
        };
        let attrs = QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            cap: granted,
            port_num: 1,
            ..QpAttr::default()
        };
        self.0.objects().qps.insert(
            qpn,
            QpRec {
                qp_type: params.qp_type,
                pd: params.pd,
                send_cqn: params.send_cqn,
                recv_cqn: params.recv_cqn,
                srqn: params.srqn,
                sq: sq_geom,
                rq: rq_geom,
                mtt,
                _buf: buf.clone(),
                db: db.clone(),
                attrs,
            },
        );
        let mut sq = Mlx4Sq {
            qpn,
            qp_type: params.qp_type,
            buf: Self::slots(&buf, sq_geom)?,
            spare,
            max_sge,
            max_inline,
            bar2: self.0.bar2.clone(),
            db_offset: doorbell_offset(self.0.uar),
            bf: self.bf_reg(),
            bf_half: 0,
            fatal: self.0.fatal.clone(),
            rung: 0,
            bf_len: 0,
        };
        sq.init_slots();
        let rq = rq_geom.map(|g| Mlx4Rq {
            buf: buf.clone(),
            geom: g,
            max_sge: granted.max_recv_sge,
            db: db.clone(),
            scratch: vec![0; g.stride()].into_boxed_slice(),
        });
        Ok(QpResources {
            qpn,
            caps: granted,
            sq,
            rq,
        })
    }

    async fn modify_qp(
        &self,
        qpn: u32,
        attr: QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), CommandError> {
        let from = attr.cur_qp_state;
        let to = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            from
        };
        let t = {
            let o = self.0.objects();
            o.qps.get(&qpn).ok_or_else(|| no("QP", qpn))?.qp_type
        };
        let Some(op) = qp_ctx::transition_opcode(t, from, to) else {
            return Err(CommandError::BadState {
                object: "QP",
                number: qpn,
                reason: format!("no HCA command for {from:?} -> {to:?}"),
            });
        };
        let (inbox, saved) = {
            let mut o = self.0.objects();
            let rec = o.qps.get_mut(&qpn).ok_or_else(|| no("QP", qpn))?;
            let saved = rec.attrs;
            rec.attrs.apply(&attr, mask);
            rec.attrs.qp_state = to;
            let env = self.qp_env(qpn, rec);
            let mb: QpMailbox = qp_ctx::build(rec, &env, mask);
            (mb, saved)
        };
        let r = match op {
            opcode::RST_QP => {
                self.cmd(Cmd::new(op).opmod(opcode::OPMOD_RST_NO_OUTBOX).in_mod(qpn))
                    .await
            }
            opcode::ERR_QP => self.cmd(Cmd::new(op).in_mod(qpn)).await,
            opcode::RTS2SQD_QP => {
                let notify = u32::from(attr.en_sqd_async_notify) << 31;
                self.cmd(Cmd::new(op).in_mod(qpn | notify)).await
            }
            _ => {
                self.cmd_in(Cmd::new(op).in_mod(qpn), inbox.as_bytes())
                    .await
            }
        };
        let mut o = self.0.objects();
        if let Some(rec) = o.qps.get_mut(&qpn) {
            if r.is_err() {
                rec.attrs = saved;
            } else {
                rec.attrs.cur_qp_state = to;
            }
        }
        r.map(|_| ())
    }

    async fn query_qp(&self, qpn: u32) -> Result<QpAttr, CommandError> {
        let known = {
            let o = self.0.objects();
            o.qps.get(&qpn).ok_or_else(|| no("QP", qpn))?.attrs
        };
        let mut out = vec![0u8; size_of::<QpMailbox>()];
        self.cmd_out(Cmd::new(opcode::QUERY_QP).in_mod(qpn), &mut out)
            .await?;
        let (mb, _) =
            QpMailbox::read_from_prefix(&out).map_err(|_| invalid("QUERY_QP outbox too short"))?;
        qp_ctx::parse_query(&mb.ctx, &known).ok_or(CommandError::Firmware {
            opcode: opcode::QUERY_QP,
            status: 0,
            meaning: "QUERY_QP returned an unknown QP state",
        })
    }

    async fn destroy_qp(&self, qpn: u32) -> Result<(), CommandError> {
        if !self.0.objects().qps.contains_key(&qpn) {
            return Err(no("QP", qpn));
        }
        self.hw2sw(
            Cmd::new(opcode::RST_QP)
                .opmod(opcode::OPMOD_RST_NO_OUTBOX)
                .in_mod(qpn),
        )
        .await?;
        if let Some(rec) = self.0.objects().qps.remove(&qpn) {
            self.0.mtts.free(rec.mtt);
            self.0.dbs.free(&rec.db);
        }
        self.0.nums().qp.free(qpn);
        Ok(())
    }

    async fn register_mr(&self, params: MrParams) -> Result<MrKeys, CommandError> {
        self.0.check_alive()?;
        let index = self
            .0
            .nums()
            .mpt
            .alloc()
            .ok_or(CommandError::ResourceExhausted { resource: "MPTs" })?;
        let key = self.mpt_key(index);
        let rec = MrRec {
            key,
            pd: params.pd,
            region: params.region,
            offset: params.offset,
            length: params.length,
            access: params.access,
            mtt: None,
        };
        match self.write_mr(index, key, &rec).await {
            Ok((keys, mtt)) => {
                self.0.objects().mrs.insert(
                    index,
                    MrRec {
                        mtt: Some(mtt),
                        ..rec
                    },
                );
                Ok(keys)
            }
            Err(e) => {
                self.0.nums().mpt.free(index);
                Err(e)
            }
        }
    }

    async fn rereg_mr(&self, handle: u32, change: MrRereg) -> Result<MrKeys, CommandError> {
        let Some(old) = self.0.objects().mrs.get(&handle).cloned() else {
            return Err(no("MR", handle));
        };
        let mut new = old.clone();
        if let Some(pd) = change.pd {
            new.pd = pd;
        }
        if let Some((region, offset, length)) = change.range {
            new.region = region;
            new.offset = offset;
            new.length = length;
        }
        if let Some(access) = change.access {
            new.access = access;
        }
        // The HCA owns the MPT: take it back (REG_BOUND while windows are bound), then hand the
        // new one over under the same key.
        self.cmd(
            Cmd::new(opcode::HW2SW_MPT)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(handle),
        )
        .await?;
        self.take_mr_range(handle);
        match self.write_mr(handle, old.key, &new).await {
            Ok((keys, mtt)) => {
                self.0.objects().mrs.insert(
                    handle,
                    MrRec {
                        mtt: Some(mtt),
                        ..new
                    },
                );
                Ok(keys)
            }
            Err(e) => {
                // Put the old registration back so the handle stays valid.
                match self.write_mr(handle, old.key, &old).await {
                    Ok((_, mtt)) => {
                        self.0.objects().mrs.insert(
                            handle,
                            MrRec {
                                mtt: Some(mtt),
                                ..old
                            },
                        );
                    }
                    Err(_) => tracing::warn!(
                        handle,
                        "could not restore a registration after a failed rereg"
                    ),
                }
                Err(e)
            }
        }
    }

    async fn deregister_mr(&self, handle: u32) -> Result<(), CommandError> {
        self.hw2sw(
            Cmd::new(opcode::HW2SW_MPT)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(handle),
        )
        .await?;
        self.take_mr_range(handle);
        self.0.objects().mrs.remove(&handle);
        self.0.nums().mpt.free(handle);
        Ok(())
    }

    async fn alloc_mw(&self, pd: u32, mw_type: MwType) -> Result<MwKeys, CommandError> {
        self.0.check_alive()?;
        let index = self
            .0
            .nums()
            .mpt
            .alloc()
            .ok_or(CommandError::ResourceExhausted { resource: "MPTs" })?;
        let key = self.mpt_key(index);
        let mpt = Mpt {
            flags: mpt_flag::STATUS_FREE.into(),
            qpn: if mw_type == MwType::Type2 {
                mpt_flag::QP_BOUND.into()
            } else {
                0.into()
            },
            key: crate::layout::keys::key_to_hw(key).into(),
            pd_flags: (pd | mpt_flag::EN_INV).into(),
            ..Default::default()
        };
        if let Err(e) = self
            .cmd_in(Cmd::new(opcode::SW2HW_MPT).in_mod(index), mpt.as_bytes())
            .await
        {
            self.0.nums().mpt.free(index);
            return Err(e);
        }
        self.0.objects().mws.insert(index, pd);
        Ok(MwKeys {
            handle: index,
            rkey: key,
        })
    }

    /// Takes the window's MPT back and frees its number. When the HCA refuses (a live device
    /// that still owns the MPT), the window stays recorded and its number reserved, so no new
    /// MPT is ever written over one the HCA uses; closing the device releases both.
    async fn dealloc_mw(&self, handle: u32) -> Result<(), CommandError> {
        if !self.0.objects().mws.contains_key(&handle) {
            return Err(no("MW", handle));
        }
        self.hw2sw(
            Cmd::new(opcode::HW2SW_MPT)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(handle),
        )
        .await?;
        if self.0.objects().mws.remove(&handle).is_some() {
            self.0.nums().mpt.free(handle);
        }
        Ok(())
    }
}

const _: () = assert!(MAILBOX_SIZE >= size_of::<QpMailbox>());
