// Philox 4x32-10: published known-answer vectors and the stream layout.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <set>

#include <gradsync/compress/philox.hpp>

using gradsync::compress::philox4x32;
using gradsync::compress::philox_block;
using gradsync::compress::philox_stream;
using gradsync::compress::uniform01;

namespace {
struct kat {
  philox_block ctr;
  std::uint32_t k0, k1;
  philox_block expect;
};
} // namespace

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors") {
  // Random123 kat_vectors, lines "philox4x32 10 <ctr x4> <key x2> <expected x4>".
  const kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const kat& k : kats) {
    const philox_block r = philox4x32<10>(k.ctr, k.k0, k.k1);
    for (int j = 0; j < 4; ++j) CHECK(r.x[j] == k.expect.x[j]);
  }
}

TEST_CASE("philox_stream: counter {index/4, step, rank}, key seed") {
  const philox_stream s{0x0123456789abcdefull, 7, 3};
  for (std::uint64_t i : {0ull, 1ull, 5ull, 4095ull, (1ull << 33) + 2}) {
    const std::uint64_t b = i / 4;
    const philox_block c{{static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32), 7u,
                          3u}};
    const philox_block r = philox4x32<10>(c, 0x89abcdefu, 0x01234567u);
    CHECK(s.bits(i) == r.x[i % 4]);
  }
  // Every coordinate of the key changes the stream.
  const philox_stream others[] = {{1, 7, 3}, {0x0123456789abcdefull, 8, 3},
                                  {0x0123456789abcdefull, 7, 4}};
  for (const philox_stream& o : others) CHECK(o.bits(0) != s.bits(0));
}

TEST_CASE("uniform01 is exact, in [0,1), and never 1") {
  CHECK(uniform01(0) == 0.0f);
  CHECK(uniform01(0xffffffffu) == 1.0f - 0x1p-24f);
  CHECK(uniform01(0x80000000u) == 0.5f);
  CHECK(uniform01(0x000000ffu) == 0.0f); // the low 8 bits are dropped
}

TEST_CASE("philox uniforms: mean and variance within 5 sigma of U(0,1)") {
  const philox_stream s{42, 0, 0};
  const std::size_t n = 1 << 20;
  double sum = 0, sq = 0;
  std::set<std::uint32_t> distinct;
  bool in_range = true;
  for (std::size_t i = 0; i < n; ++i) {
    const double u = s.uniform(i);
    in_range = in_range && u >= 0.0 && u < 1.0;
    sum += u;
    sq += u * u;
    if (i < 4096) distinct.insert(s.bits(i));
  }
  CHECK(in_range);
  const double mean = sum / n, var = sq / n - mean * mean;
  CHECK(std::abs(mean - 0.5) < 5 * std::sqrt(1.0 / 12 / n));
  // Var of the sample variance of U(0,1) is (1/80 - 1/144)/n.
  CHECK(std::abs(var - 1.0 / 12) < 5 * std::sqrt((1.0 / 80 - 1.0 / 144) / n));
  CHECK(distinct.size() == 4096); // 32-bit collisions among 4096 draws: p ~ 0.002
}
