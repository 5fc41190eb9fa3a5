// gradsync: gossip topologies. A topology is a sequence of mixing matrices W
// (one per step, cycling with the topology's period; static graphs have
// period 1). Row i of W says how rank i combines: x_i <- sum_j W[i][j] x_j,
// W[i][i] being its self weight and every other nonzero W[i][j] an
// in-neighbour j that sends to i. Every rank holds the whole topology, so
// every rank knows whom to send to (the ranks whose rows name it) and every
// check below is deterministic from arguments all ranks have: a bad graph is
// rejected on every rank before any message moves.
//
// Built-in graphs (p ranks) and their weights:
//   ring(p)              i <-> i +- 1                      uniform 1/3: doubly stochastic, symmetric
//   directed_ring(p)     i <- i - 1                        uniform 1/2
//   torus(rows, cols)    i <-> 4 grid neighbours, wrapping uniform 1/(d+1)
//   hypercube(p)         i <-> i xor 2^k (p a power of two) uniform 1/(log2 p + 1)
//   exponential(p)       i <- i - 2^k (2^k < p), directed  uniform 1/(d+1): doubly stochastic (circulant)
//   one_peer_exponential(p)  step t: i <- i - 2^(t mod L), L = ceil(log2 p); 1/2 each, period L
//   full(p)              everyone                          1/p
//   star(p)              0 <-> everyone                    uniform (row-stochastic only) or MH
//   from_edges / from_weights: a user graph, unweighted (weights by rule) or weighted.
// Weight rules for undirected graphs: uniform (1/(degree+1), row-stochastic;
// doubly stochastic on regular graphs) or Metropolis-Hastings
// (W[i][j] = 1/(1 + max(d_i, d_j)), W[i][i] the rest: doubly stochastic and
// symmetric on any undirected graph). Directed user graphs get uniform rows
// (row-stochastic, for neighbor_allreduce) or uniform columns
// (column-stochastic, 1/(out-degree+1), for push-sum).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/hash.hpp"

namespace gradsync::gossip {

/// One nonzero of a mixing matrix outside the diagonal: `peer` and its weight.
struct edge {
  int peer = 0;
  double weight = 0;
};

/// One mixing matrix, stored by rows (who rank i hears and how it weighs
/// them) and by columns (whom rank j sends to, with the receiver's weight).
class mixing {
public:
  mixing() = default;
  /// A matrix over p ranks from its self weights and off-diagonal rows;
  /// rows[i] lists the in-neighbours of i (validated by validate()); throws
  /// gradsync::error unless there is one self weight per row.
  mixing(std::vector<double> self, std::vector<std::vector<edge>> rows)
      : self_(std::move(self)), rows_(std::move(rows)), cols_(rows_.size()) {
    GRADSYNC_REQUIRE(self_.size() == rows_.size(), "gossip::mixing", -1,
                     std::to_string(self_.size()) + " self weights for " + std::to_string(rows_.size()) +
                         " rows (one per rank)");
    for (std::size_t i = 0; i < rows_.size(); ++i)
      for (const edge& e : rows_[i])
        if (e.peer >= 0 && static_cast<std::size_t>(e.peer) < cols_.size())
          cols_[static_cast<std::size_t>(e.peer)].push_back({static_cast<int>(i), e.weight});
    hash_ = gradsync::detail::fnv1a(gradsync::detail::fnv_basis, rows_.size());
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      hash_ = gradsync::detail::fnv1a(hash_, self_[i]);
      for (const edge& e : rows_[i]) hash_ = gradsync::detail::fnv1a(gradsync::detail::fnv1a(hash_, e.peer), e.weight);
    }
  }
  int size() const noexcept { return static_cast<int>(rows_.size()); }
  /// W[i][i].
  double self(int i) const { return self_.at(static_cast<std::size_t>(i)); }
  /// The in-neighbours of i with W[i][j], in the order i combines them.
  std::span<const edge> in(int i) const { return rows_.at(static_cast<std::size_t>(i)); }
  /// The out-neighbours of j with W[i][j] (the receiver's weight), ascending i.
  std::span<const edge> out(int j) const { return cols_.at(static_cast<std::size_t>(j)); }
  /// y = W x (serially, in double; for checks, SLEM and tests).
  void apply(std::span<const double> x, std::span<double> y) const {
    for (int i = 0; i < size(); ++i) {
      double s = self(i) * x[static_cast<std::size_t>(i)];
      for (const edge& e : in(i)) s += e.weight * x[static_cast<std::size_t>(e.peer)];
      y[static_cast<std::size_t>(i)] = s;
    }
  }
  /// y = W^T x.
  void apply_transposed(std::span<const double> x, std::span<double> y) const {
    for (int j = 0; j < size(); ++j) {
      double s = self(j) * x[static_cast<std::size_t>(j)];
      for (const edge& e : out(j)) s += e.weight * x[static_cast<std::size_t>(e.peer)];
      y[static_cast<std::size_t>(j)] = s;
    }
  }

