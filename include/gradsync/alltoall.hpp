// gradsync: the exchange family, for mixture-of-experts dispatch/combine and
// graph neural networks' halo exchange: alltoall (equal blocks), alltoallv
// (per-peer counts, known or learned), neighbor_alltoallv (only the edges of
// a graph) and exchange_plan (counts, displacements and schedule fixed once,
// checked pairwise, reused every step). Every call validates its arguments,
// checks that the ranks make the same call (collectives.hpp's run_call) and
// runs over any transport; counts that disagree between two ranks fail the
// receive's size check (errc::mismatch) instead of hanging or reading short.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "algo/alltoall_bruck.hpp"
#include "algo/alltoall_direct.hpp"
#include "algo/alltoall_hier.hpp"
#include "algo/alltoall_pairwise.hpp"
#include "algo/alltoall_scattered.hpp"
#include "algo/exchange.hpp"
#include "algo/neighbor_exchange.hpp"
#include "collectives.hpp"
#include "core/hash.hpp"
#include "gossip/topology.hpp"

namespace gradsync {

/// A communication graph as one rank sees it (MPI_Dist_graph_create_adjacent's
/// view): the ranks it receives from and the ranks it sends to. Entries may
/// repeat (several messages between one pair, matched in list order) and may
/// name the rank itself (a local copy: the k-th self destination fills the
/// k-th self source).
struct neighbors {
  std::vector<int> sources;
  std::vector<int> destinations;
};

/// The neighbours of `rank` in a gossip mixing matrix: it receives from its
/// in-neighbours and sends to its out-neighbours (a halo exchange over the
/// graph a gossip topology describes).
inline neighbors neighbors_of(const gossip::mixing& w, int rank) {
  GRADSYNC_REQUIRE(rank >= 0 && rank < w.size(), "neighbors_of", rank,
                   "rank out of range [0, " + std::to_string(w.size()) + ")");
  neighbors g;
  for (const gossip::edge& e : w.in(rank)) g.sources.push_back(e.peer);
  for (const gossip::edge& e : w.out(rank)) g.destinations.push_back(e.peer);
  return g;
}

namespace detail {

// Checks a count list and its displacements against a buffer of `size`
// elements: every block inside it, no two blocks of an output overlapping.
inline void check_blocks(std::span<const std::size_t> counts, std::span<const std::size_t> displs, std::size_t size,
                         bool output, const char* op, int rank, const char* what) {
  GRADSYNC_REQUIRE(counts.size() == displs.size(), op, rank,
                   std::string(what) + ": " + std::to_string(counts.size()) + " counts but " +
                       std::to_string(displs.size()) + " displacements");
  for (std::size_t q = 0; q < counts.size(); ++q)
    GRADSYNC_REQUIRE(displs[q] <= size && counts[q] <= size - displs[q], op, rank,
                     std::string(what) + " block " + std::to_string(q) + " [" + std::to_string(displs[q]) + ", +" +
                         std::to_string(counts[q]) + ") lies outside the buffer of " + std::to_string(size) +
                         " elements");
  if (!output) return;
  std::vector<std::size_t> order(counts.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return displs[a] < displs[b]; });
  for (std::size_t i = 1; i < order.size(); ++i) {
    const std::size_t a = order[i - 1], b = order[i];
    GRADSYNC_REQUIRE(counts[a] == 0 || counts[b] == 0 || displs[a] + counts[a] <= displs[b], op, rank,
                     std::string(what) + " blocks " + std::to_string(a) + " and " + std::to_string(b) +
                         " overlap (a receive would overwrite another)");
  }
}

inline std::size_t sum_checked(std::span<const std::size_t> counts, const char* op, int rank, const char* what) {
  std::size_t s = 0;
  for (const std::size_t n : counts) {
    GRADSYNC_REQUIRE(n <= std::numeric_limits<std::size_t>::max() / 4 - s, op, rank,
                     std::string(what) + " overflow size_t");
    s += n;
  }
  return s;
}

inline std::vector<std::size_t> packed(std::span<const std::size_t> counts) {
  std::vector<std::size_t> d(counts.size());
  algo::exchange::packed_displs(counts, d);
  return d;
}

template <class T, class U> bool overlaps(std::span<T> a, std::span<U> b) {
  if (a.empty() || b.empty()) return false;
  const auto x = reinterpret_cast<std::uintptr_t>(a.data()), y = reinterpret_cast<std::uintptr_t>(b.data());
  return x < y + b.size_bytes() && y < x + a.size_bytes();
}

// The checks every alltoallv form makes of its arguments (p ranks; `r`
// this rank): spans, one count per rank, blocks inside their buffers and
// outputs not overlapping, the tag, and its block to itself.
template <class T>
void check_alltoallv(std::span<const T> in, std::span<const std::size_t> send_counts,
                     std::span<const std::size_t> send_displs, std::span<T> out,
                     std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs,
                     std::size_t p, int tag, const char* name, int r) {
  check_span(in, name, r, "input");
  check_span(out, name, r, "output");
  GRADSYNC_REQUIRE(send_counts.size() == p && recv_counts.size() == p, name, r,
                   std::to_string(send_counts.size()) + " send and " + std::to_string(recv_counts.size()) +
                       " receive counts for " + std::to_string(p) + " ranks (one per rank each)");
  check_blocks(send_counts, send_displs, in.size(), false, name, r, "send");
  check_blocks(recv_counts, recv_displs, out.size(), true, name, r, "receive");
  GRADSYNC_REQUIRE(!overlaps(in, out), name, r, "input and output overlap (alltoallv is not in place)");
  check_tag(tag, name, r);
  const auto me = static_cast<std::size_t>(r);
  GRADSYNC_REQUIRE(send_counts[me] == recv_counts[me], name, r,
                   "sends itself " + std::to_string(send_counts[me]) + " elements but expects " +
                       std::to_string(recv_counts[me]));
}

// The schedule of an alltoallv whose ranks may move different amounts: the
// call's own choice (pairwise and scattered exchange the same messages, so
// ranks may pick differently by their own largest block without breaking the
// matching), or the forced one.
// On a shared arena `automatic` is always `direct`, whatever the sizes: the
// arena's rounds involve every rank, so all must take it, and a choice by
// each rank's own largest block could split them.
// The two-level `hier` runs when forced (o.algo): automatic never picks it,
// as each rank's own pick may differ and hier's messages are not pairwise.
template <transport C> algorithm v_schedule(const C& c, std::size_t largest_bytes, const options& o, const char* op,
                                            bool hier_ok = false) {
  if (o.algo == algorithm::pairwise || o.algo == algorithm::scattered) return o.algo;
  if (o.algo == algorithm::direct && shared_arena<C>) return o.algo;
  if (o.algo == algorithm::hier && hier_ok) return o.algo;
  const std::string offered = std::string(" (pairwise, scattered") + (hier_ok ? ", hier" : "") +
                              (shared_arena<C> ? ", direct" : "") + ", auto)";
  GRADSYNC_REQUIRE(o.algo == algorithm::automatic, op, c.rank(),
                   "algorithm '" + std::string(algorithm_name(o.algo)) + "' is not available for " + op + offered);
  if constexpr (shared_arena<C>) return algorithm::direct;
  return selector_for<C>(o).choose_alltoall(largest_bytes, topology_of(c, o), false);
}

// Runs exchange `l` by `a` (pairwise, scattered, or direct on a shared
// arena); `block_bytes`: an alltoall's equal block (0 for alltoallv).
template <transport C>
void run_exchange(C& c, algorithm a, const algo::exchange::layout& l, int tag, const char* name,
                  std::uint64_t block_bytes = 0) {
  if constexpr (shared_arena<C>) {
    if (a == algorithm::direct) return algo::alltoall_direct::run(c, l, block_bytes, name);
  }
  if (a == algorithm::pairwise) algo::alltoall_pairwise::run(c, l, tag);
  else algo::alltoall_scattered::run(c, l, tag);
}

// Whether `a` can run an exchange on C.
template <transport C> constexpr bool exchange_schedule(algorithm a, bool equal) {
  return a == algorithm::pairwise || a == algorithm::scattered ||
         (equal && (a == algorithm::bruck || a == algorithm::hier)) || (shared_arena<C> && a == algorithm::direct);
}

} // namespace detail

