// gradsync: broadcast and reduce straight out of shared memory (the `direct`
// algorithm of the rooted collectives), for transports that expose a
// collective arena (transport/shm.hpp). Built on the rounds of
// algo/shm_direct.hpp; no messages.
//
// Broadcast: the root stages its buffer into its arena a round (at most
// policy::shm_rooted_round_bytes) at a time, and every other rank copies the
// round out of the root's arena into its own buffer. Each round:
//   root: copy in -> post `copied`; everyone: await `copied`
//   others: copy out of the root's arena -> post `drained`
// The two arena halves alternate, so the root stages round e+1 while the
// others still copy round e out (a half is rewritten only after every rank
// drained it two rounds earlier): per rank one copy of the buffer, the
// root's and the others' running side by side.
//
// Reduce: rounds as the broadcast's, the other way. Each round:
//   others: stage their piece -> post `copied`; everyone: await `copied`
//   root: combine every rank's piece in rank order, reading the staged
//   pieces in place (its own from `in`), into `out` -> post `drained`
// so every other rank copies its input once and the root makes one pass
// over p inputs, while the others stage the next round. (Spreading the
// reduction over the ranks, reduce-scatter style, measured slower at 2
// ranks: the root then also copies the others' results out, 4.1-4.3 GB/s
// at 16-256 MiB against ring's 3.5-4.4; docs/benchmarks.md, issue 32.)
// Up to policy::shm_direct_small_bytes: one round in which every rank
// stages its buffer and the root reduces all of it.
//
// Every element is reduced as op(...op(x0, x1)..., x(p-1)) in rank order, so
// the result is the same whichever rank is root and from run to run.
// Ranks must agree on the call (count, dtype, op, collective, root): the
// arena signature checks all but the root; the call's fingerprint (in band,
// collectives.hpp) checks the root too.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/ops.hpp"
#include "../core/policy.hpp"
#include "../core/reduce.hpp"
#include "../transport/capabilities.hpp"
#include "shm_direct.hpp"

