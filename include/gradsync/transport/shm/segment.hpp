// gradsync: the shared-memory transport's segment (see transport/shm.hpp):
// creating, mapping and attaching it, and the join that waits for every
// rank and then unlinks its name.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>
#include <thread>

#include "../../core/cross_memory.hpp"
#include "../../core/error.hpp"
#include "../../core/policy.hpp"
#include "../../core/process.hpp"
#include "../../core/random_name.hpp"
#include "layout.hpp"

namespace gradsync::shm::detail {

/// How long ranks wait for each other while joining: GRADSYNC_SHM_JOIN_TIMEOUT_MS
/// (milliseconds, > 0) if set, else policy::shm_attach_timeout.
inline std::chrono::milliseconds join_timeout(int rank) {
  const char* v = std::getenv("GRADSYNC_SHM_JOIN_TIMEOUT_MS");
  if (v == nullptr || *v == '\0') return policy::shm_attach_timeout;
  char* end = nullptr;
  const long long ms = std::strtoll(v, &end, 10);
  GRADSYNC_REQUIRE(end != v && *end == '\0' && ms > 0, "shm.communicator", rank,
                   std::string("GRADSYNC_SHM_JOIN_TIMEOUT_MS='") + v + "' is not a positive number of milliseconds");
  return std::chrono::milliseconds(ms);
}

using gradsync::detail::process_alive;
using gradsync::detail::sys_error;

// Why an attach was refused (`why` empty: it was not).
struct refusal {
  std::string why;
  errc kind = errc::internal; // mismatch: the segment is not the group this rank expects
  bool ok() const noexcept { return why.empty(); }
};

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
  /// `before_create(name)` runs before each name is tried (the directory
  /// rendezvous records its intent there, so that a kill -9 between creating
  /// the segment and publishing its name leaves a record the next join finds).
  void create(int p, std::size_t ring, std::size_t arena,
              const std::function<void(const std::string&)>& before_create = nullptr) {
    const layout l(p, ring, arena);
    int fd = -1;
    for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
      name_ = gradsync::detail::random_name("/gradsync-", "shm.create", 0);
      if (before_create) before_create(name_);
      fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
      if (fd < 0 && errno != EEXIST)
        throw error(errc::internal, "shm.create", 0, -1, "shm_open(" + name_ + ") failed: " + sys_error(errno));
    }
    if (fd < 0) throw error(errc::internal, "shm.create", 0, -1, "could not find an unused segment name");
    // posix_fallocate reserves the pages now: a full /dev/shm fails here with
    // an error instead of SIGBUS on first touch.
    int rc = ::ftruncate(fd, static_cast<off_t>(l.total));
    if (rc == 0) rc = ::posix_fallocate(fd, 0, static_cast<off_t>(l.total));
    else rc = errno;
    if (rc != 0) {
      ::close(fd);
      ::shm_unlink(name_.c_str());
      throw error(errc::internal, "shm.create", 0, -1,
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

  /// Attaches to segment `name` made for `p` ranks. Returns why it could not,
  /// if it could not (so the caller may retry a stale name).
  refusal attach(const std::string& name, int p, int rank) {
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return {"shm_open(" + name + "): " + sys_error(errno)};
    struct stat st{};
    if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < sizeof(header)) {
      ::close(fd);
      return {"segment " + name + " is too small"};
    }
    map(fd, static_cast<std::size_t>(st.st_size), rank);
    hdr_ = reinterpret_cast<header*>(base_);
    if (hdr_->ready.load(std::memory_order_acquire) != 1 || hdr_->magic != magic)
      return unmap("segment " + name + " is not an initialised gradsync segment of this version");
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
      throw error(errc::internal, "shm.attach", rank, -1, "mmap of " + std::to_string(bytes) + " bytes failed: " + sys_error(e));
    }
    base_ = static_cast<std::byte*>(m);
    bytes_ = bytes;
  }
  // Refuses a segment that is not the one this rank's group expects.
  refusal unmap(std::string why) {
    release();
    return {std::move(why), errc::mismatch};
  }
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  header* hdr_ = nullptr;
  std::string name_;
  int p_ = 0;
  std::size_t ring_ = 0, arena_ = 0;
};

// Registers `rank` in an attached segment and waits until every rank has;
// the last to arrive unlinks the name (and runs `cleanup`).
inline void join(segment& seg, int rank, int size, const std::function<void()>& cleanup) {
  auto& h = seg.hdr();
  auto& me = seg.slot(rank);
  std::int32_t none = 0;
  if (!me.pid.compare_exchange_strong(none, static_cast<std::int32_t>(::getpid())))
    throw error(errc::mismatch, "shm.attach", rank, -1,
                "rank " + std::to_string(rank) + " is already attached (pid " + std::to_string(none) +
                    "): two processes were given the same rank");
  me.probe_word.store(cma::probe_address(), std::memory_order_relaxed); // (released with `attached`)
  me.state.store(attached, std::memory_order_release);
  if (h.attached.fetch_add(1) + 1 == size) {
    ::shm_unlink(seg.name().c_str());
    if (cleanup) cleanup();
    h.unlinked.store(1, std::memory_order_release);
    return;
  }
  const auto limit = join_timeout(rank);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (h.unlinked.load(std::memory_order_acquire) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::shm_unlink(seg.name().c_str()); // leave nothing behind
      if (cleanup) cleanup();
      throw error(errc::timeout, "shm.attach", rank, -1,
                  "only " + std::to_string(h.attached.load()) + " of " + std::to_string(size) +
                      " ranks attached within " + std::to_string(limit.count()) +
                      " ms (GRADSYNC_SHM_JOIN_TIMEOUT_MS sets this)");
    }
    // The creator, dead before its own join (its slot still empty).
    if (const int cp = h.creator_pid; cp != 0 && seg.slot(0).pid.load() == 0 && !process_alive(cp) &&
                                      h.unlinked.load(std::memory_order_acquire) == 0) {
      ::shm_unlink(seg.name().c_str());
      if (cleanup) cleanup();
      throw error(errc::peer_failed, "shm.attach", rank, 0, "rank 0 (pid " + std::to_string(cp) + ") died during setup");
    }
    for (int q = 0; q < size; ++q) { // a rank that died during setup
      const int pid = seg.slot(q).pid.load();
      // (the last rank may finish setup, run and exit before we look again)
      if (pid != 0 && !process_alive(pid) && h.unlinked.load(std::memory_order_acquire) == 0) {
        ::shm_unlink(seg.name().c_str());
        if (cleanup) cleanup();
        throw error(errc::peer_failed, "shm.attach", rank, q, "rank " + std::to_string(q) + " died during setup");
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

} // namespace gradsync::shm::detail
