// gradsync: the machinery shared by the block-scaled quantisers (int8, int4,
// qsgd, terngrad, sign). Each splits the tensor into blocks of `block`
// elements, stores one float scale per block and one small integer code per
// element; the decoded element is fraction(code) * scale with |fraction| <= 1,
// so no decode can overflow and subnormal scales lose nothing but their own
// precision. A codec header only supplies a rule: its scale statistic, its
// GRADSYNC_HD code/fraction functions and which codes are valid.
//
// Stochastic rules (terngrad, qsgd) are unbiased by default, and then too
// noisy for error feedback, which needs a contraction,
// E||x - C(x)||^2 <= (1 - delta) ||x||^2 with delta > 0. Their `unbiased =
// false` form (what error feedback runs: codec.hpp's feedback_form) codes
// exactly as before against the block's statistic s but stores the scale
// lambda s, lambda = ||x||^2 / E||Q(x)||^2 for the unbiased Q(x) = s
// fraction(code(x / s)), which minimises E||x - lambda Q(x)||^2 and leaves
// ||x||^2 (1 - lambda) (feedback_scale). The rule supplies E[code level^2]
// per element (`moment`, exact in units of 2^-24, the grid of the uniforms)
// and `max_level()` (fraction = level / max_level); payloads and the decoder
// are unchanged.
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

#include "../core/host_simd.hpp"
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

/// Units of a rule's `moment`: the uniforms are multiples of 2^-24, so every
/// Bernoulli probability of a code, P(u < p) = ceil(p 2^24) / 2^24, is one.
inline constexpr float moment_unit_inverse = 16777216.0f; // 2^24

/// The number of the 2^24 uniforms u for which u < p (p in [0, 1]):
/// 2^24 P(u < p), exact (p 2^24 is a float scaled by a power of two).
GRADSYNC_HD inline std::uint64_t uniforms_below(float p) {
  return static_cast<std::uint64_t>(ceilf(p * moment_unit_inverse));
}

/// The stored block scale of a stochastic rule's feedback form (see the file
/// comment): s lambda, lambda = ||x||^2 / E||Q(x)||^2, from s (the block's
/// statistic, what the codes were computed against), squares = sum x^2 and
/// moments = sum over the block of 2^24 E[level^2], the level being
/// levels * |fraction| (levels: the rule's max_level(), so E||Q||^2 =
/// s^2 moments / (levels^2 2^24)). Never
/// above s (lambda <= 1 up to rounding: E||Q||^2 >= ||E Q||^2 >= ||x||^2);
/// a zero (all-zero block) or NaN (poisoned) s is kept. Host and device run
/// this same sequence of double operations.
GRADSYNC_HD inline float feedback_scale(float s, double squares, std::uint64_t moments, unsigned levels) {
  if (!(s > 0.0f) || moments == 0) return s;
  const double lv = static_cast<double>(levels);
  const double num = squares * (lv * lv * static_cast<double>(moment_unit_inverse)); // exact factor
  const double den = static_cast<double>(s) * static_cast<double>(moments);
  const float f = static_cast<float>(num / den);
  return f < s ? f : s;
}

