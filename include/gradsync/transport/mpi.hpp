// gradsync: the MPI transport. Point-to-point on a duplicate of the user's
// communicator (never on MPI_COMM_WORLD itself, so user traffic can never match
// ours), plus the library's native collectives as the peer baseline.
#pragma once

#include <mpi.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <exception>
#include <climits>
#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/policy.hpp"
#include "../core/reduce.hpp"
#include "capabilities.hpp"
#include "transport.hpp"

namespace gradsync::mpi {

/// MPI datatype of element type T. half and bfloat16 travel as MPI_UINT16_T
/// (MPI has no such types); reductions on them use a gradsync-defined MPI_Op.
template <element T> MPI_Datatype datatype() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<U, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<U, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<U, std::int64_t>) return MPI_INT64_T;
  else return MPI_UINT16_T;
}

/// True when MPI can reduce T with its built-in operators.
template <element T>
inline constexpr bool has_builtin_reduction =
    !std::is_same_v<std::remove_cv_t<T>, half> && !std::is_same_v<std::remove_cv_t<T>, bfloat16>;

/// The MPI built-in operator for Op (avg maps to MPI_SUM; divide afterwards).
template <reduce_op Op> MPI_Op builtin_op() {
  switch (Op::kind) {
  case op_kind::prod: return MPI_PROD;
  case op_kind::min: return MPI_MIN;
  case op_kind::max: return MPI_MAX;
  case op_kind::sum:
  case op_kind::avg: break;
  }
  return MPI_SUM;
}

namespace detail {

inline std::string error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}

inline void check(int rc, const char* op, int rank, int peer = -1) {
  if (rc != MPI_SUCCESS) throw error(errc::internal, op, rank, peer, error_string(rc));
}

// Whether the MPI library takes device (CUDA) pointers in its sends and
// receives: MPICH's MPIX_GPU_query_support, Open MPI's
// MPIX_Query_cuda_support (mpi-ext.h); GRADSYNC_MPI_DEVICE=1 or 0 says so
// instead (1 on a library that is not CUDA-aware crashes on device memory).
inline bool gpu_aware_library() {
  if (const char* e = std::getenv("GRADSYNC_MPI_DEVICE"); e && *e) return e[0] == '1';
#if defined(MPIX_GPU_SUPPORT_CUDA)
  int yes = 0;
  return MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &yes) == MPI_SUCCESS && yes != 0;
#elif defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

inline bool initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

// MPICH (4.0) raises the errors of request completion (MPI_Test, MPI_Wait;
// e.g. a receive truncated by a larger message) on MPI_COMM_WORLD's handler,
// fatal by default, not on the request's communicator. While gradsync
// completes its own requests, world's handler is MPI_ERRORS_RETURN, so such
// errors become a gradsync::error. (With MPI_THREAD_MULTIPLE, another thread's
// errors on MPI_COMM_WORLD in that window return instead of aborting.)
class world_errors_return {
public:
  world_errors_return() noexcept {
    if (!initialized() || MPI_Comm_get_errhandler(MPI_COMM_WORLD, &saved_) != MPI_SUCCESS) {
      saved_ = MPI_ERRHANDLER_NULL;
      return;
    }
    if (saved_ == MPI_ERRORS_RETURN) saved_ = MPI_ERRHANDLER_NULL; // nothing to switch
    else MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  ~world_errors_return() {
    if (saved_ == MPI_ERRHANDLER_NULL || !initialized()) return;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, saved_);
    if (saved_ != MPI_ERRORS_ARE_FATAL) MPI_Errhandler_free(&saved_); // ours from the get
  }
  world_errors_return(const world_errors_return&) = delete;
  world_errors_return& operator=(const world_errors_return&) = delete;

private:
  MPI_Errhandler saved_ = MPI_ERRHANDLER_NULL;
};

} // namespace detail

namespace detail {
// Shared by a communicator and its requests: abort() from any thread.
struct abort_state {
  std::atomic<bool> set{false};
  std::mutex m;
  std::string why;
  std::string reason() {
    std::lock_guard g(m);
    return why;
  }
};

// The agreement check of the call one thread runs (capability
// inband_checked; collectives.hpp's run_call), shared by a communicator and
// the requests of that call. Tags from `base` (policy::verify_tag_offset):
// round messages of even and odd calls on base and base + 1, fingerprints
// on base + 2.
struct check_state {
  // Framed: the sender's fingerprint hash, then the payload. A receiver
  // compares it with its own: a call completes only if every message of its
  // schedule arrived, and in a schedule that carries every rank's data to
  // every rank each rank's causal past then holds every rank, so equal
  // hashes on every hop mean all agree (a rank that sees a difference
  // stops sending, and those waiting on it see it exchanging fingerprints).
  static constexpr std::size_t header = 8;
  static constexpr std::size_t wire_max = 64;    // a fingerprint's wire form, at most
  std::atomic<bool> active{false};
  std::atomic<std::thread::id> owner{};
  bool framed = false, disagreed = false;
  std::uint64_t mine = 0, lo = 0, hi = 0, seq = 0;
  std::byte wire[wire_max]{}; // the fingerprint's wire form while it is sent
  int base = 0;
  std::string why;              // what showed the disagreement first
  std::uint64_t round_out[2]{}; // the round message in flight