  /// FNV-1a of the whole matrix (ranks, self weights, rows in order): equal
  /// matrices, equal hashes; what gossip calls' fingerprints compare.
  std::uint64_t hash() const noexcept { return hash_; }

private:
  std::vector<double> self_;
  std::vector<std::vector<edge>> rows_, cols_;
  std::uint64_t hash_ = 0;
};

/// How weights are derived from an unweighted graph.
enum class weighting {
  uniform,            ///< row i: 1/(in-degree + 1) for itself and each in-neighbour
  metropolis_hastings, ///< undirected graphs: 1/(1 + max(d_i, d_j)); symmetric, doubly stochastic
  column_uniform,     ///< column j: 1/(out-degree + 1) (push-sum on directed graphs)
};

/// What an operation needs of a topology (combine with |). Every combine
/// (x_i <- sum_j W[i][j] x_j) needs rows summing to 1; push-sum needs
/// columns summing to 1 instead (its carried weight corrects the rows).
enum class property : unsigned {
  row_stochastic = 1,      ///< every row sums to 1 (neighbor_allreduce, hierarchical, CHOCO)
  column_stochastic = 2,   ///< every column sums to 1 (push-sum; preserves the sum)
  doubly_stochastic = 3,   ///< both
  symmetric = 4,           ///< W[i][j] == W[j][i] (CHOCO's neighbour copies)
  strongly_connected = 8,  ///< the union over one period reaches every rank from every rank
  static_graph = 16,       ///< period 1
};
constexpr property operator|(property a, property b) {
  return static_cast<property>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
constexpr bool has(property set, property p) {
  return (static_cast<unsigned>(set) & static_cast<unsigned>(p)) == static_cast<unsigned>(p);
}

/// Tolerance of the stochasticity and symmetry checks (weights given as
/// decimal fractions, e.g. 1/3 three times, sum to 1 within rounding).
inline constexpr double weight_tolerance = 1e-9;

/// A gossip topology: a name, and the mixing matrices of one period.
class graph {
public:
  graph() = default;
  graph(std::string name, std::vector<mixing> steps) : name_(std::move(name)), steps_(std::move(steps)) {}

  const std::string& name() const noexcept { return name_; }
  /// Ranks the topology spans (0 for an empty graph).
  int size() const noexcept { return steps_.empty() ? 0 : steps_.front().size(); }
  /// Steps before the matrices repeat (1: static).
  std::size_t period() const noexcept { return steps_.size(); }
  bool dynamic() const noexcept { return steps_.size() > 1; }
  /// The mixing matrix of step `step`.
  const mixing& at(std::uint64_t step) const { return steps_.at(static_cast<std::size_t>(step % steps_.size())); }

private:
  std::string name_;
  std::vector<mixing> steps_;
};

namespace detail {

inline std::string row_name(const std::string& g, std::size_t step, std::size_t period, int i) {
  std::string s = "topology '" + g + "'";
  if (period > 1) s += " step " + std::to_string(step);
  return s + " row " + std::to_string(i);
}

// Undirected adjacency -> weights by rule (neighbour lists sorted, unique).
inline graph weigh(std::string name, const std::vector<std::vector<int>>& adj, weighting w) {
  const auto p = adj.size();
  std::vector<double> self(p);
  std::vector<std::vector<edge>> rows(p);
  for (std::size_t i = 0; i < p; ++i) {
    const double di = static_cast<double>(adj[i].size());
    double sum = 0;
    for (int j : adj[i]) {
      double v = 0;
      switch (w) {
      case weighting::uniform: v = 1 / (di + 1); break;
      case weighting::metropolis_hastings:
        v = 1 / (1 + std::max(di, static_cast<double>(adj[static_cast<std::size_t>(j)].size())));
        break;
      case weighting::column_uniform: v = 1 / (static_cast<double>(adj[static_cast<std::size_t>(j)].size()) + 1); break;
      }
      rows[i].push_back({j, v});
      sum += v;
    }
    // Uniform rows are 1/(d+1) exactly; the rest is what the row leaves.
    self[i] = w == weighting::uniform ? 1 / (di + 1) : 1 - sum;
  }
  return graph(std::move(name), {mixing(std::move(self), std::move(rows))});
}

// Directed in-lists -> weights by rule (row or column uniform).
inline mixing weigh_directed(const std::vector<std::vector<int>>& in, weighting w) {
  const auto p = in.size();
  std::vector<std::size_t> outdeg(p, 0);
  for (const auto& r : in)
    for (int j : r) ++outdeg[static_cast<std::size_t>(j)];
  std::vector<double> self(p);
  std::vector<std::vector<edge>> rows(p);
  for (std::size_t i = 0; i < p; ++i) {
    const double row = 1 / (static_cast<double>(in[i].size()) + 1);
    for (int j : in[i])
      rows[i].push_back({j, w == weighting::column_uniform ? 1 / (static_cast<double>(outdeg[static_cast<std::size_t>(j)]) + 1) : row});
    self[i] = w == weighting::column_uniform ? 1 / (static_cast<double>(outdeg[i]) + 1) : row;
  }
  return mixing(std::move(self), std::move(rows));
}

inline void add_undirected(std::vector<std::vector<int>>& adj, int i, int j) {
  if (i == j) return;
  auto& a = adj[static_cast<std::size_t>(i)];
  if (std::find(a.begin(), a.end(), j) == a.end()) a.push_back(j);
  auto& b = adj[static_cast<std::size_t>(j)];
  if (std::find(b.begin(), b.end(), i) == b.end()) b.push_back(i);
}

inline void sort_lists(std::vector<std::vector<int>>& adj) {
  for (auto& a : adj) std::sort(a.begin(), a.end());
}

inline void require_ranks(int p, const char* what) {
  GRADSYNC_REQUIRE(p >= 1, what, -1, "needs at least 1 rank, got " + std::to_string(p));
}

inline bool power_of_two(int p) { return p > 0 && (p & (p - 1)) == 0; }

// ceil(log2 p) for p >= 1.
inline int log2_ceil(int p) {
  int l = 0;
  while ((1LL << l) < p) ++l;
  return l;
}

} // namespace detail

/// The undirected ring i <-> i +- 1 (p = 2: one neighbour; p = 1: none).
inline graph ring(int p, weighting w = weighting::uniform) {
  detail::require_ranks(p, "gossip::ring");
  std::vector<std::vector<int>> adj(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) detail::add_undirected(adj, i, (i + 1) % p);
  detail::sort_lists(adj);
  return detail::weigh("ring", adj, w);
}

/// The directed ring: i hears i - 1 only (column- and row-stochastic at 1/2).
inline graph directed_ring(int p) {
  detail::require_ranks(p, "gossip::directed_ring");
  std::vector<std::vector<int>> in(static_cast<std::size_t>(p));
  for (int i = 0; i < p && p > 1; ++i) in[static_cast<std::size_t>(i)] = {(i + p - 1) % p};
  return graph("directed_ring", {detail::weigh_directed(in, weighting::uniform)});
}

/// The 2-D torus of rows x cols ranks (rank = r * cols + c), each rank linked
/// to its four grid neighbours with wrap-around (fewer where a side is <= 2).
inline graph torus(int rows, int cols, weighting w = weighting::uniform) {
  GRADSYNC_REQUIRE(rows >= 1 && cols >= 1, "gossip::torus", -1,
                   "needs rows, cols >= 1, got " + std::to_string(rows) + " x " + std::to_string(cols));
  const int p = rows * cols;
  std::vector<std::vector<int>> adj(static_cast<std::size_t>(p));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const int i = r * cols + c;
      detail::add_undirected(adj, i, ((r + 1) % rows) * cols + c);
      detail::add_undirected(adj, i, r * cols + (c + 1) % cols);
    }
  detail::sort_lists(adj);
  return detail::weigh("torus", adj, w);
}

