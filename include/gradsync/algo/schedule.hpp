// gradsync: pieces every pipelined schedule shares: segment geometry, typed
// sends and receives, waiting for a batch of requests. (Scratch memory comes
// from the executor: exec/executor.hpp.)
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../core/partition.hpp"
#include "../core/policy.hpp"
#include "../transport/capabilities.hpp"
#include "../transport/transport.hpp"

namespace gradsync::algo {

/// Blocks of a buffer, each split into `nseg` near-equal pipeline segments.
struct segmentation {
  partition blocks;
  std::size_t nseg = 1;
  std::size_t max_seg = 0; // largest segment, in elements

  /// Geometry for `blocks` of elements of `elem_bytes`, segments of at most
  /// about `seg_bytes` (every block gets the same number of segments).
  static segmentation make(partition blocks, std::size_t elem_bytes, std::size_t seg_bytes) {
    segmentation g;
    g.blocks = blocks;
    const std::size_t largest = blocks.size(0);
    const std::size_t per = std::max<std::size_t>(1, seg_bytes / std::max<std::size_t>(1, elem_bytes));
    g.nseg = std::max<std::size_t>(1, (largest + per - 1) / per);
    g.max_seg = (largest + g.nseg - 1) / g.nseg;
    return g;
  }
  /// Offset of segment j of block b from the start of the buffer.
  std::size_t offset(std::size_t b, std::size_t j) const {
    return blocks.offset(b) + partition{blocks.size(b), nseg}.offset(j);
  }
  /// Offset of segment j of block b from the start of block b.
  std::size_t inner(std::size_t b, std::size_t j) const {
    return partition{blocks.size(b), nseg}.offset(j);
  }
  std::size_t size(std::size_t b, std::size_t j) const {
    return partition{blocks.size(b), nseg}.size(j);
  }
};

/// Request type of transport C.
template <transport C>
using request_t = decltype(std::declval<C&>().isend(std::span<const std::byte>{}, 0, 0));

/// Typed send/receive of n elements.
template <transport C, class T> request_t<C> send(C& c, const T* p, std::size_t n, int peer, int tag) {
  return c.isend(std::as_bytes(std::span<const T>(p, n)), peer, tag);
}
template <transport C, class T> auto recv(C& c, T* p, std::size_t n, int peer, int tag) {
  return c.irecv(std::as_writable_bytes(std::span<T>(p, n)), peer, tag);
}

/// Sends `w` to `peer` and waits until the receiver has it, where the
/// transport can tell (synchronous_sender), else until the send completes.
/// For a rank that sends to several peers one after another (the trees'
/// children, largest subtree first): a buffered send of a few KiB completes
/// at once, so the sends all crossed the rank's link together and the first
/// child, which has the most to forward, got its bytes last. `more`: another
/// send follows (the last one needs no wait for its receiver).
template <transport C> void send_in_turn(C& c, std::span<const std::byte> w, int peer, int tag, bool more) {
  if constexpr (synchronous_sender<C>) {
    if (more && w.size() >= policy::send_in_turn_min_bytes) {
      c.issend(w, peer, tag).wait();
      return;
    }
  }
  c.isend(w, peer, tag).wait();
}

/// Waits for every request in `v` (all of them, even if one throws) and clears it.
template <class R> void wait_all(std::vector<R>& v) {
  std::optional<error> first;
  for (auto& r : v) {
    try {
      r.wait();
    } catch (const error& e) {
      if (!first) first = e;
    }
  }
  v.clear();
  if (first) throw *first;
}

/// Up to N requests in flight without a heap allocation (a schedule step's
/// few messages): add() them, wait() for all (all of them, even if one throws).
template <transport C, std::size_t N> class request_set {
public:
  void add(request_t<C>&& r) {
    GRADSYNC_REQUIRE(n_ < N, "schedule", -1, "request_set full (" + std::to_string(N) + ")");
    q_[n_++].emplace(std::move(r));
  }
  void wait() {
    std::optional<error> first;
    for (std::size_t i = 0; i < n_; ++i) {
      try {
        q_[i]->wait();
      } catch (const error& e) {
        if (!first) first = e;
      }
      q_[i].reset();
    }
    n_ = 0;
    if (first) throw *first;
  }
  ~request_set() {
    try {
      wait();
    } catch (...) { // an earlier error is already on its way out
    }
  }

private:
  std::array<std::optional<request_t<C>>, N> q_;
  std::size_t n_ = 0;
};

} // namespace gradsync::algo
