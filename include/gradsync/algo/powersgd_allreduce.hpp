// gradsync: the PowerSGD allreduce (Vogels et al., NeurIPS'19), the two
// small factor allreduces of compress/powersgd.hpp's protocol:
//   P_i = M_i Q;  P = allreduce_sum(P_i);  orthonormalise(P);
//   Q_i = M_i^T P;  Q = allreduce(Q_i) (avg or sum);  result = P Q^T;
// with Q kept as the next step's warm start. M_i is the rank's tensor viewed
// as rows x cols (row-major, rows = n / cols); the n - rows*cols trailing
// elements (a ragged tail) are allreduced densely. Factors travel as float.
// Bytes per rank: 2 (p-1)/p (rows + cols) r floats instead of n elements.
//
// Every rank holds the same P after its allreduce and orthonormalises it
// with the same (seed, step) draws, so all ranks agree on P, Q and the
// result bitwise. Error feedback: residual_i += M_i - P Q_i^T with this
// rank's own Q_i (before the Q allreduce): the residuals sum to what the
// result lost (sum M_i - P sum Q_i^T) while each holds only its own
// approximation error, not its difference from the other ranks (which a
// residual of M_i - P Q^T would accumulate). The dense tail adds nothing.
// A factor holding NaN/Inf (non-finite input) yields a NaN result and keeps
// the previous warm start.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "../compress/powersgd.hpp"
#include "../core/dtype.hpp"
#include "../core/timeline.hpp"

namespace gradsync::algo::powersgd_allreduce {

/// Float scratch elements for a rows x cols matrix at rank r: P and Q.
inline std::size_t scratch_floats(std::size_t rows, std::size_t cols, std::size_t r) { return (rows + cols) * r; }

/// PowerSGD allreduce in place on `data` (n elements) with codec `k`
/// (rows, cols, rank) and state `st` (seed agreed on every rank; Q warm
/// start). `f` holds scratch_floats(...) floats. `dense_float(span<float>,
/// bool average)` and `dense(span<T>)` allreduce on every rank. With a
/// timeline, the two products (P = M Q with the orthonormalisation, Q = M^T P
/// with the residual) are "encode" phases and the reconstruction "decode".
template <compress::float_element T, class DenseFloat, class Dense>
void allreduce(const compress::powersgd<T>& k, compress::powersgd_state& st, T* data, std::size_t n,
               bool average, accum_t<T>* residual, std::span<float> f, DenseFloat&& dense_float, Dense&& dense,
               timeline* trace = nullptr) {
  using A = accum_t<T>;
  const std::size_t rows = k.rows, cols = k.cols, r = k.used_rank(), m = rows * cols;
  if (m < n) dense(std::span<T>(data + m, n - m)); // the ragged tail, uncompressed
  if (m == 0) return;
  if (st.q.size() != cols * r) {
    st.q.assign(cols * r, 0.0f);
    compress::powersgd_initial_q(st.seed, cols, r, st.q.data());
  }
  const compress::philox_stream rng{st.seed, static_cast<std::uint32_t>(st.step), compress::powersgd_key};
  ++st.step;
  float* p = f.data();
  float* q = p + rows * r;
  {
    const auto phase = element_phase(trace, "encode", "codec", m);
    compress::powersgd_multiply(data, rows, cols, st.q.data(), r, p);
  }
  dense_float(std::span<float>(p, rows * r), false);
  {
    const auto phase = element_phase(trace, "encode", "codec", m);
    st.replaced = compress::powersgd_orthonormalize(p, rows, r, rng);
    compress::powersgd_multiply_transposed(data, rows, cols, p, r, q);
    if (residual) { // this rank's share of the error: M_i - P Q_i^T (sums to the total over ranks)
      bool local_finite = true;
      for (std::size_t x = 0; x < cols * r; ++x) local_finite &= std::isfinite(q[x]);
      if (local_finite)
        compress::powersgd_reconstruct(p, q, rows, cols, r, [&](std::size_t i, float v) {
          if (const A e = widen(data[i]) - static_cast<A>(v); std::isfinite(static_cast<double>(e))) residual[i] += e;
        });
    }
  }
  dense_float(std::span<float>(q, cols * r), average);
  const auto phase = element_phase(trace, "decode", "codec", m);
  bool finite = true;
  for (std::size_t x = 0; x < (rows + cols) * r; ++x) finite &= std::isfinite(p[x]);
  if (finite) std::copy(q, q + cols * r, st.q.begin());
  compress::powersgd_reconstruct(p, q, rows, cols, r, [&](std::size_t i, float v) {
    data[i] = narrow<T>(static_cast<A>(finite ? v : std::numeric_limits<float>::quiet_NaN()));
  });
}

} // namespace gradsync::algo::powersgd_allreduce
