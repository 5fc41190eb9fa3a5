// gradsync: device path of PowerSGD (powersgd.hpp): the step functions and
// the codec's encode / decode / decode_accumulate, stream-ordered, with
// caller-owned workspace (size query first) and a caller-owned device state.
//
// Kernels (M row-major rows x cols of T; P rows x r, Q cols x r, float):
// - multiply, P = M Q: one thread per (row, 4 columns of P); a block stages a
//   128-row x 32-column tile of M in shared memory (coalesced loads) and each
//   thread then runs its row's sum over c in ascending order, as the host loop.
// - multiply_transposed, Q = M^T P: one thread per (column of M, 4 columns of
//   Q), sum over rows in ascending order (warp loads of M are coalesced).
// - orthonormalize: one cooperative kernel (grid.sync between reductions)
//   running the host's loop as written: modified Gram-Schmidt twice, the same
//   dependence rule (policy::powersgd_dependence_tol), the same Philox
//   replacement directions, NaN/Inf columns left alone. Each double dot
//   product is a sum over 256 fixed row slots (a thread's rows in ascending
//   order, then cub::BlockReduce over the 256 threads of a slot, then
//   cub::BlockReduce over the 256 slot sums), which every block finishes in
//   the same order, so all blocks take the same branches and the result does
//   not depend on the grid size or the GPU model (run to run deterministic).
// - reconstruct / decode: one thread per element of P Q^T running
//   powersgd_element, the host's per-element function.
// Sums are sequential in float per output as on the host, so the multiplies
// can use only rows x ceil(r/4) (resp. cols x ceil(r/4)) threads, each
// running a chain of cols (resp. rows) dependent adds: fast for matrices with
// both sides in the thousands, slow (latency-bound) for very flat or very
// tall ones (e.g. 16 x 10^6). That is the price of the bitwise guarantee below.
//
// How close device and host are (same input, seed, step and warm start;
// products and sums round separately on both sides, powersgd_mac):
// - bitwise equal: powersgd_multiply, powersgd_multiply_transposed,
//   powersgd_reconstruct, decode and decode_accumulate of any payload, the
//   initial Q, the replacement directions, the parameter block, the poison
//   decision for non-finite input, and the whole payload of a poisoned step;
// - orthonormalize differs from the host only in the order of its double dot
//   products (tree here, sequential on the host). Those are cast to float
//   (the projection coefficient d, 1/||p_j||) or compared with the dependence
//   threshold, so the float results are usually bitwise equal too; a cast
//   that rounds the other way (chance about rows * 2^-29 per dot product)
//   moves P by float rounding, and Q = M^T P with it. Stated tolerance, for
//   columns that keep at least 1 % of their norm through the projections
//   (P not near rank-deficient): ||P_dev - P_host||_F <= 1e-4 ||P_host||_F
//   and the same for Q; tests/gpu checks it. A column whose remaining norm
//   lies within rounding of the dependence threshold may be replaced on one
//   side only. A collective must therefore orthonormalise on one kind of
//   processor on every rank (all device or all host), as it must use one
//   seed: every rank then computes the same P bit for bit.
//
// State: gpu::powersgd_state holds the seed and step (host) and the warm
// start Q in caller-owned device memory (powersgd_state_floats(c) floats),
// drawn on the first encode exactly as the host draws it and left unchanged
// by a poisoned step. to_device() continues a host state on the device (to
// go back, copy q_elems floats of q into the host state's q).
#pragma once

#include <cfloat>

#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>

#include "../powersgd.hpp"
#include "common.cuh"
#include "randk.cuh" // detail::any_nonfinite: the poison scan random-k runs too

