// Algorithm selection: the cost model's choice against the formulas written
// out again here, the GRADSYNC_ALGO table (parsing, errors, precedence), and
// calibrate() agreeing one selector on every rank.
#include <doctest/doctest.h>

#include <gradsync/calibrate.hpp>
#include <gradsync/collectives.hpp>
#include <gradsync/transport/inproc.hpp>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace gradsync;

namespace {

// The textbook costs of docs/algorithms.md, independently of select.hpp.
struct ref_model {
  double a, b, g; // flat link
  double la, lb, lg; // local link (hier)
  double seg;

  double flat(algorithm x, double n, int p, double A, double B, double G) const {
    if (p <= 1) return 0;
    double L = 0;
    while ((1 << static_cast<int>(L)) < p) L += 1; // ceil(lg p)
    int q2 = 1;
    while (q2 * 2 <= p) q2 *= 2;
    const double k2 = std::log2(q2), f = q2 == p ? 0 : 1;
    switch (x) {
    case algorithm::ring: return 2.0 * (p - 1) * A + 2.0 * (p - 1) / p * n * B + (p - 1.0) / p * n * G;
    case algorithm::tree: return 2 * L * A + 2 * L * n * B + L * n * G;
    case algorithm::rd: return (k2 + 2 * f) * A + (k2 + 2 * f) * n * B + (k2 + f) * n * G;
    case algorithm::rabenseifner:
      return (2 * k2 + 2 * f) * A + (2 * (q2 - 1.0) / q2 + 2 * f) * n * B + ((q2 - 1.0) / q2 + f) * n * G;
    case algorithm::dbtree: {
      const double h = std::floor(std::log2(p));
      const double k = std::max(1.0, std::ceil(n / 2 / seg));
      const double s = n / 2 / k;
      return (k + 2 * h) * (4 * A + 4 * s * B + 2 * s * G);
    }
    default: return std::numeric_limits<double>::infinity();
    }
  }
  double best_flat(double n, int p, double A, double B, double G) const {
    double m = std::numeric_limits<double>::infinity();
    for (auto x : {algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd, algorithm::rabenseifner})
      m = std::min(m, flat(x, n, p, A, B, G));
    return m;
  }
  // topology: p ranks, groups of gs (m groups); gs == p or gs <= 1: flat only.
  double cost(algorithm x, double n, int p, int gs, int m) const {
    const bool grouped = m > 1;
    const double A = grouped ? a : la, B = grouped ? b : lb, G = grouped ? g : lg;
    if (x == algorithm::hier) {
      if (!(m > 1 && gs > 1)) return std::numeric_limits<double>::infinity();
      return 2.0 * (gs - 1) * la + 2.0 * (gs - 1) / gs * n * lb + (gs - 1.0) / gs * n * lg +
             best_flat(n / gs, m, a, b, g);
    }
    if (x == algorithm::twod) {
      if (p < 4) return std::numeric_limits<double>::infinity();
      const int w = grid_row(p), rows = (p + w - 1) / w;
      return 2.0 * (w - 1) * A + 2.0 * (w - 1) / w * n * B + (w - 1.0) / w * n * G +
             flat(algorithm::ring, n / w, rows, A, B, G);
    }
    return flat(x, n, p, A, B, G);
  }
};

constexpr algorithm candidates[] = {algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd,
                                    algorithm::rabenseifner, algorithm::twod, algorithm::hier};

struct env_guard { // sets GRADSYNC_ALGO for one test, restores "unset" after
  explicit env_guard(const char* v) { ::setenv("GRADSYNC_ALGO", v, 1); }
  ~env_guard() { ::unsetenv("GRADSYNC_ALGO"); }
};

} // namespace

