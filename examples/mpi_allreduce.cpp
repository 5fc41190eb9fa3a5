// gradsync over MPI: run with `mpiexec -n 4 ./mpi_allreduce`. Every process
// averages its gradient with the others, then sums it with a chosen schedule.
#include <gradsync/gradsync.hpp>
#include <gradsync/transport/mpi.hpp>

#include <cstdio>
#include <span>
#include <vector>

int main(int argc, char** argv) {
  gradsync::mpi::session s(argc, argv); // MPI_Init_thread unless already initialised
  auto comm = s.world();                 // a private duplicate of MPI_COMM_WORLD
  const int p = comm.size();

  std::vector<float> grad(1 << 20, static_cast<float>(comm.rank()));
  gradsync::allreduce(comm, std::span(grad), gradsync::op::avg{}); // automatic algorithm
  gradsync::allreduce(comm, std::span(grad), gradsync::op::sum{}, {.algo = gradsync::algorithm::ring});

  // mean of 0..p-1 is (p-1)/2; summed over p ranks: p(p-1)/2
  const float want = static_cast<float>(p) * static_cast<float>(p - 1) / 2;
  bool ok = true;
  for (float g : grad) ok = ok && g == want;
  if (comm.rank() == 0)
    std::printf("%d ranks: every element is %g (%s)\n", p, static_cast<double>(grad[0]), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
