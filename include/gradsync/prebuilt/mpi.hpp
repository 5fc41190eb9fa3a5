// gradsync: the mpi transport's collectives declared extern (prebuilt.hpp);
// transport/mpi.hpp includes this when GRADSYNC_PREBUILT is defined.
#pragma once

#include "../prebuilt.hpp"
#include "../transport/mpi.hpp"

GRADSYNC_PREBUILT_TRANSPORT(extern template, ::gradsync::mpi::communicator)
