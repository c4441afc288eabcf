//! Memory regions: registration, re-registration, deregistration, and the IBTA access rules.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use portverbs_hal::device::{Device, MrKeys, MrParams, MrRereg};
use portverbs_hal::dma::{HostMemory, MapHostError};
use portverbs_hal::types::AccessFlags;
use portverbs_hal::wr::Sge;
use portverbs_hal::{BlockingDevice, CommandError, block_on};

use crate::buffer::Buffer;
use crate::context::lock;
use crate::error::{MrError, Refused};
use crate::pd::Pd;

/// Checks the access-flag rules of IBA 10.6.3.1 for a memory region.
pub(crate) fn check_mr_access(access: AccessFlags) -> Result<(), MrError> {
    let needs_local_write =
        access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
    if needs_local_write && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(MrError::RemoteWithoutLocalWrite { access });
    }
    if access.contains(AccessFlags::ZERO_BASED) {
        return Err(MrError::InvalidAccess { access });
    }
    Ok(())
}

fn check_range(buffer: &Buffer, range: &Range<usize>) -> Result<(), MrError> {
    if range.start > range.end || range.end > buffer.len() {
        return Err(MrError::OutOfRange {
            offset: range.start,
            len: range.end.saturating_sub(range.start),
            buffer_len: buffer.len(),
        });
    }
    Ok(())
}

#[derive(Debug)]
struct MrState {
    keys: MrKeys,
    access: AccessFlags,
    buffer: Buffer,
    range: Range<usize>,
}

pub(crate) struct MrInner<D: Device> {
    pd: Mutex<Pd<D>>,
    state: Mutex<MrState>,
    handle: u32,
}

/// A registered memory region (`struct ibv_mr`). Cheap to clone.
pub struct Mr<D: Device> {
    inner: Arc<MrInner<D>>,
}

impl<D: Device> Clone for Mr<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for Mr<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = lock(&self.inner.state);
        f.debug_struct("Mr")
            .field("lkey", &format_args!("{:#x}", s.keys.lkey))
            .field("addr", &format_args!("{:#x}", s.keys.addr))
            .field("len", &s.range.len())
            .field("access", &s.access)
            .finish()
    }
}

/// A change to a registration (`ibv_rereg_mr`); `None` keeps the current value.
#[derive(Debug)]
pub struct Rereg<'a, D: Device> {
    /// Move the MR to another PD.
    pub pd: Option<&'a Pd<D>>,
    /// Point it at other memory.
    pub memory: Option<(&'a Buffer, Range<usize>)>,
    /// Change its rights.
    pub access: Option<AccessFlags>,
}

impl<D: Device> Default for Rereg<'_, D> {
    fn default() -> Self {
        Self {
            pd: None,
            memory: None,
            access: None,
        }
    }
}

impl<D: Device> Pd<D> {
    /// Registers `range` of `buffer` (`ibv_reg_mr`).
    ///
    /// # Errors
    /// Access-flag rules (remote write/atomic need local write), a range outside the buffer, a
    /// buffer of another device, or the device refused.
    pub async fn reg_mr(
        &self,
        buffer: &Buffer,
        range: Range<usize>,
        access: AccessFlags,
    ) -> Result<Mr<D>, MrError> {
        check_mr_access(access)?;
        check_range(buffer, &range)?;
        let ctx = &self.inner.ctx;
        if buffer.owner != Arc::as_ptr(ctx) as *const () as usize {
            return Err(MrError::ForeignObject { what: "buffer" });
        }
        let keys = ctx
            .device()
            .register_mr(MrParams {
                pd: self.pdn(),
                region: buffer.mem.clone(),
                offset: range.start,
                length: range.len(),
                access,
            })
            .await?;
        ctx.counts.mrs.fetch_add(1, Ordering::Relaxed);
        Ok(Mr {
            inner: Arc::new(MrInner {
                pd: Mutex::new(self.clone()),
                handle: keys.handle,
                state: Mutex::new(MrState {
                    keys,
                    access,
                    buffer: buffer.clone(),
                    range,
                }),
            }),
        })
    }

    /// Blocking form of [`Pd::reg_mr`].
    ///
    /// # Errors
    /// As [`Pd::reg_mr`].
    pub fn reg_mr_blocking(
        &self,
        buffer: &Buffer,
        range: Range<usize>,
        access: AccessFlags,
    ) -> Result<Mr<D>, MrError> {
        block_on(self.reg_mr(buffer, range, access))
    }

