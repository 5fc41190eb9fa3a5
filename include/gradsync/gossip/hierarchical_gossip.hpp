// gradsync: hierarchical gossip. Inside a node ranks share fast links, so
// they average exactly (allreduce); only one leader per node gossips over
// the slow network, with a topology over the nodes; the leader then
// broadcasts the mixed vector inside its node. One round moves node-sized
// messages only between leaders and costs one gossip latency on the slow
// links, and the mixing matrix seen by ranks is the leaders' matrix
// expanded over equal-sized nodes (doubly stochastic when the leaders' is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../collectives.hpp"
#include "../core/policy.hpp"
#include "../transport/subgroup.hpp"
#include "neighbor_allreduce.hpp"
#include "options.hpp"
#include "topology.hpp"

namespace gradsync::gossip {

namespace detail {
/// The groups of a hierarchical round (`group_size` consecutive ranks, or the
/// transport's node_of when 0), checked on every rank before any message
/// moves: all of one size, `groups_graph` row-stochastic over the groups.
template <transport C>
rank_groups checked_groups(const C& c, int group_size, const graph& groups_graph, const char* name) {
  const int r = c.rank();
  GRADSYNC_REQUIRE(group_size >= 0, name, r, "group_size " + std::to_string(group_size) + " is negative");
  GRADSYNC_REQUIRE(group_size > 0 || node_map<C>, name, r,
                   "needs groups: pass a group size, or use a transport with node_of()");
  rank_groups groups = groups_of(c, group_size);
  GRADSYNC_REQUIRE(groups.uniform(), name, r,
                   "groups differ in size (" + std::to_string(groups.members.front().size()) + " and " +
                       std::to_string(groups.members.back().size()) +
                       " ranks): the average of group averages would not be the average over ranks");
  validate(groups_graph, groups.count(), property::row_stochastic, name, r);
  return groups;
}
} // namespace detail

/// One hierarchical gossip round in place on `x`: average inside each group
/// (groups of `group_size` consecutive ranks, or by the transport's node_of
/// when 0), a neighbor_allreduce among the groups' first ranks over
/// `leaders` (a topology over the groups, group k being node k; validated on
/// every rank before any message moves), then a broadcast inside each
/// group. Groups must all have the same size (so that the average over ranks
/// is the average of the group averages). Every rank ends with the same
/// bits as its group's leader. With o.global_every, some steps are an exact
/// allreduce average instead. The report counts the leader's gossip bytes.
template <transport C, executor E, element T>
round_report hierarchical_neighbor_allreduce(C& c, E& ex, std::span<T> x, const graph& leaders, std::uint64_t step,
                                             int group_size = 0, const gossip_options& o = {}) {
  GRADSYNC_CARRIES(C, E);
  const char* name = "hierarchical_neighbor_allreduce";
  const int r = c.rank();
  const scoped_timeout guard(c, o.collective.timeout);
  const rank_groups groups = detail::checked_groups(c, group_size, leaders, name);
  gradsync::detail::check_span(ex, x, name, r, "data");
  if (o.global_step(step)) {
    allreduce(c, ex, x, op::avg{}, o.dense());
    return {0, true};
  }
  const int mine = groups.group_of[static_cast<std::size_t>(r)];
  subgroup<C> local(c, groups.members[static_cast<std::size_t>(mine)], 0);
  allreduce(local, ex, x, op::avg{}, o.dense());
  round_report rep;
  if (local.rank() == 0) {
    std::vector<int> heads;
    for (const auto& g : groups.members) heads.push_back(g.front());
    subgroup<C> top(c, std::move(heads), policy::tag_span);
    gossip_options inner = o;
    inner.global_every = 0;
    inner.collective.timeout = {};
    rep = neighbor_allreduce(top, ex, x, leaders, step, inner);
  }
  broadcast(local, ex, x, 0, o.dense());
  return rep;
}

/// hierarchical_neighbor_allreduce on the host executor (see above).
template <transport C, element T>
round_report hierarchical_neighbor_allreduce(C& c, std::span<T> x, const graph& leaders, std::uint64_t step,
                                             int group_size = 0, const gossip_options& o = {}) {
  exec::host ex;
  return hierarchical_neighbor_allreduce(c, ex, x, leaders, step, group_size, o);
}

} // namespace gradsync::gossip
