// A test transport over inproc ranks that reports nodes (node_of(r) =
// nodes[r]): groups from a node map, contiguous or interleaved, for the
// schedules that follow the transport's nodes (hier allreduce, two-level
// alltoall).
#pragma once

#include <gradsync/transport/inproc.hpp>

#include <span>
#include <string_view>
#include <vector>

namespace gradsync::test {

struct noded {
  static constexpr std::string_view name = "noded";
  inproc::communicator& c;
  std::vector<int> nodes;
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  int node_of(int r) const { return nodes.at(static_cast<std::size_t>(r)); }
  auto isend(std::span<const std::byte> d, int peer, int tag) { return c.isend(d, peer, tag); }
  auto irecv(std::span<std::byte> d, int peer, int tag) { return c.irecv(d, peer, tag); }
};
static_assert(node_aware<noded>);

} // namespace gradsync::test
