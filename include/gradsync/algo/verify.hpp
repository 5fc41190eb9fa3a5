// gradsync: call agreement. Before a collective moves data its ranks compare
// fingerprints of the call (collective, count, dtype, op, root, algorithm,
// codec, sequence number). One dissemination round (ceil(log2 p) steps of a
// 16-byte message) carries the smallest and the largest fingerprint hash;
// min is idempotent, so after the round every rank holds the same two
// values. Equal: the call goes on. Unequal: every rank knows it, every rank
// sends its fingerprint to every other, and every rank raises the same
// errc::mismatch error naming the fields that differ and which ranks hold
// which value (ranks with wrong counts would otherwise return wrong values
// or time out one by one). On a record_board transport (inproc: ranks in one
// address space) the ranks gather all fingerprints on the board instead and
// compare them, with no message at all.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "../core/ops.hpp"
#include "../core/timeline.hpp"
#include "../transport/capabilities.hpp"
#include "options.hpp"
#include "schedule.hpp"

namespace gradsync {

/// Which collective a fingerprint describes.
enum class call_kind : std::uint8_t {
  allreduce,
  reduce_scatter,
  allgather,
  broadcast,
  reduce,
  barrier,
  compressed_allreduce,
  neighbor_allreduce, ///< gossip: codec holds the hash of the step's mixing matrix
  push_sum,           ///< gossip, as neighbor_allreduce
  choco_gossip,       ///< gossip: codec hashes the mixing matrix, codec, gamma and seed
  other, ///< a caller's own schedule (fingerprint_of with a name)
  alltoall,           ///< count: elements per peer
  alltoallv,          ///< count: 0 (counts are per pair, checked by each message's size); codec: a plan's id
  neighbor_alltoallv, ///< as alltoallv
};

/// Whether a call kind is a gossip operation (its fingerprint's codec field
/// holds the topology of the step; it has no algorithm).
constexpr bool is_gossip(call_kind k) noexcept {
  return k == call_kind::neighbor_allreduce || k == call_kind::push_sum || k == call_kind::choco_gossip;
}

/// Name of a call kind ("allreduce", ...).
constexpr const char* call_kind_name(call_kind k) noexcept {
  switch (k) {
  case call_kind::allreduce: return "allreduce";
  case call_kind::reduce_scatter: return "reduce_scatter";
  case call_kind::allgather: return "allgather";
  case call_kind::broadcast: return "broadcast";
  case call_kind::reduce: return "reduce";
  case call_kind::barrier: return "barrier";
  case call_kind::compressed_allreduce: return "compressed_allreduce";
  case call_kind::neighbor_allreduce: return "neighbor_allreduce";
  case call_kind::push_sum: return "push_sum";
  case call_kind::choco_gossip: return "choco_gossip";
  case call_kind::other: return "other";
  case call_kind::alltoall: return "alltoall";
  case call_kind::alltoallv: return "alltoallv";
  case call_kind::neighbor_alltoallv: return "neighbor_alltoallv";
  }
  return "?";
}

/// What every rank must agree on for one collective call. Fields a
/// collective does not have keep their defaults (no dtype, no op, root -1).
struct call_fingerprint {
  call_kind kind = call_kind::other;
  std::uint8_t dt = 0;    ///< dtype id, 0: none
  std::uint8_t op = 0xff; ///< op_kind, 0xff: none
  algorithm algo = algorithm::automatic; ///< the schedule chosen (not `automatic` once chosen)
  std::int32_t root = -1;
  std::uint64_t count = 0;  ///< elements (per block for reduce_scatter / allgather)
  std::uint64_t codec = 0;  ///< hash of the compression (gossip: of the topology too), 0: none
  std::uint64_t seq = 0;    ///< this call's number among the communicator's calls on its tag
  std::uint64_t segment = 0; ///< pipeline segment bytes of the schedule (0: none, or direct)

  static constexpr std::size_t wire_bytes = 40;