/// Checks the (arg, bits) of a rule that has no argument and a fixed width.
/// (Read from a payload: a mismatch is errc::corrupt_payload.)
inline void expect_fixed(std::uint16_t arg, std::uint8_t bits, unsigned want, const char* op) {
  if (arg != 0) wire::corrupt(op, "parameter arg is " + std::to_string(arg) + ", must be 0");
  if (bits != want)
    wire::corrupt(op, "code width " + std::to_string(bits) + " bits, expected " + std::to_string(want));
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

#if GRADSYNC_HOST_AVX2
/// The whole groups of 8 of block_scale's lane loop for float input, by
/// hand (g++ does not vectorise the mixed integer max and double sums):
/// lanes 0-3 and 4-7 in two double vectors, the same operations in the same
/// order per lane, so the result is bitwise the scalar loop's. Returns the
/// elements consumed.
[[gnu::target("avx2")]] inline std::size_t sum_lanes_avx2(const float* x, std::size_t len, bool l2,
                                                         std::uint32_t* mv, double* part) {
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mv));
  __m256d lo = _mm256_loadu_pd(part), hi = _mm256_loadu_pd(part + 4);
  std::size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256i ab = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), absmask);
    m = _mm256_max_epu32(m, ab);
    const __m256 a = _mm256_castsi256_ps(ab);
    __m256d a0 = _mm256_cvtps_pd(_mm256_castps256_ps128(a)), a1 = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
    if (l2) {
      a0 = _mm256_mul_pd(a0, a0);
      a1 = _mm256_mul_pd(a1, a1);
    }
    lo = _mm256_add_pd(lo, a0);
    hi = _mm256_add_pd(hi, a1);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(mv), m);
  _mm256_storeu_pd(part, lo);
  _mm256_storeu_pd(part + 4, hi);
  return i;
}
#endif

