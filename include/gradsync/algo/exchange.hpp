// gradsync: what every exchange schedule (alltoall, alltoallv, neighbour
// exchange) works on: per peer, the bytes this rank sends it and where the
// bytes it receives from it go. Exchanges move bytes and reduce nothing, so
// the schedules are written over bytes once, never per element type.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../transport/transport.hpp"
#include "schedule.hpp"

namespace gradsync::algo::exchange {

/// One rank's side of an exchange among p ranks: to peer q it sends
/// send_bytes(q) bytes from send + send_offset(q) and from q it receives
/// recv_bytes(q) bytes into recv + recv_offset(q). Counts and offsets are in
/// elements of `elem` bytes (a row of a matrix for a token exchange); a peer
/// with no entry in `peers` (neighbour exchange) is not exchanged with.
struct layout {
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::size_t elem = 1;
  std::span<const std::size_t> send_counts, send_displs, recv_counts, recv_displs;
  /// Empty blocks carry no message. Only where both ends of every pair are
  /// known to agree on its size (an exchange_plan's counts, checked pairwise
  /// when it was made): otherwise the empty message is what lets a receiver
  /// catch a count that disagrees with its sender's.
  bool skip_empty = false;

  std::size_t send_bytes(int q) const { return send_counts[static_cast<std::size_t>(q)] * elem; }
  std::size_t recv_bytes(int q) const { return recv_counts[static_cast<std::size_t>(q)] * elem; }
  const std::byte* send_at(int q) const { return send + send_displs[static_cast<std::size_t>(q)] * elem; }
  std::byte* recv_at(int q) const { return recv + recv_displs[static_cast<std::size_t>(q)] * elem; }
  std::span<const std::byte> send_span(int q) const { return {send_at(q), send_bytes(q)}; }
  std::span<std::byte> recv_span(int q) const { return {recv_at(q), recv_bytes(q)}; }
};

/// Offsets of blocks packed one after another in rank order (MPI's
/// displacements of a contiguous buffer): out[q] = sum of counts[0..q).
inline void packed_displs(std::span<const std::size_t> counts, std::span<std::size_t> out) {
  std::size_t at = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    out[q] = at;
    at += counts[q];
  }
}

/// This rank's block to itself (a copy unless it is in place).
inline void copy_self(const layout& l, int r) {
  const std::size_t n = l.send_bytes(r);
  if (n != 0 && l.send_at(r) != l.recv_at(r)) std::memmove(l.recv_at(r), l.send_at(r), n);
}

/// Receive request type of transport C.
template <transport C> using recv_request_t = decltype(std::declval<C&>().irecv(std::span<std::byte>{}, 0, 0));

/// Receives and sends in flight; wait() completes all of them (every one,
/// even after a failure, so no buffer is left in use) and rethrows the first
/// failure.
template <transport C> struct pending {
  std::vector<recv_request_t<C>> recvs;
  std::vector<request_t<C>> sends;

  /// Posts the receive of `from`'s block and the send of `to`'s. Every pair
  /// exchanges a message even when it carries no bytes: a rank whose count
  /// for a peer disagrees with the peer's then fails the size check of the
  /// receive (errc::mismatch; inproc and shm fail the sender too) instead of
  /// leaving a message unmatched or a receive short (l.skip_empty: a
  /// checked empty block sends and receives nothing).
  void post(C& c, const layout& l, int to, int from, int tag) {
    if (!l.skip_empty || l.recv_bytes(from) != 0) recvs.push_back(c.irecv(l.recv_span(from), from, tag));
    if (!l.skip_empty || l.send_bytes(to) != 0) sends.push_back(c.isend(l.send_span(to), to, tag));
  }
  void wait() {
    std::optional<error> first;
    try {
      wait_all(recvs);
    } catch (const error& e) {
      first = e;
    }
    try {
      wait_all(sends);
    } catch (const error& e) {
      if (!first) first = e;
    }
    if (first) throw *first;
  }
};

} // namespace gradsync::algo::exchange
