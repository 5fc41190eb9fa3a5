// Gossip topologies: the built-in graphs' neighbours and weights against
// their definitions, validation (each defect named by its row, on every rank,
// before any message moves), and the SLEM against closed-form spectra.
#include "reference.hpp"

#include <gradsync/gossip/neighbor_allreduce.hpp>
#include <gradsync/transport/inproc.hpp>

#include <algorithm>
#include <complex>
#include <mutex>
#include <numbers>
#include <set>

using namespace gradsync;
using namespace gradsync::gossip;
using gradsync::test::gossip_ref::matrix_of;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::set<int> in_set(const graph& g, int i, std::uint64_t t = 0) {
  std::set<int> s;
  for (const auto& e : g.at(t).in(i)) s.insert(e.peer);
  return s;
}
int mod(int a, int p) { return ((a % p) + p) % p; }

// The message of validate(g, ranks, need), or "" when it passes.
std::string failure(const graph& g, int ranks, property need) {
  try {
    validate(g, ranks, need, "test", 0);
  } catch (const error& e) {
    CHECK(e.kind() == errc::invalid_argument);
    return e.what();
  }
  return {};
}

// Spectral radius of a circulant's non-trivial eigenvalues: c = first row's
// weights by offset (W[i][i - d] = c[d]).
double circulant_slem(const std::vector<double>& c) {
  const std::size_t p = c.size();
  double best = 0;
  for (std::size_t k = 1; k < p; ++k) {
    std::complex<double> l = 0;
    for (std::size_t d = 0; d < p; ++d)
      l += c[d] * std::polar(1.0, -2 * std::numbers::pi * static_cast<double>(k * d) / static_cast<double>(p));
    best = std::max(best, std::abs(l));
  }
  return best;
}

} // namespace

TEST_CASE("topology: ring, torus, hypercube, exponential neighbours and weights") {
  for (int p = 1; p <= 16; ++p) {
    INFO("p=" << p);
    const graph r = ring(p);
    CHECK(r.period() == 1);
    for (int i = 0; i < p; ++i) {
      std::set<int> want;
      if (p > 1) want = {mod(i - 1, p), mod(i + 1, p)};
      CHECK(in_set(r, i) == want);
      CHECK(r.at(0).self(i) == doctest::Approx(1.0 / (static_cast<double>(want.size()) + 1)));
      std::set<int> ex;
      for (int k = 1; k < p; k <<= 1) ex.insert(mod(i - k, p));
      CHECK(in_set(exponential(p), i) == ex);
      const std::set<int> one = p > 1 ? std::set<int>{mod(i - 1, p)} : std::set<int>{};
      CHECK(in_set(directed_ring(p), i) == one);
    }
    CHECK(failure(ring(p), p, property::doubly_stochastic | property::symmetric | property::strongly_connected) == "");
    CHECK(failure(ring(p, weighting::metropolis_hastings), p, property::doubly_stochastic | property::symmetric) == "");
    CHECK(failure(exponential(p), p, property::doubly_stochastic | property::strongly_connected) == "");
    CHECK(failure(directed_ring(p), p, property::doubly_stochastic | property::strongly_connected) == "");
    CHECK(failure(full(p), p, property::doubly_stochastic | property::symmetric | property::strongly_connected) == "");
    CHECK(failure(star(p), p, property::doubly_stochastic | property::symmetric | property::strongly_connected) == "");
    CHECK(failure(one_peer_exponential(p), p, property::doubly_stochastic | property::strongly_connected) == "");
    if (p & (p - 1)) {
      CHECK_THROWS_WITH_AS(hypercube(p), doctest::Contains("power-of-two"), error);
    } else {
      const graph h = hypercube(p);
      for (int i = 0; i < p; ++i) {
        std::set<int> want;
        for (int k = 1; k < p; k <<= 1) want.insert(i ^ k);
        CHECK(in_set(h, i) == want);
      }
      CHECK(failure(h, p, property::doubly_stochastic | property::symmetric | property::strongly_connected) == "");
    }
    for (int rows = 1; rows <= p; ++rows) {
      if (p % rows) continue;
      const int cols = p / rows;
      const graph t = torus(rows, cols);
      for (int i = 0; i < p; ++i) {
        const int a = i / cols, b = i % cols;
        std::set<int> want{mod(a + 1, rows) * cols + b, mod(a - 1, rows) * cols + b, a * cols + mod(b + 1, cols),
                           a * cols + mod(b - 1, cols)};
        want.erase(i);
        CHECK(in_set(t, i) == want);
      }
      CHECK(failure(t, p, property::row_stochastic | property::symmetric | property::strongly_connected) == "");
      CHECK(failure(torus(rows, cols, weighting::metropolis_hastings), p,
                    property::doubly_stochastic | property::symmetric) == "");
    }
  }
}

