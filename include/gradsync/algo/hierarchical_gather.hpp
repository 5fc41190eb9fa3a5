// gradsync: two-level allgather and reduce-scatter for ranks in groups
// (nodes), leader-based. Allgather: the members of each group gather their
// blocks among themselves (fast links), the groups' leaders allgather the
// groups' blocks (one message stream per leader over the slow links instead
// of one per rank), and each leader broadcasts the whole result inside its
// group. Reduce-scatter: the reverse (each group reduces the whole vector to
// its leader, the leaders reduce-scatter it by group, each leader sends its
// members their blocks). Inter-group traffic per group is the minimum, and
// the number of messages crossing groups falls from O(p) per rank to
// O(groups) per leader: what wins where ranks are many and messages small.
//
// Groups may have any sizes and any layout (interleaved included): the
// schedules work on a group-ordered copy ("slots": group k's blocks in member
// order, padded to the largest group), which is the caller's buffer itself
// when groups are contiguous runs of equal size. Each level's flat schedule
// is the cost model's choice for that level's link and rank count
// (cost_model::best_flat_gather / best_flat_rooted), the same on every rank
// of the level.
//
// Determinism: every rank ends with copies of the same bytes (allgather);
// each reduce-scatter block is reduced in an order fixed by the groups.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "../exec/executor.hpp"
#include "../transport/subgroup.hpp"
#include "bruck.hpp"
#include "hierarchical.hpp"
#include "hierarchical_rooted.hpp"
#include "recursive_doubling.hpp"
#include "recursive_halving.hpp"
#include "ring.hpp"
#include "select.hpp"