/// The schedule `alltoall` runs for blocks of `block` elements of T:
/// o.algo, or for `automatic` the cheapest of pairwise, scattered, Bruck,
/// the two-level `hier` (where the ranks form several groups: o.group_size
/// or the transport's nodes) and `direct` on a shared arena, by the cost
/// model (GRADSYNC_ALGO may pin one per block size in bytes).
template <element T, transport C> algorithm alltoall_algorithm(const C& c, std::size_t block, const options& o = {}) {
  if (o.algo != algorithm::automatic) return o.algo;
  return detail::selector_for<C>(o).choose_alltoall(block * sizeof(T), topology_of(c, o), true);
}

/// The schedule `alltoallv` runs on this rank when its largest block (sent
/// or received) is `largest_bytes`: o.algo (pairwise, scattered, the
/// two-level hier, direct on a shared arena), or for `automatic` `direct` on
/// a shared arena (every rank must take it) and elsewhere the cheapest of
/// pairwise and scattered by the cost model (ranks may differ: the two
/// exchange the same messages).
template <transport C> algorithm alltoallv_algorithm(const C& c, std::size_t largest_bytes, const options& o = {}) {
  return detail::v_schedule(c, largest_bytes, o, "alltoallv", true);
}

/// Scratch bytes `alltoall` needs on this rank for blocks of `block`
/// elements (pass at least this much as o.workspace to avoid a per-call
/// allocation): Bruck's rotation and packing buffers, the two-level
/// schedule's packed and regrouped blocks, or for an in-place call of the
/// other schedules a copy of the input.
template <element T, transport C>
std::size_t alltoall_workspace_bytes(const C& c, std::size_t block, const options& o = {}, bool in_place = false) {
  const std::size_t b = block * sizeof(T);
  const algorithm a = alltoall_algorithm<T>(c, block, o);
  if (a == algorithm::bruck) return algo::alltoall_bruck::scratch_bytes(c.size(), b);
  if (a == algorithm::hier)
    return algo::alltoall_hier::scratch_bytes(detail::hier_groups(c, o, "alltoall"), c.rank(), b);
  return in_place && c.size() > 1 && a != algorithm::direct
             ? b * static_cast<std::size_t>(c.size())
             : 0;
}

/// Alltoall: `in` and `out` hold size() blocks of equal length; block q of
/// `in` goes to rank q, and block q of `out` arrives from rank q. `in` may be
/// `out` (in place). Every rank must pass the same block length.
template <transport C, element T>
void alltoall(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, const options& o = {}) {
  const char* name = "alltoall";
  const int r = c.rank(), p = c.size();
  const scoped_timeout guard(c, o.timeout);
  detail::check_span(in, name, r, "input");
  detail::check_span(out, name, r, "output");
  GRADSYNC_REQUIRE(in.size() == out.size(), name, r,
                   "input holds " + std::to_string(in.size()) + " elements, output " + std::to_string(out.size()) +
                       " (both hold one block per rank)");
  GRADSYNC_REQUIRE(in.size() % static_cast<std::size_t>(p) == 0, name, r,
                   "buffer of " + std::to_string(in.size()) + " elements does not split into " + std::to_string(p) +
                       " equal blocks");
  const bool in_place = !in.empty() && static_cast<const void*>(in.data()) == static_cast<const void*>(out.data());
  if (!in_place) detail::check_alias(in, out, name, r);
  detail::check_tag(o.tag, name, r);
  const std::size_t block = in.size() / static_cast<std::size_t>(p);
  const algorithm a = alltoall_algorithm<T>(c, block, o);
  if (!detail::exchange_schedule<C>(a, true)) detail::unsupported(name, r, a);
  const rank_groups groups = a == algorithm::hier ? detail::hier_groups(c, o, name) : rank_groups{};
  const std::size_t scratch = a == algorithm::hier
                                  ? algo::alltoall_hier::scratch_bytes(groups, r, block * sizeof(T))
                                  : alltoall_workspace_bytes<T>(c, block, o, in_place);
  exec::host ex;
  auto ws = ex.template scratch<std::byte>(o.workspace, scratch, name, r);
  call_fingerprint f = detail::fingerprint_of<T, void>(call_kind::alltoall, block, a);
  // The two-level schedule's messages follow the groups: ranks must agree on them.
  if (a == algorithm::hier)
    f.codec = detail::groups_hash(groups);
  detail::run_call(c, name, f, in.size_bytes(), o, [&] {
    const auto* src = reinterpret_cast<const std::byte*>(in.data());
    auto* dst = reinterpret_cast<std::byte*>(out.data());
    const std::size_t bytes = block * sizeof(T);
    if (a == algorithm::bruck) {
      algo::alltoall_bruck::run(c, src, dst, bytes, o.tag, ws.data());
      return;
    }
    if (a == algorithm::hier) {
      algo::alltoall_hier::run(c, groups, src, dst, bytes, o.tag, ws.data(), policy::alltoall_window);
      return;
    }
    if (in_place && p > 1 && a != algorithm::direct) { // direct stages each range before it lands
      std::memcpy(ws.data(), src, in.size_bytes());
      src = ws.data();
    }
    const std::vector<std::size_t> counts(static_cast<std::size_t>(p), block);
    const std::vector<std::size_t> displs = detail::packed(counts);
    const algo::exchange::layout l{src, dst, sizeof(T), counts, displs, counts, displs};
    detail::run_exchange(c, a, l, o.tag, name, bytes);
  });
}

