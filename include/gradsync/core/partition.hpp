// gradsync: near-equal splitting of a range, used by every chunked schedule.
#pragma once

#include <cstddef>

namespace gradsync {

/// Splits `count` elements into `parts` contiguous blocks whose sizes differ
/// by at most one (the first `count % parts` blocks get the extra element).
struct partition {
  std::size_t count = 0;
  std::size_t parts = 1;

  /// First element of block `i` (i may equal `parts`, giving `count`).
  constexpr std::size_t offset(std::size_t i) const {
    const std::size_t q = count / parts, r = count % parts;
    return i * q + (i < r ? i : r);
  }
  /// Number of elements in block `i`.
  constexpr std::size_t size(std::size_t i) const {
    return count / parts + (i < count % parts ? 1 : 0);
  }
};

/// Mathematical modulo for ranks (result in [0, p)).
constexpr int mod(long long a, int p) {
  const long long m = a % p;
  return static_cast<int>(m < 0 ? m + p : m);
}

} // namespace gradsync
