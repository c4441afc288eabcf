//! Event-mode firmware commands sleep until their command-completion EQE (type 0x0a) wakes
//! them: the driver over the model behind a BAR0 shim that can hold a posted command, so the
//! test decides when the HCA "completes" it.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use portverbs_hal::device::Device;
use portverbs_hal::dma::{DmaError, DmaMemory, HostMemory, MapHostError};
use portverbs_hal::mmio::{Mmio, MmioError};
use portverbs_hal::notify::InterruptSink;
use portverbs_hal::types::Gid;
use portverbs_mlx4::layout::hcr::{EVENT, GO, HCR_BASE, dword};
use portverbs_mlx4::{CommandMode, HostMapped, Mlx4Config, Mlx4Device, PciError, PciFunction};
use portverbs_mlx4_model::{Mlx4Model, ModelConfig, ModelFunction};
use portverbs_soft::Fabric;

const STATUS: usize = HCR_BASE + dword::STATUS;

/// BAR0 of the model, but an event-mode post is held (go stays set) while `hold` is on, until
/// [`Bar0Shim::release`] hands it to the model.
#[derive(Debug)]
struct Bar0Shim {
    inner: Arc<dyn Mmio>,
    hold: AtomicBool,
    held: Mutex<Option<u32>>,
}

impl Bar0Shim {
    /// Lets the model execute the held command (it writes the EQE and raises vector 0).
    fn release(&self) {
        self.hold.store(false, Ordering::SeqCst);
        let word = self.held.lock().unwrap().take().expect("a held command");
        self.inner.write32(STATUS, word).unwrap();
    }

    fn holding(&self) -> bool {
        self.held.lock().unwrap().is_some()
    }
}

impl Mmio for Bar0Shim {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn read32(&self, offset: usize) -> Result<u32, MmioError> {
        if offset == STATUS {
            if let Some(word) = *self.held.lock().unwrap() {
                return Ok(word);
            }
        }
        self.inner.read32(offset)
    }

    fn write32(&self, offset: usize, value: u32) -> Result<(), MmioError> {
        let event_post = value & GO != 0 && value & EVENT != 0;
        if offset == STATUS && event_post && self.hold.load(Ordering::SeqCst) {
            *self.held.lock().unwrap() = Some(value);
            return Ok(());
        }
        self.inner.write32(offset, value)
    }

    fn write64(&self, offset: usize, value: u64) -> Result<(), MmioError> {
        self.write32(offset, (value >> 32) as u32)?;
        self.write32(offset + 4, value as u32)
    }

    fn write_wc(&self, offset: usize, block: &[u8]) -> Result<(), MmioError> {
        self.inner.write_wc(offset, block)
    }
}

/// The model's function with [`Bar0Shim`] as BAR0.
#[derive(Debug)]
struct Shimmed {
    inner: Arc<ModelFunction>,
    bar0: Arc<Bar0Shim>,
}

impl PciFunction for Shimmed {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn ids(&self) -> (u16, u16) {
        self.inner.ids()
    }
    fn bar(&self, index: u8) -> Result<Arc<dyn Mmio>, PciError> {
        if index == 0 {
            return Ok(self.bar0.clone());
        }
        self.inner.bar(index)
    }
    fn config_read16(&self, offset: u16) -> Result<u16, PciError> {
        self.inner.config_read16(offset)
    }
    fn alloc_dma(&self, len: usize) -> Result<Arc<dyn HostMapped>, DmaError> {
        self.inner.alloc_dma(len)
    }
    fn map_host(&self, memory: HostMemory) -> Result<Arc<dyn DmaMemory>, MapHostError> {
        self.inner.map_host(memory)
    }
    fn num_vectors(&self) -> u32 {
        self.inner.num_vectors()
    }
    fn route_interrupt(&self, vector: u32, sink: Arc<dyn InterruptSink>) -> Result<(), PciError> {
        self.inner.route_interrupt(vector, sink)
    }
    fn reset_settle(&self) -> Duration {
        self.inner.reset_settle()
    }
}