namespace gradsync::compress::gpu {

/// Per-tensor state of a device encode (the host powersgd_state with Q on the device).
struct powersgd_state {
  std::uint64_t seed = 0;            ///< identical on every rank
  std::uint64_t step = 0;            ///< advanced by one per encode (on the host)
  std::span<float> q{};              ///< device memory, >= powersgd_state_floats(c) floats
  std::size_t q_elems = 0;           ///< floats of q holding the warm start; any other
                                     ///< count than cols * r: drawn on the next encode
  std::uint32_t* replaced = nullptr; ///< optional device word: columns replaced last encode
};

/// Device floats the warm start of codec c needs (cols * used rank).
template <float_element T> std::size_t powersgd_state_floats(const powersgd<T>& c) {
  return c.cols * c.used_rank();
}

/// A device state continuing host state h: same seed and step, and h's warm
/// start, when it has one, copied into d_q (enqueued on the stream).
inline powersgd_state to_device(const compress::powersgd_state& h, std::span<float> d_q,
                                cudaStream_t stream) {
  const char* op = "gpu.powersgd_state";
  wire::check(d_q.size() >= h.q.size(), op, "device q is smaller than the host warm start");
  if (!h.q.empty())
    check(cudaMemcpyAsync(d_q.data(), h.q.data(), sizeof(float) * h.q.size(),
                          cudaMemcpyHostToDevice, stream),
          op, "cudaMemcpyAsync");
  return {.seed = h.seed, .step = h.step, .q = d_q, .q_elems = h.q.size()};
}

namespace detail {

namespace cg = cooperative_groups;

inline constexpr unsigned psgd_threads = 128; // multiply kernels: rows (cols) per block
inline constexpr unsigned psgd_jt = 4;        // factor columns per thread
inline constexpr unsigned psgd_tile = 32;     // M columns (rows) staged per step
inline constexpr unsigned psgd_slots = 256;   // orthonormalize: fixed reduction slots
inline constexpr unsigned psgd_ortho_threads = 256;
static_assert(psgd_threads >= psgd_tile * psgd_jt, "one P-tile element per thread");
static_assert(psgd_ortho_threads == psgd_slots, "the slot sums are reduced one per thread");
/// Offset of the factors in a payload.
inline constexpr std::size_t psgd_body = wire::header_bytes + powersgd<float>::param_bytes;

/// acc[jj] = acc[jj] + v * f[jj] for the factor columns j0 + jj < r.
__device__ inline void psgd_mac_tile(float (&acc)[psgd_jt], float v, const float* f,
                                     std::uint32_t j0, std::uint32_t r) {
#pragma unroll
  for (unsigned jj = 0; jj < psgd_jt; ++jj)
    if (j0 + jj < r) acc[jj] = powersgd_mac(acc[jj], v, f[jj]);
}
/// row[j0 + jj] = acc[jj] for the factor columns j0 + jj < r.
__device__ inline void psgd_store_tile(const float (&acc)[psgd_jt], float* row, std::uint32_t j0,
                                       std::uint32_t r) {
#pragma unroll
  for (unsigned jj = 0; jj < psgd_jt; ++jj)
    if (j0 + jj < r) row[j0 + jj] = acc[jj];
}

/// P = M Q; does nothing when *skip is set.
template <class T>
__global__ void __launch_bounds__(psgd_threads)
    psgd_multiply_kernel(const T* m, std::uint64_t rows, std::uint64_t cols, const float* q,
                         std::uint32_t r, float* p, const std::uint32_t* skip) {
  if (skip != nullptr && *skip != 0) return;
  __shared__ float tile[psgd_threads][psgd_tile + 1];
  const std::uint32_t j0 = blockIdx.y * psgd_jt;
  const std::uint64_t tiles = (rows + psgd_threads - 1) / psgd_threads;
  for (std::uint64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::uint64_t i0 = t * psgd_threads, i = i0 + threadIdx.x;
    float acc[psgd_jt] = {};
    for (std::uint64_t c0 = 0; c0 < cols; c0 += psgd_tile) {
      const auto width = static_cast<unsigned>(cols - c0 < psgd_tile ? cols - c0 : psgd_tile);
      for (unsigned e = threadIdx.x; e < psgd_threads * psgd_tile; e += psgd_threads) {
        const unsigned rr = e / psgd_tile, cc = e % psgd_tile;
        if (i0 + rr < rows && cc < width) tile[rr][cc] = to_float(m[(i0 + rr) * cols + c0 + cc]);
      }
      __syncthreads();
      if (i < rows)
        for (unsigned cc = 0; cc < width; ++cc)
          psgd_mac_tile(acc, tile[threadIdx.x][cc], q + (c0 + cc) * r + j0, j0, r);
      __syncthreads();
    }
    if (i < rows) psgd_store_tile(acc, p + i * r, j0, r);
  }
}

/// Q = M^T P; does nothing when *skip is set.
template <class T>
__global__ void __launch_bounds__(psgd_threads)
    psgd_multiply_t_kernel(const T* m, std::uint64_t rows, std::uint64_t cols, const float* p,
                           std::uint32_t r, float* q, const std::uint32_t* skip) {
  if (skip != nullptr && *skip != 0) return;
  __shared__ float ptile[psgd_tile][psgd_jt];
  const std::uint32_t j0 = blockIdx.y * psgd_jt;
  const std::uint64_t tiles = (cols + psgd_threads - 1) / psgd_threads;
  for (std::uint64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::uint64_t c = t * psgd_threads + threadIdx.x;
    float acc[psgd_jt] = {};
    for (std::uint64_t i0 = 0; i0 < rows; i0 += psgd_tile) {
      const auto height = static_cast<unsigned>(rows - i0 < psgd_tile ? rows - i0 : psgd_tile);
      if (threadIdx.x < psgd_tile * psgd_jt) {
        const unsigned rr = threadIdx.x / psgd_jt, jj = threadIdx.x % psgd_jt;
        ptile[rr][jj] = rr < height && j0 + jj < r ? p[(i0 + rr) * r + j0 + jj] : 0.0f;
      }
      __syncthreads();
      if (c < cols)
        for (unsigned rr = 0; rr < height; ++rr)
          psgd_mac_tile(acc, to_float(m[(i0 + rr) * cols + c]), ptile[rr], j0, r);
      __syncthreads();
    }
    if (c < cols) psgd_store_tile(acc, q + c * r, j0, r);
  }
}

/// Launches one of the multiply kernels over `outer` rows of its output.
template <class Kernel>
void psgd_launch_multiply(Kernel kernel, std::size_t outer, std::size_t r, cudaStream_t stream,
                          const char* op, auto... args) {
  if (outer == 0 || r == 0) return;
  wire::check(r <= std::size_t{65535} * psgd_jt, op, "rank above the device limit 262140");
  const dim3 grid(grid_for((outer + psgd_threads - 1) / psgd_threads, psgd_threads, op),
                  static_cast<unsigned>((r + psgd_jt - 1) / psgd_jt));
  kernel<<<grid, psgd_threads, 0, stream>>>(args...);
  check_launch(op);
}

template <class T>
void psgd_multiply(const T* m, std::size_t rows, std::size_t cols, const float* q, std::size_t r,
                   float* p, const std::uint32_t* skip, cudaStream_t stream, const char* op) {
  psgd_launch_multiply(psgd_multiply_kernel<T>, rows, r, stream, op, m, std::uint64_t{rows},
                       std::uint64_t{cols}, q, static_cast<std::uint32_t>(r), p, skip);
}

template <class T>
void psgd_multiply_t(const T* m, std::size_t rows, std::size_t cols, const float* p,
                     std::size_t r, float* q, const std::uint32_t* skip, cudaStream_t stream,
                     const char* op) {
  psgd_launch_multiply(psgd_multiply_t_kernel<T>, cols, r, stream, op, m, std::uint64_t{rows},
                       std::uint64_t{cols}, p, static_cast<std::uint32_t>(r), q, skip);
}

struct psgd_ortho_args {
  float* p;
  std::uint64_t rows;
  std::uint32_t r;
  std::uint32_t used_slots; // slots holding rows: min(psgd_slots, ceil(rows / threads))
  philox_stream rng;
  double* partials;         // 2 * psgd_slots (double-buffered slot sums)
  std::uint32_t* replaced;  // optional
  const std::uint32_t* skip; // optional: do nothing (and report 0 replaced) when set
};

/// powersgd_orthonormalize on the device: the host function's loop, with
/// every column_dot a grid-wide reduction (see the file comment). Control
/// flow depends only on reduced values, which every block computes
/// identically, so all threads reach every grid.sync().
template <class = void>
__global__ void __launch_bounds__(psgd_ortho_threads)
    psgd_orthonormalize_kernel(psgd_ortho_args a) {
  using reduce_t = cub::BlockReduce<double, psgd_ortho_threads>;
  __shared__ typename reduce_t::TempStorage temp;
  __shared__ double result;
  if (a.skip != nullptr && *a.skip != 0) {
    if (a.replaced != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *a.replaced = 0;
    return; // uniform: every block reads the same word
  }
  const cg::grid_group grid = cg::this_grid();
  float* const p = a.p;
  const std::uint64_t rows = a.rows, stride = std::uint64_t{psgd_slots} * psgd_ortho_threads;
  const std::uint32_t r = a.r;
  unsigned parity = 0;

  // f(i) for every row this thread owns (always the same thread for a row).
  const auto for_my_rows = [&](auto f) {
    for (unsigned s = blockIdx.x; s < a.used_slots; s += gridDim.x)
      for (std::uint64_t i = std::uint64_t{s} * psgd_ortho_threads + threadIdx.x; i < rows;
           i += stride)
        f(i);
  };
  // Sum over all rows of term(i), in double, the same value in every thread.
  const auto grid_sum = [&](auto term) -> double {
    double* part = a.partials + parity * psgd_slots;
    parity ^= 1u;
    for (unsigned s = blockIdx.x; s < a.used_slots; s += gridDim.x) {
      double x = 0.0;
      for (std::uint64_t i = std::uint64_t{s} * psgd_ortho_threads + threadIdx.x; i < rows;
           i += stride)
        x += term(i);
      const double slot = reduce_t(temp).Sum(x);
      if (threadIdx.x == 0) part[s] = slot;
      __syncthreads(); // temp is reused
    }
    grid.sync();
    // Slot sums written by other blocks: read through L2 (__ldcg), not L1.
    const double y = threadIdx.x < a.used_slots ? __ldcg(part + threadIdx.x) : 0.0;
    const double total = reduce_t(temp).Sum(y);
    if (threadIdx.x == 0) result = total;
    __syncthreads();
    const double v = result;
    __syncthreads(); // result and temp are rewritten by the next sum
    return v;
  };
  const auto dot = [&](std::uint32_t j, std::uint32_t k) {
    return grid_sum([&](std::uint64_t i) {
      return static_cast<double>(p[i * r + j]) * static_cast<double>(p[i * r + k]);
    });
  };
  // detail::normalise_independent, given the column's current squared norm.
  const auto normalise_independent = [&](std::uint32_t j, double sq) -> bool {
    const double before = sqrt(sq);
    if (!(before > 0.0)) return false;
    for (int pass = 0; pass < 2; ++pass)
      for (std::uint32_t k = 0; k < j; ++k) {
        const auto d = static_cast<float>(dot(k, j));
        for_my_rows([&](std::uint64_t i) {
          p[i * r + j] = powersgd_msub(p[i * r + j], d, p[i * r + k]);
        });
      }
    const double after = sqrt(dot(j, j));
    if (!(after > static_cast<double>(policy::powersgd_dependence_tol) * before)) return false;
    const auto inv = static_cast<float>(1.0 / after);
    for_my_rows([&](std::uint64_t i) { p[i * r + j] *= inv; });
    return true;
  };

  std::uint32_t replaced = 0;
  for (std::uint32_t j = 0; j < r; ++j) {
    const double sq = dot(j, j);
    if (!(sq <= DBL_MAX)) continue; // NaN or Inf: propagate
    if (normalise_independent(j, sq)) continue;
    ++replaced;
    for_my_rows([&](std::uint64_t i) {
      p[i * r + j] = powersgd_direction(a.rng, std::uint64_t{j} * rows + i);
    });
    if (!normalise_independent(j, dot(j, j)))
      for_my_rows([&](std::uint64_t i) { p[i * r + j] = 0.0f; });
  }
  if (a.replaced != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *a.replaced = replaced;
}

inline std::size_t psgd_orthonormalize_ws() { return workspace_piece<double>(2 * psgd_slots); }

inline void psgd_orthonormalize(float* p, std::size_t rows, std::size_t r,
                                const philox_stream& rng, std::uint32_t* replaced,
                                std::span<std::byte> ws, const std::uint32_t* skip,
                                cudaStream_t stream, const char* op) {
  if (rows == 0 || r == 0) {
    if (replaced != nullptr)
      check(cudaMemsetAsync(replaced, 0, sizeof(std::uint32_t), stream), op, "cudaMemsetAsync");
    return;
  }
  wire::check(r <= 0xffffffffu, op, "rank above 2^32 - 1");
  workspace_cursor cur(ws, op);
  double* partials = cur.take<double>(2 * psgd_slots).data();
  int dev = 0, sms = 0, coop = 0, per_sm = 0;
  check(cudaGetDevice(&dev), op, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev), op,
        "cudaDeviceGetAttribute");
  wire::check(coop != 0, op, "the device does not support cooperative launches");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), op,
        "cudaDeviceGetAttribute");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, psgd_orthonormalize_kernel<void>,
                                                      psgd_ortho_threads, 0),
        op, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  wire::check(per_sm > 0, op, "the orthonormalisation kernel does not fit on a multiprocessor");
  const std::uint64_t slots_wanted = (rows + psgd_ortho_threads - 1) / psgd_ortho_threads;
  const auto used =
      static_cast<std::uint32_t>(slots_wanted < psgd_slots ? slots_wanted : psgd_slots);
  const auto resident = static_cast<std::uint64_t>(per_sm) * static_cast<std::uint64_t>(sms);
  const auto blocks = static_cast<unsigned>(used < resident ? used : resident);
  psgd_ortho_args args{p,        rows,     static_cast<std::uint32_t>(r), used, rng,
                       partials, replaced, skip};
  void* argv[] = {&args};
  check(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(psgd_orthonormalize_kernel<void>),
                                    dim3(blocks), dim3(psgd_ortho_threads), argv, 0, stream),
        op, "cudaLaunchCooperativeKernel");
}

