// gradsync: buffers every rank of a shared-memory group maps (NCCL's
// registered user buffers, MPI_Win_allocate_shared). Allocating one is a
// collective call: each rank creates a POSIX shared-memory object of the
// same size, the names travel to every peer, every rank maps every peer's
// object, and once all have mapped them the objects are unlinked (nothing
// stays in /dev/shm). A collective whose buffers all lie in such memory
// (algo/shm_direct.hpp) then reads peers' inputs and writes their outputs
// in place: each byte moves once, as in a memcpy, instead of through the
// arena (copy in, reduce, copy out).
//
// The registry of a communicator lists the buffers this rank has mapped;
// ids are assigned in allocation order, so they agree on every rank.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../../core/error.hpp"
#include "../../core/process.hpp"

namespace gradsync::shm {

/// Where a range of this rank's memory lies in a shared buffer: the
/// buffer's id (the same on every rank) and the byte offset into it.
struct shared_view {
  std::uint64_t id = 0;
  std::size_t offset = 0;
};

namespace detail {

// One mapping of a shared-memory object, unmapped when destroyed.
class mapping {
public:
  mapping() = default;
  mapping(void* p, std::size_t n) : p_(static_cast<std::byte*>(p)), n_(n) {}
  mapping(mapping&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  mapping& operator=(mapping&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~mapping() {
    if (p_) ::munmap(p_, n_);
  }
  std::byte* data() const noexcept { return p_; }

private:
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
};

// Opens (creating it when `create`) and maps `bytes` of object `name`
// read-write; throws errc::internal naming `op` and `rank`.
inline mapping map_object(const std::string& name, std::size_t bytes, bool create, const char* op, int rank) {
  const int fd = ::shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC : O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw error(errc::internal, op, rank, -1, "shm_open(" + name + ") failed: " + gradsync::detail::sys_error(errno));
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw error(errc::internal, op, rank, -1,
                "cannot size " + name + " to " + std::to_string(bytes) + " bytes: " + gradsync::detail::sys_error(e));
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) {
    if (create) ::shm_unlink(name.c_str());
    throw error(errc::internal, op, rank, -1,
                "mmap of " + std::to_string(bytes) + " bytes of " + name + " failed: " + gradsync::detail::sys_error(e));
  }
  return mapping(m, bytes);
}

// The shared buffers one rank has mapped: per buffer, every rank's object
// in this process's address space.
class registry {
public:
  struct entry {
    std::uint64_t id = 0;
    std::size_t bytes = 0;
    std::vector<mapping> of; // of[q]: rank q's object
  };

  std::uint64_t next_id() const noexcept { return next_; }
  void add(entry e) {
    next_ = e.id + 1;
    entries_.push_back(std::move(e));
  }
  void remove(std::uint64_t id) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->id == id) {
        entries_.erase(it);
        return;
      }
  }
  // The buffer of this rank (`rank`) holding all of [p, p + n), if any.
  std::optional<shared_view> find(int rank, const void* p, std::size_t n) const {
    const auto b = reinterpret_cast<std::uintptr_t>(p);
    for (const auto& e : entries_) {
      const auto base = reinterpret_cast<std::uintptr_t>(e.of[static_cast<std::size_t>(rank)].data());
      if (b >= base && b - base <= e.bytes && n <= e.bytes - (b - base))
        return shared_view{e.id, static_cast<std::size_t>(b - base)};
    }
    return std::nullopt;
  }
  // Rank q's buffer `id` at byte `offset`, mapped here, if it holds `n`
  // bytes from there.
  std::byte* at(int q, std::uint64_t id, std::size_t offset, std::size_t n) const {
    for (const auto& e : entries_)
      if (e.id == id && offset <= e.bytes && n <= e.bytes - offset)
        return e.of[static_cast<std::size_t>(q)].data() + offset;
    return nullptr;
  }

private:
  std::vector<entry> entries_;
  std::uint64_t next_ = 1;
};

} // namespace detail

/// A buffer every rank of the group has mapped (see the file comment);
/// returned by shm::communicator::alloc_shared. Move-only; freeing it is
/// local (peers keep their mappings until they free theirs). The
/// communicator must outlive it.
class shared_buffer {
public:
  shared_buffer() = default;
  shared_buffer(std::shared_ptr<detail::registry> reg, std::uint64_t id, std::byte* p, std::size_t n)
      : reg_(std::move(reg)), id_(id), p_(p), n_(n) {}
  shared_buffer(shared_buffer&& o) noexcept
      : reg_(std::move(o.reg_)), id_(o.id_), p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  shared_buffer& operator=(shared_buffer&& o) noexcept {
    std::swap(reg_, o.reg_);
    std::swap(id_, o.id_);
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~shared_buffer() {
    if (reg_) reg_->remove(id_);
  }

  /// This rank's bytes.
  std::span<std::byte> bytes() const noexcept { return {p_, n_}; }
  /// This rank's bytes as elements of T (as many as fit).
  template <class T> std::span<T> as() const noexcept { return {reinterpret_cast<T*>(p_), n_ / sizeof(T)}; }
  /// The id shared by every rank's part of this buffer.
  std::uint64_t id() const noexcept { return id_; }

private:
  std::shared_ptr<detail::registry> reg_;
  std::uint64_t id_ = 0;
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
};

} // namespace gradsync::shm
