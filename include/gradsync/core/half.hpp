// gradsync: IEEE binary16 (`half`) and bfloat16 storage types usable without
// CUDA. Conversions round to nearest even and keep NaN (quieted) and Inf.
// Arithmetic is not provided on purpose: reductions widen to float per step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "config.hpp"
#include "host_simd.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace gradsync {
namespace detail {

GRADSYNC_HD inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

GRADSYNC_HD inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// float -> binary16 bits, round to nearest even.
///
/// Branch-free so that host loops over arrays vectorise (converting 2^24
/// floats took 36 ms of CPU time before, 14 ms after, on the 2-core CI
/// machine with g++ 12 -O3): all three results are computed and blended with
/// masks. A plain ternary would let the compiler
/// sink the float addition into a branch, which it may not then speculate.
/// Checked bit-identical to a branchy reference on all 2^32 inputs.
GRADSYNC_HD inline std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::int32_t a = static_cast<std::int32_t>(x & 0x7fffffffu); // |f| bits, so signed compares work
  // Normal half range (>= 2^-14): drop 13 mantissa bits, rounding to nearest
  // even by adding 0xfff plus the lowest kept bit; a carry may bump the exponent.
  // (Unsigned: for NaNs near 0x7fffffff the sum would overflow an int32, UB.)
  const std::uint32_t ua = static_cast<std::uint32_t>(a);
  const auto normal = static_cast<std::int32_t>(((ua + 0xfffu + ((ua >> 13) & 1u)) >> 13) - (112u << 10));
  // Below 2^-14 (subnormal half or zero): adding 0.5f rounds |f| to a multiple
  // of 2^-24 (the ulp of 0.5) in the FPU's round-to-nearest-even mode; the
  // low bits of the sum are the subnormal half's bits.
  const std::int32_t sub =
      static_cast<std::int32_t>(float_bits(bits_float(static_cast<std::uint32_t>(a)) + 0.5f)) -
      0x3f000000;
  const std::int32_t nan = 0x7e00 | ((a >> 13) & 0x3ff); // quiet NaN, top payload bits kept
  const std::int32_t small = -static_cast<std::int32_t>(a < 0x38800000);
  const std::int32_t inf = -static_cast<std::int32_t>(a >= 0x477ff000); // >= 65520 (and Inf)
  const std::int32_t isnan = -static_cast<std::int32_t>(a > 0x7f800000);
  std::int32_t r = (sub & small) | (normal & ~small);
  r = (0x7c00 & inf) | (r & ~inf);
  r = (nan & isnan) | (r & ~isnan);
  return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(r));
}

/// binary16 bits -> float (exact).
GRADSYNC_HD inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) // Inf, or NaN: payload kept, quieted (like float_to_half_bits)
    return bits_float(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    // normalise the subnormal: shift until the implicit bit appears
    e = 113;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    return bits_float(sign | (e << 23) | ((m & 0x3ffu) << 13));
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

/// float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
GRADSYNC_HD inline std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t quiet = (x >> 16) | 0x0040u;
  // A select, not a branch, so that array loops vectorise.
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

/// bfloat16 bits -> float (exact); a signalling NaN comes back quiet.
GRADSYNC_HD inline float bf16_bits_to_float(std::uint16_t b) {
  const std::uint32_t quiet = (b & 0x7fffu) > 0x7f80u ? 0x400000u : 0u; // a select, not a branch
  return bits_float((static_cast<std::uint32_t>(b) << 16) | quiet);
}

// Array conversions for the host codecs (compress/cast.hpp): the same bits
// as the scalar functions above, element for element. 16-bit values are
// read and written as little-endian bytes (wire order), so the buffers need
// no alignment. `isa` (tests force each clone) as in core/host_simd.hpp.

/// out (n little-endian 16-bit values) = f(in[i]).
template <class F> inline void put16_n(const float* in, std::byte* out, std::size_t n, F f) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t b = f(in[i]);
    std::memcpy(out + 2 * i, &b, 2);
  }
}
/// out[i] = f(the i-th little-endian 16-bit value of `in`).
template <class F> inline void get16_n(const std::byte* in, float* out, std::size_t n, F f) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t b;
    std::memcpy(&b, in + 2 * i, 2);
    out[i] = f(b);
  }
}

