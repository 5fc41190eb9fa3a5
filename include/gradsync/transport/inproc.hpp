// gradsync: the in-process transport. N ranks are N threads of one process;
// the embedded default, needing nothing but a C++20 compiler and threads.
//
// A message is copied exactly once: whichever side arrives second copies
// straight from the sender's buffer into the posted receive buffer (a
// rendezvous), so a send completes only when it has been received.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/futex.hpp"
#include "../core/policy.hpp"
#include "../core/timeline.hpp"
#include "capabilities.hpp"
#include "transport.hpp"

namespace gradsync::inproc {

namespace detail {

struct mailbox;

struct op_state {
  std::atomic<std::uint32_t> done{0};
  std::atomic<std::uint32_t> sleeping{0}; // a waiter may be blocked in the kernel
  mailbox* box = nullptr; // where it waits while unmatched
  std::string error; // written before `done` is released
  errc kind = errc::internal; // of `error`
  std::size_t received = 0;   // a receive's byte count, written before `done`
  const char* op = "";
  int rank = -1, peer = -1;
};

struct posted {
  int peer; // the other side: source for a receive, destination for a send
  int tag;
  std::byte* data; // a send stores its const buffer here; it is never written
  std::size_t bytes; // a receive's capacity when `upto`
  std::shared_ptr<op_state> st;
  bool upto = false; // a receive of up to `bytes`
};

struct mailbox {
  std::mutex m;
  std::deque<posted> sends; // unmatched sends addressed to this rank
  std::deque<posted> recvs; // unmatched receives posted by this rank
};

// Blocking with a deadline needs the futex directly (core/futex.hpp).
inline void complete(op_state& s, std::string err = {}, errc kind = errc::internal) {
  s.error = std::move(err);
  s.kind = kind;
  s.done.store(1); // seq_cst pairs with the waiter's store to `sleeping`
  if (s.sleeping.load()) gradsync::detail::futex_wake(s.done, gradsync::detail::futex_scope::process_private);
}

// Sleeps until `done` is set or `until` passes; returns whether it was set.
inline bool block_until(op_state& s, std::chrono::steady_clock::time_point until) {
  s.sleeping.store(1);
  while (s.done.load() == 0) {
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) return false;
    gradsync::detail::futex_wait(s.done, 0, std::chrono::duration_cast<std::chrono::nanoseconds>(left),
                                 gradsync::detail::futex_scope::process_private);
  }
  return true;
}

// The record board of one tag (communicator::board_post): two halves used
// by alternate calls, so a rank that is already in call k + 1 never
// overwrites a record a slower rank still reads for call k (it cannot reach
// call k + 2 before every rank has arrived at k + 1, i.e. finished reading k).
struct board {
  struct alignas(64) slot {
    std::byte data[board_record_bytes];
    std::atomic<std::uint64_t> call{0}; // the owner's last call number on this half
  };
  explicit board(int n) : posts(std::make_unique<std::uint64_t[]>(static_cast<std::size_t>(n))) {
    for (auto& h : half) h.slots = std::make_unique<slot[]>(static_cast<std::size_t>(n));
  }
  std::unique_ptr<std::uint64_t[]> posts; // per rank: its posts on this tag (its own thread only)
  struct half_t {
    std::unique_ptr<slot[]> slots;
    alignas(64) std::atomic<std::uint32_t> arrived{0}; // grows by size() per call; wraps
    std::atomic<std::uint32_t> sleepers{0};
  } half[2];
};

} // namespace detail

/// The shared state of one group of in-process ranks.
class world {
public:
  explicit world(int n) : boxes_(static_cast<std::size_t>(n > 0 ? n : 0)), n_(n) {
    GRADSYNC_REQUIRE(n >= 1, "inproc.world", -1, "rank count must be >= 1, got " + std::to_string(n));
    spin_ = n <= static_cast<int>(std::thread::hardware_concurrency());
    if (const auto spec = timeline::env_spec(); !spec.empty()) trace_to(timeline::path_of(spec, 0, 1));
  }
  int size() const noexcept { return n_; }

