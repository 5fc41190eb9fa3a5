// gradsync: PowerSGD low-rank compression (Vogels et al., NeurIPS'19).
//
// A gradient of rows x cols elements (row-major M) is approximated by P Q^T
// with P (rows x r) orthonormal and Q (cols x r), from one step of subspace
// iteration warm-started with the previous step's Q:
//
//   P = M Q_prev;  P = orthonormalise(P);  Q = M^T P;  M ~= P Q^T = P P^T M.
//
// For a matrix of rank <= r, P spans its column space after one step (for a
// generic Q_prev) and the reconstruction is exact up to rounding. For a fixed
// matrix the warm-started steps are power iterations: the error falls toward
// the best rank-r error. Q lives in the per-tensor state (float) and starts
// as Philox noise of the state's seed.
//
// In a collective (two-step protocol; the step functions below let a
// collective interleave the two allreduces, each of a small factor):
//   1. every rank: P_i = M_i Q            (powersgd_multiply; all ranks hold the same Q)
//   2. allreduce(P = sum_i P_i)           rows * r floats
//   3. every rank: orthonormalise(P)      (powersgd_orthonormalize; same input,
//                                          same seed and step -> same result)
//   4. every rank: Q_i = M_i^T P          (powersgd_multiply_transposed)
//   5. allreduce(Q = sum_i Q_i)           cols * r floats
//   6. every rank: sum_i M_i ~= P Q^T     (powersgd_reconstruct); keep Q
// By linearity this is exactly single-process PowerSGD on sum_i M_i. All
// ranks must use the same seed (the initial Q and the replacement directions
// are drawn with it), which is why the Philox rank key is fixed here.
//
// The factors travel as float whatever T is: Q = M^T P grows like the column
// norms of M (a half gradient can overflow 65504 there) and P must stay
// orthonormal to float precision. Orthogonalisation is modified Gram-Schmidt
// applied twice ("twice is enough"), with double dot products on the host. A
// column that is numerically dependent on the previous ones (rank-deficient
// input, or zero) is replaced by a Philox direction orthogonalised against
// them, so a zero column never freezes the warm start.
//
// Non-finite input (or a factor overflowing float) sends a poisoned payload
// (flag set, zero factors) that decodes to NaN everywhere; the warm start Q
// is left as it was, so a step skipped by a loss scaler does not destroy it.
//
// Parameter block (24 bytes): u64 rows, u64 cols, u32 rank r actually used
// (min(rank, rows, cols)), u32 flags (bit 0: poisoned).
// Body: P (rows x r, row-major, f32) then Q (cols x r, row-major, f32).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/config.hpp"
#include "../core/policy.hpp"
#include "codec.hpp"
#include "philox.hpp"
#include "wire.hpp"

namespace gradsync::compress {

// ---------------------------------------------------------------------------
// Per-element math, shared with the device path (cuda/powersgd.cuh). Every
// product and sum rounds on its own: on the device the intrinsics keep nvcc
// from contracting them into an FMA (one rounding), whatever -fmad says.

/// acc + a * b, two roundings.
GRADSYNC_HD inline float powersgd_mac(float acc, float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(acc, __fmul_rn(a, b));
#else
  return acc + a * b;
#endif
}
/// x - d * y, two roundings (the Gram-Schmidt update).
GRADSYNC_HD inline float powersgd_msub(float x, float d, float y) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(x, __fmul_rn(d, y));
#else
  return x - d * y;
#endif
}
/// Element x of a Philox direction: uniform in [-1, 1) (exact: 2u - 1 needs
/// no rounding for the 24-bit u of uniform01).
GRADSYNC_HD inline float powersgd_direction(const philox_stream& s, std::uint64_t x) {
  return 2.0f * s.uniform(x) - 1.0f;
}
/// Element x of a row-major float factor at `base`: an array, or a payload
/// body (any alignment).
struct powersgd_factor {
  const std::byte* base;
  GRADSYNC_HD float operator()(std::size_t x) const {
    return wire::load<float>(base + sizeof(float) * x);
  }
};
/// Element (i, c) of P Q^T: sum_j P[i][j] Q[c][j] in float, j ascending.
/// p(x) and q(x) return element x of the row-major factors (powersgd_factor,
/// or any functor callable where this runs).
template <class PF, class QF>
GRADSYNC_HD inline float powersgd_element(const PF& p, const QF& q, std::size_t i, std::size_t c,
                                          std::size_t r) {
  float s = 0.0f;
  for (std::size_t j = 0; j < r; ++j) s = powersgd_mac(s, p(i * r + j), q(c * r + j));
  return s;
}

