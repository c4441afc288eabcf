//! The firmware command interface through the HCR (Linux `mlx4/cmd.c`), in polling and event mode.
//!
//! Posting: wait until the HCR is free (go clear and the toggle reflected), write dwords 0..5,
//! a write barrier, then dword 6 with go, the toggle and (event mode) the e bit; flip the toggle.
//! Completion: in polling mode the HCA clears go and leaves the status in bits 31:24 and any
//! immediate output in out_param; in event mode it also writes a command-completion EQE carrying
//! the command's token, status and out_param into the driver's command EQ. Every wait is bounded
//! by the command timeout; a device that never answers produces [`CommandError::Timeout`], a
//! removed one [`CommandError::Removed`].
//!
//! Commands are `async`. Taking the HCR and polling mode (bring-up, before the command EQ
//! exists) poll the HCR and yield between looks. In event mode a posted command sleeps: its
//! future registers its waker under its token (`cmd_wait`) and returns `Pending` until the
//! command EQ's interrupt (MSI-X vector 0, `CmdEqSink`) or the task that drained its EQE wakes
//! it, or its deadline passes; it then takes the status and out_param from the EQE. A function
//! that never calls the sink's `raise` (VFIO: interrupts reach eventfds only, and the command EQ's
//! sink has none) gets the old behaviour: the command looks at the EQ and yields.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use portverbs_hal::barrier;
use portverbs_hal::dma::DmaMemory;
use portverbs_hal::error::CommandError;
use portverbs_hal::event::DeviceEvent;
use portverbs_hal::mmio::{Mmio, MmioError};
use portverbs_hal::queue::EventQueue;

use crate::cmd_wait::{CmdEqSink, Waiters};
use crate::layout::hcr::{HCR_BASE, POLL_TOKEN, StatusWord, dword};
use crate::layout::mailbox::MAILBOX_SIZE;
use crate::layout::opcode;
use crate::layout::status;
use crate::pci::PciFunction;

/// How commands report completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandMode {
    /// Poll the go bit.
    Polling,
    /// Wait for the command-completion EQE with the command's token.
    Events,
}

/// One command.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cmd {
    pub(crate) opcode: u16,
    pub(crate) opmod: u8,
    pub(crate) in_param: u64,
    pub(crate) in_mod: u32,
    pub(crate) out_param: u64,
}

impl Cmd {
    pub(crate) fn new(opcode: u16) -> Self {
        Self {
            opcode,
            ..Self::default()
        }
    }

    pub(crate) fn in_mod(mut self, v: u32) -> Self {
        self.in_mod = v;
        self
    }

    pub(crate) fn in_param(mut self, v: u64) -> Self {
        self.in_param = v;
        self
    }

    pub(crate) fn opmod(mut self, v: u8) -> Self {
        self.opmod = v;
        self
    }
}

/// A 4 KiB mailbox in DMA memory.
#[derive(Debug, Clone)]
pub(crate) struct Mailbox(pub(crate) Arc<dyn DmaMemory>);

impl Mailbox {
    pub(crate) fn addr(&self) -> u64 {
        self.0.device_addr()
    }

    /// Copies `bytes` to the start of the mailbox (the rest zeroed).
    pub(crate) fn fill(&self, bytes: &[u8]) -> Result<(), CommandError> {
        self.0.fill(0, MAILBOX_SIZE, 0)?;
        self.0.write(0, bytes)?;
        Ok(())
    }

    /// Copies the first `out.len()` bytes out.
    pub(crate) fn read(&self, out: &mut [u8]) -> Result<(), CommandError> {
        self.0.read(0, out)?;
        Ok(())
    }
}

/// The command EQ's bookkeeping in event mode.
#[derive(Debug, Default)]
struct EventState {
    eq: Option<Box<dyn EventQueue>>,
    done: HashMap<u16, (u8, u64)>,
    next_token: u16,
}

/// The HCR and its state.
#[derive(Debug)]
pub(crate) struct CommandInterface {
    bar0: Arc<dyn Mmio>,
    pci: Arc<dyn PciFunction>,
    /// The toggle value the next command is posted with.
    toggle: Mutex<bool>,
    /// One command owns the HCR registers between "free" and "posted" (and, in polling mode,
    /// until it completes).
    busy: AtomicBool,
    events: Mutex<EventState>,
    mode: Mutex<CommandMode>,
    pub(crate) timeout: Duration,
    mailboxes: Mutex<Vec<Mailbox>>,
    /// Event mode: the commands waiting for their completion EQE.
    waiters: Arc<Waiters>,
    /// The function raises the command EQ's sink (so an event-mode command may sleep).
    raises: bool,
}

/// Yields once: wakes itself and returns `Pending` (the caller re-polls).
pub(crate) struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        std::thread::yield_now();
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Yields to the executor once (the task is woken again at once); for the short bounded waits
/// that nothing signals.
pub(crate) fn yield_now() -> YieldNow {
    YieldNow(false)
}

