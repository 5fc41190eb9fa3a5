// gradsync: the public collective operations. Each validates its arguments
// (a clear gradsync::error, never undefined behaviour), picks a schedule and
// runs it over any transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#include "algo/chain.hpp"
#include "algo/dispatch.hpp"
#include "algo/dissemination.hpp"
#include "algo/hierarchical.hpp"
#include "algo/options.hpp"
#include "algo/ring.hpp"
#include "algo/select.hpp"
#include "algo/shm_direct.hpp"
#include "algo/tree.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/ops.hpp"
#include "transport/subgroup.hpp"
#include "transport/transport.hpp"

namespace gradsync {

namespace detail {

template <class T> void check_span(std::span<T> s, const char* op, int rank, const char* what) {
  GRADSYNC_REQUIRE(s.data() != nullptr || s.empty(), op, rank,
          std::string(what) + " is null but holds " + std::to_string(s.size()) + " elements");
  GRADSYNC_REQUIRE(s.size() <= std::numeric_limits<std::size_t>::max() / sizeof(T) / 2, op, rank,
          std::string(what) + " size overflows");
}

// Distinct, partially overlapping buffers would be read after being written.
template <class T, class U>
void check_alias(std::span<T> in, std::span<U> out, const char* op, int rank) {
  if (in.empty() || out.empty()) return;
  auto a = reinterpret_cast<std::uintptr_t>(in.data()), b = reinterpret_cast<std::uintptr_t>(out.data());
  const auto ae = a + in.size_bytes(), be = b + out.size_bytes();
  GRADSYNC_REQUIRE(a == b || ae <= b || be <= a, op, rank,
          "input and output overlap without being the same buffer");
}

inline void check_root(int root, int size, const char* op, int rank) {
  GRADSYNC_REQUIRE(root >= 0 && root < size, op, rank,
          "root " + std::to_string(root) + " out of range [0, " + std::to_string(size) + ")");
}

inline std::size_t mul_checked(std::size_t a, std::size_t b, const char* op, int rank) {
  GRADSYNC_REQUIRE(b == 0 || a <= std::numeric_limits<std::size_t>::max() / b, op, rank,
          std::to_string(a) + " x " + std::to_string(b) + " elements overflows size_t");
  return a * b;
}

[[noreturn]] inline void unsupported(const char* op, int rank, algorithm a) {
  throw error(op, rank, -1,
              "algorithm '" + std::string(algorithm_name(a)) + "' is not available for " + op);
}

// The selector `automatic` consults: the caller's, else `fallback` (defaults).
inline const selector& selector_of(const options& o) {
  static const selector defaults; // immutable: the policy.hpp model, no table
  return o.select ? *o.select : defaults;
}

// Groups of a hierarchical allreduce; hier needs a group size or node_of.
template <transport C> rank_groups hier_groups(const C& c, const options& o) {
  GRADSYNC_REQUIRE(o.group_size >= 0, "allreduce", c.rank(),
          "group_size " + std::to_string(o.group_size) + " is negative");
  GRADSYNC_REQUIRE(o.group_size > 0 || node_aware<C>, "allreduce", c.rank(),
          "algorithm 'hier' needs groups: set options::group_size, or use a transport with node_of()");
  return groups_of(c, o.group_size);
}

template <transport C> int grid_row_of(const C& c, const options& o) {
  GRADSYNC_REQUIRE(o.group_size >= 0, "allreduce", c.rank(),
          "group_size " + std::to_string(o.group_size) + " is negative");
  return o.group_size > 0 ? o.group_size : grid_row(c.size());
}

} // namespace detail

/// The communicator as the cost model sees it under options `o` (groups from
/// o.group_size, else the transport's node_of, else none).
template <transport C> topology topology_of(const C& c, const options& o = {}) {
  const int p = c.size();
  // Closed forms where no node map is needed: automatic calls this per call.
  if (o.group_size > 0) return {p, std::min(o.group_size, p), (p + o.group_size - 1) / o.group_size};
  if constexpr (requires { c.node_shape(); }) {
    return {p, c.node_shape().largest, c.node_shape().count};
  } else if constexpr (node_aware<C>) {
    const rank_groups g = groups_of(c, 0);
    return {p, g.max_size(), g.count()};
  } else {
    return {p, p, 1};
  }
}

/// The schedule `allreduce` runs for `count` elements of T under `o`:
/// o.algo, or for `automatic` the selector's choice (override table, then the
/// cheapest by the model). The same on every rank given equal selectors.
template <element T, transport C>
algorithm allreduce_algorithm(const C& c, std::size_t count, const options& o = {}) {
  if (o.algo != algorithm::automatic) return o.algo;
  const selector& sel = detail::selector_of(o);
  // Over shared memory the arena allreduce beats every message schedule at
  // every size (core/policy.hpp, shm section); the override table still wins.
  if constexpr (algo::shm_direct::arena_transport<C>)
    if (sel.pinned(count * sizeof(T)) == algorithm::automatic) return algorithm::direct;
  return sel.choose(count * sizeof(T), topology_of(c, o), detail::segment_bytes(o));
}

namespace detail {
// Scratch bytes of allreduce schedule `a` (already chosen) for `count` elements.
template <element T, transport C>
std::size_t allreduce_scratch_bytes(algorithm a, const C& c, std::size_t count, const options& o) {
  const std::size_t seg = segment_bytes(o);
  switch (a) {
  case algorithm::hier: {
    const rank_groups g = hier_groups(c, o);
    return algo::hierarchical::allreduce_scratch_elems(count, sizeof(T), seg, g.max_size(), g.count()) *
           sizeof(T);
  }
  case algorithm::twod: {
    const int row = grid_row_of(c, o);
    return algo::hierarchical::allreduce_scratch_elems(count, sizeof(T), seg, row,
                                                       (c.size() + row - 1) / row) * sizeof(T);
  }
  default: return algo::flat_scratch_elems(a, count, sizeof(T), seg, c.size()) * sizeof(T);
  }
}
} // namespace detail

/// Scratch bytes `allreduce` needs for `count` elements of T with options `o`
/// (pass a buffer this large as `o.workspace` to avoid a per-call allocation).
template <element T, transport C>
std::size_t allreduce_workspace_bytes(const C& c, std::size_t count, const options& o = {}) {
  return detail::allreduce_scratch_bytes<T>(allreduce_algorithm<T>(c, count, o), c, count, o);
}

/// Allreduce, out of place: `out[i] = op over ranks of in[i]`. `out` must hold
/// at least `in.size()` elements (extra elements are untouched); `in` and `out`
/// may be the same buffer. Every rank must pass the same count. All ranks end
/// with bitwise identical results.
template <transport C, element T, reduce_op Op = op::sum>
void allreduce(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op = {},
               const options& o = {}) {
  const char* name = "allreduce";
  const int r = c.rank();
  detail::check_span(in, name, r, "input");
  detail::check_span(out, name, r, "output");
  GRADSYNC_REQUIRE(out.size() >= in.size(), name, r,
          "output holds " + std::to_string(out.size()) + " elements, input " +
              std::to_string(in.size()));
  detail::check_alias(in, out, name, r);
  const std::size_t count = in.size();
  const selector& sel = detail::selector_of(o);
  const algorithm a = allreduce_algorithm<T>(c, count, o);
  const std::size_t seg = detail::segment_bytes(o);
  if (a == algorithm::direct) {
    if constexpr (algo::shm_direct::arena_transport<C>)
      return algo::shm_direct::allreduce(c, in.data(), out.data(), count, op);
    detail::unsupported(name, r, a);
  }
  if (a != algorithm::hier && a != algorithm::twod && !algo::is_flat(a)) detail::unsupported(name, r, a);
  algo::scratch<T> ws(o.workspace, detail::allreduce_scratch_bytes<T>(a, c, count, o) / sizeof(T), name, r);
  switch (a) {
  case algorithm::hier:
    algo::hierarchical::allreduce(c, in.data(), out.data(), count, op, detail::hier_groups(c, o), o.inner,
                                  sel, seg, o.tag, ws.data());
    return;
  case algorithm::twod:
    algo::hierarchical::allreduce_2d(c, in.data(), out.data(), count, op, detail::grid_row_of(c, o), seg,
                                     o.tag, ws.data());
    return;
  default:
    algo::flat_allreduce(a, c, in.data(), out.data(), count, op, seg, o.tag, ws.data(), name);
  }
}

/// Allreduce in place on `data`.
template <transport C, element T, reduce_op Op = op::sum>
void allreduce(C& c, std::span<T> data, Op op = {}, const options& o = {}) {
  allreduce<C, T, Op>(c, std::span<const T>(data), data, op, o);
}

/// Scratch bytes `reduce_scatter` needs for blocks of `block` elements.
template <element T, transport C>
std::size_t reduce_scatter_workspace_bytes(const C& c, std::size_t block, const options& o = {}) {
  const auto p = static_cast<std::size_t>(c.size());
  return algo::ring::scratch_elems(partition{block * p, p}, sizeof(T), detail::segment_bytes(o),
                                   c.size()) * sizeof(T);
}

/// Reduce-scatter: `in` holds size() blocks of `out.size()` elements; rank r
/// receives block r of the reduction. `out` may alias block r of `in`.
template <transport C, element T, reduce_op Op = op::sum>
void reduce_scatter(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out,
                    Op op = {}, const options& o = {}) {
  const char* name = "reduce_scatter";
  const int r = c.rank();
  detail::check_span(in, name, r, "input");
  detail::check_span(out, name, r, "output");
  const auto p = static_cast<std::size_t>(c.size());
  const std::size_t n = out.size();
  GRADSYNC_REQUIRE(in.size() == detail::mul_checked(n, p, name, r), name, r,
          "input holds " + std::to_string(in.size()) + " elements, expected ranks x output = " +
              std::to_string(p) + " x " + std::to_string(n));
  T* own = out.data();
  if (!out.empty() && !in.empty()) {
    const T* blk = in.data() + n * static_cast<std::size_t>(r);
    if (own != blk) detail::check_alias(in, out, name, r);
  }
  switch (o.algo) {
  case algorithm::automatic:
  case algorithm::direct: // over shared memory: through the arena (faster at every size)
    if constexpr (algo::shm_direct::arena_transport<C>) {
      return algo::shm_direct::reduce_scatter(c, in.data(), own, n, op);
    } else if (o.algo == algorithm::direct) {
      detail::unsupported(name, r, o.algo);
    }
    [[fallthrough]];
  case algorithm::ring: {
    algo::scratch<T> ws(o.workspace, reduce_scatter_workspace_bytes<T>(c, n, o) / sizeof(T), name, r);
    algo::ring::reduce_scatter(c, in.data(), own, partition{n * p, p}, op,
                               detail::segment_bytes(o), o.tag, ws.data());
    return;
  }
  default:
    detail::unsupported(name, r, o.algo);
  }
}

/// Allgather: `out` receives size() blocks of `in.size()` elements, block r
/// from rank r. `in` may alias block r of `out` (in place).
template <transport C, element T>
void allgather(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out,
               const options& o = {}) {
  const char* name = "allgather";
  const int r = c.rank();
  detail::check_span(in, name, r, "input");
  detail::check_span(out, name, r, "output");
  const auto p = static_cast<std::size_t>(c.size());
  const std::size_t n = in.size();
  GRADSYNC_REQUIRE(out.size() == detail::mul_checked(n, p, name, r), name, r,
          "output holds " + std::to_string(out.size()) + " elements, expected ranks x input = " +
              std::to_string(p) + " x " + std::to_string(n));
  T* own = out.data() + n * static_cast<std::size_t>(r);
  if (n != 0 && own != in.data()) detail::check_alias(in, out, name, r);
  switch (o.algo) {
  case algorithm::automatic:
  case algorithm::direct: // over shared memory: through the arena
    if constexpr (algo::shm_direct::arena_transport<C>) {
      return algo::shm_direct::allgather(c, in.data(), out.data(), n);
    } else if (o.algo == algorithm::direct) {
      detail::unsupported(name, r, o.algo);
    }
    [[fallthrough]];
  case algorithm::ring:
    copy_elems(own, in.data(), n);
    algo::ring::allgather(c, out.data(), partition{n * p, p}, detail::segment_bytes(o), o.tag);
    return;
  default:
    detail::unsupported(name, r, o.algo);
  }
}

namespace detail {
// broadcast/reduce: `ring` is the pipelined chain, `tree` the binomial tree.
template <transport C>
algorithm rooted_algorithm(const C& c, std::size_t bytes, bool is_reduce, const options& o) {
  if (o.algo != algorithm::automatic) return o.algo;
  return selector_of(o).choose_rooted(bytes, c.size(), is_reduce, segment_bytes(o));
}
} // namespace detail

/// Broadcast `data` from `root` to every rank: the pipelined chain (`ring`)
/// or the binomial tree (`tree`); `automatic` picks by the cost model.
template <transport C, element T>
void broadcast(C& c, std::span<T> data, int root, const options& o = {}) {
  const char* name = "broadcast";
  const int r = c.rank();
  detail::check_span(data, name, r, "buffer");
  detail::check_root(root, c.size(), name, r);
  switch (const algorithm a = detail::rooted_algorithm(c, data.size_bytes(), false, o)) {
  case algorithm::ring:
    algo::chain::broadcast(c, data.data(), data.size(), root, detail::segment_bytes(o), o.tag);
    return;
  case algorithm::tree:
    algo::tree::broadcast(c, data.data(), data.size(), root, detail::segment_bytes(o), o.tag);
    return;
  default:
    detail::unsupported(name, r, a);
  }
}

/// Scratch bytes `reduce` needs for `count` elements.
template <element T, transport C>
std::size_t reduce_workspace_bytes(const C& c, std::size_t count, const options& o = {}) {
  const std::size_t seg = detail::segment_bytes(o);
  if (detail::rooted_algorithm(c, count * sizeof(T), true, o) == algorithm::tree)
    return algo::tree::reduce_scratch_elems(count, sizeof(T), seg, c.size()) * sizeof(T);
  return algo::chain::reduce_scratch_elems(count, sizeof(T), seg, c.size()) * sizeof(T);
}

/// Reduce to `root`: at the root `out` (at least `in.size()` elements, may be
/// `in`) receives the reduction; elsewhere `out` is not touched and may be empty.
template <transport C, element T, reduce_op Op = op::sum>
void reduce(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, int root,
            Op op = {}, const options& o = {}) {
  const char* name = "reduce";
  const int r = c.rank();
  detail::check_span(in, name, r, "input");
  detail::check_span(out, name, r, "output");
  detail::check_root(root, c.size(), name, r);
  if (r == root) {
    GRADSYNC_REQUIRE(out.size() >= in.size(), name, r,
            "root output holds " + std::to_string(out.size()) + " elements, input " +
                std::to_string(in.size()));
    detail::check_alias(in, out, name, r);
  }
  const algorithm a = detail::rooted_algorithm(c, in.size_bytes(), true, o);
  if (a != algorithm::ring && a != algorithm::tree) detail::unsupported(name, r, a);
  algo::scratch<T> ws(o.workspace, reduce_workspace_bytes<T>(c, in.size(), o) / sizeof(T), name, r);
  if (a == algorithm::tree)
    algo::tree::reduce(c, in.data(), out.data(), in.size(), root, op, detail::segment_bytes(o), o.tag,
                       ws.data());
  else
    algo::chain::reduce(c, in.data(), out.data(), in.size(), root, op, detail::segment_bytes(o), o.tag,
                        ws.data());
}

/// Returns on each rank only after every rank has entered the barrier.
template <transport C> void barrier(C& c, const options& o = {}) {
  algo::dissemination::barrier(c, o.tag);
}

} // namespace gradsync
