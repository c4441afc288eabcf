//! Memory keys (Linux `mlx4/mr.c`): key = rotl8(MPT index), the MPT's key field = rotr8(key).

/// The key of MPT index `index` with tag byte 0 (first use).
pub fn index_to_key(index: u32) -> u32 {
    index.rotate_left(8)
}

/// The MPT key-field form of `key` (index in the low 24 bits, tag in the top byte).
pub fn key_to_hw(key: u32) -> u32 {
    key.rotate_right(8)
}

/// The MPT index a key names in a table of `num_mpts` (a power of two).
pub fn key_to_index(key: u32, num_mpts: u32) -> u32 {
    key_to_hw(key) & num_mpts.wrapping_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_encodings_of_facts_10_1() {
        assert_eq!(index_to_key(0x21), 0x2100);
        assert_eq!(key_to_hw(0x2100), 0x21);
        // Same index with tag byte 0x77 (iPXE style).
        assert_eq!(key_to_hw(0x2177), 0x7700_0021);
        assert_eq!(key_to_index(0x2177, 1 << 17), 0x21);
    }
}
