//! Protection domains, memory registrations (MPTs and MTTs with hardware-formed keys) and
//! memory windows.

use portverbs_hal::device::{MrKeys, MrParams, MrRereg, MwKeys};
use portverbs_hal::dma::DmaError;
use portverbs_hal::error::CommandError;
use portverbs_hal::types::{AccessFlags, MwType};
use zerocopy::IntoBytes;

use super::Mlx4Device;
use super::commands::no;
use super::objects::MrRec;
use crate::cmd::Cmd;
use crate::layout::ctx::{Mpt, mpt_flag};
use crate::layout::opcode;
use crate::mtt::MttRange;

impl Mlx4Device {
    pub(super) async fn do_alloc_pd(&self) -> Result<u32, CommandError> {
        self.0.check_alive()?;
        self.0
            .nums()
            .pd
            .alloc()
            .ok_or(CommandError::ResourceExhausted { resource: "PDs" })
    }

    pub(super) async fn do_dealloc_pd(&self, pd: u32) -> Result<(), CommandError> {
        self.0.nums().pd.free(pd);
        Ok(())
    }

    /// The key of MPT `index`: the index and a key byte drawn afresh, never the one before
    /// (Linux's mlx4 forms keys as index and tag the same way, `hw_index_to_key`; the byte is
    /// drawn as rxe draws its own, so that a peer cannot guess it and a stale key stops
    /// matching).
    pub(super) fn mpt_key(&self, index: u32) -> u32 {
        let mut n = self.0.nums();
        let n = &mut *n;
        let tag = &mut n.mpt_tag[index as usize];
        *tag = n.rng.other_byte(*tag);
        crate::layout::keys::index_to_key(index) | u32::from(*tag)
    }

    pub(super) fn access_flags(a: AccessFlags) -> u32 {
        let mut f = mpt_flag::LOCAL_READ;
        if a.contains(AccessFlags::LOCAL_WRITE) {
            f |= mpt_flag::LOCAL_WRITE;
        }
        if a.contains(AccessFlags::REMOTE_WRITE) {
            f |= mpt_flag::REMOTE_WRITE;
        }
        if a.contains(AccessFlags::REMOTE_READ) {
            f |= mpt_flag::REMOTE_READ;
        }
        if a.contains(AccessFlags::REMOTE_ATOMIC) {
            f |= mpt_flag::ATOMIC;
        }
        if a.contains(AccessFlags::MW_BIND) {
            f |= mpt_flag::BIND_ENABLE;
        }
        f
    }

    /// Writes the MTT range and the MPT of a registration; returns its keys and the range (which
    /// the caller keeps in the registration's record).
    pub(super) async fn write_mr(
        &self,
        index: u32,
        key: u32,
        mr: &MrRec,
    ) -> Result<(MrKeys, MttRange), CommandError> {
        let MrRec {
            pd,
            ref region,
            offset,
            length,
            access,
            ..
        } = *mr;
        if offset
            .checked_add(length)
            .is_none_or(|end| end > region.len())
        {
            return Err(CommandError::Dma(DmaError::OutOfBounds {
                offset,
                len: length,
                region_len: region.len(),
            }));
        }
        let addr = region.host_addr() + offset as u64;
        let cmd = Cmd::new(opcode::SW2HW_MPT).in_mod(index);
        let mtt = self
            .sw2hw(cmd, region.as_ref(), offset, length, |first| Mpt {
                flags: (mpt_flag::STATUS_SW
                    | mpt_flag::MIO
                    | mpt_flag::REGION
                    | Self::access_flags(access))
                .into(),
                key: crate::layout::keys::key_to_hw(key).into(),
                pd_flags: (pd | mpt_flag::EN_INV).into(),
                start: addr.into(),
                length: (length as u64).into(),
                mtt_addr: (first * 8).into(),
                entity_size: 12.into(),
                ..Default::default()
            })
            .await?;
        let keys = MrKeys {
            handle: index,
            lkey: key,
            rkey: key,
            addr,
        };
        Ok((keys, mtt))
    }

    /// Frees the MTT range of registration `index` (the HCA no longer uses it).
    pub(super) fn take_mr_range(&self, index: u32) {
        let r = self
            .0
            .objects()
            .mrs
            .get_mut(&index)
            .and_then(|m| m.mtt.take());
        if let Some(r) = r {
            self.0.mtts.free(r);
        }
    }

