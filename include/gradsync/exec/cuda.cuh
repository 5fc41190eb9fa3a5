// gradsync: the CUDA executor. The element work of a schedule (reduce, avg's
// division, copies, gossip's weighted combine, scratch) on device memory,
// enqueued on a stream the caller gives; nothing here synchronises but fence().
//
// Every kernel is an elementwise map over exactly the per-element functions
// of core/reduce.hpp (combine1, finish1, axpby1), which exec::host runs too,
// so results are bitwise identical to the host executor's whatever the grid
// (no element depends on another). Build with nvcc's default -prec-div=true
// (no --use_fast_math): finish1 divides, and only the IEEE division matches
// the host. Maps read and write 16 bytes per thread and step when every
// pointer is 16-byte aligned (cudaMalloc gives 256), else one element.
//
// Errors: every failed CUDA call throws gradsync::error of kind
// errc::internal naming the call (core/cuda_check.cuh's gpu::check).
// Kernels are checked for launch, not for completion: a fault while running
// surfaces at the next checked call, fence() at the latest.
#pragma once

#if !defined(__CUDACC__)
#error "gradsync/exec/cuda.cuh is a CUDA header: compile it with nvcc"
#endif

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include "../core/cuda_check.cuh"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/policy.hpp"
#include "../core/reduce.hpp"
#include "executor.hpp"
#include "host.hpp"

namespace gradsync::exec {

namespace cuda_detail {

/// W consecutive elements moved as one 16-byte access.
template <class T, int W> struct alignas(16) pack {
  T v[W];
};

/// y[i] = f(in[i]...) for i < n, grid-stride; W > 1: whole packs of W
/// elements first (every pointer 16-byte aligned), then the tail one by one.
/// Each element is read and written by one thread, so y may alias an input.
template <int W, class T, class F, class... In>
__global__ void map_kernel(T* y, std::size_t n, F f, const In*... in) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  const std::size_t first = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  static_assert((std::is_same_v<In, T> && ...), "every input has the output's type");
  std::size_t done = 0;
  if constexpr (W > 1) {
    using P = pack<T, W>;
    const std::size_t packs = n / W;
    for (std::size_t p = first; p < packs; p += stride) {
      P out;
      // One 16-byte load per input, then W elements computed from registers.
      [&](const auto&... src) {
#pragma unroll
        for (int k = 0; k < W; ++k) out.v[k] = f(src.v[k]...);
      }(reinterpret_cast<const P*>(in)[p]...);
      reinterpret_cast<P*>(y)[p] = out;
    }
    done = packs * W;
  }
  for (std::size_t i = done + first; i < n; i += stride) y[i] = f(in[i]...);
}

template <class T, class Op> struct combine_f {
  Op op;
  __device__ T operator()(T a, T b) const { return combine1(a, b, op); }
};
template <class T> struct finish_f {
  accum_t<T> ranks;
  __device__ T operator()(T v) const { return finish1(v, ranks); }
};
template <class T> struct axpby_f {
  weight_t<T> a, b;
  __device__ T operator()(T x, T y) const { return axpby1<T>(a, x, b, y); }
};

/// gpu::check, which throws errc::internal naming the call; a
/// failed call is also the runtime's "last error", cleared here, or the next
/// launch check would report it a second time as its own.
inline void check(cudaError_t e, const char* op, const char* what) {
  if (e != cudaSuccess) (void)cudaGetLastError();
  gpu::check(e, op, what);
}

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

} // namespace cuda_detail

/// Device scratch of `n` elements of T: the caller's workspace when one was
/// given (it must be large enough and aligned to T, as for host_scratch;
/// gradsync::error otherwise), else cudaMallocAsync'ed on the stream and
/// released with cudaFreeAsync on the same stream by the destructor, so work
/// enqueued on that stream before the destructor runs may still use it (work
/// on other streams must be ordered before it by the caller). Move-only.
template <class T> class cuda_scratch {
public:
  cuda_scratch(std::span<std::byte> ws, std::size_t n, const char* op, int rank,
               cudaStream_t stream)
      : stream_(stream) {
    if (n == 0) return;
    if (!ws.empty()) {
      // host_scratch checks size and alignment and only carves the pointer:
      // it never touches the (device) memory.
      p_ = host_scratch<T>(ws, n, op, rank).data();
      return;
    }
    void* p = nullptr;
    cuda_detail::check(cudaMallocAsync(&p, n * sizeof(T), stream), op, "cudaMallocAsync");
    p_ = static_cast<T*>(p);
    own_ = true;
  }
  cuda_scratch(cuda_scratch&& o) noexcept : p_(o.p_), stream_(o.stream_), own_(o.own_) {
    o.own_ = false;
  }
  cuda_scratch(const cuda_scratch&) = delete;
  cuda_scratch& operator=(const cuda_scratch&) = delete;
  cuda_scratch& operator=(cuda_scratch&&) = delete;
  /// Enqueues the release of owned memory (a failure cannot be thrown from
  /// here; it would be a sticky context error the next checked call reports).
  ~cuda_scratch() {
    if (own_) (void)cudaFreeAsync(p_, stream_);
  }
  /// Device memory for n elements (null when n == 0).
  T* data() const noexcept { return p_; }

private:
  T* p_ = nullptr;
  cudaStream_t stream_;
  bool own_ = false;
};

