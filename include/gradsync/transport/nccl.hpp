// gradsync: the NCCL transport. Messages between the GPUs of a group go
// through ncclSend/ncclRecv on a stream the caller gives: the stream of the
// collectives' executor (exec::cuda), so that a message starts after the
// kernels enqueued there before it and the kernels after it wait for it,
// with no host synchronisation in between.
//
//   gradsync::mpi::communicator boot;            // or any other transport
//   gradsync::nccl::communicator c(boot, s);     // the current device, stream s
//   gradsync::exec::cuda ex(s);
//   gradsync::allreduce(c, ex, std::span<const float>(d_in, n), std::span(d_out, n));
//
// Bootstrap: rank 0 makes NCCL's unique id and sends it to every rank over
// `boot` (tag policy::nccl_bootstrap_tag unless given); the communicator is
// created nonblocking (ncclConfig_t::blocking = 0) and its initialisation
// polled, bounded by the timeout: a rank that never joins fails the others
// with errc::timeout instead of hanging them.
//
// Posting and completion: isend/irecv enqueue nothing; they append to a
// pending list. The first wait() or test() of any request flushes the whole
// list as one NCCL group (ncclGroupStart, one ncclSend/ncclRecv of bytes per
// message, ncclGroupEnd) on the stream and records one event after it; each
// request of that group completes when that event has (NCCL reports no
// progress per message within a group). wait() polls the event and the
// communicator's asynchronous error, bounded by timeout(); an error or a
// timeout aborts the communicator (ncclCommAbort) and is thrown naming the
// operation, rank, peer and NCCL's reason; every later call then fails with
// errc::aborted.
//
// Matching: NCCL has no tags. Messages between two ranks match in the order
// they were posted, whatever their tags (checked only to be >= 0), so both
// sides must post a pair's messages in the same order: gradsync's schedules
// do (every rank runs the same schedule). Two calls in flight at once on one
// communicator (other tags, other threads) would match each other's
// messages: give each concurrent stream of calls its own communicator.
// NCCL cannot tell a receive posted with another size than its send (no
// errc::mismatch here): the collectives' call check catches calls that
// disagree before their data moves; a schedule of one's own must not do it.
//
// Limit of group completion: a request completes only with its whole group,
// so a wait also waits for the messages posted with it. If rank A's group
// holds sends whose receives B posts only after its own group completed, and
// B's group holds sends likewise, each waits for the other (over MPI each
// message completes on its own). Schedules post receives at most
// policy::pipeline_depth segments ahead, but a pipelined ring posts a
// phase's first sends for all segments at once: at 2 ranks, blocks of more
// than pipeline_depth segments (ring allreduce of more than 2 MiB of data in
// 256 KiB segments) complete only as far as NCCL's own buffers take the
// sends that are ahead of their receives. Such a call fails with
// errc::timeout after timeout(), it does not hang. native_allreduce and the
// other native_* functions below run NCCL's own collectives, which have no
// such limit (the bench's baseline).
//
// Host memory: ranges NCCL cannot address (pageable or pinned host memory:
// the call check's records, a host executor's buffers) are staged through a
// device block per group (pooled): a send's bytes are copied in when its
// group is flushed, a receive's copied out when its group completes. Device
// and managed memory go to NCCL as they are. Zero-byte messages complete at
// once and post nothing.
//
// Devices and threads: the communicator belongs to the device current at
// construction; its calls make that device current for the CUDA calls they
// make and restore the caller's. Its calls are serialised by a mutex, and
// abort() may come from any thread: a wait blocked in another thread then
// fails with errc::aborted at its next poll. NCCL's abort is local: the
// peers see a remote error or time out (as with mpi::communicator::abort).
//
// Compiles with nvcc or any C++20 compiler that finds cuda_runtime.h and
// nccl.h (no kernels here); link libnccl and libcudart.
#pragma once

#include <climits> // nccl.h's NCCL_CONFIG_INITIALIZER uses INT_MIN

#include <cuda_runtime.h>
#include <nccl.h>

#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/policy.hpp"
#include "capabilities.hpp"
#include "staged.hpp"
#include "transport.hpp"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "gradsync/transport/nccl.hpp needs NCCL 2.14 or later (nonblocking communicators)"
#endif

