// gradsync: device path of the fixed-threshold sparsifier (threshold.hpp).
// One cub::DeviceSelect::If pass over the element indices with the host's
// predicate threshold_keeps writes the kept indices, increasing, straight into
// the body; a gather writes the values after them. The entry count e is only
// known on the device: the parameter block and the header's body length are
// written there, encode returns the upper bound max_encoded_bytes(n), and the
// exact payload size is 48 + e (4 + sizeof(T)) (the header's u64 at offset 16
// holds the body length). Bit-identical to the host payload.
#pragma once

#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "../threshold.hpp"
#include "sparse.cuh"

namespace gradsync::compress::gpu {

namespace detail {

template <class T> struct keeps_fn {
  const T* x;
  float tau;
  __device__ bool operator()(std::uint32_t i) const { return threshold_keeps(x[i], tau); }
};

template <class T> std::size_t threshold_temp(std::size_t n, const char* op) {
  std::size_t bytes = 0;
  check(cub::DeviceSelect::If(nullptr, bytes, thrust::counting_iterator<std::uint32_t>(0),
                              static_cast<std::uint32_t*>(nullptr),
                              static_cast<std::uint64_t*>(nullptr), static_cast<std::int64_t>(n),
                              keeps_fn<T>{}),
        op, "cub::DeviceSelect::If (size query)");
  return bytes;
}

} // namespace detail

/// Device workspace of encode for n elements.
template <float_element T>
std::size_t encode_workspace_bytes(const threshold<T>& c, std::size_t n) {
  return 2 * workspace_piece<std::uint64_t>(1) +
         workspace_piece<std::byte>(detail::threshold_temp<T>(n, threshold<T>::encode_op)) +
         seal_workspace_bytes(c.max_encoded_bytes(n));
}

/// Device encode (see the file comment): returns max_encoded_bytes(n); the
/// payload's exact size is in its header.
template <float_element T>
std::size_t encode(const threshold<T>& c, std::span<const T> in, no_state&,
                   std::span<std::byte> ws, std::span<std::byte> out, cudaStream_t stream) {
  using C = threshold<T>;
  const char* op = C::encode_op;
  const std::size_t n = in.size();
  wire::check(finite(c.tau) && c.tau >= 0.0f, op,
              "tau " + std::to_string(c.tau) + " must be finite and >= 0");
  compress::sparse::check_count(n, op);
  check_encode(op, in.data(), n * sizeof(T), out, c.max_encoded_bytes(n), ws,
               encode_workspace_bytes(c, n));
  const float tau = c.tau;
  const header_image img = make_header(
      C::id, dtype_traits<T>::id, n, C::param_bytes, compress::sparse::body_bytes<T>(n), op,
      [tau](std::span<std::byte> q) { wire::param_writer(q).f32(tau).u32(0); });
  std::byte* body = out.data() + img.size;

  workspace_cursor cur(ws, op);
  std::uint64_t* e = cur.take<std::uint64_t>(1).data();
  std::uint64_t* body_bytes = cur.take<std::uint64_t>(1).data();
  auto temp = cur.take<std::byte>(detail::threshold_temp<T>(n, op));
  if (n > 0) {
    std::size_t tb = temp.size();
    check(cub::DeviceSelect::If(temp.data(), tb, thrust::counting_iterator<std::uint32_t>(0),
                                reinterpret_cast<std::uint32_t*>(body), e,
                                static_cast<std::int64_t>(n), detail::keeps_fn<T>{in.data(), tau},
                                stream),
          op, "cub::DeviceSelect::If");
  } else {
    check(cudaMemsetAsync(e, 0, sizeof(std::uint64_t), stream), op, "cudaMemsetAsync");
  }
  // The indices already sit at the body's start: the gather reads them in place.
  sparse::finish_dynamic(img, out.data(), 8, in.data(), reinterpret_cast<std::uint32_t*>(body), n, e,
                         body_bytes, cur.rest(), stream, op);
  return c.max_encoded_bytes(n);
}

/// Decoding: see device_decoder in common.cuh (gpu::decode, gpu::decode_accumulate).
template <float_element T>
struct device_decoder<threshold<T>> : sparse::decoder_for<threshold<T>, sparse::extra::threshold> {};

} // namespace gradsync::compress::gpu
