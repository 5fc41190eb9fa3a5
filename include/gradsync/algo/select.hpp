// gradsync: automatic algorithm choice. An alpha-beta-gamma cost model
// (alpha: seconds per message, beta: per byte sent, gamma: per byte reduced;
// one set per level: inside a group/node and between groups; plus the costs
// of the shared-memory arena where the transport has one) predicts each
// schedule's time from the textbook formulas (docs/algorithms.md), and the
// cheapest wins. An override table (GRADSYNC_ALGO, or given in code) can pin
// an algorithm per message-size range.
//
// This header is the model alone: pure functions of numbers, no
// communication, no schedule or transport headers. Measuring the numbers
// (`calibrate(comm)`, which runs collectives) lives in calibrate.hpp (above collectives.hpp).
//
// No hidden global state: the model and the table live in a `selector` value
// the caller owns and passes through options::select (null: the policy
// defaults, no table).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/policy.hpp"
#include "options.hpp"

namespace gradsync {

/// Costs of one level of the network, in seconds.
struct link_cost {
  double alpha = 0; ///< per message: latency plus software overhead
  double beta = 0;  ///< per byte moved over the link
  double gamma = 0; ///< per byte combined by the reduction kernel
  /// The part of alpha that messages in flight together overlap (the
  /// network's latency; the rest, posting and matching, each message pays
  /// in turn). 0: none overlaps, every message pays all of alpha (the
  /// uncalibrated default; calibrate() measures it with a burst of messages).
  double latency = 0;
  /// What a message of policy::calibrate_mid_bytes[i] costs beyond
  /// alpha + m beta (calibrate() times a step at each size; all 0: the
  /// textbook model). Protocol switches (eager to rendezvous) and mid-size
  /// bandwidth below the link's live here. May be negative (a size that
  /// stays in cache).
  double extra[policy::calibrate_mid_points]{};
  /// How much of beta each of several large messages in flight together on
  /// this link pays for the others: 1, they share its bandwidth (a real
  /// link, a memory bus, SimGrid's shared links); 0, each moves at the
  /// link's full rate (SimGrid's FATPIPE links, among them the loopback
  /// that carries a <cluster> node's ranks inside the `shared` and `fast`
  /// simulated platforms). calibrate() measures it from one message of
  /// calibrate_bytes / calibrate_split against calibrate_split of them at once.
  double inflight_share = 1;

  /// The per-message part of a message of `m` bytes: alpha plus the extra
  /// of the largest measured size not above m (protocols switch at size
  /// thresholds: a 32 KiB message pays 8 KiB's extra, not a share of the
  /// rendezvous step that 64 KiB shows); alpha alone below the first
  /// measured size and from policy::calibrate_bytes (where beta is timed).
  /// Never below 0.
  double alpha_at(double m) const noexcept {
    constexpr std::size_t k = policy::calibrate_mid_points;
    if (!(m >= static_cast<double>(policy::calibrate_mid_bytes[0])) || m >= static_cast<double>(policy::calibrate_bytes))
      return alpha;
    std::size_t i = 0;
    while (i + 1 < k && m >= static_cast<double>(policy::calibrate_mid_bytes[i + 1])) ++i;
    return std::max(0.0, alpha + extra[i]);
  }
  /// Seconds of one message of `m` bytes on this link alone.
  double msg(double m) const noexcept { return alpha_at(m) + m * beta; }
  /// What a message of `m` bytes in flight costs each other message in
  /// flight with it on this link (inflight_share of its bytes' time).
  double shared_bytes(double m) const noexcept { return m * beta * std::clamp(inflight_share, 0.0, 1.0); }
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
/// at most `group_size` (1 group: no hierarchy known); `shared_arena`: the
/// transport has a shared-memory arena (algo/shm_direct.hpp), so the arena
/// schedules (algorithm::direct) are candidates.
struct topology {
  int ranks = 1;
  int group_size = 1;
  int groups = 1;
  bool shared_arena = false;
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
  /// Between groups: `beta` is one message crossing while the group's other
  /// ranks are quiet; nic_share says how many crossing at once share a link.
  link_cost global{policy::model_alpha, policy::model_beta, policy::model_gamma};
  arena_cost arena{};
  /// How many of a group's ranks share one link out of it (calibrate():
  /// the group's ranks crossing at once against one alone, between 1 and
  /// the group size): 1 where every rank has its own NIC (rail-optimised
  /// GPU clusters), the ranks per node where a node has one NIC.
  double nic_share = 1;

  /// The uncalibrated model of a transport with a shared-memory arena
  /// (policy::shm_model_*): messages cost two copies at memory speed.
  static cost_model shared_memory() {
    const link_cost l{policy::shm_model_alpha, policy::shm_model_beta, policy::shm_model_gamma};
    cost_model m{.local = l, .global = l};
    m.arena.copy = policy::shm_model_arena_copy;
    m.arena.sync = policy::shm_model_arena_sync;
    return m;
  }

  /// Pipeline segment of the schedules on these links: large where a link
  /// is slow (beta above policy::slow_link_beta: a network, not memory),
  /// where each message's handshake waits behind the queued bytes of the
  /// others (core/policy.hpp has the measurement), else the policy default.
  std::size_t segment() const noexcept {
    return std::max(local.beta, global.beta) > policy::slow_link_beta ? policy::slow_link_segment_bytes
                                                                     : policy::ring_segment_bytes;
  }

  /// The link a schedule sees when every rank of a group crosses at once
  /// (local with one group): global with its beta shared nic_share ways.
  link_cost flat_link(const topology& t) const {
    if (t.groups <= 1) return local;
    link_cost l = global;
    l.beta *= contention(t, t.group_size);
    return l;
  }
  /// How many crossing messages share one link when `crossing` ranks of a
  /// group cross at once.
  double contention(const topology& t, int crossing) const {
    return std::clamp(std::min<double>(crossing, t.group_size), 1.0, std::max(1.0, nic_share));
  }