namespace gradsync::algo::shm_direct {

namespace detail {

// Signature of a rooted call: bit 63 set, call bits 0 (broadcast) or 1 (reduce).
template <element T> std::uint64_t rooted_signature(bool reduce, std::size_t count, op_kind o) {
  return (static_cast<std::uint64_t>(count) & ((std::uint64_t{1} << 48) - 1)) |
         static_cast<std::uint64_t>(dtype_traits<T>::id) << 48 | static_cast<std::uint64_t>(o) << 56 |
         static_cast<std::uint64_t>(reduce ? 1 : 0) << 60 | std::uint64_t{1} << 63;
}

// Elements of T per round of a rooted call: policy::shm_rooted_round_bytes,
// at most an arena half, at least one per rank.
template <class T, shared_arena C> std::size_t rooted_round_elems(const C& c, const char* name) {
  const std::size_t cap = arena_elems<T>(c, name);
  return std::min(cap, std::max(static_cast<std::size_t>(c.size()), policy::shm_rooted_round_bytes / sizeof(T)));
}

} // namespace detail

/// Broadcast of `count` elements of `data` from `root` through the arena.
/// Every rank must call it with the same count, type and root.
template <shared_arena C, element T> void broadcast(C& c, T* data, std::size_t count, int root) {
  using namespace detail;
  const int p = c.size(), r = c.rank();
  if (p == 1 || count == 0) return;
  const char* name = "broadcast";
  const std::size_t step = rooted_round_elems<T>(c, name);
  const std::uint64_t sig = rooted_signature<T>(false, count, op_kind::sum);
  const bool stream = count * sizeof(T) >= policy::shm_stream_out_bytes;
  std::uint64_t& epoch = c.arena_epoch();
  with_stores(c, call::broadcast, count * sizeof(T), [&](bool streamed) {
    for (std::size_t k = 0; k < count; k += step) {
      const std::uint64_t e = ++epoch;
      const std::size_t m = std::min(step, count - k);
      open_round(c, e, sig, name, [&] {
        if (r == root) put(c, streamed, stage<T>(c, r, e), data + k, m);
      });
      if (r != root) {
        const scoped_phase phase(trace_of(c), "copy_out", "transport");
        put(c, stream, data + k, static_cast<const T*>(stage<T>(c, root, e)), m);
      }
      c.arena_post(drained, e);
    }
  });
}

/// Reduce of `count` elements of every rank's `in` into `out` at `root`
/// (`out` is not touched elsewhere; at the root it may be `in`) through the
/// arena. Every rank must call it with the same count, type, operator and root.
template <shared_arena C, element T, reduce_op Op>
void reduce(C& c, const T* in, T* out, std::size_t count, int root, Op op) {
  using namespace detail;
  const int p = c.size(), r = c.rank();
  if (p == 1) {
    alone(p, in, out, count, op);
    return;
  }
  if (count == 0) return;
  const char* name = "reduce";
  const std::size_t cap = arena_elems<T>(c, name);
  const std::uint64_t sig = rooted_signature<T>(true, count, Op::kind);
  std::uint64_t& epoch = c.arena_epoch();

  if (count * sizeof(T) <= policy::shm_direct_small_bytes && count <= cap) {
    // One round: everyone stages all of it, the root reduces every copy
    // (its own staged too: in place, `out` is overwritten before the pass
    // that would read it from `in`).
    const std::uint64_t e = ++epoch;
    auto run = [&](bool streamed) {
      open_round(c, e, sig, name, [&] { put(c, streamed, stage<T>(c, r, e), in, count); });
      if (r == root) {
        const auto phase = element_phase(trace_of(c), "reduce", "compute", count);
        auto src = [&](int q) { return static_cast<const T*>(stage<T>(c, q, e)); };
        combine_wide(out, src(0), src(1), count, op);
        for (int q = 2; q < p; ++q) combine_wide(out, static_cast<const T*>(out), src(q), count, op);
        finalize(out, count, op, p);
      }
      c.arena_post(drained, e);
    };
    if (count * sizeof(T) < policy::shm_timed_stores_min_bytes) run(false);
    else with_stores(c, call::reduce, count * sizeof(T), run);
    return;
  }

  // Rounds of an arena half: every other rank stages its piece, the root
  // combines the staged pieces in place (its own read from `in`) into `out`
  // while the others stage the next round into the other half.
  // (At least policy::shm_rooted_min_rounds rounds, so that staging and
  // combining overlap on small buffers too.)
  const std::size_t step = std::min(rooted_round_elems<T>(c, name),
                                    std::max(policy::shm_direct_small_bytes / sizeof(T),
                                             (count + policy::shm_rooted_min_rounds - 1) / policy::shm_rooted_min_rounds));
  const bool stream = count * sizeof(T) >= policy::shm_stream_out_bytes;
  std::vector<const T*> src(static_cast<std::size_t>(p));
  with_stores(c, call::reduce, count * sizeof(T), [&](bool streamed) {
    for (std::size_t k = 0; k < count; k += step) {
      const std::uint64_t e = ++epoch;
      const std::size_t m = std::min(step, count - k);
      open_round(c, e, sig, name, [&] {
        if (r != root) put(c, streamed, stage<T>(c, r, e), in + k, m);
      });
      if (r == root) {
        const auto phase = element_phase(trace_of(c), "reduce", "compute", m);
        for (int q = 0; q < p; ++q)
          src[static_cast<std::size_t>(q)] = q == r ? in + k : static_cast<const T*>(stage<T>(c, q, e));
        T* const dst[1] = {out + k};
        if (stream) { // fused, streaming stores (in place is safe: each line is read before it is written)
          reduce_to_all(c, p, src.data(), dst, 1, m, op);
        } else {
          reduce_pieces<T>(
              p, m, op, [&](int q) { return src[static_cast<std::size_t>(q)]; },
              [&](std::size_t j, const T* acc, std::size_t len) { copy_elems(out + k + j, acc, len); });
        }
      }
      c.arena_post(drained, e);
    }
  });
}

} // namespace gradsync::algo::shm_direct