/// sink(e, element e of P Q^T) for every element.
template <class Sink> struct psgd_reconstruct_fn {
  const float* p;
  const float* q;
  std::uint64_t cols;
  std::uint32_t r;
  Sink sink;
  __device__ void operator()(std::size_t e) const {
    sink(e, powersgd_element(powersgd_factor{reinterpret_cast<const std::byte*>(p)},
                             powersgd_factor{reinterpret_cast<const std::byte*>(q)}, e / cols,
                             e % cols, r));
  }
};

// ---- encode ----------------------------------------------------------------

struct psgd_initial_q_fn {
  philox_stream s;
  float* q;
  __device__ void operator()(std::size_t x) const { q[x] = powersgd_direction(s, x); }
};

/// Poisoned (either flag): zero factors; otherwise the new Q into the warm start.
struct psgd_finish_fn {
  const std::uint32_t* flags; // [0]: non-finite input, [1]: non-finite factors
  float* pq;                  // P then Q, in the payload body
  std::size_t p_elems;
  float* q_state;
  __device__ void operator()(std::size_t x) const {
    if ((flags[0] | flags[1]) != 0)
      pq[x] = 0.0f;
    else if (x >= p_elems)
      q_state[x - p_elems] = pq[x];
  }
};

template <class = void>
__global__ void psgd_flags_kernel(std::byte* params, const std::uint32_t* flags) {
  wire::store<std::uint32_t>(params + 20, (flags[0] | flags[1]) != 0 ? 1u : 0u);
}

