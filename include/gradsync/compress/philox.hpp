// gradsync: Philox 4x32-10 counter-based random numbers (Salmon et al., SC'11),
// the noise source of every stochastic codec. A counter-based generator has no
// sequential state: element i's random bits are a pure function of
// (seed, step, rank, i), so a host loop and a CUDA kernel with any thread
// layout produce the same bits, and a decoder could regenerate them.
#pragma once

#include <cstdint>

#include "../core/config.hpp"

namespace gradsync::compress {

/// 128 bits: a Philox counter or one output block.
struct philox_block {
  std::uint32_t x[4];
};

namespace detail {
GRADSYNC_HD inline std::uint32_t mulhilo32(std::uint32_t a, std::uint32_t b, std::uint32_t& hi) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  return static_cast<std::uint32_t>(p);
}
} // namespace detail

/// Philox4x32 with `rounds` rounds (10 is the standard, crush-resistant choice)
/// applied to counter `c` under key (k0, k1). Matches Random123's philox4x32.
template <int rounds = 10>
GRADSYNC_HD inline philox_block philox4x32(philox_block c, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u; // round multipliers
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u; // Weyl key increments
  for (int r = 0; r < rounds; ++r) {
    if (r != 0) {
      k0 += w0;
      k1 += w1;
    }
    std::uint32_t hi0, hi1;
    const std::uint32_t lo0 = detail::mulhilo32(m0, c.x[0], hi0);
    const std::uint32_t lo1 = detail::mulhilo32(m1, c.x[2], hi1);
    c = philox_block{{hi1 ^ c.x[1] ^ k0, lo1, hi0 ^ c.x[3] ^ k1, lo0}};
  }
  return c;
}

/// Uniform float in [0, 1) from 32 random bits: the top 24 bits scaled by
/// 2^-24, so every value is exact and 1.0 is never produced.
GRADSYNC_HD inline float uniform01(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * 0x1p-24f;
}

/// The random stream of one (seed, step, rank). Element i takes lane i % 4 of
/// block i / 4, whose counter is {lo32(i/4), hi32(i/4), step, rank} under key
/// {lo32(seed), hi32(seed)}. Only the low 32 bits of the step are used, so
/// streams repeat after 2^32 steps of one seed.
struct philox_stream {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t rank = 0;

  /// The four 32-bit words for elements 4b .. 4b+3.
  GRADSYNC_HD philox_block block(std::uint64_t b) const {
    const philox_block c{{static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(b >> 32),
                          step, rank}};
    return philox4x32<10>(c, static_cast<std::uint32_t>(seed),
                          static_cast<std::uint32_t>(seed >> 32));
  }
  /// The 32 random bits of element i.
  GRADSYNC_HD std::uint32_t bits(std::uint64_t i) const { return block(i >> 2).x[i & 3]; }
  /// A uniform float in [0, 1) for element i.
  GRADSYNC_HD float uniform(std::uint64_t i) const { return uniform01(bits(i)); }
};

} // namespace gradsync::compress
