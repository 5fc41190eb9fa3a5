// GRADSYNC_ALGO (set by meson to "tree:0-64K;rd:64K-max") overrides the
// schedule of a default automatic allreduce, one without a selector, as the
// README says; sizes outside its ranges and other collectives keep the model.
#include "harness.hpp"

#include <cstdlib>

using namespace gradsync;

TEST_CASE("GRADSYNC_ALGO pins the schedule of default automatic allreduces") {
  const char* env = std::getenv("GRADSYNC_ALGO");
  REQUIRE(env != nullptr);
  REQUIRE(std::string(env) == "tree:0-64K;rd:64K-max");
  inproc::run(4, [](inproc::communicator& c) {
    CHECK(allreduce_algorithm<float>(c, 16) == algorithm::tree);
    CHECK(allreduce_algorithm<float>(c, (64 << 10) / 4 - 1) == algorithm::tree);
    CHECK(allreduce_algorithm<float>(c, (64 << 10) / 4) == algorithm::rd);
    CHECK(allreduce_algorithm<float>(c, 1 << 22) == algorithm::rd);
    // A caller's own selector is its own: no table unless it reads one.
    const selector mine;
    options o;
    o.select = &mine;
    CHECK(allreduce_algorithm<float>(c, 1 << 22, o) == mine.cheapest(std::size_t{4} << 22, topology_of(c), o.segment()));
    // And the pinned schedules give the right sums.
    for (const std::size_t n : {std::size_t{5}, std::size_t{70000}}) {
      std::vector<std::int32_t> v(n, c.rank() + 1);
      allreduce(c, std::span<std::int32_t>(v), op::sum{});
      for (const auto x : v) REQUIRE(x == 10);
    }
  });
}