template <class T> std::size_t psgd_scan_temp(const powersgd<T>& c, std::size_t n, const char* op) {
  const std::size_t a = any_nonfinite_temp<T>(n, op);
  const std::size_t b = any_nonfinite_temp<float>((c.rows + c.cols) * c.used_rank(), op);
  return a > b ? a : b;
}

// ---- decode ----------------------------------------------------------------

/// Parameters of a powersgd payload as the device reads them.
struct psgd_params {
  std::uint64_t rows, cols;
  std::uint32_t r, flags;
};
GRADSYNC_HD inline psgd_params read_powersgd(const std::byte* p) {
  return {wire::load<std::uint64_t>(p), wire::load<std::uint64_t>(p + 8),
          wire::load<std::uint32_t>(p + 16), wire::load<std::uint32_t>(p + 20)};
}

/// *out = a * b, false on overflow.
GRADSYNC_HD inline bool mul_u64(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  if (a != 0 && b > ~std::uint64_t{0} / a) return false;
  *out = a * b;
  return true;
}

/// The host decoder's parameter checks (shape holds the count, rank in
/// [1, min(rows, cols)] or equal to it, known flags) and body length.
struct psgd_body_rule {
  GRADSYNC_HD bool operator()(const std::byte* params, std::uint64_t count,
                              std::uint64_t* body) const {
    const psgd_params h = read_powersgd(params);
    std::uint64_t n = 0, factors = 0;
    if (!mul_u64(h.rows, h.cols, &n) || n != count) return false;
    const std::uint64_t lim = h.rows < h.cols ? h.rows : h.cols;
    if (!(h.r == lim || (h.r >= 1 && h.r < lim)) || h.flags > 1u) return false;
    if (h.rows + h.cols < h.rows) return false;
    return mul_u64(h.rows + h.cols, h.r, &factors) && mul_u64(factors, sizeof(float), body);
  }
};

