//! Portverbs facade (work in progress).
