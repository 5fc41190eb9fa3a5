// Algorithm selection: the cost model's choice against the formulas written
// out again here, the GRADSYNC_ALGO table (parsing, errors, precedence), and
// calibrate() agreeing one selector on every rank.
#include <doctest/doctest.h>

#include <gradsync/calibrate.hpp>
#include <gradsync/collectives.hpp>
#include <gradsync/transport/inproc.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

using namespace gradsync;

namespace {

// The cost model of docs/algorithms.md written out again here, independently
// of select.hpp (nothing below calls cost_model): a link's alpha (per
// message), beta (per byte sent) and gamma (per byte reduced).
struct ref_link {
  double A, B, G;
};

// p ranks in m groups of gs (m == 1: one group, every pair on the local
// link). Between groups every message pays the global link; `nic` ranks of a
// group crossing at once share one link out of it (nic_share: x ranks
// crossing at once pay beta times min(x, gs) clamped to [1, max(1, nic)]).
struct ref_model {
  ref_link glob; // between groups
  ref_link loc;  // inside a group (every pair with one group)
  double seg;    // pipeline segment bytes
  double nic = 1;  // nic_share
  double copy = 0; // arena copy per byte (bruck's local pass when reducing)

  static constexpr double inf = std::numeric_limits<double>::infinity();
  static int ceil_lg(int p) {
    int L = 0;
    while ((1 << L) < p) ++L;
    return L;
  }
  static int floor_pow2(int p) {
    int q = 1;
    while (q * 2 <= p) q *= 2;
    return q;
  }

  double msgs(double m) const { return m > seg ? std::ceil(m / seg) : 1; }

  // ---- One group of p ranks on link l: the textbook formulas. ----
  double textbook(algorithm x, double n, int p, const ref_link& l) const {
    if (p <= 1) return 0;
    const double L = ceil_lg(p);
    const int q2 = floor_pow2(p);
    const double k2 = std::log2(q2), f = q2 == p ? 0 : 1, A = l.A, B = l.B, G = l.G;
    switch (x) {
    // a message over seg goes as ceil(m / seg) segments, each paying alpha
    case algorithm::ring: return 2.0 * (p - 1) * msgs(n / p) * A + 2.0 * (p - 1) / p * n * B + (p - 1.0) / p * n * G;
    case algorithm::tree: { // reduce and broadcast pay alpha per segment per round
      const double k = std::max(1.0, std::ceil(n / seg));
      return 2 * k * L * A + 2 * L * n * B + L * n * G;
    }
    // (combining exchanges; copies, the fold's way back and the doubling,
    // go whole)
    case algorithm::rd: return ((k2 + f) * msgs(n) + f) * A + (k2 + 2 * f) * n * B + (k2 + f) * n * G;
    case algorithm::rabenseifner: { // halving and doubling: messages of n d / p', d = 1 .. p'/2
      double a = f * (msgs(n) + 1);
      for (int d = 1; d < q2; d *= 2) a += msgs(n * d / q2) + 1;
      return a * A + (2 * (q2 - 1.0) / q2 + 2 * f) * n * B + ((q2 - 1.0) / q2 + f) * n * G;
    }
    case algorithm::dbtree: {
      // the first segment up and down h levels (one send up, two down per
      // level), then k - 1 stages of 4 segments (two trees, up and down),
      // one alpha per send round
      const double h = std::floor(std::log2(p));
      const double k = std::max(1.0, std::ceil(n / 2 / seg));
      const double s = n / 2 / k;
      return h * (2 * A + 3 * s * B + 2 * s * G) + (k - 1) * (A + 4 * s * B + 2 * s * G);
    }
    default: return inf;
    }
  }
  double best_textbook(double n, int p, const ref_link& l) const {
    double m = inf;
    for (auto x : {algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd, algorithm::rabenseifner})
      m = std::min(m, textbook(x, n, p, l));
    return m;
  }

  // ---- Per step on p ranks in m groups of gs. ----
  // How many crossing messages share a link when `cross` ranks of a group cross.
  double share(int cross, int gs) const {
    return std::clamp(static_cast<double>(std::min(cross, gs)), 1.0, std::max(1.0, nic));
  }
  // Ranks of a group crossing when rank r pairs with r XOR d: all of them
  // where d spans a group, else none.
  static int cross_xor(int d, int gs, int m) { return m > 1 && gs > 1 && d >= gs ? gs : 0; }
  // ... when rank r sends to r + d: the last min(d, gs) ranks of the group.
  static int cross_shift(int d, int gs, int m) { return m > 1 && gs > 1 ? std::min(d, gs) : 0; }
  // A step where every rank sends `bytes` and `cross` ranks per group leave
  // it; in segments of `sg` (> 0), k of them over it, each paying its own
  // alpha on the slower link.
  double step(double bytes, int cross, int gs, int m, double sg = 0) const {
    if (sg > 0 && bytes > sg) {
      const double k = std::ceil(bytes / sg), s = bytes / k;
      const double out = m > 1 && cross > 0 ? glob.A + s * glob.B * share(cross, gs) : 0.0;
      return k * std::max(loc.A + s * loc.B, out);
    }
    const double inside = loc.A + bytes * loc.B;
    if (m <= 1 || cross <= 0) return inside;
    return std::max(inside, glob.A + bytes * glob.B * share(cross, gs));
  }
  // A chain to the next rank: one hop in gs crosses (alone: no contention).
  double chain_A(int gs, int m) const { return m > 1 ? ((gs - 1) * loc.A + glob.A) / gs : loc.A; }
  double chain_B(int m) const { return m > 1 ? std::max(loc.B, glob.B) : loc.B; }
  double hop_B(int gs, int m) const { return m > 1 ? ((gs - 1) * loc.B + glob.B) / gs : loc.B; }
  // A ring step of b bytes: the chain, but at least the crossing hop's
  // pace (its base latency over the 4 receives in flight), in proportion
  // to how full the blocks are (under 4 bytes mostly empty).
  // A block over `sg` streams k segments of s, each at the slower link's
  // A + s B (no latency part, and in-flight bytes share: stream_segment's
  // bound is the message).
  double ring_step(int gs, int m, double b, double sg) const {
    if (b > sg) {
      const double k = std::ceil(b / sg), s = b / k;
      return k * std::max(loc.A + s * loc.B, m > 1 ? glob.A + s * glob.B : 0.0);
    }
    const double chain = chain_A(gs, m) + b * chain_B(m);
    if (m <= 1) return chain;
    const double crossing = glob.A / 4 + b * glob.B;
    return chain + std::min(1.0, b / 4) * std::max(0.0, crossing - chain);
  }
  // One pass of the segmented binomial tree: every segment over every
  // round's link in turn (a rank sends or receives one message at a time).
  double tree_pass(double n, int p, int gs, int m, double sg) const {
    const double k = std::max(1.0, std::ceil(n / sg)), s = n / k;
    double first = 0;
    for (int d = 1; d < p; d *= 2)
      first += m > 1 && d >= gs ? glob.A + s * glob.B : loc.A + s * loc.B;
    double all = 0;
    for (int j = 0; j < static_cast<int>(k); ++j) all += first;
    return all;
  }
  // The flat allreduces, each step costed by the links its pairs use; the
  // reduction is the local kernel's.
  double per_step(algorithm x, double n, int p, int gs, int m) const {
    if (p <= 1) return 0;
    const double G = loc.G;
    const int L = ceil_lg(p), q2 = floor_pow2(p);
    const double k2 = std::log2(q2), f = q2 == p ? 0 : 1;
    // in to r (combined: segments), back to r + 1 (a copy: one message)
    const double fold = f * (step(n, cross_xor(1, gs, m), gs, m, seg) + step(n, cross_xor(1, gs, m), gs, m));
    switch (x) {
    case algorithm::ring:
      return 2.0 * (p - 1) * ring_step(gs, m, n / p, seg) + (p - 1.0) / p * n * G;
    case algorithm::tree: return 2 * tree_pass(n, p, gs, m, seg) + L * n * G;
    case algorithm::rd: {
      double s = fold;
      for (int d = 1; d < q2; d *= 2) s += step(n, cross_xor(d, gs, m), gs, m, seg);
      return s + (k2 + f) * n * G;
    }
    case algorithm::rabenseifner: {
      double s = fold;
      for (int d = 1; d < q2; d *= 2) // halve (segments), double (whole copies)
        s += step(n * d / q2, cross_xor(d, gs, m), gs, m, seg) + step(n * d / q2, cross_xor(d, gs, m), gs, m);
      return s + ((q2 - 1.0) / q2 + f) * n * G;
    }
    case algorithm::dbtree: {
      const double h = std::floor(std::log2(p));
      const double k = std::max(1.0, std::ceil(n / 2 / seg)), s = n / 2 / k;
      // level d of the first segment's path (heap node 2^(d-1) - 1 to
      // 2^d - 1): inside a group on the local link, else on the global one
      // with its 2^d children sending up at once and their 2^(d-1) parents
      // two each down, sharing their groups' links; then k - 1 full stages
      // with every rank of a group crossing at once
      const ref_link full = m > 1 ? ref_link{glob.A, glob.B * share(gs, gs), glob.G} : loc;
      double fill = 0;
      for (int d = 1; d <= int(h); ++d) {
        const int w = 1 << d;
        const bool out = m > 1 && ((1 << (d - 1)) - 1) / gs != (w - 1) / gs;
        const ref_link e = out ? glob : loc;
        const double up = out ? share(w, gs) : 1, down = out ? share(w / 2, gs) : 1;
        fill += 2 * e.A + s * e.B * (up + 2 * down) + 2 * s * G;
      }
      return fill + (k - 1) * (full.A + 4 * s * full.B + 2 * s * G);
    }
    default: return inf;
    }
  }
  double cost(algorithm x, double n, int p, int gs, int m) const {
    if (x == algorithm::hier) {
      if (!(m > 1 && gs > 1)) return inf;
      // all gs ranks of a group cross at once in the step between groups
      const ref_link between{glob.A, glob.B * std::clamp(static_cast<double>(gs), 1.0, std::max(1.0, nic)), glob.G};
      return 2.0 * (gs - 1) * loc.A + 2.0 * (gs - 1) / gs * n * loc.B + (gs - 1.0) / gs * n * loc.G +
             best_textbook(n / gs, m, between);
    }
    if (x == algorithm::twod) {
      if (p < 4) return inf;
      const ref_link l = m > 1 ? ref_link{glob.A, glob.B * share(gs, gs), glob.G} : loc;
      const int w = grid_row(p), rows = (p + w - 1) / w;
      // the column step: a ring of n / w bytes over the rows, unsegmented
      const double c = n / w;
      return 2.0 * (w - 1) * l.A + 2.0 * (w - 1) / w * n * l.B + (w - 1.0) / w * n * l.G + 2.0 * (rows - 1) * l.A +
             2.0 * (rows - 1) / rows * c * l.B + (rows - 1.0) / rows * c * l.G;
    }
    return per_step(x, n, p, gs, m);
  }

  // ---- Reduce-scatter (reduce) / allgather of n bytes in p blocks. ----
  // Their segment: 4 MiB where a link is slower than 1 GB/s, else 256 KiB.
  double gather_seg() const { return std::max(loc.B, glob.B) > 1e-9 ? 4 << 20 : 256 << 10; }
  double gather(algorithm x, double n, int p, int gs, int m, bool reduce) const {
    if (p <= 1) return 0;
    const double b = n / p, G = reduce ? loc.G : 0;
    switch (x) {
    case algorithm::ring: return (p - 1) * (ring_step(gs, m, b, gather_seg()) + b * G);
    case algorithm::bruck: {
      double s = 0;
      if (!reduce) { // round d: min(d, p - d) blocks to the rank d on
        for (int d = 1; d < p; d *= 2) s += step(std::min(d, p - d) * b, cross_shift(d, gs, m), gs, m);
        return s;
      }
      // halving: of `left` blocks send the last floor(left/2) ceil(left/2) on
      for (int left = p; left > 1;) {
        const int keep = (left + 1) / 2, sent = left - keep;
        s += step(sent * b, cross_shift(keep, gs, m), gs, m, gather_seg()) + sent * b * G;
        left = keep;
      }
      return s + n * copy;
    }
    case algorithm::rd: {
      const int q2 = floor_pow2(p);
      const double v = n / q2;
      double s = 0;
      const double sg = reduce ? gather_seg() : 0; // allgathers move whole ranges
      for (int d = 1; d < q2; d *= 2) s += step(d * v, cross_xor(d, gs, m), gs, m, sg) + d * v * G;
      if (q2 != p) {
        const int c = cross_xor(1, gs, m);
        s += reduce ? step(n, c, gs, m, sg) + n * G + step(b, c, gs, m) : step(b, c, gs, m) + step(n - b, c, gs, m);
      }
      return s;
    }
    case algorithm::hier: {
      // Leader-based on m slots of gs blocks: allgather = the group's blocks
      // inside + the slots among the m leaders (global) + the slots
      // broadcast inside + one unpermuting pass; reduce-scatter = one
      // permuting pass + the slots reduced inside + the leaders' reduce-
      // scatter + gs - 1 blocks sent inside. Each level at its cheapest.
      if (m <= 1 || gs <= 1) return inf;
      const ref_model across{glob, glob, seg, 1, copy}, inside{loc, loc, seg, 1, copy};
      const double all = std::ceil(b) * gs * m; // the slots, in whole bytes
      double lead = inf, in_gather = inf, in_rooted = inf;
      for (auto y : {algorithm::ring, algorithm::bruck, algorithm::rd}) {
        lead = std::min(lead, across.gather(y, all, m, m, 1, reduce));
        in_gather = std::min(in_gather, inside.gather(y, b * gs, gs, gs, 1, false));
      }
      for (auto y : {algorithm::tree, algorithm::ring, algorithm::scatter_allgather})
        in_rooted = std::min(in_rooted, inside.rooted(y, all, gs, gs, 1, reduce, seg));
      return reduce ? all * copy + in_rooted + lead + (gs - 1) * (loc.A + b * loc.B)
                    : in_gather + lead + in_rooted + all * copy;
    }
    default: return inf;
    }
  }

