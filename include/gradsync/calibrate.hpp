// gradsync: calibration, the measuring half of automatic algorithm choice.
// `calibrate(comm)` runs collectives to time one exchange step per link level,
// the reduce kernel, memcpy and (over shared memory) the arena allreduce, and
// returns a selector (algo/select.hpp, the pure model) whose costs every rank
// agrees on. It runs collectives, so it sits above collectives.hpp; the
// model (select.hpp), which every collective consults, pulls in no
// measurement or schedule code.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/ops.hpp"
#include "core/policy.hpp"
#include "core/reduce.hpp"
#include "transport/subgroup.hpp"
#include "transport/transport.hpp"
#include "algo/options.hpp"
#include "algo/select.hpp"
#include "algo/shm_direct.hpp"

namespace gradsync {

namespace detail {

/// Seconds (on c's clock: seconds_now) of the fastest of `iters` calls of f().
template <transport C, class F> double best_seconds(const C& c, int iters, F f) {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < iters && best > 0; ++i) { // a clock that did not see the work (a simulator's) will not
    const double t0 = seconds_now(c);
    f();
    best = std::min(best, seconds_now(c) - t0);
  }
  return best;
}

// Calibration's buffers: the caller's workspace when it holds `n` bytes
// (calibrate_workspace_bytes), else allocated (exec::host_scratch).
inline exec::host_scratch<std::byte> scratch_bytes(std::span<std::byte> given, std::size_t n) {
  return exec::host_scratch<std::byte>(given.size() >= n ? given : std::span<std::byte>{}, n, "calibrate", -1);
}

// Seconds per call of `f` over `iters` calls after one warm call. The mean
// on a real clock, not the best: with more ranks than cores the best step is
// one in which the pair happened to have the cores to itself, which a
// collective's steps do not. The median where the clock repeats itself (a
// simulator's): there the first steps after a barrier carry its exit skew
// (at 1024 simulated ranks, 8 per node: ~22 us in a few of the first 8
// steps of a 1 us shift around a node, which a mean of 20 turned into 3 us).
template <transport C, class F> double timed_steps(const C& c, int iters, F f) {
  f(); // warm: buffers faulted in, peers awake
  if (!clock_repeats(c)) {
    const double t0 = seconds_now(c);
    for (int k = 0; k < iters; ++k) f();
    return (seconds_now(c) - t0) / iters;
  }
  std::vector<double> d(static_cast<std::size_t>(iters));
  for (auto& x : d) {
    const double t0 = seconds_now(c);
    f();
    x = seconds_now(c) - t0;
  }
  std::nth_element(d.begin(), d.begin() + iters / 2, d.end());
  return d[static_cast<std::size_t>(iters / 2)];
}

/// One step of a schedule as collectives run it, every rank busy at once:
/// each rank sends `bytes` to `to` and receives as many from `from` (-1: no
/// such message this step). Seconds per step of `iters` steps on this rank (0
/// if it has nothing to do). Timing all ranks together, rather than a
/// ping-pong between two while the rest idle, charges what a real step
/// costs: with more ranks than cores (in-process threads) a step waits for
/// the cores, and every pair shares the memory bandwidth. See timed_steps.
template <transport C>
double exchange_step(C& c, int to, int from, std::size_t bytes, int iters, int tag, std::span<std::byte> ws = {}) {
  if (to < 0 && from < 0) return 0;
  const auto buf = scratch_bytes(ws, 2 * bytes);
  const std::span<std::byte> out(buf.data(), bytes), in(buf.data() + bytes, bytes);
  std::optional<decltype(c.irecv(in, from, tag))> rq;
  std::optional<decltype(c.isend(std::span<const std::byte>(out), to, tag))> sq;
  auto step = [&] {
    if (from >= 0) rq.emplace(c.irecv(in, from, tag));
    if (to >= 0) sq.emplace(c.isend(std::span<const std::byte>(out), to, tag));
    if (rq) rq->wait();
    if (sq) sq->wait();
    rq.reset();
    sq.reset();
  };
  return timed_steps(c, iters, step);
}

/// Seconds (as timed_steps) of `iters` bursts of `k` messages of `m` bytes
/// to `to` and from `from`, all in flight at once (0 if this rank has
/// nothing to do). 8-byte messages: the k - 1 extra messages cost their
/// software overhead, not their latency; large ones: their bytes too, as
/// far as messages in flight together share the link.
template <transport C>
double burst_step(C& c, int to, int from, int k, std::size_t m, int iters, int tag, std::span<std::byte> ws = {}) {
  if (to < 0 && from < 0) return 0;
  const std::size_t all = m * static_cast<std::size_t>(k);
  const auto buf = scratch_bytes(ws, 2 * all);
  const std::span<std::byte> out(buf.data(), all), in(buf.data() + all, all);
  std::vector<algo::request_t<C>> q;
  auto burst = [&] {
    for (int j = 0; j < k; ++j) {
      const auto at = static_cast<std::size_t>(j) * m;
      if (from >= 0) q.push_back(c.irecv(in.subspan(at, m), from, tag));
      if (to >= 0) q.push_back(c.isend(std::span<const std::byte>(out.subspan(at, m)), to, tag));
    }
    algo::wait_all(q);
  };
  return timed_steps(c, iters, burst);
}

/// alpha and beta of one exchange step with partners `to` and `from` (-1:
/// none), measured on every rank at once (see exchange_step), what the sizes
/// between 8 B and policy::calibrate_bytes cost beyond them (link_cost::
/// extra; a rank with no partner measures 0), and the part
/// of alpha a burst of messages overlaps (link_cost::latency: alpha less
/// the per-message overhead the burst shows), and how far large messages
/// in flight together share the link (link_cost::inflight_share: a step
/// of calibrate_bytes / calibrate_split against calibrate_split such
/// messages at once, which take about that many steps' bytes where they
/// share, one step's where they do not).
/// `full` false: beta alone (no sizes between, no bursts: latency left at
/// alpha, share at 1), for a step whose other costs nothing uses.
template <transport C>
link_cost measure_step(C& c, int to, int from, int tag, int iters, std::span<std::byte> ws, bool full = true) {
  // Start together (the barrier's own tag: its messages cannot match a step's).
  barrier(c, {.tag = tag + 1});
  const double small = exchange_step(c, to, from, 8, iters, tag);
  barrier(c, {.tag = tag + 1});
  const double large = exchange_step(c, to, from, policy::calibrate_bytes, iters / 4 + 1, tag, ws);
  link_cost l;
  l.alpha = l.latency = small;
  l.beta = std::max(0.0, large - small) / static_cast<double>(policy::calibrate_bytes);
  // The sizes between: what each costs beyond alpha + m beta (link_cost::extra).
  for (std::size_t i = 0; full && i < policy::calibrate_mid_points; ++i) {
    const std::size_t m = policy::calibrate_mid_bytes[i];
    barrier(c, {.tag = tag + 1});
    l.extra[i] = exchange_step(c, to, from, m, iters, tag, ws) - (small + static_cast<double>(m) * l.beta);
  }
  if (full) {
    // A rank with no partner reports no sharing, so that the ranks' largest
    // (calibrate's agreement) is the measuring ranks'.
    if (to < 0 && from < 0) l.inflight_share = 0;
    barrier(c, {.tag = tag + 1});
    constexpr int k = 8;
    const double b = burst_step(c, to, from, k, 8, std::max(5, iters / 4 + 1), tag);
    l.latency = std::clamp(small - std::max(0.0, b - small) / (k - 1), 0.0, small);
    constexpr int s = policy::calibrate_split;
    constexpr std::size_t piece = policy::calibrate_bytes / s;
    barrier(c, {.tag = tag + 1});
    const double one = exchange_step(c, to, from, piece, iters / 4 + 1, tag, ws);
    barrier(c, {.tag = tag + 1});
    const double split = burst_step(c, to, from, s, piece, iters / 4 + 1, tag, ws);
    // Beyond one piece's message and the other pieces' own overheads, what
    // the other pieces' bytes added, as a share of what their bytes cost
    // alone: a piece's step less its latency (alpha and the size's extra,
    // which pieces in flight overlap: SMPI's NICs, shared, measured 0.8
    // with it in). Against a piece, not calibrate_bytes at beta: a piece may
    // move faster per byte (it stays in cache; MPICH, 2 ranks: 0.4-1 that way).
    const double others = (s - 1) * (one - l.alpha_at(static_cast<double>(piece)));
    const double own = (s - 1) * (small - l.latency);
    if (others > 0) l.inflight_share = std::clamp((split - one - own) / others, 0.0, 1.0);
  }
  return l;
}

/// Seconds per byte on this rank (best of a few passes over
/// policy::calibrate_bytes) of the float sum kernel (gamma) and of memcpy
/// (the arena's copy cost), on c's clock (under a simulator that does not
/// simulate computation: 0).
struct kernel_costs {
  double gamma = 0, copy = 0;
};
template <transport C> kernel_costs measure_kernels(const C& c, int passes, std::span<std::byte> ws) {
  const std::size_t n = policy::calibrate_bytes / sizeof(float);
  const auto buf = scratch_bytes(ws, 2 * policy::calibrate_bytes);
  float* const a = reinterpret_cast<float*>(buf.data());
  float* const b = a + n;
  std::fill(a, a + n, 1.0f);
  std::fill(b, b + n, 2.0f);
  const auto per_byte = [](double s) { return s / static_cast<double>(policy::calibrate_bytes); };
  kernel_costs k;
  k.gamma = per_byte(best_seconds(c, passes, [&] {
    combine(a, static_cast<const float*>(a), static_cast<const float*>(b), n, op::sum{});
  }));
  k.copy = per_byte(best_seconds(c, passes, [&] {
    std::memcpy(b, a, policy::calibrate_bytes);
#if defined(__GNUC__)
    asm volatile("" : : "r"(b) : "memory"); // the copy must happen, and here
#endif
  }));
  return k;
}

/// Fastest direct allreduce (algo/shm_direct.hpp) of 4 bytes (one
/// synchronisation; copying and reducing 4 bytes is noise) and of
/// policy::calibrate_bytes (one round of the large path), in seconds. Both 0
/// on transports without an arena, where direct cannot run.
struct direct_times {
  double small = 0, large = 0;
  double ring = 0; ///< the ring allreduce of policy::calibrate_bytes over the same transport
};
static_assert(policy::calibrate_bytes > policy::shm_direct_small_bytes);
template <transport C> direct_times time_direct(C& c) {
  if constexpr (shared_arena<C>) {
    std::vector<float> x(policy::calibrate_bytes / sizeof(float), 1.0f);
    const options direct{.algo = algorithm::direct};
    auto best = [&](std::size_t n, int iters) {
      return best_seconds(c, iters, [&] { allreduce(c, std::span<float>(x.data(), n), op::max{}, direct); });
    };
    const options ring{.algo = algorithm::ring};
    const double ring_s = best_seconds(c, policy::calibrate_iters / 4 + 1,
                                       [&] { allreduce(c, std::span<float>(x), op::max{}, ring); });
    return {best(1, policy::calibrate_iters), best(x.size(), policy::calibrate_iters / 4 + 1), ring_s};
  } else {
    return {};
  }
}

inline std::int64_t env_hash(std::string_view s) {
  return static_cast<std::int64_t>(fnv1a(fnv_basis, s) >> 2); // non-negative, so -h cannot overflow
}

} // namespace detail

