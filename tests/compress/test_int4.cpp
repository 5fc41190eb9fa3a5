// int4 blockwise codec: error bound, nibble packing (odd counts), invalid
// code 8, element types, the shared family checks.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <gradsync/compress/int4.hpp>

#include "quant_common.hpp"

namespace cz = gradsync::compress;
using namespace quant;

TEST_CASE("int4: |x - decoded| <= block absmax / 14 (+ 2 ulp of absmax)") {
  for (std::uint32_t block : {1u, 5u, 64u, 333u}) {
    for (std::size_t n : {1u, 2u, 3u, 1001u, 4096u}) {
      const auto x = gradient_like(n, block + n);
      const cz::int4<float> c{.block = block};
      cz::no_state st;
      CHECK_MESSAGE(absmax_bound_misses(x, roundtrip(c, x, st), block, 14.0f) == 0, "block ",
                    block, " n ", n);
    }
  }
}

TEST_CASE("int4: two codes per byte, element 2k in the low nibble, zero padding") {
  // One block, absmax 7: codes are round(x) exactly.
  const std::vector<float> x = {7.0f, -1.0f, 2.0f, -7.0f, 0.4f, 3.5f, -2.5f};
  const cz::int4<float> c{.block = 64};
  cz::no_state st;
  std::vector<std::byte> p;
  const auto y = roundtrip(c, x, st, &p);
  REQUIRE(p.size() == cz::wire::header_bytes + 8 + 4 + 4);
  const std::size_t at = codes_at(x.size(), 64);
  CHECK(p[at + 0] == std::byte{0xf7});     // 7, -1 (0xf)
  CHECK(p[at + 1] == std::byte{0x92});     // 2, -7 (0x9)
  CHECK(p[at + 2] == std::byte{0x40});     // 0 (0.4), 4 (3.5 ties to even)
  CHECK(p[at + 3] == std::byte{0x0e});     // -2 (-2.5 ties to even, 0xe), padding 0
  const std::vector<float> expect = {7, -1, 2, -7, 0, 4, -2};
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(y[i] == expect[i]);
  corrupt::expect_rejected(c, patched(p, at + 1, std::byte{0x82}), x.size(), "element 3 has invalid code 8");
}

TEST_CASE("int4: half and bfloat16 inputs") {
  const auto xf = gradient_like(513, 8);
  auto check_type = [&](auto tag) {
    using T = decltype(tag);
    const auto x = as<T>(xf);
    const cz::int4<T> c{};
    cz::no_state st;
    CHECK(absmax_bound_misses(x, roundtrip(c, x, st), c.block, 14.0f) == 0);
  };
  check_type(gradsync::half{});
  check_type(gradsync::bfloat16{});
}

TEST_CASE("int4: family checks") { common_checks(cz::int4<float>{.block = 16}); }
TEST_CASE("int4: family checks, default block") { common_checks(cz::int4<float>{}); }