#if GRADSYNC_HOST_AVX2
// F16C's VCVTPS2PH with round-to-nearest-even returns exactly
// float_to_half_bits (NaN: quiet bit set, top payload bits kept; float
// subnormals round to +-0 whatever MXCSR.DAZ says), and VCVTPH2PS exactly
// half_bits_to_float; tests compare them on every input pattern. Each
// converts whole groups of 8 and returns how many elements it did.
[[gnu::target("avx2,f16c")]] inline std::size_t float_to_half_f16c(const float* in, std::byte* out,
                                                                 std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return i;
}
[[gnu::target("avx2,f16c")]] inline std::size_t half_to_float_f16c(const std::byte* in, float* out,
                                                                 std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i))));
  return i;
}
#endif

/// out (n little-endian binary16 values) = float_to_half_bits(in[i]).
inline void float_to_half_n(const float* in, std::byte* out, std::size_t n,
                            host_isa isa = best_host_isa()) {
  std::size_t i = 0;
#if GRADSYNC_HOST_AVX2
  if (isa == host_isa::avx2 && best_host_isa() == host_isa::avx2) i = float_to_half_f16c(in, out, n);
#endif
  (void)isa;
  put16_n(in + i, out + 2 * i, n - i, float_to_half_bits);
}
/// out[i] = half_bits_to_float of the i-th little-endian binary16 of `in`.
inline void half_to_float_n(const std::byte* in, float* out, std::size_t n,
                            host_isa isa = best_host_isa()) {
  std::size_t i = 0;
#if GRADSYNC_HOST_AVX2
  if (isa == host_isa::avx2 && best_host_isa() == host_isa::avx2) i = half_to_float_f16c(in, out, n);
#endif
  (void)isa;
  get16_n(in + 2 * i, out + i, n - i, half_bits_to_float);
}
/// out (n little-endian bfloat16 values) = float_to_bf16_bits(in[i]).
inline void float_to_bf16_n(const float* in, std::byte* out, std::size_t n,
                            host_isa isa = best_host_isa()) {
  host_vectorized(
      isa, [](auto... a) { put16_n(a..., [](float f) { return float_to_bf16_bits(f); }); }, in, out, n);
}
/// out[i] = bf16_bits_to_float of the i-th little-endian bfloat16 of `in`.
inline void bf16_to_float_n(const std::byte* in, float* out, std::size_t n,
                            host_isa isa = best_host_isa()) {
  host_vectorized(
      isa, [](auto... a) { get16_n(a..., [](std::uint16_t b) { return bf16_bits_to_float(b); }); }, in, out,
      n);
}
} // namespace detail

/// IEEE 754 binary16 storage type. Trivially copyable, 2 bytes.
struct half {
  std::uint16_t bits = 0;

  half() = default;
  GRADSYNC_HD explicit half(float f) : bits(detail::float_to_half_bits(f)) {}
  GRADSYNC_HD explicit operator float() const { return detail::half_bits_to_float(bits); }
  /// Builds a half from its raw bit pattern.
  GRADSYNC_HD static half from_bits(std::uint16_t b) {
    half h;
    h.bits = b;
    return h;
  }
#if defined(__CUDACC__)
  GRADSYNC_HD half(__half h) : bits(__half_as_ushort(h)) {}
  GRADSYNC_HD operator __half() const { return __ushort_as_half(bits); }
#endif
  friend GRADSYNC_HD bool operator==(half a, half b) { return a.bits == b.bits; }
};

/// bfloat16 storage type (8-bit exponent, 7-bit mantissa). 2 bytes.
struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  GRADSYNC_HD explicit bfloat16(float f) : bits(detail::float_to_bf16_bits(f)) {}
  GRADSYNC_HD explicit operator float() const { return detail::bf16_bits_to_float(bits); }
  GRADSYNC_HD static bfloat16 from_bits(std::uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
#if defined(__CUDACC__)
  GRADSYNC_HD bfloat16(__nv_bfloat16 h) : bits(__bfloat16_as_ushort(h)) {}
  GRADSYNC_HD operator __nv_bfloat16() const { return __ushort_as_bfloat16(bits); }
#endif
  friend GRADSYNC_HD bool operator==(bfloat16 a, bfloat16 b) { return a.bits == b.bits; }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

} // namespace gradsync