namespace gradsync::nccl {

/// NCCL's data type for gradsync's dtype `t`.
constexpr ncclDataType_t datatype(dtype t) noexcept {
  switch (t) {
  case dtype::f64: return ncclFloat64;
  case dtype::f16: return ncclFloat16;
  case dtype::bf16: return ncclBfloat16;
  case dtype::i32: return ncclInt32;
  case dtype::i64: return ncclInt64;
  case dtype::f32: break;
  }
  return ncclFloat32;
}

/// NCCL's reduction for gradsync's operator `k` (avg: ncclAvg).
constexpr ncclRedOp_t reduction(op_kind k) noexcept {
  switch (k) {
  case op_kind::prod: return ncclProd;
  case op_kind::min: return ncclMin;
  case op_kind::max: return ncclMax;
  case op_kind::avg: return ncclAvg;
  case op_kind::sum: break;
  }
  return ncclSum;
}

namespace detail {

using steady = std::chrono::steady_clock;

inline errc kind_of(ncclResult_t r) noexcept { return r == ncclRemoteError ? errc::peer_failed : errc::internal; }

// NCCL's words for `r`, with its last error message (it may name a peer or a call).
inline std::string nccl_failed(ncclResult_t r, ncclComm_t comm) {
  std::string s = std::string("NCCL error: ") + ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(comm); last && *last) s += std::string(" (") + last + ")";
  return s;
}
inline std::string cuda_failed(cudaError_t e, const char* what) {
  (void)cudaGetLastError(); // not left for the next checked call to report again
  return std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

// Polls comm's state until it is no longer ncclInProgress or `until` has
// passed: the state (ncclInProgress when it timed out), or the poll's own error.
inline ncclResult_t settle(ncclComm_t comm, steady::time_point until) {
  for (;;) {
    ncclResult_t st = ncclSuccess;
    if (const ncclResult_t r = ncclCommGetAsyncError(comm, &st); r != ncclSuccess) return r;
    if (st != ncclInProgress || steady::now() >= until) return st;
    sched_yield();
  }
}

// Makes `dev` the current device for one scope, then restores the caller's.
class device_scope {
public:
  explicit device_scope(int dev) noexcept {
    if (cudaGetDevice(&saved_) == cudaSuccess && saved_ != dev && cudaSetDevice(dev) == cudaSuccess) set_ = true;
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() {
    if (set_) (void)cudaSetDevice(saved_);
  }

private:
  int saved_ = -1;
  bool set_ = false;
};

// Whether NCCL can address p as it is (device or managed memory).
inline bool addressable(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError(); // an unknown pointer is host memory, not an error to keep
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// The staging blocks of host ranges are device memory: staged.hpp's pool
// keeps and recycles them; its copies are this file's (on the copy stream).
struct device_blocks {
  static bool is_device(const void*) noexcept { return true; }
  static void to_host(std::byte*, const std::byte*, std::size_t) noexcept {}
  static void to_device(std::byte*, const std::byte*, std::size_t) noexcept {}
  static std::byte* alloc_host(std::size_t n) {
    void* p = nullptr;
    if (const cudaError_t e = cudaMalloc(&p, n); e != cudaSuccess)
      throw error(errc::internal, "nccl.staging", -1, -1, cuda_failed(e, "cudaMalloc"));
    return static_cast<std::byte*>(p);
  }
  static void free_host(std::byte* p, std::size_t) noexcept { (void)cudaFree(p); }
};
static_assert(device_copier<device_blocks>);
using staging = gradsync::detail::staging_pool<device_blocks>;

// One flushed group: the event recorded after it, its staging block and the
// staged receives to copy out of it once the event has completed.
// A group that never completed (its communicator failed) drops its event
// and leaves its staging to the pool's end, never to reuse (an aborted
// kernel may still have written it).
struct group {
  struct copy_out {
    std::byte* host;
    const std::byte* dev;
    std::size_t bytes;
  };
  group() = default;
  group(const group&) = delete;
  group& operator=(const group&) = delete;
  ~group() {
    if (event) (void)cudaEventDestroy(event);
    if (stage.p) pool->give(std::exchange(stage, {}), false);
  }
  cudaEvent_t event = nullptr;
  staging* pool = nullptr; // where `stage` came from (it has its own lock)
  staging::block stage{};
  std::vector<copy_out> outs;
  bool done = false;
};

// One posted message.
struct message {
  std::byte* user = nullptr; // the caller's range (a send's is never written)
  std::byte* wire = nullptr; // what NCCL reads or writes: `user`, or staging
  std::size_t bytes = 0;
  int peer = -1;
  bool send = false;
  bool staged = false; // `user` is host memory
  std::shared_ptr<group> in; // once flushed
  const char* op() const noexcept { return send ? "nccl.send" : "nccl.recv"; }
};

// A communicator's state, shared with its requests (a request destroyed
// after the communicator still finds it). Its mutable members are guarded
// by m_ (the timeout is atomic).
class state {
public:
  state(ncclComm_t comm, cudaStream_t stream, int device, int rank, int size, std::chrono::milliseconds t)
      : rank(rank), size(size), device(device), stream(stream), timeout_ms(t.count()), comm_(comm) {}
  state(const state&) = delete;
  state& operator=(const state&) = delete;

  // Frees NCCL's resources: finalised (bounded by the timeout, then aborted)
  // unless the communicator failed; in-flight staging is never reused.
  ~state() {
    const device_scope on(device);
    if (comm_) {
      ncclResult_t st = ncclCommFinalize(comm_);
      if (st == ncclSuccess || st == ncclInProgress) st = settle(comm_, steady::now() + timeout());
      if (st == ncclSuccess) (void)ncclCommDestroy(comm_);
      else (void)ncclCommAbort(comm_);
    }
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    if (copies_) (void)cudaStreamDestroy(copies_);
    pool_.reset(); // cudaFree, on this device
  }

  const int rank, size, device;
  const cudaStream_t stream;
  std::atomic<long long> timeout_ms;
  std::chrono::milliseconds timeout() const noexcept { return std::chrono::milliseconds(timeout_ms.load()); }

  // Appends a message to the pending list.
  std::shared_ptr<message> post(std::byte* data, std::size_t bytes, int peer, int tag, bool send) {
    auto m = std::make_shared<message>();
    m->user = data;
    m->bytes = bytes;
    m->peer = peer;
    m->send = send;
    GRADSYNC_REQUIRE(peer >= 0 && peer < size, m->op(), rank,
                     "peer " + std::to_string(peer) + " out of range [0, " + std::to_string(size) + ")");
    GRADSYNC_REQUIRE(tag >= 0, m->op(), rank, "tag " + std::to_string(tag) + " is negative", peer);
    m->staged = bytes != 0 && !addressable(data);
    std::lock_guard g(m_);
    usable(m->op(), peer);
    if (bytes == 0) return nullptr; // complete at once
    pending_.push_back(m);
    return m;
  }

  // A request dropped before it completed: its message is taken out of the
  // pending list, or its group in flight waited for (the caller's buffer is
  // then free), up to the timeout, then NCCL is aborted.
  void abandon(const std::shared_ptr<message>& m) noexcept {
    {
      std::lock_guard g(m_);
      if (!m->in) {
        std::erase(pending_, m);
        return;
      }
    }
    try {
      complete(*m, true);
    } catch (...) { // failed before or now: NCCL was aborted
    }
  }

  // Completes m: blocks until its group has (wait), or polls once (test).
  bool complete(message& m, bool block) {
    std::unique_lock g(m_);
    if (m.in && m.in->done) return true;
    usable(m.op(), m.peer);
    if (!m.in) flush(m.op(), m.peer);
    return await(g, *m.in, block, m.op(), m.peer);
  }

  // Runs `enqueue(comm, stream) -> ncclResult_t` (a NCCL collective) after
  // the pending messages, and waits for it as for a request.
  template <class F> void native(const char* op, F&& enqueue) {
    std::unique_lock g(m_);
    usable(op, -1);
    if (!pending_.empty()) flush(op, -1);
    const device_scope on(device);
    auto gr = std::make_shared<group>();
    gr->event = take_event(op);
    ncclResult_t r = enqueue(comm_, stream);
    if (r == ncclInProgress) r = settle(comm_, steady::now() + timeout());
    if (r == ncclInProgress) fail(errc::timeout, op, -1, "enqueueing the collective " + gradsync::detail::timed_out(timeout()));
    if (r != ncclSuccess) fail(kind_of(r), op, -1, nccl_failed(r, comm_));
    record(*gr, op, -1);
    await(g, *gr, true, op, -1);
  }

  // Aborts NCCL (abortable): this and every later call fails with errc::aborted.
  void abort(const std::string& why) noexcept {
    std::lock_guard g(m_);
    abort_locked(why);
  }

  ncclComm_t handle() {
    std::lock_guard g(m_);
    return comm_;
  }

private:
  // Throws errc::aborted once the communicator has failed.
  void usable(const char* op, int peer) const {
    if (failed_) throw error(errc::aborted, op, rank, peer, "aborted: " + why_);
  }
  void abort_locked(const std::string& why) noexcept {
    if (failed_) return;
    failed_ = true;
    try {
      why_ = why;
    } catch (...) {
    }
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  // Aborts with `why` and throws it.
  [[noreturn]] void fail(errc kind, const char* op, int peer, const std::string& why) {
    abort_locked("rank " + std::to_string(rank) + " failed: " + why);
    throw error(kind, op, rank, peer, why);
  }

  cudaEvent_t take_event(const char* op) {
    if (!events_.empty()) {
      cudaEvent_t e = events_.back();
      events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    if (const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); err != cudaSuccess)
      throw error(errc::internal, op, rank, -1, cuda_failed(err, "cudaEventCreateWithFlags"));
    return e;
  }
  cudaStream_t copies(const char* op) {
    if (!copies_)
      if (const cudaError_t e = cudaStreamCreateWithFlags(&copies_, cudaStreamNonBlocking); e != cudaSuccess)
        throw error(errc::internal, op, rank, -1, cuda_failed(e, "cudaStreamCreateWithFlags"));
    return copies_;
  }
  // Copies on the private copy stream, waited for (host ranges are small:
  // the call check's records; pageable memory would make it synchronous anyway).
  void copy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, const char* op, int peer) {
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, copies(op));
    if (e == cudaSuccess) e = cudaStreamSynchronize(copies_);
    if (e != cudaSuccess) fail(errc::internal, op, peer, cuda_failed(e, "staging copy"));
  }
  // Records the group's event on the stream.
  void record(group& gr, const char* op, int peer) {
    if (const cudaError_t e = cudaEventRecord(gr.event, stream); e != cudaSuccess)
      fail(errc::internal, op, peer, cuda_failed(e, "cudaEventRecord"));
  }

  // Enqueues the pending messages as one group, then its event.
  void flush(const char* op, int peer) {
    const device_scope on(device);
    auto gr = std::make_shared<group>();
    gr->event = take_event(op);
    std::size_t staged = 0;
    for (const auto& m : pending_)
      if (m->staged) staged += (m->bytes + 255) & ~std::size_t{255};
    if (staged) {
      if (!pool_) pool_.emplace(device_blocks{});
      gr->pool = &*pool_;
      gr->stage = pool_->take(staged);
    }
    std::byte* at = gr->stage.p;
    for (const auto& m : pending_) {
      m->wire = m->user;
      if (!m->staged) continue;
      m->wire = at;
      at += (m->bytes + 255) & ~std::size_t{255};
      if (m->send) copy(m->wire, m->user, m->bytes, cudaMemcpyHostToDevice, op, peer);
      else gr->outs.push_back({m->user, m->wire, m->bytes});
    }
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess) {
      for (const auto& m : pending_) {
        r = m->send ? ncclSend(m->wire, m->bytes, ncclUint8, m->peer, comm_, stream)
                    : ncclRecv(m->wire, m->bytes, ncclUint8, m->peer, comm_, stream);
        if (r != ncclSuccess && r != ncclInProgress) break;
      }
      const ncclResult_t end = ncclGroupEnd(); // closes the group even after a failed call
      if (r == ncclSuccess || r == ncclInProgress) r = end;
    }
    if (r == ncclInProgress) r = settle(comm_, steady::now() + timeout());
    if (r == ncclInProgress) fail(errc::timeout, op, peer, "enqueueing the group " + gradsync::detail::timed_out(timeout()));
    if (r != ncclSuccess) fail(kind_of(r), op, peer, nccl_failed(r, comm_));
    record(*gr, op, peer);
    for (const auto& m : pending_) m->in = gr;
    pending_.clear();
  }

  // Polls group gr until it completes (true), or once when !block (false
  // while it has not), bounded by the timeout. Unlocks while it yields.
  bool await(std::unique_lock<std::mutex>& g, group& gr, bool block, const char* op, int peer) {
    const auto t = timeout();
    const auto until = steady::now() + t;
    for (;;) {
      if (gr.done) return true;
      usable(op, peer);
      const cudaError_t e = cudaEventQuery(gr.event);
      if (e == cudaSuccess) {
        finish(gr, op, peer);
        return true;
      }
      if (e != cudaErrorNotReady) fail(errc::internal, op, peer, cuda_failed(e, "cudaEventQuery"));
      ncclResult_t st = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &st);
      if (r == ncclSuccess && st != ncclInProgress) r = st;
      if (r != ncclSuccess) fail(kind_of(r), op, peer, nccl_failed(r, comm_));
      if (!block) return false;
      if (steady::now() >= until) fail(errc::timeout, op, peer, gradsync::detail::timed_out(t));
      g.unlock();
      sched_yield();
      g.lock();
    }
  }
  // A completed group: staged receives copied out, event and staging reused.
  void finish(group& gr, const char* op, int peer) {
    const device_scope on(device);
    for (const auto& o : gr.outs) copy(o.host, o.dev, o.bytes, cudaMemcpyDeviceToHost, op, peer);
    if (gr.stage.p) pool_->give(std::exchange(gr.stage, {}), true);
    events_.push_back(std::exchange(gr.event, nullptr));
    gr.outs.clear();
    gr.done = true;
  }

  std::mutex m_;
  ncclComm_t comm_; // null once aborted
  bool failed_ = false;
  std::string why_;
  std::vector<std::shared_ptr<message>> pending_;
  std::vector<cudaEvent_t> events_; // idle, for the next groups
  cudaStream_t copies_ = nullptr;   // staging copies (non-blocking: no order with the caller's stream)
  std::optional<staging> pool_;
};

// Rank 0's NCCL unique id, on every rank of `boot`: a status byte (rank 0
// could make it) and the id's bytes, sent from rank 0 to each rank.
template <transport Boot> ncclUniqueId share_id(Boot& boot, int tag, const char* op) {
  const int rank = boot.rank();
  std::array<std::byte, 1 + sizeof(ncclUniqueId)> msg{};
  ncclUniqueId id{};
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    msg[0] = std::byte{r == ncclSuccess};
    std::memcpy(msg.data() + 1, &id, sizeof id);
    const std::span<const std::byte> bytes(msg);
    std::vector<decltype(boot.isend(bytes, 0, tag))> sends;
    for (int q = 1; q < boot.size(); ++q) sends.push_back(boot.isend(bytes, q, tag));
    for (auto& s : sends) s.wait();
    if (r != ncclSuccess) throw error(kind_of(r), op, rank, -1, "ncclGetUniqueId: " + nccl_failed(r, nullptr));
    return id;
  }
  boot.irecv(std::span<std::byte>(msg), 0, tag).wait();
  if (msg[0] == std::byte{0})
    throw error(errc::peer_failed, op, rank, 0, "rank 0 could not make NCCL's unique id (ncclGetUniqueId failed)");
  std::memcpy(&id, msg.data() + 1, sizeof id);
  return id;
}

} // namespace detail