    /// Registers memory the application owns, as `ibv_reg_mr` does: the device maps it (through
    /// the IOMMU on VFIO) and the MR covers all of it. While it is registered the memory is
    /// reached only through the MR's [`Buffer`] ([`Mr::buffer`], copy in and out): the device may
    /// write it at any moment. [`Mr::into_host`] deregisters it and gives it back.
    ///
    /// Safe with memory the value owns (`HostMemory::from(vec)`, or [`Pd::reg_vec`]); memory
    /// given by address and length needs `unsafe` [`HostMemory::from_raw_parts`], whose contract
    /// says when the application may touch it.
    ///
    /// ```no_run
    /// # fn demo<D: portverbs_hal::Device>(pd: portverbs_verbs::Pd<D>) -> Result<(), Box<dyn std::error::Error>> {
    /// use portverbs_verbs::AccessFlags;
    /// let mr = pd.reg_vec_blocking(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)?;
    /// let sge = mr.sge(0, 4096)?; // post it in a receive …
    /// # let _ = sge;
    /// let data: Vec<u8> = mr.into_vec()?; // … and have the memory back once it is done
    /// # let _ = data; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Pd::reg_mr`], and a mapping the device refused; the memory comes back in the
    /// error.
    pub async fn reg_host(
        &self,
        memory: HostMemory,
        access: AccessFlags,
    ) -> Result<Mr<D>, Refused<HostMemory, MrError>> {
        if let Err(e) = check_mr_access(access) {
            return Err(Refused::new(e, memory));
        }
        let ctx = &self.inner.ctx;
        let mem = match ctx.device().map_host(memory) {
            Ok(mem) => mem,
            Err(MapHostError { error, memory }) => {
                let e = MrError::Device(CommandError::Dma(error));
                return Err(Refused::new(e, memory));
            }
        };
        let len = mem.len();
        let buffer = Buffer::new(mem, Arc::as_ptr(ctx) as *const () as usize);
        match self.reg_mr(&buffer, 0..len, access).await {
            Ok(mr) => Ok(mr),
            Err(e) => Err(Refused::new(e, unmap(buffer))),
        }
    }

    /// Blocking form of [`Pd::reg_host`].
    ///
    /// # Errors
    /// As [`Pd::reg_host`].
    pub fn reg_host_blocking(
        &self,
        memory: HostMemory,
        access: AccessFlags,
    ) -> Result<Mr<D>, Refused<HostMemory, MrError>> {
        block_on(self.reg_host(memory, access))
    }

    /// [`Pd::reg_host`] of a vector the MR takes over; [`Mr::into_vec`] gives it back.
    ///
    /// # Errors
    /// As [`Pd::reg_host`], with the vector back in the error.
    pub async fn reg_vec(
        &self,
        memory: Vec<u8>,
        access: AccessFlags,
    ) -> Result<Mr<D>, Refused<Vec<u8>, MrError>> {
        self.reg_host(HostMemory::from(memory), access)
            .await
            .map_err(|r| {
                let (e, m) = r.into_parts();
                Refused::new(e, m.into_vec().unwrap_or_default())
            })
    }

    /// Blocking form of [`Pd::reg_vec`].
    ///
    /// # Errors
    /// As [`Pd::reg_vec`].
    pub fn reg_vec_blocking(
        &self,
        memory: Vec<u8>,
        access: AccessFlags,
    ) -> Result<Mr<D>, Refused<Vec<u8>, MrError>> {
        block_on(self.reg_vec(memory, access))
    }
}

/// The application memory behind a region the core alone holds, unmapped; an empty vector in
/// the one case a device could not unmap it (its memory then stays with the region, which drops
/// it: an owned buffer is freed, memory given by raw parts is left where it is).
fn unmap(buffer: Buffer) -> HostMemory {
    buffer.mem.into_host().unwrap_or_else(|| {
        tracing::error!("the device kept application memory it could not unmap");
        HostMemory::from(Vec::new())
    })
}

impl<D: Device> Mr<D> {
    /// Deregisters an MR made by [`Pd::reg_host`] and gives its memory back, holding whatever
    /// the device wrote.
    ///
    /// # Errors
    /// [`MrError::NotHostMemory`] when the MR is over a device [`Buffer`] or other handles of
    /// its buffer exist; as [`Mr::dereg`] otherwise. The MR is handed back unchanged.
    pub fn into_host(self) -> Result<HostMemory, Refused<Self, MrError>> {
        let (buffer, lkey) = {
            let s = lock(&self.inner.state);
            (s.buffer.clone(), s.keys.lkey)
        };
        // The MR's own buffer handle and the clone above: the application holds no other.
        if Arc::strong_count(&buffer.handles) != 2 || !buffer.mem.is_host() {
            return Err(Refused::new(MrError::NotHostMemory { lkey }, self));
        }
        // Deregistering consumes the MR and makes the device let go of the memory; the clone
        // outlives both and is then its last handle.
        self.dereg()?;
        Ok(unmap(buffer))
    }