TEST_CASE("topology: one-peer exponential cycles one partner per step") {
  for (int p : {1, 2, 3, 5, 8, 12, 16}) {
    const graph g = one_peer_exponential(p);
    int l = 0;
    while ((1 << l) < p) ++l;
    CHECK(g.period() == static_cast<std::size_t>(std::max(l, 1)));
    for (std::uint64_t t = 0; t < 3 * g.period(); ++t)
      for (int i = 0; i < p; ++i) {
        const auto in = g.at(t).in(i);
        if (p == 1) {
          CHECK(in.empty());
          continue;
        }
        REQUIRE(in.size() == 1);
        CHECK(in[0].peer == mod(i - (1 << (t % g.period())), p));
        CHECK(in[0].weight == 0.5);
        CHECK(g.at(t).self(i) == 0.5);
        CHECK(g.at(t).out(i).size() == 1);
      }
  }
}

TEST_CASE("topology: star weights, uniform and Metropolis-Hastings") {
  const int p = 6;
  const auto u = matrix_of(star(p, weighting::uniform), 0), mh = matrix_of(star(p), 0);
  CHECK(static_cast<double>(u[0][0]) == doctest::Approx(1.0 / p));
  CHECK(static_cast<double>(u[3][0]) == doctest::Approx(0.5));
  CHECK(static_cast<double>(mh[0][3]) == doctest::Approx(1.0 / p));
  CHECK(static_cast<double>(mh[3][3]) == doctest::Approx(1 - 1.0 / p));
  CHECK(contains(failure(star(p, weighting::uniform), p, property::column_stochastic), "column 0"));
  CHECK(contains(failure(star(p, weighting::uniform), p, property::symmetric), "row 0"));
}

