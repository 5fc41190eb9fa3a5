// A check every failure test of the exchanges uses: a job on p fresh
// inproc ranks in which every rank must fail with one kind of error.
#pragma once

#include <doctest/doctest.h>

#include <gradsync/core/error.hpp>
#include <gradsync/transport/inproc.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace gradsync::test {

// Runs body on p fresh ranks; every rank must fail with an error of `kind`
// whose text contains `part`.
inline void expect_all_fail(int p, errc kind, const std::string& part, const std::function<void(inproc::communicator&)>& body) {
  std::vector<std::string> what(static_cast<std::size_t>(p));
  std::vector<int> kinds(static_cast<std::size_t>(p), -1);
  try {
    inproc::run(p, [&](inproc::communicator& c) {
      c.group().set_timeout(std::chrono::seconds(5));
      try {
        body(c);
      } catch (const error& e) {
        what[static_cast<std::size_t>(c.rank())] = e.what();
        kinds[static_cast<std::size_t>(c.rank())] = static_cast<int>(e.kind());
      }
    });
  } catch (const std::exception& e) {
    FAIL("inproc::run threw: " << e.what());
  }
  for (int r = 0; r < p; ++r) {
    INFO("rank " << r << ": " << what[static_cast<std::size_t>(r)]);
    CHECK(kinds[static_cast<std::size_t>(r)] == static_cast<int>(kind));
    CHECK(what[static_cast<std::size_t>(r)].find(part) != std::string::npos);
  }
}

} // namespace gradsync::test
