// Sharded hierarchical gossip: reduce-scatter inside groups, one column
// gossip per local index, allgather inside; against the dense reference
// (group averages mixed by the groups' matrix), bitwise equal inside each
// group, any count (also fewer elements than group members); the exact
// average after log2(groups) one-peer rounds; bad groups rejected.
#include "bad_groups.hpp"
#include "reference.hpp"

#include <gradsync/gossip/sharded_gossip.hpp>
#include <gradsync/transport/inproc.hpp>

#include <cstring>

using namespace gradsync;
using namespace gradsync::gossip;
namespace ref = gradsync::test::gossip_ref;

namespace {

// Runs `steps` sharded rounds on p inproc ranks from ref::input; returns every rank's vector.
template <class T>
std::vector<std::vector<T>> run_rounds(int p, int gs, const graph& g, std::size_t n, std::uint64_t steps,
                                       std::vector<round_report>* reports = nullptr) {
  std::vector<std::vector<T>> got(static_cast<std::size_t>(p), std::vector<T>(n));
  if (reports) reports->assign(static_cast<std::size_t>(p), {});
  inproc::run(p, [&](inproc::communicator& c) {
    c.group().set_timeout(std::chrono::seconds(60));
    auto& x = got[static_cast<std::size_t>(c.rank())];
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(ref::input(c.rank(), i));
    for (std::uint64_t s = 0; s < steps; ++s) {
      const round_report rep = sharded_neighbor_allreduce(c, std::span<T>(x), g, s, gs);
      if (reports) (*reports)[static_cast<std::size_t>(c.rank())] = rep;
    }
  });
  return got;
}

} // namespace

TEST_CASE("sharded gossip: group averages mixed by the groups' topology, any count") {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{29}, std::size_t{1000}})
    for (int p : {1, 2, 3, 4, 6, 8, 9, 12, 15, 16})
      for (int gs : {1, 2, 3, 4, 8}) {
        if (p % gs) continue;
        const int groups = p / gs;
        for (const graph& g : {ring(groups), one_peer_exponential(groups), exponential(groups)}) {
          INFO("p=" << p << " group size " << gs << " n=" << n << " groups' topology " << g.name());
          const std::uint64_t steps = 3;
          const auto got = run_rounds<double>(p, gs, g, n, steps);
          // Reference: per-group averages, then W_s of the groups each step.
          std::vector<std::vector<long double>> a(static_cast<std::size_t>(groups), std::vector<long double>(n, 0));
          for (int r = 0; r < p; ++r)
            for (std::size_t i = 0; i < n; ++i)
              a[static_cast<std::size_t>(r / gs)][i] += ref::input(r, i) / static_cast<long double>(gs);
          for (std::uint64_t s = 0; s < steps; ++s) ref::apply(ref::matrix_of(g, s), a);
          for (int r = 0; r < p; ++r) {
            const auto& first = got[static_cast<std::size_t>(r / gs * gs)];
            CHECK(std::memcmp(got[static_cast<std::size_t>(r)].data(), first.data(), n * sizeof(double)) == 0);
            for (std::size_t i = 0; i < n; ++i)
              CHECK(got[static_cast<std::size_t>(r)][i] ==
                    doctest::Approx(static_cast<double>(a[static_cast<std::size_t>(r / gs)][i])).epsilon(1e-12).scale(8));
          }
        }
      }
}

TEST_CASE("sharded gossip: one-peer exponential reaches the exact average after log2(groups) rounds; bytes per rank") {
  for (const auto& item : std::vector<std::pair<int, int>>{{8, 2}, {16, 4}, {16, 2}, {32, 8}}) {
    const auto& p = item.first;
    const auto& gs = item.second;
    const int groups = p / gs;
    int rounds = 0;
    while ((1 << rounds) < groups) ++rounds;
    const std::size_t n = 1001; // not divisible by any group size here
    std::vector<round_report> reps;
    const auto got = run_rounds<double>(p, gs, one_peer_exponential(groups), n, static_cast<std::uint64_t>(rounds), &reps);
    INFO("p=" << p << " group size " << gs);
    for (std::size_t i = 0; i < n; ++i) {
      long double avg = 0;
      for (int r = 0; r < p; ++r) avg += ref::input(r, i);
      avg /= p;
      for (int r = 0; r < p; ++r) CHECK(got[static_cast<std::size_t>(r)][i] == doctest::Approx(static_cast<double>(avg)).epsilon(1e-13));
    }
    // One neighbour per round, one block each: a rank sends about n / gs elements, not n.
    const partition blocks{n, static_cast<std::size_t>(gs)};
    for (int r = 0; r < p; ++r)
      CHECK(reps[static_cast<std::size_t>(r)].bytes_sent == blocks.size(static_cast<std::size_t>(r % gs)) * sizeof(double));
  }
}

TEST_CASE("sharded gossip: float and integer vectors, bitwise equal inside groups") {
  const int p = 12, gs = 3;
  const graph g = ring(p / gs);
  const auto f = run_rounds<float>(p, gs, g, 37, 2);
  const auto i = run_rounds<std::int32_t>(p, gs, g, 37, 2);
  for (int r = 0; r < p; ++r) {
    CHECK(std::memcmp(f[static_cast<std::size_t>(r)].data(), f[static_cast<std::size_t>(r / gs * gs)].data(), 37 * sizeof(float)) == 0);
    CHECK(i[static_cast<std::size_t>(r)] == i[static_cast<std::size_t>(r / gs * gs)]);
  }
  // Integers: the average is rounded, so the values stay within the inputs' range.
  for (const auto& v : i)
    for (const std::int32_t e : v) CHECK(std::abs(e) <= 7);
}

TEST_CASE("sharded gossip: unequal groups, a groups' graph of the wrong size and no groups are rejected") {
  ref::check_bad_groups_rejected("sharded_neighbor_allreduce", [](inproc::communicator& c, std::span<float> x, const graph& g, int gs) {
    sharded_neighbor_allreduce(c, x, g, 0, gs);
  });
}
