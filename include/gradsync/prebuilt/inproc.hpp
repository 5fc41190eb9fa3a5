// gradsync: the inproc transport's collectives declared extern (prebuilt.hpp);
// transport/inproc.hpp includes this when GRADSYNC_PREBUILT is defined.
#pragma once

#include "../prebuilt.hpp"
#include "../transport/inproc.hpp"

GRADSYNC_PREBUILT_TRANSPORT(extern template, ::gradsync::inproc::communicator)