  // Framed messages' buffers: cut from one slab, in call order, and all
  // given back at once when the next call's check begins (framed requests
  // are made and ended by the schedule, inside the call; a mutex-guarded
  // pool and a shared count per message measured +0.05 us on an 8-byte
  // allreduce). What does not fit comes from the heap, owned by its request.
  // A failed call's sends may still be read by MPI, but a failed
  // communicator makes no further calls, so its slab is never cut again; a
  // heap block of an abandoned send goes to `orphans` (freed with the
  // communicator).
  static constexpr std::size_t slab_bytes = std::size_t{256} << 10;
  struct frame {
    std::byte* p = nullptr;
    std::unique_ptr<std::byte[]> heap; // p's owner when it is not in the slab
  };
  std::unique_ptr<std::byte[]> slab;
  std::size_t cut = 0; // slab bytes given out in this call
  std::vector<std::unique_ptr<std::byte[]>> orphans;
  std::mutex orphans_m;
  frame take(std::size_t n) { // the call's thread
    const std::size_t r = (n + 63) & ~std::size_t{63};
    if (cut + r <= slab_bytes) {
      if (!slab) slab = std::make_unique_for_overwrite<std::byte[]>(slab_bytes);
      std::byte* p = slab.get() + cut;
      cut += r;
      return {p, nullptr};
    }
    frame f{nullptr, std::make_unique_for_overwrite<std::byte[]>(n)};
    f.p = f.heap.get();
    return f;
  }
  void give(frame& f, bool orphan) {
    if (f.heap && orphan) {
      std::lock_guard g(orphans_m);
      orphans.push_back(std::move(f.heap));
    }
    f = frame{};
  }

  int round_tag() const noexcept { return base + static_cast<int>(seq & 1); }
  int print_tag() const noexcept { return base + 2; }
  // Whether this thread's messages are framed now.
  bool frames() const noexcept {
    return framed && active.load(std::memory_order_relaxed) && owner.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }
  void merge(std::uint64_t l, std::uint64_t h) noexcept {
    lo = std::min(lo, l);
    hi = std::max(hi, h);
  }
  void disagree(std::string reason) {
    if (!disagreed) why = std::move(reason);
    disagreed = true;
  }
  // A message of this call's round (a rank checking it in a round, so on
  // another call than a framed one) or a fingerprint (a rank exchanging):
  // the source, or -1.
  int other_call(MPI_Comm comm, bool rounds) const {
    int flag = 0;
    MPI_Status st;
    for (const int t : {print_tag(), round_tag()}) {
      if (t != print_tag() && !rounds) continue;
      if (MPI_Iprobe(MPI_ANY_SOURCE, t, comm, &flag, &st) == MPI_SUCCESS && flag) return st.MPI_SOURCE;
    }
    return -1;
  }
};

// The steps of the agreement round for `rank`, given every rank's node
// (node_map: a node's ranks share memory): (to, from) per step.
// Dissemination inside the node (d = 1, 2, 4 .. among its ranks), then
// between nodes among the ranks of one local index (d = 1, 2, 4 .. among
// the nodes that have one), then, where nodes differ in size, inside the
// node again (a rank whose index some node lacks learned that node's
// hashes only through its own index 0). Each rank ends knowing every rank's
// hashes; a step crosses nodes only in the middle phase: ceil(log2 nodes)
// network latencies instead of up to ceil(log2 p) (SMPI, 64 ranks on 8
// nodes: 6 crossing steps before, 3 now).
inline std::vector<std::pair<int, int>> round_steps(const std::vector<int>& node, int rank) {
  const int p = static_cast<int>(node.size());
  std::vector<std::pair<int, int>> steps;
  auto disseminate = [&](const std::vector<int>& ring, int at) {
    const int n = static_cast<int>(ring.size());
    for (int d = 1; d < n; d *= 2)
      steps.emplace_back(ring[static_cast<std::size_t>((at + d) % n)], ring[static_cast<std::size_t>((at - d % n + n) % n)]);
  };
  // Nodes in order of their first rank, each its ranks in rank order.
  std::vector<std::vector<int>> nodes;
  std::vector<int> index_of_node(static_cast<std::size_t>(p), -1);
  for (int q = 0; q < p; ++q) {
    const auto key = static_cast<std::size_t>(node[static_cast<std::size_t>(q)]);
    if (key >= static_cast<std::size_t>(p)) return {}; // not a node map: no steps (never made by the constructor)
    if (index_of_node[key] < 0) {
      index_of_node[key] = static_cast<int>(nodes.size());
      nodes.emplace_back();
    }
    nodes[static_cast<std::size_t>(index_of_node[key])].push_back(q);
  }
  const auto& mine = nodes[static_cast<std::size_t>(index_of_node[static_cast<std::size_t>(node[static_cast<std::size_t>(rank)])])];
  const int local = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  disseminate(mine, local);
  std::vector<int> peers; // the rank of index `local` on every node that has one
  int at = 0;
  bool uneven = false;
  for (const auto& n : nodes) {
    uneven |= n.size() != mine.size();
    if (static_cast<int>(n.size()) <= local) continue;
    if (&n == &mine) at = static_cast<int>(peers.size());
    peers.push_back(n[static_cast<std::size_t>(local)]);
  }
  disseminate(peers, at);
  if (uneven) disseminate(mine, local);
  return steps;
}

// A request's per-part state: one part inline, more on the heap. Nearly
// every message is one part (up to policy::mpi_max_message_bytes); three
// vectors allocated per message were a tenth of an 8-byte allreduce.
template <class T> class parts {
public:
  parts() = default;
  parts(parts&& o) noexcept { *this = std::move(o); }
  parts& operator=(parts&& o) noexcept {
    one_ = o.one_;
    n_ = std::exchange(o.n_, 0);
    more_ = std::move(o.more_);
    o.more_.clear();
    return *this;
  }
  bool empty() const noexcept { return n_ == 0; }
  std::size_t size() const noexcept { return n_; }
  T& operator[](std::size_t i) noexcept { return i == 0 ? one_ : more_[i - 1]; }
  const T& operator[](std::size_t i) const noexcept { return i == 0 ? one_ : more_[i - 1]; }
  void push_back(const T& v) {
    if (n_ > 0) more_.push_back(v);
    else one_ = v;
    ++n_;
  }
  void resize(std::size_t n) {
    more_.resize(n > 1 ? n - 1 : 0);
    n_ = n;
  }
  void clear() noexcept {
    n_ = 0;
    more_.clear();
  }

private:
  T one_{};
  std::size_t n_ = 0;
  std::vector<T> more_;
};
} // namespace detail

