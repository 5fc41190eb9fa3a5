// gradsync: the host executor. Element work on host memory with the
// per-element math of core/reduce.hpp; the reduction of types computed in
// their own precision (float, double, int32, int64) runs 64 bytes per step
// through GCC vector types, which compute exactly what combine1 does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/reduce.hpp"
#include "executor.hpp"

namespace gradsync::exec {

/// Scratch of `n` elements of T in host memory: the caller's workspace when
/// one was given (it must be large enough and aligned), else memory owned by
/// this object. `op` and `rank` name the call in errors.
template <class T> class host_scratch {
public:
  host_scratch(std::span<std::byte> ws, std::size_t n, const char* op, int rank) {
    if (n == 0) return;
    const std::size_t need = n * sizeof(T);
    if (!ws.empty()) {
      GRADSYNC_REQUIRE(ws.size() >= need, op, rank,
                       "workspace holds " + std::to_string(ws.size()) + " bytes, " +
                           std::to_string(need) + " are needed (ask *_workspace_bytes)");
      GRADSYNC_REQUIRE(reinterpret_cast<std::uintptr_t>(ws.data()) % alignof(T) == 0, op, rank,
                       "workspace is not aligned to " + std::to_string(alignof(T)) + " bytes");
      p_ = reinterpret_cast<T*>(ws.data());
    } else {
      own_ = std::make_unique_for_overwrite<T[]>(n);
      p_ = own_.get();
    }
  }
  T* data() const noexcept { return p_; }

private:
  std::unique_ptr<T[]> own_;
  T* p_ = nullptr;
};

/// out = op(a, b) elementwise, exactly as combine() computes it, 64 bytes per
/// step for types reduced in their own precision (combine's loop stays scalar
/// at -O2 because `out` may alias an input; here each vector is loaded before
/// it is stored, so exact aliasing is still fine).
// Not `inline`: an `extern template` declaration (below) suppresses the
// instantiation of a template function only if it is not inline.
template <element T, reduce_op Op>
void combine_wide(T* out, const T* a, const T* b, std::size_t n, Op op) {
  std::size_t i = 0;
#if defined(__GNUC__) && !defined(__CUDACC__)
  if constexpr (std::is_same_v<T, accum_t<T>> && std::is_arithmetic_v<T>) {
    using vec [[gnu::vector_size(16)]] = T; // SSE2-sized: no ABI change in op()
    constexpr std::size_t w = 16 / sizeof(T);
    for (; i + 4 * w <= n; i += 4 * w) {
      vec x[4], y[4];
      std::memcpy(x, a + i, sizeof x);
      std::memcpy(y, b + i, sizeof y);
      for (int k = 0; k < 4; ++k) x[k] = op(x[k], y[k]);
      std::memcpy(out + i, x, sizeof x);
    }
  }
#endif
  combine(out + i, a + i, b + i, n - i, op);
}

/// The host executor: stateless, cheap to copy; every call completes before
/// it returns, so fence() has nothing to do.
struct host {
  static constexpr memory_space space = memory_space::host;

  template <element T, reduce_op Op>
  void reduce(T* y, const T* a, const T* b, std::size_t n, Op op) const {
    combine_wide(y, a, b, n, op);
  }
  template <element T, reduce_op Op> void finish(T* y, std::size_t n, Op op, int ranks) const {
    finalize(y, n, op, ranks);
  }
  template <class T> void copy(T* dst, const T* src, std::size_t n) const { copy_elems(dst, src, n); }
  template <element T>
  void axpby(T* y, double a, const T* x, double b, std::size_t n) const {
    const auto wa = static_cast<weight_t<T>>(a), wb = static_cast<weight_t<T>>(b);
    for (std::size_t i = 0; i < n; ++i) y[i] = axpby1<T>(wa, x[i], wb, y[i]);
  }
  template <class T>
  host_scratch<T> scratch(std::span<std::byte> ws, std::size_t n, const char* op, int rank) const {
    return host_scratch<T>(ws, n, op, rank);
  }
  void fence() const noexcept {}
};

static_assert(executor<host>);

} // namespace gradsync::exec

// Prebuilt kernels (gradsync/prebuilt.hpp): the host reduction of every
// prebuilt dtype and op, compiled once, optimised (prebuilt/kernels.cpp; our
// meson.build keeps it at -O2 even in a quick -O0 build), and declared `extern template` in code
// built with GRADSYNC_PREBUILT and in the prebuilt collectives' units. A
// build at -O0 (README's test command) then runs its reductions at full
// speed: in the collectives sweep at -O0, the per-element calls of the
// unoptimised bf16 reduction were ~40 % of the run time (perf).
#define GRADSYNC_PREBUILT_KERNEL(KW, T, Op)                                                                          \
  KW void ::gradsync::exec::combine_wide<T, Op>(T*, const T*, const T*, std::size_t, Op);
#define GRADSYNC_PREBUILT_KERNELS_OF(KW, T)                                                                          \
  GRADSYNC_PREBUILT_KERNEL(KW, T, ::gradsync::op::sum)                                                               \
  GRADSYNC_PREBUILT_KERNEL(KW, T, ::gradsync::op::prod)                                                              \
  GRADSYNC_PREBUILT_KERNEL(KW, T, ::gradsync::op::min)                                                               \
  GRADSYNC_PREBUILT_KERNEL(KW, T, ::gradsync::op::max)                                                               \
  GRADSYNC_PREBUILT_KERNEL(KW, T, ::gradsync::op::avg)                                                               \
  KW void ::gradsync::finalize<T, ::gradsync::op::avg>(T*, std::size_t, ::gradsync::op::avg, int);
#define GRADSYNC_PREBUILT_KERNELS(KW)                                                                                \
  GRADSYNC_PREBUILT_KERNELS_OF(KW, float)                                                                            \
  GRADSYNC_PREBUILT_KERNELS_OF(KW, double)                                                                           \
  GRADSYNC_PREBUILT_KERNELS_OF(KW, ::gradsync::half)                                                                 \
  GRADSYNC_PREBUILT_KERNELS_OF(KW, ::gradsync::bfloat16)                                                             \
  GRADSYNC_PREBUILT_KERNELS_OF(KW, std::int32_t)                                                                     \
  GRADSYNC_PREBUILT_KERNELS_OF(KW, std::int64_t)
#if (defined(GRADSYNC_PREBUILT) || defined(GRADSYNC_PREBUILT_INSTANTIATE)) && !defined(GRADSYNC_PREBUILT_KERNELS_INSTANTIATE)
GRADSYNC_PREBUILT_KERNELS(extern template)
#endif
