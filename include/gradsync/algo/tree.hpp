// gradsync: binomial trees. Reduce: in round k a rank whose virtual rank
// (distance from the root) has bit k set sends its partial result to the rank
// 2^k below and leaves; the others absorb the partial from 2^k above.
// Broadcast runs the same tree downwards. ceil(lg p) rounds each, so allreduce
// (reduce to rank 0, then broadcast) costs 2 lg p messages of the full size:
// the schedule for small messages.
//
// Determinism: a rank combines op(own partial, child's partial), children in
// a fixed order, so the result depends only on p and the root; allreduce
// broadcasts one rank's bits to all.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "../core/ops.hpp"
#include "../exec/executor.hpp"
#include "pairwise.hpp"
#include "schedule.hpp"

namespace gradsync::algo::tree {

/// Scratch elements of reduce (an accumulator and a receive segment).
inline std::size_t reduce_scratch_elems(std::size_t count, std::size_t elem_bytes,
                                        std::size_t seg_bytes, int ranks) {
  return 2 * pairwise::scratch_elems(count, elem_bytes, seg_bytes, ranks);
}

/// Scratch elements of allreduce (a receive segment; `out` accumulates).
inline constexpr auto allreduce_scratch_elems = pairwise::scratch_elems;

namespace detail {

// One binomial reduction of n elements towards virtual rank 0. `acc` receives
// the partial (the result at the root); leaves send `in` as is.
template <transport C, executor E, element T, reduce_op Op>
void reduce_segment(C& c, E& ex, const T* in, T* acc, T* tmp, std::size_t n, int root, Op op, int tag) {
  const int p = c.size(), v = mod(c.rank() - root, p);
  const T* cur = in;
  for (int mask = 1; mask < p; mask <<= 1) {
    if (v & mask) {
      if (cur != in) ex.fence();
      send(c, cur, n, mod(v - mask + root, p), tag).wait();
      return;
    }
    if (v + mask < p) {
      recv(c, tmp, n, mod(v + mask + root, p), tag).wait();
      ex.reduce(acc, cur, static_cast<const T*>(tmp), n, op);
      cur = acc;
    }
  }
}

} // namespace detail

/// Reduce `count` elements of every rank's `in` into `out` at `root` (`out`
/// is not touched elsewhere). `scratch` holds reduce_scratch_elems(...).
template <transport C, executor E, element T, reduce_op Op>
void reduce(C& c, E& ex, const T* in, T* out, std::size_t count, int root, Op op, std::size_t seg_bytes,
            int tag, T* scratch) {
  const int p = c.size();
  if (pairwise::trivial(ex, p, in, out, count, op)) return;
  const std::size_t seg = pairwise::seg_elems(sizeof(T), seg_bytes);
  const bool at_root = c.rank() == root;
  for (std::size_t off = 0; off < count; off += seg) {
    const std::size_t n = std::min(seg, count - off);
    T* acc = at_root ? out + off : scratch + std::min(seg, count); // after the receive segment
    detail::reduce_segment(c, ex, in + off, acc, scratch, n, root, op, tag);
    if (at_root) ex.finish(acc, n, op, p);
  }
}

/// Broadcast `count` elements of `data` from `root`, segment by segment (a
/// rank forwards segment j while segment j+1 is on its way).
template <transport C, executor E, element T>
void broadcast(C& c, E& ex, T* data, std::size_t count, int root, std::size_t seg_bytes, int tag) {
  const int p = c.size(), v = mod(c.rank() - root, p);
  if (p == 1 || count == 0) return;
  ex.fence(); // the root's data may have been written by the executor
  int parent = -1, mask = 1;
  for (; mask < p; mask <<= 1)
    if (v & mask) {
      parent = mod(v - mask + root, p);
      break;
    }
  std::vector<int> children; // largest subtree first: it has the most to forward
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < p) children.push_back(mod(v + mask + root, p));
  const std::size_t seg = pairwise::seg_elems(sizeof(T), seg_bytes);
  std::vector<request_t<C>> sends;
  for (std::size_t off = 0; off < count; off += seg) {
    const std::size_t n = std::min(seg, count - off);
    if (parent >= 0) recv(c, data + off, n, parent, tag).wait();
    for (int ch : children) sends.push_back(send(c, static_cast<const T*>(data + off), n, ch, tag));
  }
  wait_all(sends);
}

/// Allreduce: binomial reduce to rank 0 (accumulating in `out`), then
/// binomial broadcast. `scratch` holds allreduce_scratch_elems(...).
template <transport C, executor E, element T, reduce_op Op>
void allreduce(C& c, E& ex, const T* in, T* out, std::size_t count, Op op, std::size_t seg_bytes, int tag,
               T* scratch) {
  const int p = c.size();
  if (pairwise::trivial(ex, p, in, out, count, op)) return;
  const std::size_t seg = pairwise::seg_elems(sizeof(T), seg_bytes);
  for (std::size_t off = 0; off < count; off += seg) {
    const std::size_t n = std::min(seg, count - off);
    detail::reduce_segment(c, ex, in + off, out + off, scratch, n, 0, op, tag);
  }
  if (c.rank() == 0) ex.finish(out, count, op, p);
  broadcast(c, ex, out, count, 0, seg_bytes, tag);
}

} // namespace gradsync::algo::tree
