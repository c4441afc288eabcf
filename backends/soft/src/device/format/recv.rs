//! Receive WQEs: the slot stride, the host-side encoder and the device-side decoder.

use portverbs_hal::error::WqeError;
use portverbs_hal::wr::Sge;
use zerocopy::IntoBytes;

use super::{RECV_HEADER, RecvHeader, SGE_SIZE, get_sge, put_sge};
use crate::engine::{RecvWqe, WqeFault};

/// Slot stride of a receive queue.
pub fn recv_stride(max_sge: u32) -> usize {
    (RECV_HEADER + max_sge.max(1) as usize * SGE_SIZE).next_power_of_two()
}

/// Encoder of receive WQEs.
#[derive(Debug, Clone, Copy)]
pub struct RecvFormat {
    /// SGE capacity.
    pub max_sge: u32,
}

impl RecvFormat {
    /// Encodes a receive scatter list into `out` and returns the number of bytes used.
    ///
    /// # Errors
    /// Too many entries for the slot.
    pub fn encode_recv(&self, sges: &[Sge], out: &mut [u8]) -> Result<usize, WqeError> {
        let end = RECV_HEADER + sges.len() * SGE_SIZE;
        if sges.len() > self.max_sge as usize || end > out.len() {
            return Err(WqeError::TooManySges {
                given: sges.len(),
                max: self.max_sge,
            });
        }
        let h = RecvHeader {
            num_sge: sges.len() as u8,
            ..RecvHeader::default()
        };
        out[..RECV_HEADER].copy_from_slice(h.as_bytes());
        for (i, sge) in sges.iter().enumerate() {
            let at = RECV_HEADER + i * SGE_SIZE;
            put_sge(&mut out[at..at + SGE_SIZE], sge);
        }
        Ok(end)
    }
}

/// Device side: decodes a receive WQE slot.
///
/// # Errors
/// An SGE count beyond the slot.
pub fn decode_recv(slot: &[u8], out: &mut RecvWqe) -> Result<(), WqeFault> {
    let n = usize::from(*slot.first().ok_or(WqeFault {
        reason: "empty receive slot",
    })?);
    out.sges.clear();
    for i in 0..n {
        let at = RECV_HEADER + i * SGE_SIZE;
        let sge = slot
            .get(at..at + SGE_SIZE)
            .and_then(get_sge)
            .ok_or(WqeFault {
                reason: "receive scatter list beyond the slot",
            })?;
        out.sges.push(sge);
    }
    Ok(())
}
