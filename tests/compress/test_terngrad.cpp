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
