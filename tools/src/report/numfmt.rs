//! Small number-rendering helpers shared by the formatters.
//!
//! The tools we imitate are written in C and print with `printf`. Rust's `{:.2}` already rounds
//! the same way as glibc's `%.2f` (exact decimal expansion, ties to even), so fixed-point output
//! needs no help. Two things do:
//!
//! * C's alternate hex form (`%#0Nx`): the width counts the `0x` prefix, and a zero value gets
//!   no prefix at all, so `%#04x` prints `0x01` for 1 but `0000` for 0. perftest's address lines
//!   rely on this, which is why RoCE runs show `LID 0000`.
//! * Values that are not finite. The C tools would print `inf`/`nan` when a run measured no time;
//!   our reports print `0.00` instead, so every value passes through [`finite_or_zero`].

/// Renders `value` like C's `printf("%#0<width>x", value)`.
///
/// Non-zero values get a `0x` prefix and enough leading zeros that prefix plus digits fill
/// `width` characters; zero is printed as `width` zeros without a prefix (the C rule).
pub(crate) fn c_alt_hex(value: u64, width: usize) -> String {
    if value == 0 {
        return "0".repeat(width.max(1));
    }
    let digits = width.saturating_sub(2);
    format!("0x{value:0digits$x}")
}

/// Returns `value`, or `0.0` when it is NaN or infinite.
pub(crate) fn finite_or_zero(value: f64) -> f64 {
    if value.is_finite() { value } else { 0.0 }
}

/// Rounds `value` to the number that `%.<decimals>f` would print, as an `f64`.
///
/// Used for JSON output: serde_json writes the shortest text that reads back as the same `f64`,
/// so a value first rounded this way appears as the same decimal number the C tool writes
/// (trailing zeros aside: `12.50` is written `12.5`). Non-finite input gives `0.0`.
pub(crate) fn rounded(value: f64, decimals: usize) -> f64 {
    let text = format!("{:.decimals$}", finite_or_zero(value));
    text.parse().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alt_hex_matches_c_alternate_form() {
        assert_eq!(c_alt_hex(0, 4), "0000");
        assert_eq!(c_alt_hex(0, 6), "000000");
        assert_eq!(c_alt_hex(1, 4), "0x01");
        assert_eq!(c_alt_hex(0x1234, 4), "0x1234");
        assert_eq!(c_alt_hex(0x11, 6), "0x0011");
        assert_eq!(c_alt_hex(0xabcdef, 6), "0xabcdef");
        assert_eq!(c_alt_hex(0x7f00_dead_0000, 16), "0x007f00dead0000");
        assert_eq!(c_alt_hex(0, 0), "0");
    }

    #[test]
    fn non_finite_values_become_zero() {
        assert_eq!(finite_or_zero(f64::NAN), 0.0);
        assert_eq!(finite_or_zero(f64::INFINITY), 0.0);
        assert_eq!(finite_or_zero(-2.5), -2.5);
    }

    #[test]
    fn rounding_follows_printf() {
        assert_eq!(rounded(1234.5678, 2), 1234.57);
        // 0.125 is exact in binary: printf rounds the tie to even.
        assert_eq!(rounded(0.125, 2), 0.12);
        assert_eq!(rounded(0.000_000_4, 6), 0.0);
        assert_eq!(rounded(f64::NAN, 2), 0.0);
    }
}
