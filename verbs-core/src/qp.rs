//! Queue pairs: create with capacities, modify through the IBTA table, query, destroy, and the
//! data path (`post_send`, `post_recv`, `bind_mw`).
//!
//! The post path checks the QP state (one atomic load), validates each request against the QP's
//! transport and capacities, records its `wr_id`, asks the backend to encode it into its WQE
//! slot, and rings the doorbell once per call. It takes only this queue's own lock and
//! allocates nothing. A rejected request stops the post; the ones before it are posted and the
//! error names the index of the first rejected one (libibverbs' `bad_wr`).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use portverbs_hal::attr::{QpAttr, QpAttrMask, QpCaps};
use portverbs_hal::device::{Device, QpCreateParams};
use portverbs_hal::queue::{RecvQueue, SendQueue};
use portverbs_hal::types::{AccessFlags, LinkLayer, MwType, QpState, QpType, SpecialQp};
use portverbs_hal::wr::{MwBind, SendFlags, SendOp, SendWr, Sge};
use portverbs_hal::{BlockingDevice, CommandError, block_on};

use crate::context::{ContextInner, lock};
use crate::cq::Cq;
use crate::error::{
    CreateQpError, DestroyQpError, ModifyQpError, PostError, PostErrorKind, QpAttrError, Refused,
};
use crate::mr::Mr;
use crate::mw::Mw;
use crate::pd::Pd;
use crate::send_rules::{self, SendRules};
use crate::shared::{QpShared, WrRing};
use crate::srq::Srq;
use portverbs_hal::qp_state::{self, Violation};

mod mcast;

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sges: &'a [Sge],
}

/// How to create a QP (`struct ibv_qp_init_attr`).
#[derive(Debug)]
pub struct QpInit<'a, D: Device> {
    /// Transport.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: &'a Cq<D>,
    /// CQ for receive completions.
    pub recv_cq: &'a Cq<D>,
    /// Receive through an SRQ instead of an own receive queue.
    pub srq: Option<&'a Srq<D>>,
    /// Requested capacities.
    pub caps: QpCaps,
    /// Every send generates a completion, whatever its flags.
    pub sq_sig_all: bool,
    /// Create this special QP instead of one from the device's pool: [`QpInit::gsi`].
    pub special: Option<SpecialQp>,
}

impl<'a, D: Device> QpInit<'a, D> {
    /// A QP of `qp_type` whose sends and receives complete on `cq`, with its own receive
    /// queue and room for 16 send and 16 receive requests of one SGE each and no inline
    /// data. Change what differs with struct update syntax:
    /// `QpInit { caps: QpCaps { max_inline_data: 64, ..init.caps }, ..init }`.
    pub fn new(qp_type: QpType, cq: &'a Cq<D>) -> Self {
        Self {
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            special: None,
        }
    }

    /// The device's General Services Interface QP (QP1, IBA 13.5.1), whose sends and
    /// receives complete on `cq`: a UD QP numbered 1, the one the connection manager's MADs
    /// use. Its Q_Key is [`SpecialQp::GSI_QKEY`] (modify it to INIT with that value); one per
    /// device, so a second one fails with [`CommandError::Busy`] until the first is
    /// destroyed. Room for 64 send and 64 receive requests of one SGE each.
    pub fn gsi(cq: &'a Cq<D>) -> Self {
        let init = Self::new(QpType::Ud, cq);
        Self {
            caps: QpCaps {
                max_send_wr: 64,
                max_recv_wr: 64,
                ..init.caps
            },
            special: Some(SpecialQp::Gsi),
            ..init
        }
    }
}

/// The send queue's device object under the poster's lock. The producer counter is not here:
/// it is [`WrRing::head`] of the QP's shared bookkeeping, which only the poster (holding this
/// lock) writes, so it reads it back with a relaxed load.
struct SqState<S> {
    hw: S,
    /// Outstanding requests allowed: the device queue's depth capped by the granted capacity.
    depth: u32,
}

/// The receive queue's device object; its producer counter is [`WrRing::head`] too.
struct RqState<R> {
    hw: R,
}

