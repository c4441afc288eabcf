//! Shared receive queues, with the limit event (IBA 10.2.9.5): armed with a limit, the SRQ
//! raises `SRQ_LIMIT_REACHED` once when fewer WQEs than that remain posted.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use portverbs_hal::device::{Device, SrqModify, SrqParams};
use portverbs_hal::queue::SharedRecvQueue;
use portverbs_hal::{BlockingDevice, block_on};

use crate::context::lock;
use crate::error::{PostError, PostErrorKind, Refused, SrqError};
use crate::pd::Pd;
use crate::qp::RecvWr;
use crate::shared::SrqShared;

/// How to create an SRQ.
#[derive(Debug, Clone, Copy, Default)]
pub struct SrqInit {
    /// Minimum outstanding receives.
    pub max_wr: u32,
    /// Scatter entries per receive.
    pub max_sge: u32,
    /// Limit armed at creation (0 = not armed).
    pub limit: u32,
}

pub(crate) struct SrqInner<D: Device> {
    pub(crate) pd: Pd<D>,
    pub(crate) shared: Arc<SrqShared<D::Srq>>,
    limit: AtomicU32,
    max_sge: u32,
}

/// A shared receive queue (`struct ibv_srq`). Cheap to clone; QPs attached hold a reference.
pub struct Srq<D: Device> {
    pub(crate) inner: Arc<SrqInner<D>>,
}

impl<D: Device> Clone for Srq<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for Srq<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Srq").field("srqn", &self.srqn()).finish()
    }
}

impl<D: Device> Pd<D> {
    /// Creates a shared receive queue (`ibv_create_srq`).
    ///
    /// # Errors
    /// Capacities beyond the device limits, a limit above the size, or the device refused.
    pub async fn create_srq(&self, init: SrqInit) -> Result<Srq<D>, SrqError> {
        let ctx = &self.inner.ctx;
        let a = &ctx.attr;
        for (what, requested, max) in [
            ("max_wr", init.max_wr, a.max_srq_wr),
            ("max_sge", init.max_sge, a.max_srq_sge),
        ] {
            if requested > max {
                return Err(SrqError::CapTooLarge {
                    what,
                    requested,
                    max,
                });
            }
        }
        if init.limit > init.max_wr {
            return Err(SrqError::LimitTooLarge {
                limit: init.limit,
                size: init.max_wr,
            });
        }
        let hw = ctx
            .device()
            .create_srq(SrqParams {
                pd: self.pdn(),
                max_wr: init.max_wr.max(1),
                max_sge: init.max_sge.max(1),
                limit: init.limit,
            })
            .await?;
        let max_sge = hw.max_sge();
        let shared = Arc::new(SrqShared::new(hw));
        let inner = Arc::new(SrqInner {
            pd: self.clone(),
            shared,
            limit: AtomicU32::new(init.limit),
            max_sge,
        });
        lock(&ctx.registry.srqs).insert(inner.shared.srqn, Arc::downgrade(&inner));
        ctx.counts.srqs.fetch_add(1, Ordering::Relaxed);
        Ok(Srq { inner })
    }

    /// Blocking form of [`Pd::create_srq`].
    ///
    /// # Errors
    /// As [`Pd::create_srq`].
    pub fn create_srq_blocking(&self, init: SrqInit) -> Result<Srq<D>, SrqError> {
        block_on(self.create_srq(init))
    }
}

impl<D: Device> Srq<D> {
    /// The device's SRQ number.
    pub fn srqn(&self) -> u32 {
        self.inner.shared.srqn
    }

    /// Slots (≥ what was asked for).
    pub fn depth(&self) -> u32 {
        self.inner.shared.depth
    }

    /// Scatter entries per receive.
    pub fn max_sge(&self) -> u32 {
        self.inner.max_sge
    }

    /// The armed limit (0 once the event fired, or when never armed).
    pub fn limit(&self) -> u32 {
        self.inner.limit.load(Ordering::Acquire)
    }

