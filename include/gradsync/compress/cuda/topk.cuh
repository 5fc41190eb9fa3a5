// gradsync: device path of exact top-k (topk.hpp).
//
// The selection is select.cuh's device radix select over the unique
// (magnitude, lower index first) composite key, the host's ranking and tie
// rule, so the payload is bit-identical to the host's: up to six histogram
// passes (usually three or four), then one cub::DeviceSelect::If pass writes
// the chosen indices, increasing, straight into the body, and a gather
// writes the values.
#pragma once

#include "../topk.hpp"
#include "select.cuh"
#include "sparse.cuh"

namespace gradsync::compress::gpu {

/// Device workspace of encode for n elements.
template <float_element T> std::size_t encode_workspace_bytes(const topk<T>& c, std::size_t n) {
  return workspace_piece<std::uint64_t>(1) +
         select::workspace_bytes<T, select::all_items>(n, topk<T>::encode_op) +
         seal_workspace_bytes(c.max_encoded_bytes(n));
}

/// Device encode (see the file comment); returns the payload size.
template <float_element T>
std::size_t encode(const topk<T>& c, std::span<const T> in, no_state&, std::span<std::byte> ws,
                   std::span<std::byte> out, cudaStream_t stream) {
  const char* op = topk<T>::encode_op;
  const std::size_t n = in.size();
  compress::sparse::check_count(n, op);
  check_encode(op, in.data(), n * sizeof(T), out, c.max_encoded_bytes(n), ws,
               encode_workspace_bytes(c, n));
  const std::size_t e = c.entries(n);
  const std::size_t body_bytes = compress::sparse::body_bytes<T>(e);
  const header_image img =
      make_header(topk<T>::id, dtype_traits<T>::id, n, topk<T>::param_bytes, body_bytes, op,
                  [e](std::span<std::byte> p) { wire::param_writer(p).u64(e); });
  std::byte* body = out.data() + img.size;
  auto* idx = reinterpret_cast<std::uint32_t*>(body);

  workspace_cursor cur(ws, op);
  std::uint64_t* selected = cur.take<std::uint64_t>(1).data();
  const std::size_t sel_bytes = select::workspace_bytes<T, select::all_items>(n, op);
  std::span<std::byte> sel_ws = cur.take<std::byte>(sel_bytes);
  if (e > 0) {
    select::run(in.data(), n, select::all_items{}, n, select::fixed_k{e}, idx, e, selected,
                sel_ws, stream, op);
    for_each(e, sparse::gather_fn<T>{in.data(), idx, body, e}, stream, op);
  }
  seal(img, out.data(), nullptr, cur.rest(), stream, op);
  return img.size + body_bytes;
}

/// Decoding: see device_decoder in common.cuh (gpu::decode, gpu::decode_accumulate).
template <float_element T>
struct device_decoder<topk<T>> : sparse::decoder_for<topk<T>, sparse::extra::none> {};

} // namespace gradsync::compress::gpu
