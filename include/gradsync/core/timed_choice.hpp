// gradsync: picks the faster of two interchangeable ways of running a call,
// from the calls' own measured times, and keeps checking the other way.
//
// Used where which way is faster depends on the machine's state rather than
// on the call: on a VM whose two vCPUs the hypervisor moves between cores
// that do and do not share a cache, the shm arena's staging copies run 2x
// faster with ordinary stores in one state and 3-4x slower in the other, and
// the state flips within minutes (docs/benchmarks.md). A one-off calibration
// would be stale; this re-measures the way not taken, rarely while it keeps
// losing (at most one call in policy::timed_choice_max_period) and at once
// again after a switch.
//
// Results must not depend on the choice (both ways compute the same bytes);
// only time does. Per communicator and rank: no shared or global state.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "error.hpp"
#include "policy.hpp"

namespace gradsync::detail {

class timed_choice {
public:
  /// Independent kinds of call (e.g. collective x power-of-two size: eight
  /// kinds of shm_direct call, algo/shm_direct.hpp's detail::call).
  static constexpr std::size_t classes = 8 * 64;

  /// `forced` 0 or 1 always picks that way; -1 (default) measures.
  explicit timed_choice(int forced = -1) : forced_(forced) {}

  /// Parses a setting: "auto" -> -1, `way0` -> 0, `way1` -> 1; anything else
  /// is an error of `op` on `rank` naming the setting `what`.
  static int parse(std::string_view v, std::string_view way0, std::string_view way1, const char* op, int rank,
                   std::string_view what) {
    if (v.empty() || v == "auto") return -1;
    if (v == way0) return 0;
    if (v == way1) return 1;
    throw error(op, rank, -1,
                std::string(what) + "=\"" + std::string(v) + "\" is not one of auto, " + std::string(way0) + ", " +
                    std::string(way1));
  }

  /// A cheap monotonic clock for record() (only ratios matter): the TSC on
  /// x86-64 (a few ns; invariant on the CPUs we run on), else steady_clock ns.
  static std::uint64_t ticks() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return __builtin_ia32_rdtsc();
#else
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
#endif
  }

  /// Which way (0 or 1) the next call of class `k` should run.
  int pick(std::size_t k) {
    if (forced_ >= 0) return forced_;
    slot& s = at(k);
    ++s.calls;
    if (s.calls <= 1) return s.best; // cold (page faults, first touch): not recorded
    if (!s.seen[0]) return 0;
    if (!s.seen[1]) return 1;
    return s.calls >= s.next_check ? 1 - s.best : s.best;
  }

  /// Reports that the call of class `k` just picked ran way `w` for
  /// `cost` (time in any unit, the same for every call of the class).
  void record(std::size_t k, int w, double cost) {
    if (forced_ >= 0) return;
    slot& s = at(k);
    if (s.calls <= 1) return;
    const int o = 1 - w;
    if (w != s.best || !s.seen[w]) {
      // A probe of the way not taken (or a first sample): its time replaces
      // what we knew, which may be from a different machine state.
      s.t[w] = cost;
      s.seen[w] = true;
      if (!s.seen[o]) return;
      if (w != s.best && s.t[w] < s.t[s.best]) {
        s.best = static_cast<std::uint8_t>(w);
        s.period = policy::timed_choice_min_period; // things changed: look again soon
      } else {
        s.period = std::min(2 * s.period, policy::timed_choice_max_period);
      }
      s.next_check = s.calls + s.period;
      return;
    }
    // The way in use: smooth out noise, and give up on it as soon as it is
    // slower than the other way was when last measured.
    s.t[w] += (cost - s.t[w]) * policy::timed_choice_weight;
    if (s.t[w] > s.t[o]) {
      s.best = static_cast<std::uint8_t>(o);
      s.period = policy::timed_choice_min_period;
      s.next_check = s.calls + s.period;
    }
  }

  /// The way calls of class `k` use now (no side effects).
  int current(std::size_t k) const { return forced_ >= 0 ? forced_ : at(k).best; }

private:
  struct slot {
    double t[2] = {0, 0};
    std::uint64_t calls = 0, next_check = 0, period = policy::timed_choice_min_period;
    bool seen[2] = {false, false};
    std::uint8_t best = 0;
  };
  slot& at(std::size_t k) { return slots_[k % classes]; }
  const slot& at(std::size_t k) const { return slots_[k % classes]; }

  int forced_;
  std::array<slot, classes> slots_{};
};

} // namespace gradsync::detail
