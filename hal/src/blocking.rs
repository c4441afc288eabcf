//! The blocking forms of the device commands, as thin wrappers over the async ones.
//!
//! [`block_on`] drives one future on the calling thread: it polls, and while the future is
//! pending it parks the thread until the future's waker unparks it. It spawns nothing and owns
//! no timer, so a command whose completion depends on someone else making progress (an
//! interrupt handler, a device model thread) must arrange for its waker to be called.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

use crate::attr::{QpAttr, QpAttrMask};
use crate::caps::{DeviceAttr, GidEntry, PortAttr};
use crate::device::{
    CqParams, Device, EqParams, MrKeys, MrParams, MrRereg, MwKeys, QpCreateParams, QpResources,
    SrqModify, SrqParams,
};
use crate::error::CommandError;
use crate::notify::InterruptSink;
use crate::queue::EventQueue;
use crate::types::{Gid, MwType};

struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on the current thread.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(ThreadWaker(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park();
    }
}

/// Blocking forms of every [`Device`] command. Implemented for every device.
#[allow(missing_docs)]
pub trait BlockingDevice: Device {
    fn query_device_blocking(&self) -> Result<DeviceAttr, CommandError> {
        block_on(self.query_device())
    }
    fn query_port_blocking(&self, port: u8) -> Result<PortAttr, CommandError> {
        block_on(self.query_port(port))
    }
    fn query_gid_blocking(&self, port: u8, index: u32) -> Result<GidEntry, CommandError> {
        block_on(self.query_gid(port, index))
    }
    fn query_pkey_blocking(&self, port: u8, index: u16) -> Result<u16, CommandError> {
        block_on(self.query_pkey(port, index))
    }
    fn alloc_pd_blocking(&self) -> Result<u32, CommandError> {
        block_on(self.alloc_pd())
    }
    fn dealloc_pd_blocking(&self, pd: u32) -> Result<(), CommandError> {
        block_on(self.dealloc_pd(pd))
    }
    fn create_eq_blocking(
        &self,
        params: EqParams,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError> {
        block_on(self.create_eq(params, sink))
    }
    fn destroy_eq_blocking(&self, eqn: u32) -> Result<(), CommandError> {
        block_on(self.destroy_eq(eqn))
    }
    fn create_cq_blocking(&self, params: CqParams) -> Result<Self::Cq, CommandError> {
        block_on(self.create_cq(params))
    }
    fn resize_cq_blocking(&self, cq: &mut Self::Cq, entries: u32) -> Result<(), CommandError> {
        block_on(self.resize_cq(cq, entries))
    }
    fn destroy_cq_blocking(&self, cqn: u32) -> Result<(), CommandError> {
        block_on(self.destroy_cq(cqn))
    }
    fn create_srq_blocking(&self, params: SrqParams) -> Result<Self::Srq, CommandError> {
        block_on(self.create_srq(params))
    }
    fn modify_srq_blocking(&self, srqn: u32, change: SrqModify) -> Result<(), CommandError> {
        block_on(self.modify_srq(srqn, change))
    }
    fn destroy_srq_blocking(&self, srqn: u32) -> Result<(), CommandError> {
        block_on(self.destroy_srq(srqn))
    }
    fn create_qp_blocking(
        &self,
        params: QpCreateParams,
    ) -> Result<QpResources<Self::Sq, Self::Rq>, CommandError> {
        block_on(self.create_qp(params))
    }
    fn modify_qp_blocking(
        &self,
        qpn: u32,
        attr: QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), CommandError> {
        block_on(self.modify_qp(qpn, attr, mask))
    }
    fn query_qp_blocking(&self, qpn: u32, known: QpAttr) -> Result<QpAttr, CommandError> {
        block_on(self.query_qp(qpn, known))
    }
    fn destroy_qp_blocking(&self, qpn: u32) -> Result<(), CommandError> {
        block_on(self.destroy_qp(qpn))
    }
    fn register_mr_blocking(&self, params: MrParams) -> Result<MrKeys, CommandError> {
        block_on(self.register_mr(params))
    }
    fn rereg_mr_blocking(&self, handle: u32, change: MrRereg) -> Result<MrKeys, CommandError> {
        block_on(self.rereg_mr(handle, change))
    }
    fn deregister_mr_blocking(&self, handle: u32) -> Result<(), CommandError> {
        block_on(self.deregister_mr(handle))
    }
    fn alloc_mw_blocking(&self, pd: u32, mw_type: MwType) -> Result<MwKeys, CommandError> {
        block_on(self.alloc_mw(pd, mw_type))
    }
    fn dealloc_mw_blocking(&self, handle: u32) -> Result<(), CommandError> {
        block_on(self.dealloc_mw(handle))
    }
    fn attach_mcast_blocking(&self, qpn: u32, gid: Gid, lid: u16) -> Result<(), CommandError> {
        block_on(self.attach_mcast(qpn, gid, lid))
    }
    fn detach_mcast_blocking(&self, qpn: u32, gid: Gid, lid: u16) -> Result<(), CommandError> {
        block_on(self.detach_mcast(qpn, gid, lid))
    }
}

impl<D: Device + ?Sized> BlockingDevice for D {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct YieldOnce {
        yielded: bool,
    }

    impl Future for YieldOnce {
        type Output = u32;
        fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
            if self.yielded {
                Poll::Ready(42)
            } else {
                self.yielded = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }

    #[test]
    fn block_on_returns_ready_value() {
        assert_eq!(block_on(async { 7 }), 7);
    }

    #[test]
    fn block_on_repolls_after_wake() {
        assert_eq!(block_on(YieldOnce { yielded: false }), 42);
    }

    #[test]
    fn block_on_waits_for_a_wake_from_another_thread() {
        struct Flag(Arc<AtomicBool>, Option<Waker>);
        impl Future for Flag {
            type Output = ();
            fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                if self.0.load(Ordering::Acquire) {
                    return Poll::Ready(());
                }
                if self.1.is_none() {
                    let flag = self.0.clone();
                    let waker = cx.waker().clone();
                    self.1 = Some(waker.clone());
                    std::thread::spawn(move || {
                        flag.store(true, Ordering::Release);
                        waker.wake();
                    });
                }
                Poll::Pending
            }
        }
        block_on(Flag(Arc::new(AtomicBool::new(false)), None));
    }
}