  /// A hash of the fingerprint (equal fingerprints, equal hashes): the
  /// wire form's five words (the first packs kind, dtype, op, algorithm and
  /// root as write() lays them out) folded by multiply-xorshift steps. The
  /// MPI check computes it on every call: it reads the fields directly, as
  /// serialising them first cost ~10 ns on an 8-byte allreduce.
  std::uint64_t hash() const noexcept {
    const std::uint64_t head = static_cast<std::uint64_t>(static_cast<std::uint8_t>(kind)) |
                               static_cast<std::uint64_t>(dt) << 8 | static_cast<std::uint64_t>(op) << 16 |
                               static_cast<std::uint64_t>(static_cast<std::uint8_t>(algo)) << 24 |
                               static_cast<std::uint64_t>(static_cast<std::uint32_t>(root)) << 32;
    std::uint64_t h = 0x9e3779b97f4a7c15ull;
    for (const std::uint64_t x : {head, count, codec, seq, segment}) {
      h = (h ^ x) * 0xbf58476d1ce4e5b9ull;
      h ^= h >> 31;
    }
    return h;
  }
  /// Fixed layout (byte order of the host: all ranks of a job share it).
  void write(std::byte* w) const noexcept {
    w[0] = static_cast<std::byte>(kind);
    w[1] = static_cast<std::byte>(dt);
    w[2] = static_cast<std::byte>(op);
    w[3] = static_cast<std::byte>(algo);
    std::memcpy(w + 4, &root, 4);
    std::memcpy(w + 8, &count, 8);
    std::memcpy(w + 16, &codec, 8);
    std::memcpy(w + 24, &seq, 8);
    std::memcpy(w + 32, &segment, 8);
  }
  static call_fingerprint read(const std::byte* w) noexcept {
    call_fingerprint f;
    f.kind = static_cast<call_kind>(w[0]);
    f.dt = static_cast<std::uint8_t>(w[1]);
    f.op = static_cast<std::uint8_t>(w[2]);
    f.algo = static_cast<algorithm>(w[3]);
    std::memcpy(&f.root, w + 4, 4);
    std::memcpy(&f.count, w + 8, 8);
    std::memcpy(&f.codec, w + 16, 8);
    std::memcpy(&f.seq, w + 24, 8);
    std::memcpy(&f.segment, w + 32, 8);
    return f;
  }
};

namespace algo::verify {

namespace detail {

// "0, 2-4, 7" of a sorted rank list.
inline std::string rank_list(const std::vector<int>& r) {
  std::string s;
  for (std::size_t i = 0; i < r.size();) {
    std::size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(r[i]);
    if (j > i) s += (j == i + 1 ? ", " : "-") + std::to_string(r[j]);
    i = j + 1;
  }
  return s;
}

inline std::string field_value(const call_fingerprint& f, int field) {
  switch (field) {
  case 0: return call_kind_name(f.kind);
  case 1: return std::to_string(f.count);
  case 2: {
    if (f.dt == 0) return "none";
    const auto n = dtype_name(static_cast<dtype>(f.dt));
    return n.empty() ? "dtype#" + std::to_string(f.dt) : std::string(n);
  }
  case 3: return f.op == 0xff ? "none" : std::string(op_name(static_cast<op_kind>(f.op)));
  case 4: return std::to_string(f.root);
  case 5: return std::string(algorithm_name(f.algo));
  case 6: return f.codec == 0 ? "none" : "#" + std::to_string(f.codec);
  case 7: return std::to_string(f.segment);
  default: return std::to_string(f.seq);
  }
}
inline constexpr int field_count = 9;
inline constexpr const char* field_names[field_count] = {"collective", "count", "dtype", "op", "root", "algorithm",
                                                         "codec", "segment size", "sequence number"};

// The communicator whose call this thread is running under the board check
// (checked_on_board), or nullptr.
inline thread_local const void* board_call = nullptr;

// One rank's part of the board check (record_board): its posted
// fingerprint and, once collected, every rank's.
template <class C> struct board_check {
  static constexpr std::size_t w = call_fingerprint::wire_bytes;
  static_assert(w <= board_record_bytes);
  C& c;
  const char* name;
  std::byte mine[w];
  std::byte local[w * 16]; // every rank's, up to 16 ranks without allocating
  std::vector<std::byte> heap;
  std::byte* all = local;
  board_ticket ticket;

  board_check(C& comm, const call_fingerprint& f, int tag, const char* op) : c(comm), name(op) {
    f.write(mine);
    const auto p = static_cast<std::size_t>(c.size());
    if (p > 16) {
      heap.resize(w * p);
      all = heap.data();
    }
    ticket = c.board_post(tag, std::span<const std::byte>(mine, w), name);
  }
  bool collect(bool wait) {
    return c.board_collect(ticket, std::span<std::byte>(all, w * static_cast<std::size_t>(c.size())), wait, name);
  }
  // Throws the same errc::mismatch on every rank when the collected
  // fingerprints differ, after aborting the group where the transport can
  // (peers blocked in a schedule the disagreement stalls are woken).
  void raise_if_disagreeing();
};

} // namespace detail

/// One call in words, for error messages: "allreduce of 100 f32 (sum,
/// ring, call 5 on its tag)".
inline std::string describe(const call_fingerprint& f) {
  std::string s = std::string(call_kind_name(f.kind)) + " of " + std::to_string(f.count);
  if (f.dt != 0) s += " " + detail::field_value(f, 2);
  s += " (";
  if (f.op != 0xff) s += detail::field_value(f, 3) + ", ";
  if (f.root >= 0) s += "root " + std::to_string(f.root) + ", ";
  if (!is_gossip(f.kind)) s += std::string(algorithm_name(f.algo)) + ", ";
  s += "call " + std::to_string(f.seq) + " on its tag)";
  return s;
}

/// The error text for fingerprints `all` (one per rank) that disagree: per
/// differing field, which ranks hold which value. The same on every rank.
inline std::string describe(std::span<const call_fingerprint> all) {
  std::string s = "ranks disagree on the call:";
  bool any = false;
  const bool gossip = std::any_of(all.begin(), all.end(), [](const call_fingerprint& f) { return is_gossip(f.kind); });
  for (int field = 0; field < detail::field_count; ++field) {
    std::vector<std::pair<std::string, std::vector<int>>> groups; // value -> ranks, first seen first
    for (std::size_t q = 0; q < all.size(); ++q) {
      const std::string v = detail::field_value(all[q], field);
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
      if (it == groups.end()) groups.push_back({v, {static_cast<int>(q)}});
      else it->second.push_back(static_cast<int>(q));
    }
    if (groups.size() < 2) continue;
    const char* label = field == 6 && gossip ? "topology, step or codec" : detail::field_names[field];
    s += std::string(any ? ";" : "") + " " + label + " differs (";
    for (std::size_t g = 0; g < groups.size(); ++g)
      s += (g ? "; " : "") + std::string(groups[g].second.size() > 1 ? "ranks " : "rank ") +
           detail::rank_list(groups[g].second) + ": " + groups[g].first;
    s += ")";
    any = true;
  }
  if (!any) s += " (fingerprint hashes differ but no field does: ranks run different builds?)";
  return s;
}

template <class C> void detail::board_check<C>::raise_if_disagreeing() {
  const int p = c.size();
  bool same = true;
  for (int q = 0; q < p && same; ++q) same = std::memcmp(all + w * static_cast<std::size_t>(q), mine, w) == 0;
  if (same) return;
  std::vector<call_fingerprint> fs;
  for (int q = 0; q < p; ++q) fs.push_back(call_fingerprint::read(all + w * static_cast<std::size_t>(q)));
  const std::string why = describe(fs);
  if constexpr (abortable<C>) c.abort("call check: " + why);
  throw error(errc::mismatch, name, c.rank(), -1, why);
}

/// Checks that every rank of `c` makes the call `f` (tag `tag`, used by
/// this check alone); returns when they all do, else throws the same
/// errc::mismatch error on every rank, raised by `name`. All ranks must
/// call it for the call (as they must call the collective).
template <transport C> void agree(C& c, const call_fingerprint& f, int tag, const char* name) {
  const int p = c.size(), r = c.rank();
  if (p <= 1) return;
  if constexpr (record_board<C>) {
    // Ranks sharing an address space gather the fingerprints themselves:
    // every rank sees all of them, so all raise the same error.
    detail::board_check<C> b(c, f, tag, name);
    b.collect(true);
    b.raise_if_disagreeing();
    return;
  } else {
    const std::uint64_t h = f.hash();
    std::uint64_t lohi[2] = {h, h};
    for (int d = 1; d < p; d *= 2) {
      std::uint64_t out[2] = {lohi[0], lohi[1]}, in[2] = {0, 0};
      auto rr = c.irecv(std::as_writable_bytes(std::span(in)), mod(r - d, p), tag);
      auto sr = c.isend(std::as_bytes(std::span(out)), mod(r + d, p), tag);
      rr.wait();
      sr.wait();
      lohi[0] = std::min(lohi[0], in[0]);
      lohi[1] = std::max(lohi[1], in[1]);
    }
    if (lohi[0] == lohi[1]) return;
    // Every rank saw the same min != max: all learn every fingerprint.
    std::vector<std::byte> wire(call_fingerprint::wire_bytes * static_cast<std::size_t>(p));
    f.write(wire.data() + call_fingerprint::wire_bytes * static_cast<std::size_t>(r));
    using recv_t = decltype(c.irecv(std::span<std::byte>{}, 0, tag));
    using send_t = decltype(c.isend(std::span<const std::byte>{}, 0, tag));
    std::vector<recv_t> rs;
    std::vector<send_t> ss;
    const std::span<const std::byte> mine(wire.data() + call_fingerprint::wire_bytes * static_cast<std::size_t>(r),
                                          call_fingerprint::wire_bytes);
    for (int k = 1; k < p; ++k) {
      const int q = mod(r - k, p);
      rs.push_back(c.irecv(std::span(wire.data() + call_fingerprint::wire_bytes * static_cast<std::size_t>(q),
                                     call_fingerprint::wire_bytes),
                           q, tag));
    }
    for (int k = 1; k < p; ++k) ss.push_back(c.isend(mine, mod(r + k, p), tag));
    for (auto& x : rs) x.wait();
    for (auto& x : ss) x.wait();
    std::vector<call_fingerprint> all;
    for (int q = 0; q < p; ++q)
      all.push_back(call_fingerprint::read(wire.data() + call_fingerprint::wire_bytes * static_cast<std::size_t>(q)));
    throw error(errc::mismatch, name, r, -1, describe(all));
  }
}

/// Runs `body` (the call's schedule) with the call check on a record_board
/// transport, in band: the fingerprint is posted before the schedule and
/// the fingerprints collected after it, whose own messages have by then
/// brought every rank into the call (a reduction's result depends on every
/// rank's input; a broadcast's root waits here for the others). The rank
/// that posts last sees every fingerprint before any data moves, so a
/// disagreement that would stall the schedule fails it at once: that rank
/// aborts the group, the others' schedules fail, and every rank raises the
/// same errc::mismatch. A schedule that fails for another reason keeps its
/// error unless the fingerprints show a disagreement.
template <record_board C, class F>
void checked_on_board(C& c, const call_fingerprint& f, int tag, const char* name, F&& body) {
  // Calls the schedule makes of its own (a compressed allreduce's inner
  // dense calls, its agreement on codec costs) are covered by this call's
  // fingerprint and do not post: a nested post would let a fast rank reach
  // this call's board half again before a slow one has collected it.
  if (c.size() <= 1 || detail::board_call == &c) return body();
  detail::board_check<C> b(c, f, tag, name);
  struct outermost {
    const void* saved = detail::board_call;
    explicit outermost(const void* comm) { detail::board_call = comm; }
    ~outermost() { detail::board_call = saved; }
  };
  if (b.ticket.complete) {
    b.collect(false);
    b.raise_if_disagreeing();
  }
  try {
    const outermost scope(&c);
    body();
  } catch (const error& e) {
    // A timeout has waited its full time already; anything else waits for
    // the fingerprints (bounded by the timeout) to tell a disagreement apart.
    bool all = false;
    try {
      all = b.collect(e.kind() != errc::timeout);
    } catch (const error&) {
    }
    if (all) b.raise_if_disagreeing();
    throw;
  }
  const scoped_phase check(trace_of(c), "verify", "call"); // a broadcast's root may wait here
  b.collect(true);
  b.raise_if_disagreeing();
}

} // namespace algo::verify
} // namespace gradsync
