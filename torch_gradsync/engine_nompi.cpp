// torch_gradsync without MPI: the shm transport only.
#include "engine.hpp"

#include <stdexcept>

namespace torch_gradsync {

bool mpi_launched() { return false; }

std::unique_ptr<engine> make_mpi_engine(int rank, int, std::chrono::milliseconds) {
  throw std::runtime_error("gradsync: init_process_group (rank " + std::to_string(rank) +
                           "): this torch_gradsync was built without MPI");
}

} // namespace torch_gradsync
