// gradsync: QSGD (Alistarh et al., 2017) with s levels and bucketing. Per
// bucket the scale is its l2 norm ||x||; element x becomes
// ||x|| * sign(x) * l / s where l = floor(s |x| / ||x||) + Bernoulli(frac), so
// E[decoded] = x (up to the 2^-24 grid of the uniforms) and
// Var <= ||x||^2 / (4 s^2) per element. A norm beyond the float range is
// stored as FLT_MAX and a rounded norm is raised to max|x|; any scale >= max|x|
// keeps the codec unbiased. Noise: Philox keyed by (seed, step, rank, index).
// Under error feedback (rule.unbiased = false, which error_feedback and
// compressed_allreduce set): error feedback needs E||x - C(x)||^2 <
// ||x||^2, and the unbiased codec's error is its variance, up to
// min(n / (4 s^2), sqrt(n) / s) ||x||^2 for buckets of n: 0.65 ||x||^2 at
// the defaults (s = 7, n = 128), but 3.6 at s = 3 and 2.6 for buckets of 512.
// The feedback form draws the same levels but stores the scale lambda ||x||,
// lambda = ||x||^2 / E||Q(x)||^2 = 1 / (1 + Var / ||x||^2) from the block's
// exact level moments (qsgd_moment; blockwise.hpp's feedback_scale), which
// minimises E||x - lambda Q(x)||^2 = ||x||^2 (1 - lambda): a contraction for
// every s and bucket (at the defaults at most 0.40 ||x||^2). Same payload
// layout.
// Wire: the blockwise family (blockwise.hpp), codec id 5, arg = s (1 .. 127),
// sign-magnitude codes of 4 bits when s <= 7 (sign in bit 3), else 8 bits
// (sign in bit 7); a magnitude above s or a negative zero is invalid.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "../core/policy.hpp"
#include "blockwise.hpp"

namespace gradsync::compress {

/// Code width for s levels.
GRADSYNC_HD inline unsigned qsgd_bits(unsigned levels) { return levels <= 7 ? 4u : 8u; }

/// Per-element math: r = x / ||x|| in [-1, 1], u uniform in [0, 1).
GRADSYNC_HD inline std::uint32_t qsgd_code(float r, float u, unsigned levels) {
  const float a = (r < 0.0f ? -r : r) * static_cast<float>(levels);
  const float f = floorf(a);
  std::uint32_t l = static_cast<std::uint32_t>(f) + (u < a - f ? 1u : 0u);
  l = l > levels ? levels : l;
  return l == 0 ? 0u : (l | (r < 0.0f ? 1u << (qsgd_bits(levels) - 1) : 0u));
}
/// Per-element math: +-l / s.
GRADSYNC_HD inline float qsgd_fraction(std::uint32_t c, unsigned levels) {
  const unsigned sb = qsgd_bits(levels) - 1;
  const float f = static_cast<float>(c & ((1u << sb) - 1u)) / static_cast<float>(levels);
  return (c >> sb) ? -f : f;
}
/// Per-element math of the feedback form: 2^24 E[l^2] for the level l that
/// qsgd_code draws for r (floor(a) or floor(a) + 1, a = |r| s, clipped to s),
/// exact: the +1 comes with probability uniforms_below(a - floor(a)) / 2^24.
GRADSYNC_HD inline std::uint64_t qsgd_moment(float r, unsigned levels) {
  const float a = (r < 0.0f ? -r : r) * static_cast<float>(levels);
  const float f = floorf(a);
  const std::uint64_t up = detail::uniforms_below(a - f);
  const std::uint64_t s = levels, lo0 = static_cast<std::uint64_t>(f);
  const std::uint64_t lo = lo0 > s ? s : lo0, hi = lo0 + 1 > s ? s : lo0 + 1;
  return lo * lo * ((std::uint64_t{1} << 24) - up) + hi * hi * up;
}

/// Rule of the QSGD codec (see blockwise.hpp for the rule interface).
struct qsgd_rule {
  static constexpr codec_id id = codec_id::qsgd;
  static constexpr std::string_view name = "qsgd";
  static constexpr const char* encode_op = "encode.qsgd";
  static constexpr const char* decode_op = "decode.qsgd";
  static constexpr bool stochastic = true;
  static constexpr scale_kind scale = scale_kind::l2;
  static constexpr std::uint32_t default_block = policy::qsgd_bucket;

  /// Quantisation levels s (1 .. 127).
  std::uint16_t levels = policy::qsgd_levels;
  /// false: the feedback form (scale lambda ||x||, see above).
  bool unbiased = true;

  unsigned bits() const { return qsgd_bits(levels); }
  std::uint16_t arg() const { return levels; }
  /// `kind`: errc::corrupt_payload when the levels were read from a payload.
  void validate(const char* op, errc kind = errc::invalid_argument) const {
    wire::check(levels >= 1 && levels <= 127, op,
                "levels " + std::to_string(levels) + " out of range [1, 127]", kind);
  }
  static qsgd_rule from_wire(std::uint16_t arg, std::uint8_t bits, const char* op) {
    const qsgd_rule r{arg};
    r.validate(op, errc::corrupt_payload);
    wire::check_payload(bits == r.bits(), op,
                        "code width " + std::to_string(bits) + " bits, " + std::to_string(arg) +
                            " levels use " + std::to_string(r.bits()));
    return r;
  }
  GRADSYNC_HD std::uint32_t code(float r, float u) const { return qsgd_code(r, u, levels); }
  GRADSYNC_HD bool valid(std::uint32_t c) const {
    const unsigned sb = qsgd_bits(levels) - 1;
    const std::uint32_t mag = c & ((1u << sb) - 1u);
    return mag <= levels && !(mag == 0 && c != 0);
  }
  GRADSYNC_HD float fraction(std::uint32_t c) const { return qsgd_fraction(c, levels); }
  GRADSYNC_HD std::uint64_t moment(float r) const { return qsgd_moment(r, levels); }
  GRADSYNC_HD unsigned max_level() const { return levels; }
};

/// QSGD codec: `compress::qsgd<float> c{.block = 512, .rule = {.levels = 4}};`
/// with state {seed, step, rank}.
template <float_element T> using qsgd = blockwise<qsgd_rule, T>;

static_assert(codec<qsgd<float>> && codec<qsgd<half>>);

} // namespace gradsync::compress
