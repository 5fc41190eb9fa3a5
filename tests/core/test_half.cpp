// half and bfloat16 conversions, checked on every bit pattern against
// references that share no code with core/half.hpp: ldexp of the decoded
// fields for decoding, a nearest-value search in double for encoding, and
// (where the compiler has it) g++'s own _Float16.
#include <doctest/doctest.h>

#include <gradsync/core/half.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>
#include <random>
#include <vector>

namespace {

using gradsync::bfloat16;
using gradsync::half;

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float from_bits32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// A 16-bit float format described by its field widths.
struct format {
  int exp_bits, man_bits;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  std::uint16_t exp_mask() const { return static_cast<std::uint16_t>(((1u << exp_bits) - 1u) << man_bits); }
  std::uint16_t inf_bits() const { return exp_mask(); }
  bool is_nan(std::uint16_t b) const {
    return (b & exp_mask()) == exp_mask() && (b & ((1u << man_bits) - 1u)) != 0;
  }
  // Exact value of pattern b from its fields (NaN for NaN patterns).
  double decode(std::uint16_t b) const {
    const int sign = b >> 15;
    const int e = (b >> man_bits) & ((1 << exp_bits) - 1);
    const int m = b & ((1 << man_bits) - 1);
    double v;
    if (e == (1 << exp_bits) - 1) v = m ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
    else if (e == 0) v = std::ldexp(static_cast<double>(m), 1 - bias() - man_bits);
    else v = std::ldexp(static_cast<double>((1 << man_bits) + m), e - bias() - man_bits);
    return sign ? -v : v;
  }
  // The value the pattern after the largest finite one would have if the
  // exponent range went on: values at or past its midpoint round to Inf.
  double beyond_max() const { return std::ldexp(1.0, bias() + 1); }
};

constexpr format half_fmt{5, 10};
constexpr format bf16_fmt{8, 7};

// Reference encoder: finds the two representable neighbours of `x` among all
// non-negative finite values (sorted), picks the nearer, ties to the even
// pattern, and overflows to Inf as IEEE round-to-nearest-even specifies.
class reference_encoder {
public:
  explicit reference_encoder(format f) : f_(f) {
    for (std::uint32_t b = 0; b < f.inf_bits(); ++b) values_.push_back(f.decode(static_cast<std::uint16_t>(b)));
    values_.push_back(f.beyond_max()); // stands for Inf
  }
  std::uint16_t encode(float xf) const {
    REQUIRE(!std::isnan(xf));
    const std::uint16_t sign = std::signbit(xf) ? 0x8000 : 0;
    const double x = std::fabs(static_cast<double>(xf));
    if (std::isinf(x)) return sign | f_.inf_bits();
    if (x >= values_.back()) return sign | f_.inf_bits();
    // first value >= x
    const auto it = std::lower_bound(values_.begin(), values_.end(), x);
    auto hi = static_cast<std::uint16_t>(it - values_.begin());
    if (*it == x) return sign | hi;
    const auto lo = static_cast<std::uint16_t>(hi - 1);
    const double dlo = x - values_[lo], dhi = values_[hi] - x;
    std::uint16_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1u) ? hi : lo);
    return sign | pick; // hi == inf_bits() encodes Inf, by construction
  }
  const std::vector<double>& values() const { return values_; }

private:
  format f_;
  std::vector<double> values_;
};

const reference_encoder& half_ref() {
  static const reference_encoder r(half_fmt);
  return r;
}
const reference_encoder& bf16_ref() {
  static const reference_encoder r(bf16_fmt);
  return r;
}

std::uint16_t to_half(float f) { return half(f).bits; }
std::uint16_t to_bf16(float f) { return bfloat16(f).bits; }
float from_half(std::uint16_t b) { return static_cast<float>(half::from_bits(b)); }
float from_bf16(std::uint16_t b) { return static_cast<float>(bfloat16::from_bits(b)); }

