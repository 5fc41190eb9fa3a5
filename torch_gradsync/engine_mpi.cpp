// torch_gradsync: the engine over MPI (a process group launched by mpiexec).
#include <gradsync/transport/mpi.hpp>

#include "engine_impl.hpp"

namespace torch_gradsync {

bool mpi_launched() { return gradsync::mpi::launched_by_mpiexec(); }

std::unique_ptr<engine> make_mpi_engine(int rank, int size, std::chrono::milliseconds timeout) {
  // MPI stays initialised for the life of the process (it cannot be
  // initialised twice); several process groups share the session.
  static gradsync::mpi::session session;
  gradsync::mpi::communicator comm(MPI_COMM_WORLD);
  if (comm.rank() != rank || comm.size() != size)
    throw gradsync::error("init_process_group", rank, -1,
                          "the gradsync backend over MPI spans MPI_COMM_WORLD (rank " + std::to_string(comm.rank()) +
                              " of " + std::to_string(comm.size()) + "), but torch asked for rank " +
                              std::to_string(rank) + " of " + std::to_string(size) +
                              ": launch one torch rank per MPI rank, with the same numbering");
  comm.set_timeout(timeout);
  return std::make_unique<detail::engine_on<gradsync::mpi::communicator>>(std::move(comm));
}

} // namespace torch_gradsync
