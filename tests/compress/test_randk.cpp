// Random-k: the index permutation is a bijection, the decoder regenerates the
// indices, the estimate is unbiased (mean of many seeded draws within a bound
// derived from the variance), shared vs per-rank indices, poisoning, corruption.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include <gradsync/compress/error_feedback.hpp>
#include <gradsync/compress/randk.hpp>

#include "corrupt.hpp"

namespace cz = gradsync::compress;
using gradsync::bfloat16;
using gradsync::half;

namespace {

template <class T>
std::vector<std::byte> enc(const cz::randomk<T>& c, const std::vector<T>& x, cz::stream_state& st) {
  return cz::encode_to_vector(c, std::span<const T>(x), st);
}

// Indices of the k entries of step `step` (regenerated independently of the codec object).
std::vector<std::uint64_t> drawn(std::uint64_t seed, std::uint32_t step, std::uint32_t key,
                                 std::size_t n, std::size_t k) {
  const cz::random_permutation perm(cz::philox_stream{seed, step, key}, n);
  std::vector<std::uint64_t> idx;
  for (std::size_t j = 0; j < k; ++j) idx.push_back(perm(j));
  return idx;
}

} // namespace

TEST_CASE("random permutation is a bijection of [0, n)") {
  for (std::uint64_t n : {1u, 2u, 3u, 5u, 7u, 8u, 64u, 100u, 1000u, 65537u}) {
    for (std::uint32_t step = 0; step < 3; ++step) {
      const cz::random_permutation perm(cz::philox_stream{99, step, 4}, n);
      std::vector<char> seen(n, 0);
      for (std::uint64_t j = 0; j < n; ++j) {
        const std::uint64_t i = perm(j);
        REQUIRE(i < n);
        CHECK(seen[i] == 0);
        seen[i] = 1;
      }
    }
  }
}

TEST_CASE("random-k decode regenerates the indices and scales by n/k") {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (std::size_t n : {1u, 10u, 1000u, 4097u}) {
    std::vector<float> x(n);
    for (auto& v : x) v = g(rng);
    for (std::size_t k : {0u, 1u, 7u, 1000u, 5000u}) {
      const cz::randomk<float> c{.k = k};
      cz::stream_state st{.seed = 17, .step = 5, .rank = 2};
      const auto p = enc(c, x, st);
      CHECK(st.step == 6);
      const std::size_t e = std::min(k, n);
      CHECK(p.size() == cz::wire::header_bytes + 32 + 4 * e);
      const auto idx = drawn(17, 5, cz::randomk_shared_key, n, e);
      const auto d = cz::decode_to_vector(c, p);
      std::vector<float> expect(n, 0.0f);
      const float scale = static_cast<float>(static_cast<double>(n) / static_cast<double>(e));
      for (auto i : idx) expect[i] = scale * x[i];
      CHECK(d == expect);
      if (e == n) CHECK(d == x); // everything sent, scale 1
    }
  }
  const std::vector<float> empty;
  cz::stream_state st;
  CHECK(cz::decode_to_vector(cz::randomk<float>{.k = 3}, enc(cz::randomk<float>{.k = 3}, empty, st))
            .empty());
}

TEST_CASE("random-k indices: shared across ranks by default, per rank on request") {
  const std::size_t n = 100000, k = 100;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i) + 1.0f;
  auto indices = [&](bool shared, std::uint32_t rank) {
    const cz::randomk<float> c{.k = k, .shared_indices = shared};
    cz::stream_state st{.seed = 5, .step = 0, .rank = rank};
    const auto p = enc(c, x, st);
    std::vector<std::uint64_t> idx;
    const auto* v = p.data() + cz::wire::header_bytes + 32;
    for (std::size_t j = 0; j < k; ++j)
      idx.push_back(static_cast<std::uint64_t>(cz::wire::load<float>(v + 4 * j)) - 1);
    return idx;
  };
  CHECK(indices(true, 0) == indices(true, 3));
  CHECK(indices(false, 0) != indices(false, 3));
  CHECK(indices(false, 3) == drawn(5, 0, 3, n, k));
  // Distinct steps draw distinct sets.
  CHECK(drawn(5, 0, 7, n, k) != drawn(5, 1, 7, n, k));
}

TEST_CASE("random-k is unbiased: the mean of many draws converges to x") {
  // decoded_i = (n/k) x_i with probability k/n, else 0, so E = x_i and
  // Var = x_i^2 (n/k - 1). Over m draws the mean's error has standard deviation
  // |x_i| sqrt((n/k - 1) / m); every element must lie within 5 of those, the
  // normalised squared errors must average to 1 within 5 sqrt(2/n). And since
  // every draw has exactly k entries scaled by n/k, sum_i decoded_i / x_i = n
  // in every draw: the sign-aligned sum of z / sqrt(n) vanishes up to rounding
  // (a 1 % scale error moves it to about 6 at m = 50000).
  for (auto [n, k] : {std::pair<std::size_t, std::size_t>{64, 8}, {100, 7}}) {
    std::mt19937_64 rng(n);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<half> x(n);
    for (auto& v : x) {
      const float a = g(rng);
      v = half(a + (a >= 0.0f ? 0.5f : -0.5f)); // |x_i| >= 0.5: a nonzero spread
    }
    const cz::randomk<half> c{.k = k};
    cz::stream_state st{.seed = 2024};
    const int m = 50000;
    std::vector<double> sum(n, 0.0);
    std::vector<int> hits(n, 0);
    std::vector<float> acc(n);
    for (int t = 0; t < m; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      c.decode_accumulate(enc(c, x, st), std::span(acc));
      for (std::size_t i = 0; i < n; ++i) {
        sum[i] += acc[i];
        hits[i] += acc[i] != 0.0f;
      }
    }
    const double ratio = static_cast<double>(n) / static_cast<double>(k);
    double z2 = 0.0, worst = 0.0, signed_sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double xi = static_cast<float>(x[i]);
      const double sd = std::fabs(xi) * std::sqrt((ratio - 1.0) / m);
      const double z = (sum[i] / m - xi) / sd;
      CHECK(std::fabs(z) < 5.0);
      z2 += z * z;
      signed_sum += xi > 0 ? z : -z;
      worst = std::max(worst, std::fabs(z));
      // inclusion frequency k/n, binomial spread
      const double p = 1.0 / ratio, f = static_cast<double>(hits[i]) / m;
      CHECK(std::fabs(f - p) < 5.0 * std::sqrt(p * (1.0 - p) / m));
    }
    z2 /= static_cast<double>(n);
    CHECK(std::fabs(z2 - 1.0) < 5.0 * std::sqrt(2.0 / static_cast<double>(n)));
    const double bias_z = signed_sum / std::sqrt(static_cast<double>(n));
    CHECK(std::fabs(bias_z) < 0.05);
    std::printf("randomk n=%zu k=%zu, %d draws: mean z^2 %.3f, worst |z| %.2f, bias z %.2f\n", n,
                k, m, z2, worst, bias_z);
  }
}