  /// Communicators made from now on record their timelines into `file`
  /// (an empty path: none); the file is complete once the world and its
  /// communicators are gone (or trace()->close() was called).
  void trace_to(const std::filesystem::path& file) {
    trace_ = file.empty() ? nullptr : std::make_shared<trace_file>(file);
  }
  /// The trace file of this world's ranks, or nullptr.
  const std::shared_ptr<trace_file>& trace() const noexcept { return trace_; }

  /// Fails every pending and future operation of every rank with `reason`
  /// (used when one rank throws, so that no other rank waits forever).
  void abort(const std::string& reason) {
    {
      std::lock_guard g(abort_m_);
      if (aborted_.load()) return;
      abort_reason_ = reason;
      aborted_.store(true);
    }
    for (auto& b : boxes_) {
      std::lock_guard g(b.m);
      for (auto& p : b.sends) detail::complete(*p.st, "aborted: " + reason, errc::aborted);
      for (auto& p : b.recvs) detail::complete(*p.st, "aborted: " + reason, errc::aborted);
      b.sends.clear();
      b.recvs.clear();
    }
    std::lock_guard g(boards_m_);
    for (auto& [tag, b] : boards_)
      for (auto& h : b->half) gradsync::detail::futex_wake(h.arrived, gradsync::detail::futex_scope::process_private);
  }
  bool aborted() const noexcept { return aborted_.load(); }
  bool spin() const noexcept { return spin_; }
  /// How long any wait blocks before failing (default policy::default_timeout),
  /// for every communicator that has not set its own.
  void set_timeout(std::chrono::milliseconds t) noexcept { timeout_ms_.store(t.count()); }
  std::chrono::milliseconds timeout() const noexcept {
    return std::chrono::milliseconds(timeout_ms_.load());
  }

private:
  friend class communicator;
  std::string reason() {
    std::lock_guard g(abort_m_);
    return abort_reason_;
  }
  detail::board& board_of(int tag) {
    std::lock_guard g(boards_m_);
    auto& b = boards_[tag];
    if (!b) b = std::make_unique<detail::board>(n_);
    return *b;
  }
  std::vector<detail::mailbox> boxes_;
  std::mutex boards_m_;
  std::unordered_map<int, std::unique_ptr<detail::board>> boards_; // by tag; never erased
  int n_;
  bool spin_ = true;
  std::atomic<long long> timeout_ms_{policy::default_timeout.count()};
  std::atomic<bool> aborted_{false};
  std::mutex abort_m_;
  std::string abort_reason_;
  std::shared_ptr<trace_file> trace_;
};

/// Completion handle of an in-process send or receive.
class request {
public:
  request() = default;
  request(std::shared_ptr<detail::op_state> s, bool spin, std::chrono::milliseconds timeout, timeline* trace)
      : s_(std::move(s)), timeout_(timeout), spin_(spin), trace_(trace) {}
  request(request&& o) noexcept
      : s_(std::move(o.s_)), timeout_(o.timeout_), received_(o.received_), spin_(o.spin_), trace_(o.trace_) {}
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      cancel();
      s_ = std::move(o.s_);
      timeout_ = o.timeout_;
      received_ = o.received_;
      spin_ = o.spin_;
      trace_ = o.trace_;
    }
    return *this;
  }
  /// An abandoned request (e.g. during stack unwinding) is withdrawn if still
  /// unmatched, or waited for if a copy is in progress, so that no peer ever
  /// touches a buffer after its owner has released it.
  ~request() { cancel(); }

  /// True once complete; throws if the operation failed.
  bool test() {
    if (!s_) return true;
    if (s_->done.load(std::memory_order_acquire) == 0) return false;
    finish();
    return true;
  }
  /// Blocks until complete; throws gradsync::error if the operation failed
  /// or the peer did not match it within the communicator's timeout
  /// (errc::timeout).
  void wait() {
    if (!s_) return;
    const scoped_phase phase(trace_, "wait", "transport", wait_args(s_->peer, s_->op));
    if (spin_)
      for (int i = 0; i < 4000 && s_->done.load(std::memory_order_acquire) == 0; ++i) {
      }
    if (s_->done.load(std::memory_order_acquire) == 0 &&
        !detail::block_until(*s_, std::chrono::steady_clock::now() + timeout_)) {
      const auto s = s_;
      cancel(); // withdraws it (the peer can no longer touch our buffer) unless just matched
      if (s->done.load() == 0)
        throw error(errc::timeout, s->op, s->rank, s->peer, gradsync::detail::timed_out(timeout_));
      if (!s->error.empty()) throw error(s->kind, s->op, s->rank, s->peer, s->error);
      received_ = s->received;
      return;
    }
    finish();
  }
  /// Bytes received (a receive, once wait() returned or test() returned true;
  /// for a send, 0).
  std::size_t received() const noexcept { return received_; }

