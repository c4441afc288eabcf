//! The address handles of QP1's sends: one per peer GID, kept for the next MAD to the same
//! peer, at most [`CAPACITY`] of them. The least recently used goes when a new peer needs
//! one: a stranger who makes the CM answer from thousands of addresses (a DREQ for no
//! connection gets a DREP, a REQ to a full backlog a REJ) costs a handle for a moment, not
//! for the life of the process. A send carries its own copy of the address vector, so a
//! handle evicted while its MAD is on the wire does no harm.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::mem::size_of;

use portverbs_hal::{Device, Gid};
use portverbs_verbs::{AddressHandle, AddressVector, Pd};

/// Address handles kept at most: more peers than one CM talks to at once in any test or
/// tool of this repository (`portverbs cmtime` keeps one peer, the 200-connection test two),
/// few enough that the cache stays under 64 KiB.
pub(crate) const CAPACITY: usize = 256;

/// The cache: handles by GID, each with the tick of its last use.
#[derive(Debug)]
pub(crate) struct AhCache<D: Device> {
    map: HashMap<Gid, (AddressHandle<D>, u64)>,
    tick: u64,
}

impl<D: Device> Default for AhCache<D> {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
            tick: 0,
        }
    }
}

impl<D: Device> AhCache<D> {
    /// The handle for `gid`, made with `make` if there is none; the least recently used
    /// handle is dropped first when the cache is full.
    pub(crate) fn get<E>(
        &mut self,
        gid: Gid,
        make: impl FnOnce() -> Result<AddressHandle<D>, E>,
    ) -> Result<&AddressHandle<D>, E> {
        self.tick += 1;
        let tick = self.tick;
        if self.map.len() >= CAPACITY && !self.map.contains_key(&gid) {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(g, _)| *g);
            if let Some(g) = oldest {
                self.map.remove(&g);
            }
        }
        match self.map.entry(gid) {
            Entry::Occupied(o) => {
                let e = o.into_mut();
                e.1 = tick;
                Ok(&e.0)
            }
            Entry::Vacant(v) => Ok(&v.insert((make()?, tick)).0),
        }
    }

    /// Handles held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes held, an upper estimate by capacity: the map's buckets and each handle's shared
    /// part (its address vector and PD reference).
    pub(crate) fn bytes(&self) -> usize {
        self.map.capacity() * 8 / 7 * (size_of::<(Gid, (AddressHandle<D>, u64))>() + 1)
            + self.map.len() * (size_of::<AddressVector>() + size_of::<Pd<D>>() + 16)
    }
}
