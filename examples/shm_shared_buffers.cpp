// gradsync over shared memory with shared buffers: run with
// `mpiexec -n 2 ./shm_shared_buffers`. MPI only starts the processes and
// hands them the segment's name; the allreduce itself runs over the shm
// transport. The gradient lives in memory every rank maps
// (communicator::alloc_shared), so each rank reduces its share of every
// rank's gradient in place and writes the result into every rank's buffer:
// no staging copy through the shm arena.
#include <gradsync/gradsync.hpp>
#include <gradsync/transport/shm_mpi.hpp>

#include <cstdio>
#include <span>

int main(int argc, char** argv) {
  gradsync::mpi::session s(argc, argv);
  auto comm = gradsync::shm::from_mpi(s.world()); // the processes of one node
  const int p = comm.size();

  const std::size_t n = std::size_t{1} << 22; // 16 MiB of floats
  gradsync::shm::shared_buffer buf = comm.alloc_shared(n * sizeof(float)); // a collective call
  std::span<float> grad = buf.as<float>();
  for (std::size_t i = 0; i < n; ++i) grad[i] = static_cast<float>(comm.rank()) + static_cast<float>(i % 8);

  gradsync::allreduce(comm, grad, gradsync::op::avg{}, {.algo = gradsync::algorithm::direct});

  // The mean over ranks of r + i % 8 is (p - 1) / 2 + i % 8.
  bool ok = true;
  for (std::size_t i = 0; i < n; ++i) ok = ok && grad[i] == static_cast<float>(p - 1) / 2 + static_cast<float>(i % 8);
  if (comm.rank() == 0)
    std::printf("%d ranks, %zu floats in shared buffers: mean %s\n", p, n, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
