// gradsync: the shared-memory transport's message engine (see
// transport/shm.hpp): framing sends into the byte rings, matching receives
// per (peer, tag) in order, acknowledgements, blocking, and failure detection.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../../core/error.hpp"
#include "../../core/futex.hpp"
#include "../../core/policy.hpp"
#include "../../core/process.hpp"
#include "../../core/stream_copy.hpp"
#include "../transport.hpp"
#include "layout.hpp"
#include "segment.hpp"

namespace gradsync::shm::detail {

using gradsync::detail::cpu_relax;
using gradsync::detail::futex_wait;
using gradsync::detail::futex_wake;
using gradsync::detail::process_alive;
using gradsync::detail::stream_copy;

// State of one send or receive, shared by its request and the engine.
struct op_state {
  bool done = false;
  bool is_send = false;
  bool upto = false;        // receive: of up to `bytes`
  std::string error;
  errc error_kind = errc::internal; // of `error`
  int peer = -1, tag = 0;
  std::byte* buf = nullptr; // a send's buffer is only read
  std::size_t bytes = 0;    // a receive's capacity when `upto`
  std::size_t received = 0; // receive: message size, once matched
  std::size_t written = 0;  // send: payload bytes in the ring
  std::size_t base = 0;     // send: offset of `buf` in the message (see owned)
  std::unique_ptr<std::byte[]> owned; // send: private copy of an abandoned tail
  bool started = false;     // send: first frame written (seq assigned)
  bool acked = false;       // send: receiver matched (or rejected) it
  bool rndv = false;        // send: by rendezvous (layout.hpp's rendezvous())
  std::uint64_t seq = 0;
};
using op_ptr = std::shared_ptr<op_state>;

// A message that arrived before its receive was posted.
struct unexpected {
  int tag;
  std::uint64_t seq;
  std::size_t total, received = 0;
  std::unique_ptr<std::byte[]> data;
  bool rts = false; // announced by rendezvous: no payload until matched
};

// A rendezvous message matched to receive `op`, its payload arriving in
// `data` frames straight into op's buffer (a withdrawn receive's entry is
// removed, and its remaining frames are skipped).
struct stream_in {
  std::uint64_t seq;
  std::size_t total, received = 0;
  op_ptr op;
};

struct outbound { // this rank -> peer
  ring_ctl* ctl = nullptr;
  std::byte* data = nullptr;
  std::deque<op_ptr> sends;      // posted, first frame (or rts) not yet written, in order
  std::deque<op_ptr> streams;    // rendezvous sends acked, payload being written
  std::deque<frame> ctrl;        // acks/nacks waiting for ring space
  std::unordered_map<std::uint64_t, op_ptr> unacked;
  std::uint64_t tail = 0, head = 0, next_seq = 0; // head: cached consumer position
};

struct inbound { // peer -> this rank
  ring_ctl* ctl = nullptr;
  const std::byte* data = nullptr;
  std::deque<op_ptr> posted;     // unmatched receives, in order
  std::list<unexpected> early;   // unmatched messages, in arrival order
  std::uint64_t head = 0, tail = 0; // tail: cached producer position
  // The message being streamed (its `more` frames follow).
  bool open = false;
  std::uint64_t seq = 0;
  std::size_t total = 0, received = 0;
  std::byte* dst = nullptr;      // nullptr: discard
  op_ptr op;                     // the matched receive, if any
  unexpected* early_msg = nullptr;
  std::vector<stream_in> streams; // matched rendezvous messages, payload to come
};

using gradsync::detail::size_mismatch;

// Whether a message of `total` bytes cannot go to receive `s`.
inline bool misfit(std::size_t total, const op_state& s) { return s.upto ? total > s.bytes : total != s.bytes; }

// One rank's progress engine over the segment.
class engine {
public:
  engine(std::unique_ptr<segment> seg, int rank, int size)
      : seg_(std::move(seg)), rank_(rank), size_(size), ring_(seg_->ring_bytes()),
        out_(static_cast<std::size_t>(size)), in_(static_cast<std::size_t>(size)) {
    for (int q = 0; q < size; ++q) {
      out_[idx(q)].ctl = &seg_->ctl(rank, q);
      out_[idx(q)].data = seg_->data(rank, q);
      in_[idx(q)].ctl = &seg_->ctl(q, rank);
      in_[idx(q)].data = seg_->data(q, rank);
    }
  }
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;
  ~engine() {
    // A forked child that inherited this engine is not this rank: leave the
    // shared state alone.
    if (::getpid() != owner_) return;
    // Everything this rank wrote is already published; peers may drain it
    // after we leave (their mapping stays valid). Wake them so that anyone
    // waiting on us notices promptly.
    seg_->slot(rank_).state.store(left, std::memory_order_release);
    for (int q = 0; q < size_; ++q)
      if (q != rank_) {
        seg_->slot(q).bell.fetch_add(1);
        futex_wake(seg_->slot(q).bell);
      }
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& segment_name() const { return seg_->name(); }
  std::chrono::milliseconds timeout = policy::default_timeout;

  op_ptr post_send(const std::byte* data, std::size_t n, int peer, int tag) {
    auto s = make(true, const_cast<std::byte*>(data), n, peer, tag);
    if (s->done) return s;
    out_[idx(peer)].sends.push_back(s);
    push(peer);
    return s;
  }

  /// Posts a receive of exactly `n` bytes, or with `upto` of at most `n`.
  op_ptr post_recv(std::byte* data, std::size_t n, int peer, int tag, bool upto = false) {
    auto s = make(false, data, n, peer, tag);
    s->upto = upto;
    if (s->done) return s;
    pull(peer); // match against whatever already arrived
    auto& in = in_[idx(peer)];
    for (auto it = in.early.begin(); it != in.early.end(); ++it) {
      if (it->tag != tag) continue;
      claim(in, *it, s);
      in.early.erase(it);
      push(peer); // the ack
      return s;
    }
    in.posted.push_back(s);
    if (!out_[idx(peer)].ctrl.empty()) push(peer); // acks from the pull
    return s;
  }

  /// One round of progress on every ring.
  bool progress() {
    bool moved = false;
    for (int q = 0; q < size_; ++q) moved |= pull(q);
    for (int q = 0; q < size_; ++q) {
      auto& o = out_[idx(q)];
      if (!o.ctrl.empty() || !o.sends.empty() || !o.streams.empty()) moved |= push(q);
    }
    return moved;
  }

  /// Progresses until `s` completes (successfully or not).
  void wait(op_state& s) {
    block(s, [&] { return s.done; });
  }

  /// Fails every pending and future operation of every rank with `why`.
  void abort(const std::string& why) {
    break_all("rank " + std::to_string(rank_) + " aborted: " + why, true, errc::aborted);
  }

  /// The mapped segment (the collective arena reads and writes it directly).
  const segment& seg() const noexcept { return *seg_; }

  /// Why a wait gave up (`why` empty: it did not).
  struct failure {
    std::string why;
    errc kind = errc::internal;
  };
  /// Progresses until `done()` holds, with the same peer health checks and
  /// timeout as a receive.
  template <class Done> failure wait_for(Done done) {
    op_state guard;
    block(guard, [&] { return guard.done || done(); });
    return {std::move(guard.error), guard.error_kind};
  }

  /// Fails every pending operation here and on every other rank (once);
  /// they see errc::aborted.
  void fail_group(const std::string& why) {
    if (!broken_) break_all(why, true, errc::aborted);
  }

  /// Withdraws an abandoned operation so the engine never touches its buffer
  /// again; a send whose bytes are partly in the ring is finished first.
  void abandon(const op_ptr& s) noexcept {
    if (s->done) return;
    try {
      detach(*s);
    } catch (...) { // out of memory for the copy: the group cannot go on
      break_all("rank " + std::to_string(rank_) + " could not detach an abandoned send", true, errc::internal);
    }
  }

private:
  std::size_t idx(int q) const { return static_cast<std::size_t>(q); }

  // Progresses until done(): spin, then yield, then sleep on this rank's bell;
  // checks peers' health (failing `s` or everything) while it sleeps.
  template <class Done> void block(op_state& s, Done done) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    auto next_check = start + policy::shm_liveness_interval;
    unsigned idle = 0, yields = 0;
    bool spun = false;
    clock::time_point spin_end{};
    auto& me = seg_->slot(rank_);
    while (!done()) {
      if (progress()) {
        idle = yields = 0;
        spun = false;
        continue;
      }
      if (done()) break;
      if (!spun) { // spin for spin_polls_ polls and, unless oversubscribed, spin_time_
        if (idle++ == 0 && spin_time_.count() > 0) spin_end = clock::now() + spin_time_;
        if (idle < spin_polls_ || (spin_time_.count() > 0 && ((idle & 255u) != 0 || clock::now() < spin_end))) {
          cpu_relax();
          continue;
        }
        spun = true;
      }
      if (yields < policy::shm_yield_polls) {
        ++yields;
        sched_yield();
        continue;
      }
      const auto now = clock::now();
      if (now >= next_check) {
        check_health(s, now - start, done);
        next_check = now + policy::shm_liveness_interval;
        if (broken_) fail(s, "aborted: " + broken_reason_, broken_kind_);
        if (done()) break;
      }
      // Sleep until a peer rings the bell (or the liveness interval passes).
      const std::uint32_t v = me.bell.load(std::memory_order_acquire);
      me.sleeping.store(1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (!progress() && !done())
        futex_wait(me.bell, v,
                   std::chrono::duration_cast<std::chrono::microseconds>(policy::shm_liveness_interval));
      me.sleeping.store(0, std::memory_order_relaxed);
      yields = 0; // woken: yield-poll, do not spin
    }
  }

  op_ptr make(bool is_send, std::byte* buf, std::size_t n, int peer, int tag) {
    const char* op = is_send ? "shm.send" : "shm.recv";
    GRADSYNC_REQUIRE(peer >= 0 && peer < size_, op, rank_,
            "peer " + std::to_string(peer) + " out of range [0, " + std::to_string(size_) + ")");
    GRADSYNC_REQUIRE(buf != nullptr || n == 0, op, rank_, "null buffer of " + std::to_string(n) + " bytes", peer);
    auto s = std::make_shared<op_state>();
    s->is_send = is_send;
    s->buf = buf;
    s->bytes = n;
    s->peer = peer;
    s->tag = tag;
    s->rndv = is_send && rendezvous(n);
    if (broken_) fail(*s, "aborted: " + broken_reason_, broken_kind_);
    return s;
  }

  static void fail(op_state& s, std::string why, errc kind) {
    if (s.done) return;
    s.error = std::move(why);
    s.error_kind = kind;
    s.done = true;
  }

  void notify(int q) {
    if (q == rank_) return;
    auto& peer = seg_->slot(q);
    std::atomic_thread_fence(std::memory_order_seq_cst); // pairs with the sleeper's fence
    if (peer.sleeping.load(std::memory_order_relaxed)) {
      peer.bell.fetch_add(1, std::memory_order_release);
      futex_wake(peer.bell);
    }
  }

  // ---- producer side -------------------------------------------------------

  std::size_t space(outbound& o, std::size_t need) {
    if (ring_ - (o.tail - o.head) < need)
      o.head = o.ctl->head.load(std::memory_order_acquire);
    return ring_ - static_cast<std::size_t>(o.tail - o.head);
  }

  void put(outbound& o, std::uint64_t pos, const void* src, std::size_t n) {
    std::byte* d = o.data;
    const std::size_t off = static_cast<std::size_t>(pos & (ring_ - 1));
    const std::size_t first = std::min(n, ring_ - off);
    stream_copy(d + off, src, first);
    if (first < n) stream_copy(d, static_cast<const std::byte*>(src) + first, n - first);
  }

  void publish(outbound& o, int q) {
    o.ctl->tail.store(o.tail, std::memory_order_release);
    notify(q);
  }

  // Writes pending frames to peer q as far as the ring allows.
  bool push(int q) {
    auto& o = out_[idx(q)];
    bool moved = false;
    while (!o.ctrl.empty() && space(o, cell) >= cell) {
      put(o, o.tail, &o.ctrl.front(), cell);
      o.tail += cell;
      o.ctrl.pop_front();
      publish(o, q);
      moved = true;
    }
    if (!o.ctrl.empty()) return moved; // control frames go first
    while (!o.sends.empty()) {
      auto s = o.sends.front();
      if (s->rndv) { // announce it; the payload waits for the receiver's ack
        if (space(o, cell) < cell) break;
        frame f{};
        f.kind = rts;
        f.tag = s->tag;
        f.total = s->bytes;
        s->started = true;
        s->seq = o.next_seq++;
        o.unacked.emplace(s->seq, s);
        f.seq = s->seq;
        put(o, o.tail, &f, cell);
        o.tail += cell;
        publish(o, q);
        o.sends.pop_front();
        moved = true;
        continue;
      }
      const std::size_t left = s->bytes - s->written;
      frame f{};
      f.kind = s->started ? more : first;
      f.tag = s->tag;
      f.total = s->bytes;
      std::size_t len;
      if (s->bytes <= inline_bytes) {
        if (space(o, cell) < cell) break;
        len = left;
        if (len) std::memcpy(f.payload, s->buf, len);
      } else {
        // Adapt the frame to the free space, but never write slivers.
        const std::size_t want = std::min(left, frame_);
        const std::size_t min_len = std::min(left, policy::shm_min_frame_bytes);
        const std::size_t free = space(o, cell + round_up(want, cell));
        if (free < cell + round_up(min_len, cell)) break;
        len = std::min(want, (free - cell) / cell * cell);
        if (len < want && len < min_len) break;
        put(o, o.tail + cell, s->buf + (s->written - s->base), len);
      }
      if (!s->started) {
        s->started = true;
        s->seq = o.next_seq++;
        o.unacked.emplace(s->seq, s);
      }
      f.seq = s->seq;
      f.len = static_cast<std::uint32_t>(len);
      put(o, o.tail, &f, cell);
      o.tail += frame_span(s->bytes, len);
      s->written += len;
      publish(o, q);
      moved = true;
      if (s->written == s->bytes) {
        o.sends.pop_front();
        if (s->acked) s->done = true;
      }
    }
    // Payloads of matched rendezvous messages, in the order they were acked.
    while (!o.streams.empty()) {
      auto s = o.streams.front();
      const std::size_t left = s->bytes - s->written;
      const std::size_t want = std::min(left, frame_);
      const std::size_t min_len = std::min(left, policy::shm_min_frame_bytes);
      const std::size_t free = space(o, cell + round_up(want, cell));
      if (free < cell + round_up(min_len, cell)) break;
      const std::size_t len = std::min(want, (free - cell) / cell * cell);
      if (len < want && len < min_len) break;
      put(o, o.tail + cell, s->buf + (s->written - s->base), len);
      frame f{};
      f.kind = data;
      f.tag = s->tag;
      f.total = s->bytes;
      f.seq = s->seq;
      f.len = static_cast<std::uint32_t>(len);
      put(o, o.tail, &f, cell);
      o.tail += cell + round_up(len, cell);
      s->written += len;
      publish(o, q);
      moved = true;
      if (s->written == s->bytes) {
        o.streams.pop_front();
        s->done = true;
      }
    }
    return moved;
  }

  void answer(int q, kind k, std::uint64_t seq, std::size_t posted, int tag, bool upto) {
    frame f{};
    f.kind = k;
    f.seq = seq;
    f.total = posted;
    f.tag = tag;
    f.flags = upto ? upto_receive : 0;
    out_[idx(q)].ctrl.push_back(f);
  }

  // Answers message `seq` of `total` bytes from `q`, matched to receive `s`:
  // acks it if it fits (returns true), else nacks it and fails `s`.
  bool accept(int q, std::uint64_t seq, std::size_t total, int tag, op_state& s) {
    if (misfit(total, s)) {
      answer(q, nack, seq, s.bytes, tag, s.upto);
      fail(s, size_mismatch(q, total, rank_, s.bytes, tag, s.upto), errc::mismatch);
      return false;
    }
    answer(q, ack, seq, s.bytes, tag, s.upto);
    s.received = total;
    return true;
  }

  // ---- consumer side -------------------------------------------------------

  void get(const inbound& in, std::uint64_t pos, void* dst, std::size_t n) const {
    const std::byte* d = in.data;
    const std::size_t off = static_cast<std::size_t>(pos & (ring_ - 1));
    const std::size_t first = std::min(n, ring_ - off);
    if (!dst) return;
    std::memcpy(dst, d + off, first);
    if (first < n) std::memcpy(static_cast<std::byte*>(dst) + first, d, n - first);
  }

  // Hands an early message to receive `s` (posted now).
  void claim(inbound& in, unexpected& u, const op_ptr& s) {
    if (u.rts) { // the payload now comes straight into the user's buffer
      if (accept(s->peer, u.seq, u.total, s->tag, *s)) in.streams.push_back(stream_in{u.seq, u.total, 0, s});
      return;
    }
    const bool streaming = in.open && in.early_msg == &u;
    if (!accept(s->peer, u.seq, u.total, s->tag, *s)) {
      if (streaming) {
        in.dst = nullptr;
        in.early_msg = nullptr;
      }
      return;
    }
    if (u.received) std::memcpy(s->buf, u.data.get(), u.received);
    if (!streaming) {
      s->done = true;
      return;
    }
    in.dst = s->buf; // the rest streams straight into the user's buffer
    in.op = s;
    in.early_msg = nullptr;
  }

  // Reads every frame peer q has published.
  bool pull(int q) {
    auto& in = in_[idx(q)];
    auto& ctl = *in.ctl;
    if (in.head == in.tail) {
      in.tail = ctl.tail.load(std::memory_order_acquire);
      if (in.head == in.tail) return false;
    }
    while (in.head != in.tail) {
      frame f;
      get(in, in.head, &f, cell);
      switch (f.kind) {
      case ack:
      case nack:
      case stop: on_answer(q, f); break;
      case rts: announced(q, in, f); break;
      case data: arrive(q, in, f); break;
      case first: open(q, in, f); [[fallthrough]];
      case more: {
        if (f.kind != first && !in.open) corrupt(q, "a continuation frame without an open message");
        const std::size_t len = f.len;
        if (in.received + len > in.total) corrupt(q, "more payload than the message size");
        std::byte* dst = in.dst ? in.dst + in.received : nullptr;
        if (f.total <= inline_bytes) {
          if (dst && len) std::memcpy(dst, f.payload, len);
        } else {
          get(in, in.head + cell, dst, len);
        }
        in.received += len;
        if (in.early_msg) in.early_msg->received = in.received;
        if (in.received == in.total) close(in);
        break;
      }
      default: corrupt(q, "frame kind " + std::to_string(f.kind));
      }
      in.head += f.kind == ack || f.kind == nack || f.kind == stop || f.kind == rts ? cell
                 : f.kind == data                                              ? cell + round_up(f.len, cell)
                                                                               : frame_span(f.total, f.len);
      ctl.head.store(in.head, std::memory_order_release);
      if (in.head == in.tail) in.tail = ctl.tail.load(std::memory_order_acquire);
    }
    notify(q); // the producer may sleep waiting for space
    return true;
  }

  // A rendezvous message announced: matched to the first posted receive of
  // its tag (acked, its payload to come), else kept as early, without data.
  void announced(int q, inbound& in, const frame& f) {
    for (auto it = in.posted.begin(); it != in.posted.end(); ++it) {
      if ((*it)->tag != f.tag) continue;
      op_ptr s = *it;
      in.posted.erase(it);
      if (accept(q, f.seq, f.total, f.tag, *s)) in.streams.push_back(stream_in{f.seq, f.total, 0, std::move(s)});
      return;
    }
    in.early.push_back(unexpected{f.tag, f.seq, f.total, 0, nullptr, true});
  }

  // A payload frame of matched rendezvous message f.seq (one whose receive
  // was withdrawn is not found: skipped).
  void arrive(int q, inbound& in, const frame& f) {
    auto it = std::find_if(in.streams.begin(), in.streams.end(), [&](const stream_in& x) { return x.seq == f.seq; });
    if (it == in.streams.end()) return;
    const std::size_t len = f.len;
    if (it->received + len > it->total) corrupt(q, "more rendezvous payload than the message size");
    get(in, in.head + cell, it->op->buf + it->received, len);
    it->received += len;
    if (it->received == it->total) {
      it->op->done = true;
      in.streams.erase(it);
    }
  }

  void open(int q, inbound& in, const frame& f) {
    in.open = true;
    in.seq = f.seq;
    in.total = f.total;
    in.received = 0;
    in.dst = nullptr;
    in.op.reset();
    in.early_msg = nullptr;
    for (auto it = in.posted.begin(); it != in.posted.end(); ++it) {
      if ((*it)->tag != f.tag) continue;
      op_ptr s = *it;
      in.posted.erase(it);
      if (accept(q, f.seq, f.total, f.tag, *s)) {
        in.dst = s->buf;
        in.op = std::move(s);
      }
      return;
    }
    auto& u = in.early.emplace_back(unexpected{f.tag, f.seq, f.total, 0, nullptr});
    u.data = std::make_unique_for_overwrite<std::byte[]>(std::max<std::size_t>(f.total, 1));
    in.dst = u.data.get();
    in.early_msg = &u;
  }

  static void close(inbound& in) {
    if (in.op) in.op->done = true;
    in.op.reset();
    in.early_msg = nullptr;
    in.dst = nullptr;
    in.open = false;
  }

  void on_answer(int q, const frame& f) {
    auto& o = out_[idx(q)];
    if (f.kind == stop) { // the receiver withdrew: send no more of it
      auto st = std::find_if(o.streams.begin(), o.streams.end(), [&](const op_ptr& x) { return x->seq == f.seq; });
      if (st == o.streams.end()) return;
      (*st)->written = (*st)->bytes;
      (*st)->done = true;
      o.streams.erase(st);
      return;
    }
    auto it = o.unacked.find(f.seq);
    if (it == o.unacked.end()) return; // an abandoned send
    op_ptr s = std::move(it->second);
    o.unacked.erase(it);
    s->acked = true;
    if (s->rndv) {
      if (f.kind == ack) {
        o.streams.push_back(std::move(s)); // the payload goes now
        return;
      }
      s->written = s->bytes; // rejected: nothing of it is sent
    }
    if (f.kind == nack) {
      s->error = size_mismatch(rank_, s->bytes, q, static_cast<std::size_t>(f.total), f.tag, f.flags & upto_receive);
      s->error_kind = errc::mismatch;
      // The receiver discards the rest; stop streaming what nobody reads
      // only once it is all written (the receiver counts the bytes).
    }
    if (s->written == s->bytes) s->done = true;
  }

  // ---- failure detection ---------------------------------------------------

  template <class Done>
  void check_health(op_state& s, std::chrono::steady_clock::duration waited, Done done) {
    auto& h = seg_->hdr();
    if (h.aborted.load(std::memory_order_acquire) == 2) {
      progress();
      break_all(std::string(h.reason, strnlen(h.reason, sizeof h.reason)), false, static_cast<errc>(h.abort_kind));
      return;
    }
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      auto& sl = seg_->slot(q);
      auto st = sl.state.load(std::memory_order_acquire);
      if (st != left && !process_alive(sl.pid.load(std::memory_order_relaxed))) {
        st = sl.state.load(std::memory_order_acquire); // it may have left just before exiting
        if (st != left) {
          break_all("rank " + std::to_string(q) + " (pid " + std::to_string(sl.pid.load()) + ") died", true,
                    errc::peer_failed);
          return;
        }
      }
      if (st == left) {
        if (s.peer >= 0 && q != s.peer) continue; // not what we wait for
        progress(); // drain what it wrote before leaving
        if (done()) return;
        // It may have left over a timeout that a stopped rank caused: name
        // that rank here too, or this survivor's error hides the cause.
        break_all("rank " + std::to_string(q) + " left the communicator while rank " +
                      std::to_string(rank_) + " waited for it" + holding_up(),
                  true, errc::peer_failed);
        return;
      }
    }
    if (waited > timeout) {
      // The peer we wait for may be live and itself waiting; a stopped rank
      // is the one holding everyone up, so name it.
      fail(s, gradsync::detail::timed_out(timeout) + holding_up(), errc::timeout);
      abandon_after_timeout(s);
    }
  }

