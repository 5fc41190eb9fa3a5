// gradsync: cross-memory attach (Linux process_vm_readv): one process reads
// another's private memory with a single kernel copy, no shared staging.
//
// The kernel allows it between processes of the same user unless a security
// module says otherwise (Yama ptrace_scope >= 1 without a ptracer exception,
// a seccomp filter, a container without the syscall, another uid), so a
// group of ranks probes it once when it forms (probe()) and every rank then
// takes the same path (algo/shm_direct.hpp).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>

#if defined(__linux__)
#include <sys/types.h>
#include <sys/uio.h>
#endif

#include "error.hpp"
#include "policy.hpp"

namespace gradsync::cma {

/// Whether this build can use process_vm_readv at all.
#if defined(__linux__)
inline constexpr bool compiled_in = true;
#else
inline constexpr bool compiled_in = false;
#endif

/// The value of probe_word: a peer that reads it through cross-memory
/// attach knows the read really reached this process.
inline constexpr std::uint64_t probe_value = 0x676d612d70726f62ull; // "gma-prob"

/// A word every process holds at some address it publishes to its peers
/// (one per process: an inline variable has one definition).
inline const volatile std::uint64_t probe_word = probe_value;

/// Largest transfer of one system call (the kernel clips a call to about
/// 2 GiB; we never ask for more than 1 GiB so a partial count means a fault).
inline constexpr std::size_t max_call_bytes = std::size_t{1} << 30;

/// Copies `n` bytes at address `remote` of process `pid` into `local`.
/// Returns 0, or the errno of the failure: ESRCH (the process is gone),
/// EFAULT (the range is not mapped there), EPERM (not allowed), ENOSYS (no
/// such call). Partial transfers continue where they stopped, so a nonzero
/// result means the bytes could not all be read.
inline int read(int pid, void* local, const void* remote, std::size_t n) noexcept {
#if defined(__linux__)
  auto* d = static_cast<std::byte*>(local);
  auto s = reinterpret_cast<std::uintptr_t>(remote);
  while (n > 0) {
    const std::size_t want = n < max_call_bytes ? n : max_call_bytes;
    iovec l{d, want};
    iovec r{reinterpret_cast<void*>(s), want};
    const ssize_t got = ::process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return EFAULT; // no progress: the next byte is unreadable
    const auto g = static_cast<std::size_t>(got);
    d += g;
    s += g;
    n -= g;
  }
  return 0;
#else
  (void)pid, (void)local, (void)remote, (void)n;
  return ENOSYS;
#endif
}

/// True if this process can read process `pid`'s probe_word, published by
/// that process as `word` (its address there).
inline bool probe(int pid, std::uint64_t word) noexcept {
  if (!compiled_in || pid <= 0 || word == 0) return false;
  std::uint64_t v = 0;
  return read(pid, &v, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(word)), sizeof v) == 0 &&
         v == probe_value;
}

/// This process's probe_word address, as peers pass it to probe().
inline std::uint64_t probe_address() noexcept {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&probe_word));
}

/// True if process `pid` is gone (exited, killed, or a zombie: its memory
/// is released): a read of the byte it exposed at `addr` finds no process.
inline bool gone(int pid, std::uint64_t addr) noexcept {
  std::byte b;
  return read(pid, &b, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(addr)), 1) == ESRCH;
}

/// A smallest call size meaning "never".
inline constexpr std::uint64_t never = std::numeric_limits<std::uint64_t>::max();

/// The smallest call (bytes) this process wants read in place, from
/// GRADSYNC_SHM_SINGLE_COPY: `auto` or unset -> policy::shm_single_copy_min_bytes,
/// `off` -> never, a byte count -> that. A group takes the largest any of its
/// ranks wants (and never where a probe fails), so that all take one path.
/// Anything else is an error naming the variable (`op`, `rank` name the caller).
inline std::uint64_t min_bytes_setting(const char* op, int rank) {
  const char* v = std::getenv("GRADSYNC_SHM_SINGLE_COPY");
  const std::string_view s = v ? v : "";
  if (s.empty() || s == "auto") return policy::shm_single_copy_min_bytes;
  if (s == "off") return never;
  std::uint64_t n = 0;
  bool ok = s.size() <= 19;
  for (char ch : s) {
    ok = ok && ch >= '0' && ch <= '9';
    n = n * 10 + static_cast<std::uint64_t>(ch - '0');
  }
  if (!ok)
    throw error(op, rank, -1,
                "GRADSYNC_SHM_SINGLE_COPY=\"" + std::string(s) + "\" is not one of auto, off, or a size in bytes");
  return n;
}

/// Readable text of a read() failure.
inline std::string describe(int err) {
  return std::string("process_vm_readv: ") + std::error_code(err, std::system_category()).message();
}

/// The error for a failed read() of rank `peer` (pid `pid`) during `op` on
/// rank `rank`: errc::peer_failed when that process is gone (ESRCH) or its
/// buffer vanished under the read (EFAULT: it unmapped or is exiting), else
/// errc::internal (permission or kernel support changed after the probe).
inline error read_error(int err, const char* op, int rank, int peer, int pid) {
  const bool gone = err == ESRCH || err == EFAULT;
  return error(gone ? errc::peer_failed : errc::internal, op, rank, peer,
               "rank " + std::to_string(peer) + " (pid " + std::to_string(pid) + ")" +
                   (gone ? " died or released its buffer during the call" : " could not be read") + ": " +
                   describe(err));
}

} // namespace gradsync::cma
