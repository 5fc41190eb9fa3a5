// gradsync: device path of the fp16/bf16 cast codecs (cast.hpp).
//
// One thread per element runs cast_encode1 / cast_decode1, the functions the
// host loop runs, so device payloads are bit-identical to host payloads.
// Entry points mirror the host codec with device spans, a status word for
// decoding (common.cuh) and a stream; nothing synchronises.
#pragma once

#include "../cast.hpp"
#include "common.cuh"

namespace gradsync::compress::gpu {

namespace detail {

template <class T, class W> struct cast_encode_fn {
  const T* in;
  std::uint16_t* body;
  __device__ void operator()(std::size_t i) const {
    body[i] = cast_encode1<W>(to_float(in[i]));
  }
};

template <class W, class Sink> struct cast_decode_fn {
  const std::uint16_t* body;
  Sink sink;
  __device__ void operator()(std::size_t i) const { sink(i, cast_decode1<W>(body[i])); }
};

/// Body of a cast payload: two bytes per element, no parameters.
struct cast_body_rule {
  GRADSYNC_HD bool operator()(const std::byte*, std::uint64_t count, std::uint64_t* body) const {
    *body = 2 * count;
    return count <= (~std::uint64_t{0} >> 1);
  }
};

template <class T, class W, class Sink>
void cast_decode(std::span<const std::byte> payload, std::size_t n, std::uint32_t* d_status,
                 std::span<std::byte> ws, cudaStream_t stream, Sink sink) {
  using C = cast16<T, W>;
  const expectation<cast_body_rule> e{C::id, dtype_traits<T>::id, 0, n, {}};
  const auto* body = reinterpret_cast<const std::uint16_t*>(payload.data() + wire::header_bytes);
  decode_elementwise(payload, e, d_status, ws, stream, C::decode_op,
                     cast_decode_fn<W, Sink>{body, sink});
}

} // namespace detail

/// Device workspace of encode for n elements.
template <float_element T, class W>
std::size_t encode_workspace_bytes(const cast16<T, W>& c, std::size_t n) {
  return seal_workspace_bytes(c.max_encoded_bytes(n));
}

/// Device encode: `in`, `ws` and `out` are device memory (16-byte aligned);
/// returns the payload size (known on the host: 32 + 2n).
template <float_element T, class W>
std::size_t encode(const cast16<T, W>& c, std::span<const T> in, no_state&,
                   std::span<std::byte> ws, std::span<std::byte> out, cudaStream_t stream) {
  using C = cast16<T, W>;
  const std::size_t n = in.size();
  check_encode(C::encode_op, in.data(), n * sizeof(T), out, c.max_encoded_bytes(n), ws,
               encode_workspace_bytes(c, n));
  const header_image img =
      make_header(C::id, dtype_traits<T>::id, n, 0, 2 * n, C::encode_op, [](auto) {});
  auto* body = reinterpret_cast<std::uint16_t*>(out.data() + wire::header_bytes);
  for_each(n, detail::cast_encode_fn<T, W>{in.data(), body}, stream, C::encode_op);
  seal(img, out.data(), nullptr, ws, stream, C::encode_op);
  return img.size + 2 * n;
}

/// Decoding: see device_decoder in common.cuh (gpu::decode, gpu::decode_accumulate).
template <float_element T, class W> struct device_decoder<cast16<T, W>> {
  static constexpr bool enabled = true;
  template <class Sink>
  static void run(const cast16<T, W>&, std::span<const std::byte> payload, std::size_t n, Sink sink,
                  T*, std::uint32_t* d_status, std::span<std::byte> ws, cudaStream_t stream) {
    detail::cast_decode<T, W>(payload, n, d_status, ws, stream, sink);
  }
};

} // namespace gradsync::compress::gpu