pub(crate) struct QpInner<D: Device> {
    pd: Pd<D>,
    send_cq: Cq<D>,
    recv_cq: Cq<D>,
    srq: Option<Srq<D>>,
    qpn: u32,
    qp_type: QpType,
    special: Option<SpecialQp>,
    caps: QpCaps,
    sq_sig_all: bool,
    send_rules: SendRules,
    state: AtomicU8,
    attr: Mutex<QpAttr>,
    modifying: AtomicBool,
    sq: parking_lot::Mutex<SqState<D::Sq>>,
    rq: Option<Mutex<RqState<D::Rq>>>,
    shared: Arc<QpShared<D::Srq>>,
    /// The multicast groups the QP is attached to (at most `max_mcast_grp`).
    mcast: Mutex<Vec<portverbs_hal::types::Gid>>,
}

/// A queue pair (`struct ibv_qp`). Cheap to clone.
pub struct Qp<D: Device> {
    pub(crate) inner: Arc<QpInner<D>>,
}

/// A handle that does not keep its QP alive ([`Qp::downgrade`]): for a layer that tracks a
/// QP the application owns (the CM's QP ↔ connection association) without making
/// [`Qp::destroy`] refuse.
pub struct WeakQp<D: Device> {
    inner: std::sync::Weak<QpInner<D>>,
    qpn: u32,
}

impl<D: Device> Clone for WeakQp<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            qpn: self.qpn,
        }
    }
}

impl<D: Device> fmt::Debug for WeakQp<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakQp")
            .field("qpn", &format_args!("{:#x}", self.qpn))
            .finish()
    }
}

impl<D: Device> WeakQp<D> {
    /// The QP, unless every [`Qp`] handle is gone (destroyed or dropped).
    pub fn upgrade(&self) -> Option<Qp<D>> {
        self.inner.upgrade().map(|inner| Qp { inner })
    }

    /// The QP number it had.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }
}

impl<D: Device> Qp<D> {
    /// A handle that does not keep this QP alive.
    pub fn downgrade(&self) -> WeakQp<D> {
        WeakQp {
            inner: Arc::downgrade(&self.inner),
            qpn: self.inner.qpn,
        }
    }
}

impl<D: Device> Clone for Qp<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for Qp<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &format_args!("{:#x}", self.inner.qpn))
            .field("type", &self.inner.qp_type)
            .field("state", &self.state())
            .finish()
    }
}

