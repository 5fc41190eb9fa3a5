// gradsync: runtime choice of wider vector code for the hot host loops.
//
// A header-only library is compiled with its user's flags, usually the x86-64
// baseline (SSE2), where the codec loops run at a third of memcpy speed (the
// float -> int8 packing and the 16-bit casts have no SSE2 instructions). So a
// hot loop is written once as a lambda and run through host_vectorized(),
// which on a CPU with AVX2 and F16C calls it from a function compiled for
// them with everything below inlined (`flatten`), and otherwise calls it as
// is. Both clones compute the same IEEE operations in the same order; FMA is
// deliberately not enabled, so no multiply-add is contracted differently and
// results are bitwise identical whichever clone runs (tests check both).
//
// The payload checksum (compress/wire.hpp) is integer-only and needs 64-bit
// lane multiplies, which only AVX-512DQ has: it has its own AVX-512 clone
// (host_has_avx512dq) and no float operation can be contracted there.
//
// Elsewhere (not x86-64, not GCC/Clang, or under nvcc, whose host pass keeps
// the baseline) host_vectorized just calls the lambda.
#pragma once

#include <cstddef>
#include <cstdint>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDACC__) && !defined(GRADSYNC_NO_HOST_SIMD)
#define GRADSYNC_HOST_AVX2 1
#include <immintrin.h>
#if defined(__clang__)
#include <cpuid.h>
#endif
#else
#define GRADSYNC_HOST_AVX2 0
#endif

namespace gradsync::detail {

/// Which host clone host_vectorized() runs.
enum class host_isa : std::uint8_t { baseline, avx2 };

#if GRADSYNC_HOST_AVX2
/// Whether the CPU has F16C. GCC's __builtin_cpu_supports knows "f16c";
/// clang 14's does not (it rejects the string), so there CPUID leaf 1 is
/// read directly, once (CPUID traps to the hypervisor in a VM: microseconds).
/// YMM state being enabled by the OS is checked by the "avx2" test beside it.
inline bool host_has_f16c() {
#if defined(__clang__)
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
  }();
  return has;
#else
  return __builtin_cpu_supports("f16c");
#endif
}
#endif

/// The best clone this CPU can run (a CPUID read cached by the runtime).
inline host_isa best_host_isa() {
#if GRADSYNC_HOST_AVX2
  if (__builtin_cpu_supports("avx2") && host_has_f16c()) return host_isa::avx2;
#endif
  return host_isa::baseline;
}

/// Whether the CPU has AVX-512F/DQ/VL (64-bit lane multiplies).
inline bool host_has_avx512dq() {
#if GRADSYNC_HOST_AVX2
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

#if GRADSYNC_HOST_AVX2
/// f(args...) compiled for AVX2 + F16C (no FMA: see the file comment).
template <class F, class... A>
[[gnu::target("avx2,f16c"), gnu::flatten]] inline void run_avx2(const F& f, A... args) {
  f(args...);
}
#endif

/// Runs f(args...) as the clone `isa` (tests force each; best_host_isa() is
/// the one to use); an isa this CPU lacks falls back to the baseline. Pass the
/// loop's pointers and sizes as `args` (by value), not as captures: stores
/// through a byte pointer may alias the closure, and the compiler would then
/// reload every captured pointer each iteration instead of vectorising.
template <class F, class... A> inline void host_vectorized(host_isa isa, const F& f, A... args) {
#if GRADSYNC_HOST_AVX2
  if (isa == host_isa::avx2 && best_host_isa() == host_isa::avx2) {
    run_avx2(f, args...);
    return;
  }
#endif
  (void)isa;
  f(args...);
}

} // namespace gradsync::detail
