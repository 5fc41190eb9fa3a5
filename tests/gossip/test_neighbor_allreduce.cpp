// neighbor_allreduce: every built-in topology, ranks 1..16, every dtype,
// against the documented combine replayed serially (bit for bit) and the
// dense W^k x in long double; the consensus distance decays at the SLEM's
// rate; doubly stochastic mixing keeps the average; one-peer exponential
// gossip reaches the exact average in log2(p) steps; periodic global
// averaging.
#include "reference.hpp"

#include <gradsync/gossip/neighbor_allreduce.hpp>
#include <gradsync/transport/inproc.hpp>

#include <cstring>
#include <functional>

using namespace gradsync;
using namespace gradsync::gossip;
namespace ref = gradsync::test::gossip_ref;

namespace {

constexpr dtype all_dtypes[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64};

// The topologies to sweep on p ranks.
std::vector<graph> topologies(int p) {
  std::vector<graph> v{ring(p), ring(p, weighting::metropolis_hastings), exponential(p), one_peer_exponential(p),
                       full(p), star(p), star(p, weighting::uniform), directed_ring(p)};
  if ((p & (p - 1)) == 0) v.push_back(hypercube(p));
  for (int rows = 2; rows < p; ++rows)
    if (p % rows == 0 && p / rows >= 2) {
      v.push_back(torus(rows, p / rows));
      break;
    }
  if (p >= 3) { // an irregular user graph: a ring plus chords, MH weights
    std::vector<std::pair<int, int>> e;
    for (int i = 0; i < p; ++i) e.emplace_back(i, (i + 1) % p);
    for (int i = 0; i + 3 < p; i += 2) e.emplace_back(i, i + 3);
    v.push_back(from_edges(p, e, true, weighting::metropolis_hastings));
  }
  return v;
}

// Runs `steps` rounds from step `first` on p inproc ranks; returns x per rank.
template <class T>
std::vector<std::vector<T>> run_gossip(int p, const graph& g, std::size_t n, std::uint64_t first, std::uint64_t steps,
                                       const std::vector<std::vector<T>>& start, const gossip_options& o = {},
                                       std::vector<std::size_t>* sent = nullptr) {
  std::vector<std::vector<T>> out = start;
  if (sent) sent->assign(static_cast<std::size_t>(p), 0);
  inproc::run(p, [&](inproc::communicator& c) {
    c.group().set_timeout(std::chrono::seconds(60));
    auto& x = out[static_cast<std::size_t>(c.rank())];
    for (std::uint64_t s = first; s < first + steps; ++s) {
      const round_report rep = neighbor_allreduce(c, std::span<T>(x), g, s, o);
      if (sent) (*sent)[static_cast<std::size_t>(c.rank())] += rep.bytes_sent;
    }
  });
  (void)n;
  return out;
}

template <class T> std::vector<std::vector<T>> start_values(int p, std::size_t n) {
  std::vector<std::vector<T>> x(static_cast<std::size_t>(p), std::vector<T>(n));
  for (int r = 0; r < p; ++r)
    for (std::size_t i = 0; i < n; ++i) x[static_cast<std::size_t>(r)][i] = ref::to_elem<T>(ref::input(r, i));
  return x;
}

} // namespace

TEST_CASE("neighbor_allreduce: every topology, ranks 1..16, every dtype, bitwise against the serial replay") {
  const std::size_t n = 37;
  for (int p = 1; p <= 16; ++p)
    for (const graph& g : topologies(p))
      for (const dtype t : all_dtypes)
        dispatch_dtype(t, [&](auto tv) {
          using T = decltype(tv);
          INFO("p=" << p << " topology=" << g.name() << " dtype=" << dtype_name(t));
          const auto x0 = start_values<T>(p, n);
          const std::uint64_t first = 1, steps = 4;
          std::vector<std::size_t> sent;
          const auto got = run_gossip<T>(p, g, n, first, steps, x0, {}, &sent);
          auto want = x0;
          std::size_t want_sent = 0;
          for (std::uint64_t s = first; s < first + steps; ++s) {
            ref::replay(g.at(s), want);
            want_sent += g.at(s).out(0).size() * n * sizeof(T);
          }
          for (int r = 0; r < p; ++r)
            CHECK(std::memcmp(got[static_cast<std::size_t>(r)].data(), want[static_cast<std::size_t>(r)].data(),
                              n * sizeof(T)) == 0);
          CHECK(sent[0] == want_sent);
        });
}

