// gradsync: alltoall(v) straight through shared memory (the `direct`
// schedule of the exchange family), for transports with a collective arena
// (transport/shm.hpp). No messages: each round every rank stages a slice of
// each outgoing block in its own arena, publishes `copied`, waits for every
// rank's, copies the slice of every peer's block meant for it out of that
// peer's arena into its output, and publishes `drained`. One synchronisation
// per round instead of a message, ack and match per peer, and a small call
// is one round.
//
// Each round's arena half starts with a header the owner rewrites every
// round: what it sends each rank (bytes), what it expects from each rank
// (bytes, or `unknown` when it learns its counts) and how much its output
// holds. After the first round every rank reads every header, so every rank
// sees every pair and raises the same error on any pair that disagrees
// ("rank a sends rank b N items but rank b expects M"), or on a rank whose
// output is too small for what it is sent, before any byte lands. The same
// headers give the round count (the largest block over all pairs, in slices
// of (half - header) / p bytes) and, for learned counts, what each peer
// sends here: the count exchange costs nothing extra.
//
// A half is rewritten only after every rank drained it two rounds earlier
// (shm_direct's open_round). In place (alltoall with in == out) is safe:
// round k stages bytes [k s, (k + 1) s) of every outgoing block before it
// copies the same range of every incoming block over them, and later rounds
// touch later ranges only.
// Cost: rounds x sync + p m x copy (select.hpp's exchange(): staging and copying out through
// the cached arena move each byte through memory about once; the own block copied directly).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include "../core/error.hpp"
#include "../core/policy.hpp"
#include "../transport/capabilities.hpp"
#include "exchange.hpp"
#include "shm_direct.hpp"

