// gradsync examples: what the training examples that check themselves
// against a single-process reference share (moe_layer.cpp, gnn_fullbatch.cpp):
// the comparison of the losses, the verdict, and a main() that runs one
// function per rank over inproc threads or under mpiexec.
#pragma once

#include <gradsync/transport/inproc.hpp>
#if GRADSYNC_EXAMPLE_MPI
#include <gradsync/transport/mpi.hpp>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace example {

/// Steps whose distributed loss `got` differs from the reference `want` by
/// more than 1e-9 (relative); prints the first three steps, the last and
/// every differing one.
inline int steps_differing(const std::vector<double>& got, const std::vector<double>& want) {
  int bad = 0;
  const int steps = static_cast<int>(got.size());
  for (int s = 0; s < steps; ++s) {
    const double rel = std::abs(got[s] - want[s]) / std::max(1e-300, std::abs(want[s]));
    if (s < 3 || s == steps - 1 || rel > 1e-9)
      std::printf("step %3d  loss %.12f  single-process %.12f  rel diff %.1e\n", s, got[s], want[s], rel);
    bad += rel > 1e-9;
  }
  return bad;
}

/// The exit status: 1 when `bad` steps differed or the loss did not halve.
inline int verdict(int bad, const std::vector<double>& got) {
  if (bad) std::printf("FAILED: %d steps differ from the single-process reference\n", bad);
  if (!(got.back() < 0.5 * got.front())) {
    std::printf("FAILED: the loss did not fall below half (%.6f -> %.6f)\n", got.front(), got.back());
    ++bad;
  }
  return bad ? 1 : 0;
}

/// main() of example `name`: [--ranks N] [--steps N] [--transport inproc|mpi]
/// [--lr X] (into `lr`); runs run_rank(comm, steps) on every rank and
/// returns rank 0's status.
template <class Run> int main(const char* name, int argc, char** argv, double& lr, Run run_rank) {
  int ranks = 4, steps = 100;
  std::string transport = "inproc";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--ranks") ranks = std::stoi(v);
    else if (k == "--steps") steps = std::stoi(v);
    else if (k == "--transport") transport = v;
    else if (k == "--lr") lr = std::stod(v);
    else {
      std::fprintf(stderr, "usage: %s [--ranks N] [--steps N] [--transport inproc|mpi] [--lr X]\n", name);
      return 2;
    }
  }
  try {
#if GRADSYNC_EXAMPLE_MPI
    if (transport == "mpi") {
      gradsync::mpi::session s(argc, argv);
      auto comm = s.world();
      return run_rank(comm, steps);
    }
#endif
    if (transport != "inproc") {
      std::fprintf(stderr, "%s: transport '%s' not available\n", name, transport.c_str());
      return 2;
    }
    int status = 0;
    gradsync::inproc::run(ranks, [&](gradsync::inproc::communicator& c) {
      const int rc = run_rank(c, steps);
      if (c.rank() == 0) status = rc;
    });
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

} // namespace example
