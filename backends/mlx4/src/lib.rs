//! # Portverbs mlx4 backend — an mlx4-class HCA driven from userspace
//!
//! (Work in progress: the layout module is the contract between this driver and the emulated
//! HCA in `portverbs-mlx4-model`.)
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod layout;
pub mod pci;

pub use pci::{PciError, PciFunction};
