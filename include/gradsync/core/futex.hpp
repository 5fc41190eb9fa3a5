// gradsync: waiting on a 32-bit word with a deadline, for the transports.
// std::atomic::wait has no timeout, and mixing it with raw futex calls could
// lose wake-ups, so waiters that need a deadline use these instead.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace gradsync::detail {

/// Who may wait on or wake a word: threads of this process only (cheaper
/// kernel lookup), or any process mapping it (shared memory).
enum class futex_scope { process_private, shared };

/// Sleeps while `w` holds `expected`, for at most `d`; returns early when
/// woken, on a signal, or spuriously, so callers re-check their condition.
inline void futex_wait(std::atomic<std::uint32_t>& w, std::uint32_t expected, std::chrono::nanoseconds d,
                       futex_scope scope = futex_scope::shared) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  if (d <= std::chrono::nanoseconds::zero()) return;
#if defined(__linux__)
  const auto ns = d.count();
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w),
          scope == futex_scope::shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
#else
  // No timed wait on the word: poll it briefly instead (same contract).
  (void)scope;
  const auto until = std::chrono::steady_clock::now() + d;
  while (w.load() == expected && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
#endif
}

/// Wakes every thread sleeping in futex_wait on `w` (same scope).
inline void futex_wake(std::atomic<std::uint32_t>& w, futex_scope scope = futex_scope::shared) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w),
          scope == futex_scope::shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)scope;
  w.notify_all();
#endif
}

/// Tells the CPU this is a spin-wait iteration (frees pipeline resources for
/// a sibling hyperthread).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

} // namespace gradsync::detail
