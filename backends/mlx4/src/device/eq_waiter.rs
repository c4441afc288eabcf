//! The pool's interrupts on a function that signals eventfds only (VFIO, Linux).
//!
//! The kernel's MSI-X handler of a vfio-pci function signals the eventfd a vector is bound to
//! (`VFIO_DEVICE_SET_IRQS`) and runs nothing of ours, so the fan-out sink of a shared EQ
//! ([`super::eq_demux`]) would never run there. Instead each vector of the pool is bound to an
//! eventfd the driver owns ([`VectorFd`]), and one thread per device sleeps in `epoll_wait(2)`
//! over all of them: on each wake-up it resets the eventfds that are readable and raises the
//! fan-out sinks of their EQs, which signal every virtual queue's own sink (the completion
//! channel's eventfd an application polls). One thread for the device, whatever the number of
//! contexts; it never polls the device, it only sleeps until the kernel signals.
//!
//! The thread starts when the first virtual queue that can be woken (its sink has an eventfd)
//! is made: a device used only for polling keeps none. An interrupt that came before is not
//! lost: the eventfd's counter keeps it. Closing the device wakes the thread through an eventfd
//! of its own and joins it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use portverbs_hal::notify::InterruptSink;
use rustix::event::{EventfdFlags, epoll, eventfd};
use rustix::io::Errno;

/// The `epoll` data of the stop eventfd (the routes use their index).
const STOP: u64 = u64::MAX;

/// A nonblocking eventfd of the driver's, bound to one MSI-X vector (or used to stop the
/// thread). As a sink it is what VFIO routes a vector to: the kernel signals it.
#[derive(Debug)]
pub(crate) struct VectorFd(OwnedFd);

impl VectorFd {
    fn new() -> io::Result<Arc<Self>> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Arc::new(Self(fd)))
    }

    /// Adds one to the counter (a saturated counter is readable anyway).
    fn signal(&self) {
        loop {
            match rustix::io::write(&self.0, &1u64.to_ne_bytes()) {
                Err(Errno::INTR) => {}
                Ok(_) | Err(_) => return,
            }
        }
    }

    /// Resets the counter; nothing to do when it is zero.
    fn drain(&self) {
        let mut buf = [0u8; 8];
        loop {
            match rustix::io::read(&self.0, &mut buf) {
                Err(Errno::INTR) => {}
                Ok(_) | Err(_) => return,
            }
        }
    }
}

impl InterruptSink for VectorFd {
    fn raise(&self) {
        self.signal();
    }

    fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.0.as_fd())
    }
}

/// Vectors, each with the fan-out sinks of the pool EQs on it.
pub(crate) type VectorFanOuts = Vec<(u32, Vec<Arc<dyn InterruptSink>>)>;

/// Vectors, each with the sink to route it to.
pub(crate) type VectorRoutes = Vec<(u32, Arc<dyn InterruptSink>)>;

/// One vector: its eventfd and the fan-out sinks of the pool EQs on it.
#[derive(Debug)]
struct Route {
    fd: Arc<VectorFd>,
    fan_outs: Vec<Arc<dyn InterruptSink>>,
}

#[derive(Debug)]
enum State {
    Idle,
    Running(JoinHandle<()>),
    Stopped,
}

/// The device's interrupt thread and the eventfds it watches.
#[derive(Debug)]
pub(crate) struct EqWaiter {
    /// Names the thread (`mlx4-eq <device>`, cut to 15 bytes by Linux).
    name: String,
    routes: Arc<Vec<Route>>,
    stop: Arc<VectorFd>,
    state: Mutex<State>,
}

impl EqWaiter {
    /// An eventfd for each of `vectors` (each with the fan-out sinks of its EQs), not yet
    /// watched; also returns each vector's eventfd, for the caller to route the vector to.
    ///
    /// # Errors
    /// An eventfd could not be made (out of file descriptors).
    pub(crate) fn new(device: &str, vectors: VectorFanOuts) -> io::Result<(Self, VectorRoutes)> {
        let mut routes = Vec::with_capacity(vectors.len());
        let mut fds: VectorRoutes = Vec::with_capacity(vectors.len());
        for (vector, fan_outs) in vectors {
            let fd = VectorFd::new()?;
            fds.push((vector, fd.clone()));
            routes.push(Route { fd, fan_outs });
        }
        let waiter = Self {
            name: format!("mlx4-eq {device}"),
            routes: Arc::new(routes),
            stop: VectorFd::new()?,
            state: Mutex::new(State::Idle),
        };
        Ok((waiter, fds))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the thread unless it runs or was stopped. A failure to start it is logged: the
    /// virtual queues are then found only by looking.
    pub(crate) fn start(&self) {
        let mut st = self.state();
        if !matches!(*st, State::Idle) {
            return;
        }
        let (routes, stop) = (self.routes.clone(), self.stop.clone());
        let spawned = std::thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || {
                if let Err(e) = run(&routes, &stop) {
                    tracing::error!(%e, "the EQ interrupt thread failed; events are only polled");
                }
            });
        match spawned {
            Ok(h) => *st = State::Running(h),
            Err(e) => {
                tracing::error!(%e, "the EQ interrupt thread could not start");
                *st = State::Stopped;
            }
        }
    }