// ---------------------------------------------------------------------------
// Step functions. Layouts: M row-major rows x cols (elements T); P row-major
// rows x r (float); Q row-major cols x r (float).

/// P = M Q (P overwritten). One streaming pass over M.
template <float_element T>
void powersgd_multiply(const T* m, std::size_t rows, std::size_t cols, const float* q,
                       std::size_t r, float* p) {
  for (std::size_t i = 0; i < rows; ++i) {
    float* pi = p + i * r;
    std::fill(pi, pi + r, 0.0f);
    const T* mi = m + i * cols;
    for (std::size_t c = 0; c < cols; ++c) {
      const float v = to_float(mi[c]);
      const float* qc = q + c * r;
      for (std::size_t j = 0; j < r; ++j) pi[j] = powersgd_mac(pi[j], v, qc[j]);
    }
  }
}

/// Q = M^T P (Q overwritten). One streaming pass over M.
template <float_element T>
void powersgd_multiply_transposed(const T* m, std::size_t rows, std::size_t cols, const float* p,
                                  std::size_t r, float* q) {
  std::fill(q, q + cols * r, 0.0f);
  for (std::size_t i = 0; i < rows; ++i) {
    const float* pi = p + i * r;
    const T* mi = m + i * cols;
    for (std::size_t c = 0; c < cols; ++c) {
      const float v = to_float(mi[c]);
      float* qc = q + c * r;
      for (std::size_t j = 0; j < r; ++j) qc[j] = powersgd_mac(qc[j], v, pi[j]);
    }
  }
}

namespace detail {
inline double column_dot(const float* a, std::size_t rows, std::size_t r, std::size_t j,
                         std::size_t k) {
  double s = 0.0;
  for (std::size_t i = 0; i < rows; ++i)
    s += static_cast<double>(a[i * r + j]) * static_cast<double>(a[i * r + k]);
  return s;
}
// Column j minus its components along the orthonormal columns 0..j-1, twice.
inline void project_out(float* a, std::size_t rows, std::size_t r, std::size_t j) {
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t k = 0; k < j; ++k) {
      const auto d = static_cast<float>(column_dot(a, rows, r, k, j));
      for (std::size_t i = 0; i < rows; ++i)
        a[i * r + j] = powersgd_msub(a[i * r + j], d, a[i * r + k]);
    }
}
// Projects column j and normalises it when enough of it is left; false if dependent.
inline bool normalise_independent(float* a, std::size_t rows, std::size_t r, std::size_t j) {
  const double before = std::sqrt(column_dot(a, rows, r, j, j));
  if (!(before > 0.0)) return false;
  project_out(a, rows, r, j);
  const double after = std::sqrt(column_dot(a, rows, r, j, j));
  if (!(after > static_cast<double>(policy::powersgd_dependence_tol) * before)) return false;
  const auto inv = static_cast<float>(1.0 / after);
  for (std::size_t i = 0; i < rows; ++i) a[i * r + j] *= inv;
  return true;
}
} // namespace detail

/// Orthonormalises the r columns of P (rows x r, row-major) in place by
/// modified Gram-Schmidt applied twice. A dependent column is replaced by the
/// Philox direction `rng` draws for it (uniform in [-1, 1), element
/// j * rows + i), orthogonalised in turn; when no direction is left (r > rows)
/// it becomes zero. Columns holding NaN or Inf are left as they are, so
/// non-finite input propagates instead of vanishing. Returns the number of
/// replaced columns.
inline std::size_t powersgd_orthonormalize(float* p, std::size_t rows, std::size_t r,
                                           const philox_stream& rng) {
  std::size_t replaced = 0;
  for (std::size_t j = 0; j < r; ++j) {
    const double sq = detail::column_dot(p, rows, r, j, j);
    if (!(sq <= std::numeric_limits<double>::max())) continue; // NaN or Inf: propagate
    if (detail::normalise_independent(p, rows, r, j)) continue;
    ++replaced;
    for (std::size_t i = 0; i < rows; ++i) p[i * r + j] = powersgd_direction(rng, j * rows + i);
    if (!detail::normalise_independent(p, rows, r, j))
      for (std::size_t i = 0; i < rows; ++i) p[i * r + j] = 0.0f;
  }
  return replaced;
}

