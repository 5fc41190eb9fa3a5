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
};

/// Extra options an algorithm needs on inproc ranks (e.g. a group size for
/// hierarchical schedules); the sweep and the validation tests apply it.
inline void configure(options& o, algorithm a) {
  (void)o;
  (void)a;
}

/// Whether collective `c` has a schedule for algorithm `a` (the sweep skips
/// the others; the validation tests check that they fail with a clear error).
constexpr bool implements(collective c, algorithm a) {
  (void)c;
  return a == algorithm::automatic || a == algorithm::ring;
}

} // namespace gradsync::test
