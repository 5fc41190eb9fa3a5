// gradsync: the machinery shared by the block-scaled quantisers (int8, int4,
// qsgd, terngrad, sign). Each splits the tensor into blocks of `block`
// elements, stores one float scale per block and one small integer code per
// element; the decoded element is fraction(code) * scale with |fraction| <= 1,
// so no decode can overflow and subnormal scales lose nothing but their own
// precision. A codec header only supplies a rule: its scale statistic, its
// GRADSYNC_HD code/fraction functions and which codes are valid.
//
// Wire (wire.hpp), identical for all of them:
//   parameters (P = 8): u32 block (1 .. max_block), u16 arg (rule-specific,
//                       e.g. qsgd levels; 0 otherwise), u8 code bits, u8 zero
//   body: nb = ceil(n / block) f32 scales, then n codes of `bits` bits
//         (1, 2, 4 or 8) packed little-endian from bit 0 of the first byte;
//         unused bits of the last byte are zero. B = 4 nb + ceil(n bits / 8).
//   A scale is finite and >= 0, or NaN: a block holding any NaN or Inf is
//   "poisoned", stored with a NaN scale and all-zero codes, and decodes to NaN
//   in every element (docs/compression.md, non-finite policy).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#include "codec.hpp"

namespace gradsync::compress {

/// Largest block (per-block sums stay exact enough; codes index fits u32).
inline constexpr std::uint32_t max_block = std::uint32_t{1} << 24;

/// Which per-block statistic a rule scales by.
enum class scale_kind : std::uint8_t {
  absmax,   ///< max |x|
  mean_abs, ///< sum |x| / block length
  l2,       ///< sqrt(sum x^2), raised to at least max |x| after rounding
};

/// Body bytes of n codes of `bits` bits in blocks of `block`.
constexpr std::size_t blockwise_body_bytes(std::size_t n, std::size_t block, unsigned bits) {
  return 4 * ((n + block - 1) / block) + (n * bits + 7) / 8;
}

namespace detail {

/// Round to nearest, ties to even, for |v| <= 2^22 (codes are far smaller).
/// Host: adding and removing 1.5 * 2^23 rounds in the default mode without a
/// libm call and vectorises (IEEE semantics forbid folding it; do not build
/// gradsync with -ffast-math / -fassociative-math); device: rintf.
GRADSYNC_HD inline float round_even(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  constexpr float big = 12582912.0f;
  return (v + big) - big;
#endif
}

/// Checks the (arg, bits) of a rule that has no argument and a fixed width.
inline void expect_fixed(std::uint16_t arg, std::uint8_t bits, unsigned want, const char* op) {
  if (arg != 0) wire::fail(op, "parameter arg is " + std::to_string(arg) + ", must be 0");
  if (bits != want)
    wire::fail(op, "code width " + std::to_string(bits) + " bits, expected " + std::to_string(want));
}

/// Reads code i of width Bits (1, 2, 4, 8) from a packed little-endian stream.
template <unsigned Bits>
GRADSYNC_HD inline std::uint32_t get_code(const std::byte* codes, std::size_t i) {
  if constexpr (Bits == 8) {
    return static_cast<std::uint32_t>(codes[i]);
  } else {
    const std::size_t bit = i * Bits;
    return (static_cast<std::uint32_t>(codes[bit / 8]) >> (bit % 8)) & ((1u << Bits) - 1u);
  }
}
/// ORs code i of width Bits into a zero-initialised packed stream.
template <unsigned Bits>
GRADSYNC_HD inline void put_code(std::byte* codes, std::size_t i, std::uint32_t c) {
  if constexpr (Bits == 8) {
    codes[i] = static_cast<std::byte>(c);
  } else {
    const std::size_t bit = i * Bits;
    // Integer ops, not std::byte's |= (a host-only constexpr function under nvcc).
    codes[bit / 8] =
        static_cast<std::byte>(static_cast<std::uint32_t>(codes[bit / 8]) | (c << (bit % 8)));
  }
}

/// Calls f(std::integral_constant<unsigned, bits>) for bits in {1, 2, 4, 8}.
template <class F> decltype(auto) dispatch_bits(unsigned bits, F&& f) {
  switch (bits) {
  case 1: return f(std::integral_constant<unsigned, 1>{});
  case 2: return f(std::integral_constant<unsigned, 2>{});
  case 4: return f(std::integral_constant<unsigned, 4>{});
  default: return f(std::integral_constant<unsigned, 8>{});
  }
}

/// The statistic K of one block (host reference; kernels reduce their own way
/// and may differ in the last bits). NaN when the block is not finite.
template <scale_kind K, float_element T> float block_scale(const T* x, std::size_t len) {
  if constexpr (K == scale_kind::absmax) {
    // The max of the |x| bit patterns: for non-negative floats the bits order
    // like the values, and every NaN or Inf pattern is >= 0x7f800000, so one
    // integer max (which vectorises; a float max with a NaN check does not)
    // gives both max|x| and the poisoned-block test, with identical results.
    std::uint32_t m = 0;
    for (std::size_t i = 0; i < len; ++i) {
      const std::uint32_t a = gradsync::detail::float_bits(to_float(x[i])) & 0x7fffffffu;
      m = a > m ? a : m;
    }
    return m >= 0x7f800000u ? std::numeric_limits<float>::quiet_NaN()
                            : gradsync::detail::bits_float(m);
  }
  float amax = 0.0f;
  double sum = 0.0; // l1 or l2^2; cannot overflow: (3.4e38)^2 * 2^24 << DBL_MAX
  bool bad = false;
  for (std::size_t i = 0; i < len; ++i) {
    const float v = to_float(x[i]);
    bad |= !finite(v);
    const float a = std::fabs(v);
    amax = a > amax ? a : amax;
    if constexpr (K == scale_kind::mean_abs) sum += a;
    if constexpr (K == scale_kind::l2) sum += static_cast<double>(a) * a;
  }
  if (bad) return std::numeric_limits<float>::quiet_NaN();
  if constexpr (K == scale_kind::mean_abs) {
    return static_cast<float>(sum / static_cast<double>(len));
  } else if constexpr (K == scale_kind::l2) {
    // Clamp to the float range, and never below max|x| so |x| / scale <= 1.
    const double n2 = std::sqrt(sum);
    const float f = n2 >= static_cast<double>(std::numeric_limits<float>::max())
                        ? std::numeric_limits<float>::max()
                        : static_cast<float>(n2);
    return f > amax ? f : amax;
  } else {
    return amax;
  }
}

inline void check_block(std::uint64_t block, const char* op) {
  if (block < 1 || block > max_block)
    wire::fail(op, "block size " + std::to_string(block) + " out of range [1, " +
                       std::to_string(max_block) + "]");
}

/// Encodes `in` with `rule` into `out`; `noise` feeds stochastic rules.
template <class Rule, float_element T>
std::size_t blockwise_encode(const Rule& rule, std::uint32_t block, std::span<const T> in,
                             const philox_stream* noise, std::span<std::byte> ws,
                             std::span<std::byte> out, const char* op) {
  check_block(block, op);
  rule.validate(op);
  const unsigned bits = rule.bits();
  const std::size_t n = in.size();
  const std::size_t body = blockwise_body_bytes(n, block, bits);
  check_encode_buffers(op, out.size(), wire::header_bytes + 8 + body, ws.size(), 0);
  wire::writer w(out, Rule::id, dtype_traits<T>::id, n, 8, op);
  wire::param_writer pw(w.params());
  const std::uint16_t arg = rule.arg();
  pw.put<std::uint32_t>(block).put<std::uint16_t>(arg).put<std::uint8_t>(
      static_cast<std::uint8_t>(bits));
  const std::size_t nb = (n + block - 1) / block;
  std::byte* scales = w.body().data();
  std::byte* codes = scales + 4 * nb;
  std::memset(codes, 0, body - 4 * nb);
  dispatch_bits(bits, [&](auto bits_c) {
    constexpr unsigned B = decltype(bits_c)::value;
    [[maybe_unused]] philox_block rnd{}; // stochastic rules only (nvcc warns otherwise)
    [[maybe_unused]] std::uint64_t rnd_at = ~std::uint64_t{0};
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t lo = b * block, len = std::min<std::size_t>(block, n - lo);
      const float s = block_scale<Rule::scale>(in.data() + lo, len);
      wire::store<float>(scales + 4 * b, s);
      if (!(s > 0.0f)) continue; // zero block: codes stay 0; NaN (poisoned): likewise
      for (std::size_t i = lo; i < lo + len; ++i) {
        float u = 0.0f;
        if constexpr (Rule::stochastic) {
          if ((i >> 2) != rnd_at) rnd = noise->block(rnd_at = i >> 2); // 4 draws per call
          u = uniform01(rnd.x[i & 3]);
        }
        put_code<B>(codes, i, rule.code(to_float(in[i]) / s, u));
      }
    }
  });
  return w.finish(body);
}

/// Validates a payload of this family completely, then feeds
/// sink(i, fraction(code_i) * scale_of_block(i)) for every element.
template <class Rule, float_element T, class Sink>
void blockwise_decode(std::span<const std::byte> payload, std::size_t n, Sink sink,
                      const char* op) {
  const wire::view v = wire::open(payload, Rule::id, dtype_traits<T>::id, 8, op);
  wire::param_reader pr(v.params);
  const auto block = pr.get<std::uint32_t>();
  const auto arg = pr.get<std::uint16_t>();
  const auto bits = pr.get<std::uint8_t>();
  const auto zero = pr.get<std::uint8_t>();
  check_block(block, op);
  if (zero != 0) wire::fail(op, "reserved parameter byte is " + std::to_string(zero) + ", not 0");
  const Rule rule = Rule::from_wire(arg, bits, op);
  wire::check_count(v, n, op);
  const std::size_t nb = (n + block - 1) / block;
  // n is a real buffer's size, so these products cannot overflow.
  wire::check_body(v, blockwise_body_bytes(n, block, bits), op);
  const std::byte* scales = v.body.data();
  const std::byte* codes = scales + 4 * nb;

  dispatch_bits(bits, [&](auto bits_c) {
    constexpr unsigned B = decltype(bits_c)::value;
    // Validation pass: scales, codes, padding. Nothing is written yet.
    for (std::size_t b = 0; b < nb; ++b) {
      const float s = wire::load<float>(scales + 4 * b);
      const bool nan = s != s;
      if (!nan && !(s >= 0.0f && finite(s)))
        wire::fail(op, "block " + std::to_string(b) + " has an invalid scale " + std::to_string(s));
      const std::size_t lo = b * block, hi = std::min<std::size_t>(n, lo + block);
      bool ok = true;
      for (std::size_t i = lo; i < hi; ++i) {
        const std::uint32_t c = get_code<B>(codes, i);
        ok &= rule.valid(c) && !(nan && c != 0);
      }
      if (!ok)
        for (std::size_t i = lo; i < hi; ++i) // find the culprit for the message
          if (const std::uint32_t c = get_code<B>(codes, i); !rule.valid(c) || (nan && c != 0))
            wire::fail(op, "element " + std::to_string(i) + " has invalid code " +
                               std::to_string(c) + (nan ? " in a poisoned (NaN-scale) block" : ""));
    }
    if (const std::size_t used = n * B; used % 8 != 0) {
      const auto last = static_cast<std::uint32_t>(codes[used / 8]);
      if ((last >> (used % 8)) != 0)
        wire::fail(op, "padding bits of the last code byte are not zero");
    }
    for (std::size_t b = 0; b < nb; ++b) {
      const float s = wire::load<float>(scales + 4 * b);
      const std::size_t lo = b * block, hi = std::min<std::size_t>(n, lo + block);
      for (std::size_t i = lo; i < hi; ++i) sink(i, rule.fraction(get_code<B>(codes, i)) * s);
    }
  });
}

} // namespace detail

