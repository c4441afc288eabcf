//! PCI configuration space through the VFIO config region: reads and writes of 1, 2 or 4
//! bytes (little-endian, as PCI defines it), the command register, and the capability list.
//!
//! vfio-pci virtualises parts of config space (BAR registers, the MSI/MSI-X capabilities,
//! some command bits); what a driver needs — ids, command, status, capabilities — reads and
//! writes as on bare metal. Every failure is returned, never only logged.

use crate::device::VfioDevice;
use crate::error::VfioError;
use crate::sys;

/// Config-space register offsets and bits used here (PCI Local Bus 3.0, §6.2).
pub mod regs {
    /// Vendor id (16 bits).
    pub const VENDOR_ID: u16 = 0x00;
    /// Device id (16 bits).
    pub const DEVICE_ID: u16 = 0x02;
    /// Command register (16 bits).
    pub const COMMAND: u16 = 0x04;
    /// Status register (16 bits).
    pub const STATUS: u16 = 0x06;
    /// Capabilities pointer (8 bits).
    pub const CAP_PTR: u16 = 0x34;
    /// Command: respond to memory-space accesses.
    pub const CMD_MEMORY: u16 = 1 << 1;
    /// Command: the function may master the bus (DMA, and MSI writes).
    pub const CMD_BUS_MASTER: u16 = 1 << 2;
    /// Status: the capability list exists.
    pub const STATUS_CAP_LIST: u16 = 1 << 4;
    /// Capability id of MSI.
    pub const CAP_ID_MSI: u8 = 0x05;
    /// Capability id of MSI-X.
    pub const CAP_ID_MSIX: u8 = 0x11;
    /// Capability id of PCI Express.
    pub const CAP_ID_EXP: u8 = 0x10;
}

impl VfioDevice {
    /// Checks a config access and returns its file offset.
    fn config_at(&self, off: u16, width: u8) -> Result<u64, VfioError> {
        let (base, size) = self.inner.config;
        let end = u64::from(off) + u64::from(width);
        if off % u16::from(width) != 0 || end > size {
            return Err(VfioError::ConfigRange {
                addr: self.inner.addr.clone(),
                offset: off,
                width,
                size,
            });
        }
        Ok(base + u64::from(off))
    }

    fn config_read<const N: usize>(&self, off: u16) -> Result<[u8; N], VfioError> {
        let width = N as u8;
        let at = self.config_at(off, width)?;
        let mut buf = [0u8; N];
        sys::pread_exact(sys::device_fd(&self.inner.dev), &mut buf, at).map_err(|source| {
            VfioError::ConfigRead {
                addr: self.inner.addr.clone(),
                offset: off,
                width,
                source,
            }
        })?;
        Ok(buf)
    }

    fn config_write<const N: usize>(&self, off: u16, bytes: [u8; N]) -> Result<(), VfioError> {
        let width = N as u8;
        let at = self.config_at(off, width)?;
        sys::pwrite_all(sys::device_fd(&self.inner.dev), &bytes, at).map_err(|source| {
            VfioError::ConfigWrite {
                addr: self.inner.addr.clone(),
                offset: off,
                width,
                source,
            }
        })
    }

    /// Reads the config byte at `off`.
    ///
    /// # Errors
    /// [`VfioError::ConfigRange`] outside config space, [`VfioError::ConfigRead`] when the read
    /// fails.
    pub fn config_read8(&self, off: u16) -> Result<u8, VfioError> {
        Ok(self.config_read::<1>(off)?[0])
    }

    /// Reads the config word at `off` (2-byte aligned).
    ///
    /// # Errors
    /// As [`VfioDevice::config_read8`], and misalignment.
    pub fn config_read16(&self, off: u16) -> Result<u16, VfioError> {
        Ok(u16::from_le_bytes(self.config_read::<2>(off)?))
    }

    /// Reads the config dword at `off` (4-byte aligned).
    ///
    /// # Errors
    /// As [`VfioDevice::config_read16`].
    pub fn config_read32(&self, off: u16) -> Result<u32, VfioError> {
        Ok(u32::from_le_bytes(self.config_read::<4>(off)?))
    }

    /// Writes the config byte at `off`.
    ///
    /// # Errors
    /// [`VfioError::ConfigRange`] outside config space, [`VfioError::ConfigWrite`] when the
    /// write fails.
    pub fn config_write8(&self, off: u16, value: u8) -> Result<(), VfioError> {
        self.config_write(off, [value])
    }

    /// Writes the config word at `off` (2-byte aligned).
    ///
    /// # Errors
    /// As [`VfioDevice::config_write8`], and misalignment.
    pub fn config_write16(&self, off: u16, value: u16) -> Result<(), VfioError> {
        self.config_write(off, value.to_le_bytes())
    }

    /// Writes the config dword at `off` (4-byte aligned).
    ///
    /// # Errors
    /// As [`VfioDevice::config_write16`].
    pub fn config_write32(&self, off: u16, value: u32) -> Result<(), VfioError> {
        self.config_write(off, value.to_le_bytes())
    }

    /// Vendor and device id.
    ///
    /// # Errors
    /// The config read failed.
    pub fn vendor_device(&self) -> Result<(u16, u16), VfioError> {
        let v = self.config_read32(regs::VENDOR_ID)?;
        Ok((v as u16, (v >> 16) as u16))
    }

    /// Sets Memory Space and Bus Master in the command register, so the device answers BAR
    /// accesses and may DMA (and send MSIs, which are DMA writes). Without Bus Master, the
    /// device's DMA is silently dropped.
    ///
    /// # Errors
    /// The config read or write failed.
    pub fn enable_bus_master(&self) -> Result<(), VfioError> {
        let old = self.config_read16(regs::COMMAND)?;
        let new = old | regs::CMD_MEMORY | regs::CMD_BUS_MASTER;
        if new != old {
            self.config_write16(regs::COMMAND, new)?;
        }
        Ok(())
    }

    /// Clears Bus Master: the device stops DMA (done when the handle is dropped).
    ///
    /// # Errors
    /// The config read or write failed.
    pub fn disable_bus_master(&self) -> Result<(), VfioError> {
        let old = self.config_read16(regs::COMMAND)?;
        if old & regs::CMD_BUS_MASTER != 0 {
            self.config_write16(regs::COMMAND, old & !regs::CMD_BUS_MASTER)?;
        }
        Ok(())
    }

    /// The standard capability list as `(id, offset)` pairs, in list order. A malformed list
    /// (a loop, a pointer into the header) ends the walk.
    ///
    /// # Errors
    /// A config read failed.
    pub fn capabilities(&self) -> Result<Vec<(u8, u16)>, VfioError> {
        let mut caps = Vec::new();
        if self.config_read16(regs::STATUS)? & regs::STATUS_CAP_LIST == 0 {
            return Ok(caps);
        }
        let mut ptr = self.config_read8(regs::CAP_PTR)? & 0xfc;
        // At most 48 capabilities fit in the 192 bytes after the header.
        while ptr >= 0x40 && caps.len() < 48 {
            let off = u16::from(ptr);
            let id = self.config_read8(off)?;
            caps.push((id, off));
            ptr = self.config_read8(off + 1)? & 0xfc;
        }
        Ok(caps)
    }

    /// The offset of the first capability with `id`, if any.
    ///
    /// # Errors
    /// A config read failed.
    pub fn find_capability(&self, id: u8) -> Result<Option<u16>, VfioError> {
        Ok(self
            .capabilities()?
            .into_iter()
            .find(|&(c, _)| c == id)
            .map(|(_, off)| off))
    }
}
