// QSGD: unbiased within the closed-form variance (norm/s)^2 p (1 - p), level
// grid, 4- and 8-bit code layouts, determinism, the shared family checks.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <gradsync/compress/qsgd.hpp>

#include "stochastic_common.hpp"

namespace cz = gradsync::compress;
using namespace quant;

namespace {
double l2(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}
} // namespace

TEST_CASE("qsgd: unbiased for s = 1, 3, 7, 8, 127") {
  std::vector<float> x = {0.9f, -0.7f, 0.5f, -0.25f, 0.1f, 0.0f, 0.3f, -0.01f, 0.4f, -0.6f};
  for (int i = 0; i < 20; ++i) x.push_back(std::cos(static_cast<float>(i) * 1.3f) * 0.4f);
  const double norm = static_cast<float>(l2(x)); // the codec stores the float norm
  for (std::uint16_t s : {1, 3, 7, 8, 127}) {
    std::vector<double> var;
    for (float v : x) {
      const double a = std::fabs(v) / norm * s;
      const double p = a - std::floor(a);
      var.push_back(norm * norm / (double(s) * s) * p * (1 - p));
    }
    CAPTURE(s);
    check_unbiased(cz::qsgd<float>{.block = 64, .rule = {.levels = s}}, x, var, norm, 12000);
  }
}

TEST_CASE("qsgd: decoded values lie on the level grid norm * l / s") {
  const auto x = gradient_like(3000, 17);
  for (std::uint16_t s : {2, 7, 100}) {
    const cz::qsgd<float> c{.block = 128, .rule = {.levels = s}};
    cz::stream_state st{.seed = 3};
    std::vector<std::byte> p;
    const auto y = roundtrip(c, x, st, &p);
    int bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float norm = cz::wire::load<float>(p.data() + scale_at(i / 128));
      const double level = std::fabs(y[i]) / norm * s;
      const double lx = std::fabs(x[i]) / norm * s;
      bad += std::fabs(level - std::round(level)) > 1e-4;                  // on the grid
      bad += std::round(level) < std::floor(lx) - 1e-4 || std::round(level) > std::ceil(lx) + 1e-4; // adjacent
      bad += y[i] != 0 && (y[i] < 0) != (x[i] < 0);
    }
    CHECK_MESSAGE(bad == 0, "levels ", s);
    CHECK(p[cz::wire::header_bytes + 6] == std::byte(s <= 7 ? 4 : 8));
  }
}

TEST_CASE("qsgd: invalid magnitudes and negative zero are rejected") {
  const std::vector<float> x(10, 0.0f); // all codes 0
  {
    const cz::qsgd<float> c{.block = 16, .rule = {.levels = 4}};
    cz::stream_state st;
    const auto p = cz::encode_to_vector(c, std::span<const float>(x), st);
    corrupt::expect_rejected(c, patched(p, codes_at(10, 16), std::byte{0x05}), 10,
                             "element 0 has invalid code 5");
    corrupt::expect_rejected(c, patched(p, codes_at(10, 16) + 1, std::byte{0x80}), 10,
                             "element 3 has invalid code 8");
    corrupt::expect_rejected(c, patched(p, cz::wire::header_bytes + 4, std::byte{0}), 10, "levels 0");
    corrupt::expect_rejected(c, patched(p, cz::wire::header_bytes + 4, std::byte{200}), 10, "levels 200");
    corrupt::expect_rejected(c, patched(p, cz::wire::header_bytes + 4, std::byte{9}), 10, "9 levels use 8");
  }
  {
    const cz::qsgd<float> c{.block = 16, .rule = {.levels = 100}};
    cz::stream_state st;
    const auto p = cz::encode_to_vector(c, std::span<const float>(x), st);
    corrupt::expect_rejected(c, patched(p, codes_at(10, 16) + 2, std::byte{101}), 10,
                             "element 2 has invalid code 101");
    corrupt::expect_rejected(c, patched(p, codes_at(10, 16) + 2, std::byte{0x80}), 10,
                             "element 2 has invalid code 128");
  }
  cz::qsgd<float> bad{.rule = {.levels = 0}};
  cz::stream_state st;
  std::vector<std::byte> out(4096);
  CHECK_THROWS_AS(bad.encode(std::span<const float>(x), st, {}, out), gradsync::error);
}