/// Completion handle of an MPI send or receive. A transfer larger than
/// policy::mpi_max_message_bytes travels as several messages (MPI counts are
/// ints), all with the same tag, matched in order.
class request {
public:
  request() = default;
  request(request&& o) noexcept { *this = std::move(o); }
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      abandon();
      reqs_ = std::move(o.reqs_);
      sizes_ = std::move(o.sizes_);
      st_ = std::move(o.st_);
      op_ = o.op_;
      rank_ = o.rank_;
      peer_ = o.peer_;
      recv_ = o.recv_;
      upto_ = o.upto_;
      received_ = o.received_;
      timeout_ = o.timeout_;
      abort_ = std::move(o.abort_);
      trace_ = o.trace_;
      check_ = std::exchange(o.check_, nullptr);
      frame_ = std::move(o.frame_);
      o.frame_ = {};
      user_ = o.user_;
      comm_ = o.comm_;
      o.reqs_.clear();
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  /// An abandoned receive is cancelled (MPI never writes into the buffer
  /// afterwards); an abandoned send is released to complete on its own.
  ~request() {
    abandon();
    if (check_) check_->give(frame_, false);
  }

  /// Blocks until every part completed; throws on failure (errc::internal),
  /// size mismatch (errc::mismatch), or when the peer has not matched it
  /// within the communicator's timeout (errc::timeout).
  void wait() {
    if (reqs_.empty()) return;
    const scoped_phase phase(trace_, "wait", "transport", wait_args(peer_, op_));
    detail::world_errors_return guard;
#if defined(GRADSYNC_MPI_BLOCKING_WAIT)
    // Simulators (SimGrid SMPI): each polling MPI_Test is a context switch
    // and costs simulated time, 256 polling ranks made a round take minutes;
    // MPI_Wait parks the rank until the network model completes it. No
    // timeout or abort check in this mode.
    poll(true);
    return;
#endif
    // The clock is first read after 256 polls: most waits of small messages
    // end before, and two reads per call were ~8 % of an 8-byte allreduce
    // (perf, CI VM). The timeout then counts from there (~10 us late).
    using clock = std::chrono::steady_clock;
    clock::time_point start{};
    for (unsigned i = 0;; ++i) {
      if (poll()) return;
      if ((i & 255u) == 255u) {
        check_abort();
        if (check_) probe_other_call();
        const auto now = clock::now();
        if (i == 255u) start = now;
        const auto waited = now - start;
        if (waited > timeout_) {
          abandon();
          throw error(errc::timeout, op_, rank_, peer_, gradsync::detail::timed_out(timeout_));
        }
        if (waited > std::chrono::microseconds(200)) sched_yield(); // be fair when oversubscribed
      }
    }
  }
  /// True once complete (then as wait()); false while pending.
  bool test() {
    if (reqs_.empty()) return true;
    check_abort();
    detail::world_errors_return guard;
    return poll();
  }
  /// Bytes received (a receive, once wait() returned or test() returned true;
  /// for a send, 0).
  std::size_t received() const noexcept { return received_; }

private:
  friend class communicator;
  // One MPI_Test per part, keeping each part's status once it completed
  // (MPI_Testall would report a failed part through MPI_ERR_IN_STATUS only).
  bool poll(bool block = false) {
    st_.resize(reqs_.size());
    for (std::size_t i = 0; i < reqs_.size(); ++i) {
      if (reqs_[i] == MPI_REQUEST_NULL) continue; // completed earlier; st_[i] holds its status
      int flag = block ? 1 : 0;
      const int rc = block ? MPI_Wait(&reqs_[i], &st_[i]) : MPI_Test(&reqs_[i], &flag, &st_[i]);
      if (rc != MPI_SUCCESS) {
        reqs_[i] = MPI_REQUEST_NULL; // completed with an error
        abandon();
        int cls = MPI_ERR_OTHER;
        MPI_Error_class(rc, &cls);
        if (cls == MPI_ERR_TRUNCATE && check_)
          disagree("rank " + std::to_string(peer_) + " sent a larger message than this call's " +
                   std::to_string(sizes_[i] - detail::check_state::header) + " bytes");
        if (cls == MPI_ERR_TRUNCATE)
          throw error(errc::mismatch, op_, rank_, peer_,
                      "message size mismatch: a message larger than the posted receive of " +
                          std::string(upto_ ? "up to " : "") + std::to_string(sizes_[i]) + " bytes arrived (part " +
                          std::to_string(i) + ")");
        throw error(errc::internal, op_, rank_, peer_, detail::error_string(rc));
      }
      if (!flag) return false;
    }
    reqs_.clear();
    finish();
    return true;
  }
  void finish() {
    if (!recv_) return;
    if (check_) return finish_framed();
    std::size_t total = 0;
    for (std::size_t i = 0; i < st_.size(); ++i) {
      int got = 0;
      detail::check(MPI_Get_count(&st_[i], MPI_BYTE, &got), op_, rank_, peer_);
      total += static_cast<std::size_t>(got);
      if (!upto_ && static_cast<std::size_t>(got) != sizes_[i])
        throw error(errc::mismatch, op_, rank_, peer_,
                    "message size mismatch: received " + std::to_string(got) +
                        " bytes where a receive of " + std::to_string(sizes_[i]) +
                        " bytes was posted (part " + std::to_string(i) + ")");
    }
    received_ = total;
  }
  void abandon() noexcept {
    if (reqs_.empty()) return;
    detail::world_errors_return guard;
    for (std::size_t i = 0; i < reqs_.size(); ++i) {
      MPI_Request& r = reqs_[i];
      if (r == MPI_REQUEST_NULL || !detail::initialized()) continue;
      if (recv_) {
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      } else {
        MPI_Request_free(&r);
      }
    }
    reqs_.clear();
    if (check_) check_->give(frame_, !recv_); // a send's bytes may still be read
  }
  detail::parts<MPI_Request> reqs_;
  detail::parts<std::size_t> sizes_;
  detail::parts<MPI_Status> st_;
  const char* op_ = "";
  int rank_ = -1, peer_ = -1;
  bool recv_ = false;
  bool upto_ = false; // a receive of up to sizes_[0] bytes (one part)
  std::size_t received_ = 0;
  std::chrono::milliseconds timeout_ = policy::default_timeout;
  std::shared_ptr<detail::abort_state> abort_;
  timeline* trace_ = nullptr;
  // Framed (a checked call's message): the check (the communicator's: the
  // request ends inside the call), the message as sent (hash, then the
  // payload), a receive's destination, the communicator (probed for the
  // agreement tag while waiting).
  detail::check_state* check_ = nullptr;
  detail::check_state::frame frame_; // from check_->take()
  std::byte* user_ = nullptr;
  MPI_Comm comm_ = MPI_COMM_NULL;

