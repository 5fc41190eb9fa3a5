// Approximate top-k: the sent set is always the exact top-e of the tensor,
// the achieved density stays in a stated band, fallbacks, determinism,
// non-finite inputs, corruption.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include <gradsync/compress/approx_topk.hpp>

#include "corrupt.hpp"
#include "sparse_ref.hpp"

namespace cz = gradsync::compress;
using gradsync::bfloat16;
using gradsync::half;

namespace {

template <class T>
std::vector<std::byte> enc(const cz::approx_topk<T>& c, const std::vector<T>& x,
                           cz::approx_topk_state& st) {
  return cz::encode_to_vector(c, std::span<const T>(x), st);
}

// The payload's entries are exactly the reference top-e, e = entries sent,
// and the decoded tensor is x on them, zero elsewhere.
template <class T>
void check_exact_prefix(const cz::approx_topk<T>& c, const std::vector<T>& x,
                        const std::vector<std::byte>& p, const cz::approx_topk_state& st) {
  const auto got = sparse_ref::read<T>(p, 16);
  CHECK(got.index.size() == st.sent);
  CHECK(st.sent <= cz::approx_topk<T>::target(c.density, x.size()));
  REQUIRE(got.index == sparse_ref::top_indices(x, st.sent));
  sparse_ref::check_decoded(x, got.index, cz::decode_to_vector(c, p));
}

template <class T> void random_sweep(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int t = 0; t < 40; ++t) {
    const std::size_t n = 1 + rng() % 60000;
    const double density = std::uniform_real_distribution<double>(0.0, 0.05)(rng);
    std::vector<T> x = t % 2 ? sparse_ref::tied_values<T>(rng, n) : std::vector<T>(n);
    if (t % 2 == 0)
      for (auto& v : x) v = T(g(rng));
    const cz::approx_topk<T> c{.density = density};
    cz::approx_topk_state st{.seed = seed, .step = static_cast<std::uint64_t>(t)};
    check_exact_prefix(c, x, enc(c, x, st), st);
  }
}

} // namespace

TEST_CASE("approx top-k sends the exact top-e for the e it sends") {
  random_sweep<float>(1);
  random_sweep<half>(2);
  random_sweep<bfloat16>(3);
}

TEST_CASE("approx top-k achieved density stays in [0.7, 1] x target, mean >= 0.97") {
  // The threshold aims at 1.3 k candidates from ~128 sampled hits, so fewer
  // than k candidates needs a -3.3 sigma sample (p ~ 5e-4 per call) and even
  // then the deficit is bounded by the overshoot: 1/1.3 = 0.77 minus a few
  // sigma of 7.8 %; 0.7 is the band edge. Inputs: Gaussian and heavy-tailed.
  std::mt19937_64 rng(5);
  const std::size_t n = std::size_t{1} << 20;
  std::vector<float> gauss(n), heavy(n);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::cauchy_distribution<float> cauchy(0.0f, 1.0f);
  for (auto& v : gauss) v = g(rng);
  for (auto& v : heavy) v = cauchy(rng);
  for (const auto* x : {&gauss, &heavy}) {
    for (double density : {0.001, 0.01, 0.1}) {
      const cz::approx_topk<float> c{.density = density};
      cz::approx_topk_state st{.seed = 42, .rank = 3};
      double sum = 0.0, lo = 1.0;
      const int steps = 12;
      for (int t = 0; t < steps; ++t) {
        const auto p = enc(c, *x, st);
        const double ratio = st.achieved_density / density;
        CHECK(ratio >= 0.7);
        CHECK(ratio <= 1.0 + 1.0 / static_cast<double>(n) / density);
        CHECK(st.fallbacks == 0);
        sum += ratio;
        lo = std::min(lo, ratio);
        if (t == 0) check_exact_prefix(c, *x, p, st);
      }
      CHECK(st.step == steps);
      CHECK(sum / steps >= 0.97);
      std::printf("approx_topk %-8s density %.3f: achieved/target mean %.4f min %.4f\n",
                  x == &gauss ? "gauss" : "cauchy", density, sum / steps, lo);
    }
  }
}

TEST_CASE("approx top-k falls back to an exact select on massive ties") {
  const std::vector<float> z(100000, 0.0f);
  const cz::approx_topk<float> c{.density = 0.01};
  cz::approx_topk_state st;
  const auto p = enc(c, z, st);
  CHECK(st.fallbacks == 1);
  CHECK(st.sent == 1000);
  CHECK(st.achieved_density == doctest::Approx(0.01));
  const auto e = sparse_ref::read<float>(p, 16);
  for (std::uint32_t j = 0; j < e.index.size(); ++j) CHECK(e.index[j] == j); // tie rule
  for (float v : cz::decode_to_vector(c, p)) CHECK(v == 0.0f);                // no NaN
}