/// The hypercube over p = 2^d ranks: i <-> i xor 2^k.
inline graph hypercube(int p, weighting w = weighting::uniform) {
  GRADSYNC_REQUIRE(detail::power_of_two(p), "gossip::hypercube", -1,
                   "needs a power-of-two rank count, got " + std::to_string(p));
  std::vector<std::vector<int>> adj(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i)
    for (int k = 1; k < p; k <<= 1) detail::add_undirected(adj, i, i ^ k);
  detail::sort_lists(adj);
  return detail::weigh("hypercube", adj, w);
}

/// The static exponential graph: i hears i - 2^k for every 2^k < p (a
/// circulant, so uniform weights are doubly stochastic; not symmetric).
inline graph exponential(int p) {
  detail::require_ranks(p, "gossip::exponential");
  std::vector<std::vector<int>> in(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i)
    for (int k = 1; k < p; k <<= 1) in[static_cast<std::size_t>(i)].push_back(((i - k) % p + p) % p);
  return graph("exponential", {detail::weigh_directed(in, weighting::uniform)});
}

/// The one-peer dynamic exponential graph: at step t rank i hears only
/// i - 2^(t mod L), L = ceil(log2 p), each weighted 1/2 (doubly stochastic).
/// For p a power of two, L consecutive steps from a step that is a multiple
/// of L give every rank the exact average.
inline graph one_peer_exponential(int p) {
  detail::require_ranks(p, "gossip::one_peer_exponential");
  const int l = detail::log2_ceil(p);
  std::vector<mixing> steps;
  for (int t = 0; t < std::max(l, 1); ++t) {
    std::vector<std::vector<int>> in(static_cast<std::size_t>(p));
    if (p > 1)
      for (int i = 0; i < p; ++i) in[static_cast<std::size_t>(i)] = {((i - (1 << t)) % p + p) % p};
    steps.push_back(detail::weigh_directed(in, weighting::uniform));
  }
  return graph("one_peer_exponential", std::move(steps));
}

