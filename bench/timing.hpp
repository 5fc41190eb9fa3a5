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
// Under simulation every rank reads one clock (SMPI's), so a batch runs from
// the moment its last rank starts it to the moment its last rank ends it:
// the barrier's exit skew would otherwise add to every small row, ours and
// MPI's alike (at 256 simulated ranks, `shared`, 8 ranks a node, rank 0
// leaves the dissemination barrier three inter-node hops, ~64 us, after
// rank 255; a 1-call 8 B alltoall then timed 128 us where its three phases
// took 65).
constexpr int timing_batches = 5;
#if defined(GRADSYNC_BENCH_SIM)
constexpr bool one_clock = true;
#else
constexpr bool one_clock = false;
#endif

/// Seconds per call of one batch of `n` calls that this rank ran from `t0`
/// to `t1`, agreed by all ranks (the slowest rank's mean; one clock: from the
/// last start to the last end). A collective call.
template <transport C> double batch_seconds(C& c, double t0, double t1, int n) {
  double t[2] = {one_clock ? t1 : (t1 - t0) / n, t0};
  allreduce(c, std::span<double>(t, 2), op::max{});
  return one_clock ? (t[0] - t[1]) / n : t[0];
}

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
    t[static_cast<std::size_t>(b)] = batch_seconds(c, t0, now(), n);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

} // namespace gradsync::bench
