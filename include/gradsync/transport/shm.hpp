// gradsync: the shared-memory transport. Ranks are processes of one node that
// map one POSIX shared-memory segment; no MPI needed.
//
// Every ordered pair of ranks (i -> j, including i -> i) owns a single-producer
// single-consumer byte ring in the segment: a `tail` written only by i and a
// `head` written only by j, each on its own cache line, published with
// release stores and read with acquire loads. Everything travels as 64-byte
// aligned frames: a header cell (kind, tag, sequence number, sizes, up to
// 32 bytes of inline payload) optionally followed by payload. A small message
// is one cell; a large one is cut into frames of at most
// policy::shm_frame_bytes, so the receiver copies frame k out while the sender
// copies frame k+1 in (two copies, pipelined, through a ring that stays in
// cache). Receivers acknowledge each message when they match it (or reject it
// on a size mismatch) with a control frame on the reverse ring, so a send
// completes once its bytes are in the ring and the receive was matched, which
// is what gives both sides the size-mismatch error.
//
// Matching is per (peer, tag) in order. A message that arrives before its
// receive is posted is drained into a private buffer (so one unposted tag can
// never block another behind it) and handed over, or redirected mid-stream,
// when the receive is posted.
//
// Waiting spins briefly, then yields, then sleeps on a futex in the segment
// (the producer wakes a sleeping consumer), so oversubscribed runs progress.
// While waiting, a rank checks that its peers are alive (kill(pid, 0) and the
// zombie state): a rank that died fails every other rank's pending operations
// with an error naming it instead of hanging them.
//
// The segment is created 0600 under an unpredictable name and unlinked as soon
// as every rank has attached, so nothing is left in /dev/shm once setup is
// over, whatever happens afterwards.
//
// A communicator is used by one thread at a time (progress is made by whoever
// calls isend/irecv/wait/test).
#pragma once

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <list>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/host_simd.hpp"
#include "../core/policy.hpp"
#include "../core/timed_choice.hpp"
#include "transport.hpp"

namespace gradsync::shm {

namespace detail {

inline constexpr std::uint64_t magic = 0x6772616473796e01ull; // "gradsyn" + layout version 1
inline constexpr std::size_t cell = 64;          // frame granularity (one cache line)
inline constexpr std::size_t inline_bytes = 32;  // payload carried inside a header cell
inline constexpr std::size_t page = 4096;

inline constexpr std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

inline std::string sys_error(int e) { return std::error_code(e, std::system_category()).message(); }

// Frames. `first` opens a message (and carries it entirely if it is small),
// `more` continues the open message, `ack`/`nack` answer a message's `seq`.
enum kind : std::uint32_t { first = 1, more = 2, ack = 3, nack = 4 };

struct frame {
  std::uint32_t kind;
  std::int32_t tag;
  std::uint64_t seq;
  std::uint64_t total; // message size; for nack: the size the receiver posted
  std::uint32_t len;   // payload bytes in this frame
  std::uint32_t reserved;
  std::byte payload[inline_bytes]; // used when total <= inline_bytes
};
static_assert(sizeof(frame) == cell);

// Bytes a frame occupies in the ring.
inline std::size_t frame_span(std::uint64_t total, std::size_t len) {
  return total <= inline_bytes ? cell : cell + round_up(len, cell);
}

using a32 = std::atomic<std::uint32_t>;
using a64 = std::atomic<std::uint64_t>;
static_assert(a32::is_always_lock_free && a64::is_always_lock_free &&
              sizeof(a32) == sizeof(std::uint32_t));

// Per-rank shared state.
struct rank_slot {
  alignas(cell) std::atomic<std::int32_t> pid{0};
  a32 state{0}; // 0 not attached, 1 attached, 2 left
  alignas(cell) a32 bell{0};     // futex word: bumped to wake this rank
  a32 sleeping{0};               // this rank may be blocked on `bell`
};
enum : std::uint32_t { absent = 0, attached = 1, left = 2 };

struct header {
  std::uint64_t magic;
  std::int32_t size;
  std::int32_t creator_pid;
  std::uint64_t ring_bytes;
  std::uint64_t arena_bytes;
  std::uint64_t total_bytes;
  alignas(cell) std::atomic<std::int32_t> attached{0};
  a32 unlinked{0};
  a32 ready{0};
  alignas(cell) a32 aborted{0}; // 0 no, 1 reason being written, 2 reason valid
  char reason[480];
};

struct ring_ctl {
  alignas(cell) a64 tail{0}; // written by the producer only
  alignas(cell) a64 head{0}; // written by the consumer only
};

// Progress counters and call signatures of one rank's collective arena.
inline constexpr int arena_counters = 4;
struct arena_ctl {
  struct alignas(cell) line { a64 v{0}; };
  line counter[arena_counters]; // written by the owner only, monotonic
  alignas(cell) a64 sig[2]{};     // per arena half: what the current call is
};

struct layout {
  std::size_t ranks_off, chans_off, chan_stride, arenas_off, arena_stride, total;
  layout(int p, std::size_t ring, std::size_t arena) {
    const auto P = static_cast<std::size_t>(p);
    ranks_off = round_up(sizeof(header), page);
    chans_off = ranks_off + round_up(sizeof(rank_slot) * P, page);
    chan_stride = page + ring; // control lines, then page-aligned data
    arenas_off = chans_off + chan_stride * P * P;
    arena_stride = round_up(sizeof(arena_ctl), page) + arena;
    total = arenas_off + arena_stride * P;
  }
};

inline void futex_wait(a32& w, std::uint32_t v, std::chrono::microseconds d) {
  timespec ts{static_cast<time_t>(d.count() / 1'000'000), static_cast<long>(d.count() % 1'000'000) * 1000};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAIT, v, &ts, nullptr, 0);
}
inline void futex_wake(a32& w) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

#if GRADSYNC_HOST_AVX2
/// stream_copy's whole 64-byte steps with 32-byte loads and streaming stores
/// (`d` 32-byte aligned). Returns the bytes copied.
[[gnu::target("avx2")]] inline std::size_t stream_copy_avx2(std::byte* d, const std::byte* s, std::size_t n) {
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
  }
  return i;
}
#endif