  // ---- Broadcast / reduce (rooted) of n bytes, segments of sg. ----
  double rooted(algorithm x, double n, int p, int gs, int m, bool reduce, double sg) const {
    if (p <= 1) return 0;
    const double G = reduce ? loc.G : 0;
    switch (x) {
    case algorithm::tree: return tree_pass(n, p, gs, m, sg) + ceil_lg(p) * n * G;
    case algorithm::ring: {
      const double k = std::max(1.0, std::ceil(n / sg)), s = n / k;
      const double fill = chain_A(gs, m) + s * (hop_B(gs, m) + G);
      static_assert(policy::chain_ranks_per_segment_for_one_send == 2 && policy::pipeline_depth == 4);
      if (m <= 1 || gs <= 1) { // every hop on one link: the textbook chain, but with four
        const ref_link& l = m <= 1 ? loc : glob; // in flight the first four segments share each hop of the fill
        if (p > 2 * k) return (p - 2 + k) * (l.A + s * (l.B + G));
        return (p - 2) * (l.A + std::min(k, 4.0) * s * l.B + s * G) + k * (l.A + s * (l.B + G));
      }
      // one send in flight: each segment at the slowest hop's whole message
      if (p > 2 * k) return (p - 2) * fill + k * (std::max(loc.A + s * loc.B, glob.A + s * glob.B) + s * G);
      // four: the first min(k, 4) segments cross each group's link together
      return (p - 2) * (fill + (std::min(k, 4.0) - 1) * s * glob.B / gs) + k * (chain_A(gs, m) + s * (chain_B(m) + G));
    }
    case algorithm::scatter_allgather: {
      if (reduce) return inf;
      const double b = n / p;
      double s = 0;
      for (int half = 1 << ceil_lg(p); (half /= 2) >= 1;)
        s += step(std::min(half, p - half) * b, m > 1 && half >= gs ? 1 : 0, gs, m);
      return s + (p - 1) * ring_step(gs, m, b, seg);
    }
    case algorithm::hier: {
      // The best flat schedule among the m group leaders on the global
      // link, plus the best inside a group of gs on the local one.
      if (m <= 1 || gs <= 1) return inf;
      const ref_model across{glob, glob, seg, 1, copy}, inside{loc, loc, seg, 1, copy};
      double a = inf, b = inf;
      for (auto y : {algorithm::tree, algorithm::ring, algorithm::scatter_allgather}) {
        a = std::min(a, across.rooted(y, n, m, m, 1, reduce, sg));
        b = std::min(b, inside.rooted(y, n, gs, gs, 1, reduce, sg));
      }
      return a + b;
    }
    default: return inf;
    }
  }
};

bool same_cost(double got, double want) {
  if (std::isinf(want)) return std::isinf(got);
  return std::fabs(got - want) <= 1e-9 * std::max(std::fabs(got), std::fabs(want));
}

constexpr algorithm candidates[] = {algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd,
                                    algorithm::rabenseifner, algorithm::twod, algorithm::hier};

// Link parameter sets: the defaults, a latency-bound network, a
// bandwidth-bound one with a slow kernel, two two-level ones (slow links
// between groups; the last latency-heavy).
struct params {
  double a, b, g, la, lb, lg;
};
constexpr params param_sets[] = {
    {policy::model_alpha, policy::model_beta, policy::model_gamma, policy::model_alpha, policy::model_beta, policy::model_gamma},
    {50e-6, 1e-10, 1e-11, 50e-6, 1e-10, 1e-11},
    {1e-6, 1e-9, 5e-10, 1e-6, 1e-9, 5e-10},
    {20e-6, 4e-10, 1e-10, 1e-6, 2e-11, 1e-10},
    {20e-6, 1e-9, 1e-10, 1e-6, 1e-10, 1e-10},
};

// The nic_share values tried on a topology: 1, the group size, 8.
std::vector<double> nic_values(int groups, int G) {
  if (groups <= 1) return {1.0};
  std::vector<double> v{1.0};
  for (double x : {static_cast<double>(G), 8.0})
    if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
  return v;
}

struct env_guard { // sets GRADSYNC_ALGO for one test, restores "unset" after
  explicit env_guard(const char* v) { ::setenv("GRADSYNC_ALGO", v, 1); }
  ~env_guard() { ::unsetenv("GRADSYNC_ALGO"); }
};

} // namespace

TEST_CASE("select: the choice is the cheapest schedule by the model") {
  // Every parameter set on one group and on groups of 2, 4 and 8 with
  // nic_share 1, the group size and 8; each candidate's cost against the
  // reference, and the choice the cheapest by the reference.
  const std::size_t seg = policy::ring_segment_bytes;
  std::size_t checked = 0;
  int nic_changed = 0;
  std::vector<int> seen(16, 0);
  for (const auto& ps : param_sets)
    for (int p : {2, 3, 4, 5, 6, 7, 8, 16, 64, 256})
      for (int gs : {0, 2, 4, 8})
        for (double lb2 = 2; lb2 <= 33; lb2 += 1) {
          const auto bytes = static_cast<std::size_t>(std::pow(2.0, lb2));
          const auto n = static_cast<double>(bytes);
          const int G = gs > 0 && gs < p ? gs : p;
          const int groups = (p + G - 1) / G;
          const topology t{p, G, groups};
          algorithm at_nic1 = algorithm::automatic, at_nic8 = algorithm::automatic;
          for (double nic : nic_values(groups, G)) {
            cost_model m;
            m.global = {ps.a, ps.b, ps.g};
            m.local = {ps.la, ps.lb, ps.lg};
            m.nic_share = nic;
            const selector sel(m);
            const ref_model ref{{ps.a, ps.b, ps.g}, {ps.la, ps.lb, ps.lg}, static_cast<double>(seg), nic};
            INFO("p=" << p << " group=" << G << " groups=" << groups << " nic_share=" << nic << " bytes=" << bytes);
            double best = std::numeric_limits<double>::infinity();
            for (auto x : candidates) {
              const double want = ref.cost(x, n, p, G, groups);
              INFO(algorithm_name(x) << ": model " << m.allreduce(x, bytes, t, seg) << " reference " << want);
              REQUIRE(same_cost(m.allreduce(x, bytes, t, seg), want));
              best = std::min(best, want);
              // on one group the per-step costs are the textbook formulas
              if (groups == 1 && x != algorithm::twod && x != algorithm::hier)
                REQUIRE(same_cost(want, ref.textbook(x, n, p, {ps.la, ps.lb, ps.lg})));
            }
            const algorithm got = sel.choose(bytes, t, seg);
            INFO("chose " << algorithm_name(got));
            REQUIRE(ref.cost(got, n, p, G, groups) <= best * (1 + 1e-9));
            ++seen[static_cast<std::size_t>(got)];
            ++checked;
            if (nic == 1) at_nic1 = got;
            if (nic == 8) at_nic8 = got;
          }
          nic_changed += groups > 1 && at_nic1 != at_nic8;
        }
  CHECK(checked > 10000);
  // The grid is wide enough that the model's answer really varies, and the
  // shared NIC changes it somewhere.
  int distinct = 0;
  for (int s : seen) distinct += s > 0;
  CHECK(distinct >= 4);
  CHECK(nic_changed > 0);
}

TEST_CASE("select: gathers and rooted collectives choose the cheapest by the model") {
  // As above for choose_allgather / choose_reduce_scatter (ring, bruck, rd, hier
  // on several groups)
  // and choose_rooted (tree, ring, scatter_allgather for broadcast, hier on
  // several groups), no arena.
  const std::size_t seg = policy::ring_segment_bytes;
  std::vector<int> gathers(16, 0), rooteds(16, 0);
  std::size_t checked = 0;
  for (const auto& ps : param_sets)
    for (int p : {2, 3, 5, 6, 8, 12, 16, 48, 64})
      for (int gs : {0, 2, 4, 8})
        for (double lb2 = 3; lb2 <= 30; lb2 += 1.5) {
          const auto bytes = static_cast<std::size_t>(std::pow(2.0, lb2));
          const auto n = static_cast<double>(bytes);
          const int G = gs > 0 && gs < p ? gs : p;
          const int groups = (p + G - 1) / G;
          const topology t{p, G, groups};
          for (double nic : nic_values(groups, G)) {
            cost_model m;
            m.global = {ps.a, ps.b, ps.g};
            m.local = {ps.la, ps.lb, ps.lg};
            m.arena.copy = 1.5e-10;
            m.nic_share = nic;
            const selector sel(m);
            const ref_model ref{{ps.a, ps.b, ps.g}, {ps.la, ps.lb, ps.lg}, static_cast<double>(seg), nic, 1.5e-10};
            INFO("p=" << p << " group=" << G << " groups=" << groups << " nic_share=" << nic << " bytes=" << bytes);
            for (bool red : {false, true}) {
              INFO("reduce=" << red);
              double best = std::numeric_limits<double>::infinity();
              for (auto x : {algorithm::ring, algorithm::bruck, algorithm::rd, algorithm::hier}) {
                const double want = ref.gather(x, n, p, G, groups, red);
                INFO(algorithm_name(x) << ": model " << m.scatter_gather(x, bytes, t, red) << " reference " << want);
                REQUIRE(same_cost(m.scatter_gather(x, bytes, t, red), want));
                best = std::min(best, want);
              }
              const algorithm g = red ? sel.choose_reduce_scatter(bytes, t, seg) : sel.choose_allgather(bytes, t, seg);
              INFO("gather chose " << algorithm_name(g));
              REQUIRE(ref.gather(g, n, p, G, groups, red) <= best * (1 + 1e-9));
              ++gathers[static_cast<std::size_t>(g)];

              best = std::numeric_limits<double>::infinity();
              for (auto x : {algorithm::tree, algorithm::ring, algorithm::scatter_allgather, algorithm::hier}) {
                const double want = ref.rooted(x, n, p, G, groups, red, static_cast<double>(seg));
                INFO(algorithm_name(x) << ": model " << m.rooted(x, bytes, t, red, seg) << " reference " << want);
                REQUIRE(same_cost(m.rooted(x, bytes, t, red, seg), want));
                best = std::min(best, want);
              }
              const algorithm r = sel.choose_rooted(bytes, t, red, seg);
              INFO("rooted chose " << algorithm_name(r));
              REQUIRE(ref.rooted(r, n, p, G, groups, red, static_cast<double>(seg)) <= best * (1 + 1e-9));
              ++rooteds[static_cast<std::size_t>(r)];
              ++checked;
            }
          }
        }
  CHECK(checked > 2000);
  for (auto x : {algorithm::ring, algorithm::bruck, algorithm::rd, algorithm::hier}) {
    INFO("gathers never chose " << algorithm_name(x));
    CHECK(gathers[static_cast<std::size_t>(x)] > 0);
  }
  for (auto x : {algorithm::tree, algorithm::ring, algorithm::scatter_allgather, algorithm::hier}) {
    INFO("rooted never chose " << algorithm_name(x));
    CHECK(rooteds[static_cast<std::size_t>(x)] > 0);
  }
}

