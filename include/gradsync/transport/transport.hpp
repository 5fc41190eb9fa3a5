// gradsync: the transport concept. Algorithms are schedules over these few
// primitives and never know which transport runs them.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
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
/// send; a mismatch fails the receive (inproc and shm: both sides) with an
/// error naming the sizes. Buffers must stay valid and unmodified until the
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

/// Per-transport capabilities. A stream-ordered backend (NCCL) specialises this
/// with `stream_ordered = true`: its operations are enqueued on a device stream
/// and complete in stream order, so schedules must not wait on the host between
/// dependent steps.
template <class C> struct transport_traits {
  static constexpr bool stream_ordered = false;
};

/// Views a typed span as bytes.
template <class T> std::span<const std::byte> bytes_of(std::span<const T> s) {
  return std::as_bytes(s);
}
template <class T> std::span<std::byte> bytes_of(std::span<T> s) {
  return std::as_writable_bytes(s);
}

} // namespace gradsync
