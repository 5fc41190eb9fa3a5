// Hierarchical gossip: average inside groups, gossip among leaders, broadcast
// inside; against the dense reference (group averages mixed by the leaders'
// matrix), bitwise equal inside each group; unequal groups rejected.
#include "bad_groups.hpp"
#include "reference.hpp"

#include <gradsync/gossip/hierarchical_gossip.hpp>
#include <gradsync/transport/inproc.hpp>

#include <cstring>

using namespace gradsync;
using namespace gradsync::gossip;
namespace ref = gradsync::test::gossip_ref;

TEST_CASE("hierarchical gossip: group averages mixed by the leaders' topology") {
  const std::size_t n = 29;
  for (int p : {2, 4, 6, 8, 9, 12, 16})
    for (int gs : {1, 2, 3, 4}) {
      if (p % gs) continue;
      const int groups = p / gs;
      for (const graph& g : {ring(groups), one_peer_exponential(groups), exponential(groups)}) {
        INFO("p=" << p << " group size " << gs << " leaders' topology " << g.name());
        const std::uint64_t steps = 3;
        std::vector<std::vector<double>> got(static_cast<std::size_t>(p), std::vector<double>(n));
        inproc::run(p, [&](inproc::communicator& c) {
          c.group().set_timeout(std::chrono::seconds(60));
          auto& x = got[static_cast<std::size_t>(c.rank())];
          for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<double>(ref::input(c.rank(), i));
          for (std::uint64_t s = 0; s < steps; ++s) hierarchical_neighbor_allreduce(c, std::span<double>(x), g, s, gs);
        });
        // Reference: per-group averages, then every step W_s of the leaders
        // (the averaging inside is a no-op after the first broadcast).
        std::vector<std::vector<long double>> a(static_cast<std::size_t>(groups), std::vector<long double>(n, 0));
        for (int r = 0; r < p; ++r)
          for (std::size_t i = 0; i < n; ++i) a[static_cast<std::size_t>(r / gs)][i] += ref::input(r, i) / static_cast<long double>(gs);
        for (std::uint64_t s = 0; s < steps; ++s) ref::apply(ref::matrix_of(g, s), a);
        for (int r = 0; r < p; ++r) {
          const auto& leader = got[static_cast<std::size_t>(r / gs * gs)];
          CHECK(std::memcmp(got[static_cast<std::size_t>(r)].data(), leader.data(), n * sizeof(double)) == 0);
          for (std::size_t i = 0; i < n; ++i)
            CHECK(got[static_cast<std::size_t>(r)][i] ==
                  doctest::Approx(static_cast<double>(a[static_cast<std::size_t>(r / gs)][i])).epsilon(1e-12).scale(8));
        }
      }
    }
}

TEST_CASE("hierarchical gossip: unequal groups, a leaders' graph of the wrong size and no groups are rejected") {
  ref::check_bad_groups_rejected("hierarchical_neighbor_allreduce", [](inproc::communicator& c, std::span<float> x, const graph& g, int gs) {
    hierarchical_neighbor_allreduce(c, x, g, 0, gs);
  });
}
