//! Translation tables: MTT ranges describing DMA regions page by page (Linux `mlx4/mr.c`), written
//! with WRITE_MTT. Every queue buffer and every memory region gets one range; `mtt_base` in
//! contexts is the first entry's index × 8.

use std::sync::Mutex;

use portverbs_hal::dma::DmaMemory;
use portverbs_hal::error::CommandError;
use zerocopy::IntoBytes;
use zerocopy::byteorder::big_endian::U64;

use crate::alloc::Ranges;
use crate::cmd::{Cmd, CommandInterface};
use crate::layout::mailbox::{MTT_PRESENT, WRITE_MTT_MAX, WriteMttHeader};
use crate::layout::opcode;

/// Bytes per translated page (log_page_size 0).
pub(crate) const PAGE: u64 = 4096;

/// A range of MTT entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MttRange {
    pub(crate) first: u64,
    pub(crate) count: u64,
}

/// The MTT entry allocator.
#[derive(Debug)]
pub(crate) struct Mtts(Mutex<Ranges>);

impl Mtts {
    pub(crate) fn new(reserved: u64, total: u64) -> Self {
        Self(Mutex::new(Ranges::new(reserved.max(8), total)))
    }

    /// Writes entries for the pages of `mem` covering `[offset, offset + len)` (bus addresses)
    /// and returns the range. `page0` is the page containing `offset`.
    pub(crate) async fn write(
        &self,
        hcr: &CommandInterface,
        mem: &dyn DmaMemory,
        offset: usize,
        len: usize,
    ) -> Result<MttRange, CommandError> {
        let start = (mem.device_addr() + offset as u64) & !(PAGE - 1);
        let end = (mem.device_addr() + (offset + len.max(1)) as u64).next_multiple_of(PAGE);
        let count = (end - start) / PAGE;
        let first = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alloc(count, 8)
            .ok_or(CommandError::ResourceExhausted {
                resource: "MTT entries",
            })?;
        let range = MttRange { first, count };
        let mut done = 0u64;
        let mut inbox = Vec::with_capacity(16 + WRITE_MTT_MAX * 8);
        while done < count {
            let n = (count - done).min(WRITE_MTT_MAX as u64);
            inbox.clear();
            let header = WriteMttHeader {
                start: (first + done).into(),
                ..Default::default()
            };
            inbox.extend_from_slice(header.as_bytes());
            for i in 0..n {
                let e = U64::new((start + (done + i) * PAGE) | MTT_PRESENT);
                inbox.extend_from_slice(e.as_bytes());
            }
            let r = hcr
                .exec_in(Cmd::new(opcode::WRITE_MTT).in_mod(n as u32), &inbox)
                .await;
            if let Err(e) = r {
                self.free(range);
                return Err(e);
            }
            done += n;
        }
        Ok(range)
    }

    pub(crate) fn free(&self, r: MttRange) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free(r.first, r.count);
    }
}