/// The statistic K of one block (host reference; kernels reduce their own way
/// and may differ in the last bits). NaN when the block is not finite. With
/// Squares (K absmax or l2), also stores sum x^2 in *squares: what the
/// feedback form of a stochastic rule needs (feedback_scale).
template <scale_kind K, bool Squares = false, float_element T>
float block_scale(const T* x, std::size_t len,
                  gradsync::detail::host_isa isa = gradsync::detail::host_isa::baseline,
                  double* squares = nullptr) {
  static_assert(!Squares || K != scale_kind::mean_abs, "one sum per pass: |x| or x^2");
  if constexpr (K == scale_kind::absmax && !Squares) {
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
  // max |x| as the max of the |x| bit patterns (see absmax above: it also
  // flags NaN/Inf), and eight partial sums (element i feeds sum i % 8),
  // added in a fixed tree: one chain of dependent double adds would cost 4x
  // a memory pass; eight independent lanes vectorise.
  constexpr std::size_t lanes = 8;
  constexpr bool sq = K != scale_kind::mean_abs; // x^2 (l2, or absmax with Squares), else |x|
  std::uint32_t mv[lanes] = {}; // per-lane max, so the loop body is lane-wise
  double part[lanes] = {};      // l1 or l2^2; cannot overflow: (3.4e38)^2 * 2^24 << DBL_MAX
  auto lane = [&](std::size_t j, T v) {
    const std::uint32_t ab = gradsync::detail::float_bits(to_float(v)) & 0x7fffffffu;
    mv[j] = ab > mv[j] ? ab : mv[j];
    const double a = gradsync::detail::bits_float(ab);
    part[j] += sq ? a * a : a;
  };
  std::size_t i = 0;
#if GRADSYNC_HOST_AVX2
  if constexpr (std::is_same_v<T, float>)
    if (isa == gradsync::detail::host_isa::avx2) i = sum_lanes_avx2(x, len, sq, mv, part);
#endif
  (void)isa;
  for (; i + lanes <= len; i += lanes)
    for (std::size_t j = 0; j < lanes; ++j) lane(j, x[i + j]);
  for (std::size_t j = 0; i < len; ++i, ++j) lane(j, x[i]);
  std::uint32_t m = 0;
  for (const std::uint32_t v : mv) m = v > m ? v : m;
  const double sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  const bool bad = m >= 0x7f800000u;
  const float amax = gradsync::detail::bits_float(m);
  if constexpr (Squares) *squares = sum;
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

/// Rejects a block size out of range: the encoder's argument
/// (errc::invalid_argument) or a payload's field (errc::corrupt_payload).
inline void check_block(std::uint64_t block, const char* op, errc kind) {
  if (block < 1 || block > max_block)
    wire::fail(op, "block size " + std::to_string(block) + " out of range [1, " +
                       std::to_string(max_block) + "]", kind);
}

/// Packs 8 codes of B bits (one per byte of `c`) into B bytes and stores the
/// first `nbytes` of them. Each code moves to its bit position by one
/// multiply: the shifted copies land on disjoint bits, so nothing carries.
template <unsigned B> inline void pack8(const std::uint8_t* c, std::byte* out, std::size_t nbytes) {
  std::uint64_t w;
  std::memcpy(&w, c, 8);
  std::uint8_t b[B];
  if constexpr (B == 1) {
    b[0] = static_cast<std::uint8_t>((w * 0x0102040810204080ull) >> 56); // code j -> bit j
  } else if constexpr (B == 2) {
    for (unsigned h = 0; h < 2; ++h) { // codes 4h .. 4h+3 -> bits 0, 2, 4, 6
      const auto q = static_cast<std::uint32_t>(w >> (32 * h));
      b[h] = static_cast<std::uint8_t>((q * 0x01041040u) >> 24);
    }
  } else {
    static_assert(B == 4);
    for (unsigned h = 0; h < 4; ++h) { // codes 2h, 2h+1 -> bits 0, 4
      const auto q = static_cast<std::uint32_t>(w >> (16 * h)) & 0xffffu;
      b[h] = static_cast<std::uint8_t>(q | (q >> 4));
    }
  }
  std::memcpy(out, b, nbytes);
}

/// Codes of elements [lo, hi) of x (block scale s > 0) into the zeroed
/// packed stream. Whole bytes are assembled in a register and stored once
/// (8 / B codes each); only a block's first and last partial byte are ORed.
/// Returns the sum of rule.moment over the elements for a stochastic rule in
/// its feedback form (unbiased = false), 0 otherwise.
template <unsigned B, class Rule, float_element T>
inline std::uint64_t encode_codes(const Rule& rule, const T* x, std::size_t lo, std::size_t hi, float s,
                                  const philox_stream* noise, std::byte* codes) {
  if constexpr (Rule::stochastic) { // a Philox call per 4 elements; no vector form
    philox_block rnd{};
    std::uint64_t rnd_at = ~std::uint64_t{0};
    std::uint64_t moments = 0; // < 2^62: moment <= 127^2 2^24, at most 2^24 elements
    const bool feedback = !rule.unbiased;
    for (std::size_t i = lo; i < hi; ++i) {
      if ((i >> 2) != rnd_at) rnd = noise->block(rnd_at = i >> 2); // 4 draws per call
      const float r = to_float(x[i]) / s;
      put_code<B>(codes, i, rule.code(r, uniform01(rnd.x[i & 3])));
      if (feedback) moments += rule.moment(r);
    }
    return moments;
  } else {
    (void)noise;
    if constexpr (B == 8) {
      for (std::size_t i = lo; i < hi; ++i)
        codes[i] = static_cast<std::byte>(rule.code(to_float(x[i]) / s, 0.0f));
    } else {
      // Codes of a chunk go to bytes in L1 first (a loop that vectorises),
      // then every 8 of them are gathered into 8 B bits by one multiply.
      constexpr std::size_t per = 8 / B, chunk = 256;
      std::size_t i = lo;
      for (; i < hi && i % per != 0; ++i) put_code<B>(codes, i, rule.code(to_float(x[i]) / s, 0.0f));
      alignas(8) std::uint8_t tmp[chunk];
      while (i + per <= hi) {
        const std::size_t len = std::min(chunk, (hi - i) / per * per);
        for (std::size_t j = 0; j < len; ++j)
          tmp[j] = static_cast<std::uint8_t>(rule.code(to_float(x[i + j]) / s, 0.0f));
        for (std::size_t j = len; j % 8 != 0; ++j) tmp[j] = 0; // pad the last group
        for (std::size_t j = 0; j < len; j += 8)
          pack8<B>(tmp + j, codes + (i + j) / per, std::min<std::size_t>(8, len - j) / per);
        i += len;
      }
      for (; i < hi; ++i) put_code<B>(codes, i, rule.code(to_float(x[i]) / s, 0.0f));
    }
    return 0;
  }
}

/// The encode loop over all blocks (run through host_vectorized).
template <unsigned B, class Rule, float_element T>
inline void encode_blocks(Rule rule, const T* x, std::size_t n, std::size_t block,
                          const philox_stream* noise, std::byte* scales, std::byte* codes,
                          gradsync::detail::host_isa isa) {
  const std::size_t nb = (n + block - 1) / block;
  bool feedback = false;
  if constexpr (Rule::stochastic) feedback = !rule.unbiased;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t lo = b * block, hi = std::min(n, lo + block);
    if constexpr (Rule::stochastic) {
      if (feedback) { // codes against s, the scale stored is s lambda (feedback_scale)
        double squares = 0;
        const float s = block_scale<Rule::scale, true>(x + lo, hi - lo, isa, &squares);
        const std::uint64_t moments = s > 0.0f ? encode_codes<B>(rule, x, lo, hi, s, noise, codes) : 0;
        wire::store<float>(scales + 4 * b, feedback_scale(s, squares, moments, rule.max_level()));
        continue;
      }
    }
    const float s = block_scale<Rule::scale>(x + lo, hi - lo, isa);
    wire::store<float>(scales + 4 * b, s);
    if (s > 0.0f) encode_codes<B>(rule, x, lo, hi, s, noise, codes); // else zero or poisoned: codes stay 0
  }
}

/// Encodes `in` with `rule` into `out`; `noise` feeds stochastic rules;
/// `isa`: the host clone (every one gives the same bytes; tests force each).
template <class Rule, float_element T>
std::size_t blockwise_encode(const Rule& rule, std::uint32_t block, std::span<const T> in,
                             const philox_stream* noise, std::span<std::byte> ws,
                             std::span<std::byte> out, const char* op,
                             gradsync::detail::host_isa isa = gradsync::detail::best_host_isa()) {
  check_block(block, op, errc::invalid_argument);
  rule.validate(op);
  const unsigned bits = rule.bits();
  const std::size_t n = in.size();
  const std::size_t body = blockwise_body_bytes(n, block, bits);
  check_encode_buffers(op, out.size(), wire::header_bytes + 8 + body, ws.size(), 0);
  wire::writer w(out, Rule::id, dtype_traits<T>::id, n, 8, op);
  wire::param_writer pw(w.params());
  const std::uint16_t arg = rule.arg();
  pw.u32(block).u16(arg).u8(static_cast<std::uint8_t>(bits));
  const std::size_t nb = (n + block - 1) / block;
  std::byte* scales = w.body().data();
  std::byte* codes = scales + 4 * nb;
  std::memset(codes, 0, body - 4 * nb);
  dispatch_bits(bits, [&](auto bits_c) {
    [[maybe_unused]] constexpr unsigned B = decltype(bits_c)::value; // (g++ 12 misses the use below)
    // A lambda, not the function itself: its own type gives the clone its own
    // instantiation, so `flatten` can inline the loop into it.
    gradsync::detail::host_vectorized(
        isa, [](auto... a) { encode_blocks<B, Rule, T>(a...); }, rule, in.data(), n, std::size_t{block}, noise,
        scales, codes, isa);
  });
  return w.finish(body);
}

/// The codes of byte value v, one per byte (little-endian order), for B < 8.
template <unsigned B> constexpr std::uint64_t spread_byte(unsigned v) {
  std::uint64_t r = 0;
  for (unsigned j = 0; j < 8 / B; ++j) r |= std::uint64_t{(v >> (j * B)) & ((1u << B) - 1u)} << (8 * j);
  return r;
}
template <unsigned B> struct spread_table {
  std::uint64_t v[256];
  constexpr spread_table() : v{} {
    for (unsigned i = 0; i < 256; ++i) v[i] = spread_byte<B>(i);
  }
};
template <unsigned B> inline constexpr spread_table<B> spread{};

/// out[j] = code lo + j for j < len: whole bytes
/// through a 256-entry table, a partial first and last byte one by one.
template <unsigned B>
inline void unpack_codes(const std::byte* codes, std::size_t lo, std::size_t len, std::uint8_t* out) {
  if constexpr (B == 8) {
    std::memcpy(out, codes + lo, len);
  } else {
    constexpr std::size_t per = 8 / B;
    std::size_t j = 0;
    for (; j < len && (lo + j) % per != 0; ++j) out[j] = static_cast<std::uint8_t>(get_code<B>(codes, lo + j));
    for (; j + per <= len; j += per) {
      const std::uint64_t w = spread<B>.v[static_cast<std::uint8_t>(codes[(lo + j) / per])];
      std::memcpy(out + j, &w, per);
    }
    for (; j < len; ++j) out[j] = static_cast<std::uint8_t>(get_code<B>(codes, lo + j));
  }
}

/// Where the validation of a blockwise body found its first defect.
struct body_defect {
  enum kind_t : std::uint8_t { none, scale, code, padding } kind = none;
  std::size_t at = 0; ///< the block (scale) or element (code)
};

/// The validation pass of blockwise_decode (run through host_vectorized):
/// scales finite and >= 0 or NaN, every code valid and a NaN block's codes
/// all zero, the last byte's padding bits zero. Reads only.
template <unsigned B, class Rule>
inline void check_blocks(Rule rule, const std::byte* scales, const std::byte* codes, std::size_t n,
                         std::size_t block, body_defect* out) {
  constexpr std::size_t chunk = 256;
  alignas(32) std::uint8_t c[chunk];
  const std::size_t nb = (n + block - 1) / block;
  for (std::size_t b = 0; b < nb; ++b) {
    const float s = wire::load<float>(scales + 4 * b);
    const bool nan = s != s;
    if (!nan && !(s >= 0.0f && finite(s))) {
      *out = {body_defect::scale, b};
      return;
    }
    const std::size_t lo = b * block, hi = std::min<std::size_t>(n, lo + block);
    for (std::size_t i0 = lo; i0 < hi; i0 += chunk) {
      const std::size_t len = std::min(chunk, hi - i0);
      unpack_codes<B>(codes, i0, len, c);
      // Branch-free and without && (which does not vectorise): 4x faster.
      const unsigned zero_only = nan ? 0xffu : 0u; // a NaN block's codes must be 0
      unsigned bad = 0;
      for (std::size_t j = 0; j < len; ++j) bad |= static_cast<unsigned>(!rule.valid(c[j])) | (c[j] & zero_only);
      if (bad != 0)
        for (std::size_t j = 0; j < len; ++j)
          if (!rule.valid(c[j]) || (nan && c[j] != 0)) {
            *out = {body_defect::code, i0 + j};
            return;
          }
    }
  }
  if (const std::size_t used = n * B; used % 8 != 0)
    if ((static_cast<std::uint32_t>(codes[used / 8]) >> (used % 8)) != 0) *out = {body_defect::padding, 0};
}

/// The scatter pass of blockwise_decode (run through host_vectorized):
/// sink(i, fraction(code_i) * scale) for every element, in index order.
template <unsigned B, class Rule, class Sink>
inline void scatter_blocks(Rule rule, const std::byte* scales, const std::byte* codes, std::size_t n,
                           std::size_t block, Sink sink) {
  constexpr std::size_t chunk = 256;
  alignas(32) std::uint8_t c[chunk];
  const std::size_t nb = (n + block - 1) / block;
  for (std::size_t b = 0; b < nb; ++b) {
    const float s = wire::load<float>(scales + 4 * b);
    const std::size_t lo = b * block, hi = std::min<std::size_t>(n, lo + block);
    for (std::size_t i0 = lo; i0 < hi; i0 += chunk) {
      const std::size_t len = std::min(chunk, hi - i0);
      unpack_codes<B>(codes, i0, len, c);
      for (std::size_t j = 0; j < len; ++j) sink(i0 + j, rule.fraction(c[j]) * s);
    }
  }
}

/// Validates a payload of this family completely, then feeds
/// sink(i, fraction(code_i) * scale_of_block(i)) for every element. Both
/// passes run as the host's vector clone (host_simd.hpp; the same IEEE
/// operations either way): baseline SSE2 code decoded int8 at 1.7 ns an
/// element, a third of the encode's speed.
template <class Rule, float_element T, class Sink>
void blockwise_decode(std::span<const std::byte> payload, std::size_t n, Sink sink,
                      const char* op) {
  const wire::view v = wire::open(payload, Rule::id, dtype_traits<T>::id, 8, op);
  wire::param_reader pr(v.params);
  const auto block = pr.get<std::uint32_t>();
  const auto arg = pr.get<std::uint16_t>();
  const auto bits = pr.get<std::uint8_t>();
  const auto zero = pr.get<std::uint8_t>();
  check_block(block, op, errc::corrupt_payload);
  if (zero != 0) wire::corrupt(op, "reserved parameter byte is " + std::to_string(zero) + ", not 0");
  const Rule rule = Rule::from_wire(arg, bits, op);
  wire::check_count(v, n, op);
  const std::size_t nb = (n + block - 1) / block;
  // n is a real buffer's size, so these products cannot overflow.
  wire::check_body(v, blockwise_body_bytes(n, block, bits), op);
  const std::byte* scales = v.body.data();
  const std::byte* codes = scales + 4 * nb;
  const auto isa = gradsync::detail::best_host_isa();
  dispatch_bits(bits, [&](auto bits_c) {
    constexpr unsigned B = decltype(bits_c)::value;
    body_defect bad;
    gradsync::detail::host_vectorized(
        isa, [](auto... a) { check_blocks<B, Rule>(a...); }, rule, scales, codes, n, std::size_t{block}, &bad);
    switch (bad.kind) {
    case body_defect::none: break;
    case body_defect::scale:
      wire::corrupt(op, "block " + std::to_string(bad.at) + " has an invalid scale " +
                            std::to_string(wire::load<float>(scales + 4 * bad.at)));
    case body_defect::code: {
      const float s = wire::load<float>(scales + 4 * (bad.at / block));
      wire::corrupt(op, "element " + std::to_string(bad.at) + " has invalid code " +
                            std::to_string(get_code<B>(codes, bad.at)) +
                            (s != s ? " in a poisoned (NaN-scale) block" : ""));
    }
    case body_defect::padding: wire::corrupt(op, "padding bits of the last code byte are not zero");
    }
    gradsync::detail::host_vectorized(
        isa, [](auto... a) { scatter_blocks<B, Rule>(a...); }, rule, scales, codes, n, std::size_t{block}, sink);
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
  /// Rule parameters (qsgd: levels; terngrad and qsgd: unbiased, false for
  /// the form error feedback needs).
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
    check_float_range(in, Rule::encode_op);
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
    decode_each(payload, out.size(), store_sink<T>{out.data()});
  }
  /// acc[i] += decoded element.
  void decode_accumulate(std::span<const std::byte> payload, std::span<accum_t<T>> acc) const {
    decode_each(payload, acc.size(), accumulate_sink<T>{acc.data()});
  }
  /// sink(i, decoded element i) for i = 0 .. n-1 after full validation
  /// (codec.hpp's decodes_each; the sink is inlined into the vector clone).
  template <class Sink> void decode_each(std::span<const std::byte> payload, std::size_t n, Sink sink) const {
    detail::blockwise_decode<Rule, T>(payload, n, sink, Rule::decode_op);
  }
};

} // namespace gradsync::compress