/// Forgets an event-mode command's waker when its future ends or is dropped half-way.
struct WaitGuard<'a>(&'a Waiters, u16);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.0.forget(self.1);
    }
}

/// Releases the HCR on drop (also when a command future is dropped half-way).
struct HcrGuard<'a>(&'a AtomicBool);

impl Drop for HcrGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

pub(crate) fn mmio_error(e: MmioError) -> CommandError {
    match e {
        MmioError::Removed => CommandError::Removed,
        other => CommandError::InvalidArgument {
            what: format!("register access failed: {other}"),
        },
    }
}

impl CommandInterface {
    pub(crate) fn new(pci: Arc<dyn PciFunction>, bar0: Arc<dyn Mmio>, timeout: Duration) -> Self {
        Self {
            bar0,
            // The HCA's t bit reads 0 after reset; the first command goes out with t = 1.
            toggle: Mutex::new(true),
            busy: AtomicBool::new(false),
            events: Mutex::new(EventState::default()),
            mode: Mutex::new(CommandMode::Polling),
            timeout,
            mailboxes: Mutex::new(Vec::new()),
            waiters: Waiters::new(),
            raises: pci.raises_sinks(),
            pci,
        }
    }

    /// The interrupt sink of the command EQ (MSI-X vector 0): a raise wakes the event-mode
    /// commands waiting for their completion EQE.
    pub(crate) fn sink(&self) -> Arc<CmdEqSink> {
        Arc::new(CmdEqSink(self.waiters.clone()))
    }

    pub(crate) fn mode(&self) -> CommandMode {
        *self.mode.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Switches to event mode with `eq` as the command EQ (MAP_EQ'd for type 0x0a).
    pub(crate) fn use_events(&self, eq: Box<dyn EventQueue>) {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).eq = Some(eq);
        *self.mode.lock().unwrap_or_else(|e| e.into_inner()) = CommandMode::Events;
    }

    /// Back to polling; returns the command EQ.
    pub(crate) fn use_polling(&self) -> Option<Box<dyn EventQueue>> {
        *self.mode.lock().unwrap_or_else(|e| e.into_inner()) = CommandMode::Polling;
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .eq
            .take()
    }

    /// A mailbox from the pool.
    pub(crate) fn mailbox(&self) -> Result<Mailbox, CommandError> {
        if let Some(m) = self
            .mailboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
        {
            return Ok(m);
        }
        Ok(Mailbox(self.pci.alloc_dma(MAILBOX_SIZE)?))
    }

    /// Returns a mailbox to the pool.
    pub(crate) fn give_back(&self, m: Mailbox) {
        self.mailboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(m);
    }

    fn read_status(&self) -> Result<StatusWord, CommandError> {
        self.bar0
            .read32(HCR_BASE + dword::STATUS)
            .map(StatusWord)
            .map_err(mmio_error)
    }

    /// True while the HCA has not finished the last command (Linux `cmd_pending`).
    fn pending(&self, toggle: bool) -> Result<bool, CommandError> {
        let w = self.read_status()?;
        // The t bit reads back as the value last written; the next toggle equal to it means
        // the last write has not been reflected yet.
        Ok(w.go() || w.toggle() == toggle)
    }

    /// Runs a command; returns the immediate output (out_param).
    pub(crate) async fn exec(&self, cmd: Cmd) -> Result<u64, CommandError> {
        let deadline = Instant::now() + self.timeout;
        let timeout = || CommandError::Timeout {
            opcode: cmd.opcode,
            millis: self.timeout.as_millis() as u64,
        };
        // Take the HCR.
        while self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            if Instant::now() >= deadline {
                return Err(timeout());
            }
            yield_now().await;
        }
        let mut guard = Some(HcrGuard(&self.busy));
        let mode = self.mode();
        let toggle = *self.toggle.lock().unwrap_or_else(|e| e.into_inner());
        while self.pending(toggle)? {
            if Instant::now() >= deadline {
                return Err(timeout());
            }
            yield_now().await;
        }
        let token = match mode {
            CommandMode::Polling => POLL_TOKEN,
            CommandMode::Events => {
                let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
                ev.next_token = ev.next_token.wrapping_add(1) % POLL_TOKEN;
                ev.next_token
            }
        };
        let w = |off: usize, v: u32| self.bar0.write32(HCR_BASE + off, v).map_err(mmio_error);
        w(dword::IN_PARAM_HI, (cmd.in_param >> 32) as u32)?;
        w(dword::IN_PARAM_LO, cmd.in_param as u32)?;
        w(dword::IN_MODIFIER, cmd.in_mod)?;
        w(dword::OUT_PARAM_HI, (cmd.out_param >> 32) as u32)?;
        w(dword::OUT_PARAM_LO, cmd.out_param as u32)?;
        w(dword::TOKEN, u32::from(token) << 16)?;
        barrier::to_device();
        let event = mode == CommandMode::Events;
        w(
            dword::STATUS,
            StatusWord::post(cmd.opcode, cmd.opmod, toggle, event).0,
        )?;
        *self.toggle.lock().unwrap_or_else(|e| e.into_inner()) = !toggle;
        tracing::trace!(
            op = opcode::name(cmd.opcode),
            in_mod = cmd.in_mod,
            "command posted"
        );

        let (status, out) = match mode {
            CommandMode::Polling => loop {
                let s = self.read_status()?;
                if !s.go() {
                    barrier::from_device();
                    let hi = self
                        .bar0
                        .read32(HCR_BASE + dword::OUT_PARAM_HI)
                        .map_err(mmio_error)?;
                    let lo = self
                        .bar0
                        .read32(HCR_BASE + dword::OUT_PARAM_LO)
                        .map_err(mmio_error)?;
                    break (s.status(), (u64::from(hi) << 32) | u64::from(lo));
                }
                if Instant::now() >= deadline {
                    return Err(timeout());
                }
                yield_now().await;
            },
            CommandMode::Events => {
                // Another command may be posted as soon as go clears.
                drop(guard.take());
                let _forget = WaitGuard(&self.waiters, token);
                poll_fn(|cx| {
                    // Register first, then look: an EQE written after the look raises the
                    // sink, which wakes the waker registered here.
                    let sleeps = self.raises && self.waiters.register(token, cx.waker(), deadline);
                    match self.take_event(token) {
                        Ok(Some(done)) => return Poll::Ready(Ok(done)),
                        Err(e) => return Poll::Ready(Err(e)),
                        Ok(None) => {}
                    }
                    if Instant::now() >= deadline {
                        return Poll::Ready(Err(timeout()));
                    }
                    if !sleeps {
                        // Nobody will wake us: look again after a yield.
                        std::thread::yield_now();
                        cx.waker().wake_by_ref();
                    }
                    Poll::Pending
                })
                .await?
            }
        };
        drop(guard);
        if status != 0 {
            tracing::debug!(op = opcode::name(cmd.opcode), status, "command failed");
            return Err(status::to_error(cmd.opcode, status));
        }
        Ok(out)
    }

