// gradsync: the CUDA copier of transport/staged.hpp. Device ranges are
// copied to and from pinned staging blocks with cudaMemcpyAsync on one
// stream, the stream of the collectives' executor (exec::cuda): a send's
// copy then starts after the kernels that wrote its range, whoever enqueued
// them there, with no device-wide synchronisation. Each copy is waited for
// before the call returns (staged.hpp: a send's block is read by the host
// transport at once; a receive's range may be read by the next step).
//
//   gradsync::shm::communicator host = ...;
//   gradsync::staged dev(host, gradsync::cuda_copier(stream));
//   gradsync::exec::cuda ex(stream);
//   gradsync::allreduce(dev, ex, std::span<const float>(d_in, n), std::span(d_out, n));
#pragma once

#if !defined(__CUDACC__)
#error "gradsync/transport/cuda_staging.cuh is a CUDA header: compile it with nvcc"
#endif

#include <cstddef>

#include <cuda_runtime.h>

#include "../core/cuda_check.cuh"
#include "staged.hpp"

namespace gradsync {

/// Stages device ranges through pinned host memory on one stream (see the
/// file comment). Cheap to copy (a stream handle); keeps no global state.
class cuda_copier {
public:
  /// Copies on `stream` (0: the legacy default stream).
  explicit cuda_copier(cudaStream_t stream = nullptr) noexcept : stream_(stream) {}

  cudaStream_t stream() const noexcept { return stream_; }

  /// Device (or managed) memory: staged. Host memory, pinned or not: sent as it is.
  bool is_device(const void* p) const {
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); // an unknown pointer is host memory, not an error to keep
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  void to_host(std::byte* dst, const std::byte* src, std::size_t n) const {
    gpu::check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_), "staged.send", "cudaMemcpyAsync");
    gpu::check(cudaStreamSynchronize(stream_), "staged.send", "cudaStreamSynchronize");
  }
  void to_device(std::byte* dst, const std::byte* src, std::size_t n) const {
    gpu::check(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_), "staged.recv", "cudaMemcpyAsync");
    gpu::check(cudaStreamSynchronize(stream_), "staged.recv", "cudaStreamSynchronize");
  }
  std::byte* alloc_host(std::size_t n) const {
    void* p = nullptr;
    gpu::check(cudaMallocHost(&p, n), "staged", "cudaMallocHost");
    return static_cast<std::byte*>(p);
  }
  void free_host(std::byte* p, std::size_t) const noexcept { (void)cudaFreeHost(p); }

private:
  cudaStream_t stream_;
};

static_assert(device_copier<cuda_copier>);

} // namespace gradsync
