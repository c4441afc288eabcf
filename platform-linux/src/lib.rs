//! Linux platform layer (work in progress).
