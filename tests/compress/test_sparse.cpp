// sparse.hpp's one-pass error-feedback encode (folded_input), as the three
// sparsifiers expose it (encode_feedback): payload and residual bitwise equal
// to the separate steps done by hand here: v = in + residual, x = v, encode
// x, residual = (v - x) + (x - decoded), non-finite parts dropped. Covers the
// sampled path, its fallbacks (ties, a missed sample), no selection at all
// (k = 0, k = n, tiny tensors), NaN and Inf in the input or residual, and
// signed zeros.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gradsync/compress/approx_topk.hpp>
#include <gradsync/compress/threshold.hpp>
#include <gradsync/compress/topk.hpp>

namespace cz = gradsync::compress;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One error-feedback step both ways; `st` is copied so both see the same state.
template <class K> void check_step(const K& k, typename K::state st, const std::vector<float>& g, std::vector<float> res) {
  const std::size_t n = g.size();
  std::vector<std::byte> ws(k.workspace_bytes(n)), want(k.max_encoded_bytes(n)), got(want.size());
  // By hand.
  std::vector<float> x(n), want_res(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float v = g[i] + res[i];
    x[i] = v;
    const float e = v - x[i];
    want_res[i] = std::isfinite(e) ? e : 0.0f;
  }
  auto st_ref = st;
  want.resize(k.encode(std::span<const float>(x), st_ref, ws, want));
  std::vector<float> dec(n, 0.0f);
  k.decode_accumulate(want, std::span<float>(dec));
  for (std::size_t i = 0; i < n; ++i)
    if (const float e = x[i] - dec[i]; std::isfinite(e)) want_res[i] += e;
  // One pass.
  got.resize(k.encode_feedback(std::span<const float>(g), std::span<float>(res), st, ws, got));
  CHECK(got == want);
  CHECK(same_bits(res, want_res));
  if constexpr (requires { st.step; }) CHECK(st.step == st_ref.step);
}

template <class K> void check_inputs(const K& k, typename K::state st, const std::string& what) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (std::size_t n : {0u, 1u, 2u, 7u, 100u, 999u, 4096u, 50'001u, 300'000u}) {
    INFO(what << " n=" << n);
    std::vector<float> g(n), res(n);
    for (auto& v : g) v = nd(rng);
    for (auto& v : res) v = 0.1f * nd(rng);
    check_step(k, st, g, res);
    check_step(k, st, g, std::vector<float>(n, 0.0f)); // the first step: residual 0
    if (n >= 8) {
      auto g2 = g, r2 = res;
      g2[1] = std::numeric_limits<float>::infinity();
      g2[n / 2] = std::numeric_limits<float>::quiet_NaN();
      r2[3] = -std::numeric_limits<float>::infinity(); // a non-finite x from the residual
      g2[4] = -0.0f;
      r2[4] = 0.0f;  // x = +0
      g2[5] = 0.25f;
      r2[5] = -0.25f; // x = +0 from a cancellation
      r2[6] = -0.0f;  // x = g, residual -0
      check_step(k, st, g2, r2);
      // Massive ties (all equal magnitudes): the sampled collect overflows.
      check_step(k, st, std::vector<float>(n, 1.5f), std::vector<float>(n, 0.0f));
      // All zero: nothing above a zero threshold.
      check_step(k, st, std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f));
      // A few huge values the sample misses: fewer than k candidates.
      auto g3 = g;
      for (std::size_t i = 0; i < n; i += 97) g3[i] *= 1e6f;
      check_step(k, st, g3, res);
    }
  }
}

} // namespace

TEST_CASE("topk encode_feedback equals fold, encode and correction bitwise") {
  for (double d : {0.0, 0.001, 0.01, 0.3, 1.0}) {
    INFO("density " << d);
    for (std::size_t kk : {std::size_t{0}, std::size_t{1}, std::size_t{3}})
      check_inputs(cz::topk<float>{.k = kk}, {}, "topk k=" + std::to_string(kk));
    // k as a fraction of the largest size tested.
    check_inputs(cz::topk<float>{.k = static_cast<std::size_t>(d * 300'000)}, {}, "topk d=" + std::to_string(d));
  }
}

TEST_CASE("approx_topk encode_feedback equals fold, encode and correction bitwise") {
  for (double d : {0.0, 0.001, 0.01, 0.05, 0.5, 1.0})
    check_inputs(cz::approx_topk<float>{.density = d}, cz::approx_topk_state{.seed = 3, .step = 5, .rank = 1},
                 "approx_topk d=" + std::to_string(d));
}

TEST_CASE("threshold encode_feedback equals fold, encode and correction bitwise") {
  for (float tau : {0.0f, 0.5f, 2.576f, 1e30f}) check_inputs(cz::threshold<float>{.tau = tau}, {}, "threshold tau=" + std::to_string(tau));
}

TEST_CASE("encode_feedback rejects a residual of another length, leaving it untouched") {
  const cz::topk<float> k{.k = 2};
  std::vector<float> g(10, 1.0f), res(9, 0.5f);
  std::vector<std::byte> ws(k.workspace_bytes(10)), out(k.max_encoded_bytes(10));
  cz::no_state st;
  CHECK_THROWS_WITH_AS(k.encode_feedback(std::span<const float>(g), std::span<float>(res), st, ws, out),
                       doctest::Contains("residual of 9 elements for a tensor of 10"), gradsync::error);
  CHECK(res == std::vector<float>(9, 0.5f));
}
