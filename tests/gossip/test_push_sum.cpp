// push_sum: directed, column-stochastic graphs; the estimate converges to
// the true average (where a row-stochastic combine converges elsewhere), it
// follows the dense serial recursion, and the sums over ranks are kept.
#include "reference.hpp"

#include <gradsync/gossip/neighbor_allreduce.hpp>
#include <gradsync/gossip/push_sum.hpp>
#include <gradsync/transport/inproc.hpp>

using namespace gradsync;
using namespace gradsync::gossip;
namespace ref = gradsync::test::gossip_ref;

namespace {

// A directed graph: the ring i <- i-1 plus chords i <- i-3 for even i; column weights.
graph skewed(int p) {
  std::vector<std::pair<int, int>> e;
  for (int i = 0; i < p; ++i) e.emplace_back(i, (i + p - 1) % p);
  for (int i = 0; i < p; i += 2)
    if (p > 3) e.emplace_back(i, (i + p - 3) % p);
  return from_edges(p, e, false, weighting::column_uniform);
}

struct result {
  std::vector<std::vector<double>> estimate, numerator;
  std::vector<double> weight;
};

result run_push_sum(int p, const graph& g, std::size_t n, std::uint64_t steps) {
  result res{std::vector<std::vector<double>>(static_cast<std::size_t>(p), std::vector<double>(n)),
             std::vector<std::vector<double>>(static_cast<std::size_t>(p), std::vector<double>(n)),
             std::vector<double>(static_cast<std::size_t>(p), 1.0)};
  inproc::run(p, [&](inproc::communicator& c) {
    c.group().set_timeout(std::chrono::seconds(60));
    const auto r = static_cast<std::size_t>(c.rank());
    auto& x = res.numerator[r];
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<double>(ref::input(c.rank(), i));
    for (std::uint64_t s = 0; s < steps; ++s)
      push_sum(c, std::span<double>(x), res.weight[r], g, s, std::span<double>(res.estimate[r]));
  });
  return res;
}

} // namespace

TEST_CASE("push_sum: converges to the true average on directed graphs") {
  const std::size_t n = 17;
  for (int p = 2; p <= 16; ++p)
    for (const graph& g : {directed_ring(p), skewed(p), exponential(p)}) {
      INFO("p=" << p << " topology=" << g.name());
      // Enough rounds for the SLEM to shrink the error below 1e-13.
      const auto steps = static_cast<std::uint64_t>(std::ceil(std::log(1e-13) / std::log(slem(g)))) + 10;
      const result res = run_push_sum(p, g, n, steps);
      for (std::size_t i = 0; i < n; ++i) {
        long long sum = 0;
        for (int r = 0; r < p; ++r) sum += ref::input(r, i);
        const double mean = static_cast<double>(sum) / p;
        double numerators = 0, weights = 0;
        for (int r = 0; r < p; ++r) {
          CHECK(res.estimate[static_cast<std::size_t>(r)][i] == doctest::Approx(mean).epsilon(1e-9).scale(1));
          numerators += res.numerator[static_cast<std::size_t>(r)][i];
          weights += res.weight[static_cast<std::size_t>(r)];
        }
        CHECK(numerators == doctest::Approx(static_cast<double>(sum)).epsilon(1e-12).scale(1));
        CHECK(weights == doctest::Approx(p).epsilon(1e-12));
      }
    }
}

TEST_CASE("push_sum: follows the dense recursion W^k x, W^k 1 computed serially") {
  const int p = 7;
  const graph g = skewed(p);
  const std::size_t n = 5;
  for (std::uint64_t steps : {1, 2, 5, 13}) {
    const result res = run_push_sum(p, g, n, steps);
    std::vector<std::vector<long double>> x(static_cast<std::size_t>(p), std::vector<long double>(n + 1, 1));
    for (int r = 0; r < p; ++r)
      for (std::size_t i = 0; i < n; ++i) x[static_cast<std::size_t>(r)][i] = ref::input(r, i);
    for (std::uint64_t s = 0; s < steps; ++s) ref::apply(ref::matrix_of(g, s), x); // column n carries the weight
    for (int r = 0; r < p; ++r) {
      const auto& w = x[static_cast<std::size_t>(r)];
      CHECK(res.weight[static_cast<std::size_t>(r)] == doctest::Approx(static_cast<double>(w[n])).epsilon(1e-13));
      for (std::size_t i = 0; i < n; ++i)
        CHECK(res.estimate[static_cast<std::size_t>(r)][i] ==
              doctest::Approx(static_cast<double>(w[i] / w[n])).epsilon(1e-12).scale(1));
    }
  }
}

TEST_CASE("push_sum: a row-stochastic combine on the same directed graph is biased; push-sum is not") {
  const int p = 6;
  const std::size_t n = 1;
  std::vector<std::pair<int, int>> e;
  for (int i = 0; i < p; ++i) e.emplace_back(i, (i + p - 1) % p);
  e.emplace_back(0, 3);
  e.emplace_back(2, 3);
  const graph rows = from_edges(p, e, false, weighting::uniform);
  std::vector<double> biased(static_cast<std::size_t>(p));
  inproc::run(p, [&](inproc::communicator& c) {
    std::vector<double> x{static_cast<double>(c.rank())};
    for (std::uint64_t s = 0; s < 400; ++s) neighbor_allreduce(c, std::span<double>(x), rows, s);
    biased[static_cast<std::size_t>(c.rank())] = x[0];
  });
  CHECK(std::abs(biased[0] - 2.5) > 0.05); // the combine's fixed point is not the mean 2.5
  const result res = run_push_sum(p, from_edges(p, e, false, weighting::column_uniform), n, 400);
  (void)res;
  std::vector<double> fixed(static_cast<std::size_t>(p));
  inproc::run(p, [&](inproc::communicator& c) {
    std::vector<double> x{static_cast<double>(c.rank())}, est(1);
    double w = 1;
    for (std::uint64_t s = 0; s < 400; ++s)
      push_sum(c, std::span<double>(x), w, from_edges(p, e, false, weighting::column_uniform), s, std::span<double>(est));
    fixed[static_cast<std::size_t>(c.rank())] = est[0];
  });
  for (double v : fixed) CHECK(v == doctest::Approx(2.5).epsilon(1e-12));
}

TEST_CASE("push_sum: rejects row-stochastic-only graphs, bad weights and overlapping buffers on every rank") {
  const int p = 4;
  std::vector<std::string> seen(static_cast<std::size_t>(p));
  std::mutex mu;
  inproc::run(p, [&](inproc::communicator& c) {
    c.group().set_timeout(std::chrono::seconds(10));
    std::vector<float> x(3, 1.0f), est(3);
    double w = 1;
    try {
      push_sum(c, std::span<float>(x), w, star(p, weighting::uniform), 0, std::span<float>(est));
    } catch (const error& e) {
      std::lock_guard lk(mu);
      seen[static_cast<std::size_t>(c.rank())] = e.what();
    }
    double bad = 0;
    CHECK_THROWS_WITH_AS(push_sum(c, std::span<float>(x), bad, directed_ring(p), 0, std::span<float>(est)),
                         doctest::Contains("weight 0"), error);
    CHECK_THROWS_WITH_AS(push_sum(c, std::span<float>(x), w, directed_ring(p), 0, std::span<float>(x)),
                         doctest::Contains("overlaps"), error);
    barrier(c);
  });
  for (const auto& s : seen) CHECK(s.find("column 0: weights sum to") != std::string::npos);
}
