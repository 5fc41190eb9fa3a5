// fp16 / bf16 cast codecs: bit-exact agreement with core/half.hpp, specials,
// accumulation, edge counts, corruption.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gradsync/compress/cast.hpp>

#include "corrupt.hpp"

namespace cz = gradsync::compress;
using gradsync::bfloat16;
using gradsync::half;

namespace {

// Floats across the whole range: random bit patterns (incl. NaN, Inf,
// subnormals) plus exact halfway points of the 16-bit grids.
std::vector<float> test_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t b = static_cast<std::uint32_t>(rng());
    if (i % 3 == 0) b = (b & 0x80ffffffu) | ((100u + b % 60u) << 23); // near the half range
    float f;
    std::memcpy(&f, &b, 4);
    v.push_back(f);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float f : {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 65519.99f, 1e-8f, 5.96e-8f,
                  2.98e-8f, 1.0009765625f * 0.5f + 0.00048828125f * 0.5f, 1e30f, -1e-40f, inf,
                  -inf, std::numeric_limits<float>::quiet_NaN(), 3.3895314e38f})
    v.push_back(f);
  v.push_back(1.0f + 0x1p-11f);
  v.push_back(1.0f + 0x1p-8f);
  v.push_back(1.0f + 3 * 0x1p-11f);
  return v;
}

template <class W> std::uint16_t ref_bits(float f) { return W(f).bits; }

bool same_bits_or_both_nan(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, 4) == 0;
}

template <class C, class W> void check_float_input() {
  const auto x = test_floats(5000, 7);
  const C c;
  cz::no_state st;
  const auto p = cz::encode_to_vector(c, std::span<const float>(x), st);
  CHECK(p.size() == c.max_encoded_bytes(x.size()));
  const auto y = cz::decode_to_vector(c, p);
  REQUIRE(y.size() == x.size());
  int mismatches = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float ref = static_cast<float>(W::from_bits(ref_bits<W>(x[i])));
    if (!same_bits_or_both_nan(y[i], ref)) ++mismatches;
    if (std::isnan(x[i])) CHECK(std::isnan(y[i]));
    if (std::isinf(x[i])) CHECK(y[i] == x[i]);
  }
  CHECK(mismatches == 0);
  // Ties to even, by hand (the last three inputs).
  const float* t = y.data() + y.size() - 3;
  if constexpr (std::same_as<W, half>) {
    CHECK(t[0] == 1.0f);               // 1 + 2^-11: tie between 1 and 1 + 2^-10
    CHECK(t[1] == 1.0f + 0x1p-8f);     // exactly representable
    CHECK(t[2] == 1.0f + 0x1p-9f);     // 1 + 3*2^-11: tie, the even neighbour is 1 + 2^-9
  } else {
    CHECK(t[0] == 1.0f);
    CHECK(t[1] == 1.0f);               // 1 + 2^-8: tie between 1 and 1 + 2^-7
    CHECK(t[2] == 1.0f);               // well below the bf16 midpoint
  }
}

// C encodes and decodes its own 16-bit type: everything but NaN payloads is exact.
template <class C> void check_all_patterns(const std::vector<typename C::value_type>& x) {
  using W = typename C::value_type;
  cz::no_state st;
  const C c;
  const auto y = cz::decode_to_vector(c, cz::encode_to_vector(c, std::span<const W>(x), st));
  int bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const bool nan = std::isnan(static_cast<float>(x[i]));
    if (nan ? !std::isnan(static_cast<float>(y[i])) : !(y[i] == x[i])) ++bad;
  }
  CHECK(bad == 0);
}

} // namespace

TEST_CASE("fp16 / bf16 from float match core/half.hpp bit for bit") {
  check_float_input<cz::fp16<float>, half>();
  check_float_input<cz::bf16<float>, bfloat16>();
}

TEST_CASE("16-bit inputs: every bit pattern round-trips (NaN stays NaN)") {
  auto all = [](auto tag) {
    using W = decltype(tag);
    std::vector<W> v(65536);
    for (std::uint32_t b = 0; b < 65536; ++b) v[b] = W::from_bits(static_cast<std::uint16_t>(b));
    return v;
  };
  check_all_patterns<cz::fp16<half>>(all(half{}));
  check_all_patterns<cz::bf16<bfloat16>>(all(bfloat16{}));
  { // bf16 -> fp16 goes through float: half(float(b)) exactly.
    const auto x = all(bfloat16{});
    cz::no_state st;
    const cz::fp16<bfloat16> c;
    const auto p = cz::encode_to_vector(c, std::span<const bfloat16>(x), st);
    std::vector<float> acc(x.size(), 0.0f);
    c.decode_accumulate(p, std::span(acc));
    int bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!same_bits_or_both_nan(acc[i] + 0.0f, static_cast<float>(half(static_cast<float>(x[i]))) + 0.0f))
        ++bad;
    CHECK(bad == 0);
  }
}

TEST_CASE("double input rounds through float; accumulate adds in double") {
  const std::vector<double> x = {0.1, -1e300, 1e-300, 65504.0, 1.0 / 3.0, -2.5};
  cz::no_state st;
  const cz::fp16<double> c;
  const auto p = cz::encode_to_vector(c, std::span<const double>(x), st);
  std::vector<double> acc = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0};
  c.decode_accumulate(p, std::span(acc));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double ref = static_cast<float>(half(static_cast<float>(x[i])));
    CHECK(acc[i] == static_cast<double>(i + 1) + ref);
  }
  CHECK(std::isinf(acc[1]));
  CHECK(acc[2] == 3.0);
}

TEST_CASE("edge counts 0, 1, odd; buffers too small are rejected") {
  for (std::size_t n : {0u, 1u, 7u, 1001u}) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 64) * 0.25f - 3.0f;
    cz::no_state st;
    const cz::bf16<float> c;
    const auto p = cz::encode_to_vector(c, std::span<const float>(x), st);
    CHECK(p.size() == cz::wire::header_bytes + 2 * n);
    const auto y = cz::decode_to_vector(c, p);
    REQUIRE(y.size() == n);
    for (std::size_t i = 0; i < n; ++i) CHECK(y[i] == x[i]); // all exact in bf16
  }
  const cz::fp16<float> c;
  cz::no_state st;
  std::vector<float> x(10, 1.0f);
  std::vector<std::byte> out(c.max_encoded_bytes(10) - 1);
  CHECK_THROWS_AS(c.encode(std::span<const float>(x), st, {}, out), gradsync::error);
}

TEST_CASE("a payload decodes only as its own codec and element type") {
  std::vector<float> x(33, 0.5f);
  cz::no_state st;
  const auto p = cz::encode_to_vector(cz::fp16<float>{}, std::span<const float>(x), st);
  corrupt::expect_rejected(cz::bf16<float>{}, p, 33, "payload is fp16");
  corrupt::expect_rejected(cz::fp16<half>{}, p, 33, "encoded from f32");
}

TEST_CASE("corruption: every prefix, flips, random bytes, resizes") {
  std::vector<float> x(301);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
  cz::no_state st;
  const auto s1 = corrupt::check_decoder(cz::fp16<float>{},
                                         cz::encode_to_vector(cz::fp16<float>{}, std::span<const float>(x), st));
  CHECK(s1.rejected > 3000);
  std::vector<half> h(8);
  const auto s2 = corrupt::check_decoder(cz::bf16<half>{},
                                         cz::encode_to_vector(cz::bf16<half>{}, std::span<const half>(h), st),
                                         {.seed = 2});
  CHECK(s2.rejected > 3000);
}