/// Every factor finite (zero bits when poisoned), else bad_content.
struct psgd_check_fn {
  const std::byte* payload;
  std::uint32_t* status;
  __device__ void operator()(std::size_t x) const {
    if (*status != 0) return;
    const bool poisoned = read_powersgd(payload + wire::header_bytes).flags == 1u;
    const std::byte* f = payload + psgd_body + sizeof(float) * x;
    if (poisoned ? wire::load<std::uint32_t>(f) != 0 : !finite(wire::load<float>(f)))
      atomicCAS(status, 0u, static_cast<std::uint32_t>(gpu::status::bad_content));
  }
};

template <class Sink> struct psgd_decode_fn {
  const std::byte* payload;
  Sink sink;
  __device__ void operator()(std::size_t e) const {
    const psgd_params h = read_powersgd(payload + wire::header_bytes);
    if (h.flags == 1u) {
      sink(e, __int_as_float(0x7fc00000)); // the host's quiet NaN
      return;
    }
    const auto* p = reinterpret_cast<const float*>(payload + psgd_body);
    psgd_reconstruct_fn<Sink>{p, p + h.rows * h.r, h.cols, h.r, sink}(e);
  }
};

} // namespace detail

// ---------------------------------------------------------------------------
// Step functions (device pointers, layouts as on the host; see the host
// header for the two-step collective protocol they serve).

