// gradsync: host reduction kernels shared by every algorithm. The per-element
// math (widen, op, narrow) is the same GRADSYNC_HD code the CUDA paths use.
#pragma once

#include <cstddef>
#include <cstring>

#include "dtype.hpp"
#include "ops.hpp"

namespace gradsync {

/// One reduction step on one element: narrow(op(widen(a), widen(b))).
template <element T, reduce_op Op> GRADSYNC_HD inline T combine1(T a, T b, Op o) {
  return narrow<T>(o(widen(a), widen(b)));
}

/// out[i] = op(a[i], b[i]) for i < n. `out` may alias `a` or `b` exactly.
/// The operand order is fixed, so results are deterministic.
template <element T, reduce_op Op>
inline void combine(T* out, const T* a, const T* b, std::size_t n, Op o) {
  for (std::size_t i = 0; i < n; ++i) out[i] = combine1(a[i], b[i], o);
}

/// Final step of `op::avg`: divide by `ranks`, once (identity for other ops).
template <element T, reduce_op Op>
inline void finalize(T* data, std::size_t n, Op, int ranks) {
  if constexpr (Op::kind == op_kind::avg) {
    if (ranks == 1) return;
    using A = accum_t<T>;
    const A d = static_cast<A>(ranks);
    for (std::size_t i = 0; i < n; ++i) data[i] = narrow<T>(widen(data[i]) / d);
  }
}

/// Copies n elements unless source and destination are the same.
template <class T> inline void copy_elems(T* dst, const T* src, std::size_t n) {
  if (n != 0 && dst != src) std::memcpy(dst, src, n * sizeof(T));
}

} // namespace gradsync