    /// [`Mr::into_host`] for an MR made from a vector ([`Pd::reg_vec`]): the vector back.
    ///
    /// # Errors
    /// As [`Mr::into_host`], and [`MrError::NotHostMemory`] for memory given by raw parts
    /// (checked first: nothing is deregistered then).
    pub fn into_vec(self) -> Result<Vec<u8>, Refused<Self, MrError>> {
        let owned = lock(&self.inner.state).buffer.mem.owns_host();
        if !owned {
            let lkey = self.lkey();
            return Err(Refused::new(MrError::NotHostMemory { lkey }, self));
        }
        let memory = self.into_host()?;
        Ok(memory.into_vec().unwrap_or_default())
    }

    /// Local key (always present: IBA chapter 10 gives every memory region one).
    pub fn lkey(&self) -> u32 {
        lock(&self.inner.state).keys.lkey
    }

    /// Remote key, present only when remote access was granted.
    pub fn rkey(&self) -> Option<u32> {
        let s = lock(&self.inner.state);
        s.access.has_remote().then_some(s.keys.rkey)
    }

    /// Virtual address of the first byte.
    pub fn addr(&self) -> u64 {
        lock(&self.inner.state).keys.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        lock(&self.inner.state).range.len()
    }

    /// True for a zero-length registration.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Current rights.
    pub fn access(&self) -> AccessFlags {
        lock(&self.inner.state).access
    }

    /// The buffer and range registered.
    pub fn buffer(&self) -> (Buffer, Range<usize>) {
        let s = lock(&self.inner.state);
        (s.buffer.clone(), s.range.clone())
    }

    /// The PD the MR is in.
    pub fn pd(&self) -> Pd<D> {
        lock(&self.inner.pd).clone()
    }

