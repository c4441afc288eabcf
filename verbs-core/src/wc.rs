//! Work completions (`struct ibv_wc`): the type lives in the HAL so that a backend's decoder
//! writes the application's array directly; verbs-core re-exports it.

pub use portverbs_hal::wc::WorkCompletion;