TEST_CASE("neighbor_allreduce: doubles follow the dense W^k x; doubly stochastic mixing keeps the average") {
  const std::size_t n = 11;
  for (int p : {2, 3, 5, 8, 12, 16})
    for (const graph& g : topologies(p)) {
      INFO("p=" << p << " topology=" << g.name());
      const auto x0 = start_values<double>(p, n);
      const std::uint64_t steps = 9;
      const auto got = run_gossip<double>(p, g, n, 0, steps, x0);
      std::vector<std::vector<long double>> want(static_cast<std::size_t>(p), std::vector<long double>(n));
      for (int r = 0; r < p; ++r)
        for (std::size_t i = 0; i < n; ++i) want[static_cast<std::size_t>(r)][i] = x0[static_cast<std::size_t>(r)][i];
      std::vector<long double> mean0;
      ref::consensus_distance(want, &mean0);
      for (std::uint64_t s = 0; s < steps; ++s) ref::apply(ref::matrix_of(g, s), want);
      for (int r = 0; r < p; ++r)
        for (std::size_t i = 0; i < n; ++i)
          CHECK(static_cast<double>(got[static_cast<std::size_t>(r)][i]) ==
                doctest::Approx(static_cast<double>(want[static_cast<std::size_t>(r)][i])).epsilon(1e-12).scale(8));
      const bool doubly = g.name() != "star" || g.at(0).self(0) != 1.0 / p ? true : true;
      (void)doubly;
      std::string why;
      try {
        validate(g, p, property::doubly_stochastic, "t", 0);
      } catch (const error& e) {
        why = e.what();
      }
      if (why.empty()) { // the average is kept to rounding (|x| <= 7, 9 steps)
        std::vector<std::vector<long double>> g_ld(static_cast<std::size_t>(p), std::vector<long double>(n));
        for (int r = 0; r < p; ++r)
          for (std::size_t i = 0; i < n; ++i) g_ld[static_cast<std::size_t>(r)][i] = got[static_cast<std::size_t>(r)][i];
        std::vector<long double> mean;
        ref::consensus_distance(g_ld, &mean);
        for (std::size_t i = 0; i < n; ++i) CHECK(std::abs(static_cast<double>(mean[i] - mean0[i])) < 1e-13);
      }
    }
}

TEST_CASE("neighbor_allreduce: consensus distance decays at the rate the SLEM predicts (within 3%)") {
  struct named {
    graph g;
    int p;
  };
  const std::vector<named> cases = {{ring(16), 16},          {ring(9), 9},        {torus(4, 4), 16},
                                    {torus(3, 5), 15},       {hypercube(16), 16}, {exponential(16), 16},
                                    {exponential(12), 12},   {star(7), 7},        {one_peer_exponential(12), 12},
                                    {directed_ring(10), 10}};
  for (const named& k : cases) {
    const graph& g = k.g;
    const int p = k.p;
    const double lambda = slem(g);
    INFO("topology=" << g.name() << " p=" << p << " slem=" << lambda);
    REQUIRE(lambda > 0.05);
    REQUIRE(lambda < 1);
    // Run until the distance has shrunk by ~1e-9 (well above double rounding),
    // in whole periods; measure the rate over the second half.
    const auto period = static_cast<std::uint64_t>(g.period());
    std::uint64_t steps = static_cast<std::uint64_t>(std::ceil(std::log(1e-9) / std::log(lambda)));
    steps = (steps + 2 * period - 1) / (2 * period) * (2 * period);
    const std::size_t n = 3;
    std::vector<std::vector<double>> x(static_cast<std::size_t>(p), std::vector<double>(n));
    for (int r = 0; r < p; ++r)
      for (std::size_t i = 0; i < n; ++i) x[static_cast<std::size_t>(r)][i] = std::sin(1.7 * r + 0.3 * static_cast<double>(i) + 0.2);
    const auto half = run_gossip<double>(p, g, n, 0, steps / 2, x);
    const auto end = run_gossip<double>(p, g, n, steps / 2, steps / 2, half);
    const auto dist = [&](const std::vector<std::vector<double>>& v) {
      std::vector<std::vector<long double>> l(v.size(), std::vector<long double>(n));
      for (std::size_t r = 0; r < v.size(); ++r)
        for (std::size_t i = 0; i < n; ++i) l[r][i] = v[r][i];
      return static_cast<double>(ref::consensus_distance(l));
    };
    const double rate = std::pow(dist(end) / dist(half), 1.0 / static_cast<double>(steps / 2));
    CHECK(rate == doctest::Approx(lambda).epsilon(0.03));
    CHECK(dist(end) <= dist(x) * std::pow(lambda, static_cast<double>(steps)) * 10);
  }
}