  /// Ranks of a group whose partner is in another group in a step where
  /// rank r exchanges with rank r XOR d (`shift`: false) or sends to r + d
  /// (`shift`: true), ranks numbered group by group: none inside one group.
  static int crossing(const topology& t, int d, bool shift) {
    if (t.groups <= 1 || t.group_size <= 1) return 0;
    if (shift) return std::min(d, t.group_size);
    return d >= t.group_size ? t.group_size : 0;
  }
  /// Seconds of one step in which every rank sends `m` bytes and
  /// `cross` ranks of each group send theirs to another group (sharing its
  /// link: contention): the slowest pair bounds the step.
  /// With `seg` (> 0) the messages go in segments of seg (pairwise.hpp's
  /// exchanges: receives policy::pipeline_depth ahead), and one over it
  /// streams them as a ring's block does (ring_step): SMPI, 32 ranks one
  /// per node on `fast`, recursive-halving reduce-scatter of 64 MiB: 9415
  /// us simulated, 6319 as whole messages, 9697 streamed.
  double step(const topology& t, double m, int cross, double seg = 0) const {
    if (seg > 0 && m > seg) {
      if (t.groups <= 1 || cross <= 0) return streamed(m, seg, nullptr);
      link_cost out = global;
      out.beta *= contention(t, cross);
      return streamed(m, seg, &out);
    }
    const double in = local.msg(m);
    if (t.groups <= 1 || cross <= 0) return in;
    return std::max(in, global.alpha_at(m) + m * global.beta * contention(t, cross));
  }
  /// Per-hop latency and per-byte cost of a chain of sends to the next rank
  /// (ring, pipelined chain): one hop in group_size leaves the group, and
  /// the hops run concurrently, so bandwidth is the slower link's (one
  /// crossing message per group: no contention).
  /// (`m`: the bytes of each hop's message.)
  double chain_alpha(const topology& t, double m) const {
    if (t.groups <= 1) return local.alpha_at(m);
    const double g = std::max(1, t.group_size);
    return ((g - 1) * local.alpha_at(m) + global.alpha_at(m)) / g;
  }
  double chain_beta(const topology& t) const {
    return t.groups <= 1 ? local.beta : std::max(local.beta, global.beta);
  }
  /// One step of a ring (ring.hpp: every rank sends m bytes to the next,
  /// receives posted policy::pipeline_depth ahead): the chain's averaged
  /// hop, but at least what the one crossing hop of each group sustains,
  /// its base latency overlapped only over the receives in flight (the
  /// size-dependent extra stays in the chain term, where it was measured).
  /// Blocks under 4 bytes (an f32) are mostly empty and send nothing, so
  /// the bound applies in proportion. SMPI, 256 ranks on `shared`: ring
  /// allreduce of 2 KiB-512 KiB at 5.6-7.3 us per step against the chain's
  /// 3.7-5.6 (model -22 to -34 %); global alpha / 4 = 5.55 us.
  /// A block of several segments of `seg` streams them, pipeline_depth in
  /// flight (ring.hpp's waves): each segment costs stream_segment on the
  /// slower of the links the hops use. SMPI, 32 ranks one per node on
  /// `fast`, ring reduce-scatter of 64 MiB (2 MiB blocks, 8 segments of
  /// 256 KiB): 315 us a step simulated; the block as one message 254.
  double ring_step(const topology& t, double m, double seg) const {
    if (seg > 0 && m > seg) return streamed(m, seg, t.groups > 1 ? &global : nullptr);
    const double chain = chain_alpha(t, m) + m * chain_beta(t);
    if (t.groups <= 1) return chain;
    const double crossing = global.alpha / policy::pipeline_depth + m * global.beta;
    return chain + std::clamp(m / 4, 0.0, 1.0) * std::max(0.0, crossing - chain);
  }
  /// Seconds of a message of `m` bytes sent as k = ceil(m / seg) segments,
  /// min(k, pipeline_depth) in flight: k stream_segments on the local link,
  /// or on the slower of it and `out` where the hops also use `out`.
  double streamed(double m, double seg, const link_cost* out) const {
    const double k = std::ceil(m / seg), s = m / k, d = std::min(k, static_cast<double>(policy::pipeline_depth));
    const double in = stream_segment(local, s, d);
    return k * (out ? std::max(in, stream_segment(*out, s, d)) : in);
  }
  /// Seconds per segment of `s` bytes in a stream over link `l` with `d`
  /// in flight: its own overhead and its bytes to the others (as far as
  /// they share the link: link_cost::inflight_share), or, where the
  /// latencies are too long for d in flight to cover, what holds one of the
  /// d places in flight over d: its message, stretched by the others' shared
  /// bytes.
  static double stream_segment(const link_cost& l, double s, double d) {
    const double own = l.alpha - std::clamp(l.latency, 0.0, l.alpha), shared = l.shared_bytes(s);
    return std::max(own + shared, (l.msg(s) + (d - 1) * shared) / d);
  }
  /// Per-byte cost of one hop of such a chain, averaged over the hops (a
  /// segment filling the pipeline crosses each link in turn).
  double hop_beta(const topology& t) const {
    if (t.groups <= 1) return local.beta;
    const double g = std::max(1, t.group_size);
    return ((g - 1) * local.beta + global.beta) / g;
  }

