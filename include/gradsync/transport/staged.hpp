// gradsync: device buffers over a host transport, staged through pinned host
// memory. staged<C, M> wraps any transport C (inproc, shm, mpi) and models
// device_memory: a send of a device range is copied into a pinned staging
// block and sent from there; a receive lands in a staging block and is copied
// to the device range when it completes. Host ranges (the call check's
// records, a host executor's buffers) go straight through. The schedules stay
// the same code: they post segments, and every segment is one message of the
// inner transport, so a pipelined schedule overlaps one segment's copy with
// the transfers of the segments it has in flight.
//
// The copies are the copier's (concept device_copier): cuda_copier
// (transport/cuda_staging.cuh) with cudaMemcpyAsync on the caller's stream,
// or any other that moves bytes between its "device" and host memory. A send
// copies before it is posted (the inner transport reads the block from the
// start); a receive copies before its wait returns (the schedule's next step
// may read the range from the host side, e.g. forward it). Blocks come from a
// pool kept per communicator (sizes rounded to powers of two), and go back
// when their request completes; a request abandoned while its inner operation
// may still read or write its block (a failed call) leaves the block to the
// pool's end, never to reuse.
//
// Capabilities forwarded from C where it has them: receive up to a capacity,
// node map, abort, timeout, timeline, call record, the MPI in-band check (its
// framing then wraps the staging block) and the in-process record board. A
// transport that takes device pointers itself (takes_device_now(): a
// CUDA-aware MPI, outside its framed call check) gets them unstaged. Not
// forwarded: the shared arena (its direct schedules read host memory; device
// memory's direct path is the CUDA-IPC transport's).
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/policy.hpp"
#include "capabilities.hpp"
#include "transport.hpp"