/// The CUDA executor: element work on device memory, enqueued on one stream
/// in call order. Cheap to copy (a stream handle); owns no memory and keeps
/// no global state. The stream's device must be the current one at each
/// call (the grid is sized from it).
///
/// fence() synchronises the stream: a transport that reads device buffers
/// through host-side calls (shm, MPI without stream awareness) must not start
/// before the kernels that wrote them finish. A transport ordered on the
/// same stream (e.g. NCCL enqueued on it) does not need the fence and may
/// skip calling it.
class cuda {
public:
  static constexpr memory_space space = memory_space::device;

  /// An executor enqueuing on `stream` (0: the legacy default stream).
  explicit cuda(cudaStream_t stream) noexcept : stream_(stream) {}

  /// The stream work is enqueued on.
  cudaStream_t stream() const noexcept { return stream_; }

  /// Enqueues y[i] = combine1(a[i], b[i], op); y may alias a or b exactly.
  template <element T, reduce_op Op>
  void reduce(T* y, const T* a, const T* b, std::size_t n, Op op) const {
    map("exec::cuda.reduce", y, n, cuda_detail::combine_f<T, Op>{op}, a, b);
  }
  /// Enqueues avg's single division by `ranks` (nothing for other operators
  /// or one rank, as on the host).
  template <element T, reduce_op Op> void finish(T* y, std::size_t n, Op, int ranks) const {
    if constexpr (Op::kind == op_kind::avg) {
      if (ranks == 1) return;
      map("exec::cuda.finish", y, n, cuda_detail::finish_f<T>{static_cast<accum_t<T>>(ranks)},
          static_cast<const T*>(y));
    }
  }
  /// Enqueues a device-to-device copy (nothing when dst == src or n == 0).
  template <class T> void copy(T* dst, const T* src, std::size_t n) const {
    if (n == 0 || dst == src) return;
    cuda_detail::check(
        cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_),
        "exec::cuda.copy", "cudaMemcpyAsync");
  }
  /// Enqueues y[i] = axpby1(a, x[i], b, y[i]): the weights are converted to
  /// weight_t<T> here, as exec::host does.
  template <element T>
  void axpby(T* y, double a, const T* x, double b, std::size_t n) const {
    map("exec::cuda.axpby", y, n,
        cuda_detail::axpby_f<T>{static_cast<weight_t<T>>(a), static_cast<weight_t<T>>(b)}, x,
        static_cast<const T*>(y));
  }
  /// Device scratch (see cuda_scratch); `op` and `rank` name the call in errors.
  template <class T>
  cuda_scratch<T> scratch(std::span<std::byte> ws, std::size_t n, const char* op, int rank) const {
    return cuda_scratch<T>(ws, n, op, rank, stream_);
  }
  /// Throws gradsync::error naming `op`, `rank` and `what` unless `p` lies in
  /// memory this executor's kernels can use: device or managed memory, or
  /// host memory mapped for the device (cudaHostAlloc, cudaHostRegister).
  /// The collectives call it on their buffers (collectives.hpp's
  /// check_span), so a host range is a clear error, not a kernel fault.
  void check_memory(const void* p, std::size_t bytes, const char* op, int rank, const char* what) const {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError(); // not a pointer CUDA knows: plain host memory
      a.type = cudaMemoryTypeUnregistered;
    }
    const bool reachable = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ||
                           (a.type == cudaMemoryTypeHost && a.devicePointer != nullptr);
    GRADSYNC_REQUIRE(reachable, op, rank,
                     std::string(what) + " (" + std::to_string(bytes) + " bytes) is " +
                         (a.type == cudaMemoryTypeHost ? "pinned host memory not mapped for the device"
                                                       : "host memory") +
                         ": the CUDA executor needs device memory (cudaMalloc, cudaMallocManaged or mapped host memory)");
  }
  /// Waits for everything enqueued on the stream (see the class comment).
  void fence() const {
    cuda_detail::check(cudaStreamSynchronize(stream_), "exec::cuda.fence",
                         "cudaStreamSynchronize");
  }

private:
  template <class T, class F, class... In>
  void map(const char* op, T* y, std::size_t n, F f, const In*... in) const {
    if (n == 0) return;
    constexpr int w = sizeof(T) < 16 ? static_cast<int>(16 / sizeof(T)) : 1;
    const bool vec = w > 1 && cuda_detail::aligned16(y) && (cuda_detail::aligned16(in) && ...);
    const std::size_t units = vec ? n / w + n % w : n; // threads with work in the first sweep
    const unsigned threads = policy::cuda_block_threads;
    const unsigned blocks = gpu::grid_for((units + threads - 1) / threads, threads, op);
    if (vec) cuda_detail::map_kernel<w><<<blocks, threads, 0, stream_>>>(y, n, f, in...);
    else cuda_detail::map_kernel<1><<<blocks, threads, 0, stream_>>>(y, n, f, in...);
    gpu::check_launch(op);
  }

  cudaStream_t stream_;
};

static_assert(executor<cuda>);

} // namespace gradsync::exec
