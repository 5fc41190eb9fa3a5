// gradsync: dissemination barrier (Hensgen, Finkel & Manber): ceil(lg p)
// rounds; in round k rank r signals r + 2^k and waits for r - 2^k. No rank
// leaves before every rank has entered.
#pragma once

#include <cstddef>

#include "schedule.hpp"

namespace gradsync::algo::dissemination {

/// Blocks until every rank of `c` has called barrier.
template <transport C> void barrier(C& c, int tag) {
  const int p = c.size(), r = c.rank();
  for (int d = 1; d < p; d *= 2) {
    auto rr = c.irecv(std::span<std::byte>{}, mod(r - d, p), tag);
    auto sr = c.isend(std::span<const std::byte>{}, mod(r + d, p), tag);
    rr.wait();
    sr.wait();
  }
}

} // namespace gradsync::algo::dissemination