TEST_CASE("neighbor_allreduce: one-peer exponential gives the exact average after log2(p) steps") {
  for (int p : {1, 2, 4, 8, 16})
    for (const dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16})
      dispatch_dtype(t, [&](auto tv) {
        using T = decltype(tv);
        const graph g = one_peer_exponential(p);
        const std::uint64_t l = p == 1 ? 1 : g.period();
        const std::size_t n = 301;
        // Integers in [-7, 7]: every partial average is a multiple of 1/16 below 8, exact in all four types.
        const auto x0 = start_values<T>(p, n);
        for (std::uint64_t first : {std::uint64_t{0}, 3 * l}) {
          INFO("p=" << p << " dtype=" << dtype_name(t) << " first step " << first);
          const auto got = run_gossip<T>(p, g, n, first, l, x0);
          for (std::size_t i = 0; i < n; ++i) {
            long long sum = 0;
            for (int r = 0; r < p; ++r) sum += ref::input(r, i);
            const T want = ref::to_elem<T>(static_cast<long double>(sum) / p);
            for (int r = 0; r < p; ++r)
              CHECK(std::memcmp(&got[static_cast<std::size_t>(r)][i], &want, sizeof(T)) == 0);
          }
        }
      });
}

TEST_CASE("neighbor_allreduce: periodic global averaging every H steps") {
  const int p = 8;
  const std::size_t n = 23;
  const graph g = ring(p);
  gossip_options o;
  o.global_every = 3;
  CHECK(!o.global_step(0));
  CHECK(!o.global_step(1));
  CHECK(o.global_step(2));
  CHECK(o.global_step(5));
  const auto x0 = start_values<double>(p, n);
  std::vector<std::size_t> sent;
  const auto got = run_gossip<double>(p, g, n, 0, 3, x0, o, &sent);
  // Steps 0 and 1 gossip (average kept), step 2 is the exact average.
  for (std::size_t i = 0; i < n; ++i) {
    long long sum = 0;
    for (int r = 0; r < p; ++r) sum += ref::input(r, i);
    for (int r = 0; r < p; ++r) {
      CHECK(got[static_cast<std::size_t>(r)][i] == doctest::Approx(static_cast<double>(sum) / p).epsilon(1e-14));
      CHECK(std::memcmp(&got[static_cast<std::size_t>(r)][i], &got[0][i], sizeof(double)) == 0);
    }
  }
  CHECK(sent[0] == 2 * 2 * n * sizeof(double)); // two gossip rounds to two neighbours; the global step not counted
  // Without it, two ring steps from integer data are far from the average.
  const auto plain = run_gossip<double>(p, g, n, 0, 3, x0);
  double spread = 0;
  for (int r = 1; r < p; ++r) spread = std::max(spread, std::abs(plain[static_cast<std::size_t>(r)][0] - plain[0][0]));
  CHECK(spread > 0.01);
}

TEST_CASE("neighbor_allreduce: caller workspace, argument checks") {
  const int p = 4;
  const graph g = exponential(p);
  CHECK(neighbor_allreduce_workspace_bytes<float>(g, 0, 10) == 2 * 10 * sizeof(float));
  CHECK(neighbor_allreduce_workspace_bytes<float>(one_peer_exponential(p), 1, 10) == 10 * sizeof(float));
  inproc::run(p, [&](inproc::communicator& c) {
    c.group().set_timeout(std::chrono::seconds(10));
    std::vector<float> x(10, static_cast<float>(c.rank()));
    std::vector<std::byte> ws(neighbor_allreduce_workspace_bytes<float>(g, c.rank(), x.size()));
    gossip_options o;
    o.collective.workspace = ws;
    neighbor_allreduce(c, std::span<float>(x), g, 0, o);
    // Rank i hears i-1 and i-2: (i + (i-1) + (i-2)) / 3 mod 4 ranks.
    const int i = c.rank();
    CHECK(x[0] == doctest::Approx((i + (i + 3) % 4 + (i + 2) % 4) / 3.0));
    std::vector<std::byte> small(4);
    o.collective.workspace = small;
    CHECK_THROWS_WITH_AS(neighbor_allreduce(c, std::span<float>(x), g, 0, o), doctest::Contains("workspace"), error);
    // A global-averaging step ignores the exchange's workspace.
    o.global_every = 1;
    std::vector<float> y(10, static_cast<float>(c.rank()));
    neighbor_allreduce(c, std::span<float>(y), g, 0, o);
    CHECK(y[9] == 1.5f);
    CHECK_THROWS_WITH_AS(neighbor_allreduce(c, std::span<float>(x), ring(5), 0), doctest::Contains("spans 5 ranks"), error);
  });
}
