//! Which way the driver rings the emulated HCA's doorbells is chosen at open: through the
//! model's doorbell calls when its function offers them, through stores to BAR2 offsets when a
//! function does not. Seen at a BAR2 that counts the stores it passes on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use portverbs_hal::block_on;
use portverbs_hal::device::{CqParams, Device, EqKind, EqParams};
use portverbs_hal::dma::{DmaError, DmaMemory, HostMemory, MapHostError};
use portverbs_hal::mmio::{Mmio, MmioError};
use portverbs_hal::notify::{InterruptSink, NullSink};
use portverbs_hal::queue::CompletionQueue;
use portverbs_hal::types::Gid;
use portverbs_mlx4::layout::uar::{CQ_DOORBELL, UAR_PAGE};
use portverbs_mlx4::pci::UarDoorbells;
use portverbs_mlx4::{HostMapped, Mlx4Config, Mlx4Device, PciError, PciFunction};
use portverbs_mlx4_model::{Mlx4Model, ModelConfig, ModelFunction};
use portverbs_soft::Fabric;

/// The model's BAR2, counting the stores the driver makes to it (and the CQ doorbells among
/// them).
#[derive(Debug)]
struct CountingBar2 {
    inner: Arc<dyn Mmio>,
    stores: AtomicUsize,
    cq_arms: AtomicUsize,
}

impl Mmio for CountingBar2 {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn read32(&self, offset: usize) -> Result<u32, MmioError> {
        self.inner.read32(offset)
    }
    fn write32(&self, offset: usize, value: u32) -> Result<(), MmioError> {
        self.stores.fetch_add(1, Ordering::SeqCst);
        self.inner.write32(offset, value)
    }
    fn write64(&self, offset: usize, value: u64) -> Result<(), MmioError> {
        self.stores.fetch_add(1, Ordering::SeqCst);
        if offset % UAR_PAGE == CQ_DOORBELL {
            self.cq_arms.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.write64(offset, value)
    }
    fn write_wc(&self, offset: usize, block: &[u8]) -> Result<(), MmioError> {
        self.stores.fetch_add(1, Ordering::SeqCst);
        self.inner.write_wc(offset, block)
    }
}

/// The model's function with [`CountingBar2`] as BAR2, offering the model's doorbell calls or
/// not.
#[derive(Debug)]
struct Func {
    inner: Arc<ModelFunction>,
    bar2: Arc<CountingBar2>,
    offer_calls: bool,
}

impl PciFunction for Func {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn ids(&self) -> (u16, u16) {
        self.inner.ids()
    }
    fn bar(&self, index: u8) -> Result<Arc<dyn Mmio>, PciError> {
        if index == 2 {
            return Ok(self.bar2.clone());
        }
        self.inner.bar(index)
    }
    fn doorbells(&self) -> Option<Arc<dyn UarDoorbells>> {
        self.offer_calls.then(|| self.inner.doorbells()).flatten()
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

fn open(fabric: &Fabric, offer_calls: bool) -> (Mlx4Model, Arc<CountingBar2>, Mlx4Device) {
    let (model, function) = Mlx4Model::attach(fabric, ModelConfig::default()).unwrap();
    let bar2 = Arc::new(CountingBar2 {
        inner: function.bar(2).unwrap(),
        stores: AtomicUsize::new(0),
        cq_arms: AtomicUsize::new(0),
    });
    let pci = Arc::new(Func {
        inner: function,
        bar2: bar2.clone(),
        offer_calls,
    });
    let config = Mlx4Config::new(
        "mlx4_doorbell_calls",
        vec![vec![Gid::from_ip("10.9.1.1".parse().unwrap())]],
    );
    let dev = Mlx4Device::open(pci, config).unwrap();
    (model, bar2, dev)
}

#[test]
fn doorbells_are_calls_when_offered_and_bar2_stores_otherwise() {
    for offer_calls in [true, false] {
        let fabric = Fabric::stepped(1);
        let (model, bar2, dev) = open(&fabric, offer_calls);
        // Opening armed the device's EQs; now an EQ, a CQ on it, and both armed again.
        let params = EqParams {
            entries: 64,
            kind: EqKind::Completion { vector: 0 },
        };
        let mut eq = block_on(dev.create_eq(params, Arc::new(NullSink))).unwrap();
        let mut cq = block_on(dev.create_cq(CqParams {
            entries: 16,
            eqn: eq.eqn(),
        }))
        .unwrap();
        cq.arm(false);
        eq.arm();
        let (stores, cq_arms) = (
            bar2.stores.load(Ordering::SeqCst),
            bar2.cq_arms.load(Ordering::SeqCst),
        );
        if offer_calls {
            assert_eq!((stores, cq_arms), (0, 0), "every doorbell was a call");
        } else {
            assert_eq!(cq_arms, 1, "the CQ doorbell as one 64-bit store");
            assert!(stores > 2, "the EQ doorbells as stores too: {stores}");
        }
        assert_eq!(model.counts().ignored_doorbells, 0);
    }
}
