// gradsync: the shared-memory transport's collective arena (see
// transport/shm.hpp), the machinery behind the communicator's arena_*
// members that algo/shm_direct.hpp builds on. Each rank owns a slice of
// staging in the segment that only it writes, plus monotonic progress
// counters it publishes (release) and every rank reads (acquire), and one
// call signature per arena half (the control block is in layout.hpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "../../core/error.hpp"
#include "../../core/futex.hpp"
#include "../../core/stream_copy.hpp"
#include "../../core/timed_choice.hpp"
#include "engine.hpp"
#include "layout.hpp"

namespace gradsync::shm::detail {

/// One rank's view of every rank's arena, over its engine (which blocks and
/// detects failures for it).
class collective_arena {
public:
  collective_arena() = default;
  /// `stores`: timed_choice's forced choice (-1 measure, 0 stream, 1 plain).
  collective_arena(std::shared_ptr<engine> e, int stores) : e_(std::move(e)), stores_(stores) {}

  std::byte* base(int q) const { return e_->seg().arena(q); }
  std::size_t bytes() const noexcept { return e_->seg().arena_bytes(); }
  std::atomic<std::uint64_t>& signature(int q, int h) const { return e_->seg().actl(q).sig[h]; }
  std::uint64_t& epoch() noexcept { return epoch_; }
  gradsync::detail::timed_choice& stores() noexcept { return stores_; }

  /// Sets this rank's counter `k` to `v` and wakes sleeping peers.
  void post(int k, std::uint64_t v) {
    const auto& seg = e_->seg();
    const int me = e_->rank();
    seg.actl(me).counter[k].v.store(v, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (int q = 0; q < e_->size(); ++q) {
      auto& sl = seg.slot(q);
      if (q != me && sl.sleeping.load(std::memory_order_relaxed)) {
        sl.bell.fetch_add(1, std::memory_order_release);
        gradsync::detail::futex_wake(sl.bell);
      }
    }
  }

  /// Blocks until counter `k` of every rank is at least `v`.
  void await(int k, std::uint64_t v, const char* op) {
    const auto& seg = e_->seg();
    auto reached = [&] {
      for (int q = 0; q < e_->size(); ++q)
        if (seg.actl(q).counter[k].v.load(std::memory_order_acquire) < v) return false;
      return true;
    };
    if (reached()) return;
    auto f = e_->wait_for(reached);
    if (f.why.empty()) return;
    // The arena's rounds can no longer line up across ranks: fail them all.
    e_->fail_group("rank " + std::to_string(e_->rank()) + " in " + op + ": " + f.why);
    throw error(f.kind, op, e_->rank(), -1, f.why);
  }

  /// Copies into this rank's arena with streaming stores.
  static void copy(std::byte* dst, const std::byte* src, std::size_t n) {
    gradsync::detail::stream_copy(dst, src, n);
  }

private:
  std::shared_ptr<engine> e_;
  std::uint64_t epoch_ = 0; // arena rounds this group has completed
  gradsync::detail::timed_choice stores_; // how shm_direct writes the arena (per rank)
};

} // namespace gradsync::shm::detail