/// Alltoallv with explicit displacements (as MPI_Alltoallv): to rank q this
/// rank sends send_counts[q] elements from in + send_displs[q], and from q it
/// receives recv_counts[q] elements into out + recv_displs[q]. What rank a
/// sends b must equal what b expects from a (else both fail, errc::mismatch;
/// over MPI the receiver fails and the sender's next call). Output blocks
/// must not overlap each other or the input.
template <transport C, element T>
void alltoallv(C& c, std::type_identity_t<std::span<const T>> in, std::span<const std::size_t> send_counts,
               std::span<const std::size_t> send_displs, std::span<T> out, std::span<const std::size_t> recv_counts,
               std::span<const std::size_t> recv_displs, const options& o = {}) {
  const char* name = "alltoallv";
  const auto p = static_cast<std::size_t>(c.size());
  const scoped_timeout guard(c, o.timeout);
  detail::check_alltoallv<T>(in, send_counts, send_displs, out, recv_counts, recv_displs, p, o.tag, name, c.rank());
  std::size_t largest = 0;
  for (std::size_t q = 0; q < p; ++q) largest = std::max({largest, send_counts[q], recv_counts[q]});
  const algorithm a = detail::v_schedule(c, largest * sizeof(T), o, name, true);
  const rank_groups groups = a == algorithm::hier ? detail::hier_groups(c, o, name) : rank_groups{};
  // The fingerprint names the forced schedule, `direct` (every rank's pick on
  // a shared arena), or `automatic`: each rank's own pick of the message
  // schedules is wire-compatible with its peers'. hier's messages follow
  // the groups: ranks must agree on them.
  call_fingerprint f = detail::fingerprint_of<T, void>(call_kind::alltoallv, 0, a == algorithm::direct ? a : o.algo);
  if (a == algorithm::hier) f.codec = detail::groups_hash(groups);
  detail::run_call(c, name, f, in.size_bytes(), o, [&] {
    const algo::exchange::layout l{reinterpret_cast<const std::byte*>(in.data()), reinterpret_cast<std::byte*>(out.data()),
                                   sizeof(T), send_counts, send_displs, recv_counts, recv_displs};
    if (a == algorithm::hier) algo::alltoall_hier::run_v(c, groups, l, o.tag, policy::alltoall_window, name);
    else detail::run_exchange(c, a, l, o.tag, name);
  });
}

/// Alltoallv of packed blocks: block q of `in` (send_counts[q] elements,
/// blocks one after another in rank order) goes to rank q, and `out`
/// receives recv_counts[q] elements from each rank q, packed the same way.
template <transport C, element T>
void alltoallv(C& c, std::type_identity_t<std::span<const T>> in, std::span<const std::size_t> send_counts,
               std::span<T> out, std::span<const std::size_t> recv_counts, const options& o = {}) {
  const auto p = static_cast<std::size_t>(c.size());
  GRADSYNC_REQUIRE(send_counts.size() == p && recv_counts.size() == p, "alltoallv", c.rank(),
                   std::to_string(send_counts.size()) + " send and " + std::to_string(recv_counts.size()) +
                       " receive counts for " + std::to_string(p) + " ranks (one per rank each)");
  alltoallv<C, T>(c, in, send_counts, detail::packed(send_counts), out, recv_counts, detail::packed(recv_counts), o);
}