/// Completion of an NCCL send or receive (see the file comment: it
/// completes with the whole group it was flushed in). Move-only.
class request {
public:
  request() = default;
  request(request&& o) noexcept = default;
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      drop();
      s_ = std::move(o.s_);
      m_ = std::move(o.m_);
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  /// A request dropped before it completed: taken back if not yet flushed
  /// (the peer's matching message then waits: discard the communicator, as
  /// after any failed call), else waited for (up to the timeout, then NCCL
  /// is aborted), so that NCCL never touches a buffer its owner released.
  ~request() { drop(); }

  /// Blocks until complete; throws gradsync::error on failure (the
  /// communicator is then aborted), errc::timeout after its timeout().
  void wait() {
    if (m_) s_->complete(*m_, true);
    done();
  }
  /// True once complete (flushing the pending messages first); throws as wait().
  bool test() {
    if (m_ && !s_->complete(*m_, false)) return false;
    done();
    return true;
  }

private:
  friend class communicator;
  request(std::shared_ptr<detail::state> s, std::shared_ptr<detail::message> m) : s_(std::move(s)), m_(std::move(m)) {}
  void done() noexcept {
    m_.reset();
    s_.reset();
  }
  void drop() noexcept {
    if (m_) s_->abandon(m_);
    done();
  }
  std::shared_ptr<detail::state> s_;
  std::shared_ptr<detail::message> m_; // null: complete
};