    /// A gather/scatter entry for `len` bytes at `offset` into the MR (offsets and lengths
    /// are `usize`, as for [`Buffer`]; the entry's own length is the `u32` of `ibv_sge`).
    ///
    /// # Errors
    /// [`MrError::OutsideMr`] when the range leaves the MR or `len` exceeds `u32::MAX`.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge, MrError> {
        let s = lock(&self.inner.state);
        let mr_len = s.range.len();
        let length = u32::try_from(len).ok();
        match (offset.checked_add(len), length) {
            (Some(end), Some(length)) if end <= mr_len => Ok(Sge {
                addr: s.keys.addr + offset as u64,
                length,
                lkey: s.keys.lkey,
            }),
            _ => Err(MrError::OutsideMr {
                offset,
                len,
                mr_len,
            }),
        }
    }

    /// Copies `src` into the MR at `offset` (from the start of the MR). The device may read
    /// or write the same bytes meanwhile: copy only what no posted request uses, as with any
    /// registered memory.
    ///
    /// # Errors
    /// [`MrError::OutsideMr`] when the range leaves the MR; nothing is copied.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), MrError> {
        let (buffer, start) = self.span(offset, src.len())?;
        Ok(buffer.write(start, src)?)
    }

    /// Copies `dst.len()` bytes of the MR at `offset` into `dst` (what the device wrote, once
    /// the request's completion was polled).
    ///
    /// # Errors
    /// [`MrError::OutsideMr`] when the range leaves the MR; `dst` is left as it was.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MrError> {
        let (buffer, start) = self.span(offset, dst.len())?;
        Ok(buffer.read(start, dst)?)
    }

    /// The buffer and the buffer offset of `len` bytes at `offset` into the MR.
    fn span(&self, offset: usize, len: usize) -> Result<(Buffer, usize), MrError> {
        let s = lock(&self.inner.state);
        let mr_len = s.range.len();
        match offset.checked_add(len) {
            Some(end) if end <= mr_len => Ok((s.buffer.clone(), s.range.start + offset)),
            _ => Err(MrError::OutsideMr {
                offset,
                len,
                mr_len,
            }),
        }
    }

    /// Changes the registration (`ibv_rereg_mr`). Work requests already posted are checked
    /// against the new attributes when the device executes them. A refused change leaves the
    /// MR exactly as it was.
    ///
    /// # Errors
    /// The same rules as registration, and [`MrError::EmptyRange`] for new memory of length 0
    /// (rdma-unit-test's `ReregMrInvalidBuffer`; `reg_mr` itself accepts an empty range); the
    /// device may refuse (e.g. windows are bound).
    pub async fn rereg(&self, change: Rereg<'_, D>) -> Result<(), MrError> {
        if let Some(access) = change.access {
            check_mr_access(access)?;
        }
        let ctx = lock(&self.inner.pd).inner.ctx.clone();
        if let Some(pd) = change.pd {
            if !pd.same_device(&ctx) {
                return Err(MrError::ForeignObject { what: "PD" });
            }
        }
        if let Some((buffer, range)) = &change.memory {
            check_range(buffer, range)?;
            if range.is_empty() {
                return Err(MrError::EmptyRange {
                    offset: range.start,
                });
            }
            if buffer.owner != Arc::as_ptr(&ctx) as *const () as usize {
                return Err(MrError::ForeignObject { what: "buffer" });
            }
        }
        let req = MrRereg {
            pd: change.pd.map(Pd::pdn),
            range: change
                .memory
                .as_ref()
                .map(|(b, r)| (b.mem.clone(), r.start, r.len())),
            access: change.access,
        };
        let keys = ctx.device().rereg_mr(self.inner.handle, req).await?;
        let mut s = lock(&self.inner.state);
        s.keys = keys;
        if let Some(access) = change.access {
            s.access = access;
        }
        if let Some((buffer, range)) = change.memory {
            s.buffer = buffer.clone();
            s.range = range;
        }
        if let Some(pd) = change.pd {
            *lock(&self.inner.pd) = pd.clone();
        }
        Ok(())
    }

    /// Blocking form of [`Mr::rereg`].
    ///
    /// # Errors
    /// As [`Mr::rereg`].
    pub fn rereg_blocking(&self, change: Rereg<'_, D>) -> Result<(), MrError> {
        block_on(self.rereg(change))
    }

    /// Deregisters now (`ibv_dereg_mr`). If the device refuses (bound windows, see
    /// `QuirkId::DeregMrWithBoundMwRefused`) or other handles exist, the MR is handed back.
    ///
    /// # Errors
    /// [`MrError::Busy`] with the MR handed back.
    pub fn dereg(self) -> Result<(), Refused<Self, MrError>> {
        let users = Arc::strong_count(&self.inner) - 1;
        let lkey = self.lkey();
        if users > 0 {
            let e = MrError::Busy {
                lkey,
                source: CommandError::Busy {
                    object: "MR",
                    reason: format!("{users} other handles exist"),
                },
            };
            return Err(Refused::new(e, self));
        }
        let ctx = lock(&self.inner.pd).inner.ctx.clone();
        match ctx.device().deregister_mr_blocking(self.inner.handle) {
            Ok(()) => {
                ctx.counts.mrs.fetch_sub(1, Ordering::Relaxed);
                // The device has forgotten it; make Drop a no-op.
                let mut s = lock(&self.inner.state);
                s.keys.handle = u32::MAX;
                drop(s);
                Ok(())
            }
            Err(source) => Err(Refused::new(MrError::Busy { lkey, source }, self)),
        }
    }
}

impl<D: Device> Drop for MrInner<D> {
    fn drop(&mut self) {
        let s = lock(&self.state);
        if s.keys.handle == u32::MAX {
            return;
        }
        drop(s);
        let ctx = lock(&self.pd).inner.ctx.clone();
        ctx.counts.mrs.fetch_sub(1, Ordering::Relaxed);
        if let Err(e) = ctx.device().deregister_mr_blocking(self.handle) {
            tracing::warn!(handle = self.handle, error = %e, "deregistering an MR failed; leaked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_write_or_atomic_needs_local_write() {
        assert!(check_mr_access(AccessFlags::REMOTE_READ).is_ok());
        assert!(matches!(
            check_mr_access(AccessFlags::REMOTE_WRITE),
            Err(MrError::RemoteWithoutLocalWrite { .. })
        ));
        assert!(matches!(
            check_mr_access(AccessFlags::REMOTE_ATOMIC),
            Err(MrError::RemoteWithoutLocalWrite { .. })
        ));
        assert!(check_mr_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC).is_ok());
        assert!(check_mr_access(AccessFlags::ZERO_BASED).is_err());
    }
}
