// gradsync: what a communicator remembers of the collectives run on it. Per
// tag, how many calls have started (the sequence number in a call's
// fingerprint, algo/verify.hpp); and the first failure, after which every
// collective on the communicator fails at once until it is rebuilt: the
// failed call may have left unmatched messages that the next call would
// otherwise receive as its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace gradsync {

struct call_fingerprint; // algo/verify.hpp

/// Per-communicator bookkeeping of collective calls (thread-safe). A
/// transport holding one exposes it as `call_record& calls()` (capability
/// `recorded`, transport/capabilities.hpp).
class call_record {
public:
  call_record() = default;
  call_record(call_record&& o) noexcept {
    std::lock_guard g(o.m_);
    seq_ = std::move(o.seq_);
    failed_ = std::move(o.failed_);
    any_.store(o.any_.load());
  }
  call_record& operator=(call_record&& o) noexcept {
    if (this != &o) {
      std::scoped_lock g(m_, o.m_);
      seq_ = std::move(o.seq_);
      failed_ = std::move(o.failed_);
      any_.store(o.any_.load());
    }
    return *this;
  }

  /// The sequence number of this call among the calls with `tag` (0, 1, ...).
  /// Counted per tag: calls on one tag are ordered on every rank (their
  /// messages would mix otherwise), calls on different tags may run
  /// concurrently from several threads in any order.
  std::uint64_t next(int tag) {
    std::lock_guard g(m_);
    for (auto& [t, n] : seq_)
      if (t == tag) return n++;
    seq_.emplace_back(tag, 1);
    return 0;
  }

  /// Records a failure; the first one is kept (later ones are consequences).
  void fail(const std::string& what) {
    std::lock_guard g(m_);
    if (failed_.empty()) failed_ = what.empty() ? "failed" : what;
    any_.store(true, std::memory_order_release);
  }
  /// Whether a call has failed (one atomic load: checked by every call).
  bool failed() const noexcept { return any_.load(std::memory_order_acquire); }
  /// The first failure's message, empty if none.
  std::string failure() const {
    std::lock_guard g(m_);
    return failed_;
  }

  /// The fingerprint the running call checks in band: set by the collective
  /// (detail::run_call) for the length of a call whose schedule publishes it
  /// in its own first synchronisation (algo/shm_direct.hpp), null otherwise.
  /// Such calls use the transport's one collective arena, so they run one at
  /// a time per communicator.
  const call_fingerprint* inband() const noexcept { return inband_; }
  void set_inband(const call_fingerprint* f) noexcept { inband_ = f; }

private:
  mutable std::mutex m_;
  std::vector<std::pair<int, std::uint64_t>> seq_;
  std::string failed_;
  std::atomic<bool> any_{false};
  const call_fingerprint* inband_ = nullptr;
};

} // namespace gradsync
