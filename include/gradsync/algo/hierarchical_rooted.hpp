// gradsync: two-level broadcast and reduce for ranks in groups (nodes).
// Broadcast: the root sends to one leader per other group over the slow
// links (a flat rooted schedule among the N leaders, the root leading its
// own group), then each leader broadcasts inside its group over the fast
// ones. Reduce: the reverse (inside each group to its leader, then among
// the leaders to the root). Each byte crosses a group boundary once per
// group instead of once per rank, and the flat schedules of each level are
// the cost model's choice for that level's link and rank count
// (cost_model::best_flat_rooted), the same on every rank of the level.
//
// Determinism: each group's partial is one value from the intra-group
// schedule, combined across groups in the inter-group schedule's fixed
// order, so the root's result does not depend on timing. avg sums at both
// levels and divides once, at the root, by the whole rank count.
#pragma once

#include <cstddef>
#include <vector>

#include "../exec/executor.hpp"
#include "../transport/subgroup.hpp"
#include "chain.hpp"
#include "hierarchical.hpp"
#include "scatter_allgather.hpp"
#include "segment_op.hpp"
#include "select.hpp"
#include "tree.hpp"

namespace gradsync::algo::hierarchical_rooted {

/// The leaders: per group, its first member, or the root in the root's group.
inline std::vector<int> leaders(const rank_groups& g, int root) {
  std::vector<int> l;
  const int rg = g.group_of[static_cast<std::size_t>(root)];
  for (int k = 0; k < g.count(); ++k) l.push_back(k == rg ? root : g.members[static_cast<std::size_t>(k)].front());
  return l;
}

namespace detail {
inline int index_of(const std::vector<int>& v, int x) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] == x) return static_cast<int>(i);
  return -1;
}
} // namespace detail

/// Scratch elements a reduce of `count` elements of `elem` bytes needs on
/// any rank: a leader's partial plus the larger of the two levels' flat
/// reduce scratch (for at most `groups` leaders and `group_size` members).
inline std::size_t reduce_scratch_elems(std::size_t count, std::size_t elem_bytes, std::size_t seg, int group_size,
                                        int groups) {
  std::size_t m = 0;
  for (const int p : {group_size, groups})
    m = std::max({m, tree::reduce_scratch_elems(count, elem_bytes, seg, p),
                  chain::reduce_scratch_elems(count, elem_bytes, seg, p)});
  return count + m;
}

// Runs flat rooted schedule `a` (tree, ring = chain, scatter_allgather) of a
// broadcast on `c`.
template <transport C, executor E, class T>
void flat_broadcast(C& c, E& ex, algorithm a, T* data, std::size_t n, int root, std::size_t seg, int tag) {
  if (c.size() <= 1 || n == 0) return;
  if (a == algorithm::tree) {
    tree::broadcast(c, ex, data, n, root, seg, tag);
  } else if (a == algorithm::scatter_allgather) {
    const typed_reduce<T, op::sum, E> sop{ex, op::sum{}, c.size()}; // copies only
    scatter_allgather::broadcast(c, sop, data, n, root, seg, tag);
  } else {
    chain::broadcast(c, ex, data, n, root, seg, tag);
  }
}

/// Broadcast of `n` elements from `root` over groups `g` (the same on every
/// rank); `m` chooses each level's flat schedule.
template <transport C, executor E, class T>
void broadcast(C& c, E& ex, T* data, std::size_t n, int root, const rank_groups& g, const cost_model& m,
               std::size_t seg, int tag) {
  const int r = c.rank();
  const std::vector<int> lead = leaders(g, root);
  const int mine = g.group_of[static_cast<std::size_t>(r)];
  const std::size_t bytes = n * sizeof(T);
  if (const int at = detail::index_of(lead, r); at >= 0 && g.count() > 1) {
    subgroup<C> across(c, lead, 0);
    const algorithm a = m.best_flat_rooted(bytes, g.count(), m.global, false, seg).first;
    flat_broadcast(across, ex, a, data, n, detail::index_of(lead, root), seg, tag);
  }
  const auto& members = g.members[static_cast<std::size_t>(mine)];
  if (members.size() > 1) {
    subgroup<C> inside(c, members, 0);
    const algorithm a = m.best_flat_rooted(bytes, static_cast<int>(members.size()), m.local, false, seg).first;
    flat_broadcast(inside, ex, a, data, n, detail::index_of(members, lead[static_cast<std::size_t>(mine)]), seg, tag);
  }
}

/// Reduce of `n` elements to `root` over groups `g`: `out` is written at the
/// root only; `scratch` reduce_scratch_elems(n, sizeof(T), seg, largest
/// group, groups) elements.
template <transport C, executor E, class T, class Op>
void reduce(C& c, E& ex, const T* in, T* out, std::size_t n, int root, Op op, const rank_groups& g,
            const cost_model& m, std::size_t seg, int tag, T* scratch) {
  const int r = c.rank();
  const std::vector<int> lead = leaders(g, root);
  const int mine = g.group_of[static_cast<std::size_t>(r)];
  const std::size_t bytes = n * sizeof(T);
  const int at = detail::index_of(lead, r);
  // A leader's partial: the root's output, another leader's scratch.
  T* partial = r == root ? out : scratch;
  T* work = scratch + n;
  // Both levels combine with the partial operator (avg sums); the root
  // finishes once with the total rank count.
  const hierarchical::partial_op<Op> pop{};
  auto flat = [&](auto& sub, algorithm a, const T* from, T* to, int sub_root) {
    if (a == algorithm::tree) tree::reduce(sub, ex, from, to, n, sub_root, pop, seg, tag, work);
    else chain::reduce(sub, ex, from, to, n, sub_root, pop, seg, tag, work);
  };
  const auto& members = g.members[static_cast<std::size_t>(mine)];
  const T* have = in;
  if (members.size() > 1) {
    subgroup<C> inside(c, members, 0);
    const algorithm a = m.best_flat_rooted(bytes, static_cast<int>(members.size()), m.local, true, seg).first;
    flat(inside, a, in, partial, detail::index_of(members, lead[static_cast<std::size_t>(mine)]));
    have = partial;
  } else if (at >= 0 && n != 0 && partial != in) {
    ex.copy(partial, in, n);
    have = partial;
  }
  if (at >= 0 && g.count() > 1) {
    subgroup<C> across(c, lead, 0);
    const algorithm a = m.best_flat_rooted(bytes, g.count(), m.global, true, seg).first;
    flat(across, a, have, partial, detail::index_of(lead, root));
  }
  if (r == root) ex.finish(out, n, op, c.size());
}

} // namespace gradsync::algo::hierarchical_rooted