  // The call's check saw a disagreement: fail this request (the collective
  // then exchanges fingerprints and raises the same error on every rank).
  [[noreturn]] void disagree(std::string why) {
    check_->disagree(why);
    abandon();
    throw error(errc::mismatch, op_, rank_, peer_, "call check: " + why);
  }
  // A framed receive completed: its size and the sender's hashes.
  void finish_framed() {
    using detail::check_state;
    int got = 0;
    detail::check(MPI_Get_count(&st_[0], MPI_BYTE, &got), op_, rank_, peer_);
    const auto n = static_cast<std::size_t>(got);
    if (n < check_state::header || (!upto_ && n != sizes_[0]))
      disagree("rank " + std::to_string(peer_) + " sent " +
               (n < check_state::header ? std::string("a message of another call")
                                        : std::to_string(n - check_state::header) + " bytes where this call expects " +
                                              std::to_string(sizes_[0] - check_state::header)));
    std::uint64_t h;
    std::memcpy(&h, frame_.p, sizeof h);
    if (h != check_->mine) disagree("rank " + std::to_string(peer_) + "'s fingerprint differs from this rank's");
    if (n > check_state::header) std::memcpy(user_, frame_.p + check_state::header, n - check_state::header);
    received_ = n - check_state::header;
    check_->give(frame_, false);
  }
  // A message on the agreement tag while a framed call waits: some rank is
  // in another call (its round), or already exchanging fingerprints.
  void probe_other_call() {
    if (const int q = check_->other_call(comm_, true); q >= 0) disagree("rank " + std::to_string(q) + " is in another call");
  }

  void check_abort() {
    if (!abort_ || !abort_->set.load(std::memory_order_acquire)) return;
    abandon();
    throw error(errc::aborted, op_, rank_, peer_, "aborted: " + abort_->reason());
  }
};

/// A gradsync communicator over MPI: a private duplicate of `user` (errors
/// returned, not fatal). MPI must be initialised (see session). Move-only;
/// frees its duplicate on destruction if MPI is still running.
class communicator {
public:
  static constexpr std::string_view name = "mpi";

