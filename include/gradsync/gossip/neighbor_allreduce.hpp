// gradsync: neighbour averaging, the basic gossip step. Each rank sends its
// vector to its out-neighbours, receives its in-neighbours' (the exchange
// phase, gossip/exchange.hpp), then combines x_i <- W[i][i] x_i +
// sum_j W[i][j] x_j with the executor's weighted combine (the combine
// phase). The step number selects the matrix of a dynamic topology, so
// one-peer exponential gossip changes partner every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../algo/shm_direct.hpp"
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

/// Scratch bytes neighbor_allreduce needs on `rank` for `count` elements of
/// T on topology `g` (pass that much as o.collective.workspace to avoid a
/// per-call allocation): one buffer per in-neighbour of the busiest step.
template <element T> std::size_t neighbor_allreduce_workspace_bytes(const graph& g, int rank, std::size_t count) {
  return max_in_degree(g, rank) * count * sizeof(T);
}

/// One gossip round in place on `x`: x_i <- sum_j W_t[i][j] x_j with W_t =
/// g.at(step). `g` must span the communicator and be row-stochastic
/// (validated on every rank before any message moves; a bad graph throws
/// gradsync::error naming the row). Every rank passes the same graph, step
/// and count. Doubly stochastic matrices preserve the average over ranks
/// (to rounding). Works on every element type; integers round each weighted
/// sum to nearest. With o.global_every, some steps are an exact allreduce
/// average instead. Element work runs on executor `ex`.
template <transport C, executor E, element T>
round_report neighbor_allreduce(C& c, E& ex, std::span<T> x, const graph& g, std::uint64_t step,
                                const gossip_options& o = {}) {
  GRADSYNC_CARRIES(C, E);
  const char* name = "neighbor_allreduce";
  const int r = c.rank();
  const scoped_timeout guard(c, o.collective.timeout);
  validate(g, c.size(), property::row_stochastic, name, r);
  gradsync::detail::check_span(ex, x, name, r, "data");
  if (o.global_step(step)) {
    allreduce(c, ex, x, op::avg{}, o.dense());
    return {0, true};
  }
  const mixing& m = g.at(step);
  const std::size_t n = x.size();
  if constexpr (gradsync::detail::arena_for<C, E>) {
    // Shared memory: combine straight from the neighbours' staged copies
    // (algo/shm_direct.hpp), no messages, no scratch. Same combine order.
    round_report rep;
    // `direct`: the combine's first arena round carries the check in band.
    call_fingerprint f = detail::round_fingerprint<T>(call_kind::neighbor_allreduce, n, m, step);
    f.algo = algorithm::direct;
    gradsync::detail::run_call(
        c, name, f, n * sizeof(T), o.collective, [&] {
          const auto in = m.in(r);
          std::vector<int> peers(in.size());
          for (std::size_t k = 0; k < in.size(); ++k) peers[k] = in[k].peer;
          algo::shm_direct::neighbor_combine(c, x.data(), n, std::span<const int>(peers),
                                             [&](T* xs, const T* const* from, std::size_t len) {
                                               combine_neighbors(ex, m, r, xs, from, len);
                                             });
          rep.bytes_sent = m.out(r).size() * n * sizeof(T); // what the out-neighbours read
        });
    return rep;
  }
  auto ws = ex.template scratch<T>(o.collective.workspace, neighbor_allreduce_workspace_bytes<T>(g, r, n) / sizeof(T),
                                   name, r);
  ex.fence(); // x was written by the caller's executor work
  const lane l{std::as_bytes(std::span<const T>(x)), reinterpret_cast<std::byte*>(ws.data()), n * sizeof(T),
               o.collective.tag, false};
  round_report rep;
  gradsync::detail::run_call(c, name, detail::round_fingerprint<T>(call_kind::neighbor_allreduce, n, m, step),
                             n * sizeof(T), o.collective, [&] {
                               rep.bytes_sent = exchange(c, m, std::span<const lane>(&l, 1));
                               combine_neighbors(ex, m, r, x.data(), ws.data(), n);
                             });
  return rep;
}

/// neighbor_allreduce on the host executor (see above).
template <transport C, element T>
round_report neighbor_allreduce(C& c, std::span<T> x, const graph& g, std::uint64_t step, const gossip_options& o = {}) {
  exec::host ex;
  return neighbor_allreduce(c, ex, x, g, step, o);
}

} // namespace gradsync::gossip
