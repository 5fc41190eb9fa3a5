// tests/gpu/gpu_test.hpp: what the CUDA test programs (tests/gpu/*.cu,
// tests/exec/test_cuda_executor.cu) share, so that each holds only its
// checks: the skip without a device, a stream and a device buffer that free
// themselves, stream-ordered copies. For nvcc-compiled tests only; nothing
// here touches CUDA before it is called (test_cuda_ipc_gpu forks its ranks
// from a parent that must not have initialised CUDA). bench/ keeps its own
// (it does not include tests/).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>

namespace gpu_test {

/// Throws std::runtime_error naming the failed CUDA call (usable on threads
/// and forked ranks, where doctest's assertions are not); clears the error
/// so that the next checked call is not blamed for it.
inline void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(e));
  }
}

/// The CUDA devices the runtime sees: 0 also where it fails (no driver, as
/// on the machines CI builds on).
inline int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/// Says so and returns 77, the exit status meson and tests/gpu/run.sh read
/// as "skipped".
inline int skip_no_device() {
  std::printf("no CUDA device: skipped\n");
  return 77;
}

#if defined(DOCTEST_LIBRARY_INCLUDED) // include <doctest/doctest.h> first
inline int run_doctest(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

/// A doctest program's main: 77 without a device, else the suite.
inline int run_doctest_or_skip(int argc, char** argv) {
  return device_count() == 0 ? skip_no_device() : run_doctest(argc, argv);
}
#endif

/// A non-blocking stream: no implicit order with the legacy stream (nor with
/// any other), so what a test enqueues on it is ordered by the test alone.
struct device_stream {
  cudaStream_t s{};
  device_stream() { ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~device_stream() { (void)cudaStreamDestroy(s); }
  device_stream(const device_stream&) = delete;
  device_stream& operator=(const device_stream&) = delete;
};

/// h[0, n) to d on stream s, complete on return.
template <class T> void upload(cudaStream_t s, T* d, const T* h, std::size_t n) {
  if (n) ok(cudaMemcpyAsync(d, h, n * sizeof(T), cudaMemcpyHostToDevice, s), "upload");
  ok(cudaStreamSynchronize(s), "cudaStreamSynchronize (upload)");
}

/// d[0, n) after everything enqueued on s.
template <class T> std::vector<T> download(cudaStream_t s, const T* d, std::size_t n) {
  std::vector<T> h(n);
  if (n) ok(cudaMemcpyAsync(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s), "download");
  ok(cudaStreamSynchronize(s), "cudaStreamSynchronize (download)");
  return h;
}

/// Owning cudaMalloc (or cudaMallocManaged) allocation of n elements of T.
/// At least 16 bytes: an empty buffer is still a real pointer (cudaMalloc
/// of 0 bytes gives nullptr), with room for one vector access.
template <class T> struct device_buffer {
  T* p = nullptr;
  std::size_t n;

  explicit device_buffer(std::size_t count, bool managed = false) : n(count) {
    const std::size_t bytes = std::max<std::size_t>(n * sizeof(T), 16);
    if (managed) ok(cudaMallocManaged(reinterpret_cast<void**>(&p), bytes), "cudaMallocManaged");
    else ok(cudaMalloc(reinterpret_cast<void**>(&p), bytes), "cudaMalloc");
  }
  ~device_buffer() { (void)cudaFree(p); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  std::span<T> span() const { return {p, n}; }
  template <class V> V* as() const { return reinterpret_cast<V*>(p); }

  /// All n elements from h on stream s, complete on return.
  void put(cudaStream_t s, const T* h) { upload(s, p, h, n); }
  /// Every byte `byte` (by default the tests' poison, 0xA5), complete on return.
  void fill(cudaStream_t s, int byte = 0xA5) {
    if (n) ok(cudaMemsetAsync(p, byte, n * sizeof(T), s), "cudaMemsetAsync");
    ok(cudaStreamSynchronize(s), "cudaStreamSynchronize (fill)");
  }
  /// All n elements after everything enqueued on s.
  std::vector<T> get(cudaStream_t s) const { return download(s, static_cast<const T*>(p), n); }
};

} // namespace gpu_test
