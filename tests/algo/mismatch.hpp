// What ranks saw when a call failed, for the call-agreement tests
// (tests/algo/test_verify.cpp, tests/gossip/test_verify.cpp): run a body on
// p inproc ranks, each catching its own gradsync::error, and check that all
// raised the same errc::mismatch.
#pragma once

#include <gradsync/core/error.hpp>
#include <gradsync/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace gradsync::test {

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// What one rank saw: nothing, or a gradsync::error (kind, op, reason).
struct seen {
  bool threw = false;
  errc kind = errc::internal;
  std::string op, reason;
};

// Runs body on p ranks, each catching its own gradsync::error.
inline std::vector<seen> run_each(int p, const std::function<void(inproc::communicator&)>& body,
                           std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  std::vector<seen> out(static_cast<std::size_t>(p));
  inproc::run(p, [&](inproc::communicator& c) {
    c.set_timeout(timeout);
    try {
      body(c);
    } catch (const error& e) {
      out[static_cast<std::size_t>(c.rank())] = {true, e.kind(), e.op(), e.reason()};
    }
  });
  return out;
}

// Every rank raised the same mismatch error from `op`, containing `part`.
inline void expect_same_mismatch(const std::vector<seen>& s, const std::string& op, const std::string& part) {
  for (std::size_t q = 0; q < s.size(); ++q) {
    INFO("rank " << q << ": " << s[q].op << ": " << s[q].reason);
    REQUIRE(s[q].threw);
    CHECK(s[q].kind == errc::mismatch);
    CHECK(s[q].op == op);
    CHECK(s[q].reason == s[0].reason);
    CHECK(contains(s[q].reason, part));
  }
}

} // namespace gradsync::test