private:
  void cancel() noexcept {
    if (!s_ || s_->done.load(std::memory_order_acquire) != 0) return;
    bool withdrawn = false;
    {
      std::lock_guard g(s_->box->m);
      for (auto* q : {&s_->box->sends, &s_->box->recvs})
        for (auto it = q->begin(); it != q->end(); ++it)
          if (it->st == s_) {
            q->erase(it);
            withdrawn = true;
            break;
          }
    }
    if (!withdrawn) // matched: the copy is in progress and finishes soon
      detail::block_until(*s_, std::chrono::steady_clock::time_point::max());
    s_.reset();
  }
  void finish() {
    auto s = std::move(s_);
    if (!s->error.empty()) throw error(s->kind, s->op, s->rank, s->peer, s->error);
    received_ = s->received;
  }
  std::shared_ptr<detail::op_state> s_;
  std::chrono::milliseconds timeout_ = policy::default_timeout;
  std::size_t received_ = 0;
  bool spin_ = true;
  timeline* trace_ = nullptr;
};

/// One rank's view of a world.
class communicator {
public:
  static constexpr std::string_view name = "inproc";

  communicator(std::shared_ptr<world> w, int rank) : w_(std::move(w)), rank_(rank) {
    GRADSYNC_REQUIRE(w_ != nullptr, "inproc.communicator", rank, "null world");
    GRADSYNC_REQUIRE(rank >= 0 && rank < w_->size(), "inproc.communicator", rank,
            "rank out of range [0, " + std::to_string(w_->size()) + ")");
    if (w_->trace()) trace_ = std::make_unique<timeline>(w_->trace(), 0, rank, "rank " + std::to_string(rank));
  }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return w_->size(); }
  world& group() const noexcept { return *w_; }

  /// How long this rank's waits block before failing: its own value once
  /// set_timeout was called, else the world's (world::set_timeout).
  std::chrono::milliseconds timeout() const noexcept {
    return own_timeout_ ? timeout_ : w_->timeout();
  }
  /// Sets this communicator's timeout (other ranks keep theirs).
  void set_timeout(std::chrono::milliseconds t) noexcept {
    timeout_ = t;
    own_timeout_ = true;
  }
  /// Fails every pending and future operation of every rank of the world
  /// with `reason` (errc::aborted); blocked waits are woken.
  void abort(const std::string& reason) { w_->abort("rank " + std::to_string(rank_) + " aborted: " + reason); }
  /// The record of collective calls on this communicator (sequence numbers,
  /// first failure: see core/call_record.hpp).
  call_record& calls() noexcept { return calls_; }
  /// This rank's timeline (core/timeline.hpp), or nullptr when the world traces nothing.
  timeline* trace() const noexcept { return trace_.get(); }

  /// Posts a send of `data` to `peer`. The buffer must stay valid until the
  /// request completes (i.e. until the receiver has copied it).
  request isend(std::span<const std::byte> data, int peer, int tag) {
    const scoped_phase phase(trace(), "send", "transport", message_args(peer, data.size(), tag));
    check_peer("inproc.send", peer);
    auto& box = w_->boxes_[static_cast<std::size_t>(peer)];
    auto st = make_state("inproc.send", peer, box);
    detail::posted mine{rank_, tag, const_cast<std::byte*>(data.data()), data.size(), st};
    detail::posted other;
    if (!match(box, box.recvs, box.sends, rank_, mine, other)) return pending(st);
    transfer(mine, other, /*send_st=*/*st, /*recv_st=*/*other.st, peer, rank_);
    return pending(st);
  }

  /// Posts a receive of exactly `data.size()` bytes from `peer`.
  request irecv(std::span<std::byte> data, int peer, int tag) { return post_recv(data, peer, tag, false); }

  /// Posts a receive of at most `capacity.size()` bytes from `peer`; the
  /// request's received() says how many arrived. A larger message fails
  /// both sides with errc::mismatch.
  request irecv_upto(std::span<std::byte> capacity, int peer, int tag) {
    return post_recv(capacity, peer, tag, true);
  }

  /// Publishes this rank's record for its next call on `tag` on the
  /// world's board (record_board in capabilities.hpp); never waits.
  board_ticket board_post(int tag, std::span<const std::byte> mine, const char* name) {
    GRADSYNC_REQUIRE(mine.size() <= board_record_bytes, name, rank_,
                     "board_post: a record of " + std::to_string(mine.size()) + " bytes (at most " +
                         std::to_string(board_record_bytes) + ")");
    detail::board* b;
    {
      // Threads of one rank may call on different tags (the fusion engine's
      // progress thread): the cache is shared, a tag's board is not.
      std::lock_guard g(boards_m_);
      auto& cached = boards_[tag];
      if (!cached) cached = &w_->board_of(tag);
      b = cached;
    }
    const std::uint64_t k = b->posts[static_cast<std::size_t>(rank_)]++;
    auto& h = b->half[k & 1];
    auto& mine_slot = h.slots[static_cast<std::size_t>(rank_)];
    std::memcpy(mine_slot.data, mine.data(), mine.size());
    mine_slot.call.store(k + 1, std::memory_order_relaxed); // published by the fetch_add
    const bool last = h.arrived.fetch_add(1) + 1 == board_target(k + 1);
    if (last && h.sleepers.load() != 0)
      gradsync::detail::futex_wake(h.arrived, gradsync::detail::futex_scope::process_private);
    return board_ticket{&h, k + 1, mine.size(), tag, last};
  }
  /// Copies every rank's record of ticket `t`'s call into `all` (rank
  /// order); false if some rank has not posted it and `wait` is false.
  bool board_collect(const board_ticket& t, std::span<std::byte> all, bool wait, const char* name) {
    GRADSYNC_REQUIRE(t.where != nullptr && all.size() == t.bytes * static_cast<std::size_t>(size()), name, rank_,
                     "board_collect: " + std::to_string(all.size()) + " bytes for " + std::to_string(size()) +
                         " records of " + std::to_string(t.bytes));
    auto& h = *static_cast<detail::board::half_t*>(t.where);
    const std::uint32_t target = board_target(t.call);
    if (h.arrived.load(std::memory_order_acquire) != target) {
      if (!wait) return false;
      await_board(h, target, t.call, t.tag, name);
    }
    for (int q = 0; q < size(); ++q)
      std::memcpy(all.data() + t.bytes * static_cast<std::size_t>(q), h.slots[static_cast<std::size_t>(q)].data,
                  t.bytes);
    return true;
  }