    /// Drains the command EQ and returns the completion of `token` if it arrived; wakes the
    /// commands whose completions it drained.
    fn take_event(&self, token: u16) -> Result<Option<(u8, u64)>, CommandError> {
        let mut found = Vec::new();
        let r = self.drain_events(token, &mut found);
        for t in found.into_iter().filter(|&t| t != token) {
            self.waiters.wake(t);
        }
        r
    }

    /// [`take_event`](Self::take_event) under the lock; the other commands' tokens it drained
    /// go to `found`.
    fn drain_events(
        &self,
        token: u16,
        found: &mut Vec<u16>,
    ) -> Result<Option<(u8, u64)>, CommandError> {
        let mut ev = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let EventState { eq, done, .. } = &mut *ev;
        if let Some(eq) = eq.as_mut() {
            let mut any = false;
            loop {
                match eq.poll_one() {
                    Ok(Some(DeviceEvent::CommandDone {
                        token,
                        status,
                        out_param,
                    })) => {
                        done.insert(token, (status, out_param));
                        found.push(token);
                        any = true;
                    }
                    Ok(Some(DeviceEvent::DeviceFatal)) => return Err(CommandError::DeviceFatal),
                    Ok(Some(other)) => {
                        tracing::warn!(?other, "unexpected event on the command EQ");
                        any = true;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(%e, "malformed EQE on the command EQ");
                        any = true;
                    }
                }
            }
            if any {
                eq.arm();
            }
        }
        Ok(done.remove(&token))
    }

    /// Runs a command with an input mailbox holding `inbox`.
    pub(crate) async fn exec_in(&self, mut cmd: Cmd, inbox: &[u8]) -> Result<u64, CommandError> {
        let m = self.mailbox()?;
        m.fill(inbox)?;
        cmd.in_param = m.addr();
        let r = self.exec(cmd).await;
        self.give_back(m);
        r
    }

    /// Runs a command with an output mailbox; copies `out.len()` bytes of it into `out`.
    pub(crate) async fn exec_out(&self, mut cmd: Cmd, out: &mut [u8]) -> Result<(), CommandError> {
        let m = self.mailbox()?;
        m.fill(&[])?;
        cmd.out_param = m.addr();
        let r = self.exec(cmd).await;
        if r.is_ok() {
            m.read(out)?;
        }
        self.give_back(m);
        r.map(|_| ())
    }
}

impl Drop for CommandInterface {
    fn drop(&mut self) {
        self.waiters.stop();
    }
}