    /// Posts receives (`ibv_post_srq_recv`).
    ///
    /// # Errors
    /// The first rejected request (earlier ones were posted).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let shared = &self.inner.shared;
        let mut hw = lock(&shared.hw);
        let mut result = Ok(());
        let mut posted = 0;
        for (i, wr) in wrs.iter().enumerate() {
            let fail = |kind| PostError {
                queue: "SRQ",
                qpn: shared.srqn,
                index: i,
                wr_id: wr.wr_id,
                kind,
            };
            if wr.sges.len() > self.inner.max_sge as usize {
                result = Err(fail(PostErrorKind::TooManySges {
                    given: wr.sges.len(),
                    max: self.inner.max_sge,
                }));
                break;
            }
            match hw.write_wqe(wr.sges) {
                Ok(Some(slot)) if (slot as usize) < shared.wr_ids.len() => {
                    shared.wr_ids[slot as usize].store(wr.wr_id, Ordering::Relaxed);
                    shared.busy[slot as usize].store(true, Ordering::Release);
                    posted += 1;
                }
                Ok(Some(slot)) => {
                    result = Err(fail(PostErrorKind::Encode(
                        portverbs_hal::error::WqeError::BadSlot {
                            slot,
                            depth: shared.wr_ids.len() as u32,
                        },
                    )));
                    break;
                }
                Ok(None) => {
                    result = Err(fail(PostErrorKind::QueueFull { depth: hw.depth() }));
                    break;
                }
                Err(e) => {
                    result = Err(fail(PostErrorKind::Encode(e)));
                    break;
                }
            }
        }
        if posted > 0 {
            hw.ring_doorbell();
        }
        result
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    ///
    /// # Errors
    /// A limit above the size, or the device refused.
    pub async fn arm_limit(&self, limit: u32) -> Result<(), SrqError> {
        if limit > self.depth() {
            return Err(SrqError::LimitTooLarge {
                limit,
                size: self.depth(),
            });
        }
        let ctx = &self.inner.pd.inner.ctx;
        ctx.device()
            .modify_srq(
                self.srqn(),
                SrqModify {
                    max_wr: None,
                    limit: Some(limit),
                },
            )
            .await?;
        self.inner.limit.store(limit, Ordering::Release);
        Ok(())
    }

    /// Blocking form of [`Srq::arm_limit`].
    ///
    /// # Errors
    /// As [`Srq::arm_limit`].
    pub fn arm_limit_blocking(&self, limit: u32) -> Result<(), SrqError> {
        block_on(self.arm_limit(limit))
    }

    /// Asks the device to resize the SRQ (`IBV_SRQ_MAX_WR`); devices without `SRQ_RESIZE`
    /// refuse.
    ///
    /// # Errors
    /// The device refused.
    pub fn resize_blocking(&self, max_wr: u32) -> Result<(), SrqError> {
        let ctx = &self.inner.pd.inner.ctx;
        Ok(ctx.device().modify_srq_blocking(
            self.srqn(),
            SrqModify {
                max_wr: Some(max_wr),
                limit: None,
            },
        )?)
    }

    /// Destroys the SRQ now. Refused while QPs or other handles use it.
    ///
    /// # Errors
    /// [`SrqError::Busy`] with the SRQ handed back.
    pub fn destroy(self) -> Result<(), Refused<Self, SrqError>> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => {
                drop(inner);
                Ok(())
            }
            Err(inner) => {
                let users = Arc::strong_count(&inner) - 1;
                let srqn = inner.shared.srqn;
                Err(Refused::new(SrqError::Busy { srqn, users }, Self { inner }))
            }
        }
    }
}

impl<D: Device> SrqInner<D> {
    /// The device reported the limit event: the limit is disarmed.
    pub(crate) fn limit_fired(&self) {
        self.limit.store(0, Ordering::Release);
    }
}

impl<D: Device> Drop for SrqInner<D> {
    fn drop(&mut self) {
        let ctx = &self.pd.inner.ctx;
        lock(&ctx.registry.srqs).remove(&self.shared.srqn);
        ctx.counts.srqs.fetch_sub(1, Ordering::Relaxed);
        if let Err(e) = ctx.device().destroy_srq_blocking(self.shared.srqn) {
            tracing::warn!(srqn = self.shared.srqn, error = %e, "destroying an SRQ failed");
        }
    }
}
