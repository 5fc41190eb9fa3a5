// core/timed_choice.hpp: which way calls take, given the times they report.
// Times are synthetic (a function of the way and the call), so every pick is
// checked against the schedule the header documents, worked out here.
#include <doctest/doctest.h>

#include <gradsync/core/error.hpp>
#include <gradsync/core/policy.hpp>
#include <gradsync/core/timed_choice.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace {

using gradsync::detail::timed_choice;
namespace policy = gradsync::policy;

// Runs `n` calls of class k; cost(w, call) is the time a call on way w takes.
// Returns the way of each call (index 0 = call 1).
std::vector<int> run(timed_choice& tc, std::size_t k, int n, const std::function<double(int, int)>& cost) {
  std::vector<int> ways;
  for (int i = 1; i <= n; ++i) {
    const int w = tc.pick(k);
    REQUIRE((w == 0 || w == 1));
    tc.record(k, w, cost(w, i));
    ways.push_back(w);
  }
  return ways;
}

// Calls (1-based) after call `from` up to `n` on which the losing way is
// probed, when the winner was (re)established on call `from`: a probe every
// period calls, the period starting at the minimum and doubling after each
// lost probe up to the maximum.
std::vector<int> probes_after(int from, int n) {
  std::vector<int> at;
  std::uint64_t period = policy::timed_choice_min_period;
  for (std::uint64_t c = static_cast<std::uint64_t>(from) + period; c <= static_cast<std::uint64_t>(n); c += period) {
    at.push_back(static_cast<int>(c));
    period = std::min(2 * period, policy::timed_choice_max_period);
  }
  return at;
}

// Calls on way 0 when way 1 is always faster: call 1 (cold, unrecorded, the
// default way 0), call 2 (way 0's first sample); call 3 measures way 1,
// which wins; then the probes.
std::vector<int> probe_calls(int n) {
  std::vector<int> at{1, 2};
  for (int c : probes_after(3, n)) at.push_back(c);
  return at;
}

} // namespace

TEST_CASE("timed_choice: a forced way is always taken, whatever the times") {
  for (int f : {0, 1}) {
    timed_choice tc(f);
    const auto ways = run(tc, 3, 500, [](int w, int) { return w == 0 ? 1.0 : 100.0; });
    for (int w : ways) CHECK(w == f);
    CHECK(tc.current(3) == f);
  }
}

TEST_CASE("timed_choice: the faster way wins, the other is probed on the documented schedule") {
  timed_choice tc;
  const int n = 20000;
  const auto ways = run(tc, 7, n, [](int w, int) { return w == 1 ? 1.0 : 3.7; });
  const std::vector<int> probes = probe_calls(n);
  std::vector<int> on_zero;
  for (int i = 0; i < n; ++i)
    if (ways[static_cast<std::size_t>(i)] == 0) on_zero.push_back(i + 1);
  CHECK(on_zero == probes);
  // Long-run overhead: one probe per max period.
  CHECK(static_cast<double>(probes.size()) < 8.0 + n / static_cast<double>(policy::timed_choice_max_period));
  CHECK(tc.current(7) == 1);
  // Another class has seen nothing: it starts from way 0.
  CHECK(tc.current(8) == 0);
}

TEST_CASE("timed_choice: when the way in use slows down past the other's last time, it switches at once") {
  timed_choice tc;
  // Way 0 costs 1 and way 1 costs 2 for 1000 calls; then way 0 costs 4.
  const int flip = 1000;
  const auto ways = run(tc, 0, flip + 50, [&](int w, int i) { return w == 1 ? 2.0 : (i <= flip ? 1.0 : 4.0); });
  CHECK(ways[flip - 1] == 0);
  // The average of way 0 moves by the weight per call: 1 -> 1.75 -> 2.3125 > 2.
  double avg = 1.0;
  int calls_on_zero_after = 0;
  while (avg <= 2.0) {
    avg += (4.0 - avg) * policy::timed_choice_weight;
    ++calls_on_zero_after;
  }
  for (int i = 0; i < calls_on_zero_after; ++i) CHECK(ways[static_cast<std::size_t>(flip + i)] == 0);
  CHECK(ways[static_cast<std::size_t>(flip + calls_on_zero_after)] == 1);
  CHECK(tc.current(0) == 1);
}

TEST_CASE("timed_choice: when the way not taken speeds up, the next probe finds it") {
  timed_choice tc;
  // Way 1 costs 2 throughout; way 0 costs 4 until call 3000, then 1.
  const int flip = 3000, n = flip + 2 * static_cast<int>(policy::timed_choice_max_period) + 2;
  const auto ways = run(tc, 5, n, [&](int w, int i) { return w == 1 ? 2.0 : (i <= flip ? 4.0 : 1.0); });
  // Before the flip way 0 is only probed (the schedule above).
  const std::vector<int> probes = probe_calls(flip);
  for (int i = 1; i <= flip; ++i) {
    const bool probe = std::find(probes.begin(), probes.end(), i) != probes.end();
    CHECK(ways[static_cast<std::size_t>(i - 1)] == (probe ? 0 : 1));
  }
  // After it: the first probe at or after the flip switches for good.
  int first = 0;
  for (int c = probes.back() + static_cast<int>(policy::timed_choice_max_period); c <= n;
       c += static_cast<int>(policy::timed_choice_max_period))
    if (c > flip) {
      first = c;
      break;
    }
  REQUIRE(first > flip);
  CHECK(first - flip <= static_cast<int>(policy::timed_choice_max_period));
  for (int i = flip + 1; i < first; ++i) CHECK(ways[static_cast<std::size_t>(i - 1)] == 1);
  // ... and from then on way 1 is the one probed, on the same schedule.
  const std::vector<int> back = probes_after(first, n);
  for (int i = first; i <= n; ++i) {
    const bool probe = std::find(back.begin(), back.end(), i) != back.end();
    CHECK(ways[static_cast<std::size_t>(i - 1)] == (probe ? 1 : 0));
  }
}

TEST_CASE("timed_choice: settings parse, and a bad one names itself") {
  CHECK(timed_choice::parse("", "stream", "plain", "op", 0, "X") == -1);
  CHECK(timed_choice::parse("auto", "stream", "plain", "op", 0, "X") == -1);
  CHECK(timed_choice::parse("stream", "stream", "plain", "op", 0, "X") == 0);
  CHECK(timed_choice::parse("plain", "stream", "plain", "op", 0, "X") == 1);
  for (const char* bad : {"Plain", "streams", "1", " auto"}) {
    try {
      timed_choice::parse(bad, "stream", "plain", "shm.communicator", 3, "GRADSYNC_SHM_STORES");
      FAIL("accepted " << bad);
    } catch (const gradsync::error& e) {
      const std::string m = e.what();
      CHECK(m.find("GRADSYNC_SHM_STORES") != std::string::npos);
      CHECK(m.find(std::string("\"") + bad + "\"") != std::string::npos);
      CHECK(m.find("shm.communicator") != std::string::npos);
      CHECK(e.rank() == 3);
    }
  }
}