  // "; rank Q (pid P) is stopped ... and holds the group up" for the other
  // ranks that are stopped (SIGSTOP, a debugger); empty when none is.
  std::string holding_up() const {
    std::string stopped;
    for (int q = 0; q < size_; ++q)
      if (q != rank_ && gradsync::detail::process_stopped(seg_->slot(q).pid.load(std::memory_order_relaxed)))
        stopped += (stopped.empty() ? "" : ", ") + std::string("rank ") + std::to_string(q) + " (pid " +
                   std::to_string(seg_->slot(q).pid.load()) + ")";
    return stopped.empty() ? "" : "; " + stopped + " is stopped (SIGSTOP or a debugger) and holds the group up";
  }

  void abandon_after_timeout(op_state& s) { detach(s); }

  // Makes the engine forget the caller's buffer of `s`: an unstarted send or
  // posted receive is withdrawn; a receive being streamed discards the rest;
  // a partly written send finishes from a private copy of its remaining bytes
  // (the receiver counts on them), so detaching never blocks.
  void detach(op_state& s) {
    if (s.peer < 0) return; // an arena wait: no buffer involved
    const auto same = [&](const op_ptr& p) { return p.get() == &s; };
    if (s.is_send) {
      auto& o = out_[idx(s.peer)];
      if (!s.started) {
        std::erase_if(o.sends, same);
        return;
      }
      if (s.rndv) {
        // Announced: the receiver may match it (or already did) and then
        // counts on its payload, so it stays queued, from a private copy.
        if (s.written < s.bytes && !s.owned) {
          s.owned = std::make_unique_for_overwrite<std::byte[]>(s.bytes - s.written);
          std::memcpy(s.owned.get(), s.buf + (s.written - s.base), s.bytes - s.written);
          s.buf = s.owned.get();
          s.base = s.written;
        }
        return;
      }
      o.unacked.erase(s.seq); // its ack, if it comes, is ignored
      if (s.written < s.bytes && !s.owned) {
        s.owned = std::make_unique_for_overwrite<std::byte[]>(s.bytes - s.written);
        std::memcpy(s.owned.get(), s.buf + s.written, s.bytes - s.written);
        s.buf = s.owned.get();
        s.base = s.written;
      }
      return;
    }
    auto& in = in_[idx(s.peer)];
    std::erase_if(in.posted, same);
    if (in.open && in.op.get() == &s) {
      in.op.reset();
      in.dst = nullptr;
    }
    auto st = std::find_if(in.streams.begin(), in.streams.end(), [&](const stream_in& x) { return x.op.get() == &s; });
    if (st != in.streams.end()) { // a rendezvous payload still to come: tell the sender to stop
      answer(s.peer, stop, st->seq, 0, s.tag, false);
      in.streams.erase(st);
      push(s.peer);
    }
  }

