// gradsync: the sparse-neighbour exchange schedule (a GNN's halo exchange):
// only the edges of a communication graph carry messages. Every receive from
// a source is posted at once, then the sends to the destinations, up to
// policy::alltoall_window at a time: a rank with d neighbours pays about
// d / w latencies and its own bytes, however many ranks the communicator has.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>

#include "../core/policy.hpp"
#include "exchange.hpp"

namespace gradsync::algo::neighbor_exchange {

/// Exchanges along a graph: this rank receives recv_span(i) from sources[i]
/// and sends send_span(i) to destinations[i] (layout indices are positions
/// in the two lists, not ranks). A destination equal to this rank is a copy
/// into the matching source entry, matched in list order.
template <transport C>
void run(C& c, std::span<const int> sources, std::span<const int> destinations, const exchange::layout& l, int tag,
         int window = policy::alltoall_window) {
  const int r = c.rank();
  // Self edges: the k-th self destination feeds the k-th self source.
  std::size_t next_self = 0;
  for (std::size_t j = 0; j < destinations.size(); ++j) {
    if (destinations[j] != r) continue;
    while (next_self < sources.size() && sources[next_self] != r) ++next_self;
    const auto in = l.send_span(static_cast<int>(j));
    const auto out = l.recv_span(static_cast<int>(next_self));
    if (!in.empty() && in.data() != out.data()) std::memmove(out.data(), in.data(), in.size());
    ++next_self;
  }
  // Every receive first, so any send finds its receive posted (windows of
  // sends cannot deadlock on a rendezvous transport), then the sends
  // window by window.
  exchange::pending<C> all;
  for (std::size_t i = 0; i < sources.size(); ++i)
    if (sources[i] != r) all.recvs.push_back(c.irecv(l.recv_span(static_cast<int>(i)), sources[i], tag));
  const std::size_t w = static_cast<std::size_t>(std::max(1, window));
  try {
    for (std::size_t j0 = 0; j0 < destinations.size(); j0 += w) {
      for (std::size_t j = j0; j < std::min(destinations.size(), j0 + w); ++j)
        if (destinations[j] != r) all.sends.push_back(c.isend(l.send_span(static_cast<int>(j)), destinations[j], tag));
      wait_all(all.sends);
    }
  } catch (...) {
    try {
      all.wait();
    } catch (...) {
    }
    throw;
  }
  all.wait();
}

} // namespace gradsync::algo::neighbor_exchange