// Every decoded pattern equals its field-wise value, bit for bit (so signed
// zeros and subnormals are exact); NaN decodes to a quiet NaN of the same sign.
template <class Decode> void check_decode_all(format f, Decode decode) {
  long bad = 0;
  for (std::uint32_t i = 0; i <= 0xffff; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    const float got = decode(b);
    if (f.is_nan(b)) {
      const bool ok = std::isnan(got) && (bits_of(got) & 0x00400000u) && std::signbit(got) == bool(b >> 15);
      if (!ok && bad++ < 5) FAIL_CHECK("NaN pattern " << std::hex << i << " decoded to " << bits_of(got));
      continue;
    }
    const float want = static_cast<float>(f.decode(b));
    REQUIRE(static_cast<double>(want) == f.decode(b)); // every value fits a float exactly
    if (bits_of(got) != bits_of(want) && bad++ < 5)
      FAIL_CHECK("pattern 0x" << std::hex << i << ": got " << got << " want " << want);
  }
  CHECK(bad == 0);
}

// Encoding the decoded value of every non-NaN pattern gives the pattern back;
// NaN patterns give a quiet NaN of the same sign.
template <class Encode, class Decode> void check_round_trip(format f, Encode encode, Decode decode) {
  long bad = 0;
  const std::uint16_t quiet = static_cast<std::uint16_t>(1u << (f.man_bits - 1));
  for (std::uint32_t i = 0; i <= 0xffff; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    const std::uint16_t got = encode(decode(b));
    const bool ok = f.is_nan(b) ? f.is_nan(got) && (got & quiet) && (got >> 15) == (b >> 15) : got == b;
    if (!ok && bad++ < 5) FAIL_CHECK("pattern 0x" << std::hex << i << " came back as 0x" << got);
  }
  CHECK(bad == 0);
}

// Every midpoint between adjacent values rounds to the even pattern, and the
// floats just below and above it go to the nearer neighbour. Also covers the
// float neighbours of every representable value (they round to that value).
template <class Encode> void check_midpoints(format f, const reference_encoder& ref, Encode encode) {
  const auto& v = ref.values();
  long bad = 0, checked = 0;
  auto expect = [&](float x, std::uint16_t want) {
    for (const float s : {x, -x}) {
      const std::uint16_t w = std::signbit(s) ? static_cast<std::uint16_t>(want | 0x8000u) : want;
      const std::uint16_t got = encode(s);
      ++checked;
      if (got != w && bad++ < 8)
        FAIL_CHECK("encode(" << s << " = 0x" << std::hex << bits_of(s) << ") = 0x" << got << ", want 0x" << w);
    }
  };
  for (std::size_t lo = 0; lo + 1 < v.size(); ++lo) {
    const auto lo_b = static_cast<std::uint16_t>(lo), hi_b = static_cast<std::uint16_t>(lo + 1);
    const double mid = (v[lo] + v[lo + 1]) / 2;
    const auto midf = static_cast<float>(mid);
    REQUIRE(static_cast<double>(midf) == mid); // midpoints are floats: 16-bit formats have few digits
    expect(midf, (lo_b & 1u) ? hi_b : lo_b);
    expect(std::nextafter(midf, 0.0f), lo_b);
    expect(std::nextafter(midf, INFINITY), hi_b); // hi_b == Inf past the largest value
    const auto val = static_cast<float>(v[lo]);
    expect(val, lo_b);
    if (lo > 0) expect(std::nextafter(val, 0.0f), lo_b);
    expect(std::nextafter(val, INFINITY), lo_b);
  }
  (void)f;
  CHECK(bad == 0);
  CHECK(checked > 6 * 2 * 30000);
}

