// gradsync::error formatting, require(), partition and mod; policy limits.
#include <doctest/doctest.h>

#include <gradsync/core/error.hpp>
#include <gradsync/core/partition.hpp>
#include <gradsync/core/policy.hpp>

#include <string>
#include <utility>
#include <vector>

using gradsync::error;
using gradsync::partition;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
} // namespace

TEST_CASE("error: message names op, rank, peer and reason") {
  const error e("allreduce", 3, 5, "output too small");
  const std::string m = e.what();
  CHECK(m == "gradsync: allreduce (rank 3, peer 5): output too small");
  CHECK(e.op() == "allreduce");
  CHECK(e.rank() == 3);
  CHECK(e.peer() == 5);
  CHECK(e.reason() == "output too small");

  CHECK(std::string(error("broadcast", 0, -1, "bad root").what()) == "gradsync: broadcast (rank 0): bad root");
  CHECK(std::string(error("codec.decode", -1, -1, "truncated").what()) == "gradsync: codec.decode: truncated");
  CHECK(std::string(error("x", -1, 2, "r").what()) == "gradsync: x (peer 2): r");
  // an error is a std::runtime_error, so generic handlers see the full message
  try {
    throw error("reduce", 1, -1, "why");
  } catch (const std::runtime_error& re) {
    CHECK(contains(re.what(), "reduce"));
    CHECK(contains(re.what(), "rank 1"));
    CHECK(contains(re.what(), "why"));
  }
}

TEST_CASE("error: require throws exactly when the condition fails") {
  CHECK_NOTHROW(gradsync::require(true, "op", 0, "never"));
  try {
    gradsync::require(false, "inproc.send", 2, "peer 9 out of range", 9);
    FAIL("require(false) did not throw");
  } catch (const error& e) {
    CHECK(e.op() == "inproc.send");
    CHECK(e.rank() == 2);
    CHECK(e.peer() == 9);
    CHECK(e.reason() == "peer 9 out of range");
    CHECK(contains(e.what(), "inproc.send (rank 2, peer 9)"));
  }
  CHECK_THROWS_AS(gradsync::require(false, "op", 0, "r"), error);
}

namespace {
void check_partition(std::size_t count, std::size_t parts) {
  const partition pt{count, parts};
  INFO("count " << count << " parts " << parts);
  REQUIRE(pt.offset(0) == 0);
  REQUIRE(pt.offset(parts) == count);
  const std::size_t small = count / parts;
  for (std::size_t i = 0; i < parts; ++i) {
    const auto n = pt.size(i);
    // contiguous, no gap or overlap
    REQUIRE(pt.offset(i + 1) - pt.offset(i) == n);
    // near-equal, larger blocks first
    REQUIRE(n == (i < count % parts ? small + 1 : small));
  }
}
} // namespace

TEST_CASE("partition: blocks cover the range exactly") {
  for (std::size_t count = 0; count <= 300; ++count)
    for (std::size_t parts = 1; parts <= 40; ++parts) check_partition(count, parts);
  for (const std::size_t count : {std::size_t{1'000'003}, std::size_t{1} << 40, (std::size_t{1} << 40) + 12345})
    for (const std::size_t parts : {1, 2, 3, 7, 16, 1000, 65537}) check_partition(count, parts);
  // a huge count near the top of size_t does not overflow in offset()
  const std::size_t huge = static_cast<std::size_t>(-1) - 5;
  check_partition(huge, 7);
  check_partition(huge, 1);
  // default: everything in one block
  const partition d{};
  CHECK(d.size(0) == 0);
  CHECK(partition{5}.size(0) == 5);
}

TEST_CASE("partition: mod is the mathematical modulo") {
  CHECK(gradsync::mod(0, 4) == 0);
  CHECK(gradsync::mod(5, 4) == 1);
  CHECK(gradsync::mod(-1, 4) == 3);
  CHECK(gradsync::mod(-4, 4) == 0);
  CHECK(gradsync::mod(-9, 4) == 3);
  CHECK(gradsync::mod(-1, 1) == 0);
  for (long long a = -50; a <= 50; ++a)
    for (int p = 1; p <= 9; ++p) {
      const int m = gradsync::mod(a, p);
      REQUIRE(m >= 0);
      REQUIRE(m < p);
      REQUIRE((a - m) % p == 0);
    }
}

TEST_CASE("policy: the framed check's limit grows with the separate round's steps, ceil(log2 p)") {
  // 4 KiB per step of the round it replaces; one step below 3 ranks.
  const std::pair<int, std::size_t> want[] = {{1, 4096},  {2, 4096},   {3, 8192},   {4, 8192},  {5, 12288},
                                              {8, 12288}, {9, 16384},  {16, 16384}, {17, 20480}, {256, 32768},
                                              {257, 36864}, {1000, 40960}, {1024, 40960}, {1025, 45056}};
  for (const auto& w : want) {
    INFO("p=" << w.first);
    CHECK(gradsync::policy::mpi_framed_max_bytes_on(w.first) == w.second);
  }
}