/// One rank of an NCCL group on the current device, enqueuing on a stream
/// the caller gives (see the file comment). Move-only; a moved-from
/// communicator may only be destroyed or assigned to.
class communicator {
public:
  static constexpr std::string_view name = "nccl";
  static constexpr bool device_memory = true;
  static constexpr bool stream_ordered = true;

  /// Rank boot.rank() of a group of boot.size() ranks on the current CUDA
  /// device, enqueuing on `stream` (which must outlive it). Every rank of
  /// `boot` must construct one (collective over boot, on `tag`).
  /// Initialisation that does not finish within `timeout` (which is then
  /// the communicator's timeout()) fails with errc::timeout.
  template <transport Boot>
  communicator(Boot& boot, cudaStream_t stream, int tag = policy::nccl_bootstrap_tag,
               std::chrono::milliseconds timeout = policy::default_timeout) {
    const char* op = "nccl.communicator";
    const int rank = boot.rank(), size = boot.size();
    GRADSYNC_REQUIRE(timeout.count() > 0, op, rank, "timeout must be > 0 ms, got " + std::to_string(timeout.count()));
    int device = -1;
    if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
      throw error(errc::internal, op, rank, -1, detail::cuda_failed(e, "cudaGetDevice"));
    ncclUniqueId id = detail::share_id(boot, tag, op);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    if (r == ncclInProgress) r = detail::settle(comm, detail::steady::now() + timeout);
    if (r != ncclSuccess) {
      const std::string why = r == ncclInProgress ? "initialisation " + gradsync::detail::timed_out(timeout)
                                                  : detail::nccl_failed(r, comm);
      if (comm) (void)ncclCommAbort(comm);
      throw error(r == ncclInProgress ? errc::timeout : detail::kind_of(r), op, rank, -1, why);
    }
    try {
      s_ = std::make_shared<detail::state>(comm, stream, device, rank, size, timeout);
    } catch (...) {
      (void)ncclCommAbort(comm);
      throw;
    }
  }
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  /// Destroys the NCCL communicator (ncclCommFinalize then ncclCommDestroy,
  /// or ncclCommAbort after a failure or when finalising times out) once
  /// its last request is gone too.
  ~communicator() = default;