namespace detail {

// alltoallv_dynamic's body: `place(total)` returns where the `total`
// elements received go (or throws when they do not fit).
template <transport C, element T, class Place>
std::size_t alltoallv_dynamic(C& c, std::span<const T> in, std::span<const std::size_t> send_counts,
                              std::span<std::size_t> recv_counts, const options& o, std::size_t capacity,
                              Place&& place) {
  const char* name = "alltoallv_dynamic";
  const int r = c.rank();
  const auto p = static_cast<std::size_t>(c.size());
  const scoped_timeout guard(c, o.timeout);
  check_span(in, name, r, "input");
  GRADSYNC_REQUIRE(send_counts.size() == p && recv_counts.size() == p, name, r,
                   std::to_string(send_counts.size()) + " send counts and room for " +
                       std::to_string(recv_counts.size()) + " receive counts for " + std::to_string(p) + " ranks");
  const std::vector<std::size_t> sdispl = packed(send_counts);
  GRADSYNC_REQUIRE(sum_checked(send_counts, name, r, "send counts") <= in.size(), name, r,
                   "send counts add up to more than the input's " + std::to_string(in.size()) + " elements");
  check_tag(o.tag, name, r);
  GRADSYNC_REQUIRE(o.algo == algorithm::automatic || o.algo == algorithm::scattered ||
                       (shared_arena<C> && o.algo == algorithm::direct),
                   name, r,
                   "algorithm '" + std::string(algorithm_name(o.algo)) + "' is not available for " + name +
                       (shared_arena<C> ? " (scattered, direct, auto)" : " (scattered, auto)"));
  std::size_t total = 0;
  if constexpr (shared_arena<C>) {
    // Through the arena: the counts are in the first round's headers.
    if (o.algo != algorithm::scattered) {
      run_call(c, name, fingerprint_of<T, void>(call_kind::alltoallv, 0, algorithm::direct), in.size_bytes(), o, [&] {
        const algo::exchange::layout l{reinterpret_cast<const std::byte*>(in.data()), nullptr, sizeof(T),
                                       send_counts, sdispl, {}, {}};
        const algo::alltoall_direct::receive rx{recv_counts, capacity};
        algo::alltoall_direct::run(c, l, 0, rx, [&](std::size_t n) {
          total = n;
          std::span<T> out = place(n);
          check_span(out, name, r, "output");
          GRADSYNC_REQUIRE(!overlaps(in, out), name, r, "input and output overlap (alltoallv is not in place)");
          return reinterpret_cast<std::byte*>(out.data());
        }, name);
      });
      return total;
    }
  }
  run_call(c, name, fingerprint_of<T, void>(call_kind::alltoallv, 0, algorithm::scattered), in.size_bytes(), o, [&] {
    const int tag = o.tag, count_tag = o.tag + 1;
    std::vector<std::uint64_t> mine(p), theirs(p);
    for (std::size_t q = 0; q < p; ++q) mine[q] = send_counts[q];
    theirs[static_cast<std::size_t>(r)] = mine[static_cast<std::size_t>(r)];
    // Every count and every data message posted at once: the data need not
    // wait for the counts, only its receive does.
    algo::exchange::pending<C> counts, data;
    for (std::size_t q = 0; q < p; ++q) {
      if (static_cast<int>(q) == r) continue;
      const int peer = static_cast<int>(q);
      counts.recvs.push_back(c.irecv(std::as_writable_bytes(std::span(&theirs[q], 1)), peer, count_tag));
      counts.sends.push_back(c.isend(std::as_bytes(std::span(&mine[q], 1)), peer, count_tag));
      data.sends.push_back(c.isend(std::as_bytes(in.subspan(sdispl[q], send_counts[q])), peer, tag));
    }
    try {
      counts.wait();
      for (std::size_t q = 0; q < p; ++q) {
        GRADSYNC_REQUIRE(theirs[q] <= std::numeric_limits<std::size_t>::max() / 4 - total, name, r,
                         "rank " + std::to_string(q) + " announced " + std::to_string(theirs[q]) +
                             " elements: the total overflows");
        recv_counts[q] = static_cast<std::size_t>(theirs[q]);
        total += recv_counts[q];
      }
      std::span<T> out;
      try {
        out = place(total);
      } catch (const error& e) {
        // The senders would wait for receives that never come: fail them too.
        if constexpr (abortable<C>) c.abort(std::string(name) + " on rank " + std::to_string(r) + ": " + e.reason());
        throw;
      }
      check_span(out, name, r, "output");
      GRADSYNC_REQUIRE(!overlaps(in, out), name, r, "input and output overlap (alltoallv is not in place)");
      std::size_t at = 0;
      for (std::size_t q = 0; q < p; ++q) {
        if (static_cast<int>(q) == r) std::copy_n(in.data() + sdispl[q], recv_counts[q], out.data() + at);
        else data.recvs.push_back(c.irecv(std::as_writable_bytes(out.subspan(at, recv_counts[q])), static_cast<int>(q), tag));
        at += recv_counts[q];
      }
    } catch (...) {
      try {
        data.wait();
      } catch (...) {
      }
      throw;
    }
    data.wait();
  });
  return total;
}

} // namespace detail

/// Alltoallv whose receive counts this rank does not know yet (the MoE
/// dispatch: how many tokens each rank routes here). Each peer's count
/// travels beside its data in the same schedule (no separate call): every
/// count and data message is posted at once, and the data's receive once
/// its count arrived. On return recv_counts[q] (size() entries) holds what
/// came from rank q, packed into `out` in rank order; returns the total.
/// `out` must hold it: a shortfall fails with errc::invalid_argument naming
/// the size needed (and aborts the communicator where the transport can, so
/// the senders fail too instead of waiting). The vector overload below
/// sizes the output itself.
template <transport C, element T>
std::size_t alltoallv_dynamic(C& c, std::type_identity_t<std::span<const T>> in,
                              std::span<const std::size_t> send_counts, std::span<T> out,
                              std::span<std::size_t> recv_counts, const options& o = {}) {
  return detail::alltoallv_dynamic<C, T>(c, in, send_counts, recv_counts, o, out.size(), [&](std::size_t total) {
    GRADSYNC_REQUIRE(total <= out.size(), "alltoallv_dynamic", c.rank(),
                     "receives " + std::to_string(total) + " elements but the output holds " +
                         std::to_string(out.size()));
    return out.first(total);
  });
}

/// alltoallv_dynamic into a vector, resized to what arrives once the counts
/// are in (same single schedule).
template <transport C, element T>
std::size_t alltoallv_dynamic(C& c, std::type_identity_t<std::span<const T>> in,
                              std::span<const std::size_t> send_counts, std::vector<T>& out,
                              std::span<std::size_t> recv_counts, const options& o = {}) {
  return detail::alltoallv_dynamic<C, T>(c, in, send_counts, recv_counts, o, std::numeric_limits<std::size_t>::max(),
                                         [&](std::size_t total) {
    out.resize(total);
    return std::span<T>(out);
  });
}

/// Neighbour alltoallv (a GNN's halo exchange): this rank sends
/// send_counts[j] elements to g.destinations[j] and receives recv_counts[i]
/// elements from g.sources[i], both packed in list order. Only the graph's
/// edges carry messages. The graph must be consistent across ranks (a
/// destination's list names this rank as a source as often): a missing
/// peer fails the receive within the timeout, naming it; exchange_plan
/// checks the graph once instead.
template <transport C, element T>
void neighbor_alltoallv(C& c, const neighbors& g, std::type_identity_t<std::span<const T>> in,
                        std::span<const std::size_t> send_counts, std::span<T> out,
                        std::span<const std::size_t> recv_counts, const options& o = {}) {
  const char* name = "neighbor_alltoallv";
  const int r = c.rank(), p = c.size();
  const scoped_timeout guard(c, o.timeout);
  detail::check_span(in, name, r, "input");
  detail::check_span(out, name, r, "output");
  GRADSYNC_REQUIRE(send_counts.size() == g.destinations.size() && recv_counts.size() == g.sources.size(), name, r,
                   std::to_string(send_counts.size()) + " send counts for " + std::to_string(g.destinations.size()) +
                       " destinations, " + std::to_string(recv_counts.size()) + " receive counts for " +
                       std::to_string(g.sources.size()) + " sources");
  std::size_t self_out = 0, self_in = 0;
  for (const int q : g.destinations) {
    GRADSYNC_REQUIRE(q >= 0 && q < p, name, r, "destination " + std::to_string(q) + " out of range");
    self_out += q == r;
  }
  for (const int q : g.sources) {
    GRADSYNC_REQUIRE(q >= 0 && q < p, name, r, "source " + std::to_string(q) + " out of range");
    self_in += q == r;
  }
  GRADSYNC_REQUIRE(self_out == self_in, name, r,
                   "names itself " + std::to_string(self_out) + " times as a destination but " +
                       std::to_string(self_in) + " times as a source");
  const std::vector<std::size_t> sd = detail::packed(send_counts), rd = detail::packed(recv_counts);
  GRADSYNC_REQUIRE(detail::sum_checked(send_counts, name, r, "send counts") <= in.size(), name, r,
                   "send counts add up to more than the input's " + std::to_string(in.size()) + " elements");
  GRADSYNC_REQUIRE(detail::sum_checked(recv_counts, name, r, "receive counts") <= out.size(), name, r,
                   "receive counts add up to more than the output's " + std::to_string(out.size()) + " elements");
  for (std::size_t j = 0, i = 0; j < g.destinations.size(); ++j) { // self copies: equal sizes
    if (g.destinations[j] != r) continue;
    while (g.sources[i] != r) ++i;
    GRADSYNC_REQUIRE(send_counts[j] == recv_counts[i], name, r,
                     "its self edge " + std::to_string(j) + " sends " + std::to_string(send_counts[j]) +
                         " elements but receives " + std::to_string(recv_counts[i]));
    ++i;
  }
  GRADSYNC_REQUIRE(!detail::overlaps(in, out), name, r, "input and output overlap (the exchange is not in place)");
  detail::check_tag(o.tag, name, r);
  GRADSYNC_REQUIRE(o.algo == algorithm::automatic || o.algo == algorithm::scattered, name, r,
                   "algorithm '" + std::string(algorithm_name(o.algo)) + "' is not available for " + name +
                       " (scattered, auto)");
  detail::run_call(c, name, detail::fingerprint_of<T, void>(call_kind::neighbor_alltoallv, 0, algorithm::scattered),
                   in.size_bytes(), o, [&] {
                     const algo::exchange::layout l{reinterpret_cast<const std::byte*>(in.data()),
                                                    reinterpret_cast<std::byte*>(out.data()), sizeof(T),
                                                    send_counts, sd, recv_counts, rd};
                     algo::neighbor_exchange::run(c, g.sources, g.destinations, l, o.tag);
                   });
}

