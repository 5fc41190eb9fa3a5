// blockwise.hpp's machinery, independently of any one codec: every element's
// code is rule.code(x / scale) at its documented bit position, scales are the
// documented statistic, whole-byte packing and table unpacking agree with the
// per-element definition at every alignment (odd blocks, odd counts), and
// every host clone (core/host_simd.hpp) writes the same bytes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gradsync/compress/int4.hpp>
#include <gradsync/compress/int8.hpp>
#include <gradsync/compress/qsgd.hpp>
#include <gradsync/compress/sign.hpp>
#include <gradsync/compress/terngrad.hpp>

namespace cz = gradsync::compress;
namespace gd = gradsync::detail;

namespace {

// Mixed magnitudes plus zeros, -0, subnormals, and (when asked) a NaN/Inf.
std::vector<float> data(std::size_t n, std::uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = nd(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    if (i % 17 == 3) x[i] = 0.0f;
    if (i % 29 == 7) x[i] = -0.0f;
    if (i % 31 == 11) x[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i % 5);
  }
  if (specials && n > 40) {
    x[n / 2] = std::numeric_limits<float>::quiet_NaN();
    x[n / 3] = -std::numeric_limits<float>::infinity();
  }
  return x;
}

// The statistic by its definition, summed in order in double.
float ref_scale(cz::scale_kind k, const float* x, std::size_t len) {
  double sum = 0;
  float amax = 0;
  for (std::size_t i = 0; i < len; ++i) {
    if (!std::isfinite(x[i])) return std::numeric_limits<float>::quiet_NaN();
    const double a = std::fabs(static_cast<double>(x[i]));
    amax = std::max(amax, std::fabs(x[i]));
    sum += k == cz::scale_kind::l2 ? a * a : a;
  }
  if (k == cz::scale_kind::absmax) return amax;
  if (k == cz::scale_kind::mean_abs) return static_cast<float>(sum / static_cast<double>(len));
  return std::max(static_cast<float>(std::sqrt(sum)), amax);
}

std::uint32_t code_at(const std::vector<std::byte>& p, std::size_t codes, std::size_t i, unsigned bits) {
  const std::size_t bit = i * bits;
  return (static_cast<std::uint32_t>(p[codes + bit / 8]) >> (bit % 8)) & ((1u << bits) - 1u);
}

template <class Rule> void check_rule(Rule rule) {
  const cz::philox_stream noise{0x5eed, 3, 1};
  const unsigned bits = rule.bits();
  for (std::uint32_t block : {1u, 3u, 7u, 8u, 9u, 64u, 255u, 1000u}) {
    for (std::size_t n : {0u, 1u, 2u, 5u, 17u, 1001u, 20000u}) {
      for (bool specials : {false, true}) {
        const auto x = data(n, n * 131 + block, specials);
        const std::size_t nb = (n + block - 1) / block;
        const std::size_t size = cz::wire::header_bytes + 8 + cz::blockwise_body_bytes(n, block, bits);
        std::vector<std::byte> base(size), wide(size);
        const std::span<const float> in(x);
        const cz::philox_stream* ns = Rule::stochastic ? &noise : nullptr;
        cz::detail::blockwise_encode(rule, block, in, ns, {}, base, "test", gd::host_isa::baseline);
        cz::detail::blockwise_encode(rule, block, in, ns, {}, wide, "test", gd::host_isa::avx2);
        CAPTURE(block);
        CAPTURE(n);
        CHECK(base == wide); // every clone: the same bytes
        // Every scale and every code by the definitions.
        const std::size_t codes = cz::wire::header_bytes + 8 + 4 * nb;
        std::size_t bad_scale = 0, bad_code = 0;
        for (std::size_t b = 0; b < nb; ++b) {
          const std::size_t lo = b * block, len = std::min<std::size_t>(block, n - lo);
          const float s = cz::wire::load<float>(base.data() + cz::wire::header_bytes + 8 + 4 * b);
          const float want = ref_scale(Rule::scale, x.data() + lo, len);
          if (std::isnan(want)) {
            bad_scale += !std::isnan(s);
          } else { // one rounding of the double sum: order may move the last bit
            bad_scale += !(std::fabs(s - want) <= std::max(want * 1.2e-7f, std::numeric_limits<float>::denorm_min()));
          }
          for (std::size_t i = lo; i < lo + len; ++i) {
            const std::uint32_t want_code =
                s > 0.0f ? rule.code(x[i] / s, Rule::stochastic ? noise.uniform(i) : 0.0f) : 0u;
            bad_code += code_at(base, codes, i, bits) != want_code;
          }
        }
        if (const std::size_t used = n * bits; used % 8 != 0)
          bad_code += (static_cast<unsigned>(base[codes + used / 8]) >> (used % 8)) != 0; // zero padding
        CHECK(bad_scale == 0);
        CHECK(bad_code == 0);
        // Decoding (table unpacking) gives fraction(code) * scale per element.
        std::vector<float> y(n, -7.0f);
        cz::blockwise<Rule, float> c{.block = block, .rule = rule};
        c.decode(base, std::span<float>(y));
        std::size_t bad_dec = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const float s = cz::wire::load<float>(base.data() + cz::wire::header_bytes + 8 + 4 * (i / block));
          const float want = rule.fraction(code_at(base, codes, i, bits)) * s;
          bad_dec += !(gd::float_bits(y[i]) == gd::float_bits(want) || (std::isnan(y[i]) && std::isnan(want)));
        }
        CHECK(bad_dec == 0);
      }
    }
  }
}

} // namespace

TEST_CASE("blockwise: int8 (8-bit codes, absmax)") { check_rule(cz::int8_rule{}); }
TEST_CASE("blockwise: int4 (4-bit codes, absmax)") { check_rule(cz::int4_rule{}); }
TEST_CASE("blockwise: sign (1-bit codes, mean |x|)") { check_rule(cz::sign_rule{}); }
TEST_CASE("blockwise: terngrad (2-bit codes, stochastic)") { check_rule(cz::terngrad_rule{}); }
TEST_CASE("blockwise: qsgd (4- and 8-bit codes, l2, stochastic)") {
  check_rule(cz::qsgd_rule{.levels = 7});
  check_rule(cz::qsgd_rule{.levels = 100});
}