/// P = M Q (P overwritten), bitwise equal to compress::powersgd_multiply.
template <float_element T>
void powersgd_multiply(const T* d_m, std::size_t rows, std::size_t cols, const float* d_q,
                       std::size_t r, float* d_p, cudaStream_t stream) {
  detail::psgd_multiply(d_m, rows, cols, d_q, r, d_p, nullptr, stream, "gpu.powersgd_multiply");
}

/// Q = M^T P (Q overwritten), bitwise equal to compress::powersgd_multiply_transposed.
template <float_element T>
void powersgd_multiply_transposed(const T* d_m, std::size_t rows, std::size_t cols,
                                  const float* d_p, std::size_t r, float* d_q,
                                  cudaStream_t stream) {
  detail::psgd_multiply_t(d_m, rows, cols, d_p, r, d_q, nullptr, stream,
                          "gpu.powersgd_multiply_transposed");
}

/// Device workspace of powersgd_orthonormalize (any rows and r).
inline std::size_t powersgd_orthonormalize_workspace_bytes(std::size_t, std::size_t) {
  return detail::psgd_orthonormalize_ws();
}

/// compress::powersgd_orthonormalize on the device (P rows x r, row-major, in
/// place; one cooperative kernel). The count of replaced columns goes to
/// *d_replaced when it is not null. Within the file comment's tolerance of
/// the host result, usually bitwise equal.
inline void powersgd_orthonormalize(float* d_p, std::size_t rows, std::size_t r,
                                    const philox_stream& rng, std::uint32_t* d_replaced,
                                    std::span<std::byte> ws, cudaStream_t stream) {
  const char* op = "gpu.powersgd_orthonormalize";
  check_aligned(ws.data(), op, "workspace");
  detail::psgd_orthonormalize(d_p, rows, r, rng, d_replaced, ws, nullptr, stream, op);
}