/// Every rank hears every other, all weights 1/p (the exact average in one step).
inline graph full(int p) {
  detail::require_ranks(p, "gossip::full");
  std::vector<std::vector<int>> adj(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i)
    for (int j = 0; j < p; ++j)
      if (i != j) adj[static_cast<std::size_t>(i)].push_back(j);
  return detail::weigh("full", adj, weighting::uniform);
}

/// The star: rank 0 linked to every other rank. Uniform weights are only
/// row-stochastic (the centre weighs 1/p, a leaf 1/2); Metropolis-Hastings
/// weights are doubly stochastic.
inline graph star(int p, weighting w = weighting::metropolis_hastings) {
  detail::require_ranks(p, "gossip::star");
  std::vector<std::vector<int>> adj(static_cast<std::size_t>(p));
  for (int i = 1; i < p; ++i) detail::add_undirected(adj, 0, i);
  detail::sort_lists(adj);
  return detail::weigh("star", adj, w);
}

/// An unweighted user graph on p ranks: each pair (i, j) is an edge j -> i
/// (i hears j), or i <-> j when `undirected`; weights by `w`
/// (metropolis_hastings needs undirected). Bad ranks and self loops are
/// rejected, duplicates merged.
inline graph from_edges(int p, const std::vector<std::pair<int, int>>& edges, bool undirected,
                        weighting w = weighting::uniform) {
  const char* op = "gossip::from_edges";
  detail::require_ranks(p, op);
  GRADSYNC_REQUIRE(undirected || w != weighting::metropolis_hastings, op, -1,
                   "Metropolis-Hastings weights need an undirected graph");
  std::vector<std::vector<int>> adj(static_cast<std::size_t>(p));
  for (const auto& [i, j] : edges) {
    GRADSYNC_REQUIRE(i >= 0 && i < p && j >= 0 && j < p, op, -1,
                     "edge (" + std::to_string(i) + ", " + std::to_string(j) + ") names a rank outside [0, " +
                         std::to_string(p) + ")");
    GRADSYNC_REQUIRE(i != j, op, -1, "edge (" + std::to_string(i) + ", " + std::to_string(i) + ") is a self loop (self weights are implied)");
    if (undirected) {
      detail::add_undirected(adj, i, j);
    } else {
      auto& a = adj[static_cast<std::size_t>(i)];
      if (std::find(a.begin(), a.end(), j) == a.end()) a.push_back(j);
    }
  }
  detail::sort_lists(adj);
  if (undirected) return detail::weigh("user", adj, w);
  return graph("user", {detail::weigh_directed(adj, w)});
}

