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

#include "../core/partition.hpp"

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

/// Allgather by recursive doubling over `sop` (typed copies): rank r holds
/// block r of `out` (laid out as `blocks`, one per rank); in step k every
/// surviving rank swaps the blocks of its aligned group of 2^k survivors
/// with the rank 2^k away, so after lg p' steps all hold every block. Other
/// rank counts fold: an even rank r < 2(p - p') hands its block to r + 1
/// first and receives the rest from it at the end. No scratch.
template <transport C, segment_op S>
void allgather(C& c, const S& sop, typename S::value_type* out, const partition& blocks, int tag) {
  static_assert(S::in_place_copy && !S::staged_send, "recursive doubling's allgather moves elements as they are");
  using T = typename S::value_type;
  const int p = c.size(), r = c.rank();
  if (p == 1 || blocks.count == 0) return;
  const pairwise::fold f(p);
  auto off = [&](int b) { return blocks.offset(static_cast<std::size_t>(b)); };
  // Whole ranges move as one message each (typed copies need no segments).
  auto swap = [&](int peer, int slo, int shi, int rlo, int rhi) {
    pairwise::exchange_copy(c, sop, peer, static_cast<const T*>(out + off(slo)), off(shi) - off(slo), out + off(rlo),
                            off(rhi) - off(rlo), blocks.count, tag, nullptr);
  };
  if (r < 2 * f.rem && r % 2 == 0) { // folded: block r in, everything else back
    swap(r + 1, r, r + 1, r, r);
    request_set<C, 2> q;
    if (off(r) > 0) q.add(recv(c, out, off(r), r + 1, tag));
    if (off(p) > off(r + 1)) q.add(recv(c, out + off(r + 1), off(p) - off(r + 1), r + 1, tag));
    q.wait();
    return;
  }
  if (r < 2 * f.rem) swap(r - 1, r, r, r - 1, r); // the folded partner's block
  const int v = f.inner(r);
  for (int mask = 1; mask < f.pof2; mask <<= 1) {
    const int mine = v & ~(mask - 1), theirs = (v ^ mask) & ~(mask - 1);
    swap(f.outer(v ^ mask), f.first(mine), f.first(mine + mask), f.first(theirs), f.first(theirs + mask));
  }
  if (r < 2 * f.rem) { // the folded partner gets all but its own block, as two messages
    sop.fence();
    request_set<C, 2> q;
    if (off(r - 1) > 0) q.add(send(c, static_cast<const T*>(out), off(r - 1), r - 1, tag));
    if (off(p) > off(r)) q.add(send(c, static_cast<const T*>(out + off(r)), off(p) - off(r), r - 1, tag));
    q.wait();
  }
}

} // namespace gradsync::algo::recursive_doubling
