// gradsync: the pairwise exchange schedule of alltoall(v): p - 1 steps; at
// step k rank r sends its block for r + k and receives the block of r - k
// (mod p), one pair of messages in flight at a time. Each step waits for its
// own pair only, so a rank never holds more than one block's worth of
// outstanding traffic, and every peer pair meets at a fixed step: the
// schedule for large blocks, where the messages' bandwidth dominates and
// posting everything at once only makes the ranks' messages contend.
// Cost: (p - 1) (alpha + beta m) for blocks of m bytes.
#pragma once

#include "exchange.hpp"

namespace gradsync::algo::alltoall_pairwise {

/// Runs the exchange of layout `l` (every peer a block, zero bytes included).
template <transport C> void run(C& c, const exchange::layout& l, int tag) {
  const int p = c.size(), r = c.rank();
  exchange::copy_self(l, r);
  for (int k = 1; k < p; ++k) {
    exchange::pending<C> step;
    step.post(c, l, (r + k) % p, (r - k + p) % p, tag);
    step.wait();
  }
}

} // namespace gradsync::algo::alltoall_pairwise