    /// Stops the thread and waits for it to end; it never starts again.
    pub(crate) fn stop(&self) {
        let prev = std::mem::replace(&mut *self.state(), State::Stopped);
        if let State::Running(h) = prev {
            self.stop.signal();
            if h.thread().id() == std::thread::current().id() {
                // Closed from a raise on the thread itself: it sees the stop when it returns.
                return;
            }
            if h.join().is_err() {
                tracing::error!("the EQ interrupt thread panicked");
            }
        }
    }
}

impl Drop for EqWaiter {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread: sleeps until a vector's eventfd or the stop eventfd is readable.
fn run(routes: &[Route], stop: &VectorFd) -> io::Result<()> {
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    for (i, r) in routes.iter().enumerate() {
        epoll::add(
            &ep,
            &r.fd.0,
            epoll::EventData::new_u64(i as u64),
            epoll::EventFlags::IN,
        )?;
    }
    epoll::add(
        &ep,
        &stop.0,
        epoll::EventData::new_u64(STOP),
        epoll::EventFlags::IN,
    )?;
    let mut events: Vec<epoll::Event> = Vec::with_capacity(routes.len() + 1);
    loop {
        events.clear();
        match epoll::wait(&ep, rustix::buffer::spare_capacity(&mut events), None) {
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        for ev in &events {
            let data = ev.data;
            let Some(r) = usize::try_from(data.u64()).ok().and_then(|i| routes.get(i)) else {
                // The stop eventfd (nothing else is registered).
                return Ok(());
            };
            // Reset first: an interrupt after the reset makes the fd readable again, so a
            // raise is never lost between the reset and the fan-out.
            r.fd.drain();
            for s in &r.fan_outs {
                s.raise();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{Receiver, Sender, channel};
    use std::time::Duration;

    /// Says which fan-out was raised.
    #[derive(Debug)]
    struct Tell(u32, Mutex<Sender<u32>>);

    impl InterruptSink for Tell {
        fn raise(&self) {
            let _ = self.1.lock().unwrap().send(self.0);
        }
    }

    fn waiter() -> (EqWaiter, VectorRoutes, Receiver<u32>) {
        let (tx, rx) = channel();
        let tell = |n: u32| -> Arc<dyn InterruptSink> { Arc::new(Tell(n, Mutex::new(tx.clone()))) };
        let (w, fds) = EqWaiter::new(
            "unit",
            vec![(3, vec![tell(30), tell(31)]), (2, vec![tell(20)])],
        )
        .unwrap();
        (w, fds, rx)
    }

    /// A signal on a vector's eventfd (what the kernel does) raises the fan-outs of that
    /// vector only, once per wake-up; before the start it waits in the eventfd's counter.
    #[test]
    fn a_signalled_vector_raises_its_fan_outs() {
        let (w, fds, rx) = waiter();
        assert_eq!(fds.iter().map(|(v, _)| *v).collect::<Vec<_>>(), [3, 2]);
        assert!(fds.iter().all(|(_, s)| s.eventfd().is_some()));
        fds[1].1.raise();
        w.start();
        w.start();
        let long = Duration::from_secs(30);
        assert_eq!(rx.recv_timeout(long), Ok(20), "kept from before the start");
        fds[0].1.raise();
        let mut got = [
            rx.recv_timeout(long).unwrap(),
            rx.recv_timeout(long).unwrap(),
        ];
        got.sort_unstable();
        assert_eq!(got, [30, 31]);
        w.stop();
        assert!(matches!(*w.state(), State::Stopped));
        // Stopped (joined): a signal now raises nothing, and it does not start again.
        fds[0].1.raise();
        w.start();
        assert!(matches!(*w.state(), State::Stopped));
        assert!(rx.try_recv().is_err());
    }
}