/// Calls sink(i * cols + c, sum_j P[i][j] Q[c][j]) for every element, in
/// float, j ascending. p(x) and q(x) return element x of the row-major
/// factors (arrays, or loads from a payload).
template <class PF, class QF, class Sink>
void powersgd_reconstruct_with(PF p, QF q, std::size_t rows, std::size_t cols, std::size_t r,
                          Sink sink) {
  if (rows == 0 || cols == 0) return; // an empty matrix may still announce 2^40 rows: loop over nothing
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < cols; ++c) sink(i * cols + c, powersgd_element(p, q, i, c, r));
}
/// powersgd_reconstruct_with over float arrays P (rows x r) and Q (cols x r).
template <class Sink>
void powersgd_reconstruct(const float* p, const float* q, std::size_t rows, std::size_t cols,
                          std::size_t r, Sink sink) {
  powersgd_reconstruct_with(powersgd_factor{reinterpret_cast<const std::byte*>(p)},
                            powersgd_factor{reinterpret_cast<const std::byte*>(q)}, rows, cols, r,
                            sink);
}

/// Philox rank key of PowerSGD's draws: fixed, since every rank must agree.
inline constexpr std::uint32_t powersgd_key = 0xfffffffeu;

/// The initial Q of a tensor: uniform in [-1, 1), drawn under (seed, step 0xffffffff).
inline void powersgd_initial_q(std::uint64_t seed, std::size_t cols, std::size_t r, float* q) {
  const philox_stream s{seed, 0xffffffffu, powersgd_key};
  for (std::size_t x = 0; x < cols * r; ++x) q[x] = powersgd_direction(s, x);
}

/// Per-tensor state: the shared seed, the step counter and the warm-start Q
/// (cols x r floats; empty until the first encode).
struct powersgd_state {
  std::uint64_t seed = 0; ///< identical on every rank
  std::uint64_t step = 0; ///< advanced by one per encode
  std::vector<float> q{}; ///< warm start; resized and drawn on first use
  std::size_t replaced = 0; ///< columns of P replaced in the last encode
};

