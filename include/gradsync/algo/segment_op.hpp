// gradsync: segment operations. A schedule moves segments of a rank's buffer
// between ranks; the segment operation says what a segment looks like on the
// wire and what a rank does with one it receives. The typed reduction here
// sends elements as they are and reduces a received segment into the local
// one with an executor; a compressed ring plugs in an operation that decodes,
// accumulates in float and re-encodes (its wire sizes vary with the data, so
// schedules receive such segments with the transport's irecv_upto).
//
// The ring's five primitives (NCCL's names) map onto the operation:
//   send                  wire(mine)                        -> next
//   recv-reduce-send      reduce(got, mine)                 -> next
//   recv-reduce-copy-send reduce_copy(got, mine, dst)       -> next (and dst final)
//   recv-copy-send        copy(got, dst), forward got       -> next
//   recv                  copy(got, dst)
// Tree and pairwise schedules combine a received segment into a typed
// accumulator instead (combine), and finish once at the owner (finish).
#pragma once

#include <concepts>
#include <cstddef>
#include <deque>
#include <span>
#include <utility>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/ops.hpp"
#include "../exec/executor.hpp"
#include "../transport/capabilities.hpp"
#include "schedule.hpp"

namespace gradsync::algo {

/// Staging slots of a pipelined schedule: depth receives in flight plus
/// depth forwarded sends still draining.
inline constexpr std::size_t staging_slots = 2 * policy::pipeline_depth;

/// A segment operation over elements of `S::value_type` (see the file comment).
/// - `exact`: a segment of n elements always has slot_bytes(n) bytes on the
///   wire (schedules then post exact-size receives; otherwise up-to receives);
/// - `in_place_copy`: a copied segment may be received straight into its
///   destination (copy phases then need no slots);
/// - `staged_send`: wire() encodes into the staging it is given (step-0
///   sends then get their own rotating staging);
/// - `slot_bytes(n)`: staging bytes one in-flight segment of n elements needs;
/// - `wire(mine, n, slot)`: the wire form of local elements (may view `mine`);
/// - `reduce(got, mine, n, slot)`: wire form of op(received, local), written
///   into `slot` (which holds `got`: in place is fine);
/// - `reduce_copy(got, mine, dst, n)`: dst = the finished op(received, local)
///   (avg divided), returning the wire form to forward (may view `dst`);
/// - `recv_target(dst, n, slot)`: where a copied segment is received;
/// - `copy(got, dst, n)`: decodes a received segment into `dst` (nothing when
///   it was received there);
/// - `combine(got, mine, acc, n, got_first)`: acc = op(received, local) when
///   got_first, else op(local, received), not finished (acc may alias mine);
/// - `finish(dst, n)`: avg's single division, by the rank owning the result;
/// - `assign(dst, src, n)`: a local copy of elements (nothing when equal);
/// - `local(mine, dst, n)`: the result when this rank's operand is the only
///   one (one rank);
/// - `fence()`: the executor's fence (before sending what it wrote).
template <class S>
concept segment_op = requires(const S& s, typename S::value_type* dst, const typename S::value_type* mine,
                              std::span<std::byte> got, std::byte* slot, std::size_t n) {
  requires element<typename S::value_type>;
  { S::exact } -> std::convertible_to<bool>;
  { S::in_place_copy } -> std::convertible_to<bool>;
  { S::staged_send } -> std::convertible_to<bool>;
  { s.slot_bytes(n) } -> std::convertible_to<std::size_t>;
  { s.wire(mine, n, slot) } -> std::convertible_to<std::span<const std::byte>>;
  { s.reduce(got, mine, n, slot) } -> std::convertible_to<std::span<const std::byte>>;
  { s.reduce_copy(got, mine, dst, n) } -> std::convertible_to<std::span<const std::byte>>;
  { s.recv_target(dst, n, slot) } -> std::convertible_to<std::span<std::byte>>;
  s.copy(got, dst, n);
  s.combine(got, mine, dst, n, true);
  s.finish(dst, n);
  s.assign(dst, mine, n);
  s.local(mine, dst, n);
  s.fence();
};

/// The typed reduction: segments travel as elements; a received segment is
/// reduced as op(received, local) by the executor, in the receive slot.
/// `ranks` is the divisor of avg's final step. With a timeline, each
/// reduction is a phase "reduce" (argument: elements).
template <element T, reduce_op Op, executor E> struct typed_reduce {
  using value_type = T;
  static constexpr bool exact = true;
  static constexpr bool in_place_copy = true;
  static constexpr bool staged_send = false;

  E& ex;
  Op op;
  int ranks;
  timeline* trace = nullptr;

  static std::size_t slot_bytes(std::size_t n) noexcept { return n * sizeof(T); }
  static std::span<const std::byte> wire(const T* mine, std::size_t n, std::byte*) noexcept {
    return std::as_bytes(std::span<const T>(mine, n));
  }
  std::span<const std::byte> reduce(std::span<std::byte> got, const T* mine, std::size_t n, std::byte*) const {
    const auto phase = element_phase(trace, "reduce", "compute", n);
    T* acc = reinterpret_cast<T*>(got.data());
    ex.reduce(acc, static_cast<const T*>(acc), mine, n, op);
    return got.first(n * sizeof(T));
  }
  std::span<const std::byte> reduce_copy(std::span<std::byte> got, const T* mine, T* dst, std::size_t n) const {
    const auto phase = element_phase(trace, "reduce", "compute", n);
    ex.reduce(dst, reinterpret_cast<const T*>(got.data()), mine, n, op);
    ex.finish(dst, n, op, ranks);
    return std::as_bytes(std::span<const T>(dst, n));
  }
  static std::span<std::byte> recv_target(T* dst, std::size_t n, std::byte*) noexcept {
    return std::as_writable_bytes(std::span<T>(dst, n));
  }
  void copy(std::span<std::byte> got, T* dst, std::size_t n) const {
    ex.copy(dst, reinterpret_cast<const T*>(got.data()), n);
  }
  void combine(std::span<std::byte> got, const T* mine, T* acc, std::size_t n, bool got_first) const {
    const auto phase = element_phase(trace, "reduce", "compute", n);
    const auto* g = reinterpret_cast<const T*>(got.data());
    ex.reduce(acc, got_first ? g : mine, got_first ? mine : g, n, op);
  }
  void finish(T* dst, std::size_t n) const { ex.finish(dst, n, op, ranks); }
  void assign(T* dst, const T* src, std::size_t n) const { ex.copy(dst, src, n); }
  void local(const T* mine, T* dst, std::size_t n) const {
    ex.copy(dst, mine, n);
    finish(dst, n);
  }
  void fence() const { ex.fence(); }
};

/// Posts the receive of one segment of `S` into `d`: exact-size for
/// fixed-size wire forms, up-to otherwise.
template <segment_op S, transport C> auto post_recv(C& c, std::span<std::byte> d, int peer, int tag) {
  if constexpr (S::exact) return c.irecv(d, peer, tag);
  else return c.irecv_upto(d, peer, tag);
}
/// Request type of post_recv<S> on transport C.
template <segment_op S, transport C>
using recv_request_t = decltype(post_recv<S>(std::declval<C&>(), std::span<std::byte>{}, 0, 0));
/// The bytes that arrived in `d` for the completed receive `r`.
template <segment_op S, class R> std::span<std::byte> arrived(const R& r, std::span<std::byte> d) {
  if constexpr (S::exact) return d;
  else return d.first(r.received());
}
/// Receives one segment of `S` into `d` from `peer` and returns what arrived.
template <segment_op S, transport C> std::span<std::byte> recv_segment(C& c, std::span<std::byte> d, int peer, int tag) {
  auto r = post_recv<S>(c, d, peer, tag);
  r.wait();
  return arrived<S>(r, d);
}

/// Sends the wire form of `n` local elements at `mine` to `peer`, encoded
/// into `stage` when the operation stages its sends (then fenced: the
/// executor wrote it).
template <segment_op S, transport C>
request_t<C> send_segment(C& c, const S& sop, const typename S::value_type* mine, std::size_t n,
                          std::byte* stage, int peer, int tag) {
  const auto w = sop.wire(mine, n, stage);
  if constexpr (S::staged_send) sop.fence();
  return c.isend(w, peer, tag);
}

/// At most `width` sends in flight: a new one first waits for the oldest.
/// Width 1 completes each send at once: a send left in flight while the
/// rank waited for its next receive made a 512 KiB chain broadcast on 64
/// SimGrid SMPI ranks take 5124 us instead of 3940 (the cause is in SMPI's
/// progress of large sends; not traced further).
template <transport C> class send_window {
public:
  explicit send_window(std::size_t width) : width_(width) {}
  void push(request_t<C>&& r) {
    if (width_ <= 1) {
      r.wait();
      return;
    }
    if (q_.size() >= width_) {
      q_.front().wait();
      q_.pop_front();
    }
    q_.push_back(std::move(r));
  }
  /// Waits for every send still in flight.
  void drain() {
    for (; !q_.empty(); q_.pop_front()) q_.front().wait();
  }

private:
  std::size_t width_;
  std::deque<request_t<C>> q_;
};

/// Rotating staging slots for segments sent (or forwarded) out of them:
/// slot k % count is handed out again only after every send out of it has
/// completed, so a pipelined schedule never overwrites bytes in flight.
template <transport C> class slot_pool {
public:
  slot_pool(std::byte* mem, std::size_t stride, std::size_t count) : mem_(mem), stride_(stride), count_(count) {}
  /// Slot k, once the sends out of its previous use completed.
  std::byte* acquire(std::size_t k) {
    if (pending_.empty()) pending_.resize(count_); // allocated only by schedules that stage
    wait_all(pending_[k % count_]);
    return mem_ + (k % count_) * stride_;
  }
  /// A send out of slot k.
  void hold(std::size_t k, request_t<C>&& r) { pending_[k % count_].push_back(std::move(r)); }
  /// Waits for every send out of any slot.
  void drain() {
    for (auto& v : pending_) wait_all(v);
  }

private:
  std::byte* mem_;
  std::size_t stride_, count_;
  std::vector<std::vector<request_t<C>>> pending_;
};

} // namespace gradsync::algo
