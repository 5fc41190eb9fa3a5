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
#pragma once

#include <concepts>
#include <cstddef>
#include <span>

#include "../core/dtype.hpp"
#include "../core/ops.hpp"
#include "../exec/executor.hpp"

namespace gradsync::algo {

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
  s.local(mine, dst, n);
  s.fence();
};

/// The typed reduction: segments travel as elements; a received segment is
/// reduced as op(received, local) by the executor, in the receive slot.
/// `ranks` is the divisor of avg's final step.
template <element T, reduce_op Op, executor E> struct typed_reduce {
  using value_type = T;
  static constexpr bool exact = true;
  static constexpr bool in_place_copy = true;
  static constexpr bool staged_send = false;

  E& ex;
  Op op;
  int ranks;

  static std::size_t slot_bytes(std::size_t n) noexcept { return n * sizeof(T); }
  static std::span<const std::byte> wire(const T* mine, std::size_t n, std::byte*) noexcept {
    return std::as_bytes(std::span<const T>(mine, n));
  }
  std::span<const std::byte> reduce(std::span<std::byte> got, const T* mine, std::size_t n, std::byte*) const {
    T* acc = reinterpret_cast<T*>(got.data());
    ex.reduce(acc, static_cast<const T*>(acc), mine, n, op);
    return got.first(n * sizeof(T));
  }
  std::span<const std::byte> reduce_copy(std::span<std::byte> got, const T* mine, T* dst, std::size_t n) const {
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
  void local(const T* mine, T* dst, std::size_t n) const {
    ex.copy(dst, mine, n);
    ex.finish(dst, n, op, ranks);
  }
  void fence() const { ex.fence(); }
};

} // namespace gradsync::algo
