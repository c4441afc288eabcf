//! [`VecHca`]: the engine's device seam with plain vectors for queues — the transport driven
//! with no queue format at all, by the engine's own unit tests and the fabric's tests (a
//! device that is nothing but an engine), or to try the engine out.

use std::collections::VecDeque;

use portverbs_hal::event::DeviceEvent;
use portverbs_hal::types::QpType;
use portverbs_hal::wc::Cqe;

use crate::hca::{Hca, RecvSource, RecvWqe, SendWqe, WqeFault};

/// A device whose send queue, receive queue and CQ are vectors shared by every QP: the host
/// pushes WQEs, the engine's completions and events are collected in order.
#[derive(Debug, Default)]
pub struct VecHca {
    /// Posted send WQEs; the producer counter is the length.
    pub sq: Vec<SendWqe>,
    /// Posted receive WQEs, taken from the front.
    pub rq: VecDeque<RecvWqe>,
    /// Completions, in the order the engine wrote them.
    pub cqes: Vec<Cqe>,
    /// Asynchronous events.
    pub events: Vec<DeviceEvent>,
    /// QPs the engine moved to ERR, in order.
    pub errors: Vec<u32>,
}

impl Hca for VecHca {
    fn sq_head(&self, _qpn: u32) -> Option<u32> {
        u32::try_from(self.sq.len()).ok()
    }

    fn read_send_wqe(
        &mut self,
        _qpn: u32,
        counter: u32,
        out: &mut SendWqe,
    ) -> Result<(), WqeFault> {
        *out = self.sq.get(counter as usize).cloned().ok_or(WqeFault {
            reason: "not posted",
        })?;
        Ok(())
    }

    fn take_recv_wqe(&mut self, _src: RecvSource, out: &mut RecvWqe) -> Result<bool, WqeFault> {
        Ok(match self.rq.pop_front() {
            Some(w) => {
                *out = w;
                true
            }
            None => false,
        })
    }

    fn recv_posted(&self, _src: RecvSource) -> u32 {
        u32::try_from(self.rq.len()).unwrap_or(u32::MAX)
    }

    fn post_completion(&mut self, _cqn: u32, cqe: &Cqe, _solicited: bool) -> bool {
        self.cqes.push(*cqe);
        true
    }

    fn post_event(&mut self, event: DeviceEvent) {
        self.events.push(event);
    }

    fn qp_error(&mut self, qpn: u32) {
        self.errors.push(qpn);
    }

    fn reset_queues(&mut self, _qpn: u32, _qp_type: QpType) {
        // Counters back to 0: the host posts afresh.
        self.sq.clear();
        self.rq.clear();
    }
}
