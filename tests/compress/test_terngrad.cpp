// TernGrad: unbiased within the closed-form variance |x| (s - |x|), values in
// {0, +-s}, determinism of the Philox noise, the shared family checks.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <gradsync/compress/terngrad.hpp>

#include "stochastic_common.hpp"

namespace cz = gradsync::compress;
using namespace quant;

TEST_CASE("terngrad: decoded values are 0 or +-max|x| with the sign of x") {
  const auto x = gradient_like(2000, 2);
  const cz::terngrad<float> c{.block = 100};
  cz::stream_state st{.seed = 1};
  const auto y = roundtrip(c, x, st);
  const auto m = block_absmax(x, 100);
  int bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float s = m[i / 100];
    bad += !(y[i] == 0.0f || (y[i] == s && x[i] > 0) || (y[i] == -s && x[i] < 0));
    if (std::fabs(x[i]) == s) bad += y[i] != x[i]; // the maximum is always kept
  }
  CHECK(bad == 0);
}

TEST_CASE("terngrad: unbiased (mean of 20000 draws within 5 standard errors)") {
  std::vector<float> x = {1.0f, -1.0f, 0.5f, -0.25f, 0.1f, 0.0f, 0.9f, -0.01f, 0.3333f, -0.75f};
  for (int i = 0; i < 22; ++i) x.push_back(std::sin(static_cast<float>(i) * 0.7f) * 0.8f);
  std::vector<double> var;
  for (float v : x) var.push_back(std::fabs(v) * (1.0 - std::fabs(v))); // s = 1
  check_unbiased(cz::terngrad<float>{.block = 64}, x, var, 1.0, 20000);
}

TEST_CASE("terngrad: deterministic Philox noise") { check_determinism(cz::terngrad<float>{}); }

TEST_CASE("terngrad: code 3 is rejected") {
  const auto x = gradient_like(40, 3);
  const cz::terngrad<float> c{.block = 64};
  cz::stream_state st;
  auto p = cz::encode_to_vector(c, std::span<const float>(x), st);
  const std::size_t at = codes_at(40, 64) + 2; // elements 8..11
  corrupt::expect_rejected(c, patched(p, at, std::byte{0x03}), 40, "element 8 has invalid code 3");
}

TEST_CASE("terngrad: family checks") { common_checks(cz::terngrad<float>{.block = 32}); }
TEST_CASE("terngrad: family checks, default block") { common_checks(cz::terngrad<float>{}); }

// The feedback form (rule.unbiased = false, what error feedback runs): the
// same codes from the same noise, each block's scale ||x||^2 / ||x||_1
// instead of max|x|, and a contraction E||x - C(x)||^2 = ||x||^2 (1 -
// ||x||^2 / (s ||x||_1)) where the unbiased form's error, s ||x||_1 -
// ||x||^2, exceeds ||x||^2.
TEST_CASE("terngrad feedback form: same codes, scale ||x||^2 / ||x||_1, a contraction") {
  const std::size_t n = 1000, block = 128, nb = (n + block - 1) / block;
  const auto x = gradient_like(n, 31);
  const cz::terngrad<float> plain{.block = block};
  const cz::terngrad<float> fb{.block = block, .rule = {.unbiased = false}};
  cz::stream_state s1{.seed = 4, .step = 9, .rank = 1}, s2 = s1;
  const auto p1 = cz::encode_to_vector(plain, std::span<const float>(x), s1);
  const auto p2 = cz::encode_to_vector(fb, std::span<const float>(x), s2);
  REQUIRE(p1.size() == p2.size());
  CHECK(std::equal(p1.begin() + static_cast<std::ptrdiff_t>(codes_at(n, block)), p1.end(),
                   p2.begin() + static_cast<std::ptrdiff_t>(codes_at(n, block))));
  std::vector<double> l1(nb, 0.0), l2(nb, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    l1[i / block] += std::fabs(x[i]);
    l2[i / block] += static_cast<double>(x[i]) * x[i];
  }
  const auto amax = block_absmax(x, block);
  for (std::size_t b = 0; b < nb; ++b) {
    CAPTURE(b);
    const double want = l2[b] / l1[b];
    const float got = cz::wire::load<float>(p2.data() + scale_at(b));
    CHECK(got == doctest::Approx(want).epsilon(2e-5)); // the uniforms' 2^-24 grid moves it by less
    CHECK(got <= amax[b]);
    CHECK(cz::wire::load<float>(p1.data() + scale_at(b)) == amax[b]);
  }

  // Mean squared error over many draws, per block, against the closed forms.
  const auto [err_fb, err_plain] = block_mse(fb, plain, x, block, 3000, 77);
  int above = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    CAPTURE(b);
    const double s = amax[b];
    CHECK(err_fb[b] == doctest::Approx(l2[b] * (1 - l2[b] / (s * l1[b]))).epsilon(0.1));
    CHECK(err_plain[b] == doctest::Approx(s * l1[b] - l2[b]).epsilon(0.1));
    CHECK(err_fb[b] < l2[b]);
    above += err_plain[b] > l2[b];
  }
  CHECK(above > 0); // the unbiased form is no contraction on these blocks
}

TEST_CASE("terngrad feedback form: family checks") {
  common_checks(cz::terngrad<float>{.block = 32, .rule = {.unbiased = false}});
}
