// gradsync: allreduce straight out of shared memory, for transports that
// expose a collective arena (transport/shm.hpp). No messages: every rank
// stages its input once, reduces its 1/p share reading every peer's staged
// copy in place, and copies the other shares' results out of the owners'
// arenas. Per rank that is one copy in, one pass of reduction and one copy
// out, against 2(p-1)/p copies each way plus p-1 round trips for a ring.
//
// Large buffers go in rounds through two alternating halves of the arena, so
// a rank stages round e+1 while slower peers still read round e. Each round:
//   copy in (all shares but mine) -> post `copied`
//   await `copied`, reduce my share into `out`, finalize, copy it into my
//   arena -> post `reduced`
//   await `reduced`, copy the others' shares out -> post `drained`
// Writes into the arena use streaming stores (arena_copy): the lines were
// last read by other cores, and ordinary stores would first fetch each back.
// A half is rewritten only after every rank drained it two rounds earlier.
// Small buffers take one round in which every rank reduces the whole buffer
// from all staged copies (one synchronisation instead of two).
//
// Determinism: every element is reduced as op(...op(x0, x1)..., x(p-1)) in
// rank order, by one rank (large) or identically by all (small), so all ranks
// hold bitwise identical results, the same from run to run.
#pragma once

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/policy.hpp"
#include "../core/reduce.hpp"
#include "../transport/transport.hpp"

