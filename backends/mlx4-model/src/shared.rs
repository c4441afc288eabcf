//! State shared, without the fabric lock, by the model's handles, its BARs and its device side:
//! the IOVA table, the injected faults, the interrupt routes and the counters.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// [`Shared::corrupt_cqe`]: QPN 0xffffff and an opcode that exists in neither direction.
pub(crate) const CORRUPT_OPCODE: u8 = 1;
/// [`Shared::corrupt_cqe`]: a well-formed CQE of QPN 0xffffff (a QP the driver never made).
pub(crate) const CORRUPT_QPN: u8 = 2;
/// [`Shared::corrupt_cqe`]: a well-formed CQE of the right QP whose WQE counter names no
/// outstanding work request (half the 16-bit counter space away).
pub(crate) const CORRUPT_INDEX: u8 = 3;
/// Marks [`Shared::fail_command`] as set.
pub(crate) const FAIL_ARMED: u32 = 1 << 31;

use portverbs_hal::notify::InterruptSink;

use crate::iova::IovaTable;

/// Counters of things that happened (never reset).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) commands: AtomicU64,
    pub(crate) send_doorbells: AtomicU64,
    pub(crate) blueflame_writes: AtomicU64,
    pub(crate) ignored_doorbells: AtomicU64,
    pub(crate) interrupts: AtomicU64,
    pub(crate) lost_events: AtomicU64,
    pub(crate) eq_overflows: AtomicU64,
}

impl Stats {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) iova: Arc<IovaTable>,
    /// Surprise removal: BAR reads fail, writes vanish, nothing more reaches DMA memory.
    pub(crate) removed: AtomicBool,
    /// Commands latch but never complete.
    pub(crate) cmd_timeout: AtomicBool,
    /// The next CQE written is garbage ([`CORRUPT_OPCODE`]), names no QP ([`CORRUPT_QPN`])
    /// or no outstanding WQE ([`CORRUPT_INDEX`]); 0 for none of these.
    pub(crate) corrupt_cqe: AtomicU8,
    /// The next command with this opcode fails with this status without running:
    /// `FAIL_ARMED | opcode << 8 | status`, 0 for none.
    pub(crate) fail_command: AtomicU32,
    /// Slow firmware: event-mode command completions wait in `held` (token, status,
    /// out_param) until released.
    pub(crate) hold_events: AtomicBool,
    pub(crate) held: Mutex<Vec<(u16, u8, u64)>>,
    pub(crate) stats: Stats,
    /// MSI-X vector → sink.
    irqs: Mutex<Vec<Option<Arc<dyn InterruptSink>>>>,
}

impl Shared {
    pub(crate) fn new(vectors: u32) -> Self {
        Self {
            iova: Arc::new(IovaTable::default()),
            removed: AtomicBool::new(false),
            cmd_timeout: AtomicBool::new(false),
            corrupt_cqe: AtomicU8::new(0),
            fail_command: AtomicU32::new(0),
            hold_events: AtomicBool::new(false),
            held: Mutex::new(Vec::new()),
            stats: Stats::default(),
            irqs: Mutex::new(vec![None; vectors as usize]),
        }
    }

    /// Keeps an event-mode command's completion for later when slow firmware is injected;
    /// false when it is to be posted now.
    pub(crate) fn hold_completion(&self, token: u16, status: u8, out_param: u64) -> bool {
        if !self.hold_events.load(Ordering::Acquire) {
            return false;
        }
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((token, status, out_param));
        true
    }

    /// The injected status for a command with `opcode`, consumed; `None` when none is set for
    /// it.
    pub(crate) fn take_failure(&self, opcode: u16) -> Option<u8> {
        let armed = FAIL_ARMED | (u32::from(opcode) << 8);
        let set = self.fail_command.load(Ordering::Acquire);
        if set & !0xff != armed {
            return None;
        }
        self.fail_command
            .compare_exchange(set, 0, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|v| v as u8)
    }

    pub(crate) fn removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Routes `vector`; false when there is no such vector.
    pub(crate) fn route(&self, vector: u32, sink: Arc<dyn InterruptSink>) -> bool {
        let mut irqs = self.irqs.lock().unwrap_or_else(|e| e.into_inner());
        match irqs.get_mut(vector as usize) {
            Some(slot) => {
                *slot = Some(sink);
                true
            }
            None => false,
        }
    }

    /// Raises MSI-X `vector` (nothing happens when it is not routed).
    pub(crate) fn raise(&self, vector: u32) {
        let sink = {
            let irqs = self.irqs.lock().unwrap_or_else(|e| e.into_inner());
            irqs.get(vector as usize).cloned().flatten()
        };
        if let Some(sink) = sink {
            Stats::bump(&self.stats.interrupts);
            sink.raise();
        }
    }
}
