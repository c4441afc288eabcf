//! RoCEv2 / IB transport wire formats (work in progress).