TEST_CASE("select: hier's step between groups shares the NIC (choose_inner)") {
  // between_groups(g): every rank of a group crosses at once, beta times
  // min(g, nic_share); the choice is the cheapest textbook schedule on it.
  cost_model m;
  m.local = {1e-6, 1e-10, 1e-10};
  m.global = {10e-6, 1e-9, 1e-10};
  m.nic_share = 4;
  const selector sel(m);
  const std::size_t seg = policy::ring_segment_bytes;
  const ref_model ref{{10e-6, 1e-9, 1e-10}, {1e-6, 1e-10, 1e-10}, static_cast<double>(seg), 4};
  for (int groups : {2, 3, 8, 16})
    for (int g : {1, 2, 4, 8}) // 8: clamped to nic_share 4
      for (std::size_t b = 8; b <= (std::size_t{1} << 30); b *= 8) {
        const ref_link link{10e-6, 1e-9 * std::min(g, 4), 1e-10};
        const algorithm got = sel.choose_inner(b, groups, seg, g);
        INFO("groups=" << groups << " g=" << g << " bytes=" << b << " chose " << algorithm_name(got));
        CHECK(ref.textbook(got, static_cast<double>(b), groups, link) <=
              ref.best_textbook(static_cast<double>(b), groups, link) * (1 + 1e-9));
      }
  // The ring between 3 groups of 8 ranks, nic_share 4: beta 4 x 1e-9, and
  // blocks of 64 Mi / 3 in k = ceil(85.33) = 86 segments of 256 KiB, so
  // 2 x 2 x 86 x 10e-6 + 2 x 2/3 x 64 Mi x 4e-9 + 2/3 x 64 Mi x 1e-10
  // = 3440e-6 + 357913.941333e-6 + 4473.924267e-6 = 365827.8656 us.
  const double n = 64.0 * (1 << 20);
  CHECK(cost_model::flat(algorithm::ring, n, 3, m.between_groups(8), 1 << 18) ==
        doctest::Approx(365827.8656e-6).epsilon(1e-10));
  CHECK(m.between_groups(8).beta == doctest::Approx(4e-9).epsilon(1e-15));
  CHECK(m.between_groups(2).beta == doctest::Approx(2e-9).epsilon(1e-15));
  CHECK(m.between_groups(0).beta == doctest::Approx(1e-9).epsilon(1e-15));
}

TEST_CASE("select: per-size message costs (link_cost::extra) by hand") {
  static_assert(policy::pipeline_depth == 4);
  static_assert(policy::calibrate_mid_points == 5 && policy::calibrate_mid_bytes[0] == 1024 &&
                policy::calibrate_mid_bytes[2] == (16u << 10) && policy::calibrate_mid_bytes[4] == (512u << 10) &&
                policy::calibrate_bytes == (8u << 20));
  link_cost l{10e-6, 1e-9, 1e-10};
  // Without extras every size pays alpha.
  for (double m : {0.0, 8.0, 1000.0, 65536.0, 1e9}) CHECK(l.alpha_at(m) == 10e-6);
  const double e[5] = {1e-6, 2e-6, 30e-6, 40e-6, 50e-6}; // at 1 KiB, 8 KiB, 16 KiB, 64 KiB, 512 KiB
  std::copy(e, e + 5, l.extra);
  // A step per measured size: the extra of the largest measured size not
  // above m; alpha alone below 1 KiB and from 8 MiB.
  CHECK(l.alpha_at(8) == 10e-6);
  CHECK(l.alpha_at(1023) == 10e-6);
  CHECK(l.alpha_at(1024) == doctest::Approx(11e-6));
  CHECK(l.alpha_at(8191) == doctest::Approx(11e-6));
  CHECK(l.alpha_at(8192) == doctest::Approx(12e-6));
  CHECK(l.alpha_at(16383) == doctest::Approx(12e-6));
  CHECK(l.alpha_at(16384) == doctest::Approx(40e-6));
  CHECK(l.alpha_at(49152) == doctest::Approx(40e-6));
  CHECK(l.alpha_at(65536) == doctest::Approx(50e-6));
  CHECK(l.alpha_at(131072) == doctest::Approx(50e-6));
  CHECK(l.alpha_at(524288) == doctest::Approx(60e-6));
  CHECK(l.alpha_at(8388607) == doctest::Approx(60e-6));
  CHECK(l.alpha_at(8388608) == 10e-6);
  CHECK(l.alpha_at(1e9) == 10e-6);
  CHECK(l.msg(65536) == doctest::Approx(50e-6 + 65536 * 1e-9));
  // Schedules on one group: each message pays the extra of its own size.
  // Ring, 4 ranks, 256 KiB: 6 messages of 64 KiB, alpha + 40e-6 each; rd:
  // 2 steps of the whole 256 KiB (64 KiB's extra too); with 1 MiB, rd's
  // messages go as 4 segments of 256 KiB, 4 in flight, each the larger of
  // its own overhead and bytes, 10e-6 + s b, and a quarter of its message
  // and the other three's bytes, (50e-6 + 4 s b) / 4 = 274.644 us.
  const ref_model ref{{}, {}, static_cast<double>(policy::ring_segment_bytes)};
  const double n = 262144;
  CHECK(cost_model::flat(algorithm::ring, n, 4, l, policy::ring_segment_bytes) ==
        doctest::Approx(ref.textbook(algorithm::ring, n, 4, {50e-6, 1e-9, 1e-10})).epsilon(1e-12));
  CHECK(cost_model::flat(algorithm::rd, n, 4, l, policy::ring_segment_bytes) ==
        doctest::Approx(ref.textbook(algorithm::rd, n, 4, {50e-6, 1e-9, 1e-10})).epsilon(1e-12));
  CHECK(cost_model::flat(algorithm::rd, 4 * n, 4, l, policy::ring_segment_bytes) ==
        doctest::Approx(2 * 4 * 274.644e-6 + 2 * 4 * n * 1e-10).epsilon(1e-12));
  // Rabenseifner, 4 ranks, 1 MiB: two steps of 256 KiB (64 KiB's extra) and two
  // of 512 KiB: the halving's in 2 segments, 2 in flight, each max(10e-6 +
  // s b, (50e-6 + 2 s b) / 2) = 287.144 us, the doubling's copy whole
  // (512 KiB's extra); plus 0.75 n gamma.
  CHECK(cost_model::flat(algorithm::rabenseifner, 4 * n, 4, l, policy::ring_segment_bytes) ==
        doctest::Approx(2 * (50e-6 + n * 1e-9) + 2 * 287.144e-6 + 60e-6 + 2 * n * 1e-9 + 0.75 * 4 * n * 1e-10)
            .epsilon(1e-12));
  // The NIC shared between groups keeps the extras (only beta scales).
  cost_model m;
  m.local = l;
  m.global = l;
  m.nic_share = 8;
  CHECK(m.between_groups(8).extra[3] == 40e-6);
  CHECK(m.flat_link(topology{16, 8, 2}).extra[4] == 50e-6);
  // Never below zero: a size that ran faster than alpha + m beta.
  link_cost fast{1e-6, 1e-9, 0};
  fast.extra[4] = -5e-6;
  CHECK(fast.alpha_at(524288) == 0);
  CHECK(fast.alpha_at(65536) == doctest::Approx(1e-6));
  CHECK(fast.msg(524288) == doctest::Approx(524288 * 1e-9));
}

TEST_CASE("select: default model switches from latency- to bandwidth-optimal schedules") {
  const selector sel;
  const topology t{8, 8, 1};
  const auto seg = policy::ring_segment_bytes;
  const algorithm small = sel.choose(8, t, seg), large = sel.choose(std::size_t{256} << 20, t, seg);
  CHECK((small == algorithm::rd || small == algorithm::tree));
  CHECK((large == algorithm::ring || large == algorithm::rabenseifner || large == algorithm::twod ||
         large == algorithm::dbtree));
  // hier is a candidate only when there are groups
  for (std::size_t b = 1; b < (std::size_t{1} << 34); b *= 4) CHECK(sel.choose(b, t, seg) != algorithm::hier);
}

TEST_CASE("select: override table syntax and lookup") {
  const auto rules = parse_algo_table(" rd:0-2K; rabenseifner:2K-1M ;ring:1M-max");
  REQUIRE(rules.size() == 3);
  const selector sel(cost_model{}, rules);
  CHECK(sel.pinned(0) == algorithm::rd);
  CHECK(sel.pinned(2047) == algorithm::rd);
  CHECK(sel.pinned(2048) == algorithm::rabenseifner);
  CHECK(sel.pinned((1u << 20) - 1) == algorithm::rabenseifner);
  CHECK(sel.pinned(1u << 20) == algorithm::ring);
  CHECK(sel.pinned(SIZE_MAX) == algorithm::ring);
  // gaps fall to the model; a bare name covers everything; G suffix; plain bytes
  const selector gap(cost_model{}, parse_algo_table("tree:100-200"));
  CHECK(gap.pinned(99) == algorithm::automatic);
  CHECK(gap.pinned(150) == algorithm::tree);
  CHECK(gap.choose(150, topology{8, 8, 1}, 1 << 18) == algorithm::tree);
  CHECK(gap.choose(50, topology{8, 8, 1}, 1 << 18) == gap.cheapest(50, topology{8, 8, 1}, 1 << 18));
  CHECK(selector(cost_model{}, parse_algo_table("dbtree")).pinned(12345) == algorithm::dbtree);
  const auto big = parse_algo_table("auto:0-1G;2d:1G-max");
  CHECK(big[1].lo == (std::size_t{1} << 30));
  CHECK(big[1].algo == algorithm::twod);
  CHECK(parse_algo_table("").empty());
  CHECK(parse_algo_table("   ").empty());
}

TEST_CASE("select: malformed override tables are rejected, naming the token") {
  const char* bad[][2] = {
      {"foo", "foo"},                       // unknown algorithm
      {"ring:", "ring:"},                   // no range
      {"ring:1K", "ring:1K"},               // range without '-'
      {"ring:0-", "ring:0-"},               // missing upper size
      {"ring:-5", "ring:-5"},               // missing lower size
      {"ring:0-2X", "ring:0-2X"},           // bad suffix
      {"ring:0-1.5K", "ring:0-1.5K"},       // not an integer
      {"rd:2K-1K", "rd:2K-1K"},             // empty range
      {"rd:1K-1K", "rd:1K-1K"},             // empty range
      {"ring:max-1K", "ring:max-1K"},       // max as lower bound
      {"rd:0-2K;;ring:2K-max", "''"},       // empty entry
      {"rd:0-2K;", "''"},                   // trailing ';'
      {"rd:0-2K;ring:1K-max", "ring:1K-max"}, // overlap
      {":0-1K", ":0-1K"},                   // no name
      {"Ring:0-1K", "Ring:0-1K"},           // names are case-sensitive
      {"ring:0-99999999999999999999999", "ring:0-99999999999999999999999"}, // overflow
      {"ring:0-20000000000G", "ring:0-20000000000G"},                       // overflow by suffix
  };
  for (const auto& b : bad) {
    INFO("spec: " << b[0]);
    try {
      (void)parse_algo_table(b[0]);
      FAIL_CHECK("accepted");
    } catch (const error& e) {
      CHECK(e.op() == "GRADSYNC_ALGO");
      CHECK(std::string(e.what()).find(std::string("'") + (b[1][0] == '\'' ? "" : b[1]) + "'") != std::string::npos);
    }
  }
  env_guard env("ring:0-1K;bogus:1K-max");
  CHECK_THROWS_WITH_AS(selector::from_env(), doctest::Contains("bogus"), error);
}

namespace {
// Counts the messages each rank sends, to see which schedule really ran.
struct counting {
  static constexpr std::string_view name = "counting";
  inproc::communicator& c;
  int sends = 0;
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  auto isend(std::span<const std::byte> d, int peer, int tag) { ++sends; return c.isend(d, peer, tag); }
  auto irecv(std::span<std::byte> d, int peer, int tag) { return c.irecv(d, peer, tag); }
};
static_assert(transport<counting>);
} // namespace