TEST_CASE("random-k without scaling is contractive and stable under error feedback") {
  std::mt19937_64 rng(12);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const std::size_t n = 256, k = 16;
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng);
  const cz::randomk<float> c{.k = k, .unbiased = false};
  cz::stream_state st{.seed = 4};
  const auto p = enc(c, x, st);
  const auto d = cz::decode_to_vector(c, p);
  std::vector<float> expect(n, 0.0f);
  for (auto i : drawn(4, 0, cz::randomk_shared_key, n, k)) expect[i] = x[i];
  CHECK(d == expect);

  // Error feedback: the residual stays bounded, so the running sum of decoded
  // gradients tracks the running sum of true gradients. For a constant
  // gradient each coordinate accumulates until it is drawn (probability
  // p = k/n per step), so its residual is A x_i with A geometric on {0, 1, ..}:
  // E[A^2] = (1 - p)(2 - p) / p^2, i.e. |residual| ~ 21.6 |g| for n/k = 16.
  // The gap must stay below twice that (the scaled variant diverges).
  const cz::error_feedback<cz::randomk<float>> ef{.inner = c};
  cz::error_feedback<cz::randomk<float>>::state es;
  std::vector<float> sum(n, 0.0f);
  const int steps = 200;
  for (int t = 0; t < steps; ++t)
    ef.decode_accumulate(cz::encode_to_vector(ef, std::span<const float>(x), es), std::span(sum));
  double gap = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double diff = sum[i] - static_cast<double>(steps) * x[i];
    gap += diff * diff;
    norm += static_cast<double>(x[i]) * x[i];
  }
  const double ratio = std::sqrt(gap / norm);
  std::printf("randomk unscaled under error feedback: |sum decoded - sum g| = %.2f |g| after %d "
              "steps\n", ratio, steps);
  const double pk = static_cast<double>(k) / static_cast<double>(n);
  CHECK(ratio < 2.0 * std::sqrt((1.0 - pk) * (2.0 - pk)) / pk);
}

TEST_CASE("random-k poisons a tensor holding NaN or Inf") {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    std::vector<bfloat16> x(1000, bfloat16(1.0f));
    x[777] = bfloat16(bad); // almost surely not among the 3 drawn entries
    const cz::randomk<bfloat16> c{.k = 3};
    cz::stream_state st;
    const auto p = enc(c, x, st);
    for (bfloat16 v : cz::decode_to_vector(c, p)) CHECK(std::isnan(static_cast<float>(v)));
    std::vector<float> acc(1000, 2.0f);
    c.decode_accumulate(p, std::span(acc));
    for (float v : acc) CHECK(std::isnan(v));
  }
}

TEST_CASE("random-k decoders reject truncated, corrupted and inconsistent payloads") {
  std::vector<float> x(300);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) + 2.0f;
  const cz::randomk<float> c{.k = 40};
  cz::stream_state st{.seed = 1};
  const auto p = enc(c, x, st);
  corrupt::check_decoder(c, p);
  const cz::randomk<half> ch{.k = 5, .shared_indices = false};
  std::vector<half> xh(20, half(0.5f));
  corrupt::check_decoder(ch, enc(ch, xh, st));
  xh[3] = half(std::numeric_limits<float>::infinity());
  corrupt::check_decoder(ch, enc(ch, xh, st)); // poisoned

  auto with = [&](std::size_t at, auto v) {
    std::vector<std::byte> q = p;
    cz::wire::store(q.data() + at, v);
    cz::wire::seal(q);
    return q;
  };
  const std::size_t par = cz::wire::header_bytes, body = par + 32;
  corrupt::expect_rejected(c, with(par, std::uint64_t{301}), 300, "entries for");
  corrupt::expect_rejected(c, with(par, std::uint64_t{41}), 300, "body is");
  corrupt::expect_rejected(c, with(par + 24, std::uint32_t{4}), 300, "flags");
  corrupt::expect_rejected(c, with(par + 28, std::uint32_t{1}), 300, "padding");
  corrupt::expect_rejected(c, with(par + 24, std::uint32_t{1}), 300, "poisoned");
  corrupt::expect_rejected(c, with(body + 8, std::numeric_limits<float>::infinity()), 300,
                           "not finite");
}
