// gradsync: CUDA runtime checks and launch shapes shared by every device
// path (the executor in exec/cuda.cuh and the codec kernels in
// compress/cuda/), so neither layer includes the other.
#pragma once

#if !defined(__CUDACC__)
#error "gradsync/core/cuda_check.cuh is a CUDA header: compile it with nvcc"
#endif

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

#include "error.hpp"
#include "policy.hpp"

namespace gradsync::gpu {

/// Throws gradsync::error(op, errc::internal) naming the failed CUDA call.
inline void check(cudaError_t e, const char* op, const char* what) {
  if (e != cudaSuccess)
    throw error(op, -1, -1,
                std::string(what) + " failed: " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")",
                errc::internal);
}
/// Checks that the kernels just enqueued were launched (not that they ran).
inline void check_launch(const char* op) { check(cudaGetLastError(), op, "kernel launch"); }

/// Blocks of `threads` threads for a grid-stride kernel over `blocks_wanted`
/// units of one block each: never more than wanted, never more than about
/// policy::cuda_blocks_per_sm * policy::cuda_block_threads resident threads
/// per multiprocessor (small blocks get proportionally more blocks).
inline unsigned grid_for(std::size_t blocks_wanted, unsigned threads, const char* op) {
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), op, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), op,
        "cudaDeviceGetAttribute");
  const std::size_t per_sm =
      std::size_t{policy::cuda_blocks_per_sm} * policy::cuda_block_threads / threads;
  const std::size_t cap = static_cast<std::size_t>(sms) * (per_sm == 0 ? 1 : per_sm);
  return static_cast<unsigned>(blocks_wanted == 0 ? 1 : (blocks_wanted < cap ? blocks_wanted : cap));
}

} // namespace gradsync::gpu
