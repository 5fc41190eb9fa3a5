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

#include "pairwise.hpp" // (with schedule.hpp and segment_op.hpp)

namespace gradsync::algo::recursive_doubling {

/// Allreduce over segment operation `sop` (elements T) of `count` elements
/// from `in` into `out` (may be equal). `scratch`: pairwise::scratch_bytes(sop,
/// count, ...), which for the typed reduction is pairwise::scratch_elems(...).
template <transport C, segment_op S, class T = typename S::value_type>
void allreduce(C& c, const S& sop, const T* in, T* out, std::size_t count, std::size_t seg_bytes, int tag,
               std::byte* scratch) {
  if (pairwise::trivial(sop, c.size(), in, out, count)) return;
  const T* const whole = out; // each step sends the whole current vector
  pairwise::folded(c, sop, in, out, count, seg_bytes, tag, scratch, [&](int v, const pairwise::fold& f, std::size_t seg) {
    for (int mask = 1; mask < f.pof2; mask <<= 1)
      pairwise::exchange_combine(c, sop, f.outer(v ^ mask), v < (v ^ mask), whole, count, whole, out, count, seg, tag,
                                 scratch);
  });
  sop.finish(out, count); // once, on identical values everywhere
}

} // namespace gradsync::algo::recursive_doubling