/// An exchange fixed once and run every step (a GNN's halo: static counts;
/// an MoE layer: one plan for the tokens, their indices and their weights,
/// forwards for dispatch and backwards for combine). Creating it is
/// collective: every rank passes its counts (per rank for an alltoall plan,
/// per neighbour for a graph plan), and the plan checks them pairwise (what
/// rank a sends b equals what b expects from a; for a graph, that every edge
/// has both ends) and fails on every rank with the same error if any pair
/// disagrees. It keeps the displacements and picks the schedule; run() then
/// only moves data. Counts are in items; run() moves `width` elements per
/// item (a token's hidden vector), so one plan serves several dtypes.
/// `automatic` picks per run by the agreed largest block, with o.select (kept
/// by pointer: it must outlive the plan) and o.group_size as given here.
class exchange_plan {
public:
  /// An alltoallv plan: send_counts[q] items to rank q, recv_counts[q] from it.
  template <transport C>
  exchange_plan(C& c, std::span<const std::size_t> send_counts, std::span<const std::size_t> recv_counts,
                const options& o = {})
      : ranks_(c.size()), rank_(c.rank()), tag_(o.tag), timeout_(o.timeout), algo_(o.algo) {
    const char* name = "exchange_plan";
    const auto p = static_cast<std::size_t>(c.size());
    GRADSYNC_REQUIRE(send_counts.size() == p && recv_counts.size() == p, name, rank_,
                     std::to_string(send_counts.size()) + " send and " + std::to_string(recv_counts.size()) +
                         " receive counts for " + std::to_string(p) + " ranks (one per rank each)");
    GRADSYNC_REQUIRE(o.algo == algorithm::automatic || o.algo == algorithm::hier ||
                         detail::exchange_schedule<C>(o.algo, false),
                     name, rank_,
                     "algorithm '" + std::string(algorithm_name(o.algo)) + "' is not available for a plan " +
                         (shared_arena<C> ? "(pairwise, scattered, hier, direct, auto)" : "(pairwise, scattered, hier, auto)"));
    assign(send_counts, recv_counts);
    for (int q = 0; q < ranks_; ++q) {
      sources_.push_back(q);
      destinations_.push_back(q);
    }
    agree(c, o);
    select_ = o.select;
    group_size_ = o.group_size;
    // hier forced, or a candidate of `automatic` (several groups of several
    // ranks, no shared arena): the groups' counts once, so run() skips hier's
    // phase 0, and every rank decides on the same agreed largest block.
    const topology t = topology_of(c, o);
    const bool candidate = algo_ == algorithm::automatic && !detail::arena_for<C, exec::host> && t.groups > 1 &&
                           t.group_size > 1 && (o.group_size > 0 || node_aware<C>);
    if (algo_ == algorithm::hier || candidate) {
      groups_ = detail::hier_groups(c, o, name);
      agree_groups(c, o);
      group_counts_ = algo::alltoall_hier::exchange_counts(c, groups_, send_counts_, recv_counts_, o.tag + 1);
      hier_ready_ = true;
    }
  }

  /// A neighbour plan over graph `g` (counts per entry of its lists).
  template <transport C>
  exchange_plan(C& c, neighbors g, std::span<const std::size_t> send_counts, std::span<const std::size_t> recv_counts,
                const options& o = {})
      : ranks_(c.size()), rank_(c.rank()), tag_(o.tag), timeout_(o.timeout), algo_(algorithm::scattered), graph_(true),
        sources_(std::move(g.sources)), destinations_(std::move(g.destinations)) {
    const char* name = "exchange_plan";
    GRADSYNC_REQUIRE(send_counts.size() == destinations_.size() && recv_counts.size() == sources_.size(), name,
                     rank_,
                     std::to_string(send_counts.size()) + " send counts for " + std::to_string(destinations_.size()) +
                         " destinations, " + std::to_string(recv_counts.size()) + " receive counts for " +
                         std::to_string(sources_.size()) + " sources");
    for (const int q : sources_)
      GRADSYNC_REQUIRE(q >= 0 && q < ranks_, name, rank_, "source " + std::to_string(q) + " out of range");
    for (const int q : destinations_)
      GRADSYNC_REQUIRE(q >= 0 && q < ranks_, name, rank_, "destination " + std::to_string(q) + " out of range");
    assign(send_counts, recv_counts);
    agree(c, o);
  }