  int rank() const noexcept { return s_->rank; }
  int size() const noexcept { return s_->size; }
  /// The CUDA device the communicator belongs to.
  int device() const noexcept { return s_->device; }
  /// The stream messages and native collectives are enqueued on.
  cudaStream_t stream() const noexcept { return s_->stream; }
  /// The NCCL communicator (null once aborted), for calls of one's own on stream().
  ncclComm_t handle() const { return s_->handle(); }

  /// How long a wait (and the destructor's finalisation) lasts before failing.
  std::chrono::milliseconds timeout() const noexcept { return s_->timeout(); }
  void set_timeout(std::chrono::milliseconds t) noexcept { s_->timeout_ms.store(t.count()); }
  /// Aborts NCCL (ncclCommAbort): every pending and later call on this
  /// rank fails with errc::aborted; peers see an error or time out.
  void abort(const std::string& reason) { s_->abort("rank " + std::to_string(s_->rank) + " aborted: " + reason); }

  /// Posts a send of `data` (device or host memory) to `peer`; enqueued when
  /// a request of this communicator is first waited or tested.
  request isend(std::span<const std::byte> data, int peer, int tag) {
    return request(s_, s_->post(const_cast<std::byte*>(data.data()), data.size(), peer, tag, true));
  }
  /// Posts a receive of exactly `data.size()` bytes from `peer` (as isend).
  request irecv(std::span<std::byte> data, int peer, int tag) {
    return request(s_, s_->post(data.data(), data.size(), peer, tag, false));
  }

