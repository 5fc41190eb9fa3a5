// gradsync: sharded hierarchical gossip. The mixing of hierarchical gossip
// (group averages mixed by a topology over the groups), with the slow-link
// traffic spread over every rank of a group instead of one leader: the group
// reduce-scatters its average, so rank i holds block i of it; rank i gossips
// that block with rank i of the neighbouring groups (one gossip per local
// index, all at once); the group allgathers the mixed blocks. Each rank sends
// 1/group_size of the vector over the slow network per round, against the
// whole vector for the leader of hierarchical gossip: where every rank has
// its own network port (rail-optimised GPU clusters, docs/gossip.md) a round
// costs about 1/group_size of the leader's; where a group shares one port it
// moves the same bytes as the leader, and the allreduce + broadcast inside
// become a reduce-scatter + allgather.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../algo/ring.hpp"
#include "../collectives.hpp"
#include "../core/policy.hpp"
#include "../transport/subgroup.hpp"
#include "hierarchical_gossip.hpp"
#include "neighbor_allreduce.hpp"
#include "options.hpp"
#include "topology.hpp"

namespace gradsync::gossip {

/// One sharded hierarchical gossip round in place on `x`: the same result as
/// hierarchical_neighbor_allreduce (group averages mixed by `groups_graph`, a
/// topology over the groups; to rounding, the sums run in another order),
/// with the gossip split into group_size column gossips of one block each.
/// Groups: `group_size` consecutive ranks, or the transport's node_of when 0;
/// all of one size (validated, with the graph, on every rank before any
/// message moves). Every rank of a group ends with the same bits. The vector
/// is cut into group_size blocks of near-equal size (any count, also fewer
/// elements than ranks). With o.global_every, some steps are an exact
/// allreduce average instead. The report counts this rank's gossip bytes.
template <transport C, executor E, element T>
round_report sharded_neighbor_allreduce(C& c, E& ex, std::span<T> x, const graph& groups_graph, std::uint64_t step,
                                        int group_size = 0, const gossip_options& o = {}) {
  GRADSYNC_CARRIES(C, E);
  const char* name = "sharded_neighbor_allreduce";
  const int r = c.rank();
  const scoped_timeout guard(c, o.collective.timeout);
  const rank_groups groups = detail::checked_groups(c, group_size, groups_graph, name);
  gradsync::detail::check_span(ex, x, name, r, "data");
  if (o.global_step(step)) {
    allreduce(c, ex, x, op::avg{}, o.dense());
    return {0, true};
  }
  const auto& members = groups.members[static_cast<std::size_t>(groups.group_of[static_cast<std::size_t>(r)])];
  subgroup<C> local(c, members, 0);
  const int li = local.rank();
  const std::size_t n = x.size();
  const partition blocks{n, members.size()};
  const options d = o.dense();
  const std::size_t seg = d.segment();
  T* own = x.data() + blocks.offset(static_cast<std::size_t>(li));
  auto ws = ex.template scratch<T>(d.workspace, algo::ring::scratch_elems(blocks, sizeof(T), seg, local.size()), name,
                                   r);
  gradsync::detail::check_tag(d.tag, name, r);

  // The group's average, scattered: block li of it lands in place on rank li.
  gradsync::detail::run_call(
      local, name, gradsync::detail::fingerprint_of<T, op::avg>(call_kind::reduce_scatter, n, algorithm::ring),
      x.size_bytes(), d, [&] {
        const algo::typed_reduce<T, op::avg, E> sop{ex, op::avg{}, local.size(), trace_of(local)};
        algo::ring::reduce_scatter(local, sop, x.data(), own, blocks, seg, d.tag,
                                   reinterpret_cast<std::byte*>(ws.data()));
      });

  // Rank li of every group gossips block li (every column at once; the
  // columns are disjoint, so one tag span serves them all).
  std::vector<int> column;
  column.reserve(groups.members.size());
  for (const auto& g : groups.members) column.push_back(g[static_cast<std::size_t>(li)]);
  subgroup<C> col(c, std::move(column), policy::tag_span);
  gossip_options inner = o;
  inner.global_every = 0;
  inner.collective.timeout = {};
  const round_report rep = neighbor_allreduce(
      col, ex, std::span<T>(own, blocks.size(static_cast<std::size_t>(li))), groups_graph, step, inner);

  // Every rank of the group takes every mixed block.
  gradsync::detail::run_call(local, name,
                             gradsync::detail::fingerprint_of<T, void>(call_kind::allgather, n, algorithm::ring),
                             x.size_bytes(), d, [&] {
                               const algo::typed_reduce<T, op::sum, E> sop{ex, op::sum{}, local.size()}; // copies
                               algo::ring::allgather(local, sop, x.data(), blocks, seg, d.tag, nullptr);
                             });
  return rep;
}

/// sharded_neighbor_allreduce on the host executor (see above).
template <transport C, element T>
round_report sharded_neighbor_allreduce(C& c, std::span<T> x, const graph& groups_graph, std::uint64_t step,
                                        int group_size = 0, const gossip_options& o = {}) {
  exec::host ex;
  return sharded_neighbor_allreduce(c, ex, x, groups_graph, step, group_size, o);
}

} // namespace gradsync::gossip