TEST_CASE("topology: user graphs, by edges and by weights") {
  // Undirected edges with MH weights: a path 0-1-2-3.
  const graph path = from_edges(4, {{0, 1}, {1, 2}, {2, 3}}, true, weighting::metropolis_hastings);
  const auto w = matrix_of(path, 0);
  CHECK(static_cast<double>(w[0][1]) == doctest::Approx(1.0 / 3));
  CHECK(static_cast<double>(w[0][0]) == doctest::Approx(2.0 / 3));
  CHECK(static_cast<double>(w[1][2]) == doctest::Approx(1.0 / 3));
  CHECK(failure(path, 4, property::doubly_stochastic | property::symmetric | property::strongly_connected) == "");
  // Directed edges with column weights: column-stochastic, not row-stochastic.
  const graph d = from_edges(3, {{1, 0}, {2, 0}, {0, 2}, {0, 1}}, false, weighting::column_uniform);
  CHECK(failure(d, 3, property::column_stochastic | property::strongly_connected) == "");
  CHECK(contains(failure(d, 3, property::row_stochastic), "row 0: weights sum to"));
  CHECK_THROWS_WITH_AS(from_edges(3, {{0, 3}}, true), doctest::Contains("outside [0, 3)"), error);
  CHECK_THROWS_WITH_AS(from_edges(3, {{1, 1}}, true), doctest::Contains("self loop"), error);
  CHECK_THROWS_WITH_AS(from_edges(3, {{0, 1}}, false, weighting::metropolis_hastings), doctest::Contains("undirected"), error);
  // Weighted: a valid 3-rank matrix and one defect per case, each naming its row.
  std::vector<entry> ok = {{0, 0, 0.5}, {0, 1, 0.5}, {1, 1, 0.5}, {1, 2, 0.5}, {2, 2, 0.5}, {2, 0, 0.5}};
  CHECK(failure(from_weights(3, ok), 3, property::doubly_stochastic | property::strongly_connected) == "");
  auto bad = ok;
  bad[3].weight = 0.4; // row 1 sums to 0.9
  CHECK(contains(failure(from_weights(3, bad), 3, property::row_stochastic), "row 1: weights sum to 0.9"));
  bad = ok;
  bad[1].col = 7;
  CHECK(contains(failure(from_weights(3, bad), 3, property::row_stochastic), "row 0: neighbour 7 is outside"));
  bad = ok;
  bad.push_back({2, 0, 0.0});
  CHECK(contains(failure(from_weights(3, bad), 3, property::row_stochastic), "row 2: neighbour 0 is listed twice"));
  bad = ok;
  bad[5].weight = -0.5;
  bad[4].weight = 1.5;
  CHECK(contains(failure(from_weights(3, bad), 3, property::row_stochastic), "row 2: weight -0.5"));
  bad = ok;
  bad[0].weight = std::nan("");
  CHECK(contains(failure(from_weights(3, bad), 3, property::row_stochastic), "row 0: self weight"));
  CHECK(contains(failure(from_weights(3, ok), 4, property::row_stochastic), "spans 3 ranks, the communicator 4"));
  CHECK(contains(failure(from_weights(3, ok), 3, property::symmetric), "row 0: W[0][1]"));
  // Two components: row-stochastic but not strongly connected.
  const std::vector<entry> split = {{0, 0, 0.5}, {0, 1, 0.5}, {1, 1, 0.5}, {1, 0, 0.5}, {2, 2, 0.5}, {2, 3, 0.5},
                                    {3, 3, 0.5}, {3, 2, 0.5}};
  CHECK(failure(from_weights(4, split), 4, property::doubly_stochastic) == "");
  CHECK(contains(failure(from_weights(4, split), 4, property::strongly_connected), "row 2: rank 2 is never reached"));
  CHECK(contains(failure(one_peer_exponential(4), 4, property::static_graph), "changes every step"));
  // A raw matrix with fewer self weights than rows (found by fuzz_topology:
  // validate() then threw std::out_of_range, not gradsync::error).
  CHECK_THROWS_WITH_AS(mixing({0.5, 0.5}, {{{1, 0.5}}, {{0, 0.5}}, {}}), doctest::Contains("2 self weights for 3 rows"), error);
  CHECK(mixing({0.5, 0.5}, {{{1, 0.5}}, {{0, 0.5}}}).size() == 2);
}

TEST_CASE("topology: a bad graph is rejected on every rank before any message moves") {
  for (int p : {2, 3, 4, 8}) {
    std::vector<entry> es;
    for (int i = 0; i < p; ++i) {
      es.push_back({i, i, 0.5});
      es.push_back({i, (i + 1) % p, i == p - 1 ? 0.25 : 0.5}); // the last row sums to 0.75
    }
    const graph g = from_weights(p, es, "lopsided");
    std::mutex mu;
    std::vector<std::string> seen(static_cast<std::size_t>(p));
    inproc::run(p, [&](inproc::communicator& c) {
      c.group().set_timeout(std::chrono::seconds(10));
      std::vector<float> x(5, 1.0f);
      try {
        neighbor_allreduce(c, std::span<float>(x), g, 0);
      } catch (const error& e) {
        std::lock_guard lk(mu);
        seen[static_cast<std::size_t>(c.rank())] = e.what();
        CHECK(e.rank() == c.rank());
        CHECK(e.kind() == errc::invalid_argument);
      }
      // Every rank is still in step: a collective afterwards completes.
      barrier(c);
    });
    for (int r = 0; r < p; ++r) {
      INFO("p=" << p << " rank " << r << ": " << seen[static_cast<std::size_t>(r)]);
      CHECK(contains(seen[static_cast<std::size_t>(r)], "neighbor_allreduce"));
      CHECK(contains(seen[static_cast<std::size_t>(r)], "topology 'lopsided' row " + std::to_string(p - 1)));
    }
  }
}

