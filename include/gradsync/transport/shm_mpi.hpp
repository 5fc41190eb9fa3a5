// gradsync: bootstrapping the shared-memory transport through MPI. Rank 0 of
// the MPI communicator creates the segment and broadcasts its name; no
// rendezvous directory is needed. Kept apart so that shm.hpp needs no MPI.
#pragma once

#include <mpi.h>

#include <string>

#include "../core/error.hpp"
#include "mpi.hpp"
#include "shm.hpp"

namespace gradsync::shm {

/// A shared-memory communicator over the ranks of MPI communicator `comm`
/// (same rank numbers), which must all run on one node (checked: otherwise
/// every rank fails with an error). Collective over `comm`.
inline communicator from_mpi(MPI_Comm comm) {
  const char* op = "shm.from_mpi";
  int rank = 0, size = 0;
  gradsync::mpi::detail::check(MPI_Comm_rank(comm, &rank), op, -1);
  gradsync::mpi::detail::check(MPI_Comm_size(comm, &size), op, rank);
  MPI_Comm local = MPI_COMM_NULL;
  gradsync::mpi::detail::check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local),
                               op, rank);
  int local_size = 0;
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  int all_local = local_size == size ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_local, 1, MPI_INT, MPI_MIN, comm);
  GRADSYNC_REQUIRE(all_local == 1, op, rank,
          "the MPI communicator spans several nodes; the shm transport needs every rank on one node");
  // Rank 0 broadcasts the name; an empty name means it failed to create one
  // (every rank then fails instead of waiting for a segment that never comes).
  return communicator(rank, size, [&](const std::string& mine) {
    char buf[64] = {};
    if (rank == 0) mine.copy(buf, sizeof buf - 1);
    gradsync::mpi::detail::check(MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, comm), op, rank);
    const std::string name(buf);
    if (name.empty()) throw error(errc::peer_failed, op, rank, 0, "rank 0 could not create the shared segment");
    return name;
  });
}

/// The same over a gradsync MPI communicator (ranks as in `c`).
inline communicator from_mpi(const gradsync::mpi::communicator& c) { return from_mpi(c.native()); }

} // namespace gradsync::shm