TEST_CASE("select: GRADSYNC_ALGO is read when the selector is made and honoured by allreduce") {
  env_guard env("rd:0-1K;ring:1K-max");
  inproc::run(8, [](inproc::communicator& comm) {
    const selector sel = calibrate(comm); // reads the environment once, here
    if (comm.rank() == 0) ::setenv("GRADSYNC_ALGO", "tree", 1); // later changes do not matter
    options o;
    o.select = &sel;
    o.segment_bytes = std::size_t{1} << 20;
    o.verify = verification::never; // count the schedule's messages, not the call check's
    // 8 floats = 32 bytes: rd on 8 ranks sends lg 8 = 3 messages per rank.
    counting c{comm};
    CHECK(allreduce_algorithm<float>(c, 8, o) == algorithm::rd);
    std::vector<float> v(8, static_cast<float>(comm.rank()));
    allreduce(c, std::span<float>(v), op::sum{}, o);
    CHECK(c.sends == 3);
    CHECK(v[0] == 28.0f);
    // 1024 floats = 4 KiB: the ring sends 2 (p-1) = 14 messages per rank.
    c.sends = 0;
    std::vector<float> w(1024, 1.0f);
    CHECK(allreduce_algorithm<float>(c, w.size(), o) == algorithm::ring);
    allreduce(c, std::span<float>(w), op::sum{}, o);
    CHECK(c.sends == 14);
    CHECK(w[1023] == 8.0f);
    // an explicit options::algo beats the table
    o.algo = algorithm::tree;
    CHECK(allreduce_algorithm<float>(c, w.size(), o) == algorithm::tree);
  });
}

TEST_CASE("select: calibrate agrees one model on every rank") {
  for (int p : {1, 2, 5}) {
    std::vector<cost_model> got(static_cast<std::size_t>(p));
    inproc::run(p, [&](inproc::communicator& c) { got[static_cast<std::size_t>(c.rank())] = calibrate(c, 2).model(); });
    for (const auto& m : got) {
      CHECK(std::memcmp(&m, &got[0], sizeof m) == 0);
      if (p > 1) {
        CHECK(m.local.alpha > 0);
        CHECK(m.local.beta >= 0);
      }
      CHECK(m.local.gamma > 0);
      CHECK(m.arena.copy > 0);
      for (std::size_t j = 0; j < policy::calibrate_mid_points; ++j) {
        CHECK(std::isfinite(m.local.extra[j]));
        if (p == 1) CHECK(m.local.extra[j] == 0); // no partner: nothing timed
      }
      if (p > 1) CHECK(m.arena.sync == m.local.alpha); // inproc has no arena: the local alpha stands in
      if (p > 2) CHECK(m.global.alpha > 0);
    }
  }
}

namespace {
// A link on a clock of its own (wtime): a message of m bytes posted at time
// t arrives at t + alpha + m beta where messages in flight together do not
// share the link (SimGrid's FATPIPE), and after the bytes of every message
// posted before it in its direction where they do. Each rank keeps its own
// clock; calibration's steps are symmetric, so every rank sees the same.
struct timed_link {
  static constexpr std::string_view name = "timed_link";
  static constexpr double alpha = 10e-6, beta = 1e-9;
  inproc::communicator& c;
  bool shares;
  double now = 0, out_free = 0, in_free = 0;

  template <class R> struct timed {
    R inner;
    double done;
    double* clock;
    void wait() {
      inner.wait();
      *clock = std::max(*clock, done);
    }
    bool test() {
      if (!inner.test()) return false;
      *clock = std::max(*clock, done);
      return true;
    }
  };
  double arrival(std::size_t m, double& free) {
    const double start = shares ? std::max(now, free) : now;
    free = start + static_cast<double>(m) * beta;
    return free + alpha;
  }
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  double wtime() const { return now; }
  auto isend(std::span<const std::byte> d, int peer, int tag) {
    const double at = arrival(d.size(), out_free);
    return timed<decltype(c.isend(d, peer, tag))>{c.isend(d, peer, tag), at, &now};
  }
  auto irecv(std::span<std::byte> d, int peer, int tag) {
    const double at = arrival(d.size(), in_free);
    return timed<decltype(c.irecv(d, peer, tag))>{c.irecv(d, peer, tag), at, &now};
  }
};
static_assert(clocked<timed_link>);
} // namespace

TEST_CASE("select: calibrate measures whether messages in flight together share the link") {
  // On the timed link every step's time is closed form: alpha + m beta
  // alone; S = policy::calibrate_split pieces of P bytes at once: alpha +
  // P beta (not sharing) or alpha + S P beta (sharing). Sharing, the 8-byte
  // burst's messages arrive 8 beta apart, which calibrate takes for each
  // message's own overhead (latency = alpha), and the 8 B step that is the
  // model's alpha holds 8 beta, so the size extras are -8 beta: the others'
  // bytes cost (S - 1) P beta alone and added about (S - 1)(P - 8) beta
  // beyond their overheads: a share of about 1 - 8 / P. Not sharing: 0.
  for (const bool shares : {false, true}) {
    std::vector<cost_model> got(2);
    inproc::run(2, [&](inproc::communicator& base) {
      timed_link c{base, shares};
      got[static_cast<std::size_t>(base.rank())] = calibrate(c, 2).model();
    });
    for (const auto& m : got) {
      INFO("shares=" << shares);
      CHECK(m.local.alpha == doctest::Approx(timed_link::alpha + 8 * timed_link::beta).epsilon(1e-9));
      CHECK(m.local.beta == doctest::Approx(timed_link::beta).epsilon(1e-9));
      constexpr double piece = static_cast<double>(policy::calibrate_bytes / policy::calibrate_split);
      if (shares) { // 1 less about 8 / P (7.5 / P here: the burst's timing)
        CHECK(m.local.inflight_share > 1 - 16 / piece);
        CHECK(m.local.inflight_share <= 1 - 4 / piece);
      } else {
        CHECK(m.local.inflight_share == 0);
      }
      CHECK(m.global.inflight_share == m.local.inflight_share); // one group: the local link serves both
    }
  }
}

TEST_CASE("select: the chain's segments in flight cost what the link's in-flight share says") {
  // One group of 8 ranks, a broadcast of 8 MiB in k = 32 segments of
  // s = 256 KiB, D = 4 in flight; link alpha 1 us, all of it latency (own
  // overhead 0), beta 5e-11: a segment's message m = 1 + 13.1072 =
  // 14.1072 us. The chain: (p - 2)(m + (D - 1) x) + k max(x, (m + (D - 1)
  // x) / D), x = share s beta (a segment holds its place in flight for its
  // message and the others' shared bytes):
  //  share 1:   6 (14.1072 + 39.3216) + 32 x 53.4288 / 4 = 748.0032 us;
  //  share 0.5: 6 (14.1072 + 19.6608) + 32 x 33.768 / 4 = 472.752 us;
  //  share 0:   6 x 14.1072 + 32 x 14.1072 / 4 = 197.5008 us.
  static_assert(policy::pipeline_depth == 4);
  cost_model m;
  m.local = {1e-6, 5e-11, 0, 1e-6};
  for (const auto& sw : {std::pair{1.0, 748.0032e-6}, {0.5, 472.752e-6}, {0.0, 197.5008e-6}}) {
    const double share = sw.first, want = sw.second;
    m.local.inflight_share = share;
    INFO("share=" << share);
    CHECK(m.rooted(algorithm::ring, std::size_t{8} << 20, 8, false, std::size_t{1} << 18) ==
          doctest::Approx(want).epsilon(1e-12));
    // the tree sends one segment at a time: the share does not enter
    CHECK(m.rooted(algorithm::tree, std::size_t{8} << 20, 8, false, std::size_t{1} << 18) ==
          doctest::Approx(32 * 3 * 1e-6 + 3 * 8388608 * 5e-11).epsilon(1e-12));
  }
}

TEST_CASE("select: calibrate fails on every rank for a malformed GRADSYNC_ALGO") {
  env_guard env("ring:0-1Q");
  std::atomic<int> failures{0};
  inproc::run(4, [&](inproc::communicator& c) {
    try {
      (void)calibrate(c);
    } catch (const error& e) {
      if (std::string(e.what()).find("ring:0-1Q") != std::string::npos) ++failures;
    }
  });
  CHECK(failures == 4);
}

TEST_CASE("select: broadcast and reduce pick tree, chain or scatter-allgather by the model") {
  // One group, link {10 us, 1e-10, 1e-10}, segments of S = 256 KiB:
  //  tree: L = ceil(lg p) rounds of each of the k segments, one message at a
  //    time: k L alpha + L n (beta + gamma);
  //  chain: (p - 2 + k) (alpha + n/k (beta + gamma)), k = ceil(n / S),
  //    where it has one send in flight (p > 2k); else D = min(k, 4) in
  //    flight, each hop of the fill carrying D segments' bytes:
  //    (p - 2)(alpha + D s beta + s gamma) + k (alpha + s (beta + gamma)),
  //    s = n / k (no latency overlaps: link_cost::latency is 0);
  //  scatter_allgather (broadcast only): a binomial scatter of L rounds
  //    moving p - 1 blocks of n/p in all, then the ring allgather, its
  //    blocks over S in j = ceil(n/p / S) segments:
  //    L alpha + (p-1)/p n beta + (p - 1)(j alpha + n/p beta).
  cost_model m;
  m.local = {10e-6, 1e-10, 1e-10};
  const selector sel(m);
  for (int p : {2, 3, 4, 6, 8, 12, 16, 64})
    for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 16, std::size_t{1} << 22, std::size_t{1} << 26})
      for (bool red : {false, true}) {
        const double L = std::ceil(std::log2(p)), n = static_cast<double>(bytes), S = 1 << 18;
        const double g = red ? 1e-10 : 0;
        const double k = std::max(1.0, std::ceil(n / S));
        const double tree = k * L * 10e-6 + L * n * (1e-10 + g); // alpha per segment per round
        const double s = n / k, chain = p > 2 * k ? (p - 2 + k) * (10e-6 + s * (1e-10 + g))
                                                  : (p - 2) * (10e-6 + std::min(k, 4.0) * s * 1e-10 + s * g) +
                                                        k * (10e-6 + s * (1e-10 + g));
        const double sa = red ? std::numeric_limits<double>::infinity()
                              : L * 10e-6 + (p - 1.0) / p * n * 1e-10 +
                                    (p - 1) * ((n / p > S ? std::ceil(n / p / S) : 1) * 10e-6 + n / p * 1e-10);
        INFO("p=" << p << " bytes=" << bytes << " reduce=" << red);
        CHECK(m.rooted(algorithm::tree, bytes, p, red, 1 << 18) == doctest::Approx(tree).epsilon(1e-12));
        CHECK(m.rooted(algorithm::ring, bytes, p, red, 1 << 18) == doctest::Approx(chain).epsilon(1e-12));
        if (!red) CHECK(m.rooted(algorithm::scatter_allgather, bytes, p, red, 1 << 18) == doctest::Approx(sa).epsilon(1e-12));
        const double best = std::min({tree, chain, sa});
        const algorithm want = tree == best ? algorithm::tree : chain == best ? algorithm::ring : algorithm::scatter_allgather;
        CHECK(sel.choose_rooted(bytes, p, red, 1 << 18) == want);
      }
  // No other schedule is rooted: the model has no time for it.
  CHECK(m.rooted(algorithm::rd, 8, 4, false, 1 << 18) == std::numeric_limits<double>::infinity());
  CHECK(m.rooted(algorithm::direct, 8, 4, true, 1 << 18) == std::numeric_limits<double>::infinity());
  CHECK(m.rooted(algorithm::scatter_allgather, 8, 4, true, 1 << 18) == std::numeric_limits<double>::infinity());
  CHECK(m.rooted(algorithm::bruck, 8, 4, false, 1 << 18) == std::numeric_limits<double>::infinity());
}

TEST_CASE("select: direct broadcast and reduce (the arena) by hand, and chosen only with an arena") {
  cost_model m;
  m.local = {2e-6, 5e-10, 1.5e-10};
  m.arena.copy = 1.5e-10;
  m.arena.sync = 0.5e-6;
  const topology t{4, 4, 1, true}, no_arena{4, 4, 1, false};
  const double round = static_cast<double>(gradsync::policy::shm_rooted_round_bytes);
  // broadcast of 8 KiB: one round, a copy in and the overlapped copy out
  CHECK(m.rooted(algorithm::direct, 8192, t, false, 1 << 18) == doctest::Approx(0.5e-6 + 2 * 8192 * 1.5e-10));
  // 8 rounds and a half: 9 syncs, n plus the first round copied
  const double n = 8.5 * round;
  CHECK(m.rooted(algorithm::direct, static_cast<std::size_t>(n), t, false, 1 << 18) ==
        doctest::Approx(9 * 0.5e-6 + (n + round) * 1.5e-10));
  // reduce of 8 KiB: one round, the root reduces all four copies
  CHECK(m.rooted(algorithm::direct, 8192, t, true, 1 << 18) == doctest::Approx(0.5e-6 + 8192 * 1.5e-10 + 3 * 8192 * 1.5e-10));
  CHECK(m.rooted(algorithm::direct, 8192, no_arena, false, 1 << 18) == std::numeric_limits<double>::infinity());
  const selector sel(m);
  for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 20, std::size_t{64} << 20})
    for (bool red : {false, true}) {
      CHECK(sel.choose_rooted(bytes, t, red, 1 << 18) == algorithm::direct);
      CHECK(sel.choose_rooted(bytes, no_arena, red, 1 << 18) == sel.choose_rooted(bytes, 4, red, 1 << 18));
    }
  // a table entry naming a message schedule wins over the model
  const selector pinned(m, parse_algo_table("tree"));
  CHECK(pinned.choose_rooted(std::size_t{1} << 20, t, false, 1 << 18) == algorithm::tree);
}

