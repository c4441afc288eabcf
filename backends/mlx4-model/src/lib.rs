//! An emulated mlx4 HCA (work in progress).
#![deny(unsafe_code)]
