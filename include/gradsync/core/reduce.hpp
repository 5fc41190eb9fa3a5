// gradsync: host reduction kernels shared by every algorithm. The per-element
// math (widen, op, narrow) is the same GRADSYNC_HD code the CUDA paths use.
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "dtype.hpp"
#include "ops.hpp"

namespace gradsync {

/// One reduction step on one element: narrow(op(widen(a), widen(b))).
template <element T, reduce_op Op> GRADSYNC_HD inline T combine1(T a, T b, Op o) {
  return narrow<T>(o(widen(a), widen(b)));
}

/// avg's final step on one element: narrow(widen(v) / ranks).
template <element T> GRADSYNC_HD inline T finish1(T v, accum_t<T> ranks) {
  return narrow<T>(widen(v) / ranks);
}

/// The weight type of axpby1 for T: T's accumulation type for floating
/// types; double for integers (whose weighted sums are rounded to nearest).
template <element T>
using weight_t = std::conditional_t<std::is_floating_point_v<accum_t<T>>, accum_t<T>, double>;

/// One weighted combine on one element: a*x + b*y, computed in weight_t<T>
/// as two products and one sum (never contracted to a fused multiply-add,
/// so host and device agree bitwise).
template <element T> GRADSYNC_HD inline T axpby1(weight_t<T> a, T x, weight_t<T> b, T y) {
  using W = weight_t<T>;
#if defined(__CUDA_ARCH__) // nvcc would fuse a*x + b*y into an FMA: round each step
  W s;
  if constexpr (std::is_same_v<W, float>)
    s = __fadd_rn(__fmul_rn(a, static_cast<W>(widen(x))), __fmul_rn(b, static_cast<W>(widen(y))));
  else
    s = __dadd_rn(__dmul_rn(a, static_cast<W>(widen(x))), __dmul_rn(b, static_cast<W>(widen(y))));
#else
  const W s = a * static_cast<W>(widen(x)) + b * static_cast<W>(widen(y));
#endif
  if constexpr (std::is_floating_point_v<accum_t<T>>) {
    return narrow<T>(s);
  } else {
    return static_cast<T>(s < 0 ? s - 0.5 : s + 0.5); // round half away from zero
  }
}

/// out[i] = op(a[i], b[i]) for i < n. `out` may alias `a` or `b` exactly.
/// The operand order is fixed, so results are deterministic.
template <element T, reduce_op Op>
inline void combine(T* out, const T* a, const T* b, std::size_t n, Op o) {
  for (std::size_t i = 0; i < n; ++i) out[i] = combine1(a[i], b[i], o);
}

/// Final step of `op::avg`: divide by `ranks`, once (identity for other ops).
template <element T, reduce_op Op>
void finalize(T* data, std::size_t n, Op, int ranks) { // not inline: exec/host.hpp's prebuilt kernels
  if constexpr (Op::kind == op_kind::avg) {
    if (ranks == 1) return;
    using A = accum_t<T>;
    const A d = static_cast<A>(ranks);
    for (std::size_t i = 0; i < n; ++i) data[i] = finish1(data[i], d);
  }
}

/// Copies n elements unless source and destination are the same.
template <class T> inline void copy_elems(T* dst, const T* src, std::size_t n) {
  if (n != 0 && dst != src) std::memcpy(dst, src, n * sizeof(T));
}

} // namespace gradsync
