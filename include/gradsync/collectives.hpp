// gradsync: the public collective operations. Each validates its arguments
// (a clear gradsync::error, never undefined behaviour), picks a schedule and
// runs it over any transport.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "algo/bruck.hpp"
#include "algo/chain.hpp"
#include "algo/dispatch.hpp"
#include "algo/dissemination.hpp"
#include "algo/hierarchical.hpp"
#include "algo/hierarchical_gather.hpp"
#include "algo/hierarchical_rooted.hpp"
#include "algo/options.hpp"
#include "algo/recursive_doubling.hpp"
#include "algo/recursive_halving.hpp"
#include "algo/ring.hpp"
#include "algo/scatter_allgather.hpp"
#include "algo/select.hpp"
#include "algo/shm_direct.hpp"
#include "algo/shm_direct_rooted.hpp"
#include "algo/tree.hpp"
#include "algo/verify.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/ops.hpp"
#include "exec/executor.hpp"
#include "exec/host.hpp"
#include "transport/capabilities.hpp"
#include "transport/subgroup.hpp"
#include "transport/transport.hpp"

namespace gradsync {

namespace detail {

template <class T> void check_span(std::span<T> s, const char* op, int rank, const char* what) {
  GRADSYNC_REQUIRE(s.data() != nullptr || s.empty(), op, rank,
          std::string(what) + " is null but holds " + std::to_string(s.size()) + " elements");
  GRADSYNC_REQUIRE(s.size() <= std::numeric_limits<std::size_t>::max() / sizeof(T) / 2, op, rank,
          std::string(what) + " size overflows");
}

// check_span, and for an executor that can tell (exec::cuda: pointer
// attributes) that the range lies in memory its element work can reach: a
// host range given to a device executor is an error naming the call, not a
// kernel fault.
template <class E, class T> void check_span(const E& ex, std::span<T> s, const char* op, int rank, const char* what) {
  check_span(s, op, rank, what);
  if constexpr (requires { ex.check_memory(static_cast<const void*>(s.data()), s.size_bytes(), op, rank, what); })
    if (!s.empty()) ex.check_memory(static_cast<const void*>(s.data()), s.size_bytes(), op, rank, what);
}

// Distinct, partially overlapping buffers would be read after being written.
template <class T, class U>
void check_alias(std::span<T> in, std::span<U> out, const char* op, int rank) {
  if (in.empty() || out.empty()) return;
  auto a = reinterpret_cast<std::uintptr_t>(in.data()), b = reinterpret_cast<std::uintptr_t>(out.data());
  const auto ae = a + in.size_bytes(), be = b + out.size_bytes();
  GRADSYNC_REQUIRE(a == b || ae <= b || be <= a, op, rank,
          "input and output overlap without being the same buffer");
}

inline void check_root(int root, int size, const char* op, int rank) {
  GRADSYNC_REQUIRE(root >= 0 && root < size, op, rank,
          "root " + std::to_string(root) + " out of range [0, " + std::to_string(size) + ")");
}

inline std::size_t mul_checked(std::size_t a, std::size_t b, const char* op, int rank) {
  GRADSYNC_REQUIRE(b == 0 || a <= std::numeric_limits<std::size_t>::max() / b, op, rank,
          std::to_string(a) + " x " + std::to_string(b) + " elements overflows size_t");
  return a * b;
}

[[noreturn]] inline void unsupported(const char* op, int rank, algorithm a) {
  throw error(op, rank, -1,
              "algorithm '" + std::string(algorithm_name(a)) + "' is not available for " + op);
}

// The selector `automatic` consults: the caller's, else the policy.hpp
// model (the shared-memory one on transports with an arena) with
// GRADSYNC_ALGO's table, read at the first call that needs it (a malformed
// value fails that call and every later one, never silently).
inline const selector& selector_of(const options& o, bool shared_arena) {
  if (o.select) return *o.select;
  static const selector defaults = selector::from_env(); // immutable once made
  static const selector shm = selector::from_env(cost_model::shared_memory());
  return shared_arena ? shm : defaults;
}

inline void check_tag(int tag, const char* op, int rank) {
  GRADSYNC_REQUIRE(tag >= 0 && tag <= policy::max_tag, op, rank,
                   "tag " + std::to_string(tag) + " out of range [0, " + std::to_string(policy::max_tag) +
                       "] (a call uses tags [tag, tag + " + std::to_string(policy::tag_span) + "))");
}

// Whether a call checks its fingerprint (every call unless the options say
// never: a disagreement at any size fails every rank with one error).
inline bool verifies(const options& o) { return o.verify != verification::never; }

// Where a call's fingerprint is checked. In band: in the first arena round
// of a direct schedule on a shared-arena transport, which every rank
// synchronises on anyway (no extra message). On other calls of such a
// transport: an arena round of its own. On a record_board transport (ranks
// in one address space): posted on the board before the schedule, collected
// after it (algo::verify::checked_on_board; no message, no wait of its own).
// On a transport that checks in its messages (inband_checked: MPI), a call
// whose schedule carries every rank's messages to every rank, up to
// policy::mpi_framed_max_bytes_on(p): framed (the hashes ride in the schedule's
// own messages, no message of its own); else the transport's round.
// Elsewhere: algo/verify.hpp's dissemination round of messages.
enum class check_path { none, inband, arena, board, messages, framed };

// The largest call framed on c (below: it needs the cost model).
template <transport C> std::size_t framed_limit(const C& c, const options& o);

// Whether every rank's messages reach every rank (directly or through
// others) in the schedule of `f`, each rank sending only after it received
// what its sends depend on: recursive doubling and Rabenseifner (and their
// fold for other rank counts), the ring (p - 1 steps from the left), the
// trees' reduce then broadcast, the gathers' Bruck and recursive doubling
// or halving rounds (every rank's block reaches, or is reduced from, every
// rank), the exchanges' every-pair messages, Bruck's rounds and the two-level
// schedule (each block relayed after its carrier received it), the
// two-level allreduce (every rank's result is reduced from every rank's
// input, through its group's and the other groups' messages), a dense
// exchange plan's run (every rank sends every rank a block), the
// dissemination barrier. Not broadcast, reduce or
// gossip (their data does not reach every rank), nor calls with nothing to
// send.
constexpr bool disseminates(const call_fingerprint& f) {
  switch (f.kind) {
  case call_kind::allreduce:
    return f.count > 0 && (f.algo == algorithm::rd || f.algo == algorithm::rabenseifner || f.algo == algorithm::ring ||
                           f.algo == algorithm::tree || f.algo == algorithm::dbtree || f.algo == algorithm::hier);
  case call_kind::reduce_scatter:
  case call_kind::allgather:
    return f.count > 0 && (f.algo == algorithm::ring || f.algo == algorithm::bruck || f.algo == algorithm::rd);
  case call_kind::alltoall:
    return f.count > 0 && (f.algo == algorithm::pairwise || f.algo == algorithm::scattered ||
                           f.algo == algorithm::bruck || f.algo == algorithm::hier);
  case call_kind::alltoallv: // a dense plan's run in items (count: its width; one-off and encoded runs: 0)
    return f.count > 0 && (f.algo == algorithm::pairwise || f.algo == algorithm::scattered || f.algo == algorithm::hier);
  case call_kind::barrier: return true;
  default: return false;
  }
}
template <transport C>
check_path check_path_of(const C& c, const call_fingerprint& f, std::size_t bytes, const options& o) {
  if (!verifies(o) || c.size() <= 1) return check_path::none;
  if constexpr (shared_arena<C> && recorded<C>) {
    // A zero-count direct call runs no round: it checks in its own round,
    // which meets the first round of its peers' calls.
    // The exchanges' direct schedule runs a round even with nothing to move.
    const bool exchange = f.kind == call_kind::alltoall || f.kind == call_kind::alltoallv;
    return f.algo == algorithm::direct && (f.count > 0 || exchange) ? check_path::inband : check_path::arena;
  } else if constexpr (record_board<C>) {
    return check_path::board;
  } else if constexpr (inband_checked<C>) {
    if (!disseminates(f)) return check_path::messages;
    return bytes <= policy::mpi_framed_max_bytes_on(c.size()) || bytes <= framed_limit(c, o) ? check_path::framed
                                                                                             : check_path::messages;
  } else {
    return check_path::messages;
  }
}

// The same errc::mismatch on every rank of a call its ranks disagree on,
// from every rank's fingerprint (inband_checked transports).
template <inband_checked C>
[[noreturn]] void raise_disagreement(C& c, const call_fingerprint& f, const char* name) {
  std::byte mine[call_fingerprint::wire_bytes];
  f.write(mine);
  const std::vector<std::byte> wire = c.check_fingerprints(mine);
  std::vector<call_fingerprint> all;
  for (std::size_t at = 0; at + call_fingerprint::wire_bytes <= wire.size(); at += call_fingerprint::wire_bytes)
    all.push_back(call_fingerprint::read(wire.data() + at));
  throw error(errc::mismatch, name, c.rank(), -1, algo::verify::describe(all));
}

// Runs `body` with the call check of an inband_checked transport: framed
// (the hashes in the schedule's own messages, compared after it) or a round
// before it; a disagreement seen anywhere becomes the exchange of
// fingerprints and one error on every rank.
template <inband_checked C, class F>
void checked_by_transport(C& c, const call_fingerprint& f, check_path path, int tag, const char* name, F&& body) {
  const int started = c.check_begin(f.hash(), f.seq, tag, path == check_path::framed);
  if (started == 0) return body(); // a call inside a checked call: covered by it
  if (started < 0) {               // another thread's call is being checked: a round of our own
    {
      const scoped_phase check(trace_of(c), "verify", "call");
      algo::verify::agree(c, f, tag, name);
    }
    return body();
  }
  struct end_check {
    C& c;
    bool on = true;
    void end() noexcept {
      if (on) c.check_end();
      on = false;
    }
    ~end_check() { end(); }
  } guard{c};
  if (path == check_path::messages) {
    {
      const scoped_phase check(trace_of(c), "verify", "call");
      if (!c.check_round()) raise_disagreement(c, f, name);
    }
    guard.end();
    return body();
  }
  try {
    body();
  } catch (const error&) {
    if (c.check_disagreed()) raise_disagreement(c, f, name);
    throw;
  }
  if (!c.check_agreed()) raise_disagreement(c, f, name);
}

// Runs the data-moving part of collective `name` (arguments validated, the
// schedule chosen, into `f`): fails fast on a communicator that failed
// before; numbers the call; checks the fingerprint (check_path_of); runs
// `body`. Any failure marks the communicator failed (the call may have
// left unmatched messages) and is raised as an error of `name` that keeps
// the kind and peer of the cause and adds the call and the elapsed time.
// On a traced communicator the call is one phase `name` of the timeline
// (arguments: the call in words, count, bytes, algorithm, sequence number),
// the check one phase "verify" inside it (on a record board: its collection
// after the schedule; none for shm's in-band check).
template <transport C, class F>
void run_call(C& c, const char* name, call_fingerprint f, std::size_t bytes, const options& o, F&& body) {
  const int r = c.rank();
  if constexpr (recorded<C>) {
    if (c.calls().failed())
      throw error(errc::aborted, name, r, -1,
                  "the communicator failed in an earlier call and must be rebuilt (" + c.calls().failure() + ")");
    f.seq = c.calls().next(o.tag);
  }
  // Ranks cutting the payload into different segments would exchange
  // messages of different sizes (direct calls and gossip have none).
  if (f.kind != call_kind::barrier && f.algo != algorithm::direct && !is_gossip(f.kind)) f.segment = o.segment();
  timeline* const trace = trace_of(c);
  const scoped_phase call(trace, name, "call", [&](trace_args& a) {
    a("call", algo::verify::describe(f))("count", f.count)("bytes", bytes)("algorithm", algorithm_name(f.algo))(
        "seq", f.seq);
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    const check_path path = check_path_of(c, f, bytes, o);
    if constexpr (inband_checked<C>) {
      if (path == check_path::none) body();
      else checked_by_transport(c, f, path, o.tag + policy::verify_tag_offset, name, body);
      return;
    }
    if (path == check_path::arena || path == check_path::messages) {
      const scoped_phase check(trace, "verify", "call");
      if constexpr (shared_arena<C>) algo::shm_direct::agree(c, f, name);
      else algo::verify::agree(c, f, o.tag + policy::verify_tag_offset, name);
    }
    if constexpr (record_board<C>) {
      if (path == check_path::board) algo::verify::checked_on_board(c, f, o.tag + policy::verify_tag_offset, name, body);
      else body();
    } else if constexpr (recorded<C>) {
      // In band: the schedule's first round publishes `f` (cleared after, so
      // that calls it makes of its own do not publish it again).
      struct inband_scope {
        call_record& rec;
        ~inband_scope() { rec.set_inband(nullptr); }
      } scope{c.calls()};
      if (path == check_path::inband) c.calls().set_inband(&f);
      body();
    } else {
      body();
    }
  } catch (const error& e) {
    if constexpr (recorded<C>) c.calls().fail(e.what());
    if (e.op() == name) throw;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    throw error(e.kind(), name, r, e.peer(),
                e.op() + ": " + e.reason() + " [in " + algo::verify::describe(f) + ", after " +
                    std::to_string(ms.count()) + " ms]");
  } catch (...) {
    if constexpr (recorded<C>) c.calls().fail(std::string(name) + ": an exception that is not a gradsync::error");
    throw;
  }
}

// The fingerprint of a reduction over T with Op.
template <class T, class Op>
call_fingerprint fingerprint_of(call_kind k, std::size_t count, algorithm a, int root = -1) {
  call_fingerprint f;
  f.kind = k;
  f.dt = static_cast<std::uint8_t>(dtype_traits<T>::id);
  if constexpr (!std::is_void_v<Op>) f.op = static_cast<std::uint8_t>(Op::kind);
  f.algo = a;
  f.root = root;
  f.count = count;
  return f;
}

// Groups of a hierarchical call `op`; hier needs a group size or node_of.
template <transport C> rank_groups hier_groups(const C& c, const options& o, const char* op = "allreduce") {
  GRADSYNC_REQUIRE(o.group_size >= 0, op, c.rank(),
          "group_size " + std::to_string(o.group_size) + " is negative");
  GRADSYNC_REQUIRE(o.group_size > 0 || node_aware<C>, op, c.rank(),
          "algorithm 'hier' needs groups: set options::group_size, or use a transport with node_of()");
  return groups_of(c, o.group_size);
}

// A hash of the groups' layout: the two-level schedules' messages follow
// the groups, so their calls carry it in the fingerprint (ranks must agree).
inline std::uint64_t groups_hash(const rank_groups& g) {
  return fnv1a(fnv_basis, g.group_of.data(), g.group_of.size() * sizeof(int));
}

// The fingerprint of a call that may run hier (with the groups' hash then).
template <element T, class Op>
call_fingerprint rooted_fingerprint(call_kind k, std::size_t count, algorithm a, int root, const rank_groups& g) {
  call_fingerprint f = fingerprint_of<T, Op>(k, count, a, root);
  if (a == algorithm::hier) f.codec = groups_hash(g);
  return f;
}

template <transport C> int grid_row_of(const C& c, const options& o) {
  GRADSYNC_REQUIRE(o.group_size >= 0, "allreduce", c.rank(),
          "group_size " + std::to_string(o.group_size) + " is negative");
  // A row longer than the communicator is one row of every rank (as
  // topology_of models it): the scratch size and the schedule must agree.
  return o.group_size > 0 ? std::min(o.group_size, c.size()) : grid_row(c.size());
}

} // namespace detail

namespace detail {
// Whether collectives with executor E may run through c's shared arena.
template <transport C, executor E> inline constexpr bool arena_for =
    shared_arena<C> && E::space == memory_space::host;
// Whether c can carry the buffers of executor E: device memory only travels
// on a transport that moves it (staged<C, M>, CUDA IPC, NCCL).
template <transport C, executor E> inline constexpr bool carries =
    E::space == memory_space::host || device_memory<C>;
#define GRADSYNC_CARRIES(C, E)                                                                                  \
  static_assert(::gradsync::detail::carries<C, E>,                                                             \
                "gradsync: a device executor's buffers need a transport that moves device memory "             \
                "(device_memory): wrap the host transport in gradsync::staged<C, cuda_copier> "                \
                "(transport/staged.hpp)")
// selector_of for communicator type C with buffers in E's memory space.
template <transport C, executor E = exec::host> const selector& selector_for(const options& o) {
  return selector_of(o, arena_for<C, E>);
}

} // namespace detail

/// The communicator as the cost model sees it under options `o` (groups from
/// o.group_size, else the transport's node_of, else none), for buffers in the
/// memory space of executor E (the shared arena serves host memory only).
template <transport C, executor E = exec::host> topology topology_of(const C& c, const options& o = {}) {
  const int p = c.size();
  constexpr bool arena = detail::arena_for<C, E>;
  // Closed forms where no node map is needed: automatic calls this per call.
  if (o.group_size > 0) return {p, std::min(o.group_size, p), (p + o.group_size - 1) / o.group_size, arena};
  if constexpr (requires { c.node_shape(); }) {
    return {p, c.node_shape().largest, c.node_shape().count, arena};
  } else if constexpr (node_aware<C>) {
    const rank_groups g = groups_of(c, 0);
    return {p, g.max_size(), g.count(), arena};
  } else {
    return {p, p, 1, arena};
  }
}

namespace detail {
// The largest call whose check rides in its messages (check_path::framed):
// policy::mpi_framed_max_bytes_on(p), chosen where a message costs ~0.5 us;
// where the ranks span nodes, ceil(log2 groups) of the separate round's
// steps cross the network (transport/mpi.hpp round_steps), so each of those
// steps' 4 KiB grows by the model's latency between nodes over that one
// (the frames' copies cost the same). Every rank holds the same model and
// topology, so all take the same path.
template <transport C> std::size_t framed_limit(const C& c, const options& o) {
  const std::size_t base = policy::mpi_framed_max_bytes_on(c.size());
  const int groups = topology_of(c, o).groups;
  if (groups <= 1) return base;
  const double ratio = selector_for<C>(o).model().global.alpha / policy::mpi_framed_reference_alpha;
  if (!(ratio > 1)) return base;
  const std::size_t steps = base / policy::mpi_framed_max_bytes;
  const std::size_t crossing =
      std::min(steps, static_cast<std::size_t>(std::bit_width(static_cast<unsigned>(groups - 1))));
  return static_cast<std::size_t>(static_cast<double>(policy::mpi_framed_max_bytes) *
                                  (static_cast<double>(steps - crossing) + static_cast<double>(crossing) * ratio));
}
} // namespace detail

/// The schedule `allreduce` runs for `count` elements of T under `o` with
/// executor E: o.algo, or for `automatic` the selector's choice (override
/// table, then the cheapest by the model, `direct` included where the
/// transport has a shared arena). The same on every rank given equal selectors.
template <element T, transport C, executor E = exec::host>
algorithm allreduce_algorithm(const C& c, std::size_t count, const options& o = {}) {
  if (o.algo != algorithm::automatic) return o.algo;
  return detail::selector_for<C, E>(o).choose(count * sizeof(T), topology_of<C, E>(c, o), o.segment());
}

/// The schedule `reduce_scatter` runs for blocks of `block` elements of T:
/// `ring`, or `direct` (the shared arena) where the model finds it cheaper.
template <element T, transport C, executor E = exec::host>
algorithm reduce_scatter_algorithm(const C& c, std::size_t block, const options& o = {}) {
  if (o.algo != algorithm::automatic) return o.algo;
  return detail::selector_for<C, E>(o).choose_reduce_scatter(block * sizeof(T) * static_cast<std::size_t>(c.size()),
                                                      topology_of<C, E>(c, o), o.segment());
}

/// The schedule `allgather` runs for blocks of `block` elements of T.
template <element T, transport C, executor E = exec::host>
algorithm allgather_algorithm(const C& c, std::size_t block, const options& o = {}) {
  if (o.algo != algorithm::automatic) return o.algo;
  return detail::selector_for<C, E>(o).choose_allgather(block * sizeof(T) * static_cast<std::size_t>(c.size()),
                                                 topology_of<C, E>(c, o), o.segment());
}

/// The schedule `broadcast` runs for `count` elements of T with executor E:
/// `ring` (the pipelined chain), `tree` (binomial) or, where the transport
/// has a shared arena, `direct` (algo/shm_direct_rooted.hpp), by the cost model.
template <element T, transport C, executor E = exec::host>
algorithm broadcast_algorithm(const C& c, std::size_t count, const options& o = {}) {
  if (o.algo != algorithm::automatic) return o.algo;
  return detail::selector_for<C, E>(o).choose_rooted(count * sizeof(T), topology_of<C, E>(c, o), false, o.segment());
}

/// The schedule `reduce` runs for `count` elements of T: `ring` (chain),
/// `tree`, or `direct` where the transport has a shared arena.
template <element T, transport C, executor E = exec::host>
algorithm reduce_algorithm(const C& c, std::size_t count, const options& o = {}) {
  if (o.algo != algorithm::automatic) return o.algo;
  return detail::selector_for<C, E>(o).choose_rooted(count * sizeof(T), topology_of<C, E>(c, o), true, o.segment());
}

namespace detail {
// Scratch bytes of allreduce schedule `a` (already chosen) for `count` elements.
template <element T, transport C>
std::size_t allreduce_scratch_bytes(algorithm a, const C& c, std::size_t count, const options& o) {
  const std::size_t seg = o.segment();
  switch (a) {
  case algorithm::hier: {
    const rank_groups g = hier_groups(c, o);
    return algo::hierarchical::allreduce_scratch_elems(count, sizeof(T), seg, g.max_size(), g.count()) *
           sizeof(T);
  }
  case algorithm::twod: {
    const int row = grid_row_of(c, o);
    return algo::hierarchical::allreduce_scratch_elems(count, sizeof(T), seg, row,
                                                       (c.size() + row - 1) / row) * sizeof(T);
  }
  default: return algo::flat_scratch_elems(a, count, sizeof(T), seg, c.size()) * sizeof(T);
  }
}
} // namespace detail

/// Scratch bytes `allreduce` needs for `count` elements of T with options `o`
/// and executor E (pass a buffer this large, in E's memory space, as
/// `o.workspace` to avoid a per-call allocation).
template <element T, transport C, executor E = exec::host>
std::size_t allreduce_workspace_bytes(const C& c, std::size_t count, const options& o = {}) {
  return detail::allreduce_scratch_bytes<T>(allreduce_algorithm<T, C, E>(c, count, o), c, count, o);
}

/// Allreduce, out of place: `out[i] = op over ranks of in[i]`. `out` must hold
/// at least `in.size()` elements (extra elements are untouched); `in` and `out`
/// may be the same buffer. Every rank must pass the same count. All ranks end
/// with bitwise identical results. The element work runs on executor `ex`
/// (buffers and workspace in its memory space).
template <transport C, executor E, element T, reduce_op Op = op::sum>
void allreduce(C& c, E& ex, std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op = {},
               const options& o = {}) {
  GRADSYNC_CARRIES(C, E);
  const char* name = "allreduce";
  const int r = c.rank();
  const scoped_timeout guard(c, o.timeout); // options::timeout for this call only
  detail::check_span(ex, in, name, r, "input");
  detail::check_span(ex, out, name, r, "output");
  GRADSYNC_REQUIRE(out.size() >= in.size(), name, r,
          "output holds " + std::to_string(out.size()) + " elements, input " +
              std::to_string(in.size()));
  detail::check_alias(in, out, name, r);
  detail::check_tag(o.tag, name, r);
  const std::size_t count = in.size();
  const algorithm a = allreduce_algorithm<T, C, E>(c, count, o);
  const std::size_t seg = o.segment();
  if (a == algorithm::direct && !detail::arena_for<C, E>) detail::unsupported(name, r, a);
  if (a != algorithm::direct && a != algorithm::hier && a != algorithm::twod && !algo::is_flat(a))
    detail::unsupported(name, r, a);
  const rank_groups groups = a == algorithm::hier ? detail::hier_groups(c, o) : rank_groups{};
  auto ws = ex.template scratch<T>(
      o.workspace, a == algorithm::direct ? 0 : detail::allreduce_scratch_bytes<T>(a, c, count, o) / sizeof(T), name, r);
  detail::run_call(c, name, detail::fingerprint_of<T, Op>(call_kind::allreduce, count, a), count * sizeof(T), o, [&] {
    if (a == algorithm::direct) {
      if constexpr (detail::arena_for<C, E>) algo::shm_direct::allreduce(c, in.data(), out.data(), count, op);
      return;
    }
    switch (a) {
    case algorithm::hier:
      algo::hierarchical::allreduce(c, ex, in.data(), out.data(), count, op, groups, o.inner, detail::selector_for<C, E>(o),
                                    seg, o.tag, ws.data());
      return;
    case algorithm::twod:
      algo::hierarchical::allreduce_2d(c, ex, in.data(), out.data(), count, op, detail::grid_row_of(c, o), seg,
                                       o.tag, ws.data());
      return;
    default:
      algo::flat_allreduce(a, c, ex, in.data(), out.data(), count, op, seg, o.tag, ws.data(), name);
    }
  });
}

/// Allreduce on the host executor (see above).
template <transport C, element T, reduce_op Op = op::sum>
void allreduce(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op = {},
               const options& o = {}) {
  exec::host ex;
  allreduce<C, exec::host, T, Op>(c, ex, in, out, op, o);
}

/// Allreduce in place on `data`, element work on executor `ex`.
template <transport C, executor E, element T, reduce_op Op = op::sum>
void allreduce(C& c, E& ex, std::span<T> data, Op op = {}, const options& o = {}) {
  GRADSYNC_CARRIES(C, E);
  allreduce<C, E, T, Op>(c, ex, std::span<const T>(data), data, op, o);
}

/// Allreduce in place on `data`.
template <transport C, element T, reduce_op Op = op::sum>
void allreduce(C& c, std::span<T> data, Op op = {}, const options& o = {}) {
  exec::host ex;
  allreduce<C, exec::host, T, Op>(c, ex, std::span<const T>(data), data, op, o);
}

/// Scratch bytes `reduce_scatter` needs for blocks of `block` elements.
template <element T, transport C, executor E = exec::host>
std::size_t reduce_scatter_workspace_bytes(const C& c, std::size_t block, const options& o = {}) {
  const auto p = static_cast<std::size_t>(c.size());
  const partition blocks{block * p, p};
  switch (reduce_scatter_algorithm<T, C, E>(c, block, o)) {
  case algorithm::ring: return algo::ring::scratch_elems(blocks, sizeof(T), o.segment(), c.size()) * sizeof(T);
  case algorithm::bruck: return algo::bruck::reduce_scatter_scratch_bytes<T>(blocks, o.segment(), c.size());
  case algorithm::rd: return algo::recursive_halving::scratch_bytes<T>(blocks, o.segment(), c.size());
  case algorithm::hier:
    return algo::hierarchical_gather::reduce_scatter_scratch_bytes<T>(detail::hier_groups(c, o, "reduce_scatter"),
                                                                      block, o.segment());
  default: return 0;
  }
}

/// Reduce-scatter: `in` holds size() blocks of `out.size()` elements; rank r
/// receives block r of the reduction. `out` may alias block r of `in`.
template <transport C, executor E, element T, reduce_op Op = op::sum>
void reduce_scatter(C& c, E& ex, std::type_identity_t<std::span<const T>> in, std::span<T> out,
                    Op op = {}, const options& o = {}) {
  GRADSYNC_CARRIES(C, E);
  const char* name = "reduce_scatter";
  const int r = c.rank();
  const scoped_timeout guard(c, o.timeout); // options::timeout for this call only
  detail::check_span(ex, in, name, r, "input");
  detail::check_span(ex, out, name, r, "output");
  const auto p = static_cast<std::size_t>(c.size());
  const std::size_t n = out.size();
  GRADSYNC_REQUIRE(in.size() == detail::mul_checked(n, p, name, r), name, r,
          "input holds " + std::to_string(in.size()) + " elements, expected ranks x output = " +
              std::to_string(p) + " x " + std::to_string(n));
  T* own = out.data();
  if (!out.empty() && !in.empty()) {
    const T* blk = in.data() + n * static_cast<std::size_t>(r);
    if (own != blk) detail::check_alias(in, out, name, r);
  }
  detail::check_tag(o.tag, name, r);
  const algorithm a = reduce_scatter_algorithm<T, C, E>(c, n, o);
  if (a != algorithm::ring && a != algorithm::bruck && a != algorithm::rd && a != algorithm::hier &&
      (a != algorithm::direct || !detail::arena_for<C, E>))
    detail::unsupported(name, r, a);
  const rank_groups groups = a == algorithm::hier ? detail::hier_groups(c, o, name) : rank_groups{};
  auto ws = ex.template scratch<T>(o.workspace, reduce_scatter_workspace_bytes<T, C, E>(c, n, o) / sizeof(T), name, r);
  detail::run_call(c, name, detail::rooted_fingerprint<T, Op>(call_kind::reduce_scatter, n, a, -1, groups),
                   in.size_bytes(), o, [&] {
    if (a == algorithm::hier) {
      algo::hierarchical_gather::reduce_scatter(c, ex, in.data(), own, n, op, groups,
                                                detail::selector_for<C, E>(o).model(), o.segment(), o.tag,
                                                reinterpret_cast<std::byte*>(ws.data()));
      return;
    }
    if (a == algorithm::direct) {
      if constexpr (detail::arena_for<C, E>) algo::shm_direct::reduce_scatter(c, in.data(), own, n, op);
      return;
    }
    const algo::typed_reduce<T, Op, E> sop{ex, op, c.size(), trace_of(c)};
    auto* w = reinterpret_cast<std::byte*>(ws.data());
    if (a == algorithm::bruck)
      algo::bruck::reduce_scatter(c, sop, in.data(), own, partition{n * p, p}, o.segment(), o.tag, w);
    else if (a == algorithm::rd)
      algo::recursive_halving::reduce_scatter(c, sop, in.data(), own, partition{n * p, p}, o.segment(), o.tag, w);
    else
      algo::ring::reduce_scatter(c, sop, in.data(), own, partition{n * p, p}, o.segment(), o.tag, w);
  });
}

/// Reduce-scatter on the host executor (see above).
template <transport C, element T, reduce_op Op = op::sum>
void reduce_scatter(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op = {},
                    const options& o = {}) {
  exec::host ex;
  reduce_scatter<C, exec::host, T, Op>(c, ex, in, out, op, o);
}

/// Scratch bytes `allgather` needs for blocks of `block` elements (hier only:
/// a group-ordered copy where the groups are not contiguous and equal).
template <element T, transport C, executor E = exec::host>
std::size_t allgather_workspace_bytes(const C& c, std::size_t block, const options& o = {}) {
  if (allgather_algorithm<T, C, E>(c, block, o) != algorithm::hier) return 0;
  return algo::hierarchical_gather::allgather_scratch_bytes<T>(detail::hier_groups(c, o, "allgather"), block);
}

/// Allgather: `out` receives size() blocks of `in.size()` elements, block r
/// from rank r. `in` may alias block r of `out` (in place).
template <transport C, executor E, element T>
void allgather(C& c, E& ex, std::type_identity_t<std::span<const T>> in, std::span<T> out,
               const options& o = {}) {
  GRADSYNC_CARRIES(C, E);
  const char* name = "allgather";
  const int r = c.rank();
  const scoped_timeout guard(c, o.timeout); // options::timeout for this call only
  detail::check_span(ex, in, name, r, "input");
  detail::check_span(ex, out, name, r, "output");
  const auto p = static_cast<std::size_t>(c.size());
  const std::size_t n = in.size();
  GRADSYNC_REQUIRE(out.size() == detail::mul_checked(n, p, name, r), name, r,
          "output holds " + std::to_string(out.size()) + " elements, expected ranks x input = " +
              std::to_string(p) + " x " + std::to_string(n));
  T* own = out.data() + n * static_cast<std::size_t>(r);
  if (n != 0 && own != in.data()) detail::check_alias(in, out, name, r);
  detail::check_tag(o.tag, name, r);
  const algorithm a = allgather_algorithm<T, C, E>(c, n, o);
  if (a != algorithm::ring && a != algorithm::bruck && a != algorithm::rd && a != algorithm::hier &&
      (a != algorithm::direct || !detail::arena_for<C, E>))
    detail::unsupported(name, r, a);
  const rank_groups groups = a == algorithm::hier ? detail::hier_groups(c, o, name) : rank_groups{};
  auto ws = ex.template scratch<T>(o.workspace, allgather_workspace_bytes<T, C, E>(c, n, o) / sizeof(T), name, r);
  detail::run_call(c, name, detail::rooted_fingerprint<T, void>(call_kind::allgather, n, a, -1, groups),
                   out.size_bytes(), o, [&] {
    if (a == algorithm::hier) {
      algo::hierarchical_gather::allgather(c, ex, in.data(), out.data(), n, groups,
                                           detail::selector_for<C, E>(o).model(), o.segment(), o.tag,
                                           reinterpret_cast<std::byte*>(ws.data()));
      return;
    }
    if (a == algorithm::direct) {
      if constexpr (detail::arena_for<C, E>) algo::shm_direct::allgather(c, in.data(), out.data(), n);
      return;
    }
    ex.copy(own, in.data(), n);
    const algo::typed_reduce<T, op::sum, E> sop{ex, op::sum{}, c.size()}; // copies only
    if (a == algorithm::bruck) algo::bruck::allgather(c, sop, out.data(), partition{n * p, p}, o.tag);
    else if (a == algorithm::rd) algo::recursive_doubling::allgather(c, sop, out.data(), partition{n * p, p}, o.tag);
    else algo::ring::allgather(c, sop, out.data(), partition{n * p, p}, o.segment(), o.tag, nullptr);
  });
}

/// Allgather on the host executor (see above).
template <transport C, element T>
void allgather(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, const options& o = {}) {
  exec::host ex;
  allgather<C, exec::host, T>(c, ex, in, out, o);
}

/// Broadcast `data` from `root` to every rank: the pipelined chain (`ring`),
/// the binomial tree (`tree`) or, over a shared arena, `direct` (every rank
/// copies the root's data out of the root's arena); `automatic` picks by the
/// cost model.
template <transport C, executor E, element T>
void broadcast(C& c, E& ex, std::span<T> data, int root, const options& o = {}) {
  GRADSYNC_CARRIES(C, E);
  const char* name = "broadcast";
  const int r = c.rank();
  const scoped_timeout guard(c, o.timeout); // options::timeout for this call only
  detail::check_span(ex, data, name, r, "buffer");
  detail::check_root(root, c.size(), name, r);
  detail::check_tag(o.tag, name, r);
  const algorithm a = broadcast_algorithm<T, C, E>(c, data.size(), o);
  if (a != algorithm::ring && a != algorithm::tree && a != algorithm::scatter_allgather && a != algorithm::hier &&
      (a != algorithm::direct || !detail::arena_for<C, E>))
    detail::unsupported(name, r, a);
  const rank_groups groups = a == algorithm::hier ? detail::hier_groups(c, o, name) : rank_groups{};
  detail::run_call(c, name, detail::rooted_fingerprint<T, void>(call_kind::broadcast, data.size(), a, root, groups),
                   data.size_bytes(), o, [&] {
                     if (a == algorithm::hier) {
                       algo::hierarchical_rooted::broadcast(c, ex, data.data(), data.size(), root, groups,
                                                            detail::selector_for<C, E>(o).model(), o.segment(), o.tag);
                     } else if (a == algorithm::direct) {
                       if constexpr (detail::arena_for<C, E>)
                         algo::shm_direct::broadcast(c, data.data(), data.size(), root);
                     } else if (a == algorithm::tree) {
                       algo::tree::broadcast(c, ex, data.data(), data.size(), root, o.segment(), o.tag);
                     } else if (a == algorithm::scatter_allgather) {
                       const algo::typed_reduce<T, op::sum, E> sop{ex, op::sum{}, c.size()}; // copies only
                       algo::scatter_allgather::broadcast(c, sop, data.data(), data.size(), root, o.segment(), o.tag);
                     } else {
                       algo::chain::broadcast(c, ex, data.data(), data.size(), root, o.segment(), o.tag);
                     }
                   });
}

/// Broadcast on the host executor (see above).
template <transport C, element T>
void broadcast(C& c, std::span<T> data, int root, const options& o = {}) {
  exec::host ex;
  broadcast<C, exec::host, T>(c, ex, data, root, o);
}

/// Scratch bytes `reduce` needs for `count` elements (executor E).
template <element T, transport C, executor E = exec::host>
std::size_t reduce_workspace_bytes(const C& c, std::size_t count, const options& o = {}) {
  const std::size_t seg = o.segment();
  switch (reduce_algorithm<T, C, E>(c, count, o)) {
  case algorithm::direct: return 0;
  case algorithm::hier: {
    const rank_groups g = detail::hier_groups(c, o, "reduce");
    return algo::hierarchical_rooted::reduce_scratch_elems(count, sizeof(T), seg, g.max_size(), g.count()) * sizeof(T);
  }
  case algorithm::tree: return algo::tree::reduce_scratch_elems(count, sizeof(T), seg, c.size()) * sizeof(T);
  default: return algo::chain::reduce_scratch_elems(count, sizeof(T), seg, c.size()) * sizeof(T);
  }
}

/// Reduce to `root`: at the root `out` (at least `in.size()` elements, may be
/// `in`) receives the reduction; elsewhere `out` is not touched and may be empty.
template <transport C, executor E, element T, reduce_op Op = op::sum>
void reduce(C& c, E& ex, std::type_identity_t<std::span<const T>> in, std::span<T> out, int root,
            Op op = {}, const options& o = {}) {
  GRADSYNC_CARRIES(C, E);
  const char* name = "reduce";
  const int r = c.rank();
  const scoped_timeout guard(c, o.timeout); // options::timeout for this call only
  detail::check_span(ex, in, name, r, "input");
  detail::check_span(ex, out, name, r, "output");
  detail::check_root(root, c.size(), name, r);
  if (r == root) {
    GRADSYNC_REQUIRE(out.size() >= in.size(), name, r,
            "root output holds " + std::to_string(out.size()) + " elements, input " +
                std::to_string(in.size()));
    detail::check_alias(in, out, name, r);
  }
  detail::check_tag(o.tag, name, r);
  const algorithm a = reduce_algorithm<T, C, E>(c, in.size(), o);
  if (a != algorithm::ring && a != algorithm::tree && a != algorithm::hier &&
      (a != algorithm::direct || !detail::arena_for<C, E>))
    detail::unsupported(name, r, a);
  const rank_groups groups = a == algorithm::hier ? detail::hier_groups(c, o, name) : rank_groups{};
  auto ws = ex.template scratch<T>(o.workspace, reduce_workspace_bytes<T, C, E>(c, in.size(), o) / sizeof(T), name, r);
  detail::run_call(c, name, detail::rooted_fingerprint<T, Op>(call_kind::reduce, in.size(), a, root, groups),
                   in.size_bytes(), o, [&] {
                     if (a == algorithm::hier) {
                       if (!in.empty())
                         algo::hierarchical_rooted::reduce(c, ex, in.data(), out.data(), in.size(), root, op, groups,
                                                           detail::selector_for<C, E>(o).model(), o.segment(), o.tag,
                                                           ws.data());
                     } else if (a == algorithm::direct) {
                       if constexpr (detail::arena_for<C, E>)
                         algo::shm_direct::reduce(c, in.data(), out.data(), in.size(), root, op);
                     } else if (a == algorithm::tree)
                       algo::tree::reduce(c, ex, in.data(), out.data(), in.size(), root, op, o.segment(), o.tag,
                                          ws.data());
                     else
                       algo::chain::reduce(c, ex, in.data(), out.data(), in.size(), root, op, o.segment(), o.tag,
                                           ws.data());
                   });
}

/// Reduce on the host executor (see above).
template <transport C, element T, reduce_op Op = op::sum>
void reduce(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, int root, Op op = {},
            const options& o = {}) {
  exec::host ex;
  reduce<C, exec::host, T, Op>(c, ex, in, out, root, op, o);
}

/// Returns on each rank only after every rank has entered the barrier.
template <transport C> void barrier(C& c, const options& o = {}) {
  const scoped_timeout guard(c, o.timeout);
  detail::check_tag(o.tag, "barrier", c.rank());
  call_fingerprint f;
  f.kind = call_kind::barrier;
  detail::run_call(c, "barrier", f, 0, o, [&] { algo::dissemination::barrier(c, o.tag); });
}

} // namespace gradsync
