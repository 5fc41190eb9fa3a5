// gradsync-bench compress: what the host (compress.cpp, g++) and device
// (compress_gpu.cu, nvcc) halves share: the codec spec on the command line,
// the codec factory, the measured point and the error metric.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <gradsync/compress/spec.hpp>
#include <gradsync/core/dtype.hpp>

#include "common.hpp"

namespace gradsync::bench::compress_bench {

namespace gc = gradsync::compress;

/// A codec on the command line: NAME[:key=value,...] (the library's spec).
using codec_spec = gc::spec;
using gc::parse_spec;
using gc::with_codec;

inline constexpr const char* codec_help = gc::spec_help;

/// One measured (codec, size) point.
struct point {
  double encode_s = 0, decode_s = 0; // best of the timed iterations
  std::size_t payload = 0;
  double rel_l2 = 0;
};

template <class T> double rel_l2(std::span<const T> x, std::span<const T> y) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double a = static_cast<double>(widen(x[i])), b = static_cast<double>(widen(y[i]));
    num += (b - a) * (b - a);
    den += a * a;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// True when this build has the CUDA half (compress_gpu.cu).
bool gpu_built();
/// Throws std::runtime_error unless a CUDA device can run the device paths.
void gpu_require();
/// Device encode/decode of `spec` on n elements of type `t` (host data x,
/// uploaded first): best times of plan.iters after plan.warmup, payload size,
/// relative L2 error of the device-decoded tensor.
point gpu_measure(const codec_spec& spec, dtype t, const void* x, std::size_t n,
                  iteration_plan plan);

} // namespace gradsync::bench::compress_bench