TEST_CASE("select: the shared-memory arena allreduce (direct) by hand") {
  cost_model m;
  m.local.gamma = 1e-10;
  m.arena = {.copy = 2e-10, .sync = 1e-6, .half_bytes = 2 << 20, .round_bytes = 4 << 20};
  const topology t{4, 4, 1, true};
  // 8 KiB (<= policy::shm_direct_small_bytes): one sync, copy n in, reduce
  // all p copies: 1e-6 + 8192 * 2e-10 + 3 * 8192 * 1e-10 = 5.0960 us.
  CHECK(m.allreduce(algorithm::direct, 8192, t, 1 << 18) == doctest::Approx(5.096e-6).epsilon(1e-12));
  // 8 MiB: 4 rounds of 2 MiB, two syncs each; 2n copied; (p-1)/p n reduced:
  // 8e-6 + 2 * 8388608 * 2e-10 + 0.75 * 8388608 * 1e-10
  // = 8e-6 + 3355.4432e-6 + 629.1456e-6 = 3992.5888 us.
  CHECK(m.allreduce(algorithm::direct, 8 << 20, t, 1 << 18) == doctest::Approx(3992.5888e-6).epsilon(1e-12));
  // 16 KiB + 1: past the small path, one round.
  CHECK(m.direct(16385, 4) == doctest::Approx(2e-6 + 2 * 16385 * 2e-10 + 0.75 * 16385 * 1e-10).epsilon(1e-12));
  CHECK(m.direct(1 << 20, 1) == 0);
  // Rounds of round_bytes when that is below half an arena: 8 MiB in 16
  // rounds of 512 KiB adds 24 syncs to the 3992.5888 us above.
  cost_model r = m;
  r.arena.round_bytes = 512 << 10;
  CHECK(r.direct(8 << 20, 4) == doctest::Approx(3992.5888e-6 + 24e-6).epsilon(1e-12));
  // Without a shared arena direct does not apply, and is never chosen.
  const topology no_arena{4, 4, 1};
  CHECK(m.allreduce(algorithm::direct, 8192, no_arena, 1 << 18) == std::numeric_limits<double>::infinity());
  const selector sel(m);
  for (std::size_t b = 8; b < (std::size_t{1} << 30); b *= 8) CHECK(sel.choose(b, no_arena, 1 << 18) != algorithm::direct);
}

TEST_CASE("select: with a shared arena the model chooses direct where it is cheapest") {
  // Message costs local = global = {2 us, 1e-10, 1e-10} on 4 ranks, arena
  // {copy 2e-10, sync 1 us, halves of 2 MiB, rounds of 4 MiB (so 2 MiB)}.
  cost_model m;
  m.local = m.global = {2e-6, 1e-10, 1e-10};
  m.arena = {.copy = 2e-10, .sync = 1e-6, .half_bytes = 2 << 20, .round_bytes = 4 << 20};
  const selector sel(m);
  const topology t{4, 4, 1, true};
  const std::size_t seg = 1 << 18;
  // 8 KiB: direct 5.096 us (above); rd, the cheapest message schedule:
  // 2 steps of (2e-6 + 8192e-10) + 2 x 8192e-10 reduced = 7.2768 us.
  CHECK(m.allreduce(algorithm::rd, 8192, t, seg) == doctest::Approx(7.2768e-6).epsilon(1e-12));
  CHECK(sel.choose(8192, t, seg) == algorithm::direct);
  // 64 MiB: direct 32 rounds: 64e-6 + 2 n 2e-10 + 0.75 n 1e-10 = 31.9407 ms;
  // ring: 6 steps of 64 segments of 256 KiB: 768e-6 + 1.5 n 1e-10 + 0.75 n
  // 1e-10 = 15.8675 ms (rabenseifner's 4 unsegmented messages make it
  // cheaper still): not direct.
  const std::size_t big = std::size_t{64} << 20;
  CHECK(m.allreduce(algorithm::direct, big, t, seg) ==
        doctest::Approx(64e-6 + 2 * 67108864 * 2e-10 + 0.75 * 67108864 * 1e-10).epsilon(1e-12));
  CHECK(m.allreduce(algorithm::ring, big, t, seg) ==
        doctest::Approx(6 * 64 * 2e-6 + 1.5 * 67108864 * 1e-10 + 0.75 * 67108864 * 1e-10).epsilon(1e-12));
  CHECK(sel.choose(big, t, seg) != algorithm::direct);
  // The override table still wins, both ways.
  CHECK(selector(m, parse_algo_table("ring")).choose(8192, t, seg) == algorithm::ring);
  CHECK(selector(m, parse_algo_table("direct")).choose(big, t, seg) == algorithm::direct);
  // Over a grid the choice is the cheapest of every schedule, direct included,
  // direct's cost written out again here.
  auto direct_ref = [&](double n, int p) {
    if (n <= static_cast<double>(policy::shm_direct_small_bytes) && n <= m.arena.half_bytes) return 1e-6 + n * 2e-10 + (p - 1) * n * 1e-10;
    const double rounds = std::max(1.0, std::ceil(n / (2 << 20)));
    return 2 * rounds * 1e-6 + 2 * n * 2e-10 + (p - 1.0) / p * n * 1e-10;
  };
  const ref_model ref{{2e-6, 1e-10, 1e-10}, {2e-6, 1e-10, 1e-10}, static_cast<double>(seg)};
  int directs = 0, others = 0;
  for (int p : {2, 3, 4, 8})
    for (std::size_t bytes = 4; bytes <= (std::size_t{1} << 28); bytes *= 4) {
      const topology tp{p, p, 1, true};
      const auto n = static_cast<double>(bytes);
      double best = direct_ref(n, p);
      for (auto x : candidates) best = std::min(best, ref.cost(x, n, p, p, 1));
      const algorithm got = sel.choose(bytes, tp, seg);
      const double got_cost = got == algorithm::direct ? direct_ref(n, p) : ref.cost(got, n, p, p, 1);
      INFO("p=" << p << " bytes=" << bytes << " chose " << algorithm_name(got));
      CHECK(got_cost <= best * (1 + 1e-12));
      (got == algorithm::direct ? directs : others) += 1;
    }
  CHECK(directs > 0); // both answers occur on this grid
  CHECK(others > 0);
}

TEST_CASE("select: reduce-scatter and allgather choose direct, ring, bruck or rd by the model") {
  cost_model m;
  m.local = {2e-6, 1e-10, 1e-10};
  m.global = {20e-6, 1e-9, 1e-10};
  m.arena = {.copy = 2e-10, .sync = 1e-6, .half_bytes = 2 << 20, .round_bytes = 512 << 10};
  const selector sel(m);
  const topology t{4, 4, 1, true};
  const std::size_t seg = 1 << 18, big = std::size_t{64} << 20;
  // bytes: the whole reduce-scatter input / allgather output (4 blocks of b).
  // 8 KiB reduce-scatter (b = 2048): ring 3 (2e-6 + 2048 (1e-10 + 1e-10))
  // = 7.2288 us; rd (halving) 2 rounds of 1 and 2 blocks: 2 x 2e-6 + 3 x
  // 2048 x 2e-10 = 5.2288 us; bruck the same plus a local copy of the input,
  // 8192 x 2e-10: 6.8672 us; direct 1 round: 1e-6 + 8192 x 2e-10 + 0.75 x
  // 8192 x 1e-10 = 3.2528 us.
  CHECK(m.scatter_gather(algorithm::ring, 8192, t, true) == doctest::Approx(7.2288e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::rd, 8192, t, true) == doctest::Approx(5.2288e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::bruck, 8192, t, true) == doctest::Approx(6.8672e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::direct, 8192, t, true) == doctest::Approx(3.2528e-6).epsilon(1e-12));
  CHECK(sel.choose_reduce_scatter(8192, t, seg) == algorithm::direct);
  // 64 MiB (b = 16 Mi, 64 segments of 256 KiB): ring 3 (64 x 2e-6 + 16 Mi x
  // 2e-10) = 10.4503296 ms; rd the same: rounds of 64 and 128 segments;
  // bruck + 64 Mi x 2e-10 = 23.8721024 ms; direct 32 rounds of 2 MiB:
  // 32e-6 + 13.4217728e-3 + 5.0331648e-3 = 18.4869376 ms. The tie goes to
  // the ring (the earlier candidate).
  CHECK(m.scatter_gather(algorithm::ring, big, t, true) == doctest::Approx(10.4503296e-3).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::rd, big, t, true) == doctest::Approx(10.4503296e-3).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::bruck, big, t, true) == doctest::Approx(23.8721024e-3).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::direct, big, t, true) == doctest::Approx(18.4869376e-3).epsilon(1e-12));
  CHECK(sel.choose_reduce_scatter(big, t, seg) == algorithm::ring);
  // 8 KiB allgather: ring 3 (2e-6 + 2048e-10) = 6.6144 us; bruck and rd
  // both 2 rounds of 1 and 2 blocks: 4e-6 + 3 x 2048e-10 = 4.6144 us;
  // direct: stage one 2 KiB block in 1 round: 1e-6 + 8192 x 2e-10 = 2.6384 us.
  CHECK(m.scatter_gather(algorithm::ring, 8192, t, false) == doctest::Approx(6.6144e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::bruck, 8192, t, false) == doctest::Approx(4.6144e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::rd, 8192, t, false) == doctest::Approx(4.6144e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::direct, 8192, t, false) == doctest::Approx(2.6384e-6).epsilon(1e-12));
  CHECK(sel.choose_allgather(8192, t, seg) == algorithm::direct);
  // 64 MiB: ring 3 (64 x 2e-6 + 16 Mi x 1e-10) = 5.4171648 ms; bruck = rd =
  // 4e-6 + 48 Mi x 1e-10 = 5.0371648 ms; direct: blocks of 16 MiB in 8
  // rounds: 8e-6 + 13.4217728e-3 = 13.4297728 ms. The tie goes to bruck
  // (the earlier candidate).
  CHECK(m.scatter_gather(algorithm::ring, big, t, false) == doctest::Approx(5.4171648e-3).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::bruck, big, t, false) == doctest::Approx(5.0371648e-3).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::rd, big, t, false) == doctest::Approx(5.0371648e-3).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::direct, big, t, false) == doctest::Approx(13.4297728e-3).epsilon(1e-12));
  CHECK(sel.choose_allgather(big, t, seg) == algorithm::bruck);
  // Several groups: the ring is a chain, one hop in 2 leaving the group:
  // alpha (2e-6 + 20e-6) / 2 = 11 us per step, the slower link's beta
  // max(1e-10, 1e-9) per byte. 8 KiB allgather on 2 groups of 2:
  // 3 (11e-6 + 2048 x 1e-9) = 39.144 us; reduce-scatter adds the local
  // gamma: 3 (11e-6 + 2048 x 1.1e-9) = 39.7584 us.
  const topology grouped{4, 2, 2, true};
  CHECK(m.scatter_gather(algorithm::ring, 8192, grouped, false) == doctest::Approx(39.144e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::ring, 8192, grouped, true) == doctest::Approx(39.7584e-6).epsilon(1e-12));
  // Groups of 8 (16 ranks), local alpha 1 us, global 40 us: the chain's hop
  // averages (7 x 1 + 40) / 8 = 5.875 us, but the one crossing hop carries
  // a message every step, its 40 us over the 4 receives in flight: 10 us.
  // Allgather of 16 x 2 KiB: 15 (10e-6 + 2048 x 1e-9) = 180.72 us. Blocks
  // of 2 bytes, half of them empty, pay half the difference: 15 (5.877 +
  // 0.5 (10.002 - 5.877)) us = 119.0925 us.
  cost_model wide;
  wide.local = {1e-6, 1e-10, 1e-10};
  wide.global = {40e-6, 1e-9, 1e-10};
  const topology sixteen{16, 8, 2};
  CHECK(wide.scatter_gather(algorithm::ring, 16 * 2048, sixteen, false) == doctest::Approx(180.72e-6).epsilon(1e-12));
  CHECK(wide.scatter_gather(algorithm::ring, 32, sixteen, false) == doctest::Approx(119.0925e-6).epsilon(1e-12));
  // No arena: direct costs infinity, as does anything not a gather
  // schedule; one rank: nothing to do.
  const topology no_arena{4, 4, 1};
  CHECK(m.scatter_gather(algorithm::direct, 8192, no_arena, true) == std::numeric_limits<double>::infinity());
  CHECK(m.scatter_gather(algorithm::tree, 8192, t, true) == std::numeric_limits<double>::infinity());
  CHECK(m.scatter_gather(algorithm::ring, 8192, topology{1, 1, 1, true}, true) == 0);
  // Without an arena on 4 ranks: rd's 2 rounds move what the ring's 3 do
  // (3 blocks); reduce-scatter: bruck adds a copy of the input, rd wins
  // while a block fits one segment, above it sends as many segments as the
  // ring (3 blocks' worth) and the tie goes to the ring; allgather (whole
  // ranges, no segments): bruck and rd cost the same, bruck.
  for (std::size_t b = 8; b <= big; b *= 8) {
    CHECK(sel.choose_reduce_scatter(b, no_arena, seg) == (b / 4 > seg ? algorithm::ring : algorithm::rd));
    CHECK(sel.choose_allgather(b, no_arena, seg) == algorithm::bruck);
  }
  // The table wins when it names ring, bruck, rd or (with an arena) direct;
  // other names fall to the model.
  CHECK(selector(m, parse_algo_table("ring")).choose_reduce_scatter(8192, t, seg) == algorithm::ring);
  CHECK(selector(m, parse_algo_table("direct")).choose_allgather(big, t, seg) == algorithm::direct);
  CHECK(selector(m, parse_algo_table("rd")).choose_allgather(8192, t, seg) == algorithm::rd);
  CHECK(selector(m, parse_algo_table("bruck")).choose_reduce_scatter(8192, t, seg) == algorithm::bruck);
  CHECK(selector(m, parse_algo_table("tree")).choose_allgather(8192, t, seg) == algorithm::direct);
  CHECK(selector(m, parse_algo_table("direct")).choose_allgather(8192, no_arena, seg) == algorithm::bruck);
}