impl<D: Device> Pd<D> {
    /// Creates a queue pair in RESET (`ibv_create_qp`).
    ///
    /// # Errors
    /// Capacities beyond the device limits, objects of another device, or the device refused.
    pub async fn create_qp(&self, init: QpInit<'_, D>) -> Result<Qp<D>, CreateQpError> {
        let ctx = &self.inner.ctx;
        for (what, cq) in [("send CQ", init.send_cq), ("receive CQ", init.recv_cq)] {
            if !ContextInner::ptr_eq(cq.ctx(), ctx) {
                return Err(CreateQpError::ForeignObject { what });
            }
        }
        if let Some(srq) = init.srq {
            if !srq.inner.pd.same_device(ctx) {
                return Err(CreateQpError::ForeignObject { what: "SRQ" });
            }
        }
        if let Some(special) = init.special {
            if init.qp_type != special.qp_type() {
                return Err(CreateQpError::SpecialType {
                    special,
                    qp_type: init.qp_type,
                });
            }
        }
        let a = &ctx.attr;
        let c = &init.caps;
        let limits = [
            ("max_send_wr", c.max_send_wr, a.max_qp_wr),
            ("max_recv_wr", c.max_recv_wr, a.max_qp_wr),
            ("max_send_sge", c.max_send_sge, a.max_sge),
            ("max_recv_sge", c.max_recv_sge, a.max_sge),
            ("max_inline_data", c.max_inline_data, a.max_inline_data),
        ];
        for (what, requested, max) in limits {
            if requested > max {
                return Err(CreateQpError::CapTooLarge {
                    what,
                    requested,
                    max,
                });
            }
        }
        let res = ctx
            .device()
            .create_qp(QpCreateParams {
                pd: self.pdn(),
                qp_type: init.qp_type,
                send_cqn: init.send_cq.cqn(),
                recv_cqn: init.recv_cq.cqn(),
                srqn: init.srq.map(Srq::srqn),
                caps: init.caps,
                special: init.special,
            })
            .await?;
        if let Some(special) = init.special {
            if res.qpn != special.qpn() {
                // The device broke the contract: what it created is not the special QP, and
                // destroying it would go wrong with the queues unreleased; say so.
                return Err(CreateQpError::Device(CommandError::InvalidArgument {
                    what: format!(
                        "{special:?} QP created with number {:#x}, not {:#x}",
                        res.qpn,
                        special.qpn()
                    ),
                }));
            }
        }
        let shared = Arc::new(QpShared {
            qpn: res.qpn,
            sq: WrRing::new(res.sq.depth()),
            rq: res.rq.as_ref().map(|rq| WrRing::new(rq.depth())),
            srq: init.srq.map(|s| s.inner.shared.clone()),
        });
        for cq in [init.send_cq, init.recv_cq] {
            cq.inner.poll.lock().qps.insert(shared.clone());
        }
        ctx.counts.qps.fetch_add(1, Ordering::Relaxed);
        lock(&ctx.registry.qps).insert(res.qpn);
        Ok(Qp {
            inner: Arc::new(QpInner {
                pd: self.clone(),
                send_cq: init.send_cq.clone(),
                recv_cq: init.recv_cq.clone(),
                srq: init.srq.cloned(),
                qpn: res.qpn,
                qp_type: init.qp_type,
                special: init.special,
                caps: res.caps,
                sq_sig_all: init.sq_sig_all,
                send_rules: SendRules::new(init.qp_type, &res.caps, self.pdn()),
                state: AtomicU8::new(QpState::Reset as u8),
                attr: Mutex::new(QpAttr {
                    cap: res.caps,
                    ..QpAttr::default()
                }),
                modifying: AtomicBool::new(false),
                sq: parking_lot::Mutex::new(SqState {
                    depth: res.sq.depth().min(res.caps.max_send_wr.max(1)),
                    hw: res.sq,
                }),
                rq: res.rq.map(|hw| Mutex::new(RqState { hw })),
                shared,
                mcast: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Blocking form of [`Pd::create_qp`].
    ///
    /// # Errors
    /// As [`Pd::create_qp`].
    pub fn create_qp_blocking(&self, init: QpInit<'_, D>) -> Result<Qp<D>, CreateQpError> {
        block_on(self.create_qp(init))
    }
}

impl<D: Device> Qp<D> {
    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.inner.qpn
    }

    /// Transport.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// The special QP this is ([`QpInit::gsi`]), if it is one.
    pub fn special(&self) -> Option<SpecialQp> {
        self.inner.special
    }

    /// Granted capacities (≥ requested).
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// State as last set by a modify (the device may since have moved it to ERR or SQE; see
    /// [`Qp::query`]).
    pub fn state(&self) -> QpState {
        QpState::from_u8(self.inner.state.load(Ordering::Acquire)).unwrap_or(QpState::Err)
    }

    /// The SRQ it receives through, if it has one.
    pub fn srq(&self) -> Option<&Srq<D>> {
        self.inner.srq.as_ref()
    }

    /// The PD.
    pub fn pd(&self) -> &Pd<D> {
        &self.inner.pd
    }

    /// The send CQ.
    pub fn send_cq(&self) -> &Cq<D> {
        &self.inner.send_cq
    }

    /// The receive CQ.
    pub fn recv_cq(&self) -> &Cq<D> {
        &self.inner.recv_cq
    }

    fn ctx(&self) -> &Arc<ContextInner<D>> {
        &self.inner.pd.inner.ctx
    }

    /// Posts send work requests (`ibv_post_send`). Allowed in RTS and SQD (queued), SQE and ERR
    /// (completed with `WR_FLUSH_ERR`); refused in RESET, INIT and RTR (IBA 10.8.2).
    ///
    /// # Errors
    /// The first rejected request; those before it were posted.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let fail = |index: usize, kind| PostError {
            queue: "send queue",
            qpn: self.inner.qpn,
            index,
            wr_id: wrs.get(index).map_or(0, |w| w.wr_id),
            kind,
        };
        let state = self.state();
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(fail(0, PostErrorKind::InvalidState { state }));
        }
        let ring = &self.inner.shared.sq;
        let mut sq = self.inner.sq.lock();
        let sq = &mut *sq;
        let start = ring.head.load(Ordering::Relaxed);
        let mut head = start;
        let mut room = 0;
        // One request (the common case) is straight-line code; a list is the same step in a
        // loop that stops at the first refusal.
        let result = match wrs {
            [wr] => self
                .post_one(sq, ring, wr, &mut head, &mut room)
                .map_err(|k| fail(0, k)),
            _ => wrs.iter().enumerate().try_for_each(|(i, wr)| {
                self.post_one(sq, ring, wr, &mut head, &mut room)
                    .map_err(|k| fail(i, k))
            }),
        };
        if head != start {
            // The poller must know the new WQEs before the device can complete them.
            ring.publish(head);
            sq.hw.ring_doorbell(start, head);
        }
        result
    }

    /// Admits, records and encodes one send request at counter `head`, then advances it (not
    /// yet published or rung).
    #[inline(always)]
    fn post_one(
        &self,
        sq: &mut SqState<D::Sq>,
        ring: &WrRing,
        wr: &SendWr<'_>,
        head: &mut u32,
        room: &mut u32,
    ) -> Result<(), PostErrorKind> {
        // The precomputed rules admit a well-formed request in a few compares; only a request
        // they refuse pays for the check that names the broken rule.
        if !self.inner.send_rules.admits(wr) {
            send_rules::check(
                self.inner.qp_type,
                &self.inner.caps,
                self.inner.pd.pdn(),
                wr,
            )?;
        }
        let c = *head;
        if !ring.take_slot(c, sq.depth, room) {
            return Err(PostErrorKind::QueueFull { depth: sq.depth });
        }
        let signaled = self.inner.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        ring.set(c, wr.wr_id);
        sq.hw
            .write_wqe(c, wr, signaled)
            .map_err(PostErrorKind::Encode)?;
        *head = c.wrapping_add(1);
        Ok(())
    }

    /// Posts receive work requests (`ibv_post_recv`). Refused in RESET and on QPs with an SRQ.
    ///
    /// # Errors
    /// The first rejected request; those before it were posted.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let qpn = self.inner.qpn;
        let fail = |index: usize, kind| PostError {
            queue: "receive queue",
            qpn,
            index,
            wr_id: wrs.get(index).map_or(0, |w| w.wr_id),
            kind,
        };
        let Some(rq) = &self.inner.rq else {
            let srqn = self.inner.srq.as_ref().map_or(0, Srq::srqn);
            return Err(fail(0, PostErrorKind::UsesSrq { srqn }));
        };
        let state = self.state();
        if state == QpState::Reset {
            return Err(fail(0, PostErrorKind::InvalidState { state }));
        }
        let Some(ring) = &self.inner.shared.rq else {
            return Err(fail(0, PostErrorKind::UsesSrq { srqn: 0 }));
        };
        let mut rq = lock(rq);
        let depth = rq.hw.depth().min(self.inner.caps.max_recv_wr.max(1));
        let max_sge = self.inner.caps.max_recv_sge;
        // The poster's own counter (it alone writes it, under the lock above).
        let start = ring.head.load(Ordering::Relaxed);
        let mut head = start;
        let mut result = Ok(());
        let mut room = 0;
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sges.len() > max_sge as usize {
                result = Err(fail(
                    i,
                    PostErrorKind::TooManySges {
                        given: wr.sges.len(),
                        max: max_sge,
                    },
                ));
                break;
            }
            if !ring.take_slot(head, depth, &mut room) {
                result = Err(fail(i, PostErrorKind::QueueFull { depth }));
                break;
            }
            ring.set(head, wr.wr_id);
            if let Err(e) = rq.hw.write_wqe(head, wr.sges) {
                result = Err(fail(i, PostErrorKind::Encode(e)));
                break;
            }
            head = head.wrapping_add(1);
        }
        if head != start {
            ring.publish(head);
            rq.hw.ring_doorbell(head);
        }
        result
    }

    /// Binds a type-1 memory window (`ibv_bind_mw`): posts the bind as a send work request
    /// and returns the window's new rkey (valid once the bind completes successfully).
    ///
    /// # Errors
    /// The post was refused.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &self,
        mw: &Mw<D>,
        mr: &Mr<D>,
        addr: u64,
        len: u64,
        access: AccessFlags,
        wr_id: u64,
        signaled: bool,
    ) -> Result<u32, PostError> {
        if mw.mw_type() != MwType::Type1 {
            return Err(PostError {
                queue: "send queue",
                qpn: self.inner.qpn,
                index: 0,
                wr_id,
                kind: PostErrorKind::WrongWindowType {
                    mw_type: mw.mw_type(),
                },
            });
        }
        let bind: MwBind = mw.bind(mr, addr, len, access);
        let mut wr = SendWr::new(wr_id, SendOp::BindMw { bind });
        if signaled {
            wr = wr.signaled();
        }
        self.post_send(&[wr])?;
        Ok(bind.new_rkey)
    }

    fn check_values(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), QpAttrError> {
        use QpAttrError as E;
        let ctx = self.ctx();
        let a = &ctx.attr;
        let ports = a.phys_port_cnt;
        let port_ok = |p: u8| p >= 1 && p <= ports;
        if mask.contains(QpAttrMask::PORT) && !port_ok(attr.port_num) {
            let port = attr.port_num;
            return Err(E::Port { port, ports });
        }
        if self.inner.special == Some(SpecialQp::Gsi)
            && mask.contains(QpAttrMask::QKEY)
            && attr.qkey != SpecialQp::GSI_QKEY
        {
            return Err(E::GsiQkey { qkey: attr.qkey });
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index >= a.max_pkeys {
            let (index, table) = (attr.pkey_index, a.max_pkeys);
            return Err(E::PkeyIndex { index, table });
        }
        for (flag, value) in [
            (QpAttrMask::RQ_PSN, attr.rq_psn),
            (QpAttrMask::SQ_PSN, attr.sq_psn),
            (QpAttrMask::DEST_QPN, attr.dest_qp_num),
        ] {
            if mask.contains(flag) && value > 0x00ff_ffff {
                return Err(E::Over24Bits { attr: flag, value });
            }
        }
        for (flag, value, max) in [
            (QpAttrMask::TIMEOUT, attr.timeout, 31),
            (QpAttrMask::RETRY_CNT, attr.retry_cnt, 7),
            (QpAttrMask::RNR_RETRY, attr.rnr_retry, 7),
            (QpAttrMask::MIN_RNR_TIMER, attr.min_rnr_timer, 31),
        ] {
            if mask.contains(flag) && value > max {
                let (value, max) = (u32::from(value), u32::from(max));
                return Err(E::AboveMax {
                    attr: flag,
                    value,
                    max,
                });
            }
        }
        for (flag, value, max) in [
            (
                QpAttrMask::MAX_QP_RD_ATOMIC,
                attr.max_rd_atomic,
                a.max_qp_init_rd_atom,
            ),
            (
                QpAttrMask::MAX_DEST_RD_ATOMIC,
                attr.max_dest_rd_atomic,
                a.max_qp_rd_atom,
            ),
        ] {
            if mask.contains(flag) && u32::from(value) > max {
                let value = u32::from(value);
                return Err(E::AboveMax {
                    attr: flag,
                    value,
                    max,
                });
            }
        }
        let alt = mask & (QpAttrMask::ALT_PATH | QpAttrMask::PATH_MIG_STATE);
        if !alt.is_empty() {
            return Err(E::AltPathUnsupported { attr: alt });
        }
        if mask.contains(QpAttrMask::ACCESS_FLAGS) {
            let allowed = AccessFlags::REMOTE | AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
            if !allowed.contains(attr.qp_access_flags) {
                return Err(E::AccessFlags(attr.qp_access_flags));
            }
        }
        if mask.contains(QpAttrMask::AV) {
            let av = &attr.ah_attr;
            if !port_ok(av.port_num) {
                let port = av.port_num;
                return Err(E::AvPort { port, ports });
            }
            let pa = &ctx.port_attrs[usize::from(av.port_num) - 1];
            if pa.link_layer == LinkLayer::Ethernet && !av.is_global {
                return Err(E::RoceNeedsGrh);
            }
            if av.is_global && u32::from(av.sgid_index) >= pa.gid_tbl_len {
                let (index, table) = (av.sgid_index, pa.gid_tbl_len);
                return Err(E::SgidIndex { index, table });
            }
            if mask.contains(QpAttrMask::PATH_MTU) && attr.path_mtu > pa.max_mtu {
                let (mtu, max) = (attr.path_mtu, pa.max_mtu);
                return Err(E::PathMtu { mtu, max });
            }
        }
        Ok(())
    }

    /// Modifies the QP (`ibv_modify_qp`): checks the transition and the attribute mask against
    /// the IBTA table for the QP's transport and the values against the device limits, then
    /// asks the device. A move to RESET discards outstanding work requests and their
    /// completions.
    ///
    /// # Errors
    /// [`ModifyQpError`] naming the QP, states and attributes involved.
    pub async fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), ModifyQpError> {
        let qpn = self.inner.qpn;
        let t = self.inner.qp_type;
        if self.inner.modifying.swap(true, Ordering::AcqRel) {
            return Err(ModifyQpError::InProgress { qpn });
        }
        let result = self.modify_inner(attr, mask, qpn, t).await;
        self.inner.modifying.store(false, Ordering::Release);
        result
    }

    async fn modify_inner(
        &self,
        attr: &QpAttr,
        mask: QpAttrMask,
        qpn: u32,
        t: QpType,
    ) -> Result<(), ModifyQpError> {
        let cur = if mask.contains(QpAttrMask::CUR_STATE) {
            attr.cur_qp_state
        } else {
            self.state()
        };
        // Without STATE in the mask the modify stays in the current state.
        let target = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            cur
        };
        let to = qp_state::check(t, cur, attr.qp_state, mask).map_err(|v| match v {
            Violation::Transition => ModifyQpError::InvalidTransition {
                qpn,
                qp_type: t,
                from: cur,
                to: target,
            },
            Violation::Missing(missing) => ModifyQpError::MissingAttributes {
                qpn,
                from: cur,
                to: target,
                missing,
            },
            Violation::Unexpected(unexpected) => ModifyQpError::UnexpectedAttributes {
                qpn,
                from: cur,
                to: target,
                unexpected,
            },
        })?;
        self.check_values(attr, mask)
            .map_err(|error| ModifyQpError::InvalidAttribute { qpn, error })?;
        // The QP's one attribute record, as it is to be after this modify, goes to the device
        // (which keeps no copy); it becomes the record only once the device has taken it.
        let mut record = *lock(&self.inner.attr);
        record.apply(attr, mask);
        record.qp_state = to;
        record.cur_qp_state = cur;
        if !mask.contains(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
            // A request for this modify only, never remembered.
            record.en_sqd_async_notify = false;
        }
        // The device checks the transition against the state it really is in (it may have
        // moved the QP to ERR on its own); CUR_STATE goes down only when the caller asserted it.
        let cmd_mask = mask | QpAttrMask::STATE;
        self.ctx()
            .device()
            .modify_qp(qpn, record, cmd_mask)
            .await
            .map_err(|source| ModifyQpError::Device { qpn, source })?;
        if to == QpState::Reset {
            // The device makes no completion for the QP once it is in RESET. Discard those it
            // left, with the CQs held, then restart the queues — rdma-core's providers clean
            // the CQs after the command in the same way. A poll that slips in between still
            // finds the old queues intact.
            with_cqs_cleaned(&self.inner.send_cq, &self.inner.recv_cq, qpn, || ());
            let mut sq = self.inner.sq.lock();
            sq.hw.reset();
            self.inner.shared.sq.reset();
            if let (Some(rq), Some(ring)) = (&self.inner.rq, &self.inner.shared.rq) {
                let mut rq = lock(rq);
                rq.hw.reset();
                ring.reset();
            }
        }
        *lock(&self.inner.attr) = QpAttr {
            cur_qp_state: to,
            ..record
        };
        self.inner.state.store(to as u8, Ordering::Release);
        if to != cur {
            tracing::debug!(qpn, "QP {cur} => {to}");
        }
        Ok(())
    }

    /// Blocking form of [`Qp::modify`].
    ///
    /// # Errors
    /// As [`Qp::modify`].
    pub fn modify_blocking(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), ModifyQpError> {
        block_on(self.modify(attr, mask))
    }

    /// Queries the QP from the device (`ibv_query_qp`), including a state the device changed on
    /// its own (ERR after a fatal error, SQE).
    ///
    /// # Errors
    /// The device refused.
    pub async fn query(&self) -> Result<QpAttr, CommandError> {
        let known = *lock(&self.inner.attr);
        let mut a = self.ctx().device().query_qp(self.inner.qpn, known).await?;
        a.cap = self.inner.caps;
        self.inner.state.store(a.qp_state as u8, Ordering::Release);
        Ok(a)
    }

    /// Blocking form of [`Qp::query`].
    ///
    /// # Errors
    /// As [`Qp::query`].
    pub fn query_blocking(&self) -> Result<QpAttr, CommandError> {
        block_on(self.query())
    }

    /// Destroys the QP now (`ibv_destroy_qp`). Refused while other handles exist.
    ///
    /// # Errors
    /// [`DestroyQpError::Busy`] with the QP handed back.
    pub fn destroy(self) -> Result<(), Refused<Self, DestroyQpError>> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => {
                drop(inner);
                Ok(())
            }
            Err(inner) => {
                let users = Arc::strong_count(&inner) - 1;
                let qpn = inner.qpn;
                Err(Refused::new(
                    DestroyQpError::Busy { qpn, users },
                    Self { inner },
                ))
            }
        }
    }
}

