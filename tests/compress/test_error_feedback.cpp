// Error feedback: the telescoping identity sum(decoded) = sum(g) - e_T, a
// bounded residual where the plain codec drifts, DGC momentum correction and
// masking, the non-finite policy, saturation for half, state checks.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <gradsync/compress/cast.hpp>
#include <gradsync/compress/error_feedback.hpp>
#include <gradsync/compress/int8.hpp>
#include <gradsync/compress/qsgd.hpp>
#include <gradsync/compress/sign.hpp>

#include "quant_common.hpp"

namespace cz = gradsync::compress;
using namespace quant;

static_assert(cz::codec<cz::error_feedback<cz::int8<float>>>);
static_assert(cz::codec<cz::error_feedback<cz::qsgd<gradsync::half>>>);

namespace {

double norm2(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

struct run_result {
  std::vector<double> sum_g, sum_dec; // in double, independent of the codec
  double max_g_norm = 0, max_g_abs = 0;
};

// T steps of gradient-like inputs through codec C (EF-wrapped or not).
template <class C> run_result run(const C& c, typename C::state& st, std::size_t n, int steps) {
  run_result r{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0), 0.0, 0.0};
  for (int t = 0; t < steps; ++t) {
    auto g = gradient_like(n, 100 + static_cast<std::uint64_t>(t));
    for (float& v : g) v += 0.01f; // a persistent bias the sign codec would lose
    const auto p = cz::encode_to_vector(c, std::span<const float>(g), st);
    std::vector<float> y(n, 0.0f);
    c.decode_accumulate(p, std::span(y));
    double gn = 0;
    for (std::size_t i = 0; i < n; ++i) {
      r.sum_g[i] += g[i];
      r.sum_dec[i] += y[i];
      gn += double(g[i]) * g[i];
      r.max_g_abs = std::max(r.max_g_abs, double(std::fabs(g[i])));
    }
    r.max_g_norm = std::max(r.max_g_norm, std::sqrt(gn));
  }
  return r;
}

std::vector<double> diff(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

} // namespace

TEST_CASE("EF(int8): sum of decoded = sum of inputs - final residual; residual stays tiny") {
  const std::size_t n = 1000;
  const int steps = 100;
  cz::error_feedback<cz::int8<float>> c{.inner = {.block = 64}};
  decltype(c)::state st;
  const auto r = run(c, st, n, steps);
  REQUIRE(st.residual.size() == n);
  const auto gap = diff(r.sum_g, r.sum_dec);
  double worst = 0, res_max = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(gap[i] - st.residual[i]));
    res_max = std::max(res_max, double(std::fabs(st.residual[i])));
  }
  CHECK(worst <= 1e-5 * r.max_g_abs * steps); // float rounding of the per-step updates only
  // |e| <= max|e + g| / 254 per step: one quantisation step, not an accumulation.
  CHECK(res_max <= 1.01 * r.max_g_abs / 253);
}

TEST_CASE("EF(sign): bounded residual where plain sign drifts linearly") {
  const std::size_t n = 2048;
  const int steps = 200;
  cz::error_feedback<cz::sign<float>> ef{.inner = {.block = 256}};
  decltype(ef)::state st;
  const auto with = run(ef, st, n, steps);
  cz::sign<float> plain{.block = 256};
  cz::no_state none;
  const auto without = run(plain, none, n, steps);

  const double gap_ef = norm2(diff(with.sum_g, with.sum_dec));
  const double gap_plain = norm2(diff(without.sum_g, without.sum_dec));
  std::vector<double> e(st.residual.begin(), st.residual.end());
  CHECK(std::fabs(gap_ef - norm2(e)) <= 1e-4 * gap_ef + 1e-6); // the identity, in norm
  MESSAGE("sign over ", steps, " steps: |sum g - sum decoded| = ", gap_ef, " with EF, ", gap_plain,
          " without; max |g_t| = ", with.max_g_norm);
  CHECK(gap_ef <= 6 * with.max_g_norm); // bounded by a few gradients, independent of T
  CHECK(gap_plain >= 5 * gap_ef);       // what EF is for
}

TEST_CASE("EF(qsgd): the identity holds for a stochastic codec too") {
  const std::size_t n = 500;
  cz::error_feedback<cz::qsgd<float>> c{.inner = {.block = 50, .rule = {.levels = 3}}};
  decltype(c)::state st;
  st.inner = {.seed = 77, .step = 0, .rank = 2};
  const auto r = run(c, st, n, 50);
  CHECK(st.inner.step == 50);
  const auto gap = diff(r.sum_g, r.sum_dec);
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(gap[i] - st.residual[i]));
  CHECK(worst <= 1e-4);
}