/// One entry W[row][col] = weight of a user-weighted graph.
struct entry {
  int row = 0, col = 0;
  double weight = 0;
};

/// A user-weighted graph on p ranks from its nonzero entries (diagonal
/// included; a missing diagonal is 0). The entries are only stored here:
/// validate (which every operation runs) rejects ranks out
/// of range, duplicates, negative or non-finite weights and bad row sums,
/// naming the row.
inline graph from_weights(int p, const std::vector<entry>& entries, std::string name = "user") {
  detail::require_ranks(p, "gossip::from_weights");
  std::vector<double> self(static_cast<std::size_t>(p), 0.0);
  std::vector<std::vector<edge>> rows(static_cast<std::size_t>(p));
  for (const entry& e : entries) {
    GRADSYNC_REQUIRE(e.row >= 0 && e.row < p, "gossip::from_weights", -1,
                     "entry (" + std::to_string(e.row) + ", " + std::to_string(e.col) + ") has row outside [0, " +
                         std::to_string(p) + ")");
    if (e.row == e.col) self[static_cast<std::size_t>(e.row)] += e.weight;
    else rows[static_cast<std::size_t>(e.row)].push_back({e.col, e.weight});
  }
  return graph(std::move(name), {mixing(std::move(self), std::move(rows))});
}

