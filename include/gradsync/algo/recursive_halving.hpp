// gradsync: reduce-scatter by recursive halving (the first half of
// Rabenseifner's allreduce, on per-rank blocks). In step k every surviving
// rank swaps half of the blocks it still reduces with the rank p'/2^(k+1)
// away and combines the half it keeps: lg p' messages and (p'-1)/p' of the
// data per rank, latency-optimal where p is a power of two. Other rank
// counts fold first: an even rank r < 2(p - p') hands its whole input to
// r + 1, which reduces both ranks' blocks and hands block r back at the end.
//
// Determinism: partners combine op(lower, higher); each block is finished on
// one rank.
#pragma once

#include <cstddef>

#include "../core/partition.hpp"
#include "pairwise.hpp"
#include "schedule.hpp"
#include "segment_op.hpp"

namespace gradsync::algo::recursive_halving {

/// Scratch bytes of reduce_scatter for `blocks` (p blocks) of elements of
/// T under the typed reduction: a work copy of the input and one receive
/// segment (pairwise::work_copy_scratch_bytes).
template <class T> std::size_t scratch_bytes(const partition& blocks, std::size_t seg_bytes, int ranks) {
  return pairwise::work_copy_scratch_bytes<T>(blocks, seg_bytes, ranks);
}

/// Reduce-scatter over the typed reduction `sop`: `in` holds p blocks laid
/// out as `blocks` (one per rank); rank r gets the finished reduction of
/// block r in `own` (blocks.size(r) elements; may alias block r of `in`).
/// `scratch`: scratch_bytes<T>(...), aligned for the elements.
template <transport C, segment_op S>
void reduce_scatter(C& c, const S& sop, const typename S::value_type* in, typename S::value_type* own,
                    const partition& blocks, std::size_t seg_bytes, int tag, std::byte* scratch) {
  using T = typename S::value_type;
  static_assert(S::exact && S::in_place_copy, "a typed reduction: the scratch holds elements");
  const int p = c.size(), r = c.rank();
  auto off = [&](int b) { return blocks.offset(static_cast<std::size_t>(b)); };
  const std::size_t mine_n = blocks.size(static_cast<std::size_t>(r));
  if (p == 1 || blocks.count == 0) {
    if (mine_n != 0) sop.local(in, own, mine_n);
    return;
  }
  const pairwise::fold f(p);
  const std::size_t seg = pairwise::seg_elems(sizeof(T), seg_bytes);
  T* w = reinterpret_cast<T*>(scratch);
  std::byte* seg_scratch = scratch + blocks.count * sizeof(T);
  const T* src = in; // the data this rank combines from: its input, then W
  if (r < 2 * f.rem) {
    if (r % 2 == 0) { // folded: the whole input out, block r back finished
      pairwise::exchange_combine(c, sop, r + 1, true, in, blocks.count, in, w, 0, seg, tag, seg_scratch);
      pairwise::exchange_copy(c, sop, r + 1, static_cast<const T*>(own), 0, own, mine_n, seg, tag, seg_scratch);
      return;
    }
    pairwise::exchange_combine(c, sop, r - 1, false, in, 0, in, w, blocks.count, seg, tag, seg_scratch);
    src = w;
  }
  const int v = f.inner(r);
  int lo = 0, hi = f.pof2; // survivors whose blocks this rank still reduces
  for (int mask = f.pof2 / 2; mask > 0; mask /= 2) {
    const int mid = lo + mask;
    const bool lower = (v & mask) == 0; // the lower rank keeps the lower half
    const int klo = lower ? lo : mid, khi = lower ? mid : hi, slo = lower ? mid : lo, shi = lower ? hi : mid;
    const std::size_t kb = off(f.first(klo)), sb = off(f.first(slo));
    pairwise::exchange_combine(c, sop, f.outer(v ^ mask), lower, src + sb, off(f.first(shi)) - sb, src + kb, w + kb,
                               off(f.first(khi)) - kb, seg, tag, seg_scratch);
    src = w;
    lo = klo;
    hi = khi;
  }
  // W now holds the finished reduction of the blocks of the ranks v stands for.
  if (r < 2 * f.rem) { // block r - 1 to the folded partner
    const std::size_t b = off(r - 1), n = off(r) - b;
    sop.finish(w + b, n);
    pairwise::exchange_copy(c, sop, r - 1, static_cast<const T*>(w + b), n, own, 0, seg, tag, seg_scratch);
  }
  sop.finish(w + off(r), mine_n);
  sop.assign(own, w + off(r), mine_n);
}

} // namespace gradsync::algo::recursive_halving
