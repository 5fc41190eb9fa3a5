// gradsync: the shared-memory transport's collective arena (see
// transport/shm.hpp), the machinery behind the communicator's arena_*
// members that algo/shm_direct.hpp builds on. Each rank owns a slice of
// staging in the segment that only it writes, plus monotonic progress
// counters it publishes (release) and every rank reads (acquire), and one
// call signature per arena half (the control block is in layout.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "../../core/cross_memory.hpp"
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
  std::byte* note(int q, int h) const { return e_->seg().actl(q).note[h]; }
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

  /// The counter every rank posts once, when the group forms (algo/shm_direct.hpp uses 0-2).
  static constexpr int joined = 3;

  /// Agrees, when the group forms, on the smallest call that collectives
  /// read straight from peers' memory (core/cross_memory.hpp): this rank
  /// offers `want` if it can read every peer's probe word (else cma::never),
  /// publishes it, waits for every rank's offer and keeps the largest, so all
  /// ranks take the same path (a lone rank never needs it).
  void agree_single_copy(std::uint64_t want) {
    const auto& seg = e_->seg();
    const int me = e_->rank(), p = e_->size();
    if (p == 1) want = cma::never;
    for (int q = 0; q < p && want != cma::never; ++q)
      if (q != me && !cma::probe(seg.slot(q).pid.load(std::memory_order_relaxed),
                                 seg.slot(q).probe_word.load(std::memory_order_relaxed)))
        want = cma::never;
    seg.slot(me).single_copy_min.store(want, std::memory_order_relaxed); // released by post()
    post(joined, 1);
    await(joined, 1, "shm.communicator");
    single_copy_min_ = 0;
    for (int q = 0; q < p; ++q)
      single_copy_min_ = std::max<std::uint64_t>(single_copy_min_, seg.slot(q).single_copy_min.load(std::memory_order_relaxed));
  }
  /// What agree_single_copy() settled on.
  std::uint64_t single_copy_min() const noexcept { return single_copy_min_; }

  /// Copies into this rank's arena with streaming stores.
  static void copy(std::byte* dst, const std::byte* src, std::size_t n) {
    gradsync::detail::stream_copy(dst, src, n);
  }

private:
  std::shared_ptr<engine> e_;
  std::uint64_t epoch_ = 0; // arena rounds this group has completed
  gradsync::detail::timed_choice stores_; // how shm_direct writes the arena (per rank)
  std::uint64_t single_copy_min_ = cma::never;
};

} // namespace gradsync::shm::detail
