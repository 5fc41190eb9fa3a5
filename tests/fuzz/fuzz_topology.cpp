// libFuzzer target: topology construction and validation on arbitrary input.
// Byte 0 picks the way a topology is built: by name (gossip::named, the text
// a command line or configuration file gives), from edges (from_edges), from
// weighted entries (from_weights) or as a raw mixing matrix; byte 1 the rank
// count (-4..35, so bad counts come too). Building and validate() may only
// return or throw gradsync::error. Whatever validate() accepts is checked
// again here, independently, for exactly what it promised: entries in range,
// weights finite and positive, rows / columns summing to 1, symmetry,
// strong connectivity; and slem() of an accepted doubly stochastic, strongly
// connected graph is finite and in [0, 1].
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gradsync/gossip/topology.hpp>

namespace gg = gradsync::gossip;

namespace {

[[noreturn]] void fail() { std::abort(); }

// A weight from one byte: mostly ordinary fractions, sometimes the values a
// hostile file holds (0, negative, NaN, Inf, huge, subnormal).
double weight_of(std::uint8_t b) {
  switch (b) {
  case 0xF8: return 0.0;
  case 0xF9: return -0.5;
  case 0xFA: return std::numeric_limits<double>::quiet_NaN();
  case 0xFB: return std::numeric_limits<double>::infinity();
  case 0xFC: return 1e308;
  case 0xFD: return std::numeric_limits<double>::denorm_min();
  case 0xFE: return 1.0 / 3.0;
  case 0xFF: return 1.0;
  default: return static_cast<double>(b % 17) / 16.0;
  }
}

// W[i][j] of one step, searched in the row (the oracle does not use cols).
double at(const gg::mixing& m, int i, int j) {
  if (i == j) return m.self(i);
  for (const gg::edge& e : m.in(i))
    if (e.peer == j) return e.weight;
  return 0;
}

// What validate(g, p, need) promised, rechecked from the rows alone.
void recheck(const gg::graph& g, int p, gg::property need) {
  constexpr double tol = 1e-8; // validate's 1e-9 plus room for summing in another order
  if (g.size() != p || g.period() == 0) fail();
  const auto n = static_cast<std::size_t>(p);
  std::vector<std::vector<char>> link(n, std::vector<char>(n, 0)); // link[i][j]: i hears j in some step
  for (std::size_t t = 0; t < g.period(); ++t) {
    const gg::mixing& m = g.at(t);
    if (m.size() != p) fail();
    std::vector<double> col(n, 0.0);
    for (int i = 0; i < p; ++i) {
      const double s = m.self(i);
      if (!std::isfinite(s) || s < 0) fail();
      double row = s;
      col[static_cast<std::size_t>(i)] += s;
      for (const gg::edge& e : m.in(i)) {
        if (e.peer < 0 || e.peer >= p || e.peer == i) fail();
        if (!std::isfinite(e.weight) || !(e.weight > 0)) fail();
        row += e.weight;
        col[static_cast<std::size_t>(e.peer)] += e.weight;
        link[static_cast<std::size_t>(i)][static_cast<std::size_t>(e.peer)] = 1;
        if (gg::has(need, gg::property::symmetric) && std::abs(at(m, e.peer, i) - e.weight) > tol) fail();
      }
      if (gg::has(need, gg::property::row_stochastic) && std::abs(row - 1) > tol) fail();
    }
    if (gg::has(need, gg::property::column_stochastic))
      for (double c : col)
        if (std::abs(c - 1) > tol) fail();
  }
  if (gg::has(need, gg::property::strongly_connected) && p > 1) {
    // Floyd-Warshall closure: every rank reaches every other.
    for (std::size_t k = 0; k < n; ++k)
      for (std::size_t i = 0; i < n; ++i)
        if (link[i][k])
          for (std::size_t j = 0; j < n; ++j)
            if (link[k][j]) link[i][j] = 1;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j)
        if (i != j && !link[i][j]) fail();
  }
}

gg::graph build(int mode, int p, const std::uint8_t* d, std::size_t size) {
  switch (mode) {
  case 0: return gg::named(std::string(reinterpret_cast<const char*>(d), size), p);
  case 1: { // from_edges: byte 0 flags, then (i, j) pairs as signed bytes
    if (size == 0) return gg::from_edges(p, {}, true);
    const bool undirected = d[0] & 1;
    const auto w = static_cast<gg::weighting>((d[0] >> 1) % 3);
    std::vector<std::pair<int, int>> edges;
    for (std::size_t k = 1; k + 1 < size; k += 2)
      edges.emplace_back(static_cast<std::int8_t>(d[k]), static_cast<std::int8_t>(d[k + 1]));
    return gg::from_edges(p, edges, undirected, w);
  }
  case 2: { // from_weights: (row, col, weight) triples
    std::vector<gg::entry> entries;
    for (std::size_t k = 0; k + 2 < size; k += 3)
      entries.push_back({static_cast<std::int8_t>(d[k]), static_cast<std::int8_t>(d[k + 1]), weight_of(d[k + 2])});
    return gg::from_weights(p, entries);
  }
  default: { // a raw mixing matrix, as a user may build one: byte 0 the self-weight count
    const std::size_t nself = size == 0 ? 0 : d[0] % 40;
    std::vector<double> self;
    std::size_t k = 1;
    for (; self.size() < nself && k < size; ++k) self.push_back(weight_of(d[k]));
    std::vector<std::vector<gg::edge>> rows(p > 0 ? static_cast<std::size_t>(p) : 0);
    for (; k + 2 < size && !rows.empty(); k += 3)
      rows[d[k] % rows.size()].push_back({static_cast<std::int8_t>(d[k + 1]), weight_of(d[k + 2])});
    return gg::graph("raw", {gg::mixing(std::move(self), std::move(rows))});
  }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2 || size > 512) return 0;
  const int mode = data[0] % 4;
  const int p = static_cast<int>(data[1] % 40) - 4;
  using gg::property;
  const property needs[] = {property::row_stochastic, property::column_stochastic,
                            property::doubly_stochastic | property::symmetric,
                            property::row_stochastic | property::strongly_connected,
                            property::doubly_stochastic | property::strongly_connected | property::static_graph};
  try {
    const gg::graph g = build(mode, p, data + 2, size - 2);
    for (const property need : needs) {
      try {
        gg::validate(g, p, need, "fuzz_topology", 0);
      } catch (const gradsync::error&) {
        continue;
      }
      recheck(g, p, need);
      if (gg::has(need, property::doubly_stochastic | property::strongly_connected)) {
        const double s = gg::slem(g, 200);
        if (!std::isfinite(s) || s < 0 || s > 1 + 1e-6) fail();
      }
    }
  } catch (const gradsync::error&) {
  } catch (...) {
    fail();
  }
  return 0;
}
