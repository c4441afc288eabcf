//! Where the mlx4 backend differs from IBTA or from the software device.

use portverbs_hal::caps::{Quirk, QuirkId};

/// The quirks table of the mlx4 backend.
pub static MLX4_QUIRKS: &[Quirk] = &[
    Quirk {
        id: QuirkId::NoAutomaticPathMigration,
        summary: "alternate paths (ALT_PATH, PATH_MIG_STATE) are not programmed",
    },
    Quirk {
        id: QuirkId::DeregMrWithBoundMwRefused,
        summary: "deregistering an MR with bound memory windows fails with Busy (the HCA \
                  answers HW2SW_MPT with REG_BOUND); the windows keep working",
    },
    Quirk {
        id: QuirkId::NoSrqResize,
        summary: "an SRQ's max_wr cannot change after creation",
    },
    Quirk {
        id: QuirkId::ZeroRdAtomicIsAccessError,
        summary: "a responder with max_dest_rd_atomic = 0 gets no remote read/atomic rights \
                  (the QP context's rra_max cannot say none; Linux clears the rights too), so \
                  a READ or atomic to it completes with REM_ACCESS_ERR, not REM_INV_REQ_ERR",
    },
    Quirk::RESET_TO_ERR_REFUSED,
    Quirk::UD_OVERSIZE_IS_LOC_LEN_ERR,
    Quirk::NO_ZERO_BASED_ADDRESSING,
];