    pub(super) async fn do_register_mr(&self, params: MrParams) -> Result<MrKeys, CommandError> {
        self.0.check_alive()?;
        let index = self
            .0
            .nums()
            .mpt
            .alloc()
            .ok_or(CommandError::ResourceExhausted { resource: "MPTs" })?;
        let key = self.mpt_key(index);
        let rec = MrRec {
            key,
            pd: params.pd,
            region: params.region,
            offset: params.offset,
            length: params.length,
            access: params.access,
            mtt: None,
        };
        match self.write_mr(index, key, &rec).await {
            Ok((keys, mtt)) => {
                self.0.objects().mrs.insert(
                    index,
                    MrRec {
                        mtt: Some(mtt),
                        ..rec
                    },
                );
                Ok(keys)
            }
            Err(e) => {
                self.0.nums().mpt.free(index);
                Err(e)
            }
        }
    }

    pub(super) async fn do_rereg_mr(
        &self,
        handle: u32,
        change: MrRereg,
    ) -> Result<MrKeys, CommandError> {
        let Some(old) = self.0.objects().mrs.get(&handle).cloned() else {
            return Err(no("MR", handle));
        };
        let mut new = old.clone();
        if let Some(pd) = change.pd {
            new.pd = pd;
        }
        if let Some((region, offset, length)) = change.range {
            new.region = region;
            new.offset = offset;
            new.length = length;
        }
        if let Some(access) = change.access {
            new.access = access;
        }
        // The HCA owns the MPT: take it back (REG_BOUND while windows are bound), then hand the
        // new one over under the same key.
        self.cmd(
            Cmd::new(opcode::HW2SW_MPT)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(handle),
        )
        .await?;
        self.take_mr_range(handle);
        match self.write_mr(handle, old.key, &new).await {
            Ok((keys, mtt)) => {
                self.0.objects().mrs.insert(
                    handle,
                    MrRec {
                        mtt: Some(mtt),
                        ..new
                    },
                );
                Ok(keys)
            }
            Err(e) => {
                // Put the old registration back so the handle stays valid.
                match self.write_mr(handle, old.key, &old).await {
                    Ok((_, mtt)) => {
                        self.0.objects().mrs.insert(
                            handle,
                            MrRec {
                                mtt: Some(mtt),
                                ..old
                            },
                        );
                    }
                    Err(_) => tracing::warn!(
                        handle,
                        "could not restore a registration after a failed rereg"
                    ),
                }
                Err(e)
            }
        }
    }

    pub(super) async fn do_deregister_mr(&self, handle: u32) -> Result<(), CommandError> {
        self.hw2sw(
            Cmd::new(opcode::HW2SW_MPT)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(handle),
        )
        .await?;
        self.take_mr_range(handle);
        self.0.objects().mrs.remove(&handle);
        self.0.nums().mpt.free(handle);
        Ok(())
    }

    pub(super) async fn do_alloc_mw(
        &self,
        pd: u32,
        mw_type: MwType,
    ) -> Result<MwKeys, CommandError> {
        self.0.check_alive()?;
        let index = self
            .0
            .nums()
            .mpt
            .alloc()
            .ok_or(CommandError::ResourceExhausted { resource: "MPTs" })?;
        let key = self.mpt_key(index);
        let mpt = Mpt {
            flags: mpt_flag::STATUS_FREE.into(),
            qpn: if mw_type == MwType::Type2 {
                mpt_flag::QP_BOUND.into()
            } else {
                0.into()
            },
            key: crate::layout::keys::key_to_hw(key).into(),
            pd_flags: (pd | mpt_flag::EN_INV).into(),
            ..Default::default()
        };
        if let Err(e) = self
            .cmd_in(Cmd::new(opcode::SW2HW_MPT).in_mod(index), mpt.as_bytes())
            .await
        {
            self.0.nums().mpt.free(index);
            return Err(e);
        }
        self.0.objects().mws.insert(index, pd);
        Ok(MwKeys {
            handle: index,
            rkey: key,
        })
    }

    /// Takes the window's MPT back and frees its number. When the HCA refuses (a live device
    /// that still owns the MPT), the window stays recorded and its number reserved, so no new
    /// MPT is ever written over one the HCA uses; closing the device releases both.
    pub(super) async fn do_dealloc_mw(&self, handle: u32) -> Result<(), CommandError> {
        if !self.0.objects().mws.contains_key(&handle) {
            return Err(no("MW", handle));
        }
        self.hw2sw(
            Cmd::new(opcode::HW2SW_MPT)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(handle),
        )
        .await?;
        if self.0.objects().mws.remove(&handle).is_some() {
            self.0.nums().mpt.free(handle);
        }
        Ok(())
    }
}