  /// Moves caller-laid-out bytes along the plan's edges (the encoded
  /// exchange of exchange_codec.hpp is built on it): forwards (back: false)
  /// send_bytes[k] bytes to the plan's k-th destination and recv_bytes[k]
  /// from its k-th source (backwards the roles swap), both packed in list
  /// order in `in` / `out`. Sizes must be what the other end computes for
  /// the same edge; `largest_bytes` the largest block of any rank, the same
  /// on every rank (it picks the schedule); `dt` and `salt` (a hash of how
  /// the bytes were made, a codec's) enter the call's fingerprint, so ranks
  /// that disagree on them fail together.
  template <transport C>
  void run_bytes(C& c, std::span<const std::byte> in, std::span<const std::size_t> send_bytes, std::span<std::byte> out,
                 std::span<const std::size_t> recv_bytes, bool back, std::size_t largest_bytes, dtype dt,
                 std::uint64_t salt) const {
    const char* name = back ? "exchange_plan::run_back" : "exchange_plan::run";
    const int r = c.rank();
    check_comm(c, name);
    const auto& to = back ? sources_ : destinations_;
    const auto& from = back ? destinations_ : sources_;
    GRADSYNC_REQUIRE(send_bytes.size() == to.size() && recv_bytes.size() == from.size(), name, r,
                     std::to_string(send_bytes.size()) + " send and " + std::to_string(recv_bytes.size()) +
                         " receive sizes for " + std::to_string(to.size()) + " destinations and " +
                         std::to_string(from.size()) + " sources");
    const std::vector<std::size_t> sd = detail::packed(send_bytes), rd = detail::packed(recv_bytes);
    const std::size_t total_in = detail::sum_checked(send_bytes, name, r, "send sizes");
    const std::size_t total_out = detail::sum_checked(recv_bytes, name, r, "receive sizes");
    GRADSYNC_REQUIRE(in.size() >= total_in && out.size() >= total_out, name, r,
                     "input holds " + std::to_string(in.size()) + " bytes (needs " + std::to_string(total_in) +
                         "), output " + std::to_string(out.size()) + " (needs " + std::to_string(total_out) + ")");
    GRADSYNC_REQUIRE(!detail::overlaps(in, out), name, r, "input and output overlap (the exchange is not in place)");
    const algo::exchange::layout l{in.data(), out.data(), 1, send_bytes, sd, recv_bytes, rd};
    const scoped_timeout guard(c, timeout_);
    move(c, name, l, back, schedule(c, name, largest_bytes), static_cast<std::uint8_t>(dt), 0, salt, total_in, false);
  }

  /// Items this rank sends / receives in one forward run.
  std::size_t send_items() const noexcept { return send_total_; }
  std::size_t recv_items() const noexcept { return recv_total_; }
  std::span<const std::size_t> send_counts() const noexcept { return send_counts_; }
  std::span<const std::size_t> recv_counts() const noexcept { return recv_counts_; }
  std::span<const std::size_t> send_displs() const noexcept { return send_displs_; }
  std::span<const std::size_t> recv_displs() const noexcept { return recv_displs_; }
  /// The largest count of any rank's block (the same on every rank).
  std::size_t largest_items() const noexcept { return largest_; }
  /// The plan's peers: for an alltoallv plan every rank in order, for a
  /// graph plan the graph's lists (counts follow their order).
  std::span<const int> sources() const noexcept { return sources_; }
  std::span<const int> destinations() const noexcept { return destinations_; }
  /// The same id on every rank of the plan (a hash of every rank's counts).
  std::uint64_t id() const noexcept { return id_; }
  /// Whether some rank has an empty block to or from another rank. Such a
  /// plan's message schedules send nothing for empty blocks (their counts
  /// were checked pairwise when the plan was made): scattered becomes the
  /// sparse-neighbour schedule over the non-empty blocks (one window of
  /// receives, as MPI_Alltoallv's linear form posts them), pairwise skips
  /// the empty steps. hier and direct run as for dense counts.
  bool sparse() const noexcept { return sparse_; }
  /// The schedule run() takes for items of `item_bytes` (elements x width x
  /// their size): the forced one, or automatic's pick for the agreed largest
  /// block (the same on every rank; hier among the candidates where the
  /// ranks form several groups of several ranks).
  template <transport C> algorithm algorithm_for(const C& c, std::size_t item_bytes) const {
    return schedule(c, "exchange_plan", largest_ * item_bytes);
  }

  /// Runs the exchange forwards: `in` holds send_items() x width elements
  /// (packed per destination), `out` receives recv_items() x width.
  template <transport C, element T>
  void run(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, std::size_t width = 1) const {
    go<C, T>(c, in, out, width, false);
  }
  /// Runs it backwards (what came from q goes back to q: MoE's combine, a
  /// halo's gradient): `in` holds recv_items() x width, `out` send_items() x width.
  template <transport C, element T>
  void run_back(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, std::size_t width = 1) const {
    go<C, T>(c, in, out, width, true);
  }

private:
  void assign(std::span<const std::size_t> s, std::span<const std::size_t> r) {
    send_counts_.assign(s.begin(), s.end());
    recv_counts_.assign(r.begin(), r.end());
    send_total_ = detail::sum_checked(s, "exchange_plan", rank_, "send counts");
    recv_total_ = detail::sum_checked(r, "exchange_plan", rank_, "receive counts");
    send_displs_ = detail::packed(s);
    recv_displs_ = detail::packed(r);
  }

  // The pairwise check: each edge's sender tells its receiver the count it
  // will send (the receiver compares), and every rank learns the first bad
  // pair of any rank, so all fail alike. Also fixes the plan id and the
  // largest block for the schedule choice.
  template <transport C> void agree(C& c, const options& o) {
    const char* name = "exchange_plan";
    // What each destination entry will carry, in its list order.
    std::vector<std::uint64_t> told(sources_.size(), 0);
    std::vector<std::uint64_t> mine(send_counts_.begin(), send_counts_.end());
    std::vector<std::size_t> ones_s(destinations_.size(), 1), ones_r(sources_.size(), 1);
    const std::vector<std::size_t> ds = detail::packed(ones_s), dr = detail::packed(ones_r);
    const algo::exchange::layout l{reinterpret_cast<const std::byte*>(mine.data()),
                                   reinterpret_cast<std::byte*>(told.data()), sizeof(std::uint64_t), ones_s, ds,
                                   ones_r, dr};
    constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
    std::int64_t bad[4] = {none, 0, 0, 0}; // (receiver, entry), sender, sent, expected
    try {
      agree_counts(c, o, l, told, bad, none);
    } catch (const error& e) {
      if (e.op() == name) throw; // the agreed disagreement, the same on every rank
      // A missing edge leaves a receive waiting (errc::timeout) on one side
      // and the other side waiting in the agreement: name the likely cause.
      throw error(e.kind(), name, rank_, e.peer(),
                  "the ranks could not agree the plan (do their graphs disagree: an edge without its other "
                  "end?): " + e.reason());
    }
  }

