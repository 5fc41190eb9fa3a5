// gradsync: van de Geijn's broadcast for large messages: the root scatters
// p blocks down a binomial tree (block r to rank r, ceil(log2 p) rounds),
// then the ring allgather spreads them. Each rank receives about 2 (p-1)/p
// of the data against the binomial tree's lg p copies of all of it, and no
// rank sends more than that either: what MPICH and Open MPI run for long
// broadcasts.
//
// The tree is numbered relative to the root (v = r - root mod p): rank v
// receives the blocks of its subtree, v .. v + lowbit(v) - 1 (relative),
// from v - lowbit(v), and hands each child v + m (m = lowbit(v)/2, ..., 1)
// the blocks v + m .. v + 2m - 1. Relative block ranges are real ranks
// shifted by the root, so a range that wraps past rank p-1 moves as two
// messages.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>

#include "../core/partition.hpp"
#include "ring.hpp"
#include "schedule.hpp"
#include "segment_op.hpp"

namespace gradsync::algo::scatter_allgather {

/// Broadcast of `count` elements of `data` from `root` over `sop` (typed
/// copies: its wire form is the elements); every other rank's `data`
/// receives them. `seg_bytes` is the ring allgather's pipeline segment. No
/// scratch.
template <transport C, segment_op S>
void broadcast(C& c, const S& sop, typename S::value_type* data, std::size_t count, int root, std::size_t seg_bytes,
               int tag) {
  static_assert(S::in_place_copy && !S::staged_send, "the scatter moves elements as they are");
  using T = typename S::value_type;
  const int p = c.size(), r = c.rank();
  if (p == 1 || count == 0) return;
  const partition blocks{count, static_cast<std::size_t>(p)};
  const int v = mod(r - root, p);
  // Calls f(first element, elements) for the blocks of relative ranks [lo, hi).
  auto ranges = [&](int lo, int hi, auto&& f) {
    const int a = (lo + root) % p, n = hi - lo;
    auto piece = [&](int x, int y) {
      const std::size_t b = blocks.offset(static_cast<std::size_t>(x));
      if (const std::size_t k = blocks.offset(static_cast<std::size_t>(y)) - b) f(b, k);
    };
    if (a + n <= p) {
      piece(a, a + n);
    } else {
      piece(a, p);
      piece(0, a + n - p);
    }
  };
  const int sub = v == 0 ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(p))) : (v & -v);
  if (v != 0) {
    request_set<C, 2> q;
    ranges(v, std::min(v + sub, p), [&](std::size_t b, std::size_t k) { q.add(recv(c, data + b, k, mod(v - sub + root, p), tag)); });
    q.wait();
  } else {
    sop.fence(); // the root's data may have been written by the executor
  }
  // One child at a time, largest subtree first: the first child forwards
  // its half while the next receives (all at once, the children shared the
  // sender's link and the first one started forwarding last: 1.4x the
  // sequential time at 16 MiB on 64 simulated ranks).
  for (int m = sub / 2; m >= 1; m /= 2)
    if (v + m < p) {
      const bool more = m > 1 && v + 1 < p; // the child at m = 1 comes last
      ranges(v + m, std::min(v + 2 * m, p), [&](std::size_t b, std::size_t k) {
        send_in_turn(c, std::as_bytes(std::span<const T>(data + b, k)), (v + m + root) % p, tag, more);
      });
    }
  ring::allgather(c, sop, data, blocks, seg_bytes, tag, nullptr);
}

} // namespace gradsync::algo::scatter_allgather
