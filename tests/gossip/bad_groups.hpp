// The rejection check hierarchical and sharded gossip share: on 7 inproc
// ranks, unequal groups (3, 3, 1), a groups' graph of the wrong size and no
// groups at all (group size 0 on a transport without node_of) each fail on
// every rank with an error that says which, and nothing hangs.
#pragma once

#include <doctest/doctest.h>

#include <gradsync/collectives.hpp>
#include <gradsync/gossip/topology.hpp>
#include <gradsync/transport/inproc.hpp>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace gradsync::test::gossip_ref {

/// round(c, x, graph, group_size) runs one round of the operation `name`.
template <class Round> void check_bad_groups_rejected(const std::string& name, Round round) {
  const int p = 7;
  std::mutex mu;
  std::vector<std::string> why;
  inproc::run(p, [&](inproc::communicator& c) {
    c.group().set_timeout(std::chrono::seconds(10));
    std::vector<float> x(4, 1.0f);
    for (const auto& [g, gs] : std::vector<std::pair<gossip::graph, int>>{
             {gossip::ring(3), 3}, {gossip::ring(4), 7}, {gossip::ring(7), 0}}) {
      try {
        round(c, std::span<float>(x), g, gs);
      } catch (const error& e) {
        std::lock_guard lk(mu);
        why.push_back(e.what());
      }
    }
    gradsync::barrier(c);
  });
  REQUIRE(why.size() == 3 * p);
  int unequal = 0, size = 0, none = 0;
  for (const auto& w : why) {
    CHECK(w.find(name) != std::string::npos);
    unequal += w.find("groups differ in size (3 and 1 ranks)") != std::string::npos;
    size += w.find("spans 4 ranks, the communicator 1") != std::string::npos;
    none += w.find("needs groups") != std::string::npos;
  }
  CHECK(unequal == p);
  CHECK(size == p);
  CHECK(none == p);
}

} // namespace gradsync::test::gossip_ref