  /// Runs `enqueue(ncclComm_t, cudaStream_t) -> ncclResult_t` (NCCL calls
  /// of one's own, e.g. a collective) after the pending messages and waits
  /// for it like a request: errors and timeouts as there, naming `op`.
  template <class F> void run_native(const char* op, F&& enqueue) { s_->native(op, std::forward<F>(enqueue)); }

private:
  std::shared_ptr<detail::state> s_;
};

static_assert(transport<communicator>);
static_assert(device_memory<communicator> && stream_ordered<communicator> && timed<communicator> &&
              abortable<communicator>);
static_assert(!shared_arena<communicator> && !node_map<communicator> && !upto_receiver<communicator> &&
              !record_board<communicator>);

namespace detail {
inline void check_root(const communicator& c, int root, const char* op) {
  GRADSYNC_REQUIRE(root >= 0 && root < c.size(), op, c.rank(),
                   "root " + std::to_string(root) + " out of range [0, " + std::to_string(c.size()) + ")");
}
} // namespace detail

// ---- NCCL's own collectives (the bench's baseline) -------------------------
// On the communicator's stream, after its pending messages; each returns
// once the collective has completed (its event polled as a request's,
// bounded by timeout(); errors likewise abort the communicator). Buffers are
// device (or managed) memory; counts are elements of `t`.

