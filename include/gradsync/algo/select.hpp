// gradsync: automatic algorithm choice. An alpha-beta-gamma cost model
// (alpha: seconds per message, beta: per byte sent, gamma: per byte reduced;
// one set per level: inside a group/node and between groups) predicts each
// schedule's time from the textbook formulas (docs/algorithms.md), and the
// cheapest wins. An override table (GRADSYNC_ALGO, or given in code) can pin
// an algorithm per message-size range.
//
// No hidden global state: the model and the table live in a `selector` value
// the caller owns and passes through options::select (null: the policy
// defaults, no table). `calibrate(comm)` builds one collectively: it times a
// ping-pong, the reduce kernel, memcpy and (over shared memory) the arena's
// synchronisation, reads GRADSYNC_ALGO once, and agrees all
// of it across ranks, because ranks that chose differently would deadlock.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/policy.hpp"
#include "../core/reduce.hpp"
#include "../transport/subgroup.hpp"
#include "dissemination.hpp"
#include "options.hpp"
#include "ring.hpp"
#include "schedule.hpp"
#include "shm_direct.hpp"

namespace gradsync {

/// Costs of one level of the network, in seconds.
struct link_cost {
  double alpha = 0; ///< per message: latency plus software overhead
  double beta = 0;  ///< per byte moved over the link
  double gamma = 0; ///< per byte combined by the reduction kernel
};

/// Costs of the shared-memory arena allreduce (algorithm::direct,
/// algo/shm_direct.hpp), which sends no messages: it copies through every
/// rank's arena and synchronises on shared flags. The defaults: copy is
/// policy::model_beta (the inproc transport's per-byte cost, itself one
/// memcpy: about 41 GB/s in cache on the CI VM), sync the 8 B direct
/// allreduce of 2 processes on that VM (0.2 .. 0.6 us, core/policy.hpp).
struct arena_cost {
  double copy = policy::model_beta; ///< seconds per byte one core copies (memcpy)
  double sync = 0.4e-6;             ///< seconds per synchronisation of all ranks (post a flag, await every rank's)
  double half_bytes = static_cast<double>(policy::shm_arena_bytes / 2); ///< bytes of one arena half (small path limit)
  double round_bytes = static_cast<double>(policy::shm_allreduce_round_bytes); ///< message bytes per large round (at most half_bytes)
};

/// The communicator as the model sees it: `ranks` ranks in `groups` groups of
/// at most `group_size` (1 group: no hierarchy known).
struct topology {
  int ranks = 1;
  int group_size = 1;
  int groups = 1;
};

/// Row length of the `twod` grid on p ranks: the divisor of p closest to
/// sqrt(p) (rows then all have equal length), or ceil(sqrt(p)) if p is prime.
constexpr int grid_row(int p) {
  int best = 0;
  for (int w = 2; w < p; ++w)
    if (p % w == 0 && (best == 0 || std::abs(w * w - p) < std::abs(best * best - p))) best = w;
  if (best) return best;
  int w = 1;
  while (w * w < p) ++w;
  return w;
}

/// The alpha-beta-gamma model of the allreduce (and rooted) schedules.
struct cost_model {
  link_cost local{policy::model_alpha, policy::model_beta, policy::model_gamma};
  link_cost global{policy::model_alpha, policy::model_beta, policy::model_gamma};
  arena_cost arena{};

  /// Link costs flat schedules see: between groups when there are several.
  const link_cost& flat_link(const topology& t) const { return t.groups > 1 ? global : local; }

