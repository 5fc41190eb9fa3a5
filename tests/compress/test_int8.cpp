// int8 blockwise codec: error bound, reference codes, element types, the
// shared family checks (edges, non-finite policy, validation, corruption).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <gradsync/compress/int8.hpp>

#include "quant_common.hpp"

namespace cz = gradsync::compress;
using namespace quant;

TEST_CASE("int8: |x - decoded| <= block absmax / 254 (+ 2 ulp of absmax)") {
  for (std::uint32_t block : {1u, 3u, 64u, 256u, 1000u}) {
    const auto x = gradient_like(4099, block);
    const cz::int8<float> c{.block = block};
    cz::no_state st;
    CHECK_MESSAGE(absmax_bound_misses(x, roundtrip(c, x, st), block, 254.0f) == 0, "block ", block);
  }
}

TEST_CASE("int8: codes match a scalar reference; the block max is exact") {
  const auto x = gradient_like(1000, 9);
  const std::uint32_t block = 100;
  const cz::int8<float> c{.block = block};
  cz::no_state st;
  std::vector<std::byte> p;
  const auto y = roundtrip(c, x, st, &p);
  const auto m = block_absmax(x, block);
  for (std::size_t b = 0; b < m.size(); ++b) CHECK(cz::wire::load<float>(p.data() + scale_at(b)) == m[b]);
  int bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float a = m[i / block];
    const long q = std::lrint(static_cast<double>(x[i]) / a * 127.0); // reference in double
    const auto code = static_cast<std::int8_t>(p[codes_at(x.size(), block) + i]);
    // float and double quotients may round a near-tie differently: allow one step there.
    const double frac = std::fabs(static_cast<double>(x[i]) / a * 127.0 - std::trunc(static_cast<double>(x[i]) / a * 127.0));
    if (code != q && std::fabs(frac - 0.5) > 1e-4) ++bad;
    if (y[i] != static_cast<float>(code) / 127.0f * a) ++bad;
    if (std::fabs(x[i]) == a && a > 0) bad += std::abs(code) != 127 || y[i] != x[i];
  }
  CHECK(bad == 0);
}

TEST_CASE("int8: half, bfloat16 and double inputs") {
  const auto xf = gradient_like(777, 4);
  auto check_type = [&](auto tag) {
    using T = decltype(tag);
    const auto x = as<T>(xf);
    const cz::int8<T> c{.block = 64};
    cz::no_state st;
    CHECK(absmax_bound_misses(x, roundtrip(c, x, st), 64, 254.0f) == 0);
  };
  check_type(gradsync::half{});
  check_type(gradsync::bfloat16{});
  check_type(double{});
}

TEST_CASE("int8: code -128 is rejected") {
  const auto x = gradient_like(50, 1);
  const cz::int8<float> c{.block = 16};
  cz::no_state st;
  const auto p = cz::encode_to_vector(c, std::span<const float>(x), st);
  corrupt::expect_rejected(c, patched(p, codes_at(50, 16) + 17, std::byte{0x80}), 50,
                           "element 17 has invalid code 128");
}

TEST_CASE("int8: family checks") { common_checks(cz::int8<float>{.block = 64}); }
TEST_CASE("int8: family checks, default block") { common_checks(cz::int8<float>{}); }