TEST_CASE("select: bruck and rd allgather and reduce-scatter by hand on one group") {
  // One group, link {1 us, 1e-9, 5e-10}, arena copy 2e-10; n = 24000 bytes.
  cost_model m;
  m.local = {1e-6, 1e-9, 5e-10};
  m.global = {50e-6, 1e-8, 1e-9}; // unused on one group
  m.arena.copy = 2e-10;
  const selector sel(m);
  const std::size_t n = 24000, seg = 1 << 18;
  const topology t8{8, 8, 1}, t6{6, 6, 1};
  // p = 8, blocks of b = 3000:
  //  bruck allgather: rounds d = 1, 2, 4 of 1, 2, 4 blocks:
  //    3 x 1e-6 + 7 x 3000 x 1e-9 = 3e-6 + 21e-6 = 24 us;
  //  rd allgather: rounds d = 1, 2, 4 of d blocks of n/8: the same, 24 us;
  //  ring allgather: 7 (1e-6 + 3e-6) = 28 us;
  //  bruck reduce-scatter: halvings 8 -> 4 -> 2 -> 1 sending 4, 2, 1 blocks
  //    and reducing them, plus the copy of the input:
  //    3e-6 + 7 x 3000 x 1.5e-9 + 24000 x 2e-10 = 3e-6 + 31.5e-6 + 4.8e-6 = 39.3 us;
  //  rd reduce-scatter (halving): 3e-6 + 7 x 3000 x 1.5e-9 = 34.5 us;
  //  ring reduce-scatter: 7 (1e-6 + 3000 x 1.5e-9) = 38.5 us.
  CHECK(m.scatter_gather(algorithm::bruck, n, t8, false) == doctest::Approx(24e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::rd, n, t8, false) == doctest::Approx(24e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::ring, n, t8, false) == doctest::Approx(28e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::bruck, n, t8, true) == doctest::Approx(39.3e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::rd, n, t8, true) == doctest::Approx(34.5e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::ring, n, t8, true) == doctest::Approx(38.5e-6).epsilon(1e-12));
  CHECK(sel.choose_allgather(n, t8, seg) == algorithm::bruck); // tie with rd: the earlier
  CHECK(sel.choose_reduce_scatter(n, t8, seg) == algorithm::rd);
  // p = 6, blocks of b = 4000:
  //  bruck allgather: d = 1, 2, 4 send min(d, 6 - d) = 1, 2, 2 blocks:
  //    3e-6 + 5 x 4000 x 1e-9 = 23 us;
  //  rd allgather over the 4 survivors (shares of 6000): d = 1, 2:
  //    2e-6 + 3 x 6000 x 1e-9 = 20 us, plus the fold: a block in (1e-6 +
  //    4e-6) and the other 20000 bytes back (1e-6 + 20e-6): 46 us;
  //  ring allgather: 5 (1e-6 + 4e-6) = 25 us;
  //  bruck reduce-scatter: halvings 6 -> 3 -> 2 -> 1 sending 3, 1, 1 blocks:
  //    3e-6 + 5 x 4000 x 1.5e-9 + 4.8e-6 = 37.8 us;
  //  rd reduce-scatter: the fold sends all n in (1e-6 + 24e-6), reduces it
  //    (12e-6) and returns a block (1e-6 + 4e-6): 42 us; the halving rounds
  //    (1e-6 + 6000 x 1.5e-9) + (1e-6 + 12000 x 1.5e-9) = 29 us: 71 us;
  //  ring reduce-scatter: 5 (1e-6 + 4000 x 1.5e-9) = 35 us.
  CHECK(m.scatter_gather(algorithm::bruck, n, t6, false) == doctest::Approx(23e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::rd, n, t6, false) == doctest::Approx(46e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::ring, n, t6, false) == doctest::Approx(25e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::bruck, n, t6, true) == doctest::Approx(37.8e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::rd, n, t6, true) == doctest::Approx(71e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::ring, n, t6, true) == doctest::Approx(35e-6).epsilon(1e-12));
  CHECK(sel.choose_allgather(n, t6, seg) == algorithm::bruck);
  CHECK(sel.choose_reduce_scatter(n, t6, seg) == algorithm::ring);
  // no such gather schedule
  CHECK(m.scatter_gather(algorithm::scatter_allgather, n, t8, false) == std::numeric_limits<double>::infinity());
  CHECK(m.scatter_gather(algorithm::pairwise, n, t8, true) == std::numeric_limits<double>::infinity());
}

TEST_CASE("select: scatter-allgather broadcast by hand, and chosen for large broadcasts on many ranks") {
  // One group, link {1 us, 1e-9, 5e-10}, n = 24000, segments of 256 KiB.
  cost_model m;
  m.local = {1e-6, 1e-9, 5e-10};
  const std::size_t n = 24000, seg = 1 << 18;
  // p = 8 (b = 3000): the root sends 4, then 2, then 1 blocks (3 rounds,
  // 7 blocks): 3e-6 + 21e-6 = 24 us; the ring allgather 7 (1e-6 + 3e-6) =
  // 28 us: 52 us. The tree: 3 (1e-6 + 24e-6) = 75 us; the chain (one
  // segment): 7 (1e-6 + 24e-6) = 175 us.
  CHECK(m.rooted(algorithm::scatter_allgather, n, 8, false, seg) == doctest::Approx(52e-6).epsilon(1e-12));
  CHECK(m.rooted(algorithm::tree, n, 8, false, seg) == doctest::Approx(75e-6).epsilon(1e-12));
  CHECK(m.rooted(algorithm::ring, n, 8, false, seg) == doctest::Approx(175e-6).epsilon(1e-12));
  CHECK(selector(m).choose_rooted(n, 8, false, seg) == algorithm::scatter_allgather);
  // p = 6 (b = 4000): rounds of the subtrees 4 (min(4, 2) = 2 blocks), 2
  // (2 blocks), 1 (1 block): 3e-6 + 5 x 4e-6 = 23 us; ring allgather
  // 5 (1e-6 + 4e-6) = 25 us: 48 us.
  CHECK(m.rooted(algorithm::scatter_allgather, n, 6, false, seg) == doctest::Approx(48e-6).epsilon(1e-12));
  // only a broadcast: no reduce by scatter-allgather
  CHECK(m.rooted(algorithm::scatter_allgather, n, 8, true, seg) == std::numeric_limits<double>::infinity());
  // p = 1: nothing to do
  CHECK(m.rooted(algorithm::scatter_allgather, n, 1, false, seg) == 0);

  // 64 ranks, link {5 us, 1e-10, 1e-10}, segments S = 256 KiB.
  cost_model w;
  w.local = {5e-6, 1e-10, 1e-10};
  const selector sel(w);
  const topology t{64, 64, 1};
  const std::size_t big = std::size_t{4} << 20; // 4 MiB: k = 16 segments
  // broadcast of 4 MiB:
  //  tree: 16 segments of 6 rounds: 96 x 5e-6 + 6 x 4 Mi x 1e-10 = 480e-6 + 2516.5824e-6 = 2996.5824 us;
  //  chain: (62 + 16)(5e-6 + 256 Ki x 1e-10) = 78 x 31.2144e-6 = 2434.7232 us;
  //  scatter_allgather (b = 64 KiB): 6 x 5e-6 + 63 x 6.5536e-6 = 442.8768 us
  //    + 63 (5e-6 + 6.5536e-6) = 727.8768 us: 1170.7536 us.
  CHECK(w.rooted(algorithm::tree, big, t, false, seg) == doctest::Approx(2996.5824e-6).epsilon(1e-12));
  CHECK(w.rooted(algorithm::ring, big, t, false, seg) == doctest::Approx(2434.7232e-6).epsilon(1e-12));
  CHECK(w.rooted(algorithm::scatter_allgather, big, t, false, seg) == doctest::Approx(1170.7536e-6).epsilon(1e-12));
  CHECK(sel.choose_rooted(big, t, false, seg) == algorithm::scatter_allgather);
  // reduce of 4 MiB (gamma too; the tree's 16 segments each pay 6 alphas):
  // tree 16 x 6 x 5e-6 + 2516.5824 + 2516.5824 = 5513.1648 us; chain 78
  // (5e-6 + 256 Ki x 2e-10) = 4479.4464 us: the chain.
  CHECK(w.rooted(algorithm::tree, big, t, true, seg) == doctest::Approx(5513.1648e-6).epsilon(1e-12));
  CHECK(w.rooted(algorithm::ring, big, t, true, seg) == doctest::Approx(4479.4464e-6).epsilon(1e-12));
  CHECK(sel.choose_rooted(big, t, true, seg) == algorithm::ring);
  // broadcast of 8 B: the tree's 6 alphas (30.0048 us) beat the chain's 63
  // and scatter-allgather's 69.
  CHECK(w.rooted(algorithm::tree, 8, t, false, seg) == doctest::Approx(30.0048e-6).epsilon(1e-12));
  CHECK(sel.choose_rooted(8, t, false, seg) == algorithm::tree);
}

