// gradsync-bench: how every sweep times its rows (collective_sweep.cpp,
// alltoall.cpp).
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include <gradsync/collectives.hpp>

#include "common.hpp"

namespace gradsync::bench {

// Seconds per call: the timed iterations run in `timing_batches` batches
// (fewer when there are fewer iterations); a batch's time is its mean per
// call, the maximum over ranks (the slowest rank bounds a training step);
// the row reports the median batch. On a shared VM one preemption inflates a
// whole mean by tens of percent; the median keeps it out of the row, while
// each batch is still a mean over back-to-back calls as nccl-tests times.
constexpr int timing_batches = 5;

template <transport C, class F> double time_calls(C& c, F& call, const iteration_plan& pl) {
  barrier(c);
  for (int i = 0; i < pl.warmup; ++i) call();
  const int batches = std::min(timing_batches, pl.iters);
  std::vector<double> t(static_cast<std::size_t>(batches));
  for (int b = 0; b < batches; ++b) {
    const int n = pl.iters / batches + (b < pl.iters % batches ? 1 : 0);
    barrier(c);
    const double t0 = now();
    for (int i = 0; i < n; ++i) call();
    t[static_cast<std::size_t>(b)] = (now() - t0) / n;
  }
  allreduce(c, std::span<double>(t), op::max{});
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

} // namespace gradsync::bench
