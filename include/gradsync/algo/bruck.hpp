// gradsync: Bruck's allgather and its mirror, a dissemination reduce-scatter:
// any rank count in ceil(log2 p) rounds (the ring needs p - 1), each rank
// sending (p-1)/p of the data in all, as the ring does. Latency-optimal for
// small and medium blocks on many ranks.
//
// Allgather, round k (d = 2^k): every rank holds blocks r .. r + d - 1
// (mod p) from the rounds before; it sends the first min(d, p - d) of them
// to rank r - d and receives as many, starting at block r + d, from rank
// r + d. Blocks land at their final places (a range
// that wraps past block p-1 moves as two messages), so no rotation pass.
//
// Reduce-scatter runs the dissemination backwards on a work copy W of the
// input rotated so that W[i] is the block meant for rank r + i: while m > 1
// blocks are live, with d = ceil(m/2), every rank sends W[d, m) to rank r + d
// and combines what rank r - d sends into W[0, m - d); then m = d. After
// ceil(log2 p) rounds W[0] is the reduction of block r. Every block is
// combined on one rank only, in an order fixed by p and r.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>

#include "../core/partition.hpp"
#include "pairwise.hpp"
#include "schedule.hpp"
#include "segment_op.hpp"

namespace gradsync::algo::bruck {

/// Rounds of either schedule on p ranks: ceil(log2 p).
constexpr int rounds(int p) { return p <= 1 ? 0 : std::bit_width(static_cast<unsigned>(p - 1)); }

namespace detail {
// Calls f(first, last) for the blocks [b, b + n) taken modulo p: one range,
// or two where it wraps past block p - 1.
template <class F> void wrapped(int b, int n, int p, F&& f) {
  if (b + n <= p) {
    f(b, b + n);
  } else {
    f(b, p);
    f(0, b + n - p);
  }
}
} // namespace detail

/// Allgather over segment operation `sop` (typed copies: its wire form is the
/// elements): rank r holds block r of `out` (laid out as `blocks`, one per
/// rank); afterwards every rank holds all of them. No scratch.
template <transport C, segment_op S>
void allgather(C& c, const S& sop, typename S::value_type* out, const partition& blocks, int tag) {
  static_assert(S::in_place_copy && !S::staged_send, "Bruck's allgather moves elements as they are");
  const int p = c.size(), r = c.rank();
  if (p == 1 || blocks.count == 0) return;
  auto at = [&](int b) { return out + blocks.offset(static_cast<std::size_t>(b)); };
  auto len = [&](int lo, int hi) {
    return blocks.offset(static_cast<std::size_t>(hi)) - blocks.offset(static_cast<std::size_t>(lo));
  };
  sop.fence(); // the own block may have been written by the executor
  request_set<C, 4> q;
  for (int d = 1; d < p; d *= 2) {
    const int n = std::min(d, p - d);
    const int to = mod(r - d, p), from = (r + d) % p;
    detail::wrapped((r + d) % p, n, p, [&](int lo, int hi) {
      if (const std::size_t k = len(lo, hi)) q.add(recv(c, at(lo), k, from, tag));
    });
    detail::wrapped(r, n, p, [&](int lo, int hi) {
      if (const std::size_t k = len(lo, hi)) q.add(send(c, static_cast<const typename S::value_type*>(at(lo)), k, to, tag));
    });
    q.wait();
  }
}

/// Scratch bytes of reduce_scatter for `blocks` (p blocks) of elements of
/// T under the typed reduction: a work copy of the input and one receive
/// segment (pairwise::work_copy_scratch_bytes).
template <class T> std::size_t reduce_scatter_scratch_bytes(const partition& blocks, std::size_t seg_bytes, int ranks) {
  return pairwise::work_copy_scratch_bytes<T>(blocks, seg_bytes, ranks);
}

/// Reduce-scatter over the typed reduction `sop`: `in` holds p blocks laid
/// out as `blocks`; rank r gets the finished reduction of block r in `own`
/// (blocks.size(r) elements; may alias block r of `in`). `scratch`:
/// reduce_scatter_scratch_bytes<T>(...), aligned for the elements. Blocks must
/// be equal in size (the collectives' reduce-scatter): W's offsets are
/// rotated per rank.
template <transport C, segment_op S>
void reduce_scatter(C& c, const S& sop, const typename S::value_type* in, typename S::value_type* own,
                    const partition& blocks, std::size_t seg_bytes, int tag, std::byte* scratch) {
  using T = typename S::value_type;
  static_assert(S::exact && S::in_place_copy, "a typed reduction: the scratch holds elements");
  const int p = c.size(), r = c.rank();
  const std::size_t b = blocks.size(0);
  if (p == 1 || b == 0) {
    if (b != 0) sop.local(in, own, b);
    return;
  }
  const auto ur = static_cast<std::size_t>(r), up = static_cast<std::size_t>(p);
  T* w = reinterpret_cast<T*>(scratch);
  std::byte* seg_scratch = scratch + blocks.count * sizeof(T);
  sop.assign(w, in + ur * b, (up - ur) * b); // W[i] = block r + i (mod p)
  sop.assign(w + (up - ur) * b, in, ur * b);
  const std::size_t seg = pairwise::seg_elems(sizeof(T), seg_bytes);
  for (int m = p; m > 1;) {
    const int d = (m + 1) / 2;
    const auto k = static_cast<std::size_t>(m - d) * b; // W[d, m) out, W[0, m - d) combined
    pairwise::shift_combine(c, sop, (r + d) % p, mod(r - d, p), false, static_cast<const T*>(w + static_cast<std::size_t>(d) * b),
                            k, static_cast<const T*>(w), w, k, seg, tag, seg_scratch);
    m = d;
  }
  sop.finish(w, b);
  sop.assign(own, w, b);
}

} // namespace gradsync::algo::bruck