/// sink(i * cols + c, (P Q^T)[i][c]) for every element (sink: a device
/// functor such as store_sink<T>), bitwise equal to compress::powersgd_reconstruct.
template <class Sink>
void powersgd_reconstruct(const float* d_p, const float* d_q, std::size_t rows, std::size_t cols,
                          std::size_t r, Sink sink, cudaStream_t stream) {
  const char* op = "gpu.powersgd_reconstruct";
  wire::check(r <= 0xffffffffu, op, "rank above 2^32 - 1");
  for_each(rows * cols,
           detail::psgd_reconstruct_fn<Sink>{d_p, d_q, cols, static_cast<std::uint32_t>(r), sink},
           stream, op);
}

// ---------------------------------------------------------------------------
// The codec.

/// Device workspace of encode for n = rows * cols elements.
template <float_element T>
std::size_t encode_workspace_bytes(const powersgd<T>& c, std::size_t n) {
  return workspace_piece<std::uint32_t>(2) +
         workspace_piece<std::byte>(detail::psgd_scan_temp(c, n, powersgd<T>::encode_op)) +
         detail::psgd_orthonormalize_ws() + seal_workspace_bytes(c.max_encoded_bytes(n));
}

/// Device encode: one warm-started PowerSGD step on `in` (rows x cols, device
/// memory); the payload's factors are computed in place in `out`. Updates the
/// warm start in st.q (unless poisoned) and advances st.step on the host.
template <float_element T>
std::size_t encode(const powersgd<T>& c, std::span<const T> in, powersgd_state& st,
                   std::span<std::byte> ws, std::span<std::byte> out, cudaStream_t stream) {
  using C = powersgd<T>;
  const char* op = C::encode_op;
  const std::size_t n = in.size();
  wire::check(c.rank >= 1, op, "rank must be at least 1");
  wire::check(n == wire::checked_mad(c.rows, c.cols, 0, op), op,
              "input holds " + std::to_string(n) + " elements, the matrix is " +
                  std::to_string(c.rows) + " x " + std::to_string(c.cols));
  check_encode(op, in.data(), n * sizeof(T), out, c.max_encoded_bytes(n), ws,
               encode_workspace_bytes(c, n));
  const std::size_t rows = c.rows, cols = c.cols, r = c.used_rank();
  wire::check(st.q.size() >= cols * r, op,
              "state q holds " + std::to_string(st.q.size()) + " floats, the warm start needs " +
                  std::to_string(cols * r) + " (powersgd_state_floats)");
  check_ptr(st.q.data(), sizeof(float) * cols * r, op, "state q");
  const philox_stream rng{st.seed, static_cast<std::uint32_t>(st.step), powersgd_key};
  ++st.step;
  if (st.q_elems != cols * r) {
    for_each(cols * r,
             detail::psgd_initial_q_fn{philox_stream{st.seed, 0xffffffffu, powersgd_key},
                                       st.q.data()},
             stream, op);
    st.q_elems = cols * r;
  }
  const std::size_t factors = (rows + cols) * r;
  const auto used = static_cast<std::uint32_t>(r);
  const header_image img =
      make_header(C::id, dtype_traits<T>::id, n, C::param_bytes, sizeof(float) * factors, op,
                  [&](std::span<std::byte> p) {
                    wire::param_writer(p)
                        .u64(rows)
                        .u64(cols)
                        .u32(used)
                        .u32(0); // flags: patched on the device
                  });
  workspace_cursor cur(ws, op);
  std::uint32_t* flags = cur.take<std::uint32_t>(2).data();
  auto scan = cur.take<std::byte>(detail::psgd_scan_temp(c, n, op));
  auto ortho = cur.take<std::byte>(2 * detail::psgd_slots * sizeof(double));
  auto* pq = reinterpret_cast<float*>(out.data() + img.size); // P, then Q
  float* q = pq + rows * r;
  detail::any_nonfinite(in.data(), n, flags, scan, stream, op);
  detail::psgd_multiply(in.data(), rows, cols, st.q.data(), r, pq, flags, stream, op);
  detail::psgd_orthonormalize(pq, rows, r, rng, st.replaced, ortho, flags, stream, op);
  detail::psgd_multiply_t(in.data(), rows, cols, pq, r, q, flags, stream, op);
  detail::any_nonfinite(static_cast<const float*>(pq), factors, flags + 1, scan, stream, op);
  for_each(factors, detail::psgd_finish_fn{flags, pq, rows * r, st.q.data()}, stream, op);
  // The poison flag is only known on the device: patched between the header
  // write and the checksum.
  seal_with(img, out.data(), nullptr, cur.rest(), stream, op, [&] {
    detail::psgd_flags_kernel<><<<1, 1, 0, stream>>>(out.data() + wire::header_bytes, flags);
    check_launch(op);
  });
  return img.size + sizeof(float) * factors;
}