/// out[i] = op over ranks of in[i], i < count (in == out: in place).
inline void native_allreduce(communicator& c, const void* in, void* out, std::size_t count, dtype t, op_kind k) {
  c.run_native("nccl.allreduce", [&](ncclComm_t comm, cudaStream_t s) {
    return ncclAllReduce(in, out, count, datatype(t), reduction(k), comm, s);
  });
}
/// out (recv_count elements) = block rank() of the reduction of every rank's
/// in (size() * recv_count elements).
inline void native_reduce_scatter(communicator& c, const void* in, void* out, std::size_t recv_count, dtype t,
                                  op_kind k) {
  c.run_native("nccl.reduce_scatter", [&](ncclComm_t comm, cudaStream_t s) {
    return ncclReduceScatter(in, out, recv_count, datatype(t), reduction(k), comm, s);
  });
}
/// out (size() * send_count elements) = every rank's in, in rank order.
inline void native_allgather(communicator& c, const void* in, void* out, std::size_t send_count, dtype t) {
  c.run_native("nccl.allgather", [&](ncclComm_t comm, cudaStream_t s) {
    return ncclAllGather(in, out, send_count, datatype(t), comm, s);
  });
}
/// out = root's in (count elements; `in` is read on the root only).
inline void native_broadcast(communicator& c, const void* in, void* out, std::size_t count, dtype t, int root) {
  detail::check_root(c, root, "nccl.broadcast");
  c.run_native("nccl.broadcast", [&](ncclComm_t comm, cudaStream_t s) {
    return ncclBroadcast(in, out, count, datatype(t), root, comm, s);
  });
}
/// out on the root = op over ranks of in (count elements; `out` is written on the root only).
inline void native_reduce(communicator& c, const void* in, void* out, std::size_t count, dtype t, op_kind k,
                          int root) {
  detail::check_root(c, root, "nccl.reduce");
  c.run_native("nccl.reduce", [&](ncclComm_t comm, cudaStream_t s) {
    return ncclReduce(in, out, count, datatype(t), reduction(k), root, comm, s);
  });
}

} // namespace gradsync::nccl
