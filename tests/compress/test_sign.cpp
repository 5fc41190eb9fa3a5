// Scaled sign codec: exact decoded values sign(x) * mean|x| per block, bit
// packing, the shared family checks.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <gradsync/compress/sign.hpp>

#include "quant_common.hpp"

namespace cz = gradsync::compress;
using namespace quant;

TEST_CASE("sign: every element decodes to sign(x) * mean |x| of its block") {
  for (std::uint32_t block : {1u, 7u, 128u, 1024u}) {
    const auto x = gradient_like(3001, block);
    const cz::sign<float> c{.block = block};
    cz::no_state st;
    const auto y = roundtrip(c, x, st);
    std::vector<double> l1((x.size() + block - 1) / block, 0.0);
    std::vector<std::size_t> len(l1.size(), 0);
    for (std::size_t i = 0; i < x.size(); ++i) {
      l1[i / block] += std::fabs(x[i]);
      ++len[i / block];
    }
    int bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float mean = static_cast<float>(l1[i / block] / static_cast<double>(len[i / block]));
      bad += y[i] != (x[i] < 0 ? -mean : mean); // zero counts as positive
    }
    CHECK_MESSAGE(bad == 0, "block ", block);
  }
}

TEST_CASE("sign: one bit per element, element 8k in bit 0, 1 = negative") {
  const std::vector<float> x = {1, -1, -2, 3, 0, -0.5f, 4, -4, -1, 2, -3};
  const cz::sign<float> c{.block = 1024};
  cz::no_state st;
  std::vector<std::byte> p;
  roundtrip(c, x, st, &p);
  REQUIRE(p.size() == cz::wire::header_bytes + 8 + 4 + 2);
  CHECK(cz::wire::load<float>(p.data() + scale_at(0)) == 21.5f / 11.0f);
  const std::size_t at = codes_at(x.size(), 1024);
  CHECK(p[at] == std::byte{0b10100110});
  CHECK(p[at + 1] == std::byte{0b00000101});
}

TEST_CASE("sign: family checks") { common_checks(cz::sign<float>{.block = 32}); }
TEST_CASE("sign: family checks, default block") { common_checks(cz::sign<float>{}); }
