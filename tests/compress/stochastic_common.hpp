// Unbiasedness and determinism checks shared by the stochastic quantisers
// (terngrad, qsgd): the mean of many seeded draws must sit within 5 standard
// errors of the input, with the variance known in closed form per element.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "quant_common.hpp"

namespace quant {

/// Draws `draws` encodings of x (steps 0 .. draws-1 of one seed, spread over
/// `ranks` ranks) and checks, per element i with closed-form variance var[i]:
/// |mean_i - x_i| <= 5 sqrt(var_i / draws) + 1e-6 * scale, and for elements
/// with a variance of at least 0.3 of the largest, the sample variance within 15 %.
template <class C>
void check_unbiased(const C& c, const std::vector<float>& x, const std::vector<double>& var,
                    double scale, int draws, std::uint32_t ranks = 4) {
  std::vector<double> sum(x.size(), 0.0), sq(x.size(), 0.0);
  std::vector<typename C::state> states(ranks);
  for (std::uint32_t r = 0; r < ranks; ++r) states[r] = {.seed = 0x5eed, .step = 0, .rank = r};
  for (int d = 0; d < draws; ++d) {
    auto& st = states[static_cast<std::uint32_t>(d) % ranks];
    const auto p = cz::encode_to_vector(c, std::span<const float>(x), st);
    std::vector<float> y(x.size(), 0.0f);
    c.decode_accumulate(p, std::span(y));
    for (std::size_t i = 0; i < x.size(); ++i) {
      sum[i] += y[i];
      sq[i] += static_cast<double>(y[i]) * y[i];
    }
  }
  int bad_mean = 0, bad_var = 0, var_checked = 0;
  double max_var = 0;
  for (double v : var) max_var = std::max(max_var, v);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double mean = sum[i] / draws;
    const double tol = 5 * std::sqrt(var[i] / draws) + 1e-6 * scale;
    if (std::fabs(mean - x[i]) > tol) {
      ++bad_mean;
      MESSAGE("element ", i, ": x ", x[i], " mean ", mean, " tol ", tol);
    }
    const double emp = sq[i] / draws - mean * mean;
    if (var[i] >= 0.3 * max_var) { // Bernoulli p(1-p) >= 0.075: sample variance within ~2.5 %
      ++var_checked;
      if (std::fabs(emp - var[i]) > 0.15 * var[i]) {
        ++bad_var;
        MESSAGE("element ", i, ": var ", var[i], " sample var ", emp);
      }
    }
    if (var[i] == 0.0) bad_var += emp > 1e-12 * scale * scale; // exact levels never move
  }
  CHECK(bad_mean == 0);
  CHECK(bad_var == 0);
  CHECK(var_checked > 0);
}

/// Same state -> same payload; step, rank and seed each change it; encode
/// advances the step by one.
template <class C> void check_determinism(const C& c) {
  const auto x = gradient_like(1000, 21);
  typename C::state a{.seed = 9, .step = 5, .rank = 1};
  auto b = a;
  const auto pa = cz::encode_to_vector(c, std::span<const float>(x), a);
  const auto pb = cz::encode_to_vector(c, std::span<const float>(x), b);
  CHECK(pa == pb);
  CHECK(a.step == 6);
  CHECK(cz::encode_to_vector(c, std::span<const float>(x), a) != pa); // step 6
  typename C::state r{.seed = 9, .step = 5, .rank = 2}, s{.seed = 10, .step = 5, .rank = 1};
  CHECK(cz::encode_to_vector(c, std::span<const float>(x), r) != pa);
  CHECK(cz::encode_to_vector(c, std::span<const float>(x), s) != pa);
}

/// Mean squared error per block of `block` elements of codecs `a` and `b`
/// on x over `draws` round trips, both from state {seed} (the noise streams
/// advance per draw): {mse of a, mse of b}.
template <class A, class B>
std::pair<std::vector<double>, std::vector<double>> block_mse(const A& a, const B& b, const std::vector<float>& x,
                                                              std::size_t block, int draws, std::uint64_t seed) {
  const std::size_t nb = (x.size() + block - 1) / block;
  std::vector<double> ea(nb, 0.0), eb(nb, 0.0);
  cz::stream_state sa{.seed = seed}, sb = sa;
  for (int d = 0; d < draws; ++d) {
    const auto y = roundtrip(a, x, sa);
    const auto z = roundtrip(b, x, sb);
    for (std::size_t i = 0; i < x.size(); ++i) {
      ea[i / block] += (x[i] - static_cast<double>(y[i])) * (x[i] - static_cast<double>(y[i])) / draws;
      eb[i / block] += (x[i] - static_cast<double>(z[i])) * (x[i] - static_cast<double>(z[i])) / draws;
    }
  }
  return {ea, eb};
}

} // namespace quant
