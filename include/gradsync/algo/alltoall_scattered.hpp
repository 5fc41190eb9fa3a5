// gradsync: the windowed scattered schedule of alltoall(v): receives and
// sends to `window` peers posted at once, in the pairwise order (r + k for
// the sends, r - k for the receives, so no peer is every rank's first
// target), and the next window once those completed. All peers in flight
// overlap their latencies: the schedule for small and medium blocks, where
// per-message latency dominates; the window bounds the requests and
// unexpected-message buffering a transport holds at once
// (policy::alltoall_window). Cost: ceil((p - 1) / w) alpha + (p - 1) beta m.
#pragma once

#include <algorithm>

#include "../core/policy.hpp"
#include "exchange.hpp"

namespace gradsync::algo::alltoall_scattered {

/// Runs the exchange of layout `l`, at most `window` (>= 1) peers in flight.
template <transport C> void run(C& c, const exchange::layout& l, int tag, int window = policy::alltoall_window) {
  const int p = c.size(), r = c.rank();
  exchange::copy_self(l, r);
  window = std::max(1, window);
  for (int k0 = 1; k0 < p; k0 += window) {
    exchange::pending<C> batch;
    for (int k = k0; k < std::min(p, k0 + window); ++k) batch.post(c, l, (r + k) % p, (r - k + p) % p, tag);
    batch.wait();
  }
}

} // namespace gradsync::algo::alltoall_scattered