fn open(fabric: &Fabric, timeout: Duration) -> (Mlx4Model, Arc<Bar0Shim>, Mlx4Device) {
    let (model, function) = Mlx4Model::attach(fabric, ModelConfig::default()).unwrap();
    let bar0 = Arc::new(Bar0Shim {
        inner: function.bar(0).unwrap(),
        hold: AtomicBool::new(false),
        held: Mutex::new(None),
    });
    let pci = Arc::new(Shimmed {
        inner: function,
        bar0: bar0.clone(),
    });
    let mut config = Mlx4Config::new(
        "mlx4_events",
        vec![vec![Gid::from_ip("10.9.0.1".parse().unwrap())]],
    );
    config.command_mode = CommandMode::Events;
    config.command_timeout = timeout;
    let dev = Mlx4Device::open(pci, config).unwrap();
    (model, bar0, dev)
}

#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn an_event_mode_command_sleeps_until_its_completion_eqe() {
    let fabric = Fabric::stepped(1);
    let (model, bar0, dev) = open(&fabric, Duration::from_secs(5));
    let interrupts = model.counts();
    bar0.hold.store(true, Ordering::SeqCst);

    let wakes = Arc::new(Wakes::default());
    let waker = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(dev.query_port(1));
    let mut polls = 0;
    let mut poll = |cx: &mut Context<'_>| {
        polls += 1;
        fut.as_mut().poll(cx)
    };

    assert!(poll(&mut cx).is_pending(), "posted, no EQE yet");
    assert!(bar0.holding(), "the command was posted in event mode");
    // No self-wake: the future does not spin while the HCA works.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "nobody woke the command");
    // A spurious poll finds nothing and sleeps again.
    assert!(poll(&mut cx).is_pending());
    assert_eq!(wakes.0.load(Ordering::SeqCst), 0);

    // The HCA completes: the EQE on the command EQ raises MSI-X vector 0.
    bar0.release();
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        1,
        "the completion EQE's interrupt woke the command once"
    );
    let attr = match poll(&mut cx) {
        Poll::Ready(r) => r.unwrap(),
        Poll::Pending => panic!("woken but not complete"),
    };
    assert_eq!(polls, 3);
    assert!(attr.gid_tbl_len > 0);
    let after = model.counts();
    assert!(
        after.interrupts > interrupts.interrupts,
        "the wake-up came through the interrupt"
    );
}

#[test]
fn a_blocked_event_mode_command_wakes_on_the_eqe_not_by_polling() {
    let fabric = Fabric::stepped(1);
    let (_model, bar0, dev) = open(&fabric, Duration::from_secs(5));
    bar0.hold.store(true, Ordering::SeqCst);
    let polls = Arc::new(AtomicU32::new(0));
    let counted = {
        let polls = polls.clone();
        let mut fut = Box::pin(dev.query_port(1));
        std::future::poll_fn(move |cx| {
            polls.fetch_add(1, Ordering::SeqCst);
            fut.as_mut().poll(cx)
        })
    };
    let releaser = std::thread::spawn({
        let bar0 = bar0.clone();
        move || {
            let limit = Instant::now() + Duration::from_secs(10);
            while !bar0.holding() && Instant::now() < limit {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(50));
            bar0.release();
        }
    });
    let started = Instant::now();
    let r = portverbs_hal::block_on(counted);
    releaser.join().unwrap();
    assert!(r.is_ok(), "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(50));
    // One poll to post, one after the wake-up (a spurious unpark may add one).
    let n = polls.load(Ordering::SeqCst);
    assert!(
        (2..=3).contains(&n),
        "{n} polls: the command slept while held"
    );
}

#[test]
fn an_event_mode_command_without_an_eqe_still_times_out() {
    let fabric = Fabric::stepped(1);
    let timeout = Duration::from_millis(100);
    let (_model, bar0, dev) = open(&fabric, timeout);
    bar0.hold.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let r = portverbs_hal::block_on(dev.query_port(1));
    let waited = started.elapsed();
    assert!(format!("{r:?}").contains("Timeout"), "{r:?}");
    assert!(waited >= timeout && waited < timeout * 50, "{waited:?}");
    // Let the device go: the held command completes late and is ignored.
    bar0.release();
}
