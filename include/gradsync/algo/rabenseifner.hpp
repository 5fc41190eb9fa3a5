// gradsync: Rabenseifner's allreduce. A reduce-scatter by recursive halving
// (step k: swap half of the current range with the rank p/2^(k+1) away and
// reduce the half kept) leaves each rank one block of the result; an
// allgather by recursive doubling spreads them. 2 lg p messages and
// 2 (p-1)/p n bytes per rank: bandwidth-optimal with logarithmic latency.
// Other rank counts fold onto a power of two first; blocks may be empty
// (count < ranks), in which case nothing is sent for them.
//
// Determinism: partners combine op(lower, higher); each block is finished on
// one rank and copied to all others.
#pragma once

#include <cstddef>

#include "../core/ops.hpp"
#include "../exec/executor.hpp"
#include "pairwise.hpp"
#include "schedule.hpp"
#include "segment_op.hpp"

namespace gradsync::algo::rabenseifner {

/// Allreduce over segment operation `sop` of `count` elements from `in` into
/// `out` (may be equal); `scratch` holds pairwise::scratch_bytes(sop, count, ...)
/// (pairwise::scratch_elems(...) elements of the typed reduction).
template <transport C, segment_op S>
void allreduce(C& c, const S& sop, const typename S::value_type* in, typename S::value_type* out,
               std::size_t count, std::size_t seg_bytes, int tag, std::byte* scratch) {
  using T = typename S::value_type;
  pairwise::folded(c, sop, in, out, count, seg_bytes, tag, scratch, [&](int v, const pairwise::fold& f, std::size_t seg) {
    const partition blocks{count, static_cast<std::size_t>(f.pof2)};
    auto at = [&](std::size_t b) { return out + blocks.offset(b); };
    auto len = [&](std::size_t lo, std::size_t hi) { return blocks.offset(hi) - blocks.offset(lo); };
    std::size_t lo = 0, hi = static_cast<std::size_t>(f.pof2); // blocks this rank still reduces
    for (int mask = f.pof2 / 2; mask > 0; mask /= 2) {
      const int w = v ^ mask;
      const std::size_t mid = lo + (hi - lo) / 2;
      const bool lower = (v & mask) == 0; // the lower rank keeps the lower half
      const std::size_t klo = lower ? lo : mid, khi = lower ? mid : hi;
      const std::size_t slo = lower ? mid : lo, shi = lower ? hi : mid;
      pairwise::exchange_combine(c, sop, f.outer(w), lower, static_cast<const T*>(at(slo)), len(slo, shi),
                                 static_cast<const T*>(at(klo)), at(klo), len(klo, khi), seg, tag, scratch);
      lo = klo;
      hi = khi;
    }
    sop.finish(at(lo), len(lo, hi)); // block v is final
    for (int mask = 1; mask < f.pof2; mask *= 2) {
      const int w = v ^ mask;
      const auto m = static_cast<std::size_t>(mask);
      const std::size_t plo = (v & mask) ? lo - m : hi; // the partner's range adjoins ours
      pairwise::exchange_copy(c, sop, f.outer(w), static_cast<const T*>(at(lo)), len(lo, hi), at(plo),
                              len(plo, plo + m), seg, tag, scratch);
      lo = std::min(lo, plo);
      hi = lo + 2 * m;
    }
  });
}

} // namespace gradsync::algo::rabenseifner