  explicit communicator(MPI_Comm user = MPI_COMM_WORLD) {
    GRADSYNC_REQUIRE(detail::initialized(), "mpi.communicator", -1,
            "MPI is not initialised: create a gradsync::mpi::session or call MPI_Init first");
    detail::check(MPI_Comm_dup(user, &comm_), "mpi.communicator", -1);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    int* ub = nullptr;
    int has_ub = 0;
    if (MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &has_ub) == MPI_SUCCESS && has_ub && ub) tag_ub_ = *ub;
    // Node of every rank (for hierarchical schedules): ranks sharing memory
    // form one node, numbered by their lowest rank.
    MPI_Comm local;
    detail::check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
                  "mpi.communicator", rank_);
    int lowest = rank_;
    MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, local);
    MPI_Comm_free(&local);
    node_.resize(static_cast<std::size_t>(size_));
    MPI_Allgather(&lowest, 1, MPI_INT, node_.data(), 1, MPI_INT, comm_);
    for (int r = 0; r < size_; ++r) { // node q is numbered q = its lowest rank
      if (node_[static_cast<std::size_t>(r)] == r) ++shape_.count;
      shape_.largest = std::max(shape_.largest, static_cast<int>(std::count(node_.begin(), node_.end(), node_[static_cast<std::size_t>(r)])));
    }
    round_ = detail::round_steps(node_, rank_);
    trace_ = timeline::from_env(rank_, size_);
    gpu_aware_ = detail::gpu_aware_library();
  }
  communicator(communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_), gpu_aware_(o.gpu_aware_),
        node_(std::move(o.node_)), round_(std::move(o.round_)), shape_(o.shape_), timeout_(o.timeout_), tag_ub_(o.tag_ub_),
        calls_(std::move(o.calls_)), abort_(std::move(o.abort_)), check_(std::move(o.check_)),
        trace_(std::move(o.trace_)) {}
  communicator& operator=(communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      gpu_aware_ = o.gpu_aware_;
      size_ = o.size_;
      node_ = std::move(o.node_);
      round_ = std::move(o.round_);
      shape_ = o.shape_;
      timeout_ = o.timeout_;
      tag_ub_ = o.tag_ub_;
      calls_ = std::move(o.calls_);
      abort_ = std::move(o.abort_);
      check_ = std::move(o.check_);
      trace_ = std::move(o.trace_);
    }
    return *this;
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  ~communicator() { release(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// Whether the MPI library is CUDA-aware (detail::gpu_aware_library, asked once).
  bool gpu_aware() const noexcept { return gpu_aware_; }
  /// Whether a device range may be posted as it is right now (staged.hpp then
  /// does not stage it): a CUDA-aware library, outside a call checked in
  /// band (whose frames are host copies of the payload).
  bool takes_device_now() const noexcept { return gpu_aware_ && !check_->frames(); }
  /// Node (shared-memory domain) of rank `r`, numbered by its lowest rank.
  int node_of(int r) const {
    GRADSYNC_REQUIRE(r >= 0 && r < size_, "mpi.node_of", rank_,
            "rank " + std::to_string(r) + " out of range [0, " + std::to_string(size_) + ")");
    return node_[static_cast<std::size_t>(r)];
  }
  /// How many nodes, and the most ranks on one (fixed at construction, so
  /// the automatic algorithm choice need not rebuild the node map per call).
  struct node_shape_t {
    int count = 0, largest = 0;
  };
  node_shape_t node_shape() const noexcept { return shape_; }
  /// The private duplicate communicator gradsync uses.
  MPI_Comm native() const noexcept { return comm_; }
  /// MPI_Wtime (`clocked`): the simulated clock under SimGrid SMPI.
  double wtime() const noexcept { return MPI_Wtime(); }
  /// Whether MPI_Wtime repeats itself (clock_repeats): compiled for a
  /// simulator (-DGRADSYNC_MPI_SIMULATED_CLOCK, bench/sim/build.sh), where
  /// the same steps take the same simulated time every time.
  bool wtime_repeats() const noexcept {
#if defined(GRADSYNC_MPI_SIMULATED_CLOCK)
    return true;
#else
    return false;
#endif
  }
  /// How long a wait blocks before failing (default policy::default_timeout).
  void set_timeout(std::chrono::milliseconds t) noexcept { timeout_ = t; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// The record of collective calls on this communicator (sequence numbers,
  /// first failure: see core/call_record.hpp).
  call_record& calls() noexcept { return calls_; }
  /// This rank's timeline (core/timeline.hpp): GRADSYNC_TIMELINE's when the
  /// communicator was made, or set_trace's; nullptr for none.
  timeline* trace() const noexcept { return trace_.get(); }
  void set_trace(std::unique_ptr<timeline> t) noexcept { trace_ = std::move(t); }

  /// Fails this rank's pending and later operations with errc::aborted
  /// (callable from any thread: a blocked wait returns within a few polls).
  /// MPI cannot free another process's wait short of MPI_Abort, so the other
  /// ranks see this one fall silent and time out.
  void abort(const std::string& reason) {
    {
      std::lock_guard g(abort_->m);
      if (abort_->why.empty()) abort_->why = "rank " + std::to_string(rank_) + " aborted: " + reason;
    }
    abort_->set.store(true, std::memory_order_release);
    calls_.fail("aborted: " + reason);
  }

  /// Posts a send of `data` to `peer` with `tag`.
  request isend(std::span<const std::byte> data, int peer, int tag) {
    return post(true, const_cast<std::byte*>(data.data()), data.size(), peer, tag);
  }
  /// Posts a synchronous send (MPI_Issend): it completes once `peer` has
  /// matched it, so sends made one after another do not cross together.
  request issend(std::span<const std::byte> data, int peer, int tag) {
    return post(true, const_cast<std::byte*>(data.data()), data.size(), peer, tag, /*upto=*/false, /*sync=*/true);
  }
  /// Posts a receive of exactly `data.size()` bytes from `peer`.
  request irecv(std::span<std::byte> data, int peer, int tag) {
    return post(false, data.data(), data.size(), peer, tag);
  }
  /// Posts a receive of at most `capacity.size()` bytes from `peer`; the
  /// request's received() says how many arrived. A larger message fails this
  /// receive with errc::mismatch (MPI cannot tell the sender, whose send
  /// completes). The capacity must be below policy::mpi_max_message_bytes:
  /// a larger transfer travels as several messages, and a receiver that does
  /// not know the size could not tell where it ends.
  request irecv_upto(std::span<std::byte> capacity, int peer, int tag) {
    GRADSYNC_REQUIRE(capacity.size() < policy::mpi_max_message_bytes, "mpi.recv", rank_,
                     "irecv_upto capacity of " + std::to_string(capacity.size()) +
                         " bytes is not below policy::mpi_max_message_bytes (" +
                         std::to_string(policy::mpi_max_message_bytes) + ")",
                     peer);
    return post(false, capacity.data(), capacity.size(), peer, tag, true);
  }

private:
  request post(bool is_send, std::byte* p, std::size_t n, int peer, int tag, bool upto = false, bool sync = false) {
    const char* op = is_send ? "mpi.send" : "mpi.recv";
    const scoped_phase phase(trace(), is_send ? "send" : "recv", "transport", message_args(peer, n, tag));
    GRADSYNC_REQUIRE(peer >= 0 && peer < size_, op, rank_,
            "peer " + std::to_string(peer) + " out of range [0, " + std::to_string(size_) + ")");
    GRADSYNC_REQUIRE(tag >= 0 && tag <= tag_ub_, op, rank_,
                     "tag " + std::to_string(tag) + " out of MPI's range [0, MPI_TAG_UB = " + std::to_string(tag_ub_) +
                         "]", peer);
    if (abort_->set.load(std::memory_order_acquire))
      throw error(errc::aborted, op, rank_, peer, "aborted: " + abort_->reason());
    request r;
    r.op_ = op;
    r.rank_ = rank_;
    r.peer_ = peer;
    r.recv_ = !is_send;
    r.upto_ = upto;
    r.timeout_ = timeout_;
    r.abort_ = abort_;
    r.trace_ = trace();
    if (check_->frames()) { // a checked call's message: the hashes go first
      constexpr std::size_t h = detail::check_state::header;
      GRADSYNC_REQUIRE(n < policy::mpi_max_message_bytes - h, op, rank_,
                       "a message of " + std::to_string(n) + " bytes in a call checked in band", peer);
      r.check_ = check_.get();
      r.comm_ = comm_;
      r.frame_ = check_->take(n + h);
      if (is_send) {
        std::memcpy(r.frame_.p, &check_->mine, h);
        if (n) std::memcpy(r.frame_.p + h, p, n);
      } else {
        r.user_ = p;
      }
      MPI_Request q = MPI_REQUEST_NULL;
      const int len = static_cast<int>(n + h);
      detail::check(is_send ? (sync ? MPI_Issend : MPI_Isend)(r.frame_.p, len, MPI_BYTE, peer, tag, comm_, &q)
                            : MPI_Irecv(r.frame_.p, len, MPI_BYTE, peer, tag, comm_, &q),
                    op, rank_, peer);
      r.reqs_.push_back(q);
      r.sizes_.push_back(n + h);
      return r;
    }
    const std::size_t chunk = policy::mpi_max_message_bytes;
    std::size_t off = 0;
    do {
      const std::size_t len = std::min(chunk, n - off);
      MPI_Request q = MPI_REQUEST_NULL;
      const int rc = is_send ? (sync ? MPI_Issend : MPI_Isend)(p + off, static_cast<int>(len), MPI_BYTE, peer, tag, comm_, &q)
                             : MPI_Irecv(p + off, static_cast<int>(len), MPI_BYTE, peer, tag, comm_, &q);
      detail::check(rc, op, rank_, peer);
      r.reqs_.push_back(q);
      r.sizes_.push_back(len);
      off += len;
    } while (off < n);
    return r;
  }
  // A failed communicator's duplicate is retired, not freed: its failed
  // call may have left messages in flight or unmatched, and MPICH recycles a
  // freed communicator's context id, so a later duplicate would receive them
  // as its own ("received 4 bytes where 1000 were posted"). One handle per
  // failure is the price.
  void release() noexcept {
    if (comm_ != MPI_COMM_NULL && detail::initialized() && !calls_.failed()) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool gpu_aware_ = false;
  std::vector<int> node_;
  std::vector<std::pair<int, int>> round_; // check_round's (to, from) steps (detail::round_steps)
  node_shape_t shape_;
  std::chrono::milliseconds timeout_ = policy::default_timeout;
  int tag_ub_ = 32767; // MPI_TAG_UB (the standard's minimum until queried)
  call_record calls_;
  std::shared_ptr<detail::abort_state> abort_ = std::make_shared<detail::abort_state>();
  std::shared_ptr<detail::check_state> check_ = std::make_shared<detail::check_state>();
  std::unique_ptr<timeline> trace_;

  // Waits for raw request `q` of the check, bounded by the timeout and woken
  // by abort; returns its status, or nothing when `stop()` says to give up
  // first (the request is then cancelled).
  template <class Stop> std::optional<MPI_Status> check_wait(MPI_Request& q, int peer, Stop stop) {
    detail::world_errors_return guard;
    MPI_Status st{};
#if defined(GRADSYNC_MPI_BLOCKING_WAIT)
    // Simulators: block as request::wait does (no timeout, no early stop).
    (void)stop;
    detail::check(MPI_Wait(&q, &st), "mpi.check", rank_, peer);
    return st;
#endif
    const auto start = std::chrono::steady_clock::now();
    for (unsigned i = 0;; ++i) {
      int flag = 0;
      detail::check(MPI_Test(&q, &flag, &st), "mpi.check", rank_, peer);
      if (flag) return st;
      if ((i & 255u) == 255u) {
        const bool aborted = abort_->set.load(std::memory_order_acquire);
        const bool late = std::chrono::steady_clock::now() - start > timeout_;
        const bool stopped = !aborted && !late && stop();
        if (aborted || late || stopped) {
          MPI_Cancel(&q);
          MPI_Wait(&q, MPI_STATUS_IGNORE);
          if (stopped) return std::nullopt;
          if (aborted) throw error(errc::aborted, "mpi.check", rank_, peer, "aborted: " + abort_->reason());
          throw error(errc::timeout, "mpi.check", rank_, peer, gradsync::detail::timed_out(timeout_));
        }
        sched_yield();
      }
    }
  }

public:
  /// The call check (capability inband_checked, collectives.hpp's run_call).
  /// `seq`: the call's number on its tag; `base`: its tag + policy::verify_tag_offset.
  int check_begin(std::uint64_t hash, std::uint64_t seq, int base, bool framed) {
    auto& s = *check_;
    GRADSYNC_REQUIRE(base >= 0 && base <= tag_ub_ - 2, "mpi.check", rank_,
                     "agreement tags from " + std::to_string(base) + " exceed MPI_TAG_UB = " + std::to_string(tag_ub_));
    bool idle = false;
    if (!s.active.compare_exchange_strong(idle, true, std::memory_order_acq_rel))
      return s.owner.load(std::memory_order_relaxed) == std::this_thread::get_id() ? 0 : -1;
    s.owner.store(std::this_thread::get_id(), std::memory_order_relaxed);
    s.framed = framed;
    s.disagreed = false;
    s.why.clear();
    s.mine = s.lo = s.hi = hash;
    s.seq = seq;
    s.base = base;
    s.cut = 0;
    return 1;
  }
  void check_end() noexcept {
    check_->framed = false;
    check_->active.store(false, std::memory_order_release);
  }
  bool check_agreed() const noexcept { return !check_->disagreed && check_->lo == check_->mine && check_->hi == check_->mine; }
  bool check_disagreed() const noexcept { return check_->disagreed; }

  /// The agreement round of a call that is not framed: the steps of
  /// detail::round_steps (dissemination inside the node, between nodes,
  /// ceil(log2 p) steps when all ranks share one node or none does), in
  /// each of which this rank sends one peer the smallest and largest hash it
  /// has seen and takes another's (min and max are idempotent: every rank
  /// ends with the same two). A fingerprint on its way (some rank saw a
  /// disagreement and is exchanging) ends the round. True when all agree.
  bool check_round() {
    auto& s = *check_;
    const int r = rank_;
    for (const auto& [to, from] : round_) {
      if (s.disagreed) break;
      s.round_out[0] = s.lo;
      s.round_out[1] = s.hi;
      std::uint64_t in[2] = {0, 0};
      MPI_Request rq = MPI_REQUEST_NULL, sq = MPI_REQUEST_NULL;
      detail::check(MPI_Irecv(in, sizeof in, MPI_BYTE, from, s.round_tag(), comm_, &rq), "mpi.check", r, from);
      detail::check(MPI_Isend(s.round_out, sizeof s.round_out, MPI_BYTE, to, s.round_tag(), comm_, &sq), "mpi.check", r, to);
      int q = -1;
      const auto got = check_wait(rq, from, [&] { return (q = s.other_call(comm_, false)) >= 0; });
      check_wait(sq, to, [] { return false; });
      if (!got) {
        s.disagree("rank " + std::to_string(q) + " is exchanging fingerprints");
        break;
      }
      s.merge(in[0], in[1]);
    }
    if (s.lo != s.hi) s.disagree("the hashes differ");
    return !s.disagreed;
  }

  /// Every rank's fingerprint (wire form, rank order; this rank's is `mine`), once the call is
  /// known to be disagreed: this rank sends its own to every rank and takes
  /// every rank's. Bounded by the timeout.
  std::vector<std::byte> check_fingerprints(std::span<const std::byte> mine) {
    auto& s = *check_;
    const int p = size_, r = rank_;
    const std::size_t w = mine.size();
    GRADSYNC_REQUIRE(w <= detail::check_state::wire_max, "mpi.check", rank_,
                     "a fingerprint of " + std::to_string(w) + " bytes");
    std::memcpy(s.wire, mine.data(), w);
    s.disagreed = true;
    std::vector<std::byte> all(static_cast<std::size_t>(p) * w);
    std::memcpy(all.data() + static_cast<std::size_t>(r) * w, s.wire, w);
    std::vector<MPI_Request> sends, recvs;
    for (int q = 0; q < p; ++q) {
      if (q == r) continue;
      recvs.push_back(MPI_REQUEST_NULL);
      detail::check(MPI_Irecv(all.data() + static_cast<std::size_t>(q) * w, static_cast<int>(w), MPI_BYTE, q,
                              s.print_tag(), comm_, &recvs.back()),
                    "mpi.check", r, q);
      sends.push_back(MPI_REQUEST_NULL);
      detail::check(MPI_Isend(s.wire, static_cast<int>(w), MPI_BYTE, q, s.print_tag(), comm_, &sends.back()),
                    "mpi.check", r, q);
    }
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      const int q = static_cast<int>(i) < r ? static_cast<int>(i) : static_cast<int>(i) + 1;
      try {
        check_wait(recvs[i], q, [] { return false; });
      } catch (...) {
        for (std::size_t j = i + 1; j < recvs.size(); ++j) {
          MPI_Cancel(&recvs[j]);
          MPI_Wait(&recvs[j], MPI_STATUS_IGNORE);
        }
        throw;
      }
    }
    for (auto& q : sends) check_wait(q, -1, [] { return false; });
    return all;
  }
private:
};

static_assert(transport<communicator>);
static_assert(upto_receiver<communicator> && node_map<communicator> && timed<communicator> && recorded<communicator> &&
              traced<communicator>);
// abort() frees this rank's blocked calls only (see there).
static_assert(abortable<communicator> && synchronous_sender<communicator>);
static_assert(inband_checked<communicator>);
static_assert(!shared_arena<communicator> && !device_memory<communicator> &&
              !stream_ordered<communicator>);

/// RAII MPI lifetime for programs that want gradsync to manage it: initialises
/// MPI unless the program already did, and finalises it only if it initialised it.
class session {
public:
  /// `required` thread level: MPI_THREAD_SERIALIZED lets a background
  /// progress thread drive collectives while the main thread computes.
  session(int& argc, char**& argv, int required = MPI_THREAD_SERIALIZED) { init(&argc, &argv, required); }
  explicit session(int required = MPI_THREAD_SERIALIZED) { init(nullptr, nullptr, required); }
  session(const session&) = delete;
  session& operator=(const session&) = delete;
  /// Finalises MPI if this session initialised it. Left by an exception
  /// (a failed collective, say), it aborts the job instead: MPI_Finalize
  /// waits for every rank, and a rank that died or stopped never comes.
  ~session() {
    if (!owner_ || !detail::initialized()) return;
    if (std::uncaught_exceptions() > 0) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
  }
  /// A communicator over all processes (a duplicate of MPI_COMM_WORLD).
  communicator world() const { return communicator(MPI_COMM_WORLD); }
  /// Thread level MPI provides.
  int thread_level() const noexcept { return provided_; }
  /// True if this session initialised MPI (and will finalise it).
  bool owner() const noexcept { return owner_; }

private:
  void init(int* argc, char*** argv, int required) {
    int init = 0;
    MPI_Initialized(&init);
    if (init) {
      MPI_Query_thread(&provided_);
      return;
    }
    const int rc = MPI_Init_thread(argc, argv, required, &provided_);
    if (rc != MPI_SUCCESS) throw error(errc::internal, "mpi.session", -1, -1, detail::error_string(rc));
    owner_ = true;
  }
  bool owner_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

/// True when the program was started by an MPI launcher (mpiexec/mpirun sets
/// one of these variables), so a binary can default to the MPI transport.
inline bool launched_by_mpiexec() {
  for (const char* v : {"PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

/// The MPI library's own collectives on gradsync's duplicate communicator:
/// the peer baseline of the bench, and a fallback for users. Counts above
/// INT_MAX are split into several calls where the operation allows it.
namespace native {

namespace detail {
template <element T, reduce_op Op> void user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = combine1(a[i], b[i], Op{});
}

// An MPI_Op for (T, Op): the built-in when MPI has one, else a temporary user op.
template <element T, reduce_op Op> class op_handle {
public:
  op_handle() {
    if constexpr (has_builtin_reduction<T>) op_ = builtin_op<Op>();
    else {
      MPI_Op_create(&user_reduce<T, Op>, 1, &op_);
      owned_ = true;
    }
  }
  ~op_handle() {
    if (owned_ && gradsync::mpi::detail::initialized()) MPI_Op_free(&op_);
  }
  op_handle(const op_handle&) = delete;
  op_handle& operator=(const op_handle&) = delete;
  MPI_Op get() const { return op_; }

private:
  MPI_Op op_ = MPI_OP_NULL;
  bool owned_ = false;
};

inline int int_count(std::size_t n, const char* op, int rank) {
  GRADSYNC_REQUIRE(n <= static_cast<std::size_t>(INT_MAX), op, rank,
          "native MPI baseline limited to INT_MAX elements per block");
  return static_cast<int>(n);
}
} // namespace detail

/// MPI_Allreduce (in place when in and out are the same buffer).
template <element T, reduce_op Op = op::sum>
void allreduce(communicator& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op = {}) {
  GRADSYNC_REQUIRE(out.size() >= in.size(), "native.allreduce", c.rank(), "output smaller than input");
  detail::op_handle<T, Op> h;
  const std::size_t step = INT_MAX;
  for (std::size_t off = 0; off < in.size(); off += step) {
    const int n = static_cast<int>(std::min(step, in.size() - off));
    const void* src = in.data() == out.data() ? MPI_IN_PLACE : static_cast<const void*>(in.data() + off);
    gradsync::mpi::detail::check(MPI_Allreduce(src, out.data() + off, n, datatype<T>(), h.get(), c.native()),
                                 "native.allreduce", c.rank());
  }
  finalize(out.data(), in.size(), op, c.size());
}

/// MPI_Reduce_scatter_block: in holds size() blocks of out.size() elements.
template <element T, reduce_op Op = op::sum>
void reduce_scatter(communicator& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, Op op = {}) {
  GRADSYNC_REQUIRE(in.size() == out.size() * static_cast<std::size_t>(c.size()), "native.reduce_scatter",
          c.rank(), "input must hold ranks x output elements");
  detail::op_handle<T, Op> h;
  const int n = detail::int_count(out.size(), "native.reduce_scatter", c.rank());
  gradsync::mpi::detail::check(
      MPI_Reduce_scatter_block(in.data(), out.data(), n, datatype<T>(), h.get(), c.native()),
      "native.reduce_scatter", c.rank());
  finalize(out.data(), out.size(), op, c.size());
}

/// MPI_Allgather: out holds size() blocks of in.size() elements.
template <element T>
void allgather(communicator& c, std::type_identity_t<std::span<const T>> in, std::span<T> out) {
  GRADSYNC_REQUIRE(out.size() == in.size() * static_cast<std::size_t>(c.size()), "native.allgather", c.rank(),
          "output must hold ranks x input elements");
  const int n = detail::int_count(in.size(), "native.allgather", c.rank());
  gradsync::mpi::detail::check(MPI_Allgather(in.data(), n, datatype<T>(), out.data(), n, datatype<T>(), c.native()),
                               "native.allgather", c.rank());
}

/// MPI_Bcast from `root`.
template <element T> void broadcast(communicator& c, std::span<T> data, int root) {
  const std::size_t step = INT_MAX;
  for (std::size_t off = 0; off < data.size(); off += step) {
    const int n = static_cast<int>(std::min(step, data.size() - off));
    gradsync::mpi::detail::check(MPI_Bcast(data.data() + off, n, datatype<T>(), root, c.native()),
                                 "native.broadcast", c.rank());
  }
}

/// MPI_Reduce to `root` (out used at the root only).
template <element T, reduce_op Op = op::sum>
void reduce(communicator& c, std::type_identity_t<std::span<const T>> in, std::span<T> out, int root, Op op = {}) {
  detail::op_handle<T, Op> h;
  const bool at_root = c.rank() == root;
  const std::size_t step = INT_MAX;
  for (std::size_t off = 0; off < in.size(); off += step) {
    const int n = static_cast<int>(std::min(step, in.size() - off));
    const void* src = at_root && in.data() == out.data() ? MPI_IN_PLACE : static_cast<const void*>(in.data() + off);
    gradsync::mpi::detail::check(MPI_Reduce(src, at_root ? out.data() + off : nullptr, n, datatype<T>(), h.get(),
                                            root, c.native()),
                                 "native.reduce", c.rank());
  }
  if (at_root) finalize(out.data(), in.size(), op, c.size());
}

/// MPI_Barrier.
inline void barrier(communicator& c) {
  gradsync::mpi::detail::check(MPI_Barrier(c.native()), "native.barrier", c.rank());
}

} // namespace native
} // namespace gradsync::mpi

// Opt-in prebuilt instantiations (gradsync/prebuilt.hpp).
#if defined(GRADSYNC_PREBUILT) && !defined(GRADSYNC_PREBUILT_INSTANTIATE)
#include "../prebuilt/mpi.hpp"
#endif
