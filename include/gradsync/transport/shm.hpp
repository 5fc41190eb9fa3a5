// gradsync: the shared-memory transport (public include). Ranks are processes
// of one node that map one POSIX shared-memory segment; no MPI needed. The
// implementation lives in shm/: layout.hpp (the segment's layout),
// segment.hpp (mapping and join), engine.hpp (messages), arena.hpp (the
// collective arena of algo/shm_direct.hpp) and communicator.hpp.
#pragma once

#include "shm/communicator.hpp"

// Opt-in prebuilt instantiations (gradsync/prebuilt.hpp).
#if defined(GRADSYNC_PREBUILT) && !defined(GRADSYNC_PREBUILT_INSTANTIATE)
#include "../prebuilt/shm.hpp"
#endif
