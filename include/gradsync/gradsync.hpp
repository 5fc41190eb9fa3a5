// gradsync: one include for users. Transports that need external libraries
// (transport/mpi.hpp, transport/nccl.hpp) are included separately.
#pragma once

#include "collectives.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "core/ops.hpp"
#include "transport/inproc.hpp"