  template <transport C>
  void agree_counts(C& c, const options& o, const algo::exchange::layout& l, const std::vector<std::uint64_t>& told,
                    std::int64_t (&bad)[4], std::int64_t none) {
    const char* name = "exchange_plan";
    {
      // On its own tag: a rank that finished its part early is already in
      // the agreement below, whose messages must not meet these receives.
      const scoped_timeout guard(c, o.timeout);
      algo::neighbor_exchange::run(c, sources_, destinations_, l, o.tag + 1);
    }
    for (std::size_t i = 0; i < sources_.size(); ++i)
      if (told[i] != recv_counts_[i]) {
        bad[0] = static_cast<std::int64_t>(rank_) << 32 | static_cast<std::int64_t>(i); // ranks first, then entries
        bad[1] = sources_[i];
        bad[2] = static_cast<std::int64_t>(told[i]);
        bad[3] = static_cast<std::int64_t>(recv_counts_[i]);
        break;
      }
    // Every rank learns the first disagreement (min over the key, then the
    // owner's details), the largest block and the plan id.
    // Recursive doubling only (tag o.tag): never the count exchange's tag.
    const options q{.algo = algorithm::rd, .tag = o.tag, .timeout = o.timeout};
    std::int64_t key = bad[0];
    allreduce(c, std::span<std::int64_t>(&key, 1), op::min{}, q);
    // receiver, sender, sent, expected, largest count, an empty block to or from another rank
    std::int64_t all[6] = {0, 0, 0, 0, 0, 0};
    if (key != none && key == bad[0]) all[0] = rank_, all[1] = bad[1], all[2] = bad[2], all[3] = bad[3];
    for (const std::size_t n : send_counts_) all[4] = std::max(all[4], static_cast<std::int64_t>(n));
    for (std::size_t j = 0; j < destinations_.size(); ++j) all[5] |= destinations_[j] != rank_ && send_counts_[j] == 0;
    for (std::size_t i = 0; i < sources_.size(); ++i) all[5] |= sources_[i] != rank_ && recv_counts_[i] == 0;
    allreduce(c, std::span<std::int64_t>(all, 6), op::max{}, q);
    // The plan id: the largest of the ranks' hashes of their own counts
    // (the same on every rank; a rank running another plan shows in run()'s
    // call check).
    std::uint64_t h = gradsync::detail::fnv1a(gradsync::detail::fnv_basis, rank_);
    for (std::size_t i = 0; i < send_counts_.size(); ++i)
      h = gradsync::detail::fnv1a(gradsync::detail::fnv1a(h, destinations_[i]), send_counts_[i]);
    const auto id = static_cast<std::int64_t>(h >> 1);
    std::vector<std::int64_t> ids(1, id);
    allreduce(c, std::span<std::int64_t>(ids), op::max{}, q);
    if (key != none)
      throw error(errc::mismatch, name, rank_, static_cast<int>(all[1]),
                  "rank " + std::to_string(all[1]) + " sends rank " + std::to_string(all[0]) + " " +
                      std::to_string(all[2]) + " items but rank " + std::to_string(all[0]) + " expects " +
                      std::to_string(all[3]));
    id_ = static_cast<std::uint64_t>(ids[0]);
    largest_ = static_cast<std::size_t>(all[4]);
    sparse_ = all[5] != 0;
    // The non-empty entries of each list, for runs in items (the layouts
    // go() builds are the plan's own counts and displacements).
    to_nonempty_ = nonempty(destinations_, send_counts_, send_counts_, send_displs_, name, "sends");
    from_nonempty_ = nonempty(sources_, recv_counts_, recv_counts_, recv_displs_, name, "receives");
  }

  // hier: every rank must hold the same groups (their layout's hash, min and
  // max over the ranks), else all fail alike before any count is exchanged.
  template <transport C> void agree_groups(C& c, const options& o) {
    const options q{.algo = algorithm::rd, .tag = o.tag, .timeout = o.timeout};
    const auto h = static_cast<std::int64_t>(detail::groups_hash(groups_) >> 1);
    std::int64_t lo_hi[2] = {h, -h};
    allreduce(c, std::span<std::int64_t>(lo_hi, 2), op::min{}, q);
    if (lo_hi[0] != -lo_hi[1])
      throw error(errc::mismatch, "exchange_plan", rank_, -1,
                  "the ranks disagree on hier's groups (options::group_size or the transport's nodes)");
  }

  template <transport C> void check_comm(const C& c, const char* name) const {
    GRADSYNC_REQUIRE(c.size() == ranks_ && c.rank() == rank_, name, c.rank(),
                     "the plan was made for rank " + std::to_string(rank_) + " of " + std::to_string(ranks_) +
                         ", not this communicator");
  }

  // The schedule for blocks of at most `largest` bytes (a graph: scattered).
  template <transport C> algorithm schedule(const C& c, const char* name, std::size_t largest) const {
    const algorithm a = graph_ ? algorithm::scattered : algo_ != algorithm::automatic ? algo_ : choose<C>(c, largest);
    GRADSYNC_REQUIRE(a == algorithm::hier || detail::exchange_schedule<C>(a, false), name, c.rank(),
                     "algorithm '" + std::string(algorithm_name(a)) + "' cannot run on this transport");
    return a;
  }

