// gradsync: one include for users: the collectives, calibrate(comm) for a
// measured cost model, and the in-process transport. Transports that need
// external libraries (transport/mpi.hpp, transport/nccl.hpp) are included
// separately.
#pragma once

#include "calibrate.hpp"
#include "collectives.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "core/ops.hpp"
#include "transport/inproc.hpp"
#include "transport/staged.hpp"