/// Checks what every operation needs of a topology (ranks match, entries in
/// range, no duplicate or negative or non-finite weights) and the properties
/// `need` asks for (rows or columns summing to 1, ...), on behalf of operation `op` on
/// `rank`; throws gradsync::error (errc::invalid_argument) naming the
/// topology, the step and the bad row (or column) otherwise.
inline void validate(const graph& g, int ranks, property need, const char* op, int rank) {
  const std::string& n = g.name();
  GRADSYNC_REQUIRE(g.period() > 0, op, rank, "topology '" + n + "' is empty");
  GRADSYNC_REQUIRE(g.size() == ranks, op, rank,
                   "topology '" + n + "' spans " + std::to_string(g.size()) + " ranks, the communicator " +
                       std::to_string(ranks));
  GRADSYNC_REQUIRE(!has(need, property::static_graph) || !g.dynamic(), op, rank,
                   "topology '" + n + "' changes every step (period " + std::to_string(g.period()) +
                       "); this operation needs a static topology");
  const auto p = static_cast<std::size_t>(ranks);
  const bool connect = has(need, property::strongly_connected) && p > 1;
  std::vector<std::vector<char>> reach(connect ? p : 0, std::vector<char>(connect ? p : 0, 0)); // union graph: j -> i
  for (std::size_t t = 0; t < g.period(); ++t) {
    const mixing& m = g.at(t);
    GRADSYNC_REQUIRE(m.size() == ranks, op, rank, "topology '" + n + "' step " + std::to_string(t) + " has " +
                                                      std::to_string(m.size()) + " rows, expected " + std::to_string(ranks));
    std::vector<double> col(p, 0.0);
    std::vector<char> seen(p, 0);
    for (int i = 0; i < ranks; ++i) {
      const auto row = [&] { return detail::row_name(n, t, g.period(), i); };
      const double s = m.self(i);
      GRADSYNC_REQUIRE(std::isfinite(s) && s >= 0, op, rank, row() + ": self weight " + std::to_string(s) + " is negative or not finite");
      double sum = s;
      col[static_cast<std::size_t>(i)] += s;
      std::fill(seen.begin(), seen.end(), 0);
      for (const edge& e : m.in(i)) {
        GRADSYNC_REQUIRE(e.peer >= 0 && e.peer < ranks && e.peer != i, op, rank,
                         row() + ": neighbour " + std::to_string(e.peer) + " is outside [0, " + std::to_string(ranks) +
                             ") or the row itself");
        GRADSYNC_REQUIRE(!seen[static_cast<std::size_t>(e.peer)], op, rank,
                         row() + ": neighbour " + std::to_string(e.peer) + " is listed twice");
        seen[static_cast<std::size_t>(e.peer)] = 1;
        GRADSYNC_REQUIRE(std::isfinite(e.weight) && e.weight > 0, op, rank,
                         row() + ": weight " + std::to_string(e.weight) + " of neighbour " + std::to_string(e.peer) +
                             " is not positive and finite");
        sum += e.weight;
        col[static_cast<std::size_t>(e.peer)] += e.weight;
        if (connect) reach[static_cast<std::size_t>(i)][static_cast<std::size_t>(e.peer)] = 1;
      }
      GRADSYNC_REQUIRE(!has(need, property::row_stochastic) || std::abs(sum - 1) <= weight_tolerance, op, rank,
                       row() + ": weights sum to " + std::to_string(sum) + ", not 1 (the mixing matrix must be row-stochastic)");
      if (has(need, property::symmetric))
        for (const edge& e : m.in(i)) {
          double back = -1;
          for (const edge& f : m.in(e.peer))
            if (f.peer == i) back = f.weight;
          GRADSYNC_REQUIRE(std::abs(back - e.weight) <= weight_tolerance, op, rank,
                           row() + ": W[" + std::to_string(i) + "][" + std::to_string(e.peer) + "] = " +
                               std::to_string(e.weight) + " but W[" + std::to_string(e.peer) + "][" + std::to_string(i) +
                               "] = " + std::to_string(std::max(back, 0.0)) + " (this operation needs a symmetric matrix)");
        }
    }
    if (has(need, property::column_stochastic))
      for (std::size_t j = 0; j < p; ++j)
        GRADSYNC_REQUIRE(std::abs(col[j] - 1) <= weight_tolerance, op, rank,
                         "topology '" + n + "'" + (g.period() > 1 ? " step " + std::to_string(t) : std::string()) +
                             " column " + std::to_string(j) + ": weights sum to " + std::to_string(col[j]) +
                             ", not 1 (this operation needs a column-stochastic matrix)");
  }
  if (connect) {
    // Every rank must reach rank 0 and be reached from it in the union graph.
    for (int dir = 0; dir < 2; ++dir) {
      std::vector<char> hit(p, 0);
      std::vector<std::size_t> stack{0};
      hit[0] = 1;
      while (!stack.empty()) {
        const std::size_t u = stack.back();
        stack.pop_back();
        for (std::size_t v = 0; v < p; ++v)
          if (!hit[v] && (dir == 0 ? reach[v][u] : reach[u][v])) {
            hit[v] = 1;
            stack.push_back(v);
          }
      }
      for (std::size_t v = 0; v < p; ++v)
        GRADSYNC_REQUIRE(hit[v], op, rank,
                         "topology '" + n + "' row " + std::to_string(v) + ": rank " + std::to_string(v) +
                             (dir == 0 ? " is never reached from rank 0" : " never reaches rank 0") +
                             " (this operation needs a strongly connected graph)");
    }
  }
}

