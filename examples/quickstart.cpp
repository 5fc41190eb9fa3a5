// gradsync quickstart: four ranks average their gradients with one call.
// The ranks here are threads of this process (gradsync::inproc); the same
// collective runs across processes over MPI (see mpi_allreduce.cpp).
#include <gradsync/gradsync.hpp>

#include <cstdio>
#include <span>
#include <vector>

int main() {
  try {
    gradsync::inproc::run(4, [](gradsync::inproc::communicator& comm) {
      // Rank r's gradient holds r + i at position i.
      std::vector<float> grad(8);
      for (std::size_t i = 0; i < grad.size(); ++i)
        grad[i] = static_cast<float>(comm.rank()) + static_cast<float>(i);

      // In place on every rank: the mean over ranks of r + i is i + 1.5.
      gradsync::allreduce(comm, std::span(grad), gradsync::op::avg{});

      for (std::size_t i = 0; i < grad.size(); ++i)
        if (grad[i] != static_cast<float>(i) + 1.5f)
          throw gradsync::error("quickstart", comm.rank(), -1, "unexpected mean at " + std::to_string(i));
      if (comm.rank() == 0) {
        std::printf("mean gradient on %d ranks:", comm.size());
        for (float g : grad) std::printf(" %g", static_cast<double>(g));
        std::printf("\n");
      }
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
