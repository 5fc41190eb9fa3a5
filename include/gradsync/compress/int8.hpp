// gradsync: blockwise int8 quantisation with a per-block absmax scale.
// code q = round_to_nearest_even(127 x / absmax) in [-127, 127], decoded as
// (q / 127) absmax, so |x - decoded| <= absmax / 254 (plus two float roundings).
// Deterministic, unbiased only up to rounding; pair it with error_feedback for
// long runs. Wire: the blockwise family (blockwise.hpp), codec id 3, 8-bit
// two's complement codes, -128 invalid.
#pragma once

#include <cstdint>
#include <string_view>

#include "../core/policy.hpp"
#include "blockwise.hpp"

namespace gradsync::compress {

/// Per-element math: code of r = x / absmax in [-1, 1].
GRADSYNC_HD inline std::uint32_t int8_code(float r) {
  float q = detail::round_even(r * 127.0f);
  q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
  return static_cast<std::uint8_t>(static_cast<std::int8_t>(q));
}
/// Per-element math: the fraction of absmax that code c stands for.
GRADSYNC_HD inline float int8_fraction(std::uint32_t c) {
  return static_cast<float>(static_cast<std::int8_t>(static_cast<std::uint8_t>(c))) / 127.0f;
}

/// Rule of the int8 codec (see blockwise.hpp for the rule interface).
struct int8_rule {
  static constexpr codec_id id = codec_id::int8;
  static constexpr std::string_view name = "int8";
  static constexpr const char* encode_op = "encode.int8";
  static constexpr const char* decode_op = "decode.int8";
  static constexpr bool stochastic = false;
  static constexpr scale_kind scale = scale_kind::absmax;
  static constexpr std::uint32_t default_block = policy::int8_block;

  unsigned bits() const { return 8; }
  std::uint16_t arg() const { return 0; }
  void validate(const char*) const {}
  static int8_rule from_wire(std::uint16_t arg, std::uint8_t bits, const char* op) {
    detail::expect_fixed(arg, bits, 8, op);
    return {};
  }
  GRADSYNC_HD std::uint32_t code(float r, float) const { return int8_code(r); }
  GRADSYNC_HD bool valid(std::uint32_t c) const { return c != 0x80u; }
  GRADSYNC_HD float fraction(std::uint32_t c) const { return int8_fraction(c); }
};

/// Blockwise int8 codec: `compress::int8<float> c{.block = 256};`
template <float_element T> using int8 = blockwise<int8_rule, T>;

static_assert(codec<int8<float>> && codec<int8<half>> && codec<int8<double>>);

} // namespace gradsync::compress
