// gradsync: FNV-1a, the one hash of the library's agreement checks (call
// fingerprints, codec and bucket keys, GRADSYNC_ALGO values): ranks compare
// hashes instead of texts. Not for adversarial input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace gradsync::detail {

inline constexpr std::uint64_t fnv_basis = 0xcbf29ce484222325ull;

/// Folds `n` bytes at `p` into hash `h`.
inline std::uint64_t fnv1a(std::uint64_t h, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}
/// Folds the object representation of a trivially copyable value.
template <class V>
  requires std::is_trivially_copyable_v<V> && (!std::is_pointer_v<V>)
std::uint64_t fnv1a(std::uint64_t h, const V& v) {
  return fnv1a(h, &v, sizeof v);
}
/// Folds a string's characters.
inline std::uint64_t fnv1a(std::uint64_t h, std::string_view s) { return fnv1a(h, s.data(), s.size()); }

} // namespace gradsync::detail
