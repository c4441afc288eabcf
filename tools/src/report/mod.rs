//! Output formatting in the conventions of perftest, ibv_devinfo and ibv_rc_pingpong (work in progress).
