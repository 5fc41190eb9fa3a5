// gradsync: runs a flat (single-level) allreduce schedule named at run time.
// Hierarchical schedules use it for their inner steps; collectives.hpp for
// the public entry point.
#pragma once

#include <cstddef>
#include <string>

#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "dbtree.hpp"
#include "options.hpp"
#include "rabenseifner.hpp"
#include "recursive_doubling.hpp"
#include "ring.hpp"
#include "tree.hpp"

namespace gradsync::algo {

/// Whether `a` is a single-level allreduce schedule.
constexpr bool is_flat(algorithm a) {
  return a == algorithm::ring || a == algorithm::tree || a == algorithm::dbtree ||
         a == algorithm::rd || a == algorithm::rabenseifner;
}

/// Scratch elements of flat allreduce `a` (0 for others).
inline std::size_t flat_scratch_elems(algorithm a, std::size_t count, std::size_t elem_bytes,
                                      std::size_t seg_bytes, int ranks) {
  switch (a) {
  case algorithm::ring:
    return ring::scratch_elems(partition{count, static_cast<std::size_t>(ranks)}, elem_bytes, seg_bytes, ranks);
  case algorithm::tree: return tree::allreduce_scratch_elems(count, elem_bytes, seg_bytes, ranks);
  case algorithm::dbtree: return dbtree::allreduce_scratch_elems(count, elem_bytes, seg_bytes, ranks);
  case algorithm::rd:
  case algorithm::rabenseifner: return pairwise::scratch_elems(count, elem_bytes, seg_bytes, ranks);
  default: return 0;
  }
}

/// Largest scratch any flat allreduce needs.
inline std::size_t any_flat_scratch_elems(std::size_t count, std::size_t elem_bytes,
                                          std::size_t seg_bytes, int ranks) {
  std::size_t m = 0;
  for (auto a : {algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd, algorithm::rabenseifner})
    m = std::max(m, flat_scratch_elems(a, count, elem_bytes, seg_bytes, ranks));
  return m;
}

/// Runs flat allreduce `a` with the typed reduction on executor `ex`
/// (`scratch`: flat_scratch_elems(a, ...) elements); throws naming `op` for
/// non-flat algorithms.
template <transport C, executor E, element T, reduce_op Op>
void flat_allreduce(algorithm a, C& c, E& ex, const T* in, T* out, std::size_t count, Op op,
                    std::size_t seg_bytes, int tag, T* scratch, const char* opname = "allreduce") {
  const typed_reduce<T, Op, E> sop{ex, op, c.size(), trace_of(c)};
  auto* ws = reinterpret_cast<std::byte*>(scratch);
  switch (a) {
  case algorithm::ring: return ring::allreduce(c, ex, in, out, count, op, seg_bytes, tag, scratch);
  case algorithm::tree: return tree::allreduce(c, sop, in, out, count, seg_bytes, tag, ws);
  case algorithm::dbtree: return dbtree::allreduce(c, sop, in, out, count, seg_bytes, tag, ws);
  case algorithm::rd: return recursive_doubling::allreduce(c, sop, in, out, count, seg_bytes, tag, ws);
  case algorithm::rabenseifner: return rabenseifner::allreduce(c, sop, in, out, count, seg_bytes, tag, ws);
  default:
    throw error(opname, c.rank(), -1,
                "algorithm '" + std::string(algorithm_name(a)) + "' is not a single-level schedule");
  }
}

} // namespace gradsync::algo