TEST_CASE("qsgd: a norm beyond the float range is clamped and stays unbiased-safe") {
  const std::vector<float> x = {3e38f, -3e38f, 3e38f, 1e38f};
  const cz::qsgd<float> c{.block = 4, .rule = {.levels = 7}};
  cz::stream_state st;
  std::vector<std::byte> p;
  const auto y = roundtrip(c, x, st, &p);
  CHECK(cz::wire::load<float>(p.data() + scale_at(0)) == flt_max);
  for (float v : y) CHECK(std::isfinite(v));
}

TEST_CASE("qsgd: deterministic Philox noise") { check_determinism(cz::qsgd<float>{}); }
TEST_CASE("qsgd: family checks, 4-bit") { common_checks(cz::qsgd<float>{.block = 32, .rule = {.levels = 5}}); }
TEST_CASE("qsgd: family checks, 8-bit") { common_checks(cz::qsgd<float>{.block = 48, .rule = {.levels = 64}}); }
TEST_CASE("qsgd: family checks, defaults") { common_checks(cz::qsgd<float>{}); }

// The feedback form (rule.unbiased = false, what error feedback runs): the
// same codes, each bucket's scale lambda ||x|| with lambda = ||x||^2 /
// E||Q(x)||^2 (E from the level probabilities, computed here in double),
// and the mean squared error ||x||^2 (1 - lambda) below ||x||^2 even where
// the unbiased form's variance is above it (s = 2, buckets of 256).
TEST_CASE("qsgd feedback form: same codes, scale lambda ||x||, a contraction") {
  const auto x = gradient_like(1200, 41);
  for (const auto& lb : {std::pair<std::uint16_t, std::uint32_t>{7, 128}, {2, 256}, {100, 64}}) {
    const std::uint16_t levels = lb.first; // (not a structured binding: clang 14 cannot capture one)
    const std::uint32_t block = lb.second;
    CAPTURE(levels);
    const std::size_t n = x.size(), nb = (n + block - 1) / block;
    const cz::qsgd<float> plain{.block = block, .rule = {.levels = levels}};
    const cz::qsgd<float> fb{.block = block, .rule = {.levels = levels, .unbiased = false}};
    cz::stream_state s1{.seed = 5, .step = 2, .rank = 3}, s2 = s1;
    const auto p1 = cz::encode_to_vector(plain, std::span<const float>(x), s1);
    const auto p2 = cz::encode_to_vector(fb, std::span<const float>(x), s2);
    REQUIRE(p1.size() == p2.size());
    CHECK(std::equal(p1.begin() + static_cast<std::ptrdiff_t>(codes_at(n, block)), p1.end(),
                     p2.begin() + static_cast<std::ptrdiff_t>(codes_at(n, block))));
    std::vector<double> l2(nb, 0.0), eq2(nb, 0.0), lambda(nb, 0.0);
    for (std::size_t b = 0; b < nb; ++b) {
      const double norm = cz::wire::load<float>(p1.data() + scale_at(b)); // the unbiased scale
      for (std::size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
        const double a = std::fabs(x[i]) / norm * levels, f = std::floor(a), p = a - f;
        l2[b] += static_cast<double>(x[i]) * x[i];
        eq2[b] += (f * f + (2 * f + 1) * p) * norm * norm / (double(levels) * levels); // E Q_i^2
      }
      lambda[b] = l2[b] / eq2[b];
      CAPTURE(b);
      CHECK(cz::wire::load<float>(p2.data() + scale_at(b)) == doctest::Approx(lambda[b] * norm).epsilon(1e-5));
      CHECK(lambda[b] <= 1.0);
    }
    const auto [err_fb, err_plain] = block_mse(fb, plain, x, block, 2000, 78);
    int above = 0;
    for (std::size_t b = 0; b < nb; ++b) {
      CAPTURE(b);
      CHECK(err_fb[b] == doctest::Approx(l2[b] * (1 - lambda[b])).epsilon(0.1));
      CHECK(err_plain[b] == doctest::Approx(eq2[b] - l2[b]).epsilon(0.1)); // the variance
      CHECK(err_fb[b] < l2[b]);
      above += err_plain[b] > l2[b];
    }
    if (levels == 2) CHECK(above > 0); // few levels, large buckets: the unbiased form expands
  }
}

TEST_CASE("qsgd feedback form: family checks") {
  common_checks(cz::qsgd<float>{.block = 32, .rule = {.levels = 5, .unbiased = false}});
  common_checks(cz::qsgd<float>{.block = 48, .rule = {.levels = 64, .unbiased = false}});
}