/// Decoding: see device_decoder in common.cuh (gpu::decode, gpu::decode_accumulate):
/// out = P Q^T, bitwise equal to the host decode; NaN everywhere when poisoned.
template <float_element T> struct device_decoder<powersgd<T>> {
  static constexpr bool enabled = true;
  template <class Sink>
  static void run(const powersgd<T>&, std::span<const std::byte> payload, std::size_t n, Sink sink,
                  T*, std::uint32_t* d_status, std::span<std::byte> ws, cudaStream_t stream) {
    using C = powersgd<T>;
    const char* op = C::decode_op;
    const expectation<detail::psgd_body_rule> e{C::id, dtype_traits<T>::id,
                                                static_cast<std::uint32_t>(C::param_bytes), n, {}};
    validate(payload.data(), payload.size(), e, d_status, ws, stream, op);
    // A valid payload holds exactly this many factor entries; an invalid one is never read.
    const std::size_t head = body_offset(C::param_bytes);
    const std::size_t factors = payload.size() > head ? (payload.size() - head) / sizeof(float) : 0;
    for_each(factors, detail::psgd_check_fn{payload.data(), d_status}, stream, op);
    for_each(n, if_valid<detail::psgd_decode_fn<Sink>>{d_status, {payload.data(), sink}}, stream,
             op);
  }
};

} // namespace gradsync::compress::gpu