// Random floats: mostly uniform bit patterns, plus many inside the format's
// range (where rounding is non-trivial), all compared with the reference.
template <class Encode> void check_random(const reference_encoder& ref, Encode encode, float lo, float hi, int n) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<std::uint32_t> any;
  std::uniform_real_distribution<float> range(std::log2(lo), std::log2(hi));
  long bad = 0;
  for (int i = 0; i < n; ++i) {
    float x = i % 2 ? from_bits32(any(rng)) : std::exp2(range(rng)) * (any(rng) & 1 ? -1.f : 1.f);
    if (i % 4 == 2) x = from_bits32((bits_of(x) & ~0x1fffu) | 0x1000u | (any(rng) & 1)); // near half ties
    if (std::isnan(x)) continue;
    const auto got = encode(x), want = ref.encode(x);
    if (got != want && bad++ < 8)
      FAIL_CHECK("encode(0x" << std::hex << bits_of(x) << ") = 0x" << got << ", want 0x" << want);
  }
  CHECK(bad == 0);
}

} // namespace

TEST_CASE("half: decode every pattern exactly") { check_decode_all(half_fmt, from_half); }

TEST_CASE("bfloat16: decode every pattern exactly") { check_decode_all(bf16_fmt, from_bf16); }

TEST_CASE("half: every non-NaN pattern survives a round trip") {
  check_round_trip(half_fmt, to_half, from_half);
}

TEST_CASE("bfloat16: every non-NaN pattern survives a round trip") {
  check_round_trip(bf16_fmt, to_bf16, from_bf16);
}

TEST_CASE("half: midpoints round to even, neighbours to the nearer value") {
  check_midpoints(half_fmt, half_ref(), to_half);
}

TEST_CASE("bfloat16: midpoints round to even, neighbours to the nearer value") {
  check_midpoints(bf16_fmt, bf16_ref(), to_bf16);
}