TEST_CASE("EF momentum correction: transmits the momentum sum; masking clears sent entries") {
  const std::size_t n = 300;
  const float m = 0.9f;
  // Nearly lossless inner codec: decoded sum tracks sum_t u_t, u_t = m u + g.
  cz::error_feedback<cz::fp16<float>> c{.inner = {}, .momentum = m, .mask_momentum = false};
  decltype(c)::state st;
  std::vector<double> u(n, 0.0), sum_u(n, 0.0), sum_dec(n, 0.0);
  for (int t = 0; t < 40; ++t) {
    const auto g = gradient_like(n, 500 + static_cast<std::uint64_t>(t));
    const auto p = cz::encode_to_vector(c, std::span<const float>(g), st);
    std::vector<float> y(n, 0.0f);
    c.decode_accumulate(p, std::span(y));
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + g[i];
      sum_u[i] += u[i];
      sum_dec[i] += y[i];
    }
  }
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(sum_u[i] - sum_dec[i] - st.residual[i]));
    scale = std::max(scale, std::fabs(sum_u[i]));
    CHECK(st.momentum[i] == doctest::Approx(u[i]).epsilon(1e-4));
  }
  CHECK(worst <= 1e-5 * scale);

  // Masking with int8: elements that quantise to 0 keep their momentum.
  cz::error_feedback<cz::int8<float>> mk{.inner = {.block = 8}, .momentum = 0.5f};
  decltype(mk)::state ms;
  const std::vector<float> g = {100.0f, 0.1f, -0.2f, 50.0f, 0.3f, 0.0f, -100.0f, 0.01f};
  const auto p = cz::encode_to_vector(mk, std::span<const float>(g), ms);
  std::vector<float> y(g.size(), 0.0f);
  mk.decode_accumulate(p, std::span(y));
  for (std::size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CHECK(ms.momentum[i] == (y[i] != 0.0f ? 0.0f : g[i])); // step 1: u = g
    CHECK(ms.residual[i] == g[i] - y[i]);
  }
}

TEST_CASE("EF non-finite input: payload shows it, residual and momentum are kept") {
  cz::error_feedback<cz::int8<float>> c{.inner = {.block = 4}, .momentum = 0.5f};
  decltype(c)::state st;
  const std::vector<float> g1 = {1.0f, 2.0f, 3.0f, 4.0f, 0.5f, 0.25f, 0.125f, 1.0f};
  cz::encode_to_vector(c, std::span<const float>(g1), st);
  const auto e = st.residual, u = st.momentum;
  auto g2 = g1;
  g2[5] = qnan;
  const auto p = cz::encode_to_vector(c, std::span<const float>(g2), st);
  std::vector<float> y(8, 0.0f);
  c.decode_accumulate(p, std::span(y));
  for (int i = 0; i < 4; ++i) CHECK(std::isfinite(y[i]));
  for (int i = 4; i < 8; ++i) CHECK(std::isnan(y[i]));
  CHECK(st.residual == e);
  CHECK(st.momentum == u);
  g2[5] = inf;
  cz::encode_to_vector(c, std::span<const float>(g2), st);
  CHECK(st.residual == e);
}

TEST_CASE("EF half: the corrected value saturates, the excess stays in the residual") {
  using gradsync::half;
  cz::error_feedback<cz::int8<half>> c{.inner = {.block = 2}};
  decltype(c)::state st;
  st.residual = {60000.0f, -60000.0f, 1.0f};
  const std::vector<half> g = {half(60000.0f), half(-60000.0f), half(1.0f)};
  const auto p = cz::encode_to_vector(c, std::span<const half>(g), st);
  std::vector<float> y(3, 0.0f);
  c.decode_accumulate(p, std::span(y));
  CHECK(std::isfinite(y[0]));
  CHECK(y[0] == doctest::Approx(65504.0f).epsilon(0.005));
  CHECK(st.residual[0] == 120000.0f - y[0]);
  CHECK(st.residual[1] == -120000.0f - y[1]);
}

TEST_CASE("EF argument checks") {
  cz::error_feedback<cz::int8<float>> c{};
  decltype(c)::state st;
  std::vector<float> g(10, 1.0f), h(11, 1.0f);
  cz::encode_to_vector(c, std::span<const float>(g), st);
  CHECK_THROWS_WITH_AS(cz::encode_to_vector(c, std::span<const float>(h), st),
                       doctest::Contains("one state per tensor"), gradsync::error);
  st.reset();
  cz::encode_to_vector(c, std::span<const float>(h), st); // fine after reset
  c.momentum = 1.0f;
  CHECK_THROWS_AS(cz::encode_to_vector(c, std::span<const float>(h), st), gradsync::error);
  c.momentum = 0.0f;
  std::vector<std::byte> ws(c.workspace_bytes(11) - 1), out(c.max_encoded_bytes(11));
  CHECK_THROWS_AS(c.encode(std::span<const float>(h), st, ws, out), gradsync::error);
  // Empty tensors work.
  decltype(c)::state e;
  const auto p = cz::encode_to_vector(c, std::span<const float>(), e);
  CHECK(cz::wire::count_of(p) == 0);
}
