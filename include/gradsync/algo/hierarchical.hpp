// gradsync: hierarchical allreduce. Ranks form groups (nodes): a
// reduce-scatter inside each group leaves local rank i with the group's
// partial sum of shard i; shard i is then allreduced across the groups by the
// ranks holding it (any flat schedule, chosen by the model or the caller);
// an allgather inside each group completes the vector. Only 1/g of the data
// crosses the slow inter-group links per rank, and the fast local links carry
// the rest.
//
// Groups come from the transport (node_of) or from a group size; they may
// have different sizes. With G = the largest group size the vector has G
// shards; in a group of g < G ranks local rank i holds shards i, i+g, ...,
// and its local steps are binomial reduce/broadcast per shard (equal groups
// use the ring). Three forms: one communicator with groups, two
// communicators (an intra-node transport plus a "cross" transport linking the
// ranks with equal local rank, as Horovod does), and the 2-D grid (rows then
// columns of one communicator).
//
// Determinism: each group's partial of a shard is one value; the inner
// schedule gives all members of a column the same bits; the allgather copies.
// So every rank ends with identical results, whatever the group sizes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "../core/ops.hpp"
#include "../core/policy.hpp"
#include "../exec/executor.hpp"
#include "../transport/subgroup.hpp"
#include "dispatch.hpp"
#include "ring.hpp"
#include "schedule.hpp"
#include "select.hpp"
#include "tree.hpp"