  /// Predicted seconds of a flat allreduce of `n` bytes over `p` ranks on
  /// link `l` (`seg`: pipeline segment bytes). NaN for hier/twod/automatic.
  static double flat(algorithm a, double n, int p, const link_cost& l, double seg) {
    if (p <= 1) return 0;
    // Integer logarithms (bit operations, exact): this runs on every
    // automatic call, where libm's log2 was a tenth of an 8-byte allreduce.
    const auto up = static_cast<unsigned>(p);
    const double lg = std::bit_width(up - 1); // ceil(log2 p)
    const int pof2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
    const double k2 = std::countr_zero(static_cast<unsigned>(pof2)), fold = p == pof2 ? 0 : 1, q = (pof2 - 1.0) / pof2;
    switch (a) {
    case algorithm::ring:
      return 2 * (p - 1) * l.alpha + 2.0 * (p - 1) / p * n * l.beta + (p - 1.0) / p * n * l.gamma;
    case algorithm::tree:
      return 2 * lg * (l.alpha + n * l.beta) + lg * n * l.gamma;
    case algorithm::rd:
      return (k2 + 2 * fold) * (l.alpha + n * l.beta) + (k2 + fold) * n * l.gamma;
    case algorithm::rabenseifner:
      return (2 * k2 + 2 * fold) * l.alpha + (2 * q + 2 * fold) * n * l.beta + (q + fold) * n * l.gamma;
    case algorithm::dbtree: {
      const double h = std::bit_width(up) - 1; // floor(log2 p): height of the heap tree
      const double k = std::max(1.0, std::ceil(n / 2 / seg)), s = n / 2 / k;
      return (k + 2 * h) * (4 * l.alpha + 4 * s * l.beta + 2 * s * l.gamma);
    }
    default: return std::numeric_limits<double>::quiet_NaN();
    }
  }
  /// Hierarchical: ring reduce-scatter inside groups of g, the best flat
  /// allreduce of n/g bytes across the m groups, ring allgather inside groups.
  double hier(double n, int g, int m, double seg) const {
    const double local_part = 2 * (g - 1) * local.alpha + 2.0 * (g - 1) / g * n * local.beta +
                              (g - 1.0) / g * n * local.gamma;
    return local_part + best_flat(n / g, m, global, seg).second;
  }
  /// 2-D grid of rows of w (p/w rows): hier with rows as groups, the column
  /// step a ring, all on the flat link.
  double twod(double n, int p, int w, const link_cost& l) const {
    const int rows = (p + w - 1) / w;
    return 2 * (w - 1) * l.alpha + 2.0 * (w - 1) / w * n * l.beta + (w - 1.0) / w * n * l.gamma +
           flat(algorithm::ring, n / w, rows, l, 1);
  }
  /// The cheapest flat schedule and its cost (ties: the earlier in the list).
  static std::pair<algorithm, double> best_flat(double n, int p, const link_cost& l, double seg) {
    std::pair<algorithm, double> best{algorithm::ring, std::numeric_limits<double>::infinity()};
    for (auto a : {algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd, algorithm::rabenseifner})
      if (const double t = flat(a, n, p, l, seg); t < best.second) best = {a, t};
    return best;
  }
  /// Shared-memory arena allreduce of n bytes on p ranks (the local gamma).
  /// Up to policy::shm_direct_small_bytes: one round in which every rank
  /// stages its buffer, synchronises once and reduces all p copies. Larger:
  /// rounds of min(round_bytes, half_bytes), each copying 2n/rounds per rank (its others'
  /// shares in, its reduced share out twice, the others' results out),
  /// reducing its 1/p share and synchronising twice (staged, reduced).
  double direct(double n, int p) const {
    if (p <= 1) return 0;
    const double g = local.gamma;
    if (n <= static_cast<double>(policy::shm_direct_small_bytes) && n <= arena.half_bytes)
      return arena.sync + n * arena.copy + (p - 1) * n * g;
    const double rounds = std::max(1.0, std::ceil(n / std::min(arena.round_bytes, arena.half_bytes)));
    return 2 * rounds * arena.sync + 2 * n * arena.copy + (p - 1.0) / p * n * g;
  }
  /// Predicted seconds of allreduce algorithm `a` (any but automatic) on `t`;
  /// infinity where `a` does not apply (hier without groups, twod below 4 ranks).
  double allreduce(algorithm a, std::size_t bytes, const topology& t, std::size_t seg) const {
    const auto n = static_cast<double>(bytes);
    const auto s = static_cast<double>(seg);
    constexpr double inf = std::numeric_limits<double>::infinity();
    switch (a) {
    case algorithm::hier:
      return t.groups > 1 && t.group_size > 1 ? hier(n, t.group_size, t.groups, s) : inf;
    case algorithm::twod:
      return t.ranks >= 4 ? twod(n, t.ranks, grid_row(t.ranks), flat_link(t)) : inf;
    case algorithm::direct: return direct(n, t.ranks);
    case algorithm::automatic: return inf;
    default: return flat(a, n, t.ranks, flat_link(t), s);
    }
  }
  /// Predicted seconds of a broadcast (`reduce`: false) or reduce of `bytes`
  /// from/to one root: `tree` is the binomial tree, `ring` the pipelined chain.
  double rooted(algorithm a, std::size_t bytes, int p, bool reduce, std::size_t seg) const {
    if (p <= 1) return 0;
    const auto n = static_cast<double>(bytes);
    const link_cost& l = local;
    const double g = reduce ? l.gamma : 0;
    if (a == algorithm::tree)
      return std::bit_width(static_cast<unsigned>(p) - 1) * (l.alpha + n * (l.beta + g)); // ceil(log2 p) steps
    const double k = std::max(1.0, std::ceil(n / static_cast<double>(seg))), s = n / k;
    return (p - 2 + k) * (l.alpha + s * (l.beta + g));
  }
};

/// One entry of an override table: `algo` for messages of [lo, hi) bytes
/// (hi == SIZE_MAX: no upper end).
struct size_rule {
  algorithm algo = algorithm::automatic;
  std::size_t lo = 0, hi = SIZE_MAX;
};

namespace detail {

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

[[noreturn]] inline void bad_rule(std::string_view token, const std::string& why) {
  throw error("GRADSYNC_ALGO", -1, -1, "bad token '" + std::string(token) + "': " + why);
}

// "123", "2K", "1M", "4G" (binary multiples) or "max".
inline std::size_t parse_size(std::string_view s, std::string_view token) {
  s = trim(s);
  if (s == "max") return SIZE_MAX;
  std::size_t mult = 1;
  if (!s.empty()) switch (s.back()) {
    case 'K': case 'k': mult = std::size_t{1} << 10; break;
    case 'M': case 'm': mult = std::size_t{1} << 20; break;
    case 'G': case 'g': mult = std::size_t{1} << 30; break;
    default: break;
    }
  if (mult != 1) s.remove_suffix(1);
  if (s.empty()) bad_rule(token, "missing size");
  std::size_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') bad_rule(token, "size '" + std::string(s) + "' is not a number with an optional K/M/G suffix");
    const auto d = static_cast<std::size_t>(ch - '0');
    if (v > (SIZE_MAX - d) / 10) bad_rule(token, "size overflows");
    v = v * 10 + d;
  }
  if (v > SIZE_MAX / mult) bad_rule(token, "size overflows");
  return v * mult;
}

} // namespace detail