namespace gradsync::algo::shm_direct {

/// A transport whose ranks share memory through a collective arena.
template <class C>
concept arena_transport = transport<C> && requires(C& c, int q, int k, std::uint64_t v) {
  { c.arena(q) } -> std::same_as<std::byte*>;
  { c.arena_bytes() } -> std::convertible_to<std::size_t>;
  c.arena_post(k, v);
  c.arena_await(k, v, "");
  { c.arena_epoch() } -> std::same_as<std::uint64_t&>;
  { c.arena_signature(q, k) } -> std::same_as<std::atomic<std::uint64_t>&>;
  c.arena_copy(static_cast<std::byte*>(nullptr), static_cast<const std::byte*>(nullptr), std::size_t{0});
  c.abort(std::string());
};

namespace detail {

enum counter : int { copied = 0, reduced = 1, drained = 2 };

// What a call is, packed so that ranks can compare calls: count (48 bits),
// dtype and operator.
template <element T, reduce_op Op> std::uint64_t signature(std::size_t count) {
  return (static_cast<std::uint64_t>(count) & ((std::uint64_t{1} << 48) - 1)) |
         static_cast<std::uint64_t>(dtype_traits<T>::id) << 48 |
         static_cast<std::uint64_t>(Op::kind) << 56;
}

// The reduction runs on chunks this large (bytes: half of L1), so that all
// p-1 passes over a chunk hit L1.
template <class T> inline constexpr std::size_t chunk_elems = 16384 / sizeof(T);

// out = op(a, b) elementwise, exactly as combine() computes it, but 64 bytes
// per step through GCC vector types (combine's loop stays scalar at -O2, as
// `out` may alias an input; here each vector is loaded before it is stored,
// so exact aliasing is still fine). For types reduced in their own precision.
template <element T, reduce_op Op> void combine_wide(T* out, const T* a, const T* b, std::size_t n, Op op) {
  std::size_t i = 0;
#if defined(__GNUC__)
  if constexpr (std::is_same_v<T, accum_t<T>> && std::is_arithmetic_v<T>) {
    using vec [[gnu::vector_size(16)]] = T; // SSE2-sized: no ABI change in op()
    constexpr std::size_t w = 16 / sizeof(T);
    for (; i + 4 * w <= n; i += 4 * w) {
      vec x[4], y[4];
      std::memcpy(x, a + i, sizeof x);
      std::memcpy(y, b + i, sizeof y);
      for (int k = 0; k < 4; ++k) x[k] = op(x[k], y[k]);
      std::memcpy(out + i, x, sizeof x);
    }
  }
#endif
  combine(out + i, a + i, b + i, n - i, op);
}

inline std::string describe(std::uint64_t sig) {
  return "count " + std::to_string(sig & ((std::uint64_t{1} << 48) - 1)) + ", dtype " +
         std::to_string((sig >> 48) & 0xff) + ", op " + std::to_string(sig >> 56);
}

// Every rank must run the same call: otherwise fail every rank now (the
// arena rounds would no longer line up).
template <arena_transport C> void check_signatures(C& c, int h, std::uint64_t mine) {
  for (int q = 0; q < c.size(); ++q) {
    const std::uint64_t theirs = c.arena_signature(q, h).load(std::memory_order_relaxed);
    if (theirs == mine) continue;
    const std::string why = "ranks disagree on the call: rank " + std::to_string(c.rank()) + " has " +
                            describe(mine) + ", rank " + std::to_string(q) + " has " + describe(theirs);
    c.abort(why);
    throw error("allreduce", c.rank(), q, why);
  }
}

} // namespace detail

/// Elements one arena half holds for T.
template <arena_transport C, element T> std::size_t half_elems(const C& c) {
  return c.arena_bytes() / 2 / sizeof(T);
}

/// Allreduce of `count` elements from `in` into `out` (may be equal) through
/// the arena. Every rank must call it with the same count, type and operator
/// (checked: a mismatch fails every rank with an error naming both calls).
template <arena_transport C, element T, reduce_op Op>
void allreduce(C& c, const T* in, T* out, std::size_t count, Op op) {
  const int p = c.size(), r = c.rank();
  if (p == 1 || count == 0) {
    copy_elems(out, in, count);
    finalize(out, count, op, p);
    return;
  }
  const std::size_t half_bytes = c.arena_bytes() / 2 / policy::shm_arena_align * policy::shm_arena_align;
  const std::size_t cap = half_bytes / sizeof(T);
  require(cap >= static_cast<std::size_t>(p), "allreduce", r, "shm arena too small for this rank count");
  const std::uint64_t sig = detail::signature<T, Op>(count);
  std::uint64_t& epoch = c.arena_epoch();
  auto stage = [&](int q, std::uint64_t e) {
    return reinterpret_cast<T*>(c.arena(q) + (e & 1) * half_bytes);
  };
  auto begin_round = [&](std::uint64_t e) {
    if (e > 2) c.arena_await(detail::drained, e - 2, "allreduce"); // half free again
    c.arena_signature(r, static_cast<int>(e & 1)).store(sig, std::memory_order_relaxed);
  };

  if (count * sizeof(T) <= policy::shm_direct_small_bytes && count <= cap) {
    const std::uint64_t e = ++epoch;
    begin_round(e);
    c.arena_copy(reinterpret_cast<std::byte*>(stage(r, e)), reinterpret_cast<const std::byte*>(in), count * sizeof(T));
    c.arena_post(detail::copied, e);
    c.arena_await(detail::copied, e, "allreduce");
    detail::check_signatures(c, static_cast<int>(e & 1), sig);
    // Everyone reduces everything, in rank order, from the staged copies
    // (never from `in`, which may be `out`).
    detail::combine_wide(out, static_cast<const T*>(stage(0, e)), static_cast<const T*>(stage(1, e)), count, op);
    for (int q = 2; q < p; ++q)
      detail::combine_wide(out, static_cast<const T*>(out), static_cast<const T*>(stage(q, e)), count, op);
    finalize(out, count, op, p);
    c.arena_post(detail::drained, e);
    return;
  }

  // Shares of a round: `shard` elements each (a multiple of the alignment),
  // the last round's shares clipped.
  const std::size_t align = std::max<std::size_t>(1, policy::shm_arena_align / sizeof(T));
  const auto P = static_cast<std::size_t>(p);
  const std::size_t per_rank = (count + P - 1) / P;
  std::size_t shard = std::min(cap / P, (per_rank + align - 1) / align * align);
  shard = std::max<std::size_t>(1, shard / align * align);
  if (shard * P > cap) shard = cap / P;
  auto part = [&](std::size_t base, int q, std::size_t& off) {
    off = base + static_cast<std::size_t>(q) * shard;
    return off >= count ? std::size_t{0} : std::min(shard, count - off);
  };
  auto to_arena = [&](T* dst, const T* src, std::size_t n) {
    c.arena_copy(reinterpret_cast<std::byte*>(dst), reinterpret_cast<const std::byte*>(src), n * sizeof(T));
  };
  // Results too big to stay in cache go to `out` with streaming stores too
  // (no read-for-ownership of lines about to be overwritten).
  const bool stream_out = count * sizeof(T) >= policy::shm_stream_out_bytes;
  auto to_out = [&](T* dst, const T* src, std::size_t n) {
    if (stream_out) to_arena(dst, src, n);
    else std::memcpy(dst, src, n * sizeof(T));
  };
  for (std::size_t base = 0; base < count; base += shard * P) {
    const std::uint64_t e = ++epoch;
    const int h = static_cast<int>(e & 1);
    begin_round(e);
    T* mine = stage(r, e);
    std::size_t off;
    for (int q = 0; q < p; ++q)
      if (q != r)
        if (const std::size_t n = part(base, q, off)) to_arena(mine + (off - base), in + off, n);
    c.arena_post(detail::copied, e);

    c.arena_await(detail::copied, e, "allreduce");
    detail::check_signatures(c, h, sig);
    // My share, a cache-resident chunk at a time: all p-1 combine passes in
    // `acc`, then out to `out` and to my arena, where the peers read it.
    // (In place, my share of `in` is fully read before it is overwritten.)
    const std::size_t n = part(base, r, off);
    for (std::size_t k = 0; k < n; k += detail::chunk_elems<T>) {
      alignas(64) T acc[detail::chunk_elems<T>];
      const std::size_t m = std::min(detail::chunk_elems<T>, n - k), at = off + k;
      auto src = [&](int q) { return q == r ? in + at : static_cast<const T*>(stage(q, e) + (at - base)); };
      detail::combine_wide(acc, src(0), src(1), m, op);
      for (int q = 2; q < p; ++q) detail::combine_wide(acc, static_cast<const T*>(acc), src(q), m, op);
      finalize(acc, m, op, p);
      to_out(out + at, acc, m);
      to_arena(mine + (at - base), acc, m);
    }
    c.arena_post(detail::reduced, e);

    c.arena_await(detail::reduced, e, "allreduce");
    for (int q = 0; q < p; ++q)
      if (q != r)
        if (const std::size_t m = part(base, q, off)) to_out(out + off, stage(q, e) + (off - base), m);
    c.arena_post(detail::drained, e);
  }
}

} // namespace gradsync::algo::shm_direct