TEST_CASE("topology: SLEM against closed-form spectra") {
  for (int p = 2; p <= 16; ++p) {
    INFO("p=" << p);
    // Ring with uniform weights: a circulant (1/3 at offsets 0, +-1; 1/2 at p = 2).
    std::vector<double> c(static_cast<std::size_t>(p), 0.0);
    const double w = p == 2 ? 0.5 : 1.0 / 3;
    c[0] = w;
    c[1] += w;
    c[static_cast<std::size_t>(p - 1)] += p == 2 ? 0 : w;
    CHECK(slem(ring(p)) == doctest::Approx(circulant_slem(c)).epsilon(1e-6));
    // Static exponential: 1/(L+1) at offsets 0 and 2^k.
    std::vector<double> e(static_cast<std::size_t>(p), 0.0);
    int l = 0;
    for (int k = 1; k < p; k <<= 1) ++l;
    e[0] = 1.0 / (l + 1);
    for (int k = 1; k < p; k <<= 1) e[static_cast<std::size_t>(k)] = 1.0 / (l + 1);
    CHECK(slem(exponential(p)) == doctest::Approx(circulant_slem(e)).epsilon(1e-6));
    CHECK(slem(full(p)) < 1e-6);
    if ((p & (p - 1)) == 0) {
      // Hypercube of dimension d: eigenvalues (d + 1 - 2m)/(d + 1); one-peer exponential: exact in a period.
      CHECK(slem(hypercube(p)) == doctest::Approx(static_cast<double>(l - 1) / (l + 1)).epsilon(1e-6));
      CHECK(slem(one_peer_exponential(p)) < 1e-6);
    } else {
      CHECK(slem(one_peer_exponential(p)) > 0.01); // not exact off powers of two
      CHECK(slem(one_peer_exponential(p)) < 1);
    }
  }
  // Torus 4 x 4: eigenvalues (1 + 2 cos(2 pi a / 4) + 2 cos(2 pi b / 4)) / 5, SLEM 3/5.
  CHECK(slem(torus(4, 4)) == doctest::Approx(0.6).epsilon(1e-6));
  // Directed ring at 1/2: eigenvalues (1 + e^{-2 pi i k/p})/2, modulus |cos(pi k / p)|.
  CHECK(slem(directed_ring(8)) == doctest::Approx(std::cos(std::numbers::pi / 8)).epsilon(1e-6));
  // Star with MH weights: eigenvalues 1, 1 - 1/p (p - 2 times), 0 for p >= 3.
  CHECK(slem(star(6)) == doctest::Approx(1 - 1.0 / 6).epsilon(1e-6));
}

TEST_CASE("topology: built-in graphs by name") {
  CHECK(named("ring", 6).name() == "ring");
  CHECK(matrix_of(named("ring:mh", 6), 0) == matrix_of(ring(6, weighting::metropolis_hastings), 0));
  CHECK(matrix_of(named("torus", 12), 0) == matrix_of(torus(3, 4), 0)); // rows: the largest divisor <= sqrt p
  CHECK(matrix_of(named("torus:2x6", 12), 0) == matrix_of(torus(2, 6), 0));
  CHECK(named("one_peer", 8).period() == 3);
  CHECK(matrix_of(named("star:uniform", 5), 0) == matrix_of(star(5, weighting::uniform), 0));
  CHECK_THROWS_WITH_AS(named("torus:2x5", 12), doctest::Contains("has 10 ranks, not 12"), error);
  // rows x cols beyond int (found by fuzz_topology): rejected, not overflowed.
  CHECK_THROWS_WITH_AS(named("torus:1666666767x8", 12), doctest::Contains("has 13333334136 ranks, not 12"), error);
  CHECK_THROWS_WITH_AS(named("torus:2y5", 10), doctest::Contains("expected torus:ROWSxCOLS"), error);
  CHECK_THROWS_WITH_AS(named("tours", 4), doctest::Contains("unknown topology 'tours'"), error);
  CHECK_THROWS_WITH_AS(named("hypercube", 6), doctest::Contains("power-of-two"), error);
}
