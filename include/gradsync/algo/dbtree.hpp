// gradsync: pipelined double binary tree allreduce (the idea of NCCL's tree
// algorithm). Two binary trees each carry half of the data: tree A is the
// heap-ordered tree over ranks 0..p-1 (children of node i: 2i+1, 2i+2), tree
// B is its mirror (rank r is node p-1-r). The interior nodes of A are ranks
// below p/2, those of B ranks above, so every rank is a leaf in at least one
// tree and the two trees together load every link evenly. Each half moves in
// segments: reduced up the tree, then broadcast down, pipelined.
//
// Schedule: in step s a node of height h reduces segment s - h and a node of
// depth d forwards segment s - H - d downwards (H: the root's height). Every
// wait is therefore for a message its peer posted in an earlier step, so the
// pipeline never stalls on a chain of same-step waits and cannot deadlock.
// Time ~ (nseg + 2H) steps; bandwidth ~ 2n bytes per rank.
//
// Determinism: a node combines op(op(own, left child), right child); each
// half's result comes from its root and is copied down, so every rank holds
// the same bits. The trees use tags `tag` and `tag + 1`.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <vector>

#include "../core/ops.hpp"
#include "../exec/executor.hpp"
#include "pairwise.hpp"
#include "schedule.hpp"

namespace gradsync::algo::dbtree {

/// Scratch elements of allreduce: one receive segment per child.
inline std::size_t allreduce_scratch_elems(std::size_t count, std::size_t elem_bytes,
                                           std::size_t seg_bytes, int ranks) {
  if (ranks <= 1) return 0;
  return 2 * segmentation::make(partition{count, 2}, elem_bytes, seg_bytes).max_seg;
}

/// One rank's place in a heap-ordered binary tree of `p` nodes.
struct heap_node {
  int node = 0, parent = -1, height = 0, depth = 0;
  std::array<int, 2> child{-1, -1};

  heap_node(int p, int i) : node(i) {
    if (i > 0) parent = (i - 1) / 2;
    for (int k = 0; k < 2; ++k)
      if (2 * i + 1 + k < p) child[static_cast<std::size_t>(k)] = 2 * i + 1 + k;
    for (long long c = 2LL * i + 1; c < p; c = 2 * c + 1) ++height; // leftmost path is longest
    for (int a = i; a > 0; a = (a - 1) / 2) ++depth;
  }
};

/// Allreduce of `count` elements from `in` into `out` (may be equal).
template <transport C, executor E, element T, reduce_op Op>
void allreduce(C& c, E& ex, const T* in, T* out, std::size_t count, Op op, std::size_t seg_bytes, int tag,
               T* scratch) {
  const int p = c.size(), r = c.rank();
  if (pairwise::trivial(ex, p, in, out, count, op)) return;
  const auto g = segmentation::make(partition{count, 2}, sizeof(T), seg_bytes);
  const auto nseg = static_cast<long long>(g.nseg);
  const int H = heap_node(p, 0).height;
  // Tree t: this rank's node and the real rank of a node.
  const std::array<heap_node, 2> me{heap_node(p, r), heap_node(p, p - 1 - r)};
  auto rank_of = [&](int t, int node) { return t == 0 ? node : p - 1 - node; };
  using req = request_t<C>;
  std::array<std::vector<std::optional<req>>, 2> up; // per tree, per segment
  for (auto& u : up) u.resize(g.nseg);
  std::vector<req> down;
  for (long long s = 0; s < nseg + 2LL * H + 1; ++s)
    for (int t = 0; t < 2; ++t) {
      const auto& m = me[static_cast<std::size_t>(t)];
      const auto b = static_cast<std::size_t>(t);
      const int ttag = tag + t;
      if (const long long j = s - m.height; j >= 0 && j < nseg) { // reduce upwards
        const auto js = static_cast<std::size_t>(j);
        const std::size_t off = g.offset(b, js), n = g.size(b, js);
        if (n) {
          const T* cur = in + off;
          for (std::size_t k = 0; k < 2; ++k)
            if (m.child[k] >= 0) {
              T* slot = scratch + k * g.max_seg;
              recv(c, slot, n, rank_of(t, m.child[k]), ttag).wait();
              ex.reduce(out + off, cur, static_cast<const T*>(slot), n, op);
              cur = out + off;
            }
          if (m.parent >= 0) {
            if (cur != in + off) ex.fence();
            up[b][js].emplace(send(c, cur, n, rank_of(t, m.parent), ttag));
          } else {
            ex.finish(out + off, n, op, p);
          } // the root has children since p >= 2
        }
      }
      if (const long long j = s - H - m.depth; j >= 0 && j < nseg) { // broadcast downwards
        const auto js = static_cast<std::size_t>(j);
        const std::size_t off = g.offset(b, js), n = g.size(b, js);
        if (n) {
          if (m.parent >= 0) {
            if (auto& u = up[b][js]) { u->wait(); u.reset(); } // out[off..] may be in flight
            recv(c, out + off, n, rank_of(t, m.parent), ttag).wait();
          } else {
            ex.fence(); // the root's finished segment
          }
          for (int ch : m.child)
            if (ch >= 0) down.push_back(send(c, static_cast<const T*>(out + off), n, rank_of(t, ch), ttag));
        }
      }
    }
  wait_all(down);
}

} // namespace gradsync::algo::dbtree