/// Runs `f` (a device command that ends a QP's current incarnation) with both CQs' poll locks
/// held, then removes the QP's unpolled completions from them (mlx4's "CQ clean").
fn with_cqs_cleaned<D: Device, R>(
    send: &Cq<D>,
    recv: &Cq<D>,
    qpn: u32,
    f: impl FnOnce() -> R,
) -> R {
    let (s, r) = (&send.inner, &recv.inner);
    if Arc::ptr_eq(s, r) {
        let mut g = s.poll.lock();
        let out = f();
        g.clean(qpn, s.cqn);
        out
    } else {
        // Lock in CQ-number order so that two teardowns never deadlock.
        let (a, b) = if s.cqn < r.cqn { (s, r) } else { (r, s) };
        let mut ga = a.poll.lock();
        let mut gb = b.poll.lock();
        let out = f();
        ga.clean(qpn, a.cqn);
        gb.clean(qpn, b.cqn);
        out
    }
}

impl<D: Device> Drop for QpInner<D> {
    fn drop(&mut self) {
        let qpn = self.qpn;
        let ctx = self.pd.inner.ctx.clone();
        let r = with_cqs_cleaned(&self.send_cq, &self.recv_cq, qpn, || {
            ctx.device().destroy_qp_blocking(qpn)
        });
        if let Err(e) = r {
            tracing::warn!(qpn, error = %e, "destroying a QP failed");
        }
        for cq in [&self.send_cq, &self.recv_cq] {
            cq.inner.poll.lock().qps.remove(qpn);
        }
        lock(&ctx.registry.qps).remove(&qpn);
        ctx.counts.qps.fetch_sub(1, Ordering::Relaxed);
    }
}