/// Copies `n` bytes into shared staging with non-temporal stores. Staging
/// lines were last read by another core; ordinary stores must first take each
/// line back from that core's cache (measured 2.3 GB/s on the CI VM), while
/// streaming stores skip that (26-32 GB/s, and the reader still reads at
/// 9-21 GB/s). Ordered before a later release store by the final sfence.
inline void stream_copy(void* dst, const void* src, std::size_t n) {
#if defined(__SSE2__)
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  const std::size_t head = std::min(n, (32 - reinterpret_cast<std::uintptr_t>(d) % 32) % 32);
  if (n < 256) {
    std::memcpy(d, s, n);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  std::size_t i = 0;
#if GRADSYNC_HOST_AVX2
  if (gradsync::detail::best_host_isa() == gradsync::detail::host_isa::avx2) i = stream_copy_avx2(d, s, n);
#endif
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  for (; i + 16 <= n; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  std::memcpy(d + i, s + i, n - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// True unless process `pid` is gone. A killed child its parent has not yet
/// reaped still answers kill(pid, 0), so the zombie state counts as dead.
inline bool process_alive(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  std::FILE* f = std::fopen(path, "r");
  if (!f) return true; // no procfs: trust kill()
  char buf[512];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')'); // the command name may contain spaces
  if (!close || close[1] == '\0' || close[2] == '\0') return true;
  return close[2] != 'Z' && close[2] != 'X';
}

/// Ring bytes per ordered pair for `p` ranks: policy::shm_ring_bytes while the
/// p*p rings fit policy::shm_rings_budget, smaller (a power of two, at least
/// policy::shm_min_ring_bytes) beyond.
inline std::size_t ring_bytes_for(int p) {
  const auto pairs = static_cast<std::size_t>(p) * static_cast<std::size_t>(p);
  std::size_t ring = policy::shm_ring_bytes;
  while (ring > policy::shm_min_ring_bytes && ring * pairs > policy::shm_rings_budget) ring /= 2;
  return ring;
}

inline std::string random_name() {
  unsigned char b[16];
  std::size_t got = 0;
  while (got < sizeof b) {
    const ssize_t r = getrandom(b + got, sizeof b - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw error("shm.create", 0, -1, "getrandom failed: " + sys_error(errno));
    }
    got += static_cast<std::size_t>(r);
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string s = "/gradsync-";
  for (unsigned char c : b) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

// The mapped segment of one rank.
class segment {
public:
  segment() = default;
  segment(const segment&) = delete;
  segment& operator=(const segment&) = delete;
  ~segment() {
    if (base_) ::munmap(base_, bytes_);
  }

  /// Creates and initialises a fresh segment for `p` ranks (rank 0).
  void create(int p, std::size_t ring, std::size_t arena) {
    const layout l(p, ring, arena);
    int fd = -1;
    for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
      name_ = random_name();
      fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
      if (fd < 0 && errno != EEXIST)
        throw error("shm.create", 0, -1, "shm_open(" + name_ + ") failed: " + sys_error(errno));
    }
    GRADSYNC_REQUIRE(fd >= 0, "shm.create", 0, "could not find an unused segment name");
    // posix_fallocate reserves the pages now: a full /dev/shm fails here with
    // an error instead of SIGBUS on first touch.
    int rc = ::ftruncate(fd, static_cast<off_t>(l.total));
    if (rc == 0) rc = ::posix_fallocate(fd, 0, static_cast<off_t>(l.total));
    else rc = errno;
    if (rc != 0) {
      ::close(fd);
      ::shm_unlink(name_.c_str());
      throw error("shm.create", 0, -1,
                  "cannot size segment to " + std::to_string(l.total) + " bytes: " + sys_error(rc));
    }
    map(fd, l.total, 0);
    hdr_ = new (base_) header;
    hdr_->magic = magic;
    hdr_->size = p;
    hdr_->creator_pid = static_cast<std::int32_t>(::getpid());
    hdr_->ring_bytes = ring;
    hdr_->arena_bytes = arena;
    hdr_->total_bytes = l.total;
    for (int r = 0; r < p; ++r) new (slot_ptr(l, r)) rank_slot;
    for (int i = 0; i < p * p; ++i)
      new (base_ + l.chans_off + l.chan_stride * static_cast<std::size_t>(i)) ring_ctl;
    for (int r = 0; r < p; ++r) new (base_ + l.arenas_off + l.arena_stride * static_cast<std::size_t>(r)) arena_ctl;
    hdr_->ready.store(1, std::memory_order_release);
    p_ = p;
    ring_ = ring;
    arena_ = arena;
  }

  /// Attaches to segment `name` made for `p` ranks. Returns an empty string on
  /// success, else why it could not (so the caller may retry a stale name).
  std::string attach(const std::string& name, int p, int rank) {
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return "shm_open(" + name + "): " + sys_error(errno);
    struct stat st{};
    if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < sizeof(header)) {
      ::close(fd);
      return "segment " + name + " is too small";
    }
    map(fd, static_cast<std::size_t>(st.st_size), rank);
    hdr_ = reinterpret_cast<header*>(base_);
    if (hdr_->ready.load(std::memory_order_acquire) != 1 || hdr_->magic != magic)
      return unmap("segment " + name + " is not an initialised gradsync segment");
    if (hdr_->size != p || hdr_->ring_bytes < 4 * cell || (hdr_->ring_bytes & (hdr_->ring_bytes - 1)) != 0)
      return unmap("segment " + name + " was made for " + std::to_string(hdr_->size) +
                   " ranks, this rank expects " + std::to_string(p));
    if (hdr_->total_bytes != bytes_ || layout(p, hdr_->ring_bytes, hdr_->arena_bytes).total != bytes_)
      return unmap("segment " + name + " has an inconsistent size");
    name_ = name;
    p_ = p;
    ring_ = hdr_->ring_bytes;
    arena_ = hdr_->arena_bytes;
    return {};
  }

  /// Unmaps (after a failed attach, before trying another name).
  void release() {
    if (base_) ::munmap(base_, bytes_);
    base_ = nullptr;
    hdr_ = nullptr;
  }

  header& hdr() const { return *hdr_; }
  rank_slot& slot(int r) const { return *slot_ptr(layout(p_, ring_, arena_), r); }
  arena_ctl& actl(int r) const { return *reinterpret_cast<arena_ctl*>(arena_base(r)); }
  std::byte* arena(int r) const { return arena_base(r) + round_up(sizeof(arena_ctl), page); }
  std::size_t arena_bytes() const { return arena_; }
  ring_ctl& ctl(int from, int to) const {
    return *reinterpret_cast<ring_ctl*>(chan(from, to));
  }
  std::byte* data(int from, int to) const { return chan(from, to) + page; }
  std::size_t ring_bytes() const { return ring_; }
  const std::string& name() const { return name_; }

private:
  std::byte* arena_base(int r) const {
    const layout l(p_, ring_, arena_);
    return base_ + l.arenas_off + l.arena_stride * static_cast<std::size_t>(r);
  }
  std::byte* chan(int from, int to) const {
    const layout l(p_, ring_, arena_);
    return base_ + l.chans_off + l.chan_stride * static_cast<std::size_t>(from * p_ + to);
  }
  rank_slot* slot_ptr(const layout& l, int r) const {
    return reinterpret_cast<rank_slot*>(base_ + l.ranks_off) + r;
  }
  void map(int fd, std::size_t bytes, int rank) {
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    const int e = errno;
    ::close(fd);
    if (m == MAP_FAILED) {
      if (rank == 0) ::shm_unlink(name_.c_str());
      throw error("shm.attach", rank, -1, "mmap of " + std::to_string(bytes) + " bytes failed: " + sys_error(e));
    }
    base_ = static_cast<std::byte*>(m);
    bytes_ = bytes;
  }
  std::string unmap(std::string why) {
    release();
    return why;
  }
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  header* hdr_ = nullptr;
  std::string name_;
  int p_ = 0;
  std::size_t ring_ = 0, arena_ = 0;
};

// State of one send or receive, shared by its request and the engine.
struct op_state {
  bool done = false;
  bool is_send = false;
  std::string error;
  int peer = -1, tag = 0;
  std::byte* buf = nullptr; // a send's buffer is only read
  std::size_t bytes = 0;
  std::size_t written = 0;  // send: payload bytes in the ring
  std::size_t base = 0;     // send: offset of `buf` in the message (see owned)
  std::unique_ptr<std::byte[]> owned; // send: private copy of an abandoned tail
  bool started = false;     // send: first frame written (seq assigned)
  bool acked = false;       // send: receiver matched (or rejected) it
  std::uint64_t seq = 0;
};
using op_ptr = std::shared_ptr<op_state>;

// A message that arrived before its receive was posted.
struct unexpected {
  int tag;
  std::uint64_t seq;
  std::size_t total, received = 0;
  std::unique_ptr<std::byte[]> data;
};

struct outbound { // this rank -> peer
  ring_ctl* ctl = nullptr;
  std::byte* data = nullptr;
  std::deque<op_ptr> sends;      // posted, not fully written, in order
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
};

inline std::string mismatch(int src, std::size_t sent, int dst, std::size_t posted, int tag) {
  return "message size mismatch: rank " + std::to_string(src) + " sent " + std::to_string(sent) +
         " bytes, rank " + std::to_string(dst) + " posted a receive of " + std::to_string(posted) +
         " bytes (tag " + std::to_string(tag) + ")";
}

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

  op_ptr post_recv(std::byte* data, std::size_t n, int peer, int tag) {
    auto s = make(false, data, n, peer, tag);
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
      if (!o.ctrl.empty() || !o.sends.empty()) moved |= push(q);
    }
    return moved;
  }

  /// Progresses until `s` completes (successfully or not).
  void wait(op_state& s) {
    block(s, [&] { return s.done; });
  }

  // ---- collective arena (see communicator::arena) --------------------------

  void abort(const std::string& why) { break_all("rank " + std::to_string(rank_) + " aborted: " + why, true); }

  std::byte* arena(int q) const { return seg_->arena(q); }
  std::size_t arena_bytes() const { return seg_->arena_bytes(); }
  arena_ctl& arena_state(int q) const { return seg_->actl(q); }
  std::uint64_t epoch = 0; // arena rounds this group has completed
  gradsync::detail::timed_choice stores; // how shm_direct writes the arena (per rank)

  /// Sets this rank's counter `k` to `v` and wakes sleeping peers.
  void post(int k, std::uint64_t v) {
    seg_->actl(rank_).counter[k].v.store(v, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    for (int q = 0; q < size_; ++q) {
      auto& sl = seg_->slot(q);
      if (q != rank_ && sl.sleeping.load(std::memory_order_relaxed)) {
        sl.bell.fetch_add(1, std::memory_order_release);
        futex_wake(sl.bell);
      }
    }
  }

  /// Blocks until counter `k` of every rank is at least `v`.
  void await(int k, std::uint64_t v, const char* op) {
    op_state guard;
    auto reached = [&] {
      for (int q = 0; q < size_; ++q)
        if (seg_->actl(q).counter[k].v.load(std::memory_order_acquire) < v) return false;
      return true;
    };
    if (reached()) return;
    block(guard, [&] { return guard.done || reached(); });
    if (guard.error.empty()) return;
    // The arena's rounds can no longer line up across ranks: fail them all.
    if (!broken_) break_all("rank " + std::to_string(rank_) + " in " + op + ": " + guard.error, true);
    throw error(op, rank_, -1, guard.error);
  }

  /// Withdraws an abandoned operation so the engine never touches its buffer
  /// again; a send whose bytes are partly in the ring is finished first.
  void abandon(const op_ptr& s) noexcept {
    if (s->done) return;
    try {
      detach(*s);
    } catch (...) { // out of memory for the copy: the group cannot go on
      break_all("rank " + std::to_string(rank_) + " could not detach an abandoned send", true);
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
        if (broken_) fail(s, "aborted: " + broken_reason_);
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
    if (broken_) fail(*s, "aborted: " + broken_reason_);
    return s;
  }

  static void fail(op_state& s, std::string why) {
    if (s.done) return;
    s.error = std::move(why);
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
    return moved;
  }

  void answer(int q, kind k, std::uint64_t seq, std::size_t posted, int tag) {
    frame f{};
    f.kind = k;
    f.seq = seq;
    f.total = posted;
    f.tag = tag;
    out_[idx(q)].ctrl.push_back(f);
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
    const bool streaming = in.open && in.early_msg == &u;
    if (u.total != s->bytes) {
      answer(s->peer, nack, u.seq, s->bytes, s->tag);
      fail(*s, mismatch(s->peer, u.total, rank_, s->bytes, s->tag));
      if (streaming) {
        in.dst = nullptr;
        in.early_msg = nullptr;
      }
      return;
    }
    answer(s->peer, ack, u.seq, s->bytes, s->tag);
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
      case nack: on_answer(q, f); break;
      case first: open(q, in, f); [[fallthrough]];
      case more: {
        GRADSYNC_REQUIRE(f.kind == first || in.open, "shm.recv", rank_, "corrupt frame stream", q);
        const std::size_t len = f.len;
        GRADSYNC_REQUIRE(in.received + len <= in.total, "shm.recv", rank_, "corrupt frame stream", q);
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
      default: GRADSYNC_REQUIRE(false, "shm.recv", rank_, "corrupt frame stream (kind " + std::to_string(f.kind) + ")", q);
      }
      in.head += f.kind == ack || f.kind == nack ? cell : frame_span(f.total, f.len);
      ctl.head.store(in.head, std::memory_order_release);
      if (in.head == in.tail) in.tail = ctl.tail.load(std::memory_order_acquire);
    }
    notify(q); // the producer may sleep waiting for space
    return true;
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
      if (s->bytes != f.total) {
        answer(q, nack, f.seq, s->bytes, f.tag);
        fail(*s, mismatch(q, f.total, rank_, s->bytes, f.tag));
      } else {
        answer(q, ack, f.seq, s->bytes, f.tag);
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
    auto it = o.unacked.find(f.seq);
    if (it == o.unacked.end()) return; // an abandoned send
    op_ptr s = std::move(it->second);
    o.unacked.erase(it);
    s->acked = true;
    if (f.kind == nack) {
      s->error = mismatch(rank_, s->bytes, q, static_cast<std::size_t>(f.total), f.tag);
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
      break_all(std::string(h.reason, strnlen(h.reason, sizeof h.reason)), false);
      return;
    }
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      auto& sl = seg_->slot(q);
      auto st = sl.state.load(std::memory_order_acquire);
      if (st != left && !process_alive(sl.pid.load(std::memory_order_relaxed))) {
        st = sl.state.load(std::memory_order_acquire); // it may have left just before exiting
        if (st != left) {
          break_all("rank " + std::to_string(q) + " (pid " + std::to_string(sl.pid.load()) + ") died", true);
          return;
        }
      }
      if (st == left) {
        if (s.peer >= 0 && q != s.peer) continue; // not what we wait for
        progress(); // drain what it wrote before leaving
        if (done()) return;
        break_all("rank " + std::to_string(q) + " left the communicator while rank " +
                      std::to_string(rank_) + " waited for it",
                  true);
        return;
      }
    }
    if (waited > timeout) {
      fail(s, "timed out after " + std::to_string(timeout.count()) +
                  " ms waiting for the peer (does every rank call the same collective with "
                  "the same count, root and options?)");
      abandon_after_timeout(s);
    }
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
  }

  // Fails every pending operation; with `announce`, tells every other rank.
  void break_all(const std::string& why, bool announce) {
    if (announce) {
      auto& h = seg_->hdr();
      std::uint32_t expected = 0;
      if (h.aborted.compare_exchange_strong(expected, 1)) {
        const std::size_t n = std::min(why.size(), sizeof h.reason - 1);
        std::memcpy(h.reason, why.data(), n);
        h.reason[n] = '\0';
        h.aborted.store(2, std::memory_order_release);
        for (int q = 0; q < size_; ++q) {
          seg_->slot(q).bell.fetch_add(1);
          futex_wake(seg_->slot(q).bell);
        }
      }
    }
    broken_ = true;
    broken_reason_ = why;
    const std::string msg = "aborted: " + why;
    for (auto& o : out_) {
      for (auto& s : o.sends) fail(*s, msg);
      for (auto& [seq, s] : o.unacked) fail(*s, msg);
      o.sends.clear();
      o.unacked.clear();
    }
    for (auto& in : in_) {
      for (auto& s : in.posted) fail(*s, msg);
      in.posted.clear();
      if (in.op) fail(*in.op, msg);
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
  std::size_t frame_ = std::min(policy::shm_frame_bytes, ring_ / 4); // >= 2 frames in flight
  // More ranks than cores: a spinning rank only delays the peer it waits for.
  bool oversubscribed_ = static_cast<unsigned>(size_) > std::max(1u, std::thread::hardware_concurrency());
  unsigned spin_polls_ = oversubscribed_ ? policy::shm_oversubscribed_spin_polls : policy::shm_spin_polls;
  std::chrono::microseconds spin_time_ = oversubscribed_ ? std::chrono::microseconds{0} : policy::shm_spin_time;
};

// Registers `rank` in an attached segment and waits until every rank has;
// the last to arrive unlinks the name (and runs `cleanup`).
inline void join(segment& seg, int rank, int size, const std::function<void()>& cleanup) {
  auto& h = seg.hdr();
  auto& me = seg.slot(rank);
  std::int32_t none = 0;
  GRADSYNC_REQUIRE(me.pid.compare_exchange_strong(none, static_cast<std::int32_t>(::getpid())), "shm.attach",
          rank, "rank " + std::to_string(rank) + " is already attached (pid " + std::to_string(none) +
                    "): two processes were given the same rank");
  me.state.store(attached, std::memory_order_release);
  if (h.attached.fetch_add(1) + 1 == size) {
    ::shm_unlink(seg.name().c_str());
    if (cleanup) cleanup();
    h.unlinked.store(1, std::memory_order_release);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + policy::shm_attach_timeout;
  while (h.unlinked.load(std::memory_order_acquire) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::shm_unlink(seg.name().c_str()); // leave nothing behind
      if (cleanup) cleanup();
      throw error("shm.attach", rank, -1,
                  "only " + std::to_string(h.attached.load()) + " of " + std::to_string(size) +
                      " ranks attached within " +
                      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(policy::shm_attach_timeout).count()) +
                      " s");
    }
    for (int q = 0; q < size; ++q) { // a rank that died during setup
      const int pid = seg.slot(q).pid.load();
      // (the last rank may finish setup, run and exit before we look again)
      if (pid != 0 && !process_alive(pid) && h.unlinked.load(std::memory_order_acquire) == 0) {
        ::shm_unlink(seg.name().c_str());
        if (cleanup) cleanup();
        throw error("shm.attach", rank, q, "rank " + std::to_string(q) + " died during setup");
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

} // namespace detail

/// Completion handle of a shared-memory send or receive.
class request {
public:
  request() = default;
  request(std::shared_ptr<detail::engine> e, detail::op_ptr s) : e_(std::move(e)), s_(std::move(s)) {}
  request(request&& o) noexcept : e_(std::move(o.e_)), s_(std::move(o.s_)) {}
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      abandon();
      e_ = std::move(o.e_);
      s_ = std::move(o.s_);
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  /// An abandoned request is withdrawn: its buffer is never touched again.
  ~request() { abandon(); }

  /// True once complete; throws gradsync::error if the operation failed.
  bool test() {
    if (!s_) return true;
    if (!s_->done) e_->progress();
    if (!s_->done) return false;
    finish();
    return true;
  }
  /// Blocks until complete; throws gradsync::error if the operation failed,
  /// its peer died or left, or it was not matched within the timeout.
  void wait() {
    if (!s_) return;
    e_->wait(*s_);
    finish();
  }

private:
  void abandon() noexcept {
    if (s_ && !s_->done) e_->abandon(s_);
    s_.reset();
    e_.reset();
  }
  void finish() {
    auto s = std::move(s_);
    auto e = std::move(e_);
    if (!s->error.empty())
      throw error(s->is_send ? "shm.send" : "shm.recv", e->rank(), s->peer, s->error);
  }
  std::shared_ptr<detail::engine> e_;
  detail::op_ptr s_;
};

/// One rank's endpoint of a shared-memory group.
class communicator {
public:
  static constexpr std::string_view name = "shm";

  /// Joins the group of `size` ranks that rendezvous in directory `dir` (which
  /// every rank can reach; one group per directory at a time). Rank 0 creates
  /// the segment and publishes its name in `dir` atomically; the others wait
  /// for it (up to policy::shm_attach_timeout) and attach.
  communicator(const std::filesystem::path& dir, int rank, int size) {
    check_args(rank, size);
    const int stores = stores_setting(rank);
    std::error_code ec;
    GRADSYNC_REQUIRE(std::filesystem::is_directory(dir, ec), "shm.communicator", rank,
            "rendezvous directory " + dir.string() + " does not exist");
    const auto file = dir / "gradsync-shm.rendezvous";
    auto cleanup = [file] {
      std::error_code ec;
      std::filesystem::remove(file, ec);
    };
    auto seg = std::make_unique<detail::segment>();
    if (rank == 0) {
      cleanup(); // a stale file of a crashed run
      seg->create(size, detail::ring_bytes_for(size), policy::shm_arena_bytes);
      const auto tmp = dir / (".gradsync-shm." + seg->name().substr(10) + ".tmp");
      {
        std::ofstream f(tmp, std::ios::trunc);
        f << seg->name() << ' ' << size << ' ' << ::getpid() << '\n';
        f.close();
        if (!f) {
          ::shm_unlink(seg->name().c_str());
          throw error("shm.communicator", rank, -1, "cannot write rendezvous file in " + dir.string());
        }
      }
      std::filesystem::rename(tmp, file, ec); // atomic publication
      if (ec) {
        ::shm_unlink(seg->name().c_str());
        std::filesystem::remove(tmp, ec);
        throw error("shm.communicator", rank, -1, "cannot publish rendezvous file " + file.string());
      }
    } else {
      attach_from_file(*seg, file, rank, size);
    }
    detail::join(*seg, rank, size, cleanup);
    e_ = std::make_shared<detail::engine>(std::move(seg), rank, size);
    e_->stores = gradsync::detail::timed_choice(stores);
  }

  /// Joins a group bootstrapped by any out-of-band channel: `share(name)` is
  /// called on every rank; rank 0 passes the segment name it created and every
  /// other rank receives it as the return value (e.g. an MPI broadcast).
  communicator(int rank, int size, const std::function<std::string(const std::string&)>& share) {
    check_args(rank, size);
    const int stores = stores_setting(rank);
    auto seg = std::make_unique<detail::segment>();
    if (rank == 0) {
      try {
        seg->create(size, detail::ring_bytes_for(size), policy::shm_arena_bytes);
      } catch (...) {
        try { // an empty name tells the other ranks to fail instead of waiting
          share(std::string());
        } catch (...) {
        }
        throw;
      }
      try {
        share(seg->name());
      } catch (...) {
        ::shm_unlink(seg->name().c_str());
        throw;
      }
    } else {
      const std::string nm = share(std::string());
      const std::string why = seg->attach(nm, size, rank);
      GRADSYNC_REQUIRE(why.empty(), "shm.communicator", rank, "cannot attach: " + why);
    }
    detail::join(*seg, rank, size, nullptr);
    e_ = std::make_shared<detail::engine>(std::move(seg), rank, size);
    e_->stores = gradsync::detail::timed_choice(stores);
  }

  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;

  int rank() const noexcept { return e_->rank(); }
  int size() const noexcept { return e_->size(); }
  /// How long a wait blocks for its peer before failing (default
  /// policy::default_timeout). Dead peers are detected much sooner.
  void set_timeout(std::chrono::milliseconds t) noexcept { e_->timeout = t; }
  std::chrono::milliseconds timeout() const noexcept { return e_->timeout; }
  /// Name the segment had in /dev/shm (unlinked once every rank attached).
  const std::string& segment_name() const noexcept { return e_->segment_name(); }

  /// Posts a send of `data` to `peer`; complete once the bytes are in shared
  /// memory and the receiver has matched it.
  request isend(std::span<const std::byte> data, int peer, int tag) {
    return request(e_, e_->post_send(data.data(), data.size(), peer, tag));
  }
  /// Posts a receive of exactly `data.size()` bytes from `peer`.
  request irecv(std::span<std::byte> data, int peer, int tag) {
    return request(e_, e_->post_recv(data.data(), data.size(), peer, tag));
  }

  /// Fails every pending and future operation of every rank of the group
  /// with `reason` (e.g. after ranks disagreed on a collective call).
  void abort(const std::string& reason) { e_->abort(reason); }

  // ---- collective arena: the low-level interface of algo/shm_direct.hpp ----
  // Each rank owns arena_bytes() of shared staging that only it writes, and
  // monotonic counters it publishes (release) and every rank reads (acquire);
  // collectives built on them read peers' data in place.

  /// Rank `q`'s staging (arena_bytes() bytes, page aligned).
  std::byte* arena(int q) const { return e_->arena(q); }
  std::size_t arena_bytes() const noexcept { return e_->arena_bytes(); }
  /// Publishes this rank's counter `k` (< 4) as `v` and wakes sleeping peers.
  void arena_post(int k, std::uint64_t v) { e_->post(k, v); }
  /// Blocks until counter `k` of every rank reaches `v` (with the same dead
  /// peer detection and timeout as a receive); throws naming `op`.
  void arena_await(int k, std::uint64_t v, const char* op) { e_->await(k, v, op); }
  /// Copies `n` bytes from private memory into this rank's arena (streaming
  /// stores: the fast way into lines peers have read).
  static void arena_copy(std::byte* dst, const std::byte* src, std::size_t n) { detail::stream_copy(dst, src, n); }
  /// Whether arena writes use arena_copy (0) or ordinary stores (1), per
  /// kind of call: measured as calls run (core/timed_choice.hpp), or fixed
  /// by GRADSYNC_SHM_STORES=stream|plain when the communicator is created.
  gradsync::detail::timed_choice& arena_stores() noexcept { return e_->stores; }
  /// Rank `q`'s description of the call using arena half `h` (0 or 1).
  std::atomic<std::uint64_t>& arena_signature(int q, int h) const { return e_->arena_state(q).sig[h]; }
  /// Arena rounds this rank has run (the same on every rank between calls).
  std::uint64_t& arena_epoch() noexcept { return e_->epoch; }

private:
  // GRADSYNC_SHM_STORES: auto (default), stream or plain; checked before the
  // group forms, so a bad value fails every rank alike instead of one.
  static int stores_setting(int rank) {
    const char* v = std::getenv("GRADSYNC_SHM_STORES");
    return gradsync::detail::timed_choice::parse(v ? v : "", "stream", "plain", "shm.communicator", rank,
                                                 "GRADSYNC_SHM_STORES");
  }

  static void check_args(int rank, int size) {
    GRADSYNC_REQUIRE(size >= 1, "shm.communicator", rank, "rank count must be >= 1, got " + std::to_string(size));
    GRADSYNC_REQUIRE(rank >= 0 && rank < size, "shm.communicator", rank,
            "rank out of range [0, " + std::to_string(size) + ")");
  }

  static void attach_from_file(detail::segment& seg, const std::filesystem::path& file, int rank, int size) {
    const auto deadline = std::chrono::steady_clock::now() + policy::shm_attach_timeout;
    std::string why = "no rendezvous file " + file.string() + " (is rank 0 running?)";
    for (;;) {
      std::ifstream f(file);
      std::string nm;
      int n = 0, pid = 0;
      if (f >> nm >> n >> pid) {
        // A file of a crashed run names a dead creator or a vanished segment.
        if (n != size) why = "rendezvous file names a group of " + std::to_string(n) + " ranks, not " + std::to_string(size);
        else if (!detail::process_alive(pid)) why = "rendezvous file is stale (creator pid " + std::to_string(pid) + " is gone)";
        else if (auto w = seg.attach(nm, size, rank); !w.empty()) why = w;
        else if (seg.hdr().creator_pid != pid) {
          why = "rendezvous file and segment disagree on the creator";
          seg.release();
        } else return;
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw error("shm.communicator", rank, -1,
                    "rendezvous in " + file.parent_path().string() + " failed: " + why);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::shared_ptr<detail::engine> e_;
};

static_assert(transport<communicator>);

} // namespace gradsync::shm
