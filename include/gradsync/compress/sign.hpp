// gradsync: 1-bit sign compression with a per-block scale, as in EF-signSGD
// (Karimireddy et al., 2019): every element of a block decodes to
// sign(x) * mean|x| of its block, which preserves the block's l1 norm. +0
// counts as positive, -0 as negative. Biased: use it inside error_feedback.
// Wire: the blockwise family (blockwise.hpp), codec id 7, 1-bit codes
// (1 = negative), eight per byte, element 8k in bit 0.
#pragma once

#include <cstdint>
#include <string_view>

#include "../core/policy.hpp"
#include "blockwise.hpp"

namespace gradsync::compress {

/// Per-element math: the sign bit of r = x / scale (the quotient keeps the
/// sign even when it underflows; -0 counts as negative, +0 as positive).
GRADSYNC_HD inline std::uint32_t sign_code(float r) { return gradsync::detail::float_bits(r) >> 31; }
/// Per-element math: -1 or +1.
GRADSYNC_HD inline float sign_fraction(std::uint32_t c) { return c ? -1.0f : 1.0f; }

/// Rule of the sign codec (see blockwise.hpp for the rule interface).
struct sign_rule {
  static constexpr codec_id id = codec_id::sign;
  static constexpr std::string_view name = "sign";
  static constexpr const char* encode_op = "encode.sign";
  static constexpr const char* decode_op = "decode.sign";
  static constexpr bool stochastic = false;
  static constexpr scale_kind scale = scale_kind::mean_abs;
  static constexpr std::uint32_t default_block = policy::sign_block;

  unsigned bits() const { return 1; }
  std::uint16_t arg() const { return 0; }
  void validate(const char*) const {}
  static sign_rule from_wire(std::uint16_t arg, std::uint8_t bits, const char* op) {
    detail::expect_fixed(arg, bits, 1, op);
    return {};
  }
  GRADSYNC_HD std::uint32_t code(float r, float) const { return sign_code(r); }
  GRADSYNC_HD bool valid(std::uint32_t) const { return true; }
  GRADSYNC_HD float fraction(std::uint32_t c) const { return sign_fraction(c); }
};

/// Scaled sign codec: `compress::sign<float> c{.block = 1024};`
template <float_element T> using sign = blockwise<sign_rule, T>;

static_assert(codec<sign<float>> && codec<sign<half>>);

} // namespace gradsync::compress