  /// One pass of the segmented binomial tree (tree.hpp: reduce or broadcast)
  /// of n bytes in k segments of at most `seg`: k times the first segment's
  /// path over every round's link (round d: the rank d away, crossing where
  /// d spans a group). A rank handles one message at a time: the reduce
  /// waits for each segment's send before it takes the next, so the root
  /// receives every segment from every child in turn (SimGrid SMPI, 64
  /// ranks, 100 Gbit/s NICs, 8 MiB: a pipelined form predicted 27 % of the
  /// simulated reduce); the broadcast sends to one child at a time, so a
  /// rank's sends of a segment take one round's time each.
  double tree_phase(const topology& t, double n, double seg) const {
    const int p = t.ranks;
    const double k = std::max(1.0, std::ceil(n / std::max(1.0, seg))), s = n / k;
    double first = 0;
    for (int d = 1; d < p; d *= 2)
      first += t.groups > 1 && d >= t.group_size ? global.msg(s) : local.msg(s);
    return k * first;
  }
  /// Predicted seconds of a flat allreduce of `n` bytes over `p` ranks on
  /// link `l` (`seg`: pipeline segment bytes). NaN for hier/twod/automatic.
  static double flat(algorithm a, double n, int p, const link_cost& l, double seg) {
    const cost_model m{.local = l, .global = l};
    return m.flat_on(a, n, topology{p, p, 1}, seg);
  }
  /// The same on topology `t`: each step costed by the links its pairs use
  /// (step, chain_alpha; docs/algorithms.md). On one group these are the
  /// textbook formulas. NaN for hier/twod/automatic.
  double flat_on(algorithm a, double n, const topology& t, double seg) const {
    const int p = t.ranks;
    if (p <= 1) return 0;
    // Integer logarithms (bit operations, exact): this runs on every
    // automatic call, where libm's log2 was a tenth of an 8-byte allreduce.
    const auto up = static_cast<unsigned>(p);
    const double lg = std::bit_width(up - 1); // ceil(log2 p)
    const int pof2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
    const double k2 = std::countr_zero(static_cast<unsigned>(pof2)), fold = p == pof2 ? 0 : 1;
    const double q = (pof2 - 1.0) / pof2, g = local.gamma;
    // The fold's two steps: partners r, r + 1 (the same group unless groups
    // of one). Combining exchanges go in segments, copies whole
    // (pairwise.hpp: shift_copy moves a typed range as one message).
    const double folds = fold * (step(t, n, crossing(t, 1, false), seg) + step(t, n, crossing(t, 1, false)));
    switch (a) {
    case algorithm::ring:
      return 2 * (p - 1) * ring_step(t, n / p, seg) + (p - 1.0) / p * n * g;
    case algorithm::tree: return 2 * tree_phase(t, n, seg) + lg * n * g; // reduce, then broadcast
    case algorithm::rd: {
      double s = folds;
      for (int d = 1; d < pof2; d *= 2) s += step(t, n, crossing(t, d, false), seg);
      return s + (k2 + fold) * n * g;
    }
    case algorithm::rabenseifner: {
      double s = folds;
      for (int d = 1; d < pof2; d *= 2) // halving (combining), doubling (copies)
        s += step(t, n * d / pof2, crossing(t, d, false), seg) + step(t, n * d / pof2, crossing(t, d, false));
      return s + (q + fold) * n * g;
    }
    case algorithm::dbtree: {
      const double h = std::bit_width(up) - 1; // floor(log2 p): height of the heap tree
      const double k = std::max(1.0, std::ceil(n / 2 / seg)), sz = n / 2 / k;
      // The first segment's path, level by level along the leftmost (longest)
      // path of the heap, node 2^(d-1) - 1 to 2^d - 1 (nodes of one depth
      // are consecutive ranks): a level whose edge stays in a group costs
      // the local link, one that leaves it the global link, its 2^d senders
      // up and 2^(d-1) down (two children each) sharing their groups'
      // links. The later k - 1 segments follow one full stage apart: a rank
      // moves 4 segments per stage (two trees, up and down), latencies
      // overlapping (one alpha), every rank of a group crossing at once.
      // SimGrid SMPI, 64 ranks in nodes of 8, receives posted ahead
      // (dbtree.hpp), 512 KiB (k = 1): 2h stages of 4 segments on the
      // global link predicted 3.9x the simulated time with a NIC per rank
      // (3570 us); every level on the global link, 1.6x, and 1.4x with 8
      // ranks a NIC (18426 us); at 8 B 1.9x (139 us: the path leaves its
      // node on 3 of its 6 levels).
      const link_cost l = flat_link(t);
      const int gs = std::max(1, t.group_size);
      double fill = 0;
      for (int d = 1; d <= static_cast<int>(h); ++d) {
        const long long parent = (1LL << (d - 1)) - 1, child = (1LL << d) - 1;
        const bool leaves = t.groups > 1 && parent / gs != child / gs;
        const link_cost& e = leaves ? global : local;
        const int w = static_cast<int>(child + 1); // 2^d <= p: the level's nodes
        const double up = leaves ? contention(t, w) : 1.0, down = leaves ? contention(t, w / 2) : 1.0;
        fill += 2 * e.alpha_at(sz) + sz * e.beta * (up + 2 * down) + 2 * sz * g;
      }
      return fill + (k - 1) * (l.alpha_at(sz) + 4 * sz * l.beta + 2 * sz * g);
    }
    default: return std::numeric_limits<double>::quiet_NaN();
    }
  }
  /// The link of hier's step between groups of g: all g ranks of a group
  /// cross at once, each with its own shard.
  link_cost between_groups(int g) const {
    link_cost l = global;
    l.beta *= std::clamp(static_cast<double>(g), 1.0, std::max(1.0, nic_share));
    return l;
  }
  /// Hierarchical: ring reduce-scatter inside groups of g, the best flat
  /// allreduce of n/g bytes across the m groups, ring allgather inside groups.
  double hier(double n, int g, int m, double seg) const {
    const double local_part = 2 * (g - 1) * local.alpha_at(n / g) + 2.0 * (g - 1) / g * n * local.beta +
                              (g - 1.0) / g * n * local.gamma;
    return local_part + best_flat(n / g, m, between_groups(g), seg).second;
  }
  /// 2-D grid of rows of w (p/w rows): hier with rows as groups, the column
  /// step a ring (its blocks unsegmented), all on the flat link.
  double twod(double n, int p, int w, const link_cost& l) const {
    const int rows = (p + w - 1) / w;
    return 2 * (w - 1) * l.alpha_at(n / w) + 2.0 * (w - 1) / w * n * l.beta + (w - 1.0) / w * n * l.gamma +
           flat(algorithm::ring, n / w, rows, l, 0);
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
  /// infinity where `a` does not apply (hier without groups, twod below 4
  /// ranks, direct without a shared arena).
  double allreduce(algorithm a, std::size_t bytes, const topology& t, std::size_t seg) const {
    const auto n = static_cast<double>(bytes);
    const auto s = static_cast<double>(seg);
    constexpr double inf = std::numeric_limits<double>::infinity();
    switch (a) {
    case algorithm::hier:
      return t.groups > 1 && t.group_size > 1 ? hier(n, t.group_size, t.groups, s) : inf;
    case algorithm::twod:
      return t.ranks >= 4 ? twod(n, t.ranks, grid_row(t.ranks), flat_link(t)) : inf;
    case algorithm::direct: return t.shared_arena ? direct(n, t.ranks) : inf;
    case algorithm::automatic: return inf;
    default: return flat_on(a, n, t, s);
    }
  }
  /// Arena reduce-scatter (`reduce`: true) or allgather of `n` bytes in all
  /// (p blocks of n/p): the two halves of direct's large path. Reduce-scatter
  /// rounds move at most half an arena of input and synchronise once; each
  /// rank copies (p-1)/p n in and its n/p block out (n) and reduces (p-1)/p n.
  /// Allgather rounds stage at most half an arena of the own block and
  /// synchronise once; each rank copies n/p in and (p-1)/p n out (n).
  double arena_half(double n, int p, bool reduce) const {
    if (p <= 1) return 0;
    const double staged = reduce ? n : n / p; // bytes one rank stages in all rounds
    const double rounds = std::max(1.0, std::ceil(staged / arena.half_bytes));
    return rounds * arena.sync + n * arena.copy + (reduce ? (p - 1.0) / p * n * local.gamma : 0);
  }
  /// Predicted seconds of a reduce-scatter (`reduce`: true) or allgather of
  /// `bytes` in all (p blocks of n/p) by `a` on `t` (docs/algorithms.md):
  ///  - `ring`: p-1 steps of one block to the next rank (chain_alpha,
  ///    chain_beta; blocks over segment() stream: ring_step) [+ its reduction];
  ///  - `bruck` (algo/bruck.hpp): ceil(log2 p) rounds of min(d, p-d) blocks
  ///    to the rank d away (reduce-scatter: floor(m/2) blocks, d = ceil(m/2)),
  ///    plus, reducing, one local copy of the input (arena.copy);
  ///  - `rd`: recursive doubling / halving over the largest power of two p'
  ///    (rounds of d blocks of n/p' with the rank d away), plus the fold's
  ///    two steps where p is not one;
  ///  - `direct`: arena_half where t.shared_arena;
  ///  - `hier` (several groups of several ranks): the two levels below;
  /// infinity for anything else.
  double scatter_gather(algorithm a, std::size_t bytes, const topology& t, bool reduce) const {
    return gather_cost(a, static_cast<double>(bytes), t, reduce);
  }
  /// The same for `n` bytes, not necessarily whole (a level of hier).
  double gather_cost(algorithm a, double n, const topology& t, bool reduce) const {
    const int p = t.ranks;
    if (p <= 1) return 0;
    const double b = n / p, g = reduce ? local.gamma : 0;
    // Reduce-scatters combine in segments; allgathers' bruck and rd, and
    // the fold's copy back, move whole ranges (bruck.hpp, pairwise.hpp).
    const double seg = static_cast<double>(segment()), xseg = reduce ? seg : 0;
    switch (a) {
    case algorithm::ring: return (p - 1) * (ring_step(t, b, seg) + b * g);
    case algorithm::bruck: {
      double s = 0;
      if (reduce) {
        for (int m = p; m > 1;) {
          const int d = (m + 1) / 2;
          s += step(t, (m - d) * b, crossing(t, d, true), xseg) + (m - d) * b * g;
          m = d;
        }
        return s + n * arena.copy;
      }
      for (int d = 1; d < p; d *= 2) s += step(t, std::min(d, p - d) * b, crossing(t, d, true));
      return s;
    }
    case algorithm::rd: {
      const int pof2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
      const double v = n / pof2; // a survivor's share
      double s = 0;
      for (int d = 1; d < pof2; d *= 2) s += step(t, d * v, crossing(t, d, false), xseg) + d * v * g;
      if (p != pof2) // fold: a block (allgather) or all (reduce-scatter) in, the rest back
        s += step(t, reduce ? n : b, crossing(t, 1, false), xseg) + (reduce ? n * g : 0) +
             step(t, reduce ? b : n - b, crossing(t, 1, false));
      return s;
    }
    case algorithm::direct:
      return t.shared_arena ? arena_half(n, p, reduce) : std::numeric_limits<double>::infinity();
    case algorithm::hier: {
      // algo/hierarchical_gather.hpp on groups of g: the slots hold G g
      // blocks. Allgather: the group's blocks among its members, the slots
      // among the leaders (global link, one crossing per group), the slots
      // broadcast inside the group, one local pass to unpermute. Reduce-
      // scatter: one pass to permute, the slots reduced to the leader, the
      // leaders' reduce-scatter, g - 1 blocks sent to the members.
      if (t.groups <= 1 || t.group_size <= 1) return std::numeric_limits<double>::infinity();
      const int gs = t.group_size, groups = t.groups;
      const double all = std::ceil(b) * gs * groups; // whole bytes (a real call's blocks are)
      const double across = best_flat_gather(all, groups, global, reduce).second;
      const double inside =
          best_flat_rooted(static_cast<std::size_t>(all), gs, local, reduce, static_cast<std::size_t>(seg)).second;
      if (!reduce) return best_flat_gather(b * gs, gs, local, false).second + across + inside + all * arena.copy;
      return all * arena.copy + inside + across + (gs - 1) * local.msg(b);
    }
    default: return std::numeric_limits<double>::infinity();
    }
  }
  /// The cheapest flat reduce-scatter (`reduce`) or allgather schedule
  /// (ring, bruck, rd) of `bytes` in all on p ranks joined by link `l`, and
  /// its predicted seconds: each level of the two-level gathers.
  std::pair<algorithm, double> best_flat_gather(double bytes, int p, const link_cost& l, bool reduce) const {
    const cost_model m{.local = l, .global = l, .arena = arena};
    std::pair<algorithm, double> best{algorithm::ring, std::numeric_limits<double>::infinity()};
    for (const algorithm a : {algorithm::ring, algorithm::bruck, algorithm::rd})
      if (const double x = m.gather_cost(a, bytes, topology{p, p, 1}, reduce);
          x < best.second * (1 - 1e-9))
        best = {a, x};
    return best;
  }
  /// Arena broadcast (`reduce`: false) or reduce of n bytes on p ranks
  /// (algo/shm_direct_rooted.hpp). Broadcast: one synchronisation per round
  /// of policy::shm_rooted_round_bytes; the root's copy in and the others'
  /// copy out overlap but for the first round. Reduce: the same rounds, the
  /// others staging while the root combines all p inputs of the round before
  /// (p - 1 combining passes); up to shm_direct_small_bytes one round.
  double rooted_direct(double n, int p, bool reduce) const {
    if (p <= 1) return 0;
    if (!reduce) {
      const double round = std::min(static_cast<double>(policy::shm_rooted_round_bytes), arena.half_bytes);
      const double rounds = std::max(1.0, std::ceil(n / round));
      return rounds * arena.sync + (n + std::min(n, round)) * arena.copy;
    }
    const double g = local.gamma;
    if (n <= static_cast<double>(policy::shm_direct_small_bytes) && n <= arena.half_bytes)
      return arena.sync + n * arena.copy + (p - 1) * n * g;
    const double round = std::min(static_cast<double>(policy::shm_rooted_round_bytes), arena.half_bytes);
    const double rounds = std::max(1.0, std::ceil(n / round));
    return rounds * arena.sync + std::min(n, round) * arena.copy + (p - 1) * n * g;
  }
  /// Predicted seconds of a broadcast (`reduce`: false) or reduce of `bytes`
  /// from/to one root on `t` (docs/algorithms.md):
  ///  - `tree`: ceil(log2 p) rounds of the whole message to the rank d away;
  ///  - `ring`: the pipelined chain, p - 2 + k steps of a segment (k
  ///    segments of at most `seg`);
  ///  - `scatter_allgather` (broadcast only): a binomial scatter (round m:
  ///    m blocks of n/p to the rank m away, one sender per group where it
  ///    crosses) and the ring allgather;
  ///  - `direct` (rooted_direct) where t.shared_arena;
  /// infinity elsewhere.
  double rooted(algorithm a, std::size_t bytes, const topology& t, bool reduce, std::size_t seg) const {
    constexpr double inf = std::numeric_limits<double>::infinity();
    const int p = t.ranks;
    if (a == algorithm::direct) return t.shared_arena ? rooted_direct(static_cast<double>(bytes), p, reduce) : inf;
    if (a == algorithm::hier) {
      // algo/hierarchical_rooted.hpp: the best flat schedule among the
      // groups' leaders (one crossing per group: global link, no
      // contention), then inside a group (local link). Several groups of
      // several ranks only.
      if (t.groups <= 1 || t.group_size <= 1) return inf;
      return best_flat_rooted(bytes, t.groups, global, reduce, seg).second +
             best_flat_rooted(bytes, t.group_size, local, reduce, seg).second;
    }
    if (a != algorithm::tree && a != algorithm::ring && (reduce || a != algorithm::scatter_allgather)) return inf;
    if (p <= 1) return 0;
    const auto n = static_cast<double>(bytes);
    const double g = reduce ? local.gamma : 0;
    if (a == algorithm::tree)
      return tree_phase(t, n, static_cast<double>(seg)) + std::bit_width(static_cast<unsigned>(p) - 1) * n * g;
    if (a == algorithm::scatter_allgather) {
      const double b = n / p;
      double s = 0;
      // the root's sends, one child at a time, largest subtree first; the
      // children forward theirs meanwhile (one sender per group crossing)
      for (int m = static_cast<int>(std::bit_ceil(static_cast<unsigned>(p))) / 2; m >= 1; m /= 2)
        s += step(t, std::min(m, p - m) * b, t.groups > 1 && m >= t.group_size ? 1 : 0);
      return s + (p - 1) * ring_step(t, b, static_cast<double>(seg));
    }
    // The chain (algo/chain.hpp): the first segment fills p - 2 hops (at
    // each hop's own speed), then k segments follow. With one send in
    // flight (chain::sends_in_flight: more than
    // policy::chain_ranks_per_segment_for_one_send ranks per segment) each
    // leaves at the slowest hop's pace, a whole message with its latency.
    // Otherwise the first D = min(k, pipeline_depth) segments cross each
    // group's link together, so each crossing hop of the fill carries D
    // segments' bytes, and the stream hides the latencies (SimGrid SMPI, 64
    // ranks, `shared`, 8 MiB broadcast, D = 4: 15.9 ms simulated, model
    // 17.7; one in flight, 256 ranks, 4 MiB: 21.0, model 21.8).
    // One group, or groups of one rank (every hop on one kind of link), D
    // sends in flight: the first D segments share each hop's link, so each
    // hop of the fill takes a message plus (D - 1) segments' bytes; after it
    // each segment costs its bytes (both times link_cost::inflight_share:
    // on a link whose flows do not share, segments in flight move at once,
    // and only the latencies bound the stream) or, where the latencies (link_cost::
    // latency and the size extras: SMPI's latency factors) are too long for
    // D in flight to cover, what holds one of the D places in flight over D:
    // its message, stretched by the other segments' bytes where they share
    // the link (latency / D + bytes: SMPI, 8 ranks one per node on `fast`,
    // chain broadcast of 8 / 16 MiB: 2147 / 3362 us simulated, this 2189 /
    // 3439; the message over D alone 1723 / 2507).
    // The part of alpha that does not overlap (posting, matching) is paid
    // in full. SimGrid SMPI, 8 ranks
    // one per node (10 Gbit/s NICs), chain broadcast of 256 KiB / 1 / 4 /
    // 8 MiB in 256 KiB segments: 2524 / 7206 / 10622 / 14880 us simulated,
    // this 2553 / 7520 / 10743 / 15041 (the several-group form below: up to
    // 18134, +22 %); 64 ranks on `fast`, hier reduce (a chain of 8 inside
    // each node, then one of the 8 leaders) of 8 / 16 MiB: 2385 / 3758 us,
    // this 2467 / 3877, the textbook chain 3901 / 7185 (+64 / +91 %).
    const double k = std::max(1.0, std::ceil(n / static_cast<double>(seg))), sz = n / k;
    const double fill = chain_alpha(t, sz) + sz * (hop_beta(t) + g);
    const bool one_in_flight = p > static_cast<double>(policy::chain_ranks_per_segment_for_one_send) * k;
    if (t.groups <= 1 || t.group_size <= 1) { // every hop on one kind of link
      const link_cost& l = t.groups <= 1 ? local : global;
      if (one_in_flight) return (p - 2 + k) * (l.msg(sz) + sz * g);
      const double d = std::min(k, static_cast<double>(policy::pipeline_depth));
      return (p - 2) * (l.msg(sz) + (d - 1) * l.shared_bytes(sz) + sz * g) + k * (stream_segment(l, sz, d) + sz * g);
    }
    if (one_in_flight)
      return (p - 2) * fill + k * (std::max(local.msg(sz), global.msg(sz)) + sz * g);
    const double together = std::min(k, static_cast<double>(policy::pipeline_depth)) - 1;
    return (p - 2) * (fill + together * sz * global.beta / std::max(1, t.group_size)) +
           k * (chain_alpha(t, sz) + sz * (chain_beta(t) + g));
  }
  /// The same on p ranks in one group without an arena.
  double rooted(algorithm a, std::size_t bytes, int p, bool reduce, std::size_t seg) const {
    return rooted(a, bytes, topology{p, p, 1}, reduce, seg);
  }
  /// The cheapest flat rooted schedule (tree, ring = the chain, and for a
  /// broadcast scatter_allgather) on p ranks joined by link `l`, and its
  /// predicted seconds: each level of the two-level rooted schedules.
  std::pair<algorithm, double> best_flat_rooted(std::size_t bytes, int p, const link_cost& l, bool reduce,
                                                std::size_t seg) const {
    const cost_model m{.local = l, .global = l, .arena = arena};
    std::pair<algorithm, double> best{algorithm::tree, std::numeric_limits<double>::infinity()};
    for (const algorithm a : {algorithm::tree, algorithm::ring, algorithm::scatter_allgather})
      if (const double x = m.rooted(a, bytes, topology{p, p, 1}, reduce, seg); x < best.second * (1 - 1e-9))
        best = {a, x};
    return best;
  }

  /// Predicted seconds of an alltoall(v) by `a` moving `m` bytes to each of
  /// p - 1 peers on link `l` (docs/algorithms.md): `pairwise` one pair of
  /// messages per step, (p-1)(alpha + beta m), plus the own block's local
  /// copy (m arena.copy); `scattered` `window` peers
  /// in flight: the same (alpha is mostly per-message software cost, which
  /// a window does not overlap), a hair cheaper so ties go to it; `bruck` (equal blocks only) ceil(log2 p) rounds of up to ceil(p/2)
  /// packed blocks plus three local passes over the p blocks (rotate, pack,
  /// unrotate) at memcpy speed (arena.copy); `hier` (equal blocks, several
  /// groups) two phases, inside the groups then across; `direct` (t.shared_arena only)
  /// one arena synchronisation per round, and p m copied: each byte is
  /// staged into the arena and copied out of it, and the arena half stays in
  /// cache, so the pair moves a byte through memory about once, as one
  /// memcpy does (own block included).
  /// Infinity for anything else.
  double exchange(algorithm a, double m, const topology& t, int window = policy::alltoall_window) const {
    const int p = t.ranks;
    if (p <= 1) return 0;
    const link_cost& l = flat_link(t);
    // Step s pairs rank r with r + s: the pairs crossing groups share the
    // group's link (step(); on one group (p-1)(alpha + beta m)).
    auto steps = [&] {
      double sum = 0;
      for (int k = 1; k < p; ++k) sum += step(t, m, crossing(t, k, true));
      return sum;
    };
    // The own block, copied locally by pairwise and scattered (exchange::
    // copy_self). Without it the model put pairwise at 853 us for 8 MiB
    // blocks on 2 shm ranks against 1556 measured (direct: 1226 against
    // 1377) and picked it over direct up to 1.4x slower (docs/benchmarks.md).
    const double own = m * arena.copy;
    switch (a) {
    case algorithm::pairwise: return steps() + own;
    case algorithm::scattered: {
      // `window` messages in flight overlap their latency (link_cost::
      // latency, once per window); the rest of alpha, posting and matching,
      // each pays in turn. On a machine alpha is mostly that software cost
      // (latency ~0: the pairwise formula); on a network mostly latency
      // (SMPI, 64 ranks, 8 B: pairwise 1477 us, scattered 119 us, which the
      // formula without the overlap put at 1401 us). Less a small share of
      // alpha per extra message in flight, so ties go to scattered.
      const int w = std::min(std::max(1, window), p - 1);
      const double lat = std::clamp(l.latency, 0.0, l.alpha);
      return std::ceil((p - 1.0) / w) * lat + steps() - (p - 1) * lat - (w - 1) * 1e-3 * l.alpha + own;
    }
    case algorithm::bruck: {
      double sum = 0; // round d: ceil(p/2) packed blocks to the rank d away
      for (int d = 1; d < p; d *= 2) sum += step(t, m * std::ceil(p / 2.0), crossing(t, d, true));
      return sum + 3.0 * p * m * arena.copy;
    }
    case algorithm::hier: {
      // algo/alltoall_hier.hpp on equal groups of g: g - 1 messages of ~N
      // blocks inside the group before and after ceil((N - 1) / g) of g^2
      // blocks across, all g ranks of a group crossing at once; windows
      // overlap latency as scattered's do; four local passes over the p
      // blocks. A candidate only where the ranks form several groups of
      // several.
      if (t.groups <= 1 || t.group_size <= 1) return std::numeric_limits<double>::infinity();
      const double g = t.group_size, n = t.groups;
      auto windowed = [&](double k, const link_cost& c, double beta, double bytes) {
        const double lat = std::clamp(c.latency, 0.0, c.alpha);
        return std::ceil(k / std::max(1, window)) * lat + k * (c.alpha_at(bytes) - lat + bytes * beta);
      };
      return 2 * windowed(g - 1, local, local.beta, n * m) +
             windowed(std::ceil((n - 1) / g), global, global.beta * contention(t, t.group_size), g * g * m) +
             4.0 * p * m * arena.copy;
    }
    case algorithm::direct: {
      if (!t.shared_arena) return std::numeric_limits<double>::infinity();
      // algo/alltoall_direct.hpp: rounds of (half - header) / p bytes per
      // peer, one synchronisation each; every byte staged once and copied
      // out once through the cached arena (about one memcpy per byte), the
      // own block copied directly.
      const double slice = std::max(64.0, (arena.half_bytes - 16.0 * p) / p);
      const double rounds = std::max(1.0, std::ceil(m / slice));
      return rounds * arena.sync + p * m * arena.copy;
    }
    default: return std::numeric_limits<double>::infinity();
    }
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
                                  "' (auto, ring, tree, dbtree, rd, rabenseifner, hier, 2d, direct, pairwise, scattered, bruck, "
                                  "scatter_allgather)");
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

  /// Pipeline segment of the schedules under this model (cost_model::segment).
  std::size_t segment_bytes() const noexcept { return model_.segment(); }

  /// Whether `a` is no allreduce schedule (the exchanges', the gathers' and
  /// broadcast's): a table entry naming one leaves allreduce to the model.
  static constexpr bool exchange_only(algorithm a) noexcept {
    return a == algorithm::pairwise || a == algorithm::scattered || a == algorithm::bruck ||
           a == algorithm::scatter_allgather;
  }
  /// The table's entry for `bytes`, or automatic when none covers it.
  algorithm pinned(std::size_t bytes) const {
    for (const auto& r : table_)
      if (r.lo <= bytes && (bytes < r.hi || r.hi == SIZE_MAX)) return r.algo;
    return algorithm::automatic;
  }

  /// The allreduce schedule for `bytes` on `t`.
  algorithm choose(std::size_t bytes, const topology& t, std::size_t seg) const {
    if (const auto a = pinned(bytes); a != algorithm::automatic && !exchange_only(a)) return a;
    return cheapest(bytes, t, seg);
  }

  /// The cheapest allreduce schedule on `t` by the model alone (direct only
  /// where t.shared_arena).
  algorithm cheapest(std::size_t bytes, const topology& t, std::size_t seg) const {
    if (t.ranks <= 1) return algorithm::ring;
    // (ties beyond rounding go to the earlier: 2d and rabenseifner cost
    // exactly the same on 4 ranks)
    return memo_.get(choice_memo::question(0, bytes, t, seg), [&] {
      return cheapest_of({algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd, algorithm::rabenseifner,
                          algorithm::twod, algorithm::hier, algorithm::direct},
                         [&](algorithm a) { return model_.allreduce(a, bytes, t, seg); });
    });
  }

  /// The schedule of hier's inter-group step: the table's entry (unless it
  /// names hier/twod, which cannot nest) or the cheapest flat one.
  /// `group_size`: ranks per group, all crossing at once (between_groups).
  algorithm choose_inner(std::size_t bytes, int groups, std::size_t seg, int group_size = 1) const {
    if (const auto a = pinned(bytes);
        a != algorithm::automatic && a != algorithm::hier && a != algorithm::twod && !exchange_only(a))
      return a;
    return cost_model::best_flat(static_cast<double>(bytes), groups, model_.between_groups(group_size),
                                 static_cast<double>(seg)).first;
  }

  /// Broadcast (`reduce`: false) or reduce schedule on `t`: the table's
  /// entry where it names one that runs here, else the cheapest by
  /// cost_model::rooted of `tree` (binomial), `ring` (the pipelined chain),
  /// for broadcast `scatter_allgather`, and `direct` where t.shared_arena.
  algorithm choose_rooted(std::size_t bytes, const topology& t, bool reduce, std::size_t seg) const {
    const algorithm pin = pinned(bytes);
    if (pin == algorithm::tree || pin == algorithm::ring || (pin == algorithm::direct && t.shared_arena) ||
        (pin == algorithm::scatter_allgather && !reduce) ||
        (pin == algorithm::hier && t.groups > 1 && t.group_size > 1))
      return pin;
    return memo_.get(choice_memo::question(reduce ? 2 : 1, bytes, t, seg), [&] {
      return cheapest_of({algorithm::tree, algorithm::ring, algorithm::scatter_allgather, algorithm::direct,
                          algorithm::hier},
                         [&](algorithm a) { return model_.rooted(a, bytes, t, reduce, seg); });
    });
  }
  /// The same on p ranks in one group without an arena.
  algorithm choose_rooted(std::size_t bytes, int p, bool reduce, std::size_t seg) const {
    return choose_rooted(bytes, topology{p, p, 1}, reduce, seg);
  }

  /// Reduce-scatter schedule for `bytes` in all (p blocks of bytes/p) on
  /// `t`: the table's entry where it names ring, bruck, rd, (with an arena)
  /// direct or (on several groups) hier, else the cheapest of them by cost_model::scatter_gather. `seg`
  /// is the call's segment size (the formulas do not depend on it).
  algorithm choose_reduce_scatter(std::size_t bytes, const topology& t, std::size_t /*seg*/) const {
    return choose_gather(bytes, t, true);
  }
  /// Allgather schedule for `bytes` in all (p blocks): as choose_reduce_scatter.
  algorithm choose_allgather(std::size_t bytes, const topology& t, std::size_t /*seg*/) const {
    return choose_gather(bytes, t, false);
  }

  /// Alltoall(v) schedule for `m` bytes per peer on `t` (`equal`: equal
  /// blocks, so Bruck and, on several groups, hier are candidates; `agreed`:
  /// uneven blocks whose m every rank shares, an exchange_plan's, so hier is
  /// one; `direct` where t.shared_arena): the
  /// table's entry when it names an exchange schedule, else the cheapest by
  /// cost_model::exchange.
  algorithm choose_alltoall(std::size_t m, const topology& t, bool equal, bool agreed = false) const {
    // Uneven blocks: hier only where every rank decides on the same m (an
    // exchange_plan's agreed largest block: `agreed`); Bruck never.
    const bool hier_ok = equal || agreed;
    if (const auto a = pinned(m); a == algorithm::pairwise || a == algorithm::scattered ||
                                  (equal && a == algorithm::bruck) || (hier_ok && a == algorithm::hier && t.groups > 1) ||
                                  (t.shared_arena && a == algorithm::direct))
      return a;
    return memo_.get(choice_memo::question(5 + (equal ? 1 : 0) + (hier_ok ? 2 : 0), m, t, 0), [&] {
      return cheapest_of({algorithm::scattered, algorithm::pairwise, algorithm::bruck, algorithm::hier,
                          algorithm::direct},
                         [&](algorithm a) {
                           if ((a == algorithm::bruck && !equal) || (a == algorithm::hier && !hier_ok))
                             return std::numeric_limits<double>::infinity();
                           return model_.exchange(a, static_cast<double>(m), t);
                         });
    });
  }

private:
  // The first of `list` whose cost is lowest (a later one must be cheaper
  // beyond rounding); infinite costs never win.
  template <class F> static algorithm cheapest_of(std::initializer_list<algorithm> list, F&& cost) {
    algorithm best = *list.begin();
    double c = std::numeric_limits<double>::infinity();
    for (const algorithm a : list)
      if (const double x = cost(a); x < c * (1 - 1e-9)) {
        best = a;
        c = x;
      }
    return best;
  }
  algorithm choose_gather(std::size_t bytes, const topology& t, bool reduce) const {
    if (const auto a = pinned(bytes); a == algorithm::ring || a == algorithm::bruck || a == algorithm::rd ||
                                      (a == algorithm::direct && t.shared_arena) ||
                                      (a == algorithm::hier && t.groups > 1 && t.group_size > 1))
      return a;
    if (t.ranks <= 1) return algorithm::ring;
    return memo_.get(choice_memo::question(reduce ? 4 : 3, bytes, t, 0), [&] {
      return cheapest_of({algorithm::ring, algorithm::bruck, algorithm::rd, algorithm::direct, algorithm::hier},
                         [&](algorithm a) { return model_.scatter_gather(a, bytes, t, reduce); });
    });
  }

  // Automatic choices already made, so a size a training loop repeats does
  // not evaluate the model again: choose() took 42-65 ns per call (g++ -O3,
  // CI VM), 15-20 % of an 8-byte allreduce over shm. Direct-mapped, one
  // atomic word per slot (the question's hash above the low byte, the
  // answer in it), so ranks that are threads of one process share it
  // without a lock. A hash collision could answer another question's
  // schedule: every schedule computes the same result, and ranks that chose
  // differently fail the call check together. A copy starts empty.
  class choice_memo {
  public:
    choice_memo() = default;
    choice_memo(const choice_memo&) noexcept {}
    choice_memo& operator=(const choice_memo&) noexcept {
      for (auto& x : slots_) x.store(0, std::memory_order_relaxed);
      return *this;
    }
    /// The hash of one question: which choice (`kind`, < 16), its size,
    /// topology and segment; 0 (not remembered) for a topology too large to
    /// pack. The kind and topology are packed into one word without loss and
    /// each word goes through a bijective mixer (MurmurHash3's finalizer), so
    /// two sizes of one topology never share a hash; other pairs of
    /// questions do with probability about 2^-56.
    static std::uint64_t question(std::uint64_t kind, std::size_t bytes, const topology& t, std::size_t seg) noexcept {
      constexpr std::uint64_t lim = std::uint64_t{1} << 19;
      if (t.ranks < 0 || t.group_size < 0 || t.groups < 0 || std::uint64_t(t.ranks) >= lim ||
          std::uint64_t(t.group_size) >= 2 * lim || std::uint64_t(t.groups) >= 2 * lim)
        return 0;
      const std::uint64_t packed = kind | std::uint64_t{t.shared_arena} << 4 | std::uint64_t(t.ranks) << 5 |
                                   std::uint64_t(t.group_size) << 24 | std::uint64_t(t.groups) << 44;
      const std::uint64_t q = mix(mix(mix(seg + 0x9e3779b97f4a7c15ull) ^ packed) ^ bytes);
      return q ? q : 1;
    }
    static constexpr std::uint64_t mix(std::uint64_t x) noexcept {
      x ^= x >> 33;
      x *= 0xff51afd7ed558ccdull;
      x ^= x >> 33;
      x *= 0xc4ceb9fe1a85ec53ull;
      return x ^ (x >> 33);
    }
    /// The stored answer to `q`, else compute() (stored).
    template <class F> algorithm get(std::uint64_t q, F&& compute) const {
      if (q == 0) return compute();
      std::atomic<std::uint64_t>& slot = slots_[q % slots_.size()];
      const std::uint64_t tag = q & ~std::uint64_t{0xff};
      const std::uint64_t v = slot.load(std::memory_order_relaxed);
      if ((v & ~std::uint64_t{0xff}) == tag && (v & 0xff) != 0) return static_cast<algorithm>((v & 0xff) - 1);
      const algorithm a = compute();
      slot.store(tag | (static_cast<std::uint64_t>(a) + 1), std::memory_order_relaxed);
      return a;
    }

  private:
    mutable std::array<std::atomic<std::uint64_t>, 64> slots_{};
  };

  cost_model model_;
  std::vector<size_rule> table_;
  choice_memo memo_;
};

inline std::size_t options::segment() const noexcept {
  if (segment_bytes) return segment_bytes;
  return select ? select->segment_bytes() : policy::ring_segment_bytes;
}

} // namespace gradsync