private:
  // Arrivals on a board half once call `call` (from 1) is complete: the half
  // has then been used (call + 1) / 2 times by each of the p ranks.
  std::uint32_t board_target(std::uint64_t call) const noexcept {
    return static_cast<std::uint32_t>((call + 1) / 2 * static_cast<std::uint64_t>(size()));
  }
  void await_board(detail::board::half_t& h, std::uint32_t target, std::uint64_t call, int tag, const char* name) {
    if (w_->spin())
      for (int i = 0; i < 4000; ++i)
        if (h.arrived.load(std::memory_order_acquire) == target) return;
    const auto t = timeout();
    const auto until = std::chrono::steady_clock::now() + t;
    h.sleepers.fetch_add(1);
    struct leave {
      std::atomic<std::uint32_t>& n;
      ~leave() { n.fetch_sub(1); }
    } guard{h.sleepers};
    for (std::uint32_t v; (v = h.arrived.load()) != target;) {
      if (w_->aborted()) throw error(errc::aborted, name, rank_, -1, "aborted: " + w_->reason());
      const auto left = until - std::chrono::steady_clock::now();
      if (left <= std::chrono::nanoseconds::zero()) {
        std::string missing;
        int first = -1;
        for (int q = 0; q < size(); ++q)
          if (h.slots[static_cast<std::size_t>(q)].call.load() != call) {
            missing += (missing.empty() ? "" : ", ") + std::to_string(q);
            if (first < 0) first = q;
          }
        throw error(errc::timeout, name, rank_, first,
                    "call check (tag " + std::to_string(tag) + "): rank(s) " + missing + " did not make the call; " +
                        gradsync::detail::timed_out(t));
      }
      // Slices: an abort between the check above and the sleep still wakes us.
      gradsync::detail::futex_wait(h.arrived, v,
                                   std::min<std::chrono::nanoseconds>(left, std::chrono::milliseconds(50)),
                                   gradsync::detail::futex_scope::process_private);
    }
  }
  request post_recv(std::span<std::byte> data, int peer, int tag, bool upto) {
    const scoped_phase phase(trace(), "recv", "transport", message_args(peer, data.size(), tag));
    check_peer("inproc.recv", peer);
    auto& box = w_->boxes_[static_cast<std::size_t>(rank_)];
    auto st = make_state("inproc.recv", peer, box);
    detail::posted mine{peer, tag, data.data(), data.size(), st, upto};
    detail::posted other;
    if (!match(box, box.sends, box.recvs, peer, mine, other)) return pending(st);
    transfer(other, mine, *other.st, *st, rank_, peer);
    return pending(st);
  }
  // Under the box's lock: takes the oldest entry of `from` posted by `src`
  // with mine's tag into `other` (true), or queues `mine` on `to` (false;
  // an aborted world fails it at once instead).
  bool match(detail::mailbox& box, std::deque<detail::posted>& from, std::deque<detail::posted>& to, int src,
             detail::posted& mine, detail::posted& other) {
    std::lock_guard g(box.m);
    if (w_->aborted()) {
      detail::complete(*mine.st, "aborted: " + w_->reason(), errc::aborted);
      return false;
    }
    if (take(from, src, mine.tag, other)) return true;
    to.push_back(std::move(mine));
    return false;
  }
  request pending(std::shared_ptr<detail::op_state> st) {
    return request(std::move(st), w_->spin(), timeout(), trace());
  }
  static bool take(std::deque<detail::posted>& q, int peer, int tag, detail::posted& out) {
    for (auto it = q.begin(); it != q.end(); ++it)
      if (it->peer == peer && it->tag == tag) {
        out = std::move(*it);
        q.erase(it);
        return true;
      }
    return false;
  }
  // Copies a matched pair outside any lock, then releases both sides.
  static void transfer(const detail::posted& send, const detail::posted& recv,
                       detail::op_state& send_st, detail::op_state& recv_st, int dst, int src) {
    if (recv.upto ? send.bytes > recv.bytes : send.bytes != recv.bytes) {
      const std::string why = gradsync::detail::size_mismatch(src, send.bytes, dst, recv.bytes, send.tag, recv.upto);
      detail::complete(recv_st, why, errc::mismatch);
      detail::complete(send_st, why, errc::mismatch);
      return;
    }
    if (send.bytes != 0) std::memcpy(recv.data, send.data, send.bytes);
    recv_st.received = send.bytes;
    detail::complete(recv_st);
    detail::complete(send_st);
  }
  std::shared_ptr<detail::op_state> make_state(const char* op, int peer,
                                               detail::mailbox& box) const {
    auto st = std::make_shared<detail::op_state>();
    st->box = &box;
    st->op = op;
    st->rank = rank_;
    st->peer = peer;
    return st;
  }
  void check_peer(const char* op, int peer) const {
    GRADSYNC_REQUIRE(peer >= 0 && peer < size(), op, rank_,
            "peer " + std::to_string(peer) + " out of range [0, " + std::to_string(size()) + ")");
  }
  std::shared_ptr<world> w_;
  int rank_;
  std::chrono::milliseconds timeout_{0};
  bool own_timeout_ = false;
  call_record calls_;
  std::unique_ptr<timeline> trace_;
  std::mutex boards_m_;
  std::unordered_map<int, detail::board*> boards_; // tag -> the world's board (a cache)
};

