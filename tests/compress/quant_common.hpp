// Checks every block-scaled quantiser (int8, int4, qsgd, terngrad, sign) must
// pass, plus test data and payload-crafting helpers their tests share.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <gradsync/compress/blockwise.hpp>

#include "corrupt.hpp"

namespace quant {

namespace cz = gradsync::compress;
inline constexpr float flt_max = std::numeric_limits<float>::max();
inline constexpr float inf = std::numeric_limits<float>::infinity();
inline const float qnan = std::numeric_limits<float>::quiet_NaN();

/// Gradient-like data: Student-t(3) with a scale that drifts over 3 decades,
/// a few exact zeros.
inline std::vector<float> gradient_like(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::student_t_distribution<float> t3(3.0f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = i % 97 == 5 ? 0.0f
                       : t3(rng) * std::pow(10.0f, -1.0f - 3.0f * static_cast<float>(i) /
                                                       static_cast<float>(n));
  return x;
}

/// Unit in the last place of |v| (the subnormal spacing below 2^-126).
inline float ulp(float v) {
  const float a = std::fabs(v);
  return std::max(std::nextafter(a, inf) - a, std::numeric_limits<float>::denorm_min());
}

template <class T> std::vector<T> as(const std::vector<float>& x) {
  std::vector<T> v;
  for (float f : x) v.push_back(static_cast<T>(f));
  return v;
}

/// Encodes x (float) with codec C and decodes through decode_accumulate into
/// zeros, so the float values are seen without a narrowing to T.
template <class C>
std::vector<float> roundtrip(const C& c, const std::vector<typename C::value_type>& x,
                             typename C::state& st, std::vector<std::byte>* payload = nullptr) {
  const auto p = cz::encode_to_vector(c, std::span<const typename C::value_type>(x), st);
  CHECK(p.size() == c.max_encoded_bytes(x.size()));
  std::vector<gradsync::accum_t<typename C::value_type>> acc(x.size(), 0);
  c.decode_accumulate(p, std::span(acc));
  // decode() must agree with narrow(accumulated value).
  std::vector<typename C::value_type> out(x.size());
  c.decode(p, std::span(out));
  int disagree = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float a = static_cast<float>(gradsync::narrow<typename C::value_type>(acc[i]));
    const float b = static_cast<float>(gradsync::widen(out[i]));
    if (!(a == b || (std::isnan(a) && std::isnan(b)))) ++disagree;
  }
  CHECK(disagree == 0);
  if (payload) *payload = p;
  return std::vector<float>(acc.begin(), acc.end());
}

/// Per-block max |x| (an independent reference for the bounds).
inline std::vector<float> block_absmax(const std::vector<float>& x, std::size_t block) {
  std::vector<float> m((x.size() + block - 1) / block, 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i) m[i / block] = std::max(m[i / block], std::fabs(x[i]));
  return m;
}

/// Elements of x (as float) whose decoded y misses |x - y| <= absmax / div +
/// 2 ulp(absmax), absmax taken per block of `block` (the int8/int4 bound).
template <class T>
int absmax_bound_misses(const std::vector<T>& x, const std::vector<float>& y, std::size_t block,
                        float div) {
  std::vector<float> xf;
  for (T v : x) xf.push_back(static_cast<float>(v));
  const auto m = block_absmax(xf, block);
  int bad = 0;
  for (std::size_t i = 0; i < xf.size(); ++i) {
    const float a = m[i / block];
    bad += !(std::fabs(xf[i] - y[i]) <= a / div + 2 * ulp(a));
  }
  return bad;
}

/// Largest magnitude a decoded element of each block may have: max |x|, or
/// for l2-scaled rules the block norm (clamped to the float range).
template <class C> std::vector<float> block_bound(const C& c, const std::vector<float>& x) {
  auto m = block_absmax(x, c.block);
  if constexpr (decltype(c.rule)::scale == cz::scale_kind::l2) {
    std::vector<double> sq(m.size(), 0.0);
    for (std::size_t i = 0; i < x.size(); ++i) sq[i / c.block] += double(x[i]) * x[i];
    for (std::size_t b = 0; b < m.size(); ++b)
      m[b] = static_cast<float>(std::min<double>(flt_max, std::sqrt(sq[b])));
  }
  return m;
}

/// A copy of payload p with byte `at` set to v (or, with `mask`, xor-ed) and
/// the checksum recomputed, so the codec's own validation is reached.
inline std::vector<std::byte> patched(std::vector<std::byte> p, std::size_t at, std::byte v,
                                      bool xor_it = false) {
  REQUIRE(at < p.size());
  p[at] = xor_it ? p[at] ^ v : v;
  cz::wire::seal(p);
  return p;
}
/// Same, writing a 4-byte value (float or u32) at `at`.
template <class V> std::vector<std::byte> patched4(std::vector<std::byte> p, std::size_t at, V v) {
  static_assert(sizeof(V) == 4);
  REQUIRE(at + 4 <= p.size());
  cz::wire::store<V>(p.data() + at, v);
  cz::wire::seal(p);
  return p;
}

/// Offset of block b's scale and of the codes in a blockwise payload.
inline std::size_t scale_at(std::size_t b) { return cz::wire::header_bytes + 8 + 4 * b; }
inline std::size_t codes_at(std::size_t n, std::size_t block) {
  return scale_at((n + block - 1) / block);
}

/// Checks shared by the whole family, for codec C over float.
template <class C> void common_checks(C c) {
  using S = typename C::state;
  const unsigned bits = c.rule.bits();

  SUBCASE("edge counts, zeros, subnormals, huge values") {
    const float dmin = std::numeric_limits<float>::denorm_min();
    const std::vector<std::vector<float>> inputs = {
        {},
        {0.75f},
        {-3.0f},
        std::vector<float>(9, 0.0f),
        {1.0f, -2.0f, 3.0f, -4.0f, 5.0f, -6.0f, 7.0f}, // odd count
        {dmin, -dmin, 3 * dmin, 0.0f, 1e-40f, -1e-39f, 2e-45f},
        {flt_max, -flt_max, flt_max, 1.0f, -flt_max / 3, 0.0f},
        {1e30f, -1e-30f, 1e-20f, 3e38f, -2.5e38f},
    };
    for (const auto& x : inputs) {
      S st{};
      const auto y = roundtrip(c, x, st);
      REQUIRE(y.size() == x.size());
      const auto m = block_bound(c, x);
      for (std::size_t i = 0; i < x.size(); ++i) {
        CHECK_MESSAGE(std::isfinite(y[i]), "element ", i, " of ", x.size(), ": ", y[i]);
        // Never beyond the block's magnitude range (plus rounding), never the wrong sign.
        CHECK(std::fabs(y[i]) <= m[i / c.block] * (1 + 1e-6f) + 2 * ulp(m[i / c.block]));
        if (x[i] == 0.0f && m[i / c.block] == 0.0f) CHECK(y[i] == 0.0f);
        if (y[i] != 0.0f && x[i] != 0.0f) CHECK((y[i] > 0) == (x[i] > 0));
      }
      const std::size_t nb = (x.size() + c.block - 1) / c.block;
      const auto p = cz::encode_to_vector(c, std::span<const float>(x), st);
      CHECK(p.size() == cz::wire::header_bytes + 8 + 4 * nb + (x.size() * bits + 7) / 8);
    }
  }

  SUBCASE("non-finite policy: a block with NaN or Inf decodes to NaN, others unaffected") {
    auto x = gradient_like(3 * c.block, 3);
    x[c.block + 1] = qnan;
    x[2 * c.block + c.block - 1] = -inf;
    S st{};
    const auto y = roundtrip(c, x, st);
    int nan0 = 0, nan1 = 0, nan2 = 0;
    for (std::size_t i = 0; i < c.block; ++i) {
      nan0 += std::isnan(y[i]);
      nan1 += std::isnan(y[c.block + i]);
      nan2 += std::isnan(y[2 * c.block + i]);
    }
    CHECK(nan0 == 0);
    CHECK(nan1 == static_cast<int>(c.block));
    CHECK(nan2 == static_cast<int>(c.block));
  }

  SUBCASE("parameters and structure are validated") {
    const std::size_t n = 2 * c.block + 3;
    auto x = gradient_like(n, 5);
    S st{};
    const auto p = cz::encode_to_vector(c, std::span<const float>(x), st);
    const std::size_t P = cz::wire::header_bytes;
    corrupt::expect_rejected(c, patched4(p, P, std::uint32_t{0}), n, "block size");
    corrupt::expect_rejected(c, patched(p, P + 3, std::byte{0x7f}), n, "block size");
    corrupt::expect_rejected(c, patched(p, P + 6, std::byte{3}), n, "code width");
    corrupt::expect_rejected(c, patched(p, P + 7, std::byte{1}), n, "reserved");
    corrupt::expect_rejected(c, patched4(p, scale_at(1), -1.0f), n, "invalid scale");
    corrupt::expect_rejected(c, patched4(p, scale_at(1), inf), n, "invalid scale");
    // A poisoned block must carry zero codes.
    auto q = patched4(p, scale_at(0), qnan);
    bool any_code = false;
    for (std::size_t i = 0; i < c.block * bits / 8; ++i)
      any_code |= q[codes_at(n, c.block) + i] != std::byte{0};
    if (any_code) corrupt::expect_rejected(c, q, n, "poisoned");
    // Padding bits of the last byte.
    if ((n * bits) % 8 != 0)
      corrupt::expect_rejected(c, patched(p, p.size() - 1, std::byte{0x80}, true), n, "padding");
    // Encode-side parameter checks.
    C bad = c;
    bad.block = 0;
    std::vector<std::byte> out(4096);
    CHECK_THROWS_AS(bad.encode(std::span<const float>(x), st, {}, out), gradsync::error);
    bad.block = cz::max_block + 1;
    CHECK_THROWS_AS(bad.encode(std::span<const float>(x), st, {}, out), gradsync::error);
    std::vector<std::byte> small(c.max_encoded_bytes(n) - 1);
    CHECK_THROWS_AS(c.encode(std::span<const float>(x), st, {}, small), gradsync::error);
  }

  SUBCASE("half, bfloat16 and double inputs encode exactly like their float values") {
    const auto xf = gradient_like(3 * c.block + 5, 13);
    auto same_body = [&](auto tag) {
      using T = decltype(tag);
      using CT = cz::blockwise<std::remove_cvref_t<decltype(c.rule)>, T>;
      const CT ct{.block = c.block, .rule = c.rule};
      const auto xt = as<T>(xf);
      std::vector<float> back; // the float values the T inputs stand for
      for (T v : xt) back.push_back(static_cast<float>(v));
      S s1{}, s2{};
      const auto pt = cz::encode_to_vector(ct, std::span<const T>(xt), s1);
      const auto pf = cz::encode_to_vector(c, std::span<const float>(back), s2);
      REQUIRE(pt.size() == pf.size());
      CHECK(pt[6] == static_cast<std::byte>(gradsync::dtype_traits<T>::id));
      CHECK(std::equal(pt.begin() + 32, pt.end(), pf.begin() + 32)); // params and body
      // Decoding into T narrows the float result.
      std::vector<T> yt(xt.size());
      ct.decode(pt, std::span(yt));
      std::vector<float> yf(xt.size(), 0.0f);
      c.decode_accumulate(pf, std::span(yf));
      int bad = 0;
      for (std::size_t i = 0; i < yt.size(); ++i)
        bad += !(static_cast<float>(yt[i]) == static_cast<float>(static_cast<T>(yf[i])));
      CHECK(bad == 0);
      // A payload from one element type does not decode as another.
      std::vector<float> wrong(xt.size());
      CHECK_THROWS_AS(c.decode(pt, std::span(wrong)), gradsync::error);
    };
    same_body(gradsync::half{});
    same_body(gradsync::bfloat16{});
    same_body(double{});
  }

  SUBCASE("corruption harness") {
    const std::size_t n = 2 * c.block + 7;
    auto x = gradient_like(n, 11);
    S st{};
    std::vector<std::byte> p = cz::encode_to_vector(c, std::span<const float>(x), st);
    const auto s = corrupt::check_decoder(c, p, {.seed = static_cast<std::uint64_t>(bits) * 31});
    CHECK(s.rejected > 3000);
    MESSAGE("resealed mutations still valid: ", s.resealed_accepted);
  }
}

} // namespace quant