namespace gradsync::algo::hierarchical_gather {

/// Whether group k's members are ranks k g .. k g + g - 1 for one g: the
/// slots are then the caller's own layout.
inline bool identity_layout(const rank_groups& g) {
  const std::size_t w = g.members.front().size();
  for (std::size_t k = 0; k < g.members.size(); ++k) {
    if (g.members[k].size() != w) return false;
    for (std::size_t i = 0; i < w; ++i)
      if (g.members[k][i] != static_cast<int>(k * w + i)) return false;
  }
  return true;
}

/// Elements of the group-ordered slots for blocks of `n` elements.
inline std::size_t slots_elems(const rank_groups& g, std::size_t n) {
  return static_cast<std::size_t>(g.count()) * static_cast<std::size_t>(g.max_size()) * n;
}

/// Scratch bytes of a flat reduce-scatter by `a` (ring, bruck, rd) of p
/// blocks of `block` elements of `elem` bytes.
template <class T> std::size_t flat_reduce_scatter_bytes(algorithm a, std::size_t block, std::size_t seg, int p) {
  const partition blocks{block * static_cast<std::size_t>(p), static_cast<std::size_t>(p)};
  if (a == algorithm::bruck) return bruck::reduce_scatter_scratch_bytes<T>(blocks, seg, p);
  if (a == algorithm::rd) return recursive_halving::scratch_bytes<T>(blocks, seg, p);
  return ring::scratch_elems(blocks, sizeof(T), seg, p) * sizeof(T);
}

// Runs flat gather schedule `a` (ring, bruck, rd) on `c` over `buf`, which
// holds c.size() blocks of `n` elements with this rank's already in place.
template <transport C, executor E, class T>
void flat_allgather(C& c, E& ex, algorithm a, T* buf, std::size_t n, std::size_t seg, int tag) {
  if (c.size() <= 1 || n == 0) return;
  const typed_reduce<T, op::sum, E> sop{ex, op::sum{}, c.size()}; // copies only
  const partition blocks{n * static_cast<std::size_t>(c.size()), static_cast<std::size_t>(c.size())};
  if (a == algorithm::bruck) bruck::allgather(c, sop, buf, blocks, tag);
  else if (a == algorithm::rd) recursive_doubling::allgather(c, sop, buf, blocks, tag);
  else ring::allgather(c, sop, buf, blocks, seg, tag, nullptr);
}

/// Scratch bytes of an allgather of blocks of `n` elements over groups `g`:
/// the slots, unless the layout is the caller's own.
template <class T> std::size_t allgather_scratch_bytes(const rank_groups& g, std::size_t n) {
  return identity_layout(g) ? 0 : slots_elems(g, n) * sizeof(T);
}

/// Allgather of blocks of `n` elements over groups `g` (the same on every
/// rank): `out` (c.size() blocks) receives rank q's `in` at block q; `in`
/// may be this rank's block of `out`. `scratch`: allgather_scratch_bytes.
template <transport C, executor E, class T>
void allgather(C& c, E& ex, const T* in, T* out, std::size_t n, const rank_groups& g, const cost_model& m,
               std::size_t seg, int tag, std::byte* scratch) {
  if (n == 0) return;
  const int r = c.rank(), mine = g.group_of[static_cast<std::size_t>(r)];
  const auto& members = g.members[static_cast<std::size_t>(mine)];
  const std::size_t width = static_cast<std::size_t>(g.max_size()) * n; // one slot
  const bool direct = identity_layout(g);
  T* const slots = direct ? out : reinterpret_cast<T*>(scratch);
  T* const slot = slots + static_cast<std::size_t>(mine) * width;
  const int local = hierarchical_rooted::detail::index_of(members, r);
  T* const own = slot + static_cast<std::size_t>(local) * n;
  if (own != in) ex.copy(own, in, n);
  const auto gs = static_cast<int>(members.size());
  if (gs > 1) { // the group's blocks, among its members
    subgroup<C> inside(c, members, 0);
    flat_allgather(inside, ex, m.best_flat_gather(n * gs * sizeof(T), gs, m.local, false).first, slot, n, seg, tag);
  }
  if (g.count() > 1) {
    if (local == 0) { // the groups' slots, among the leaders (each group's first member)
      subgroup<C> across(c, hierarchical_rooted::leaders(g, 0), 0);
      const algorithm a = m.best_flat_gather(width * static_cast<std::size_t>(g.count()) * sizeof(T), g.count(),
                                             m.global, false).first;
      flat_allgather(across, ex, a, slots, width, seg, tag);
    }
    if (gs > 1) { // every slot, from the leader to its members
      subgroup<C> inside(c, members, 0);
      const std::size_t all = width * static_cast<std::size_t>(g.count());
      const algorithm a = m.best_flat_rooted(all * sizeof(T), gs, m.local, false, seg).first;
      hierarchical_rooted::flat_broadcast(inside, ex, a, slots, all, 0, seg, tag);
    }
  }
  if (direct) return;
  for (int k = 0; k < g.count(); ++k) {
    const auto& mem = g.members[static_cast<std::size_t>(k)];
    for (std::size_t i = 0; i < mem.size(); ++i)
      ex.copy(out + static_cast<std::size_t>(mem[i]) * n, slots + static_cast<std::size_t>(k) * width + i * n, n);
  }
}

/// Scratch bytes of a reduce-scatter of blocks of `n` elements over groups
/// `g`: the group-ordered input, a leader's slot of the leaders' step, and
/// the largest scratch any level's flat schedule may need.
template <class T>
std::size_t reduce_scatter_scratch_bytes(const rank_groups& g, std::size_t n, std::size_t seg) {
  const std::size_t all = slots_elems(g, n), width = static_cast<std::size_t>(g.max_size()) * n;
  std::size_t w = std::max(tree::reduce_scratch_elems(all, sizeof(T), seg, g.max_size()),
                           chain::reduce_scratch_elems(all, sizeof(T), seg, g.max_size())) *
                  sizeof(T);
  for (const algorithm a : {algorithm::ring, algorithm::bruck, algorithm::rd})
    w = std::max(w, flat_reduce_scatter_bytes<T>(a, width, seg, g.count()));
  return (all + width) * sizeof(T) + (w + sizeof(T) - 1) / sizeof(T) * sizeof(T); // whole elements
}

/// Reduce-scatter over groups `g`: `in` holds c.size() blocks of `n`
/// elements; this rank's block of the reduction lands in `out` (which may
/// be this rank's block of `in`). `scratch`: reduce_scatter_scratch_bytes.
template <transport C, executor E, class T, class Op>
void reduce_scatter(C& c, E& ex, const T* in, T* out, std::size_t n, Op op, const rank_groups& g,
                    const cost_model& m, std::size_t seg, int tag, std::byte* scratch) {
  if (n == 0) return;
  const int r = c.rank(), mine = g.group_of[static_cast<std::size_t>(r)];
  const auto& members = g.members[static_cast<std::size_t>(mine)];
  const auto gs = static_cast<int>(members.size());
  const int local = hierarchical_rooted::detail::index_of(members, r);
  const std::size_t width = static_cast<std::size_t>(g.max_size()) * n, all = slots_elems(g, n);
  T* const slots = reinterpret_cast<T*>(scratch); // the input in group order, then the group's partial
  T* const mine_slot = slots + all;                // a leader's slot of the leaders' reduce-scatter
  std::byte* const work = scratch + (all + width) * sizeof(T);
  for (int k = 0; k < g.count(); ++k) {
    const auto& mem = g.members[static_cast<std::size_t>(k)];
    T* const s = slots + static_cast<std::size_t>(k) * width;
    for (std::size_t i = 0; i < mem.size(); ++i) ex.copy(s + i * n, in + static_cast<std::size_t>(mem[i]) * n, n);
    // Padding of a short group: zeros, so the reductions read defined values.
    for (std::size_t i = mem.size(); i < static_cast<std::size_t>(g.max_size()); ++i)
      std::fill_n(s + i * n, n, T{});
  }
  // Both levels combine with the partial operator (avg sums); every rank
  // finishes its block once with the total rank count.
  const hierarchical::partial_op<Op> pop{};
  if (gs > 1) { // the whole vector, reduced to the group's leader (in place there)
    subgroup<C> inside(c, members, 0);
    const algorithm a = m.best_flat_rooted(all * sizeof(T), gs, m.local, true, seg).first;
    T* const w = reinterpret_cast<T*>(work);
    if (a == algorithm::tree) tree::reduce(inside, ex, slots, slots, all, 0, pop, seg, tag, w);
    else chain::reduce(inside, ex, slots, slots, all, 0, pop, seg, tag, w);
  }
  if (local == 0) {
    T* const got = g.count() > 1 ? mine_slot : slots;
    if (g.count() > 1) { // the groups' slots, reduce-scattered among the leaders
      subgroup<C> across(c, hierarchical_rooted::leaders(g, 0), 0); // each group's first member
      const algorithm a = m.best_flat_gather(all * sizeof(T), g.count(), m.global, true).first;
      const typed_reduce<T, hierarchical::partial_op<Op>, E> sop{ex, pop, g.count(), trace_of(c)};
      const partition blocks{all, static_cast<std::size_t>(g.count())};
      if (a == algorithm::bruck) bruck::reduce_scatter(across, sop, slots, got, blocks, seg, tag, work);
      else if (a == algorithm::rd) recursive_halving::reduce_scatter(across, sop, slots, got, blocks, seg, tag, work);
      else ring::reduce_scatter(across, sop, slots, got, blocks, seg, tag, work);
    }
    std::vector<request_t<C>> sends;
    for (int i = 1; i < gs; ++i)
      sends.push_back(send(c, got + static_cast<std::size_t>(i) * n, n, members[static_cast<std::size_t>(i)], tag));
    ex.copy(out, got, n);
    wait_all(sends);
  } else {
    recv(c, out, n, members.front(), tag).wait();
  }
  ex.finish(out, n, op, c.size());
}

} // namespace gradsync::algo::hierarchical_gather
