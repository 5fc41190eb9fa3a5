// gradsync: push-sum gossip (Kempe, Dobra and Gehrke's weighted averaging)
// for directed graphs. Each rank keeps a numerator x and a scalar weight w,
// both mixed with a column-stochastic matrix (every rank splits what it has
// among itself and its out-neighbours, so the sums over ranks never change);
// the estimate x / w converges to the average over ranks on any strongly
// connected graph, where a row-stochastic combine on a directed graph would
// converge to a weighted (wrong) average.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../collectives.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../exec/executor.hpp"
#include "../exec/host.hpp"
#include "../transport/transport.hpp"
#include "exchange.hpp"
#include "options.hpp"
#include "topology.hpp"

namespace gradsync::gossip {

/// Scratch bytes push_sum needs on `rank` for `count` elements of T.
template <element T> std::size_t push_sum_workspace_bytes(const graph& g, int rank, std::size_t count) {
  return max_in_degree(g, rank) * count * sizeof(T);
}

/// One push-sum round: the numerator `x` (in place) and the weight `weight`
/// (start every rank at 1 and x at its value) become sum_j W_t[i][j] x_j and
/// sum_j W_t[i][j] w_j, W_t = g.at(step) column-stochastic and strongly
/// connected over a period (validated on every rank before any message
/// moves); `estimate` (x.size() elements, not overlapping x) receives
/// x * (1 / weight), the running estimate of the average. Every rank passes
/// the same graph, step and count. Non-finite values in x give NaN estimates.
/// o.global_every is not used (push-sum has no exact step to mix in).
template <transport C, executor E, element T>
round_report push_sum(C& c, E& ex, std::span<T> x, double& weight, const graph& g, std::uint64_t step,
                      std::span<T> estimate, const gossip_options& o = {}) {
  GRADSYNC_CARRIES(C, E);
  const char* name = "push_sum";
  const int r = c.rank();
  const scoped_timeout guard(c, o.collective.timeout);
  validate(g, c.size(), property::column_stochastic | property::strongly_connected, name, r);
  gradsync::detail::check_span(ex, x, name, r, "numerator");
  gradsync::detail::check_span(ex, estimate, name, r, "estimate");
  GRADSYNC_REQUIRE(estimate.size() == x.size(), name, r,
                   "estimate holds " + std::to_string(estimate.size()) + " elements, the numerator " +
                       std::to_string(x.size()));
  GRADSYNC_REQUIRE(x.empty() || estimate.data() + estimate.size() <= x.data() || x.data() + x.size() <= estimate.data(),
                   name, r, "estimate overlaps the numerator (the numerator is state kept across rounds)");
  GRADSYNC_REQUIRE(std::isfinite(weight) && weight > 0, name, r,
                   "weight " + std::to_string(weight) + " is not positive and finite (start every rank at 1)");
  const mixing& m = g.at(step);
  const std::size_t n = x.size(), deg = m.in(r).size();
  auto ws = ex.template scratch<T>(o.collective.workspace, push_sum_workspace_bytes<T>(g, r, n) / sizeof(T), name, r);
  std::vector<double> weights(deg);
  ex.fence();
  const double mine = weight;
  const lane lanes[2] = {
      {std::as_bytes(std::span<const T>(x)), reinterpret_cast<std::byte*>(ws.data()), n * sizeof(T), o.collective.tag, false},
      {std::as_bytes(std::span<const double>(&mine, 1)), reinterpret_cast<std::byte*>(weights.data()), sizeof(double),
       o.collective.tag + 1, false}};
  round_report rep;
  gradsync::detail::run_call(c, name, detail::round_fingerprint<T>(call_kind::push_sum, n, m, step), n * sizeof(T),
                             o.collective, [&] {
                               rep.bytes_sent = exchange(c, m, std::span<const lane>(lanes));
                               combine_neighbors(ex, m, r, x.data(), ws.data(), n);
                             });
  weight = combine_scalar(m, r, mine, weights.data());
  ex.copy(estimate.data(), x.data(), n);
  ex.axpby(estimate.data(), 0.0, x.data(), 1.0 / weight, n);
  return rep;
}

/// push_sum on the host executor (see above).
template <transport C, element T>
round_report push_sum(C& c, std::span<T> x, double& weight, const graph& g, std::uint64_t step, std::span<T> estimate,
                      const gossip_options& o = {}) {
  exec::host ex;
  return push_sum(c, ex, x, weight, g, step, estimate, o);
}

} // namespace gradsync::gossip
