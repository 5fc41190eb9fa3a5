// gradsync: TernGrad (Wen et al., 2017) stochastic ternarisation. Per block,
// s = max|x|; element x becomes s * sign(x) * b with b ~ Bernoulli(|x| / s),
// so E[decoded] = x (unbiased up to the 2^-24 grid of the uniforms) and
// Var = |x| (s - |x|). The paper's optional gradient clipping is left to the
// caller (it makes the codec biased). Noise: Philox keyed by
// (seed, step, rank, element index) from the codec state.
//
// Under error feedback (rule.unbiased = false, which error_feedback and
// compressed_allreduce set): that variance, s ||x||_1 - ||x||^2, exceeds
// ||x||^2 for typical blocks, so the unbiased codec is no contraction and the
// residual grows without bound (NaN within ~30 steps in a 4-rank training
// run). The feedback form draws the same b but stores the scale
// lambda s = ||x||^2 / ||x||_1 (lambda = ||x||^2 / (s ||x||_1) minimises
// E||x - lambda Q(x)||^2; blockwise.hpp's feedback_scale, with the exact
// probabilities of the 2^-24 grid), leaving E||x - C(x)||^2 =
// ||x||^2 (1 - ||x||^2 / (s ||x||_1)) < ||x||^2. Same payload layout.
// Wire: the blockwise family (blockwise.hpp), codec id 6, 2-bit codes
// 0 = 0, 1 = +1, 2 = -1 (3 invalid), four per byte.
#pragma once

#include <cstdint>
#include <string_view>

#include "../core/policy.hpp"
#include "blockwise.hpp"

namespace gradsync::compress {

/// Per-element math: r = x / max|x| in [-1, 1], u uniform in [0, 1).
GRADSYNC_HD inline std::uint32_t terngrad_code(float r, float u) {
  const float a = r < 0.0f ? -r : r;
  return u < a ? (r < 0.0f ? 2u : 1u) : 0u;
}
/// Per-element math: 0, +1 or -1.
GRADSYNC_HD inline float terngrad_fraction(std::uint32_t c) {
  return c == 1u ? 1.0f : (c == 2u ? -1.0f : 0.0f);
}
/// Per-element math of the feedback form: 2^24 E[fraction(code(r, u))^2] =
/// 2^24 P(u < |r|), exact.
GRADSYNC_HD inline std::uint64_t terngrad_moment(float r) {
  return detail::uniforms_below(r < 0.0f ? -r : r);
}

/// Rule of the TernGrad codec (see blockwise.hpp for the rule interface).
struct terngrad_rule {
  static constexpr codec_id id = codec_id::terngrad;
  static constexpr std::string_view name = "terngrad";
  static constexpr const char* encode_op = "encode.terngrad";
  static constexpr const char* decode_op = "decode.terngrad";
  static constexpr bool stochastic = true;
  static constexpr scale_kind scale = scale_kind::absmax;
  static constexpr std::uint32_t default_block = policy::terngrad_block;

  /// false: the feedback form (scale ||x||^2 / ||x||_1, see above).
  bool unbiased = true;

  unsigned bits() const { return 2; }
  std::uint16_t arg() const { return 0; }
  void validate(const char*) const {}
  static terngrad_rule from_wire(std::uint16_t arg, std::uint8_t bits, const char* op) {
    detail::expect_fixed(arg, bits, 2, op);
    return {};
  }
  GRADSYNC_HD std::uint32_t code(float r, float u) const { return terngrad_code(r, u); }
  GRADSYNC_HD bool valid(std::uint32_t c) const { return c != 3u; }
  GRADSYNC_HD float fraction(std::uint32_t c) const { return terngrad_fraction(c); }
  GRADSYNC_HD std::uint64_t moment(float r) const { return terngrad_moment(r); }
  GRADSYNC_HD unsigned max_level() const { return 1; }
};

/// TernGrad codec: `compress::terngrad<float> c;` with state {seed, step, rank};
/// `compress::terngrad<float>{.rule = {.unbiased = false}}` for error feedback.
template <float_element T> using terngrad = blockwise<terngrad_rule, T>;

static_assert(codec<terngrad<float>> && codec<terngrad<half>>);

} // namespace gradsync::compress