namespace gradsync::algo::alltoall_direct {

/// An expected count this rank does not know (alltoallv_dynamic learns it).
inline constexpr std::uint64_t unknown = std::numeric_limits<std::uint64_t>::max();

namespace detail {

using namespace gradsync::algo::shm_direct::detail;

// Signature of an exchange round: rooted-call bit 63, call bits 2 (see
// shm_direct's call_name), the equal block length in bytes (0 for
// alltoallv: its counts are checked pairwise in the headers).
inline std::uint64_t signature(std::uint64_t block_bytes) {
  return (block_bytes & ((std::uint64_t{1} << 48) - 1)) | std::uint64_t{2} << 60 | std::uint64_t{1} << 63;
}

// Header words of rank q's half: [0, p) sent to each rank, [p, 2p) expected
// from each rank, [2p] output capacity (bytes).
inline std::size_t header_bytes(int p) {
  const std::size_t a = policy::shm_arena_align;
  return ((2 * static_cast<std::size_t>(p) + 1) * sizeof(std::uint64_t) + a - 1) / a * a;
}
inline const std::uint64_t* header(const std::byte* half) { return reinterpret_cast<const std::uint64_t*>(half); }

// Slice bytes per destination in a round: what is left of a half after the
// header, split over the p ranks, in cache lines.
template <shared_arena C> std::size_t slice_bytes(const C& c, const char* name) {
  const std::size_t p = static_cast<std::size_t>(c.size());
  const std::size_t h = half_bytes(c), hb = header_bytes(c.size());
  GRADSYNC_REQUIRE(h > hb && (h - hb) / p >= policy::shm_arena_align, name, c.rank(),
                   "shm arena too small for an exchange among " + std::to_string(p) + " ranks");
  return (h - hb) / p / policy::shm_arena_align * policy::shm_arena_align;
}

// The first pair (sender a, receiver b) whose counts disagree
// (errc::mismatch), or a rank whose output cannot hold what it is sent
// (errc::invalid_argument): the same answer on every rank, as all read the
// same headers. An empty `why` when all agree.
struct verdict {
  errc kind = errc::mismatch;
  std::string why;
};
template <shared_arena C> verdict disagreement(const C& c, std::uint64_t e, std::size_t elem) {
  const int p = c.size();
  const auto P = static_cast<std::size_t>(p);
  for (int b = 0; b < p; ++b) {
    const std::uint64_t* hb = header(reinterpret_cast<const std::byte*>(stage<std::byte>(c, b, e)));
    std::uint64_t total = 0;
    for (int a = 0; a < p; ++a) {
      const std::uint64_t sent = header(reinterpret_cast<const std::byte*>(stage<std::byte>(c, a, e)))[b];
      const std::uint64_t want = hb[P + static_cast<std::size_t>(a)];
      if (want != unknown && sent != want)
        return {errc::mismatch, "rank " + std::to_string(a) + " sends rank " + std::to_string(b) + " " +
                                    std::to_string(sent / elem) + " items but rank " + std::to_string(b) +
                                    " expects " + std::to_string(want / elem)};
      total += sent;
    }
    if (total > hb[2 * P])
      return {errc::invalid_argument, "rank " + std::to_string(b) + " receives " + std::to_string(total / elem) +
                                          " elements but its output holds " + std::to_string(hb[2 * P] / elem)};
  }
  return {};
}

} // namespace detail

/// Where what arrives goes: known counts (recv side of the layout), or
/// learned ones (`learned` non-empty: filled with what each rank sends here,
/// in elements, and `place(total)` returns the output, packed in rank order,
/// once every rank's header is read; `capacity` is what the output can hold,
/// checked on every rank first).
struct receive {
  std::span<std::size_t> learned{};
  std::size_t capacity = std::numeric_limits<std::size_t>::max();
};

/// Runs the exchange of layout `l` through the arena. `block_bytes`: the
/// equal block length of an alltoall (part of the round signature), 0 for
/// alltoallv. With `rx.learned` the layout's receive side is ignored and
/// `place(total_elements)` gives the output (a std::byte*); it runs on every
/// rank after the first round, and a throw from it aborts the group.
template <shared_arena C, class Place>
void run(C& c, const exchange::layout& l, std::uint64_t block_bytes, const receive& rx, Place&& place,
         const char* name) {
  using namespace detail;
  const int p = c.size(), r = c.rank();
  const auto P = static_cast<std::size_t>(p);
  const bool learn = !rx.learned.empty();
  if (p == 1) {
    if (learn) {
      rx.learned[0] = l.send_counts[0];
      std::byte* out = place(l.send_counts[0]);
      if (l.send_bytes(0)) std::memmove(out, l.send_at(0), l.send_bytes(0));
    } else {
      exchange::copy_self(l, r);
    }
    return;
  }
  const std::size_t s = slice_bytes(c, name), hb = header_bytes(p);
  const std::uint64_t sig = detail::signature(block_bytes);
  std::size_t largest = 0, total_in = 0;
  for (int q = 0; q < p; ++q) largest = std::max(largest, l.send_bytes(q));
  for (int q = 0; q < p && !learn; ++q) total_in += l.recv_bytes(q);
  const bool stream = std::max(total_in, largest * P) >= policy::shm_stream_out_bytes;
  std::uint64_t& epoch = c.arena_epoch();
  std::byte* out = learn ? nullptr : l.recv;
  with_stores(c, call::alltoall, largest * P, [&](bool streamed) {
    std::size_t rounds = 1;
    for (std::size_t k = 0; k < rounds; ++k) {
      const std::uint64_t e = ++epoch;
      const std::size_t at = k * s;
      open_round(c, e, sig, name, [&] {
        std::byte* half = stage<std::byte>(c, r, e);
        auto* w = reinterpret_cast<std::uint64_t*>(half);
        for (int q = 0; q < p; ++q) {
          const auto Q = static_cast<std::size_t>(q);
          w[Q] = l.send_bytes(q);
          w[P + Q] = learn ? (q == r ? l.send_bytes(q) : unknown) : l.recv_bytes(q);
          const std::size_t n = q == r || at >= w[Q] ? 0 : std::min(s, static_cast<std::size_t>(w[Q]) - at);
          if (n) put(c, streamed, half + hb + Q * s, l.send_at(q) + at, n);
        }
        w[2 * P] = learn && rx.capacity <= std::numeric_limits<std::uint64_t>::max() / l.elem
                       ? rx.capacity * l.elem
                       : std::numeric_limits<std::uint64_t>::max();
      });
      if (k == 0) {
        if (verdict v = disagreement(c, e, l.elem); !v.why.empty())
          throw error(v.kind, name, r, -1, v.why); // every rank, alike: none aborts the others
        std::size_t most = 0, total = 0;
        for (int a = 0; a < p; ++a)
          for (int b = 0; b < p; ++b)
            if (a != b) most = std::max<std::size_t>(most, header(stage<std::byte>(c, a, e))[b]);
        rounds = std::max<std::size_t>(1, (most + s - 1) / s);
        if (learn) {
          for (int q = 0; q < p; ++q) {
            const std::size_t n = header(stage<std::byte>(c, q, e))[r] / l.elem;
            rx.learned[static_cast<std::size_t>(q)] = n;
            total += n;
          }
          try {
            out = place(total);
          } catch (const error& ex) {
            c.abort(std::string(name) + " on rank " + std::to_string(r) + ": " + ex.reason());
            throw;
          }
          std::size_t self_at = 0;
          for (int q = 0; q < r; ++q) self_at += rx.learned[static_cast<std::size_t>(q)] * l.elem;
          if (const std::size_t n = l.send_bytes(r)) std::memmove(out + self_at, l.send_at(r), n);
        } else {
          exchange::copy_self(l, r);
        }
      }
      {
        const scoped_phase phase(trace_of(c), "copy_out", "transport");
        std::size_t packed = 0; // learned: where rank q's block starts
        for (int q = 0; q < p; ++q) {
          const auto Q = static_cast<std::size_t>(q);
          const std::size_t from = header(stage<std::byte>(c, q, e))[r];
          std::byte* dst = learn ? out + packed : l.recv_at(q);
          if (learn) packed += rx.learned[Q] * l.elem;
          if (q == r || at >= from) continue;
          put(c, stream, dst + at, stage<std::byte>(c, q, e) + hb + static_cast<std::size_t>(r) * s,
              std::min(s, from - at));
        }
      }
      c.arena_post(drained, e);
    }
  });
}

/// run() with the counts known on both sides.
template <shared_arena C>
void run(C& c, const exchange::layout& l, std::uint64_t block_bytes, const char* name) {
  run(c, l, block_bytes, receive{},
      [&](std::size_t) -> std::byte* { throw error(errc::internal, name, c.rank(), -1, "no counts to learn"); }, name);
}

} // namespace gradsync::algo::alltoall_direct