TEST_CASE("select: the choice is the cheapest schedule by the model") {
  // Parameter sets: the defaults, a latency-bound network, a bandwidth-bound
  // one with a slow kernel, and a two-level one (slow links between groups).
  struct params { double a, b, g, la, lb, lg; };
  const params sets[] = {
      {policy::model_alpha, policy::model_beta, policy::model_gamma, policy::model_alpha, policy::model_beta, policy::model_gamma},
      {50e-6, 1e-10, 1e-11, 50e-6, 1e-10, 1e-11},
      {1e-6, 1e-9, 5e-10, 1e-6, 1e-9, 5e-10},
      {20e-6, 4e-10, 1e-10, 1e-6, 2e-11, 1e-10},
  };
  std::size_t checked = 0;
  std::vector<int> seen(16, 0);
  for (const auto& ps : sets)
    for (int p : {2, 3, 4, 5, 6, 7, 8, 16, 64, 256})
      for (int gs : {0, 2, 4, 8})
        for (double lb2 = 2; lb2 <= 33; lb2 += 1) {
          const auto bytes = static_cast<std::size_t>(std::pow(2.0, lb2));
          cost_model m;
          m.global = {ps.a, ps.b, ps.g};
          m.local = {ps.la, ps.lb, ps.lg};
          const selector sel(m);
          const int G = gs > 0 && gs < p ? gs : p;
          const int groups = (p + G - 1) / G;
          const topology t{p, G, groups};
          const std::size_t seg = policy::ring_segment_bytes;
          const ref_model ref{ps.a, ps.b, ps.g, ps.la, ps.lb, ps.lg, static_cast<double>(seg)};
          const algorithm got = sel.choose(bytes, t, seg);
          const double got_cost = ref.cost(got, static_cast<double>(bytes), p, G, groups);
          double best = std::numeric_limits<double>::infinity();
          for (auto x : candidates) best = std::min(best, ref.cost(x, static_cast<double>(bytes), p, G, groups));
          INFO("p=" << p << " group=" << G << " bytes=" << bytes << " chose " << algorithm_name(got));
          REQUIRE(got_cost <= best * (1 + 1e-12));
          ++seen[static_cast<std::size_t>(got)];
          ++checked;
        }
  CHECK(checked > 1000);
  // The grid is wide enough that the model's answer really varies.
  int distinct = 0;
  for (int s : seen) distinct += s > 0;
  CHECK(distinct >= 4);
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
      if (p > 1) CHECK(m.arena.sync == m.local.alpha); // inproc has no arena: the local alpha stands in
      if (p > 2) CHECK(m.global.alpha > 0);
    }
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

TEST_CASE("select: broadcast and reduce pick tree or chain by the model") {
  cost_model m;
  m.local = {10e-6, 1e-10, 1e-10};
  const selector sel(m);
  for (int p : {2, 4, 8, 16})
    for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 16, std::size_t{1} << 26})
      for (bool red : {false, true}) {
        const double L = std::ceil(std::log2(p)), n = static_cast<double>(bytes), S = 1 << 18;
        const double g = red ? 1e-10 : 0;
        const double tree = L * (10e-6 + n * (1e-10 + g));
        const double k = std::max(1.0, std::ceil(n / S));
        const double chain = (p - 2 + k) * (10e-6 + n / k * (1e-10 + g));
        CHECK(sel.choose_rooted(bytes, p, red, 1 << 18) == (tree < chain ? algorithm::tree : algorithm::ring));
      }
  // No other schedule is rooted: the model has no time for it.
  CHECK(m.rooted(algorithm::rd, 8, 4, false, 1 << 18) == std::numeric_limits<double>::infinity());
  CHECK(m.rooted(algorithm::direct, 8, 4, true, 1 << 18) == std::numeric_limits<double>::infinity());
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
  // ring: 12e-6 + 1.5 n 1e-10 + 0.75 n 1e-10 = 15.1115 ms (rabenseifner's 4
  // messages instead of 6 make it 4 us cheaper still): not direct.
  const std::size_t big = std::size_t{64} << 20;
  CHECK(m.allreduce(algorithm::direct, big, t, seg) ==
        doctest::Approx(64e-6 + 2 * 67108864 * 2e-10 + 0.75 * 67108864 * 1e-10).epsilon(1e-12));
  CHECK(m.allreduce(algorithm::ring, big, t, seg) ==
        doctest::Approx(12e-6 + 1.5 * 67108864 * 1e-10 + 0.75 * 67108864 * 1e-10).epsilon(1e-12));
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
  const ref_model ref{2e-6, 1e-10, 1e-10, 2e-6, 1e-10, 1e-10, static_cast<double>(seg)};
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