/// A block-scaled quantiser over element type T following `Rule` (see the
/// codec headers: int8, int4, qsgd, terngrad, sign). Models `codec`.
template <class Rule, float_element T> struct blockwise {
  using value_type = T;
  using state = std::conditional_t<Rule::stochastic, stream_state, no_state>;
  static constexpr codec_id id = Rule::id;
  static constexpr std::string_view name = Rule::name;

  /// Elements per scale (1 .. max_block).
  std::uint32_t block = Rule::default_block;
  /// Rule parameters (only qsgd has any: levels).
  Rule rule{};

  /// Exact payload size for n elements (the size never depends on the data).
  std::size_t max_encoded_bytes(std::size_t n) const {
    return wire::header_bytes + 8 + blockwise_body_bytes(n, block, rule.bits());
  }
  /// No scratch needed.
  std::size_t workspace_bytes(std::size_t) const { return 0; }

  /// Quantises `in`; stochastic rules draw from `st` and advance st.step.
  std::size_t encode(std::span<const T> in, state& st, std::span<std::byte> ws,
                     std::span<std::byte> out) const {
    if constexpr (Rule::stochastic) {
      const philox_stream noise = st.next();
      return detail::blockwise_encode(rule, block, in, &noise, ws, out, Rule::encode_op);
    } else {
      (void)st;
      return detail::blockwise_encode(rule, block, in, nullptr, ws, out, Rule::encode_op);
    }
  }
  /// out[i] = decoded element; out.size() must equal the encoded count.
  void decode(std::span<const std::byte> payload, std::span<T> out) const {
    detail::blockwise_decode<Rule, T>(payload, out.size(), store_sink<T>{out.data()},
                                      Rule::decode_op);
  }
  /// acc[i] += decoded element.
  void decode_accumulate(std::span<const std::byte> payload, std::span<accum_t<T>> acc) const {
    detail::blockwise_decode<Rule, T>(payload, acc.size(), accumulate_sink<T>{acc.data()},
                                      Rule::decode_op);
  }
};

} // namespace gradsync::compress
