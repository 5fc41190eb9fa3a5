// tests/exec: seeded inputs and bitwise comparison shared by the host and
// CUDA executor tests (plain C++, no doctest, so nvcc and g++ both take it).
#pragma once

#include <gradsync/core/dtype.hpp>
#include <gradsync/core/half.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

namespace exec_test {

template <class T>
inline constexpr bool is_16bit_float =
    std::is_same_v<T, gradsync::half> || std::is_same_v<T, gradsync::bfloat16>;

/// n seeded values of T: floats in [-4, 4) with every 16th a signed zero
/// (sum's +0/-0 rule); integers in [-1000, 1000], so that a product of two
/// and the sums of a few never overflow int32.
template <class T> std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_integral_v<T>) {
      v[i] = static_cast<T>(static_cast<std::int64_t>(rng() % 2001) - 1000);
    } else {
      const double u = static_cast<double>(rng() >> 11) * 0x1p-53; // [0, 1)
      double d = 8.0 * u - 4.0;
      if (i % 16 == 5) d = (rng() & 1) ? 0.0 : -0.0;
      if constexpr (is_16bit_float<T>) v[i] = T(static_cast<float>(d));
      else v[i] = static_cast<T>(d);
    }
  }
  return v;
}

/// Index of the first element whose bits differ, or n when all agree.
template <class T> std::size_t first_difference(const T* x, const T* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (std::memcmp(x + i, y + i, sizeof(T)) != 0) return i;
  return n;
}

} // namespace exec_test