/// Parses an override table: `name[:lo-hi]` entries separated by ';', sizes in
/// bytes with optional K/M/G (x1024) suffixes, `max` for no upper bound, e.g.
/// "rd:0-2K;rabenseifner:2K-1M;ring:1M-max". A name alone covers every size;
/// `auto` hands a range back to the model; sizes no entry covers use the
/// model. Throws gradsync::error naming the bad token for unknown names, bad
/// sizes, empty ranges (lo >= hi) and overlapping ranges.
inline std::vector<size_rule> parse_algo_table(std::string_view spec) {
  std::vector<size_rule> rules;
  spec = detail::trim(spec);
  if (spec.empty()) return rules;
  while (true) {
    const auto semi = spec.find(';');
    const std::string_view token = detail::trim(spec.substr(0, semi));
    if (token.empty()) detail::bad_rule(token, "empty entry (two ';' in a row, or a leading/trailing ';')");
    const auto colon = token.find(':');
    size_rule rule;
    const std::string_view name = detail::trim(token.substr(0, colon));
    if (!parse_algorithm(name, rule.algo))
      detail::bad_rule(token, "unknown algorithm '" + std::string(name) +
                                  "' (auto, ring, tree, dbtree, rd, rabenseifner, hier, 2d)");
    if (colon != std::string_view::npos) {
      const std::string_view range = token.substr(colon + 1);
      const auto dash = range.find('-');
      if (dash == std::string_view::npos) detail::bad_rule(token, "range must be lo-hi");
      rule.lo = detail::parse_size(range.substr(0, dash), token);
      rule.hi = detail::parse_size(range.substr(dash + 1), token);
      if (rule.lo == SIZE_MAX) detail::bad_rule(token, "'max' is only valid as the upper bound");
      if (rule.lo >= rule.hi) detail::bad_rule(token, "empty range (lo >= hi)");
    }
    for (const auto& o : rules)
      if (rule.lo < o.hi && o.lo < rule.hi) detail::bad_rule(token, "range overlaps an earlier entry");
    rules.push_back(rule);
    if (semi == std::string_view::npos) break;
    spec = spec.substr(semi + 1);
  }
  return rules;
}

