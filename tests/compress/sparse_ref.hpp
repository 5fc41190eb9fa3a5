// Helpers shared by the sparsifier tests (topk, approx_topk, threshold): an
// independent reference ranking built on a full sort, readers of the sparse
// body, and re-sealed payload surgery for targeted decoder rejections.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include <gradsync/compress/codec.hpp>

namespace sparse_ref {

namespace cz = gradsync::compress;

/// Sort rank of a magnitude under the documented rule, computed from the
/// value (not its bits): NaN > +Inf > finite by |x|.
inline bool ranks_before(float a, std::size_t ia, float b, std::size_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return na;
  if (!na) {
    const float ma = std::fabs(a), mb = std::fabs(b);
    if (ma != mb) return ma > mb;
  }
  return ia < ib;
}

/// The k top-ranked indices of `x` by a full sort, returned in increasing order.
template <class T> std::vector<std::uint32_t> top_indices(const std::vector<T>& x, std::size_t k) {
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return ranks_before(static_cast<float>(x[a]), a, static_cast<float>(x[b]), b);
  });
  std::vector<std::uint32_t> top;
  for (std::size_t j = 0; j < std::min(k, x.size()); ++j)
    top.push_back(static_cast<std::uint32_t>(order[j]));
  std::sort(top.begin(), top.end());
  return top;
}

/// Bitwise equality (NaN equals the same NaN).
template <class T> bool same_bits(T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

/// The entries of a sparse payload whose parameter block is `param_bytes`
/// long (body right after it).
template <class T> struct entries {
  std::vector<std::uint32_t> index;
  std::vector<T> value;
};
template <class T>
entries<T> read(std::span<const std::byte> p, std::size_t param_bytes) {
  entries<T> e;
  const std::size_t body = p.size() - cz::wire::header_bytes - param_bytes;
  const std::size_t k = body / (4 + sizeof(T));
  const std::byte* b = p.data() + cz::wire::header_bytes + param_bytes;
  for (std::size_t j = 0; j < k; ++j) {
    e.index.push_back(cz::wire::load<std::uint32_t>(b + 4 * j));
    e.value.push_back(cz::wire::load<T>(b + 4 * k + sizeof(T) * j));
  }
  return e;
}

/// Checks a decoded tensor: x at the (increasing) indices, zero elsewhere.
template <class T>
void check_decoded(const std::vector<T>& x, const std::vector<std::uint32_t>& index,
                   const std::vector<T>& dec) {
  REQUIRE(dec.size() == x.size());
  std::size_t j = 0, bad = 0, first_bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const bool sent = j < index.size() && index[j] == i;
    const bool ok = sent ? same_bits(dec[i], x[i]) : static_cast<float>(dec[i]) == 0.0f;
    if (!ok && bad++ == 0) first_bad = i;
    j += sent ? 1 : 0;
  }
  CHECK_MESSAGE(bad == 0, bad, " wrong decoded elements, the first at index ", first_bad);
  CHECK(j == index.size());
}

/// Copy of `p` with the u32 index of entry j replaced, checksum re-sealed.
inline std::vector<std::byte> with_index(std::span<const std::byte> p, std::size_t param_bytes,
                                         std::size_t j, std::uint32_t index) {
  std::vector<std::byte> q(p.begin(), p.end());
  cz::wire::store<std::uint32_t>(q.data() + cz::wire::header_bytes + param_bytes + 4 * j, index);
  cz::wire::seal(q);
  return q;
}

/// Copy of `p` with a u64 parameter at `offset` replaced, checksum re-sealed.
inline std::vector<std::byte> with_param(std::span<const std::byte> p, std::size_t offset,
                                         std::uint64_t v) {
  std::vector<std::byte> q(p.begin(), p.end());
  cz::wire::store<std::uint64_t>(q.data() + cz::wire::header_bytes + offset, v);
  cz::wire::seal(q);
  return q;
}

/// Random values with many exact ties: small integers times a power of two,
/// with a few wider values mixed in.
template <class T> std::vector<T> tied_values(std::mt19937_64& rng, std::size_t n) {
  std::vector<T> x(n);
  std::uniform_int_distribution<int> small(-4, 4), kind(0, 9);
  std::normal_distribution<float> wide(0.0f, 3.0f);
  for (auto& v : x) v = T(kind(rng) == 0 ? wide(rng) : 0.25f * static_cast<float>(small(rng)));
  return x;
}

} // namespace sparse_ref