TEST_CASE("select: two-level rd and rabenseifner allreduce: the shared NIC slows only the rounds between groups") {
  // 64 ranks in 8 groups of 8; local {1 us, 1e-10, 1e-10}, global {10 us,
  // 1e-9, 3e-10} (the reduction runs on the local kernel: gamma 1e-10);
  // n = 1 MiB.
  cost_model m;
  m.local = {1e-6, 1e-10, 1e-10};
  m.global = {10e-6, 1e-9, 3e-10};
  const topology t{64, 8, 8};
  const std::size_t n = 1 << 20, seg = 1 << 18;
  // The helpers: exchanges with r XOR d cross for d >= 8 (all 8 ranks of a
  // group), sends to r + d cross for min(d, 8) ranks of a group.
  CHECK(cost_model::crossing(t, 4, false) == 0);
  CHECK(cost_model::crossing(t, 8, false) == 8);
  CHECK(cost_model::crossing(t, 32, false) == 8);
  CHECK(cost_model::crossing(t, 3, true) == 3);
  CHECK(cost_model::crossing(t, 16, true) == 8);
  CHECK(cost_model::crossing(topology{8, 8, 1}, 4, true) == 0);
  // rd: 6 rounds of all n, each in 4 segments of s = 256 KiB (alpha each:
  // no latency overlaps). d = 1, 2, 4 inside the groups: 3 x 4 (1e-6 + s x
  // 1e-10) = 326.5728 us; d = 8, 16, 32 between groups, all 8 ranks at
  // once; the reduction 6 x 1 Mi x 1e-10 = 629.1456 us.
  //  nic_share 1: 3 x 4 (10e-6 + s x 1e-9) = 3265.728 us: 4221.4464 us;
  //  nic_share 8: 3 x 4 (10e-6 + 8 s x 1e-9) = 25285.824 us: 26241.5424 us;
  //  nic_share 3: 3 x 4 (10e-6 + 3 s x 1e-9) = 9557.184 us: 10512.9024 us.
  m.nic_share = 1;
  CHECK(m.allreduce(algorithm::rd, n, t, seg) == doctest::Approx(4221.4464e-6).epsilon(1e-12));
  m.nic_share = 8;
  CHECK(m.allreduce(algorithm::rd, n, t, seg) == doctest::Approx(26241.5424e-6).epsilon(1e-12));
  CHECK(m.contention(t, 8) == 8);
  CHECK(m.contention(t, 4) == 4);
  CHECK(m.contention(t, 0) == 1);
  m.nic_share = 3;
  CHECK(m.allreduce(algorithm::rd, n, t, seg) == doctest::Approx(10512.9024e-6).epsilon(1e-12));
  CHECK(m.contention(t, 8) == 3);
  // rabenseifner: rounds d of n d/64 bytes, twice (halving, doubling).
  // Inside: 2 (3 x 1e-6 + 7/64 Mi x 1e-10) = 6e-6 + 22.9376e-6 = 28.9376 us;
  // between (d = 8, 16, 32: 56/64 Mi; d = 32's 512 KiB halving in 2
  // segments, one alpha more; the doubling's copies go whole):
  //  nic_share 1: 70e-6 + 2 x 917504 x 1e-9 = 1905.008 us;
  //  nic_share 8: 70e-6 + 2 x 8 x 917504 x 1e-9 = 14750.064 us;
  // reduction 63/64 Mi x 1e-10 = 103.2192 us.
  // Totals 2037.1648 us and 14882.2208 us.
  m.nic_share = 1;
  CHECK(m.allreduce(algorithm::rabenseifner, n, t, seg) == doctest::Approx(2037.1648e-6).epsilon(1e-12));
  m.nic_share = 8;
  CHECK(m.allreduce(algorithm::rabenseifner, n, t, seg) == doctest::Approx(14882.2208e-6).epsilon(1e-12));
  // nic_share above the group size is clamped to it: the same as 8.
  m.nic_share = 32;
  CHECK(m.allreduce(algorithm::rd, n, t, seg) == doctest::Approx(26241.5424e-6).epsilon(1e-12));
  // One group: no crossing, rd is 6 x 4 (1e-6 + s x 1e-10) + 629.1456 us =
  // 653.1456 + 629.1456 = 1282.2912 us whatever nic_share.
  CHECK(m.allreduce(algorithm::rd, n, topology{64, 64, 1}, seg) == doctest::Approx(1282.2912e-6).epsilon(1e-12));
}

TEST_CASE("select: dbtree by hand: the first segment level by level, then full stages sharing the NIC") {
  const std::size_t n = 1 << 20, seg = 1 << 18; // k = ceil(n / 2 / seg) = 2 segments of s = 256 Ki
  // One group of 8 (h = 3), link {1 us, 1e-9, 5e-10}: three levels of
  // 2 alpha + 3 s beta + 2 s gamma = 2 + 786.432 + 262.144 = 1050.576 us,
  // then one stage of alpha + 4 s beta + 2 s gamma = 1311.72 us: 4463.448 us.
  CHECK(cost_model::flat(algorithm::dbtree, static_cast<double>(n), 8, {1e-6, 1e-9, 5e-10}, static_cast<double>(seg)) ==
        doctest::Approx(4463.448e-6).epsilon(1e-12));
  // 16 ranks in 4 groups of 4 (h = 4), local {1 us, 1e-10, 1e-10}, global
  // {10 us, 1e-9, 3e-10}, gamma the local one. The path 0-1-3-7-15 leaves
  // group 0 at levels 3 and 4. Levels 1, 2 on the local link: 2 + 3 s 1e-10
  // + 2 s 1e-10 = 133.072 us each. Levels 3, 4 on the global link,
  // 2 alpha + s beta (up + 2 down) + 2 s gamma, up/down the senders sharing
  // a link (at most nic_share): 2^d children, 2^(d-1) parents.
  //  nic_share 4: (up, down) = (4, 4) at both: 20 + 12 s 1e-9 + 52.4288 =
  //  3218.1568 us each: fill 6702.4576 us; the stage with 4 ranks a group
  //  crossing: 10 + 4 s 4e-9 + 2 s 1e-10 = 4256.7328 us: 10959.1904 us.
  //  nic_share 1: 20 + 3 s 1e-9 + 52.4288 = 858.8608 us each: fill
  //  1983.8656 us; the stage 1111.0048 us: 3094.8704 us.
  cost_model m;
  m.local = {1e-6, 1e-10, 1e-10};
  m.global = {10e-6, 1e-9, 3e-10};
  const topology t{16, 4, 4};
  m.nic_share = 4;
  CHECK(m.allreduce(algorithm::dbtree, n, t, seg) == doctest::Approx(10959.1904e-6).epsilon(1e-12));
  m.nic_share = 1;
  CHECK(m.allreduce(algorithm::dbtree, n, t, seg) == doctest::Approx(3094.8704e-6).epsilon(1e-12));
}

TEST_CASE("select: the chain broadcast and reduce on several groups by hand") {
  // 16 ranks in 4 groups of 4, local {1 us, 1e-10, 1e-10}, global {10 us,
  // 1e-9, 3e-10}; n = 1 MiB in k = 4 segments of s = 256 Ki.
  // Per hop of the fill: alpha (3 x 1e-6 + 10e-6) / 4 = 3.25 us; the
  // filling segment's beta averaged over the hops (3 x 1e-10 + 1e-9) / 4 =
  // 3.25e-10. 16 ranks > 2 x 4 segments: one send in flight, so each
  // segment then leaves at the slowest hop's whole message, 10 us + s 1e-9.
  // Broadcast: 14 (3.25e-6 + s 3.25e-10) + 4 (10e-6 + s 1e-9)
  //   = 14 x 88.4468e-6 + 4 x 272.144e-6 = 1238.2552 + 1088.576 = 2326.8312 us.
  // Reduce (local gamma 1e-10 per hop and segment): 14 (3.25e-6 + s 4.25e-10)
  //   + 4 (10e-6 + s 1.1e-9) = 1605.2568 + 1193.4336 = 2798.6904 us.
  cost_model m;
  m.local = {1e-6, 1e-10, 1e-10};
  m.global = {10e-6, 1e-9, 3e-10};
  const topology t{16, 4, 4};
  const std::size_t n = 1 << 20, seg = 1 << 18;
  CHECK(m.chain_alpha(t, 4096) == doctest::Approx(3.25e-6).epsilon(1e-12));
  CHECK(m.hop_beta(t) == doctest::Approx(3.25e-10).epsilon(1e-12));
  CHECK(m.chain_beta(t) == doctest::Approx(1e-9).epsilon(1e-12));
  CHECK(m.rooted(algorithm::ring, n, t, false, seg) == doctest::Approx(2326.8312e-6).epsilon(1e-12));
  CHECK(m.rooted(algorithm::ring, n, t, true, seg) == doctest::Approx(2798.6904e-6).epsilon(1e-12));
  // One crossing message per group at a time: the shared NIC does not enter.
  m.nic_share = 4;
  CHECK(m.rooted(algorithm::ring, n, t, false, seg) == doctest::Approx(2326.8312e-6).epsilon(1e-12));
  // 4 MiB: k = 16 segments, 16 ranks <= 2 x 16: four sends in flight. The
  // first four segments cross each group's link together, so each hop of
  // the fill adds 3 s 1e-9 / 4 = 196.608 us: 14 (88.4468 + 196.608) =
  // 3990.7672 us; the stream hides the latencies at the averaged hop:
  // 16 (3.25e-6 + s 1e-9) = 16 x 265.394 = 4246.304 us.
  CHECK(m.rooted(algorithm::ring, 4 * n, t, false, seg) == doctest::Approx(8237.0712e-6).epsilon(1e-12));
  // One group, one send in flight (1 MiB): the textbook chain, (14 + 4)
  // (1e-6 + s 1e-10) = 18 x 27.2144e-6 = 489.8592 us.
  CHECK(m.rooted(algorithm::ring, n, 16, false, seg) == doctest::Approx(489.8592e-6).epsilon(1e-12));
  // Four in flight (4 MiB): each hop of the fill carries four segments,
  // 14 (1e-6 + 4 s 1e-10) = 14 x 105.8576 = 1482.0064 us, then 16 segments
  // of a whole message each (no latency overlaps: link_cost::latency 0),
  // 16 x 27.2144 = 435.4304 us: 1917.4368 us.
  CHECK(m.rooted(algorithm::ring, 4 * n, 16, false, seg) == doctest::Approx(1917.4368e-6).epsilon(1e-12));
  // All of alpha overlaps (latency = alpha, as calibrated under SMPI): a
  // segment of the stream holds one of the four places in flight for its
  // message and the other three's bytes (the link shares: inflight_share
  // 1), max(s 1e-10, (27.2144 + 3 x 26.2144) / 4) = 26.4644 us:
  // 1482.0064 + 423.4304 = 1905.4368 us.
  m.local.latency = 1e-6;
  CHECK(m.rooted(algorithm::ring, 4 * n, 16, false, seg) == doctest::Approx(1905.4368e-6).epsilon(1e-12));
  // A latency of 100 us that four in flight cannot cover: (126.2144 +
  // 78.6432) / 4 = 51.2144 us a segment; the fill 14 (100 + 104.8576) =
  // 2868.0064 us: 3687.4368 us.
  m.local.alpha = m.local.latency = 100e-6;
  CHECK(m.rooted(algorithm::ring, 4 * n, 16, false, seg) == doctest::Approx(3687.4368e-6).epsilon(1e-12));
  // The same link where segments in flight do not share it (a FATPIPE):
  // the fill's hops carry one segment's bytes, 14 x 126.2144 = 1767.0016
  // us, and the stream a message over four, 16 x 31.5536 = 504.8576 us:
  // 2271.8592 us.
  m.local.inflight_share = 0;
  CHECK(m.rooted(algorithm::ring, 4 * n, 16, false, seg) == doctest::Approx(2271.8592e-6).epsilon(1e-12));
  // Groups of one rank: every hop crosses, the same form on the global
  // link: 14 (10e-6 + 4 s 1e-9) + 16 (10e-6 + s 1e-9) = 14820.064 +
  // 4354.304 = 19174.368 us.
  CHECK(m.rooted(algorithm::ring, 4 * n, topology{16, 1, 16}, false, seg) == doctest::Approx(19174.368e-6).epsilon(1e-12));
}