TEST_CASE("half: special values and thresholds") {
  CHECK(to_half(0.0f) == 0x0000);
  CHECK(to_half(-0.0f) == 0x8000);
  CHECK(to_half(INFINITY) == 0x7c00);
  CHECK(to_half(-INFINITY) == 0xfc00);
  CHECK(to_half(65504.0f) == 0x7bff);
  CHECK(to_half(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  CHECK(to_half(65520.0f) == 0x7c00); // the tie goes to the even pattern, which is Inf
  CHECK(to_half(-65520.0f) == 0xfc00);
  CHECK(to_half(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(to_half(std::ldexp(1.0f, -24)) == 0x0001); // smallest subnormal
  CHECK(to_half(std::ldexp(1.0f, -25)) == 0x0000); // tie with zero: even
  CHECK(to_half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(to_half(-std::ldexp(1.0f, -25)) == 0x8000); // signed zero kept
  CHECK(to_half(std::ldexp(3.0f, -25)) == 0x0002); // 1.5 ulp: tie to even 2
  CHECK(to_half(std::ldexp(1.0f, -14)) == 0x0400); // smallest normal
  CHECK(to_half(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(to_half(-std::numeric_limits<float>::denorm_min()) == 0x8000);
  CHECK(to_half(std::ldexp(1023.5f, -24)) == 0x0400); // subnormal rounds up into the normals
  for (const float nan : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN(),
                          from_bits32(0x7f800001u), from_bits32(0xff800001u), from_bits32(0x7fffffffu)}) {
    const auto h = to_half(nan);
    CHECK((h & 0x7c00) == 0x7c00);
    CHECK((h & 0x0200) != 0); // quiet
    CHECK((h >> 15) == (bits_of(nan) >> 31));
  }
  CHECK(from_half(0x7bff) == 65504.0f);
  CHECK(from_half(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::signbit(from_half(0x8000)));
  CHECK(std::isinf(from_half(0xfc00)));
}

TEST_CASE("bfloat16: special values and thresholds") {
  CHECK(to_bf16(0.0f) == 0x0000);
  CHECK(to_bf16(-0.0f) == 0x8000);
  CHECK(to_bf16(INFINITY) == 0x7f80);
  CHECK(to_bf16(-INFINITY) == 0xff80);
  CHECK(to_bf16(std::numeric_limits<float>::max()) == 0x7f80); // above max bf16 + half ulp
  CHECK(to_bf16(from_bits32(0x7f7f7fffu)) == 0x7f7f);
  CHECK(to_bf16(from_bits32(0x7f7f8000u)) == 0x7f80); // tie, odd -> Inf
  CHECK(to_bf16(from_bits32(0x3f808000u)) == 0x3f80); // tie, even stays
  CHECK(to_bf16(from_bits32(0x3f818000u)) == 0x3f82); // tie, odd rounds up
  CHECK(to_bf16(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(to_bf16(from_bits32(0x00008001u)) == 0x0001); // float subnormals are bf16 subnormals
  CHECK(to_bf16(from_bits32(0x807fffffu)) == 0x8080); // rounds up into the normals, sign kept
  for (const float nan : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN(),
                          from_bits32(0x7f800001u), from_bits32(0xff800001u), from_bits32(0x7fffffffu)}) {
    const auto b = to_bf16(nan);
    CHECK((b & 0x7f80) == 0x7f80);
    CHECK((b & 0x0040) != 0); // quiet, never rounded into Inf
    CHECK((b >> 15) == (bits_of(nan) >> 31));
  }
}

TEST_CASE("bfloat16: every upper half with the rounding-relevant lower halves") {
  // bf16 rounding depends only on the low 16 bits (vs 0x8000) and the
  // lowest kept bit, so these lower halves under every upper half cover it.
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff};
  long bad = 0;
  for (std::uint32_t hi = 0; hi <= 0xffff; ++hi)
    for (const auto lo : lows) {
      const float x = from_bits32((hi << 16) | lo);
      if (std::isnan(x)) continue;
      const auto got = to_bf16(x), want = bf16_ref().encode(x);
      if (got != want && bad++ < 8)
        FAIL_CHECK("encode(0x" << std::hex << bits_of(x) << ") = 0x" << got << ", want 0x" << want);
    }
  CHECK(bad == 0);
}

TEST_CASE("half and bfloat16: millions of random floats against the reference") {
  check_random(half_ref(), to_half, 1e-9f, 1e6f, 3'000'000);
  check_random(bf16_ref(), to_bf16, 1e-40f, 1e38f, 3'000'000);
}

#ifdef __FLT16_MAX__
TEST_CASE("half: agrees with the compiler's _Float16") {
  long bad = 0;
  for (std::uint32_t i = 0; i <= 0xffff; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    _Float16 h;
    std::memcpy(&h, &b, 2);
    const float want = static_cast<float>(h), got = from_half(b);
    const bool ok = std::isnan(want) ? std::isnan(got) : bits_of(want) == bits_of(got);
    if (!ok && bad++ < 5) FAIL_CHECK("decode 0x" << std::hex << i);
  }
  std::mt19937 rng(777);
  std::uniform_int_distribution<std::uint32_t> any;
  auto compare = [&](float x) {
    const _Float16 h = static_cast<_Float16>(x);
    std::uint16_t want;
    std::memcpy(&want, &h, 2);
    const auto got = to_half(x);
    const bool ok = std::isnan(x) ? half_fmt.is_nan(got) && half_fmt.is_nan(want) : got == want;
    if (!ok && bad++ < 10) FAIL_CHECK("encode(0x" << std::hex << bits_of(x) << ") = 0x" << got << ", _Float16 0x" << want);
  };
  // every upper half with low bits around the half-precision rounding points
  const std::uint32_t lows[] = {0x0000, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0xffff};
  for (std::uint32_t hi = 0; hi <= 0xffff; ++hi)
    for (const auto lo : lows) compare(from_bits32((hi << 16) | lo));
  for (int i = 0; i < 4'000'000; ++i) {
    std::uint32_t u = any(rng);
    if (i % 2) u = (u & 0x807fffffu) | ((100u + (u >> 8) % 46u) << 23); // exponents around half's range
    compare(from_bits32(u));
  }
  CHECK(bad == 0);
}
#endif
