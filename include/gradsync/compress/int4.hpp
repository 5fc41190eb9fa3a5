// gradsync: blockwise int4 quantisation with a per-block absmax scale, two
// codes per byte (element 2k in the low nibble), odd counts padded with a zero
// nibble. code q = round_to_nearest_even(7 x / absmax) in [-7, 7], decoded as
// (q / 7) absmax, so |x - decoded| <= absmax / 14 (plus two float roundings).
// Wire: the blockwise family (blockwise.hpp), codec id 4, 4-bit two's
// complement codes, -8 (0x8) invalid.
#pragma once

#include <cstdint>
#include <string_view>

#include "../core/policy.hpp"
#include "blockwise.hpp"

namespace gradsync::compress {

/// Per-element math: 4-bit code of r = x / absmax in [-1, 1].
GRADSYNC_HD inline std::uint32_t int4_code(float r) {
  float q = detail::round_even(r * 7.0f);
  q = q > 7.0f ? 7.0f : (q < -7.0f ? -7.0f : q);
  return static_cast<std::uint32_t>(static_cast<int>(q)) & 0xfu;
}
/// Per-element math: the fraction of absmax that code c stands for.
GRADSYNC_HD inline float int4_fraction(std::uint32_t c) {
  const int q = static_cast<int>(c & 0xfu) - (c & 0x8u ? 16 : 0); // sign-extend the nibble
  return static_cast<float>(q) / 7.0f;
}

/// Rule of the int4 codec (see blockwise.hpp for the rule interface).
struct int4_rule {
  static constexpr codec_id id = codec_id::int4;
  static constexpr std::string_view name = "int4";
  static constexpr const char* encode_op = "encode.int4";
  static constexpr const char* decode_op = "decode.int4";
  static constexpr bool stochastic = false;
  static constexpr scale_kind scale = scale_kind::absmax;
  static constexpr std::uint32_t default_block = policy::int4_block;

  unsigned bits() const { return 4; }
  std::uint16_t arg() const { return 0; }
  void validate(const char*) const {}
  static int4_rule from_wire(std::uint16_t arg, std::uint8_t bits, const char* op) {
    detail::expect_fixed(arg, bits, 4, op);
    return {};
  }
  GRADSYNC_HD std::uint32_t code(float r, float) const { return int4_code(r); }
  GRADSYNC_HD bool valid(std::uint32_t c) const { return c != 0x8u; }
  GRADSYNC_HD float fraction(std::uint32_t c) const { return int4_fraction(c); }
};

/// Blockwise int4 codec: `compress::int4<float> c{.block = 64};`
template <float_element T> using int4 = blockwise<int4_rule, T>;

static_assert(codec<int4<float>> && codec<int4<bfloat16>>);

} // namespace gradsync::compress