TEST_CASE("select: reduce-scatter and allgather choose direct or ring by the model") {
  cost_model m;
  m.local = {2e-6, 1e-10, 1e-10};
  m.global = {20e-6, 1e-9, 1e-10};
  m.arena = {.copy = 2e-10, .sync = 1e-6, .half_bytes = 2 << 20, .round_bytes = 512 << 10};
  const selector sel(m);
  const topology t{4, 4, 1, true};
  const std::size_t seg = 1 << 18, big = std::size_t{64} << 20;
  // bytes: the whole reduce-scatter input / allgather output (4 blocks).
  // 8 KiB reduce-scatter: ring 3 (2e-6 + 2048 (1e-10 + 1e-10)) = 7.2288 us;
  // direct 1 round: 1e-6 + 8192 x 2e-10 + 0.75 x 8192 x 1e-10 = 3.2528 us.
  CHECK(m.scatter_gather(algorithm::ring, 8192, t, true) == doctest::Approx(7.2288e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::direct, 8192, t, true) == doctest::Approx(3.2528e-6).epsilon(1e-12));
  CHECK(sel.choose_reduce_scatter(8192, t, seg) == algorithm::direct);
  // 64 MiB: ring 3 (2e-6 + 16 Mi x 2e-10) = 10.0723296 ms; direct 32 rounds
  // of 2 MiB: 32e-6 + 13.4217728e-3 + 5.0331648e-3 = 18.4869376 ms.
  CHECK(m.scatter_gather(algorithm::ring, big, t, true) == doctest::Approx(10.0723296e-3).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::direct, big, t, true) == doctest::Approx(18.4869376e-3).epsilon(1e-12));
  CHECK(sel.choose_reduce_scatter(big, t, seg) == algorithm::ring);
  // 8 KiB allgather: ring 3 (2e-6 + 2048e-10) = 6.6144 us; direct: stage one
  // 2 KiB block in 1 round: 1e-6 + 8192 x 2e-10 = 2.6384 us.
  CHECK(m.scatter_gather(algorithm::ring, 8192, t, false) == doctest::Approx(6.6144e-6).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::direct, 8192, t, false) == doctest::Approx(2.6384e-6).epsilon(1e-12));
  CHECK(sel.choose_allgather(8192, t, seg) == algorithm::direct);
  // 64 MiB: ring 3 (2e-6 + 16 Mi x 1e-10) = 5.0391648 ms; direct: blocks of
  // 16 MiB in 8 rounds: 8e-6 + 13.4217728e-3 = 13.4297728 ms.
  CHECK(m.scatter_gather(algorithm::ring, big, t, false) == doctest::Approx(5.0391648e-3).epsilon(1e-12));
  CHECK(m.scatter_gather(algorithm::direct, big, t, false) == doctest::Approx(13.4297728e-3).epsilon(1e-12));
  CHECK(sel.choose_allgather(big, t, seg) == algorithm::ring);
  // Several groups: the ring runs on the global link. 8 KiB allgather on 2
  // groups of 2: 3 (20e-6 + 2048e-9) = 66.144 us.
  const topology grouped{4, 2, 2, true};
  CHECK(m.scatter_gather(algorithm::ring, 8192, grouped, false) == doctest::Approx(66.144e-6).epsilon(1e-12));
  // No arena: always ring, direct costs infinity; one rank: nothing to do.
  const topology no_arena{4, 4, 1};
  CHECK(m.scatter_gather(algorithm::direct, 8192, no_arena, true) == std::numeric_limits<double>::infinity());
  CHECK(m.scatter_gather(algorithm::tree, 8192, t, true) == std::numeric_limits<double>::infinity());
  CHECK(m.scatter_gather(algorithm::ring, 8192, topology{1, 1, 1, true}, true) == 0);
  for (std::size_t b = 8; b <= big; b *= 8) {
    CHECK(sel.choose_reduce_scatter(b, no_arena, seg) == algorithm::ring);
    CHECK(sel.choose_allgather(b, no_arena, seg) == algorithm::ring);
  }
  // The table wins when it names ring or direct; other names fall to the model.
  CHECK(selector(m, parse_algo_table("ring")).choose_reduce_scatter(8192, t, seg) == algorithm::ring);
  CHECK(selector(m, parse_algo_table("direct")).choose_allgather(big, t, seg) == algorithm::direct);
  CHECK(selector(m, parse_algo_table("rd")).choose_allgather(8192, t, seg) == algorithm::direct);
}
