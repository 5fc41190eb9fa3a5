// One rank of a fault test (faults.py drives it): joins a group over shm
// (rendezvous directory) or MPI, then runs allreduces of 1 Mi floats until
// told to stop or until one fails. Prints "joined" and "step N" lines on
// stdout; on failure prints the error to stderr and exits 3, so the driver
// can check that survivors fail within the timeout and name the lost rank.
//   fault_worker shm DIR RANK SIZE TIMEOUT_MS STEPS
//   fault_worker mpi REPORT_DIR - - TIMEOUT_MS STEPS   (under mpiexec)
// Under MPI the error also goes to REPORT_DIR/rank<R>.err (unless "-"): the
// session's MPI_Abort can end mpiexec's forwarding before a rank's stderr
// is passed on (seen in ~1 of 5 runs on a loaded 2-core VM: empty stderr).
#include <gradsync/collectives.hpp>
#include <gradsync/transport/shm.hpp>
#ifdef GRADSYNC_FAULTS_MPI
#include <gradsync/transport/mpi.hpp>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

namespace {

template <class C> int steps(C& c, long long timeout_ms, long steps_total) {
  c.set_timeout(std::chrono::milliseconds(timeout_ms));
  std::printf("joined rank %d of %d\n", c.rank(), c.size());
  std::fflush(stdout);
  std::vector<float> v(std::size_t{1} << 20);
  for (long s = 0; s < steps_total; ++s) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(c.rank() + 1);
    gradsync::allreduce(c, std::span<float>(v), gradsync::op::sum{});
    const float want = static_cast<float>(c.size() * (c.size() + 1) / 2);
    if (v[0] != want || v[v.size() - 1] != want) {
      std::fprintf(stderr, "wrong sum at step %ld: %g, want %g\n", s, static_cast<double>(v[0]),
                   static_cast<double>(want));
      return 4;
    }
    std::printf("step %ld\n", s);
    std::fflush(stdout);
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s shm|mpi DIR RANK SIZE TIMEOUT_MS STEPS\n", argv[0]);
    return 2;
  }
  const std::string kind = argv[1];
  const long long timeout_ms = std::atoll(argv[5]);
  const long n = std::atol(argv[6]);
  try {
    if (kind == "shm") {
      gradsync::shm::communicator c(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
      return steps(c, timeout_ms, n);
    }
#ifdef GRADSYNC_FAULTS_MPI
    if (kind == "mpi") {
      gradsync::mpi::session s(argc, argv);
      auto c = s.world();
      try {
        return steps(c, timeout_ms, n);
      } catch (const gradsync::error& e) { // printed here: leaving the session aborts the job
        std::fprintf(stderr, "%s\nkind=%s peer=%d\n", e.what(), gradsync::errc_name(e.kind()), e.peer());
        std::fflush(stderr);
        if (std::string(argv[2]) != "-") {
          const std::string path = std::string(argv[2]) + "/rank" + std::to_string(c.rank()) + ".err";
          if (std::FILE* f = std::fopen(path.c_str(), "w")) {
            std::fprintf(f, "%s\nkind=%s peer=%d\n", e.what(), gradsync::errc_name(e.kind()), e.peer());
            std::fclose(f);
          }
        }
        throw;
      }
    }
#endif
    std::fprintf(stderr, "unknown transport %s\n", kind.c_str());
    return 2;
  } catch (const gradsync::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fprintf(stderr, "kind=%s peer=%d\n", gradsync::errc_name(e.kind()), e.peer());
    return 3;
  }
}