/// Chooses allreduce (and broadcast/reduce) schedules: the override table
/// first, then the cheapest by the cost model. A plain value, cheap to copy;
/// pass it by pointer in options::select.
class selector {
public:
  /// Default model (core/policy.hpp), no override table.
  selector() = default;
  /// A given model and (optionally) override table.
  explicit selector(cost_model m, std::vector<size_rule> table = {})
      : model_(m), table_(std::move(table)) {}

  /// A given model with the table of GRADSYNC_ALGO, read now (once). Every
  /// rank must see the same value; calibrate() checks that, this does not.
  static selector from_env(cost_model m = {}) {
    const char* s = std::getenv("GRADSYNC_ALGO");
    return selector(m, parse_algo_table(s ? s : ""));
  }

  const cost_model& model() const noexcept { return model_; }
  const std::vector<size_rule>& table() const noexcept { return table_; }

  /// The table's entry for `bytes`, or automatic when none covers it.
  algorithm pinned(std::size_t bytes) const {
    for (const auto& r : table_)
      if (r.lo <= bytes && (bytes < r.hi || r.hi == SIZE_MAX)) return r.algo;
    return algorithm::automatic;
  }

  /// The allreduce schedule for `bytes` on `t`.
  algorithm choose(std::size_t bytes, const topology& t, std::size_t seg) const {
    if (const auto a = pinned(bytes); a != algorithm::automatic) return a;
    return cheapest(bytes, t, seg);
  }

  /// The cheapest allreduce schedule on `t` by the model alone.
  algorithm cheapest(std::size_t bytes, const topology& t, std::size_t seg) const {
    if (t.ranks <= 1) return algorithm::ring;
    algorithm best = algorithm::ring;
    double cost = std::numeric_limits<double>::infinity();
    for (auto a : {algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd,
                   algorithm::rabenseifner, algorithm::twod, algorithm::hier})
      // a later candidate must be cheaper beyond rounding (e.g. 2d and
      // rabenseifner cost exactly the same on 4 ranks)
      if (const double c = model_.allreduce(a, bytes, t, seg); c < cost * (1 - 1e-9)) {
        best = a;
        cost = c;
      }
    return best;
  }

  /// The schedule of hier's inter-group step: the table's entry (unless it
  /// names hier/twod, which cannot nest) or the cheapest flat one.
  algorithm choose_inner(std::size_t bytes, int groups, std::size_t seg) const {
    if (const auto a = pinned(bytes); a != algorithm::automatic && a != algorithm::hier && a != algorithm::twod)
      return a;
    return cost_model::best_flat(static_cast<double>(bytes), groups, model_.global,
                                 static_cast<double>(seg)).first;
  }