/// Bytes of the workspace calibrate() uses when `options::workspace` holds them.
constexpr std::size_t calibrate_workspace_bytes() noexcept { return 2 * policy::calibrate_bytes; }

/// Builds a selector collectively (every rank must call it, with the same
/// `group_size`): times one exchange step with every rank busy at once (see
/// exchange_step: 8 bytes for alpha, policy::calibrate_bytes for beta)
/// around each group and, when there are several groups, between
/// neighbouring groups (groups as in groups_of: blocks of `group_size`, else
/// the transport's nodes) with every rank and then one rank per group
/// crossing (the global link, and from the ratio of the two betas the
/// model's nic_share), and the float reduce kernel on every rank; times
/// are on the transport's clock (seconds_now: simulated under SMPI); reads GRADSYNC_ALGO once. The measurements (the slowest rank's
/// gamma and memcpy cost) and the table are agreed by an allreduce, so every
/// rank returns the same selector. On a transport with a shared-memory arena
/// it also times the direct allreduce of 4 bytes (the arena's sync) and of
/// policy::calibrate_bytes (its copy cost, after the syncs and reduction) and
/// reads the arena's size; elsewhere the arena's sync is the local alpha and
/// its copy cost the memcpy's. Throws on every rank if any rank's GRADSYNC_ALGO is
/// malformed or differs from the others'. Costs about 2 x
/// policy::calibrate_iters exchange steps plus a few reduce-kernel passes.
/// Its large buffers (2 x policy::calibrate_bytes) are `o.workspace` when
/// that holds calibrate_workspace_bytes() (a simulator's bench passes shared
/// memory there: 1024 simulated ranks would otherwise fault in and copy
/// 16 MiB each), else allocated.
template <transport C> selector calibrate(C& c, int group_size = 0, const options& o = {}) {
  const int p = c.size(), r = c.rank();
  const rank_groups groups = groups_of(c, group_size);
  // The environment is parsed first but errors are raised only after the
  // agreement below, so a rank with a bad value cannot leave others waiting.
  const char* env = std::getenv("GRADSYNC_ALGO");
  const std::string spec = env ? env : "";
  std::vector<size_rule> table;
  std::optional<error> parse_error;
  try {
    table = parse_algo_table(spec);
  } catch (const error& e) {
    parse_error = e;
  }
  // Local step: a shift around each group; global step: a shift between
  // neighbouring groups, rank i of group k to rank i of group k+1.
  const int k = groups.group_of[static_cast<std::size_t>(r)], ng = groups.count();
  const auto& mine = groups.members[static_cast<std::size_t>(k)];
  const int g = static_cast<int>(mine.size());
  const int i = static_cast<int>(std::find(mine.begin(), mine.end(), r) - mine.begin());
  const int lto = g > 1 ? mine[static_cast<std::size_t>((i + 1) % g)] : -1;
  const int lfrom = g > 1 ? mine[static_cast<std::size_t>((i + g - 1) % g)] : -1;
  auto member = [&](int group, int idx) {
    const auto& mem = groups.members[static_cast<std::size_t>(group)];
    return ng > 1 && idx < static_cast<int>(mem.size()) ? mem[static_cast<std::size_t>(idx)] : -1;
  };
  // Timed repetitions: fewer where the clock repeats itself (a simulator's:
  // enough for the median to pass over a barrier's skew, timed_steps).
  const bool repeats = clock_repeats(c);
  const int iters = repeats ? 9 : policy::calibrate_iters;
  const link_cost local = detail::measure_step(c, lto, lfrom, o.tag, iters, o.workspace);
  // Between groups twice: every rank crossing at once, then rank 0 of each
  // group alone: their betas' ratio is how many crossing ranks share one
  // link out of a group (cost_model::nic_share).
  const int gto = member((k + 1) % ng, i), gfrom = member((k + ng - 1) % ng, i);
  const link_cost crowded = detail::measure_step(c, gto, gfrom, o.tag, iters, o.workspace, false); // its beta only
  const link_cost global = detail::measure_step(c, i == 0 ? gto : -1, i == 0 ? gfrom : -1, o.tag, iters, o.workspace);
  const detail::direct_times direct = detail::time_direct(c);
  const detail::kernel_costs kernels = detail::measure_kernels(c, repeats ? 1 : 5, o.workspace);
  const double h = static_cast<double>(detail::env_hash(spec));
  // max over ranks of: step times (the slowest rank's), gamma, the table's
  // hash and its negation (equal everywhere iff max(h) == -max(-h)), error
  // flag, memcpy cost, the direct allreduce's times.
  std::vector<double> v{local.alpha, local.beta, global.alpha, global.beta, kernels.gamma,
                        h, -h, parse_error ? 1.0 : 0.0, kernels.copy, direct.small, direct.large, direct.ring,
                        crowded.beta, static_cast<double>(groups.max_size()), local.latency, global.latency};
  // The extras go as alpha + extra (the slowest rank's time beyond
  // alpha + m beta; an extra alone could be negative) and come back as
  // differences from the agreed alpha.
  constexpr std::size_t mid = 16, nmid = policy::calibrate_mid_points;
  for (std::size_t j = 0; j < nmid; ++j) v.push_back(local.alpha + local.extra[j]);
  for (std::size_t j = 0; j < nmid; ++j) v.push_back(global.alpha + global.extra[j]);
  constexpr std::size_t shares = mid + 2 * nmid; // then the in-flight shares (the largest rank's)
  v.insert(v.end(), {local.inflight_share, global.inflight_share});
  // A fixed schedule: `automatic` would consult a model, which is what this
  // call is still agreeing on.
  // Recursive doubling: ceil(log2 p) steps, where a ring's 2(p - 1) took
  // seconds of a 1024-rank simulation.
  allreduce(c, std::span<double>(v), op::max{}, options{.algo = algorithm::rd, .tag = o.tag});
  if (v[7] != 0) {
    if (parse_error) throw error(parse_error->op(), r, -1, parse_error->reason());
    throw error("GRADSYNC_ALGO", r, -1, "malformed on another rank");
  }
  GRADSYNC_REQUIRE(v[5] == -v[6], "GRADSYNC_ALGO", r, "differs between ranks (this rank: '" + spec + "')");
  cost_model m;
  m.local = {v[0], v[1], v[4], v[14]};
  link_cost across{v[2], v[3], v[4], v[15]};
  for (std::size_t j = 0; j < nmid; ++j) {
    m.local.extra[j] = v[mid + j] - v[0];
    across.extra[j] = v[mid + nmid + j] - v[2];
  }
  m.local.inflight_share = v[shares];
  across.inflight_share = v[shares + 1];
  m.global = groups.count() > 1 ? across : m.local;
  if (groups.max_size() <= 1) m.local = m.global; // groups of one rank: no link inside a group to time
  if (groups.count() > 1 && v[3] > 0) m.nic_share = std::clamp(v[12] / v[3], 1.0, std::max(1.0, v[13]));
  m.arena.copy = v[8];
  m.arena.sync = v[9] > 0 ? v[9] : v[0];
  if constexpr (shared_arena<C>) {
    m.arena.half_bytes = static_cast<double>(algo::shm_direct::detail::half_bytes(c));
    // Copies between ranks' caches cost more than a memcpy within one: the
    // copy cost is what the timed large direct allreduce leaves after its
    // synchronisations and reduction.
    if (p > 1) {
      const auto n = static_cast<double>(policy::calibrate_bytes);
      cost_model no_copy = m;
      no_copy.arena.copy = 0;
      m.arena.copy = std::max(0.0, v[10] - no_copy.direct(n, p)) / (2 * n);
      // Message schedules over shared memory pay more per byte than the
      // exchange step shows (its buffers stay warm; a ring's segments and
      // staging do not): with the step's beta the ring was modelled 1.4-2x
      // too fast (1-64 MiB, 2 ranks) and, the step's beta varying 2-4e-10
      // between runs, `automatic` took it over direct in 1 of 3 bench runs
      // (33 vs 16.6 ms at 64 MiB). Beta is the larger of the step's and the
      // one at which the model's ring is the timed one (in segments of
      // policy::ring_segment_bytes: time_direct's options name no selector;
      // the model's ring is piecewise linear in beta: the secant from 0 to
      // the step's beta, in-flight share applied).
      link_cost no_beta = m.local;
      no_beta.beta = 0;
      const double seg = static_cast<double>(policy::ring_segment_bytes);
      const double base = cost_model::flat(algorithm::ring, n, p, no_beta, seg);
      const double per_beta = m.local.beta > 0
                                  ? (cost_model::flat(algorithm::ring, n, p, m.local, seg) - base) / m.local.beta
                                  : 2.0 * (p - 1) / p * n;
      const double implied = per_beta > 0 ? (v[11] - base) / per_beta : 0;
      m.local.beta = std::max(m.local.beta, implied);
      if (groups.count() <= 1) m.global = m.local;
    }
  }
  return selector(m, std::move(table));
}

} // namespace gradsync