/// PowerSGD codec for a rows x cols gradient (see the file comment).
template <float_element T> struct powersgd {
  using value_type = T;
  using state = powersgd_state;
  static constexpr codec_id id = codec_id::powersgd;
  static constexpr std::string_view name = "powersgd";
  static constexpr const char* encode_op = "encode.powersgd";
  static constexpr const char* decode_op = "decode.powersgd";
  static constexpr std::size_t param_bytes = 24;

  /// Matrix shape of the gradient (row-major); the input holds rows * cols elements.
  std::size_t rows = 0;
  std::size_t cols = 0;
  /// Requested rank (>= 1); min(rank, rows, cols) is used.
  std::size_t rank = 1;

  /// The rank actually used: min(rank, rows, cols).
  std::size_t used_rank() const { return std::min({rank, rows, cols}); }
  /// Payload bytes (exact): the two float factors.
  std::size_t max_encoded_bytes(std::size_t) const {
    return wire::header_bytes + param_bytes + sizeof(float) * (rows + cols) * used_rank();
  }
  /// P and the new Q as floats.
  std::size_t workspace_bytes(std::size_t) const {
    return workspace_piece<float>(rows * used_rank()) + workspace_piece<float>(cols * used_rank());
  }

  /// One warm-started PowerSGD step on `in` (rows x cols); updates st.q.
  std::size_t encode(std::span<const T> in, state& st, std::span<std::byte> ws,
                     std::span<std::byte> out) const {
    check_float_range(in, encode_op);
    wire::check(rank >= 1, encode_op, "rank must be at least 1");
    wire::check(in.size() == wire::checked_mad(rows, cols, 0, encode_op, errc::invalid_argument), encode_op,
                "input holds " + std::to_string(in.size()) + " elements, the matrix is " +
                    std::to_string(rows) + " x " + std::to_string(cols));
    check_encode_buffers(encode_op, out.size(), max_encoded_bytes(in.size()), ws.size(),
                         workspace_bytes(in.size()));
    const std::size_t r = used_rank();
    const philox_stream rng{st.seed, static_cast<std::uint32_t>(st.step), powersgd_key};
    ++st.step;
    if (st.q.size() != cols * r) {
      st.q.assign(cols * r, 0.0f);
      powersgd_initial_q(st.seed, cols, r, st.q.data());
    }
    wire::writer w(out, id, dtype_traits<T>::id, in.size(), param_bytes, encode_op);
    const std::size_t body_bytes = sizeof(float) * (rows + cols) * r;
    std::byte* body = w.body().data();
    std::uint32_t top = 0; // largest exponent field: all ones only for NaN/Inf (vectorises)
    for (const T& v : in) top = std::max(top, gradsync::detail::float_bits(to_float(v)) & 0x7f800000u);
    bool poisoned = top == 0x7f800000u;
    st.replaced = 0;
    if (!poisoned) {
      workspace_cursor cur(ws, encode_op);
      const auto p = cur.take<float>(rows * r);
      const auto q = cur.take<float>(cols * r);
      powersgd_multiply(in.data(), rows, cols, st.q.data(), r, p.data());
      st.replaced = powersgd_orthonormalize(p.data(), rows, r, rng);
      powersgd_multiply_transposed(in.data(), rows, cols, p.data(), r, q.data());
      for (float v : p) poisoned |= !finite(v);
      for (float v : q) poisoned |= !finite(v);
      if (!poisoned) { // the warm start only ever holds finite factors
        std::copy(q.begin(), q.end(), st.q.begin());
        if (!p.empty()) std::memcpy(body, p.data(), sizeof(float) * p.size());
        if (!q.empty()) std::memcpy(body + sizeof(float) * p.size(), q.data(), sizeof(float) * q.size());
      }
    }
    if (poisoned && body_bytes != 0) std::memset(body, 0, body_bytes);
    const auto used = static_cast<std::uint32_t>(r), flags = poisoned ? 1u : 0u;
    wire::param_writer(w.params())
        .u64(rows)
        .u64(cols)
        .u32(used)
        .u32(flags);
    return w.finish(body_bytes);
  }

  /// out = P Q^T (NaN everywhere if poisoned).
  void decode(std::span<const std::byte> payload, std::span<T> out) const {
    run(payload, out.size(), store_sink<T>{out.data()});
  }
  /// acc += P Q^T.
  void decode_accumulate(std::span<const std::byte> payload, std::span<accum_t<T>> acc) const {
    run(payload, acc.size(), accumulate_sink<T>{acc.data()});
  }

private:
  template <class Sink>
  static void run(std::span<const std::byte> payload, std::size_t out_count, Sink sink) {
    const wire::view v = wire::open(payload, id, dtype_traits<T>::id, param_bytes, decode_op);
    wire::check_count(v, out_count, decode_op);
    wire::param_reader rd(v.params);
    const auto rows = rd.get<std::uint64_t>();
    const auto cols = rd.get<std::uint64_t>();
    const std::uint64_t r = rd.get<std::uint32_t>();
    const auto flags = rd.get<std::uint32_t>();
    wire::check_payload(wire::checked_mad(rows, cols, 0, decode_op) == v.h.count, decode_op,
                        "matrix " + std::to_string(rows) + " x " + std::to_string(cols) +
                            " does not hold the " + std::to_string(v.h.count) + " elements");
    wire::check_payload(r == std::min(rows, cols) || (r >= 1 && r < std::min(rows, cols)), decode_op,
                        "rank " + std::to_string(r) + " is not in [1, min(rows, cols)]");
    wire::check_payload(flags <= 1u, decode_op, "unknown flags " + std::to_string(flags));
    const std::uint64_t factors = wire::checked_mad(rows + cols, r, 0, decode_op);
    wire::check_body(v, wire::checked_mad(factors, sizeof(float), 0, decode_op), decode_op);
    const bool poisoned = flags == 1u;
    for (std::size_t x = 0; x < factors; ++x) {
      const auto f = wire::load<float>(v.body.data() + sizeof(float) * x);
      if (poisoned ? wire::load<std::uint32_t>(v.body.data() + sizeof(float) * x) != 0
                   : !finite(f))
        wire::corrupt(decode_op, "factor entry " + std::to_string(x) +
                                     (poisoned ? " is nonzero in a poisoned payload"
                                               : " is not finite in an unpoisoned payload"));
    }
    if (poisoned) {
      for (std::size_t i = 0; i < out_count; ++i) sink(i, std::numeric_limits<float>::quiet_NaN());
      return;
    }
    const std::byte* pb = v.body.data();
    const std::byte* qb = pb + sizeof(float) * rows * r;
    powersgd_reconstruct_with(powersgd_factor{pb}, powersgd_factor{qb},
                              static_cast<std::size_t>(rows), static_cast<std::size_t>(cols),
                              static_cast<std::size_t>(r), sink);
  }
};

} // namespace gradsync::compress
