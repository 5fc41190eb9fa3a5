// gradsync: the transport concept. Algorithms are schedules over these few
// primitives and never know which transport runs them. Optional capabilities
// (node map, shared arena, abort, timeouts, receive up to a capacity, device
// memory, stream order, timeline) are named concepts in capabilities.hpp.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace gradsync {

/// A pending point-to-point operation. `wait()` blocks until it completes and
/// throws gradsync::error if it failed; `test()` polls (and throws likewise).
template <class R>
concept completion = std::movable<R> && requires(R r) {
  r.wait();
  { r.test() } -> std::convertible_to<bool>;
};

/// A communicator: `size()` ranks, this one being `rank()`, exchanging byte
/// ranges by nonblocking send/receive. Messages between one pair of ranks with
/// one tag are matched in the order they were posted (MPI's non-overtaking
/// rule). A receive must be posted with exactly the size of the matching
/// send (capabilities.hpp's upto_receiver relaxes this); a mismatch fails the
/// receive (inproc and shm: both sides) with an errc::mismatch error naming
/// the sizes. Buffers must stay valid and unmodified until the
/// operation completes. After a collective has failed on a communicator,
/// discard the communicator: unmatched messages of the failed call may remain.
template <class C>
concept transport = requires(C& c, std::span<const std::byte> s, std::span<std::byte> d,
                             int peer, int tag) {
  { C::name } -> std::convertible_to<std::string_view>;
  { std::as_const(c).rank() } -> std::convertible_to<int>;
  { std::as_const(c).size() } -> std::convertible_to<int>;
  { c.isend(s, peer, tag) } -> completion;
  { c.irecv(d, peer, tag) } -> completion;
};

namespace detail {

// The reasons every transport gives for its common failures, worded alike.
inline std::string size_mismatch(int src, std::size_t sent, int dst, std::size_t posted, int tag,
                                 bool upto = false) {
  return "message size mismatch: rank " + std::to_string(src) + " sent " + std::to_string(sent) +
         " bytes, rank " + std::to_string(dst) + " posted a receive of " + (upto ? "up to " : "") +
         std::to_string(posted) + " bytes (tag " + std::to_string(tag) + ")";
}
inline std::string timed_out(std::chrono::milliseconds t) {
  return "timed out after " + std::to_string(t.count()) +
         " ms waiting for the peer (does every rank call the same collective with the same count, "
         "root and options?)";
}

} // namespace detail

/// Views a typed span as bytes.
template <class T> std::span<const std::byte> bytes_of(std::span<const T> s) {
  return std::as_bytes(s);
}
template <class T> std::span<std::byte> bytes_of(std::span<T> s) {
  return std::as_writable_bytes(s);
}

} // namespace gradsync