TEST_CASE("select: allgather and reduce-scatter on many ranks: bruck or rd small, ring large") {
  const std::size_t seg = 1 << 18, big = std::size_t{64} << 20;
  // One group of 48, link {1 us, 1e-10, 1e-10}, arena copy 1e-10.
  cost_model one;
  one.local = {1e-6, 1e-10, 1e-10};
  one.arena.copy = 1e-10;
  const topology t48{48, 48, 1};
  // 384 B (blocks of 8):
  //  bruck allgather: d = 1 .. 32: 1 + 2 + 4 + 8 + 16 + 16 = 47 blocks:
  //    6e-6 + 376 x 1e-10 = 6.0376 us;
  //  rd allgather: 5 rounds over 32 survivors (shares of 12: 372 B) and the
  //    fold (8 B in, 376 B back): 7e-6 + 756e-10 = 7.0756 us;
  //  ring allgather: 47 (1e-6 + 8e-10) = 47.0376 us;
  //  bruck reduce-scatter: halvings 48, 24, 12, 6, 3, 2 sending 24, 12, 6,
  //    3, 1, 1 = 47 blocks: 6e-6 + 376 x 2e-10 + 384 x 1e-10 = 6.1136 us;
  //  rd reduce-scatter: 7e-6 + 372 x 2e-10 + (384 + 384 + 8) x 1e-10 = 7.152 us;
  //  ring reduce-scatter: 47 (1e-6 + 16e-10) = 47.0752 us.
  CHECK(one.scatter_gather(algorithm::bruck, 384, t48, false) == doctest::Approx(6.0376e-6).epsilon(1e-12));
  CHECK(one.scatter_gather(algorithm::rd, 384, t48, false) == doctest::Approx(7.0756e-6).epsilon(1e-12));
  CHECK(one.scatter_gather(algorithm::ring, 384, t48, false) == doctest::Approx(47.0376e-6).epsilon(1e-12));
  CHECK(one.scatter_gather(algorithm::bruck, 384, t48, true) == doctest::Approx(6.1136e-6).epsilon(1e-12));
  CHECK(one.scatter_gather(algorithm::rd, 384, t48, true) == doctest::Approx(7.152e-6).epsilon(1e-12));
  CHECK(one.scatter_gather(algorithm::ring, 384, t48, true) == doctest::Approx(47.0752e-6).epsilon(1e-12));
  const selector s48(one);
  CHECK(s48.choose_allgather(384, t48, seg) == algorithm::bruck);
  CHECK(s48.choose_reduce_scatter(384, t48, seg) == algorithm::bruck);
  // 64 MiB reduce-scatter: ring 47 steps of 6 segments (blocks of 1.33 MiB
  // over 256 KiB), 282e-6 + 47/48 n x 2e-10 = 13424.1525 us; bruck's 6
  // rounds send 24, 12, 6, 3, 1, 1 blocks, in 128 + 64 + 32 + 16 + 6 + 6
  // segments: 252e-6 + 47/48 n x 2e-10 + n x 1e-10 = 20105.0389 us (and
  // the copy of the input): the ring. Allgather: bruck
  // moves the ring's 47 blocks in 6 rounds, 6e-6 + 47/48 n 1e-10 =
  // 6577.0763 us against 6853.0763 us: bruck at every size on one group.
  const double N = static_cast<double>(big);
  CHECK(one.scatter_gather(algorithm::ring, big, t48, true) == doctest::Approx(282e-6 + 47.0 / 48 * N * 2e-10).epsilon(1e-12));
  CHECK(one.scatter_gather(algorithm::bruck, big, t48, true) ==
        doctest::Approx(252e-6 + 47.0 / 48 * N * 2e-10 + N * 1e-10).epsilon(1e-12));
  CHECK(s48.choose_reduce_scatter(big, t48, seg) == algorithm::ring);
  CHECK(one.scatter_gather(algorithm::bruck, big, t48, false) == doctest::Approx(6e-6 + 47.0 / 48 * N * 1e-10).epsilon(1e-12));
  CHECK(s48.choose_allgather(big, t48, seg) == algorithm::bruck);

  // 64 ranks in 8 groups of 8, one NIC per group (nic_share 8); local
  // {1 us, 1e-10, 1e-10}, a latency-heavy global link {20 us, 1e-9, 1e-10}.
  cost_model two;
  two.local = {1e-6, 1e-10, 1e-10};
  two.global = {20e-6, 1e-9, 1e-10};
  two.arena.copy = 1e-10;
  two.nic_share = 8;
  const topology t{64, 8, 8};
  // 512 B (blocks of 8), allgather:
  //  ring: 63 steps, each the chain's alpha (7 x 1e-6 + 20e-6) / 8 =
  //    3.375 us and 8 B at 1e-9 (3.383 us), but at least the crossing hop's
  //    pace, 20e-6 / 4 receives in flight + 8e-9 = 5.008 us: 315.504 us;
  //  bruck: every round d sends d blocks to r + d, min(d, 8) ranks a group
  //    crossing: sum over d of 20e-6 + 8 d x 1e-9 x min(d, 8) =
  //    120e-6 + (8 + 32 + 128 + 512 + 1024 + 2048) x 1e-9 = 123.752 us;
  //  rd: d = 1, 2, 4 inside: 3e-6 + 56 x 1e-10 = 3.0056 us; d = 8, 16, 32
  //    all 8 crossing: 60e-6 + (64 + 128 + 256) x 8e-9 = 63.584 us: 66.5896 us.
  // Reduce-scatter: the same plus the local gamma on the blocks reduced:
  //  ring 63 (5.008e-6 + 8 x 1e-10) = 315.5544 us; bruck 123.752 us + 504
  //  x 1e-10 + the copy 512 x 1e-10 = 123.8536 us; rd 66.5896 + 504 x
  //  1e-10 = 66.64 us.
  CHECK(two.scatter_gather(algorithm::ring, 512, t, false) == doctest::Approx(315.504e-6).epsilon(1e-12));
  CHECK(two.scatter_gather(algorithm::bruck, 512, t, false) == doctest::Approx(123.752e-6).epsilon(1e-12));
  CHECK(two.scatter_gather(algorithm::rd, 512, t, false) == doctest::Approx(66.5896e-6).epsilon(1e-12));
  CHECK(two.scatter_gather(algorithm::ring, 512, t, true) == doctest::Approx(315.5544e-6).epsilon(1e-12));
  CHECK(two.scatter_gather(algorithm::bruck, 512, t, true) == doctest::Approx(123.8536e-6).epsilon(1e-12));
  CHECK(two.scatter_gather(algorithm::rd, 512, t, true) == doctest::Approx(66.64e-6).epsilon(1e-12));
  const selector sel(two);
  CHECK(sel.choose_allgather(512, t, seg) == algorithm::rd);
  CHECK(sel.choose_reduce_scatter(512, t, seg) == algorithm::rd);
  // 64 MiB (blocks of 1 MiB: 4 segments of 256 KiB, all 4 in flight): a
  // ring step streams them at the crossing hop's pace, each segment
  // max(20e-6 + 256 Ki x 1e-9, (20e-6 + 4 x 256 Ki x 1e-9) / 4) = 282.144
  // us: allgather 63 x 4 x 282.144e-6 = 71100.288 us, reduce-scatter 63 (4
  // x 282.144e-6 + 1 Mi x 1e-10) = 77706.3168 us; bruck's and rd's round
  // d = 32 alone moves 32 MiB with 8 ranks sharing the NIC: 32 Mi x 8e-9 =
  // 268435.456 us: the ring.
  CHECK(two.scatter_gather(algorithm::ring, big, t, false) == doctest::Approx(71100.288e-6).epsilon(1e-12));
  CHECK(two.scatter_gather(algorithm::ring, big, t, true) == doctest::Approx(77706.3168e-6).epsilon(1e-12));
  CHECK(two.scatter_gather(algorithm::rd, big, t, false) > 268435.456e-6);
  CHECK(two.scatter_gather(algorithm::bruck, big, t, false) > 268435.456e-6);
  CHECK(two.scatter_gather(algorithm::bruck, big, t, true) > 268435.456e-6);
  CHECK(sel.choose_allgather(big, t, seg) == algorithm::ring);
  CHECK(sel.choose_reduce_scatter(big, t, seg) == algorithm::ring);
  // With a NIC per rank (nic_share 1) rd's rounds between groups move 56
  // MiB at 1e-9: 3e-6 + 7 Mi x 1e-10 + 60e-6 + 56 Mi x 1e-9 = 3e-6 +
  // 734.0032e-6 + 60e-6 + 58720.256e-6 = 59517.2592 us, below the ring's
  // 71100.288 us: rd.
  two.nic_share = 1;
  CHECK(two.scatter_gather(algorithm::rd, big, t, false) == doctest::Approx(59517.2592e-6).epsilon(1e-12));
  CHECK(selector(two).choose_allgather(big, t, seg) == algorithm::rd);
}

TEST_CASE("select: table entries naming gather and broadcast schedules") {
  // The model of the case above (64 ranks, 8 groups sharing a NIC), where
  // the model picks the ring for 64 MiB gathers and the tree for 8 B.
  cost_model m;
  m.local = {1e-6, 1e-10, 1e-10};
  m.global = {20e-6, 1e-9, 1e-10};
  m.arena.copy = 1e-10;
  m.nic_share = 8;
  const topology t{64, 8, 8};
  const std::size_t seg = 1 << 18, big = std::size_t{64} << 20;
  const selector model(m);
  REQUIRE(model.choose_allgather(big, t, seg) == algorithm::ring);
  // "bruck": honoured by allgather, reduce-scatter and (equal blocks)
  // alltoall; allreduce, hier's inner step and broadcast keep the model.
  const selector bruck(m, parse_algo_table("bruck"));
  CHECK(bruck.choose_allgather(big, t, seg) == algorithm::bruck);
  CHECK(bruck.choose_reduce_scatter(big, t, seg) == algorithm::bruck);
  CHECK(bruck.choose_alltoall(1024, t, true) == algorithm::bruck);
  CHECK(bruck.choose_alltoall(1024, t, false) == model.choose_alltoall(1024, t, false));
  for (std::size_t b : {std::size_t{8}, std::size_t{1} << 20, big}) {
    CHECK(bruck.choose(b, t, seg) == model.cheapest(b, t, seg));
    CHECK(bruck.choose_inner(b, 8, seg, 8) == model.choose_inner(b, 8, seg, 8));
    CHECK(bruck.choose_rooted(b, t, false, seg) == model.choose_rooted(b, t, false, seg));
  }
  // A size range: bruck up to 1 KiB, rd above.
  const selector ranged(m, parse_algo_table("bruck:0-1K;rd:1K-max"));
  CHECK(ranged.choose_allgather(512, t, seg) == algorithm::bruck);
  CHECK(ranged.choose_allgather(big, t, seg) == algorithm::rd);
  CHECK(ranged.choose_reduce_scatter(big, t, seg) == algorithm::rd);
  // "scatter_allgather": broadcasts only; a reduce, allreduce and the
  // gathers keep the model.
  const selector sa(m, parse_algo_table("scatter_allgather"));
  REQUIRE(model.choose_rooted(8, t, false, seg) != algorithm::scatter_allgather);
  CHECK(sa.choose_rooted(8, t, false, seg) == algorithm::scatter_allgather);
  CHECK(sa.choose_rooted(8, 4, false, seg) == algorithm::scatter_allgather);
  CHECK(sa.choose_rooted(8, t, true, seg) == model.choose_rooted(8, t, true, seg));
  CHECK(sa.choose(8, t, seg) == model.cheapest(8, t, seg));
  CHECK(sa.choose_allgather(big, t, seg) == algorithm::ring);
  CHECK(selector::exchange_only(algorithm::scatter_allgather));
  CHECK(selector::exchange_only(algorithm::bruck));
  CHECK(!selector::exchange_only(algorithm::rd));
  // "direct" without an arena is no choice for broadcast: the model's.
  CHECK(selector(m, parse_algo_table("direct")).choose_rooted(8, t, false, seg) == model.choose_rooted(8, t, false, seg));
}

TEST_CASE("selector: remembered choices are the model's, across sizes, topologies, kinds and threads") {
  // A long-lived selector answers from its memo after the first call; a
  // fresh selector (empty memo) answers every question from the model. Many
  // questions share a slot (64 slots), so answers are stored, evicted and
  // asked again in every order.
  cost_model m = cost_model::shared_memory();
  m.global = link_cost{20e-6, 1e-9, 1e-10, 10e-6};
  m.nic_share = 4;
  const std::vector<topology> topos{{2, 2, 1, true}, {8, 8, 1, false}, {16, 4, 4, false}, {64, 8, 8, false},
                                    {5, 5, 1, true}};
  std::vector<std::size_t> sizes;
  for (std::size_t b = 1; b <= (std::size_t{64} << 20); b *= 3) sizes.push_back(b);
  const std::vector<std::size_t> segs{std::size_t{64} << 10, std::size_t{256} << 10};
  auto answers = [&](const selector& s, const topology& t, std::size_t b, std::size_t seg) {
    return std::vector<algorithm>{s.choose(b, t, seg),          s.choose_rooted(b, t, false, seg),
                                  s.choose_rooted(b, t, true, seg), s.choose_allgather(b, t, seg),
                                  s.choose_reduce_scatter(b, t, seg), s.choose_alltoall(b, t, true),
                                  s.choose_alltoall(b, t, false),  s.choose_alltoall(b, t, false, true)};
  };
  const selector kept(m);
  std::size_t asked = 0, mismatched = 0;
  for (int pass = 0; pass < 3; ++pass)
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (const auto& t : topos)
        for (const std::size_t seg : segs) {
          const std::size_t b = sizes[pass == 1 ? sizes.size() - 1 - i : i]; // backwards on the second pass
          const selector fresh(m);
          ++asked;
          if (answers(kept, t, b, seg) != answers(fresh, t, b, seg)) ++mismatched;
        }
  CHECK(asked == 3 * sizes.size() * topos.size() * segs.size());
  CHECK(mismatched == 0);
  // Ranks that are threads share one selector: four threads asking at once
  // get the model's answers.
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 20; ++rep)
        for (std::size_t i = 0; i < sizes.size(); ++i) {
          const topology& t = topos[(i + static_cast<std::size_t>(k)) % topos.size()];
          const std::size_t b = sizes[(i * 7 + static_cast<std::size_t>(k + rep)) % sizes.size()];
          if (answers(kept, t, b, segs[0]) != answers(selector(m), t, b, segs[0])) ++wrong;
        }
    });
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
  // A copy starts with an empty memo and answers the same.
  const selector copy = kept;
  for (const auto& t : topos) CHECK(answers(copy, t, 12345, segs[1]) == answers(selector(m), t, 12345, segs[1]));
}