namespace gradsync::algo::hierarchical {

/// The operator partial steps use: avg sums, and divides once at the end by
/// the total rank count.
template <reduce_op Op>
using partial_op = std::conditional_t<Op::kind == op_kind::avg, op::sum, Op>;

/// Scratch elements of a hierarchical allreduce of `count` elements over
/// `groups` groups of at most `group_size` ranks.
inline std::size_t allreduce_scratch_elems(std::size_t count, std::size_t elem_bytes,
                                           std::size_t seg_bytes, int group_size, int groups) {
  const auto gs = static_cast<std::size_t>(std::max(1, group_size));
  std::size_t m = ring::scratch_elems(partition{count, gs}, elem_bytes, seg_bytes, group_size);
  // Shards hold size(0) or size(0) - 1 elements, and a schedule's scratch is
  // not monotonic in its count (segments of 257 elements cut at 64 per
  // segment are 52 long, of 256 elements 64 long): size for both.
  const std::size_t shard = partition{count, gs}.size(0);
  for (const std::size_t n : {shard, shard > 0 ? shard - 1 : 0})
    m = std::max({m, tree::reduce_scratch_elems(n, elem_bytes, seg_bytes, group_size),
                  any_flat_scratch_elems(n, elem_bytes, seg_bytes, groups)});
  return m;
}

/// The three steps, given this rank's group `local` (`shards` = the largest
/// group size), and `inner(k, data, n)`, which allreduces shard k in place
/// across groups with the partial operator. `ranks`: all ranks, for avg.
template <transport L, executor E, element T, reduce_op Op, class Inner>
void run(L& local, E& ex, int shards, const T* in, T* out, std::size_t count, Op op, int ranks,
         std::size_t seg_bytes, int tag, T* scratch, Inner&& inner) {
  const int g = local.size(), lr = local.rank();
  const auto G = static_cast<std::size_t>(shards);
  const partition sh{count, G};
  const partial_op<Op> pop{};
  const typed_reduce<T, partial_op<Op>, E> sop{ex, pop, g, trace_of(local)};
  if (g == shards) {
    ring::reduce_scatter(local, sop, in, out + sh.offset(static_cast<std::size_t>(lr)), sh, seg_bytes,
                         tag, reinterpret_cast<std::byte*>(scratch));
  } else {
    for (std::size_t k = 0; k < G; ++k)
      tree::reduce(local, ex, in + sh.offset(k), out + sh.offset(k), sh.size(k),
                   static_cast<int>(k % static_cast<std::size_t>(g)), pop, seg_bytes, tag, scratch);
  }
  for (auto k = static_cast<std::size_t>(lr); k < G; k += static_cast<std::size_t>(g)) {
    inner(k, out + sh.offset(k), sh.size(k));
    ex.finish(out + sh.offset(k), sh.size(k), op, ranks);
  }
  if (g == shards) {
    ring::allgather(local, sop, out, sh, seg_bytes, tag, nullptr);
  } else {
    for (std::size_t k = 0; k < G; ++k)
      tree::broadcast(local, ex, out + sh.offset(k), sh.size(k),
                      static_cast<int>(k % static_cast<std::size_t>(g)), seg_bytes, tag);
  }
}

/// Hierarchical allreduce over one communicator split into `groups`. The
/// inter-group step runs `inner` (automatic: `sel` chooses per shard).
/// `scratch` holds allreduce_scratch_elems(...) elements.
template <transport C, executor E, element T, reduce_op Op>
void allreduce(C& c, E& ex, const T* in, T* out, std::size_t count, Op op, const rank_groups& groups,
               algorithm inner, const selector& sel, std::size_t seg_bytes, int tag, T* scratch) {
  const int r = c.rank();
  GRADSYNC_REQUIRE(static_cast<int>(groups.group_of.size()) == c.size(), "allreduce", r,
          "hier: groups describe " + std::to_string(groups.group_of.size()) + " ranks, the communicator has " +
              std::to_string(c.size()));
  GRADSYNC_REQUIRE(inner == algorithm::automatic || is_flat(inner), "allreduce", r,
          "hier: inner algorithm '" + std::string(algorithm_name(inner)) + "' is not a single-level schedule");
  const auto& mine = groups.members[static_cast<std::size_t>(groups.group_of[static_cast<std::size_t>(r)])];
  subgroup<C> local(c, mine, 0);
  const int m = groups.count();
  run(local, ex, groups.max_size(), in, out, count, op, c.size(), seg_bytes, tag, scratch,
      [&](std::size_t k, T* data, std::size_t n) {
        std::vector<int> column; // the holder of shard k in every group
        for (const auto& grp : groups.members) column.push_back(grp[k % grp.size()]);
        subgroup<C> cross(c, std::move(column), policy::level_tag_shift);
        const algorithm a =
            inner == algorithm::automatic ? sel.choose_inner(n * sizeof(T), m, seg_bytes, groups.max_size()) : inner;
        flat_allreduce(a, cross, ex, static_cast<const T*>(data), data, n, partial_op<Op>{}, seg_bytes, tag, scratch);
      });
}

/// Hierarchical allreduce over two communicators: `local` joins the ranks of
/// one node (e.g. shared memory) and `cross` the ranks with the same local
/// rank on every node (e.g. MPI). All nodes must have the same number of
/// ranks. `scratch` holds allreduce_scratch_elems(count, ..., local.size(),
/// cross.size()) elements.
template <transport L, transport X, executor E, element T, reduce_op Op>
void allreduce(L& local, X& cross, E& ex, const T* in, T* out, std::size_t count, Op op, algorithm inner,
               const selector& sel, std::size_t seg_bytes, int tag, T* scratch) {
  GRADSYNC_REQUIRE(inner == algorithm::automatic || is_flat(inner), "allreduce", local.rank(),
          "hier: inner algorithm '" + std::string(algorithm_name(inner)) + "' is not a single-level schedule");
  const int m = cross.size();
  run(local, ex, local.size(), in, out, count, op, local.size() * m, seg_bytes, tag, scratch,
      [&](std::size_t, T* data, std::size_t n) {
        const algorithm a =
            inner == algorithm::automatic ? sel.choose_inner(n * sizeof(T), m, seg_bytes, local.size()) : inner;
        flat_allreduce(a, cross, ex, static_cast<const T*>(data), data, n, partial_op<Op>{}, seg_bytes,
                       tag + policy::level_tag_shift, scratch);
      });
}

/// 2-D grid allreduce: rows of `row` consecutive ranks (the last may be
/// shorter) reduce-scatter, each column runs a ring allreduce of its shard,
/// rows allgather. 2(row-1) + 2(rows-1) messages per rank instead of the
/// ring's 2(p-1), with the ring's bandwidth term.
template <transport C, executor E, element T, reduce_op Op>
void allreduce_2d(C& c, E& ex, const T* in, T* out, std::size_t count, Op op, int row,
                  std::size_t seg_bytes, int tag, T* scratch) {
  allreduce(c, ex, in, out, count, op, rank_groups::blocks(c.size(), row), algorithm::ring, selector{},
            seg_bytes, tag, scratch);
}

} // namespace gradsync::algo::hierarchical
