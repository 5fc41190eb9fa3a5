// The algorithms the collective sweep (harness.hpp) runs. This is the one
// place to add an algorithm to the tests: append it to algorithms_under_test
// and, if it has no schedule for some collective, say so in implements().
#pragma once

#include <gradsync/algo/options.hpp>

namespace gradsync::test {

/// Collectives the sweep covers.
enum class collective { allreduce, reduce_scatter, allgather, broadcast, reduce };

/// Every algorithm listed here runs the full sweep of every collective that
/// implements() it. New algorithms are appended here.
inline constexpr algorithm algorithms_under_test[] = {
    algorithm::automatic,
    algorithm::ring,
    algorithm::tree,
    algorithm::dbtree,
    algorithm::rd,
    algorithm::rabenseifner,
    algorithm::hier,
    algorithm::twod,
    algorithm::bruck,
    algorithm::scatter_allgather,
};

/// Extra options an algorithm needs on inproc ranks: hier has no node_of
/// there, so it gets a group size, one that leaves a short last group for
/// most rank counts (tests/algo/test_hierarchical.cpp sweeps group sizes).
inline void configure(options& o, algorithm a) {
  if (a == algorithm::hier) o.group_size = 3;
}

/// Whether collective `c` has a schedule for algorithm `a` (the sweep skips
/// the others; the validation tests check that they fail with a clear error).
constexpr bool implements(collective c, algorithm a) {
  switch (a) {
  case algorithm::automatic:
  case algorithm::ring: return true;
  case algorithm::tree: return c == collective::allreduce || c == collective::broadcast || c == collective::reduce;
  case algorithm::rd: return c == collective::allreduce || c == collective::reduce_scatter || c == collective::allgather;
  case algorithm::bruck: return c == collective::reduce_scatter || c == collective::allgather;
  case algorithm::scatter_allgather: return c == collective::broadcast;
  case algorithm::hier: return true;
  case algorithm::dbtree:
  case algorithm::rabenseifner:
  case algorithm::twod: return c == collective::allreduce;
  default: return false; // direct: shared memory only (tests/transport)
  }
}

} // namespace gradsync::test