  // Runs exchange `l` (forwards or back) by `a` as one checked call: the
  // fingerprint holds the dtype, `count` (the width), and the plan id mixed
  // with the direction and `salt`.
  template <transport C>
  void move(C& c, const char* name, const algo::exchange::layout& l, bool back, algorithm a, std::uint8_t dt,
            std::size_t count, std::uint64_t salt, std::size_t bytes, bool items = true) const {
    // A sparse plan's run is a neighbour exchange of its non-empty blocks
    // (its messages do not reach every rank: checked in a round of its own
    // on MPI). A dense run in items reaches every rank from every rank, so
    // MPI checks it framed up to the limit, judged on the plan's agreed
    // bound (p blocks of the largest) so that every rank takes the same
    // path; one-off and encoded runs (count 0) move sizes only their ranks
    // know, so they never are (collectives.hpp disseminates()).
    const bool neighbours = graph_ || sparse_;
    call_fingerprint f;
    f.kind = neighbours ? call_kind::neighbor_alltoallv : call_kind::alltoallv;
    if (!neighbours && items) bytes = largest_ * l.elem * static_cast<std::size_t>(ranks_);
    f.dt = dt;
    f.algo = a;
    f.count = count;
    f.codec = id_ ^ salt ^ (back ? 1 : 0);
    options o;
    o.tag = tag_;
    o.algo = a;
    o.timeout = timeout_;
    const auto& to = back ? sources_ : destinations_;
    const auto& from = back ? destinations_ : sources_;
    if (graph_ || (sparse_ && a == algorithm::scattered)) {
      // Only the blocks with items move (the counts were checked pairwise
      // at creation, so both ends of an edge skip it alike): a graph's
      // edges, or an alltoallv plan's non-empty blocks, all receives posted
      // at once and the sends windowed.
      // In items the entries were found at creation; in bytes (encoded)
      // their sizes are the caller's.
      const auto& to_items = back ? recv_counts_ : send_counts_;
      const auto& from_items = back ? send_counts_ : recv_counts_;
      edges s_bytes, rv_bytes;
      if (!items) {
        s_bytes = nonempty(to, to_items, l.send_counts, l.send_displs, name, "sends");
        rv_bytes = nonempty(from, from_items, l.recv_counts, l.recv_displs, name, "receives");
      }
      const edges& s = items ? (back ? from_nonempty_ : to_nonempty_) : s_bytes;
      const edges& rv = items ? (back ? to_nonempty_ : from_nonempty_) : rv_bytes;
      const algo::exchange::layout lc{l.send, l.recv, l.elem, s.counts, s.displs, rv.counts, rv.displs};
      detail::run_call(c, name, f, bytes, o, [&] { algo::neighbor_exchange::run(c, rv.peers, s.peers, lc, tag_); });
      return;
    }
    detail::run_call(c, name, f, bytes, o, [&] {
      if (a == algorithm::hier) // counts in items: the plan's own; in bytes (encoded): exchanged again
        algo::alltoall_hier::run_v(c, groups_, l, tag_, policy::alltoall_window, name, items ? &group_counts_ : nullptr, back,
                                   &hier_buffers_);
      else {
        algo::exchange::layout ls = l;
        ls.skip_empty = sparse_; // pairwise (or direct, which ignores it): no message for an empty block
        detail::run_exchange(c, a, ls, tag_, name);
      }
    });
  }

  // The entries of one side of an exchange (peers in list order, `items`
  // the plan's count per entry) that carry items, with their sizes and
  // offsets from `counts` / `displs` (items, or bytes when encoded). An
  // entry without items must carry no bytes either: the other end skips it.
  struct edges {
    std::vector<int> peers;
    std::vector<std::size_t> counts, displs;
  };
  edges nonempty(const std::vector<int>& peers, const std::vector<std::size_t>& items, std::span<const std::size_t> counts,
                 std::span<const std::size_t> displs, const char* name, const char* what) const {
    edges e;
    for (std::size_t k = 0; k < peers.size(); ++k) {
      if (items[k] == 0) {
        GRADSYNC_REQUIRE(counts[k] == 0, name, rank_,
                         std::string(what) + " entry " + std::to_string(k) + " (rank " + std::to_string(peers[k]) +
                             ") has no items in the plan but " + std::to_string(counts[k]) + " bytes");
        continue;
      }
      e.peers.push_back(peers[k]);
      e.counts.push_back(counts[k]);
      e.displs.push_back(displs[k]);
    }
    return e;
  }

  template <transport C, element T>
  void go(C& c, std::span<const T> in, std::span<T> out, std::size_t width, bool back) const {
    const char* name = back ? "exchange_plan::run_back" : "exchange_plan::run";
    const int r = c.rank();
    check_comm(c, name);
    GRADSYNC_REQUIRE(width >= 1, name, r, "width must be >= 1");
    const scoped_timeout guard(c, timeout_);
    detail::check_span(in, name, r, "input");
    detail::check_span(out, name, r, "output");
    const std::size_t need_in = detail::mul_checked(back ? recv_total_ : send_total_, width, name, r);
    const std::size_t need_out = detail::mul_checked(back ? send_total_ : recv_total_, width, name, r);
    GRADSYNC_REQUIRE(in.size() >= need_in && out.size() >= need_out, name, r,
                     "input holds " + std::to_string(in.size()) + " elements (needs " + std::to_string(need_in) +
                         "), output " + std::to_string(out.size()) + " (needs " + std::to_string(need_out) + ")");
    GRADSYNC_REQUIRE(!detail::overlaps(in, out), name, r, "input and output overlap (the exchange is not in place)");
    const auto& sc = back ? recv_counts_ : send_counts_;
    const auto& sd = back ? recv_displs_ : send_displs_;
    const auto& rc = back ? send_counts_ : recv_counts_;
    const auto& rd = back ? send_displs_ : recv_displs_;
    const algo::exchange::layout l{reinterpret_cast<const std::byte*>(in.data()), reinterpret_cast<std::byte*>(out.data()),
                                   sizeof(T) * width, sc, sd, rc, rd};
    move(c, name, l, back, schedule(c, name, largest_ * sizeof(T) * width),
         static_cast<std::uint8_t>(dtype_traits<T>::id), width, 0, need_in * sizeof(T));
  }

  template <transport C> algorithm choose(const C& c, std::size_t bytes) const {
    const options o{.select = select_, .group_size = group_size_};
    return detail::selector_for<C>(o).choose_alltoall(bytes, topology_of(c, o), false, hier_ready_);
  }

  int ranks_ = 0, rank_ = 0, tag_ = 0;
  std::chrono::milliseconds timeout_{0};
  algorithm algo_ = algorithm::automatic;
  bool graph_ = false;
  std::vector<int> sources_, destinations_;
  std::vector<std::size_t> send_counts_, recv_counts_, send_displs_, recv_displs_;
  std::size_t send_total_ = 0, recv_total_ = 0, largest_ = 0;
  std::uint64_t id_ = 0;
  rank_groups groups_;                                 // hier's groups
  algo::alltoall_hier::group_counts group_counts_;     // hier: the group's counts, fixed at creation
  bool hier_ready_ = false;                            // groups_ and group_counts_ hold them
  // hier's message buffers, kept from run to run (a run is the rank's one
  // call on its communicator at a time, so runs never share them at once).
  mutable algo::alltoall_hier::buffers hier_buffers_;
  bool sparse_ = false; // some rank has an empty block to or from another: skipped (agreed at creation)
  edges to_nonempty_, from_nonempty_; // the destinations' / sources' entries with items
  const selector* select_ = nullptr;                   // options::select at creation (automatic's model)
  int group_size_ = 0;                                 // options::group_size at creation
};

} // namespace gradsync
