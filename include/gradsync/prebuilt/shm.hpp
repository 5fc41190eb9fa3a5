// gradsync: the shm transport's collectives declared extern (prebuilt.hpp);
// transport/shm.hpp includes this when GRADSYNC_PREBUILT is defined.
#pragma once

#include "../prebuilt.hpp"
#include "../transport/shm.hpp"

GRADSYNC_PREBUILT_TRANSPORT(extern template, ::gradsync::shm::communicator)