  /// Broadcast (`reduce`: false) or reduce schedule: `tree` (binomial) or
  /// `ring` (the pipelined chain). The table applies when it names one of them.
  algorithm choose_rooted(std::size_t bytes, int p, bool reduce, std::size_t seg) const {
    if (const auto a = pinned(bytes); a == algorithm::tree || a == algorithm::ring) return a;
    return model_.rooted(algorithm::tree, bytes, p, reduce, seg) <
                   model_.rooted(algorithm::ring, bytes, p, reduce, seg)
               ? algorithm::tree
               : algorithm::ring;
  }

private:
  cost_model model_;
  std::vector<size_rule> table_;
};

namespace detail {

/// Seconds of the fastest of `iters` calls of f().
template <class F> double best_seconds(int iters, F f) {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

/// One step of a schedule as collectives run it, every rank busy at once:
/// each rank sends `bytes` to `to` and receives as many from `from` (-1: no
/// such message this step). Mean seconds of `iters` steps on this rank (0
/// if it has nothing to do). Timing all ranks together, rather than a
/// ping-pong between two while the rest idle, charges what a real step
/// costs: with more ranks than cores (in-process threads) a step waits for
/// the cores, and every pair shares the memory bandwidth.
template <transport C>
double exchange_step(C& c, int to, int from, std::size_t bytes, int iters, int tag) {
  if (to < 0 && from < 0) return 0;
  std::vector<std::byte> out(bytes), in(bytes);
  std::optional<decltype(c.irecv(std::span<std::byte>(in), from, tag))> rq;
  std::optional<decltype(c.isend(std::span<const std::byte>(out), to, tag))> sq;
  auto step = [&] {
    if (from >= 0) rq.emplace(c.irecv(std::span<std::byte>(in), from, tag));
    if (to >= 0) sq.emplace(c.isend(std::span<const std::byte>(out), to, tag));
    if (rq) rq->wait();
    if (sq) sq->wait();
    rq.reset();
    sq.reset();
  };
  step(); // warm: buffers faulted in, peers awake
  // The mean, not the best: with more ranks than cores the best step is one
  // in which the pair happened to have the cores to itself, which a
  // collective's steps do not.
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < iters; ++k) step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

/// alpha and beta of one exchange step with partners `to` and `from` (-1:
/// none), measured on every rank at once (see exchange_step).
template <transport C> link_cost measure_step(C& c, int to, int from, int tag) {
  // Start together (the barrier's own tag: its messages cannot match a step's).
  algo::dissemination::barrier(c, tag + 1);
  const double small = exchange_step(c, to, from, 8, policy::calibrate_iters, tag);
  algo::dissemination::barrier(c, tag + 1);
  const double large = exchange_step(c, to, from, policy::calibrate_bytes, policy::calibrate_iters / 4 + 1, tag);
  link_cost l;
  l.alpha = small;
  l.beta = std::max(0.0, large - small) / static_cast<double>(policy::calibrate_bytes);
  return l;
}

/// Seconds per byte on this rank (best of a few passes over
/// policy::calibrate_bytes) of the float sum kernel (gamma) and of memcpy
/// (the arena's copy cost).
struct kernel_costs {
  double gamma = 0, copy = 0;
};
inline kernel_costs measure_kernels() {
  const std::size_t n = policy::calibrate_bytes / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  const auto per_byte = [](double s) { return s / static_cast<double>(policy::calibrate_bytes); };
  kernel_costs k;
  k.gamma = per_byte(best_seconds(5, [&] {
    combine(a.data(), static_cast<const float*>(a.data()), static_cast<const float*>(b.data()), n, op::sum{});
  }));
  k.copy = per_byte(best_seconds(5, [&] {
    std::memcpy(b.data(), a.data(), policy::calibrate_bytes);
#if defined(__GNUC__)
    asm volatile("" : : "r"(b.data()) : "memory"); // the copy must happen, and here
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
};
static_assert(policy::calibrate_bytes > policy::shm_direct_small_bytes);
template <transport C> direct_times time_direct(C& c) {
  if constexpr (algo::shm_direct::arena_transport<C>) {
    std::vector<float> x(policy::calibrate_bytes / sizeof(float), 1.0f);
    auto best = [&](std::size_t n, int iters) {
      return best_seconds(iters, [&] { algo::shm_direct::allreduce(c, x.data(), x.data(), n, op::max{}); });
    };
    return {best(1, policy::calibrate_iters), best(x.size(), policy::calibrate_iters / 4 + 1)};
  } else {
    return {};
  }
}

inline std::int64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char ch : s) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return static_cast<std::int64_t>(h >> 2); // non-negative, so -h cannot overflow
}

} // namespace detail

/// Builds a selector collectively (every rank must call it, with the same
/// `group_size`): times one exchange step with every rank busy at once (see
/// exchange_step: 8 bytes for alpha, policy::calibrate_bytes for beta)
/// around each group and, when there are several groups, between
/// neighbouring groups (groups as in groups_of: blocks of `group_size`, else
/// the transport's nodes), and the float reduce kernel on every rank; reads GRADSYNC_ALGO once. The measurements (the slowest rank's
/// gamma and memcpy cost) and the table are agreed by an allreduce, so every
/// rank returns the same selector. On a transport with a shared-memory arena
/// it also times the direct allreduce of 4 bytes (the arena's sync) and of
/// policy::calibrate_bytes (its copy cost, after the syncs and reduction) and
/// reads the arena's size; elsewhere the arena's sync is the local alpha and
/// its copy cost the memcpy's. Throws on every rank if any rank's GRADSYNC_ALGO is
/// malformed or differs from the others'. Costs about 2 x
/// policy::calibrate_iters exchange steps plus a few reduce-kernel passes.
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
  const link_cost local = detail::measure_step(c, lto, lfrom, o.tag);
  const link_cost global = detail::measure_step(c, member((k + 1) % ng, i), member((k + ng - 1) % ng, i), o.tag);
  const detail::direct_times direct = detail::time_direct(c);
  const detail::kernel_costs kernels = detail::measure_kernels();
  const double h = static_cast<double>(detail::fnv1a(spec));
  // max over ranks of: step times (the slowest rank's), gamma, the table's
  // hash and its negation (equal everywhere iff max(h) == -max(-h)), error
  // flag, memcpy cost, the direct allreduce's times.
  std::vector<double> v{local.alpha, local.beta, global.alpha, global.beta, kernels.gamma,
                        h, -h, parse_error ? 1.0 : 0.0, kernels.copy, direct.small, direct.large};
  std::vector<double> ws(algo::ring::scratch_elems(partition{v.size(), static_cast<std::size_t>(p)},
                                                   sizeof(double), policy::ring_segment_bytes, p));
  algo::ring::allreduce(c, static_cast<const double*>(v.data()), v.data(), v.size(), op::max{},
                        policy::ring_segment_bytes, o.tag, ws.data());
  if (v[7] != 0) {
    if (parse_error) throw error(parse_error->op(), r, -1, parse_error->reason());
    throw error("GRADSYNC_ALGO", r, -1, "malformed on another rank");
  }
  GRADSYNC_REQUIRE(v[5] == -v[6], "GRADSYNC_ALGO", r, "differs between ranks (this rank: '" + spec + "')");
  cost_model m;
  m.local = {v[0], v[1], v[4]};
  m.global = groups.count() > 1 ? link_cost{v[2], v[3], v[4]} : m.local;
  m.arena.copy = v[8];
  m.arena.sync = v[9] > 0 ? v[9] : v[0];
  if constexpr (algo::shm_direct::arena_transport<C>) {
    m.arena.half_bytes = static_cast<double>(algo::shm_direct::detail::half_bytes(c));
    // Copies between ranks' caches cost more than a memcpy within one: the
    // copy cost is what the timed large direct allreduce leaves after its
    // synchronisations and reduction.
    if (p > 1) {
      const auto n = static_cast<double>(policy::calibrate_bytes);
      cost_model no_copy = m;
      no_copy.arena.copy = 0;
      m.arena.copy = std::max(0.0, v[10] - no_copy.direct(n, p)) / (2 * n);
    }
  }
  return selector(m, std::move(table));
}

} // namespace gradsync