static_assert(transport<communicator>);
static_assert(upto_receiver<communicator> && abortable<communicator> && timed<communicator> && recorded<communicator> &&
              traced<communicator> && record_board<communicator>);
static_assert(!node_map<communicator> && !shared_arena<communicator> && !device_memory<communicator> &&
              !stream_ordered<communicator>);

/// Runs `fn(comm)` on one thread per rank of world `w` (one fresh
/// communicator each) and returns when all have finished. If any rank
/// throws, the world is aborted (every blocked rank fails instead of
/// hanging) and the first exception that was not itself caused by the abort
/// is rethrown.
template <class Fn> void run(const std::shared_ptr<world>& w, Fn&& fn) {
  GRADSYNC_REQUIRE(w != nullptr, "inproc.run", -1, "null world");
  const int ranks = w->size();
  std::vector<std::exception_ptr> errs(static_cast<std::size_t>(ranks));
  std::vector<char> secondary(static_cast<std::size_t>(ranks), 0);
  auto body = [&](int r) {
    try {
      communicator c(w, r);
      fn(c);
    } catch (const error& e) {
      errs[static_cast<std::size_t>(r)] = std::current_exception();
      // a consequence of another rank's failure (kind aborted, whether the
      // transport raised it or a collective re-raised it as its own)
      secondary[static_cast<std::size_t>(r)] = w->aborted() && e.kind() == errc::aborted;
      w->abort("rank " + std::to_string(r) + " failed: " + e.what());
    } catch (const std::exception& e) {
      errs[static_cast<std::size_t>(r)] = std::current_exception();
      w->abort("rank " + std::to_string(r) + " failed: " + e.what());
    } catch (...) {
      errs[static_cast<std::size_t>(r)] = std::current_exception();
      w->abort("rank " + std::to_string(r) + " failed with an unknown exception");
    }
  };
  {
    std::vector<std::jthread> threads;
    threads.reserve(static_cast<std::size_t>(ranks));
    for (int r = 1; r < ranks; ++r) threads.emplace_back(body, r);
    body(0);
  }
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t r = 0; r < errs.size(); ++r)
      if (errs[r] && (pass == 1 || !secondary[r])) std::rethrow_exception(errs[r]);
}

/// run() on a fresh world of `ranks` ranks.
template <class Fn> void run(int ranks, Fn&& fn) { run(std::make_shared<world>(ranks), std::forward<Fn>(fn)); }

} // namespace gradsync::inproc

// Opt-in prebuilt instantiations (gradsync/prebuilt.hpp).
#if defined(GRADSYNC_PREBUILT) && !defined(GRADSYNC_PREBUILT_INSTANTIATE)
#include "../prebuilt/inproc.hpp"
#endif