  [[noreturn]] void corrupt(int q, const std::string& what) const {
    throw error(errc::internal, "shm.recv", rank_, q, "corrupt frame stream: " + what);
  }

  // Fails every pending operation with `kind`; with `announce`, tells every
  // other rank (which then fail theirs with the same kind).
  void break_all(const std::string& why, bool announce, errc kind) {
    if (announce) {
      auto& h = seg_->hdr();
      std::uint32_t expected = 0;
      if (h.aborted.compare_exchange_strong(expected, 1)) {
        const std::size_t n = std::min(why.size(), sizeof h.reason - 1);
        std::memcpy(h.reason, why.data(), n);
        h.reason[n] = '\0';
        h.abort_kind = static_cast<std::uint32_t>(kind);
        h.aborted.store(2, std::memory_order_release);
        for (int q = 0; q < size_; ++q) {
          seg_->slot(q).bell.fetch_add(1);
          futex_wake(seg_->slot(q).bell);
        }
      }
    }
    broken_ = true;
    broken_reason_ = why;
    broken_kind_ = kind;
    const std::string msg = "aborted: " + why;
    for (auto& o : out_) {
      for (auto& s : o.sends) fail(*s, msg, kind);
      for (auto& [seq, s] : o.unacked) fail(*s, msg, kind);
      for (auto& s : o.streams) fail(*s, msg, kind);
      o.sends.clear();
      o.unacked.clear();
      o.streams.clear();
    }
    for (auto& in : in_) {
      for (auto& s : in.posted) fail(*s, msg, kind);
      in.posted.clear();
      for (auto& st : in.streams) fail(*st.op, msg, kind);
      in.streams.clear();
      if (in.op) fail(*in.op, msg, kind);
      in.op.reset();
      in.dst = nullptr;
    }
  }

  std::unique_ptr<segment> seg_;
  pid_t owner_ = ::getpid();
  int rank_, size_;
  std::size_t ring_;
  std::vector<outbound> out_;
  std::vector<inbound> in_;
  bool broken_ = false;
  std::string broken_reason_;
  errc broken_kind_ = errc::aborted;
  std::size_t frame_ = std::min(policy::shm_frame_bytes, ring_ / 4); // >= 2 frames in flight
  // More ranks than cores: a spinning rank only delays the peer it waits for.
  bool oversubscribed_ = static_cast<unsigned>(size_) > std::max(1u, std::thread::hardware_concurrency());
  unsigned spin_polls_ = oversubscribed_ ? policy::shm_oversubscribed_spin_polls : policy::shm_spin_polls;
  std::chrono::microseconds spin_time_ = oversubscribed_ ? std::chrono::microseconds{0} : policy::shm_spin_time;
};

} // namespace gradsync::shm::detail
