// gradsync: recursive doubling allreduce. In step k every rank swaps its whole
// current vector with the rank 2^k away and combines, so after lg p steps all
// hold the reduction: lg p messages of the full size, the least latency of
// any schedule, for small messages. Other rank counts fold first (the extra
// ranks hand their data to a partner and receive the result at the end:
// two more steps).
//
// Determinism: partners combine op(lower, higher), so after step k all ranks
// of each aligned block of 2^k survivors hold bitwise equal values.
#pragma once

#include <cstddef>

#include "../core/ops.hpp"
#include "../exec/executor.hpp"
#include "pairwise.hpp"
#include "schedule.hpp"

namespace gradsync::algo::recursive_doubling {

/// Scratch elements of allreduce: one receive segment.
inline constexpr auto allreduce_scratch_elems = pairwise::scratch_elems;

/// Allreduce of `count` elements from `in` into `out` (may be equal).
template <transport C, executor E, element T, reduce_op Op>
void allreduce(C& c, E& ex, const T* in, T* out, std::size_t count, Op op, std::size_t seg_bytes, int tag,
               T* scratch) {
  pairwise::folded(c, ex, in, out, count, op, seg_bytes, tag, scratch, [&](int v, const pairwise::fold& f, std::size_t seg) {
    for (int mask = 1; mask < f.pof2; mask <<= 1) {
      const int w = v ^ mask;
      pairwise::exchange_combine(c, ex, f.outer(w), v < w, static_cast<const T*>(out), count,
                                 static_cast<const T*>(out), out, count, op, seg, tag, scratch);
    }
  });
  ex.finish(out, count, op, c.size()); // once, on identical values everywhere
}

} // namespace gradsync::algo::recursive_doubling
