//! The seeded generator of the fault injection: SplitMix64, which lives in the HAL
//! ([`portverbs_hal::rng`]) because every device draws its identifiers from it too. Its
//! promise is "same seed, same run" across versions of Portverbs.

pub use portverbs_hal::rng::SplitMix64;
