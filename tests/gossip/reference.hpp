// Serial references for the gossip tests: the dense mixing matrix of a
// topology, W^k x computed serially in long double, and the documented
// combine order replayed on one thread (for bit-exact comparisons).
#pragma once

#include <doctest/doctest.h>

#include <gradsync/core/reduce.hpp>
#include <gradsync/gossip/topology.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace gradsync::test::gossip_ref {

using dense = std::vector<std::vector<long double>>;

/// The dense matrix of step t of g.
inline dense matrix_of(const gossip::graph& g, std::uint64_t t) {
  const auto p = static_cast<std::size_t>(g.size());
  dense w(p, std::vector<long double>(p, 0));
  const gossip::mixing& m = g.at(t);
  for (int i = 0; i < g.size(); ++i) {
    w[static_cast<std::size_t>(i)][static_cast<std::size_t>(i)] = m.self(i);
    for (const auto& e : m.in(i)) w[static_cast<std::size_t>(i)][static_cast<std::size_t>(e.peer)] += e.weight;
  }
  return w;
}

/// x := W x for ranks' vectors x[rank][element].
inline void apply(const dense& w, std::vector<std::vector<long double>>& x) {
  const std::size_t p = x.size(), n = p ? x[0].size() : 0;
  std::vector<std::vector<long double>> y(p, std::vector<long double>(n, 0));
  for (std::size_t i = 0; i < p; ++i)
    for (std::size_t j = 0; j < p; ++j)
      if (w[i][j] != 0)
        for (std::size_t e = 0; e < n; ++e) y[i][e] += w[i][j] * x[j][e];
  x = std::move(y);
}

/// One round of the documented combine on every rank, serially: x_i =
/// axpby1(w_1, x_j1, W_ii, x_i), then axpby1(w_k, x_jk, 1, x_i) in row order.
template <class T> void replay(const gossip::mixing& m, std::vector<std::vector<T>>& x) {
  using W = weight_t<T>;
  const auto old = x;
  for (int i = 0; i < m.size(); ++i) {
    auto& xi = x[static_cast<std::size_t>(i)];
    const auto in = m.in(i);
    if (in.empty()) {
      if (m.self(i) != 1.0)
        for (auto& v : xi) v = axpby1<T>(W(0), v, static_cast<W>(m.self(i)), v);
      continue;
    }
    for (std::size_t k = 0; k < in.size(); ++k) {
      const auto& xj = old[static_cast<std::size_t>(in[k].peer)];
      const W a = static_cast<W>(in[k].weight), b = static_cast<W>(k == 0 ? m.self(i) : 1.0);
      for (std::size_t e = 0; e < xi.size(); ++e) xi[e] = axpby1<T>(a, xj[e], b, xi[e]);
    }
  }
}

/// A deterministic input: small integers in [-range, range], varied by rank and element.
inline long long input(int rank, std::size_t i, int range = 7) {
  std::uint64_t z = (static_cast<std::uint64_t>(rank) + 1) * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull;
  z ^= z >> 31;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 29;
  return static_cast<long long>(z % static_cast<std::uint64_t>(2 * range + 1)) - range;
}

template <class T> T to_elem(long double v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}
template <class T> long double to_ld(T v) { return static_cast<long double>(static_cast<double>(widen(v))); }

/// Euclidean distance of the ranks' vectors from their average, and that average.
inline long double consensus_distance(const std::vector<std::vector<long double>>& x, std::vector<long double>* mean = nullptr) {
  const std::size_t p = x.size(), n = x[0].size();
  std::vector<long double> m(n, 0);
  for (const auto& v : x)
    for (std::size_t e = 0; e < n; ++e) m[e] += v[e] / static_cast<long double>(p);
  long double d = 0;
  for (const auto& v : x)
    for (std::size_t e = 0; e < n; ++e) d += (v[e] - m[e]) * (v[e] - m[e]);
  if (mean) *mean = m;
  return std::sqrt(d);
}

} // namespace gradsync::test::gossip_ref