namespace gradsync {

/// What moves bytes between device memory and (pinned) host memory for
/// staged<C, M>. Every copy has completed when the call returns.
/// - `is_device(p)`: whether p points into memory the host cannot read
///   directly (it is then staged; anything else is sent as it is);
/// - `to_host(dst, src, n)` / `to_device(dst, src, n)`: n bytes from device
///   range src to host range dst, and back;
/// - `alloc_host(n)` / `free_host(p, n)`: staging memory (pinned, for a GPU).
template <class M>
concept device_copier = requires(M& m, const M& cm, std::byte* d, const std::byte* s, std::size_t n) {
  { cm.is_device(static_cast<const void*>(s)) } -> std::convertible_to<bool>;
  m.to_host(d, s, n);
  m.to_device(d, s, n);
  { m.alloc_host(n) } -> std::same_as<std::byte*>;
  m.free_host(d, n);
};

namespace detail {

// Staging blocks of one communicator, by size class (powers of two from
// policy::staging_min_block_bytes). Requests share it with the
// communicator, so a request destroyed after it still returns its block.
template <device_copier M> class staging_pool {
public:
  explicit staging_pool(M m) : copier(std::move(m)) {}
  staging_pool(const staging_pool&) = delete;
  staging_pool& operator=(const staging_pool&) = delete;
  ~staging_pool() {
    for (auto& cls : free_)
      for (const block& b : cls) copier.free_host(b.p, b.bytes);
    for (const block& b : orphans_) copier.free_host(b.p, b.bytes);
  }

  struct block {
    std::byte* p = nullptr;
    std::size_t bytes = 0; // the block's size (its class), 0 when none
  };

  /// A block of at least n > 0 bytes.
  block take(std::size_t n) {
    const std::size_t bytes = std::bit_ceil(std::max(n, policy::staging_min_block_bytes));
    const auto cls = static_cast<std::size_t>(std::countr_zero(bytes));
    {
      std::lock_guard g(m_);
      if (cls < free_.size() && !free_[cls].empty()) {
        const block b = free_[cls].back();
        free_[cls].pop_back();
        return b;
      }
    }
    return {copier.alloc_host(bytes), bytes};
  }
  /// Back to the pool: `reusable` when no operation can touch it any more,
  /// else kept aside until the pool ends.
  void give(block b, bool reusable) noexcept {
    if (!b.p) return;
    std::lock_guard g(m_);
    try {
      if (!reusable) {
        orphans_.push_back(b);
        return;
      }
      const auto cls = static_cast<std::size_t>(std::countr_zero(b.bytes));
      if (free_.size() <= cls) free_.resize(cls + 1);
      free_[cls].push_back(b);
    } catch (...) {
      // Out of memory for the bookkeeping: the block leaks, nothing breaks.
    }
  }
  /// Blocks allocated so far that are idle in the pool (tests, diagnostics).
  std::size_t idle_blocks() const {
    std::lock_guard g(m_);
    std::size_t n = 0;
    for (const auto& cls : free_) n += cls.size();
    return n;
  }

  M copier;

private:
  mutable std::mutex m_;
  std::vector<std::vector<block>> free_;
  std::vector<block> orphans_;
};

} // namespace detail

template <transport C, device_copier M> class staged;

/// Completion of a staged send or receive: the inner request, plus the
/// staging block and (receive) the device range the block is copied to.
template <class R, device_copier M> class staged_request {
public:
  staged_request() = default;
  staged_request(staged_request&& o) noexcept { *this = std::move(o); }
  staged_request& operator=(staged_request&& o) noexcept {
    if (this != &o) {
      release(false);
      inner_ = std::move(o.inner_);
      o.inner_.reset();
      pool_ = std::move(o.pool_);
      blk_ = std::exchange(o.blk_, {});
      dev_ = o.dev_;
      done_ = o.done_;
      want_ = o.want_;
      received_ = o.received_;
    }
    return *this;
  }
  staged_request(const staged_request&) = delete;
  staged_request& operator=(const staged_request&) = delete;
  /// A request abandoned before it completed keeps its block out of reuse
  /// (its inner operation may still be in flight).
  ~staged_request() { release(false); }

  /// Blocks until complete; a receive's bytes are in the device range when it returns.
  void wait() {
    if (done_ || !inner_) return;
    inner_->wait();
    finish();
  }
  /// True once complete (as wait()), false while pending.
  bool test() {
    if (done_ || !inner_) return true;
    if (!inner_->test()) return false;
    finish();
    return true;
  }
  /// Bytes received (a receive of up to a capacity, once complete).
  std::size_t received() const noexcept
    requires sized_completion<R>
  {
    return received_;
  }

private:
  template <transport, device_copier> friend class staged;
  staged_request(R inner, std::shared_ptr<detail::staging_pool<M>> pool,
                 typename detail::staging_pool<M>::block blk, std::byte* dev)
      : inner_(std::move(inner)), pool_(std::move(pool)), blk_(blk), dev_(dev) {}

  void finish() {
    std::size_t n = 0;
    if constexpr (sized_completion<R>) n = received_ = inner_->received();
    if (dev_ && blk_.p) {
      if constexpr (!sized_completion<R>) n = want_;
      if (n) {
        try {
          pool_->copier.to_device(dev_, blk_.p, n);
        } catch (const error&) {
          throw;
        } catch (const std::exception& e) {
          throw error(errc::internal, "staged.recv", -1, -1, std::string("staging failed: ") + e.what());
        }
      }
    }
    done_ = true;
    release(true);
  }
  void release(bool complete) noexcept {
    if (pool_ && blk_.p) pool_->give(std::exchange(blk_, {}), complete || done_);
  }

  std::optional<R> inner_;
  std::shared_ptr<detail::staging_pool<M>> pool_;
  typename detail::staging_pool<M>::block blk_{};
  std::byte* dev_ = nullptr; // receive: where the block's bytes go
  std::size_t want_ = 0;     // receive: bytes posted (inner requests that do not report a size)
  std::size_t received_ = 0;
  bool done_ = false;
};

/// Transport C carrying device buffers through pinned host staging (see the
/// file comment). Holds a reference: `inner` must outlive it. Calls on one
/// staged communicator come from one thread at a time, as on C.
template <transport C, device_copier M> class staged {
public:
  static constexpr std::string_view name = "staged";
  static constexpr bool device_memory = true;

  /// `inner` carries the bytes; `copier` stages them (for a GPU:
  /// cuda_copier on the stream the collectives' executor uses).
  explicit staged(C& inner, M copier = M{})
      : inner_(&inner), pool_(std::make_shared<detail::staging_pool<M>>(std::move(copier))) {}

  int rank() const noexcept { return inner_->rank(); }
  int size() const noexcept { return inner_->size(); }
  /// The transport underneath.
  C& inner() const noexcept { return *inner_; }
  /// The copier (e.g. to check pointers the same way the staging does).
  M& copier() const noexcept { return pool_->copier; }
  /// Staging blocks idle in the pool (they are reused, not freed, between calls).
  std::size_t idle_staging_blocks() const { return pool_->idle_blocks(); }

  /// Posts a send of `data` (device or host memory) to `peer` with `tag`.
  auto isend(std::span<const std::byte> data, int peer, int tag) {
    using R = decltype(inner_->isend(data, peer, tag));
    if (data.empty() || !is_device(data.data(), "staged.send", peer))
      return staged_request<R, M>(inner_->isend(data, peer, tag), pool_, {}, nullptr);
    return post<R>("staged.send", data.size(), peer, nullptr, [&](std::byte* blk) {
      copy("staged.send", peer, [&] { pool_->copier.to_host(blk, data.data(), data.size()); });
      return inner_->isend(std::span<const std::byte>(blk, data.size()), peer, tag);
    });
  }
  /// Posts a receive of exactly `data.size()` bytes (device or host memory) from `peer`.
  auto irecv(std::span<std::byte> data, int peer, int tag) {
    using R = decltype(inner_->irecv(data, peer, tag));
    if (data.empty() || !is_device(data.data(), "staged.recv", peer))
      return staged_request<R, M>(inner_->irecv(data, peer, tag), pool_, {}, nullptr);
    return post<R>("staged.recv", data.size(), peer, data.data(),
                   [&](std::byte* blk) { return inner_->irecv(std::span<std::byte>(blk, data.size()), peer, tag); });
  }
  /// Posts a receive of up to `capacity.size()` bytes, when C has it.
  auto irecv_upto(std::span<std::byte> capacity, int peer, int tag)
    requires upto_receiver<C>
  {
    using R = decltype(inner_->irecv_upto(capacity, peer, tag));
    if (capacity.empty() || !is_device(capacity.data(), "staged.recv", peer))
      return staged_request<R, M>(inner_->irecv_upto(capacity, peer, tag), pool_, {}, nullptr);
    return post<R>("staged.recv", capacity.size(), peer, capacity.data(), [&](std::byte* blk) {
      return inner_->irecv_upto(std::span<std::byte>(blk, capacity.size()), peer, tag);
    });
  }

  // Forwarded capabilities (each only where C has it).
  int node_of(int r) const
    requires node_map<C>
  {
    return inner_->node_of(r);
  }
  void abort(const std::string& reason)
    requires abortable<C>
  {
    inner_->abort(reason);
  }
  std::chrono::milliseconds timeout() const
    requires timed<C>
  {
    return inner_->timeout();
  }
  void set_timeout(std::chrono::milliseconds t)
    requires timed<C>
  {
    inner_->set_timeout(t);
  }
  timeline* trace() const
    requires traced<C>
  {
    return inner_->trace();
  }
  /// C's call record: calls on the staged view and on C itself are numbered together.
  call_record& calls()
    requires recorded<C>
  {
    return inner_->calls();
  }
  int check_begin(std::uint64_t hash, std::uint64_t seq, int tag, bool framed)
    requires inband_checked<C>
  {
    return inner_->check_begin(hash, seq, tag, framed);
  }
  void check_end()
    requires inband_checked<C>
  {
    inner_->check_end();
  }
  bool check_agreed()
    requires inband_checked<C>
  {
    return inner_->check_agreed();
  }
  bool check_round()
    requires inband_checked<C>
  {
    return inner_->check_round();
  }
  bool check_disagreed()
    requires inband_checked<C>
  {
    return inner_->check_disagreed();
  }
  std::vector<std::byte> check_fingerprints(std::span<const std::byte> mine)
    requires inband_checked<C>
  {
    return inner_->check_fingerprints(mine);
  }
  board_ticket board_post(int tag, std::span<const std::byte> mine, const char* name)
    requires record_board<C>
  {
    return inner_->board_post(tag, mine, name);
  }
  bool board_collect(const board_ticket& t, std::span<std::byte> all, bool wait, const char* name)
    requires record_board<C>
  {
    return inner_->board_collect(t, all, wait, name);
  }

private:
  // A staged operation: a block of n bytes, `start(block)` posts the inner
  // operation on it (a send copies first); a receive's bytes go to `dev`.
  template <class R, class Start> staged_request<R, M> post(const char* op, std::size_t n, int peer, std::byte* dev,
                                                            Start start) {
    typename detail::staging_pool<M>::block blk;
    copy(op, peer, [&] { blk = pool_->take(n); });
    try {
      staged_request<R, M> r(start(blk.p), pool_, blk, dev);
      r.want_ = n;
      return r;
    } catch (...) {
      pool_->give(blk, true); // nothing was posted from it
      throw;
    }
  }
  // Whether a range is staged: device memory, unless C takes device
  // pointers as they are at this moment (a CUDA-aware MPI).
  bool is_device(const void* p, const char* op, int peer) const {
    if constexpr (requires { { inner_->takes_device_now() } -> std::convertible_to<bool>; })
      if (inner_->takes_device_now()) return false;
    bool dev = false;
    copy(op, peer, [&] { dev = pool_->copier.is_device(p); });
    return dev;
  }
  // Runs a copier step; its failure becomes an error of `op` naming this
  // rank and the peer (a gradsync::error from the copier keeps its kind).
  template <class F> void copy(const char* op, int peer, F f) const {
    try {
      f();
    } catch (const error&) {
      throw;
    } catch (const std::exception& e) {
      throw error(errc::internal, op, rank(), peer, std::string("staging failed: ") + e.what());
    }
  }

  C* inner_;
  std::shared_ptr<detail::staging_pool<M>> pool_;
};

/// A copier for host memory standing in for a device's (tests, and a host
/// build that runs the device code path): `device` ranges are those the
/// predicate marks; copies are memcpy, staging blocks come from new[].
struct host_copier {
  /// Which pointers count as device memory (none when empty).
  std::function<bool(const void*)> device;
  bool is_device(const void* p) const { return device && device(p); }
  void to_host(std::byte* d, const std::byte* s, std::size_t n) const noexcept { std::copy_n(s, n, d); }
  void to_device(std::byte* d, const std::byte* s, std::size_t n) const noexcept { std::copy_n(s, n, d); }
  std::byte* alloc_host(std::size_t n) const { return new std::byte[n]; }
  void free_host(std::byte* p, std::size_t) const noexcept { delete[] p; }
};
static_assert(device_copier<host_copier>);

namespace detail {
// A staged view has C's forwardable capabilities and moves device memory.
template <class C>
inline constexpr bool staged_forwards =
    device_memory<staged<C, host_copier>> && upto_receiver<staged<C, host_copier>> == upto_receiver<C> &&
    node_map<staged<C, host_copier>> == node_map<C> && abortable<staged<C, host_copier>> == abortable<C> &&
    timed<staged<C, host_copier>> == timed<C> && traced<staged<C, host_copier>> == traced<C> &&
    recorded<staged<C, host_copier>> == recorded<C> && inband_checked<staged<C, host_copier>> == inband_checked<C> &&
    record_board<staged<C, host_copier>> == record_board<C> && !shared_arena<staged<C, host_copier>>;
} // namespace detail

} // namespace gradsync