TEST_CASE("approx top-k is deterministic in (seed, step, rank)") {
  std::mt19937_64 rng(9);
  std::vector<float> x(50000);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : x) v = u(rng);
  const cz::approx_topk<float> c{.density = 0.002};
  cz::approx_topk_state a{.seed = 7, .step = 3, .rank = 1}, b = a;
  CHECK(enc(c, x, a) == enc(c, x, b));
  CHECK(a.step == 4);
}

TEST_CASE("approx top-k edge cases and non-finite inputs") {
  cz::approx_topk_state st;
  for (double d : {0.0, 1.0, 0.5}) {
    for (std::size_t n : {0u, 1u, 2u, 1000u}) {
      std::vector<float> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 37) % 101) - 50.0f;
      const cz::approx_topk<float> c{.density = d};
      const auto p = enc(c, x, st);
      CHECK(st.sent == cz::approx_topk<float>::target(d, n));
      check_exact_prefix(c, x, p, st);
    }
  }
  std::vector<float> x(1);
  for (double bad : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    const cz::approx_topk<float> c{.density = bad};
    std::vector<std::byte> ws(64), out(1024);
    CHECK_THROWS_WITH_AS(c.encode(x, st, ws, out), doctest::Contains("density"), gradsync::error);
  }

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<half> y(200000);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (auto& v : y) v = half(g(rng));
  y[12345] = half(nan);
  y[54321] = half(-inf);
  const cz::approx_topk<half> c{.density = 0.001};
  const auto p = enc(c, y, st);
  check_exact_prefix(c, y, p, st);
  const auto d = cz::decode_to_vector(c, p);
  CHECK(std::isnan(static_cast<float>(d[12345])));
  CHECK(static_cast<float>(d[54321]) == -inf);
}

TEST_CASE("approx top-k decoders reject truncated, corrupted and inconsistent payloads") {
  std::mt19937_64 rng(11);
  const auto x = sparse_ref::tied_values<float>(rng, 5000);
  const cz::approx_topk<float> c{.density = 0.004};
  cz::approx_topk_state st;
  const auto p = enc(c, x, st);
  REQUIRE(st.sent == 20);
  corrupt::check_decoder(c, p);
  const auto xb = sparse_ref::tied_values<bfloat16>(rng, 40);
  const cz::approx_topk<bfloat16> cb{.density = 0.5};
  corrupt::check_decoder(cb, enc(cb, xb, st));

  const auto e = sparse_ref::read<float>(p, 16);
  corrupt::expect_rejected(c, sparse_ref::with_index(p, 16, 19, 5000), 5000, "outside");
  corrupt::expect_rejected(c, sparse_ref::with_index(p, 16, 3, e.index[2]), 5000,
                           "not above the previous");
  corrupt::expect_rejected(c, sparse_ref::with_param(p, 8, 21), 5000, "exceed the density");
  corrupt::expect_rejected(c, sparse_ref::with_param(p, 8, 19), 5000, "body is");
  double bad = 1.5;
  std::uint64_t bits;
  std::memcpy(&bits, &bad, 8);
  corrupt::expect_rejected(c, sparse_ref::with_param(p, 0, bits), 5000, "density");
  bad = std::numeric_limits<double>::quiet_NaN();
  std::memcpy(&bits, &bad, 8);
  corrupt::expect_rejected(c, sparse_ref::with_param(p, 0, bits), 5000, "density");
}

TEST_CASE("approx_topk: the candidate scan (vector and scalar paths) keeps index order, counts past the buffer") {
  std::mt19937_64 rng(77);
  std::normal_distribution<float> nd;
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 1000u, 4099u}) {
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    if (n > 9) {
      x[3] = std::numeric_limits<float>::quiet_NaN(); // keys above every number
      x[5] = -std::numeric_limits<float>::infinity();
      x[8] = -0.0f;
    }
    for (std::uint32_t thr : {0u, 0x3f000000u, 0x3fc00000u, 0x7f800000u, 0x7fffffffu}) {
      for (std::size_t cap : {std::size_t{0}, std::size_t{3}, n}) {
        std::vector<std::uint32_t> want;
        for (std::size_t i = 0; i < n; ++i)
          if (cz::sparse::magnitude_key(x[i]) >= thr) want.push_back(static_cast<std::uint32_t>(i));
        std::vector<std::uint32_t> got(cap + 1, 0xdeadbeefu);
        const std::size_t c = cz::sparse::collect_at_least(x.data(), n, thr, got.data(), cap);
        CAPTURE(n);
        CAPTURE(thr);
        CAPTURE(cap);
        CHECK(c == want.size());
        for (std::size_t j = 0; j < std::min(c, cap); ++j) CHECK(got[j] == want[j]);
        CHECK(got[cap] == 0xdeadbeefu); // nothing written past the buffer
      }
    }
  }
}