/// The per-step convergence factor of gossip on `g`: the second-largest
/// eigenvalue modulus (SLEM) of the mixing matrix, by power iteration on W
/// with its consensus direction removed; for a dynamic topology, the SLEM of
/// the product over one period raised to 1/period. Consensus distance
/// shrinks by about this factor per step (from generic starting values).
/// `g` must pass validate() with strongly_connected.
inline double slem(const graph& g, int iterations = 4000) {
  const auto p = static_cast<std::size_t>(g.size());
  if (p <= 1) return 0;
  const std::size_t period = g.period();
  std::vector<double> a(p), b(p);
  const auto forward = [&](std::vector<double>& x) { // x := W_{L-1} ... W_0 x
    for (std::size_t t = 0; t < period; ++t) {
      g.at(t).apply(x, b);
      std::swap(x, b);
    }
  };
  const auto backward = [&](std::vector<double>& x) { // x := (W_{L-1} ... W_0)^T x
    for (std::size_t t = period; t-- > 0;) {
      g.at(t).apply_transposed(x, b);
      std::swap(x, b);
    }
  };
  // Right and left Perron vectors u (P u = u) and v (v^T P = v^T), v.u = 1;
  // damped (x + P x)/2 so periodic matrices converge too.
  const auto perron = [&](auto step) {
    std::vector<double> x(p, 1.0), y;
    for (int k = 0; k < iterations; ++k) {
      y = x;
      step(y);
      double s = 0;
      for (std::size_t i = 0; i < p; ++i) s += (x[i] = 0.5 * (x[i] + y[i]));
      for (auto& e : x) e *= static_cast<double>(p) / s;
    }
    return x;
  };
  const std::vector<double> u = perron(forward), v = perron(backward);
  double vu = 0;
  for (std::size_t i = 0; i < p; ++i) vu += v[i] * u[i];
  // Power iteration on P - u v^T / (v.u) from a fixed generic start.
  for (std::size_t i = 0; i < p; ++i) a[i] = std::sin(1.0 + 2.3 * static_cast<double>(i)) + 0.1;
  const auto deflate_norm = [&](std::vector<double>& x) {
    double d = 0, n2 = 0;
    for (std::size_t i = 0; i < p; ++i) d += v[i] * x[i];
    for (std::size_t i = 0; i < p; ++i) n2 += (x[i] -= u[i] * d / vu) * x[i];
    return std::sqrt(n2);
  };
  double norm = deflate_norm(a), log_sum = 0;
  int counted = 0;
  for (int k = 0; k < iterations; ++k) {
    if (norm < 1e-280) return 0; // nilpotent after deflation (e.g. full, one-peer on 2^k)
    for (auto& e : a) e /= norm;
    forward(a);
    norm = deflate_norm(a);
    if (k >= iterations / 2) { // the geometric mean over the second half averages out rotating pairs
      if (norm < 1e-280) return 0;
      log_sum += std::log(norm);
      ++counted;
    }
  }
  const double rate = std::exp(log_sum / counted);
  return std::pow(rate, 1.0 / static_cast<double>(period));
}

} // namespace gradsync::gossip

namespace gradsync::gossip {

/// Names `named` accepts, for help texts.
inline constexpr const char* topology_help =
    "ring, ring:mh, directed_ring, torus (rows ~ sqrt p), torus:RxC, hypercube, exponential, one_peer "
    "(one-peer dynamic exponential), full, star, star:uniform";

/// A built-in topology on p ranks by name (configuration files, command
/// lines); throws gradsync::error listing the names for an unknown one.
inline graph named(const std::string& spec, int p) {
  const char* op = "gossip::named";
  if (spec == "ring") return ring(p);
  if (spec == "ring:mh") return ring(p, weighting::metropolis_hastings);
  if (spec == "directed_ring") return directed_ring(p);
  if (spec == "hypercube") return hypercube(p);
  if (spec == "exponential") return exponential(p);
  if (spec == "one_peer" || spec == "one_peer_exponential") return one_peer_exponential(p);
  if (spec == "full") return full(p);
  if (spec == "star") return star(p);
  if (spec == "star:uniform") return star(p, weighting::uniform);
  if (spec == "torus") {
    int rows = 1;
    for (int d = 1; d * d <= p; ++d)
      if (p % d == 0) rows = d;
    return torus(rows, p / rows);
  }
  if (spec.rfind("torus:", 0) == 0) {
    const std::string dims = spec.substr(6);
    const auto x = dims.find('x');
    int rows = 0, cols = 0;
    try {
      std::size_t a = 0, b = 0;
      rows = std::stoi(dims.substr(0, x), &a);
      cols = x == std::string::npos ? 0 : std::stoi(dims.substr(x + 1), &b);
      if (a != x || b != dims.size() - x - 1) rows = 0;
    } catch (const std::exception&) {
      rows = 0;
    }
    GRADSYNC_REQUIRE(rows > 0 && cols > 0, op, -1, "'" + spec + "': expected torus:ROWSxCOLS");
    const long long ranks = static_cast<long long>(rows) * cols; // both are ints: no overflow in 64 bits
    GRADSYNC_REQUIRE(ranks == p, op, -1,
                     "'" + spec + "' has " + std::to_string(ranks) + " ranks, not " + std::to_string(p));
    return torus(rows, cols);
  }
  throw error(op, -1, -1, "unknown topology '" + spec + "' (" + topology_help + ")");
}

} // namespace gradsync::gossip
