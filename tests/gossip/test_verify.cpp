// Call agreement of the gossip operations: ranks that disagree on the count,
// the dtype, the step of a dynamic graph, the graph itself or CHOCO's codec
// and step size all raise one errc::mismatch error from the operation,
// naming the ranks; the communicator then fails fast; agreeing calls with
// the check forced on give the closed-form average.
#include <gradsync/gossip/choco.hpp>
#include <gradsync/gossip/neighbor_allreduce.hpp>
#include <gradsync/gossip/push_sum.hpp>
#include <gradsync/transport/inproc.hpp>

#include "../algo/mismatch.hpp"

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

using namespace gradsync;
using namespace gradsync::gossip;
using namespace std::chrono_literals;
using gradsync::test::expect_same_mismatch;
using gradsync::test::run_each;
using gradsync::test::seen;

namespace {

gossip_options checked() {
  gossip_options o;
  o.collective.verify = verification::always;
  return o;
}

} // namespace

TEST_CASE("gossip verify: a rank with another count makes every rank raise the same mismatch") {
  const int p = 4;
  const graph g = ring(p);
  const auto s = run_each(p, [&](inproc::communicator& c) {
    std::vector<float> x(c.rank() == 2 ? 9 : 8, 1.0f);
    neighbor_allreduce(c, std::span<float>(x), g, 0, checked());
  });
  expect_same_mismatch(s, "neighbor_allreduce", "count differs (ranks 0, 1, 3: 8; rank 2: 9)");
}

TEST_CASE("gossip verify: ranks on different steps of a dynamic graph, or on different graphs, are named") {
  const int p = 4;
  const graph dyn = one_peer_exponential(p);
  const auto s = run_each(p, [&](inproc::communicator& c) {
    std::vector<double> x(16, c.rank());
    neighbor_allreduce(c, std::span<double>(x), dyn, c.rank() == 3 ? 1 : 0, checked());
  });
  expect_same_mismatch(s, "neighbor_allreduce", "topology, step or codec differs (ranks 0-2: #");

  // A static graph at a different step: the same matrix, but global
  // averaging and dynamic graphs depend on the step, so it is a mismatch.
  const graph st = ring(p);
  const auto t = run_each(p, [&](inproc::communicator& c) {
    std::vector<double> x(16, c.rank());
    neighbor_allreduce(c, std::span<double>(x), st, c.rank() == 0 ? 5 : 4, checked());
  });
  expect_same_mismatch(t, "neighbor_allreduce", "rank 0: #");

  const graph a = ring(p), b = torus(2, 2);
  const auto u = run_each(p, [&](inproc::communicator& c) {
    std::vector<float> x(16, 1.0f);
    neighbor_allreduce(c, std::span<float>(x), c.rank() == 1 ? b : a, 0, checked());
  });
  expect_same_mismatch(u, "neighbor_allreduce", "topology, step or codec differs");
}

TEST_CASE("gossip verify: push_sum with another dtype on one rank; the communicator then fails fast") {
  const int p = 3;
  const graph g = directed_ring(p);
  std::vector<seen> after(p);
  const auto s = run_each(p, [&](inproc::communicator& c) {
    double w = 1.0;
    try {
      if (c.rank() == 1) {
        std::vector<double> x(32, 1.0), e(32);
        push_sum(c, std::span<double>(x), w, g, 0, std::span<double>(e), checked());
      } else {
        std::vector<float> x(32, 1.0f), e(32);
        push_sum(c, std::span<float>(x), w, g, 0, std::span<float>(e), checked());
      }
    } catch (const error&) {
      std::vector<float> x(32, 1.0f), e(32);
      try {
        push_sum(c, std::span<float>(x), w, g, 1, std::span<float>(e), checked());
      } catch (const error& e2) {
        after[static_cast<std::size_t>(c.rank())] = {true, e2.kind(), e2.op(), e2.reason()};
      }
      throw;
    }
  });
  expect_same_mismatch(s, "push_sum", "dtype differs (ranks 0, 2: f32; rank 1: f64)");
  for (const auto& a : after) {
    REQUIRE(a.threw);
    CHECK(a.kind == errc::aborted);
    CHECK(a.reason.find("must be rebuilt") != std::string::npos);
  }
}

TEST_CASE("gossip verify: CHOCO ranks with another step size or codec are named") {
  const int p = 4;
  const graph g = ring(p);
  for (const bool codec : {false, true}) {
    const auto s = run_each(p, [&](inproc::communicator& c) {
      std::vector<float> x(64, static_cast<float>(c.rank()));
      choco_state<float> st;
      choco_config z;
      if (c.rank() == 2) {
        if (codec) z.codec = compress::parse_spec("int4");
        else z.gamma = 0.25;
      }
      choco_gossip(c, std::span<float>(x), g, st, z, checked());
    });
    expect_same_mismatch(s, "choco_gossip", "topology, step or codec differs (ranks 0, 1, 3: #");
  }
}

TEST_CASE("gossip verify: agreeing calls with the check on give the exact average (one-peer exponential)") {
  for (const int p : {2, 4, 8}) {
    const graph g = one_peer_exponential(p);
    std::vector<std::vector<double>> out(static_cast<std::size_t>(p));
    inproc::run(p, [&](inproc::communicator& c) {
      std::vector<double> x(100, static_cast<double>(c.rank()));
      for (std::uint64_t k = 0; k < g.period(); ++k) neighbor_allreduce(c, std::span<double>(x), g, k, checked());
      out[static_cast<std::size_t>(c.rank())] = x;
    });
    const double mean = (p - 1) / 2.0; // average of 0..p-1, exact in binary for these p
    for (const auto& x : out)
      for (const double v : x) CHECK(v == mean);
  }
}
