// gradsync: fp16 and bf16 cast codecs. Each element is rounded to nearest
// even into 16 bits with core/half.hpp's conversions; NaN stays NaN (quieted)
// and +-Inf stay +-Inf, as a loss scaler needs to see overflow.
//
// Wire (wire.hpp): codec id fp16 (1) or bf16 (2), no parameters (P = 0),
// body = n little-endian 16-bit values (B = 2n). Every bit pattern is a valid
// value, so only the structure is validated.
//
// double input is rounded to float first (two roundings: a double exactly
// halfway between two 16-bit values after the first rounding may round
// differently from a direct double -> 16-bit conversion).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "../core/half.hpp"
#include "codec.hpp"

namespace gradsync::compress {

/// Per-element math, shared with device kernels: float -> W bits.
template <class W> GRADSYNC_HD inline std::uint16_t cast_encode1(float x) { return W(x).bits; }
/// W bits -> float (exact).
template <class W> GRADSYNC_HD inline float cast_decode1(std::uint16_t b) {
  return static_cast<float>(W::from_bits(b));
}

/// Cast codec from T to the 16-bit storage type W (half or bfloat16).
template <float_element T, class W>
  requires std::same_as<W, half> || std::same_as<W, bfloat16>
struct cast16 {
  using value_type = T;
  using state = no_state;
  static constexpr bool is_half = std::same_as<W, half>;
  static constexpr codec_id id = is_half ? codec_id::fp16 : codec_id::bf16;
  static constexpr std::string_view name = is_half ? "fp16" : "bf16";
  static constexpr const char* encode_op = is_half ? "encode.fp16" : "encode.bf16";
  static constexpr const char* decode_op = is_half ? "decode.fp16" : "decode.bf16";

  /// Header plus two bytes per element.
  std::size_t max_encoded_bytes(std::size_t n) const { return wire::header_bytes + 2 * n; }
  /// No scratch needed.
  std::size_t workspace_bytes(std::size_t) const { return 0; }

  /// Rounds every element to W; returns the payload size.
  std::size_t encode(std::span<const T> in, state&, std::span<std::byte> ws,
                     std::span<std::byte> out) const {
    check_encode_buffers(encode_op, out.size(), max_encoded_bytes(in.size()), ws.size(), 0);
    wire::writer w(out, id, dtype_traits<T>::id, in.size(), 0, encode_op);
    std::byte* body = w.body().data();
    if constexpr (std::same_as<T, float>) {
      to_bits_n(in.data(), body, in.size());
    } else { // widen a chunk to float in L1, then convert it
      float tmp[chunk];
      for (std::size_t i0 = 0; i0 < in.size(); i0 += chunk) {
        const std::size_t m = std::min(chunk, in.size() - i0);
        for (std::size_t j = 0; j < m; ++j) tmp[j] = to_float(in[i0 + j]);
        to_bits_n(tmp, body + 2 * i0, m);
      }
    }
    return w.finish(2 * in.size());
  }
  /// out[i] = the decoded element; out.size() must equal the encoded count.
  void decode(std::span<const std::byte> payload, std::span<T> out) const {
    run(payload, out.size(), store_sink<T>{out.data()});
  }
  /// acc[i] += the decoded element.
  void decode_accumulate(std::span<const std::byte> payload, std::span<accum_t<T>> acc) const {
    run(payload, acc.size(), accumulate_sink<T>{acc.data()});
  }

private:
  static constexpr std::size_t chunk = 1024; // elements converted per step (4 KiB of float)

  static void to_bits_n(const float* in, std::byte* out, std::size_t n) {
    if constexpr (is_half) gradsync::detail::float_to_half_n(in, out, n);
    else gradsync::detail::float_to_bf16_n(in, out, n);
  }

  template <class Sink> void run(std::span<const std::byte> payload, std::size_t n, Sink sink) const {
    const wire::view v = wire::open(payload, id, dtype_traits<T>::id, 0, decode_op);
    wire::check_count(v, n, decode_op);
    wire::check_body(v, wire::checked_mad(v.h.count, 2, 0, decode_op), decode_op);
    float tmp[chunk];
    for (std::size_t i0 = 0; i0 < n; i0 += chunk) {
      const std::size_t m = std::min(chunk, n - i0);
      const std::byte* src = v.body.data() + 2 * i0;
      if constexpr (is_half) gradsync::detail::half_to_float_n(src, tmp, m);
      else gradsync::detail::bf16_to_float_n(src, tmp, m);
      for (std::size_t j = 0; j < m; ++j) sink(i0 + j, tmp[j]);
    }
  }
};

/// IEEE binary16 cast codec.
template <float_element T> using fp16 = cast16<T, half>;
/// bfloat16 cast codec.
template <float_element T> using bf16 = cast16<T, bfloat16>;

static_assert(codec<fp16<float>> && codec<bf16<half>> && codec<fp16<double>>);

} // namespace gradsync::compress
