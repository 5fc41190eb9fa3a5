// gradsync: device path of random-k (randk.hpp). The index of entry j is
// random_permutation(j), the host's GRADSYNC_HD bijection, computed by the
// thread of entry j; the permutation object is built once on the host (encode)
// or per thread from the payload's parameters (decode). The poison flag (any
// non-finite input) is a cub::DeviceReduce::TransformReduce over the tensor
// (any_nonfinite, also PowerSGD's poison scan). Payloads are bit-identical to
// the host's for both settings of `unbiased` (the unscaled flag, bit 1, is
// set on the host side of the header; the n/k scaling in decode uses
// __fmul_rn so no FMA contraction changes a bit, and an unscaled payload
// decodes to the values as sent, as on the host).
#pragma once

#include <cub/device/device_reduce.cuh>

#include "../randk.hpp"
#include "common.cuh"

namespace gradsync::compress::gpu {

namespace detail {

template <class T> struct nonfinite_fn {
  __device__ std::uint32_t operator()(const T& x) const { return finite(to_float(x)) ? 0u : 1u; }
};
struct max_u32 {
  __device__ std::uint32_t operator()(std::uint32_t a, std::uint32_t b) const {
    return a > b ? a : b;
  }
};

/// Device workspace of any_nonfinite over n elements of T.
template <class T> std::size_t any_nonfinite_temp(std::size_t n, const char* op) {
  std::size_t bytes = 0;
  check(cub::DeviceReduce::TransformReduce(nullptr, bytes, static_cast<const T*>(nullptr),
                                           static_cast<std::uint32_t*>(nullptr), n, max_u32{},
                                           nonfinite_fn<T>{}, 0u),
        op, "cub::DeviceReduce::TransformReduce (size query)");
  return bytes;
}

/// Enqueues *d_flag = 1 if any of x[0, n) is NaN or +-Inf, else 0 (n may be 0);
/// temp: any_nonfinite_temp<T>(n) bytes.
template <class T>
void any_nonfinite(const T* x, std::size_t n, std::uint32_t* d_flag, std::span<std::byte> temp,
                   cudaStream_t stream, const char* op) {
  if (n == 0) {
    check(cudaMemsetAsync(d_flag, 0, sizeof(std::uint32_t), stream), op, "cudaMemsetAsync");
    return;
  }
  std::size_t tb = temp.size();
  check(cub::DeviceReduce::TransformReduce(temp.data(), tb, x, d_flag, n, max_u32{},
                                           nonfinite_fn<T>{}, 0u, stream),
        op, "cub::DeviceReduce::TransformReduce");
}

template <class T> struct randomk_gather_fn {
  const T* x;
  random_permutation perm;
  const std::uint32_t* poisoned;
  T* values;
  __device__ void operator()(std::size_t j) const {
    values[j] = *poisoned ? T(0.0f) : x[perm(j)];
  }
};

/// The flags word: the host-known bits (unscaled) plus the poison bit only the
/// device knows.
template <class = void>
__global__ void randomk_flags_kernel(std::byte* params, const std::uint32_t* poisoned,
                                     std::uint32_t flags) {
  wire::store<std::uint32_t>(params + 24, flags | (*poisoned ? randomk<float>::flag_poisoned : 0u));
}

/// Parameters of a randomk payload as the device reads them.
struct randomk_params {
  std::uint64_t e, seed;
  std::uint32_t step, key, flags, pad;
};
GRADSYNC_HD inline randomk_params read_randomk(const std::byte* p) {
  return {wire::load<std::uint64_t>(p),      wire::load<std::uint64_t>(p + 8),
          wire::load<std::uint32_t>(p + 16), wire::load<std::uint32_t>(p + 20),
          wire::load<std::uint32_t>(p + 24), wire::load<std::uint32_t>(p + 28)};
}

template <class T> struct randomk_body_rule {
  GRADSYNC_HD bool operator()(const std::byte* params, std::uint64_t count,
                              std::uint64_t* body) const {
    const randomk_params p = read_randomk(params);
    constexpr std::uint32_t known = randomk<T>::flag_poisoned | randomk<T>::flag_unscaled;
    if (p.e > count || p.flags > known || p.pad != 0) return false;
    *body = p.e * sizeof(T);
    return true;
  }
};

template <class T> __device__ inline bool positive_zero(T x) {
  const float f = to_float(x);
  return f == 0.0f && !signbit(f);
}

template <class T> struct randomk_check_fn {
  const std::byte* payload;
  std::uint32_t* status;
  __device__ void operator()(std::size_t j) const {
    if (*status != 0) return;
    const randomk_params p = read_randomk(payload + wire::header_bytes);
    const T x = reinterpret_cast<const T*>(payload + wire::header_bytes + 32)[j];
    if ((p.flags & randomk<T>::flag_poisoned) != 0 ? !positive_zero(x) : !finite(to_float(x)))
      atomicCAS(status, 0u, static_cast<std::uint32_t>(gpu::status::bad_content));
  }
};

/// Poisoned payloads: NaN into every element.
template <class Sink> struct randomk_poison_fn {
  const std::byte* payload;
  Sink sink;
  __device__ void operator()(std::size_t i) const {
    if ((read_randomk(payload + wire::header_bytes).flags & randomk<float>::flag_poisoned) != 0)
      sink(i, __int_as_float(0x7fc00000));
  }
};

template <class T, class Sink> struct randomk_scatter_fn {
  const std::byte* payload;
  std::uint64_t count;
  Sink sink;
  __device__ void operator()(std::size_t j) const {
    const randomk_params p = read_randomk(payload + wire::header_bytes);
    if ((p.flags & randomk<T>::flag_poisoned) != 0) return;
    const random_permutation perm(philox_stream{p.seed, p.step, p.key}, count);
    // The host's scale: n/k rounded to float, or exactly 1 for an unscaled payload.
    const float scale = (p.flags & randomk<T>::flag_unscaled) != 0
                            ? 1.0f
                            : static_cast<float>(__ddiv_rn(static_cast<double>(count),
                                                           static_cast<double>(p.e)));
    const T x = reinterpret_cast<const T*>(payload + wire::header_bytes + 32)[j];
    sink(static_cast<std::size_t>(perm(j)), __fmul_rn(scale, to_float(x)));
  }
};

template <class T> struct zero_out_fn {
  T* out;
  __device__ void operator()(std::size_t i) const { out[i] = T(0.0f); }
};

template <class T, class Sink>
void randomk_decode(std::span<const std::byte> payload, std::size_t n, Sink sink, T* zero,
                    std::uint32_t* d_status, std::span<std::byte> ws, cudaStream_t stream) {
  using C = randomk<T>;
  const char* op = C::decode_op;
  const expectation<randomk_body_rule<T>> e{C::id, dtype_traits<T>::id, 32, n, {}};
  validate(payload.data(), payload.size(), e, d_status, ws, stream, op);
  // A valid payload holds exactly this many values; an invalid one is never read.
  const std::size_t head = wire::header_bytes + C::param_bytes;
  const std::size_t k = payload.size() > head ? (payload.size() - head) / sizeof(T) : 0;
  for_each(k, randomk_check_fn<T>{payload.data(), d_status}, stream, op);
  if (zero != nullptr) for_each(n, if_valid<zero_out_fn<T>>{d_status, {zero}}, stream, op);
  for_each(n, if_valid<randomk_poison_fn<Sink>>{d_status, {payload.data(), sink}}, stream, op);
  for_each(k, if_valid<randomk_scatter_fn<T, Sink>>{d_status, {payload.data(), n, sink}}, stream,
           op);
}

} // namespace detail

/// Device workspace of encode for n elements.
template <float_element T>
std::size_t encode_workspace_bytes(const randomk<T>& c, std::size_t n) {
  return workspace_piece<std::uint32_t>(1) +
         workspace_piece<std::byte>(detail::any_nonfinite_temp<T>(n, randomk<T>::encode_op)) +
         seal_workspace_bytes(c.max_encoded_bytes(n));
}

/// Device encode; advances st.step on the host like the host encode.
template <float_element T>
std::size_t encode(const randomk<T>& c, std::span<const T> in, stream_state& st,
                   std::span<std::byte> ws, std::span<std::byte> out, cudaStream_t stream) {
  using C = randomk<T>;
  const char* op = C::encode_op;
  const std::size_t n = in.size();
  check_encode(op, in.data(), n * sizeof(T), out, c.max_encoded_bytes(n), ws,
               encode_workspace_bytes(c, n));
  const std::size_t e = c.entries(n);
  const std::uint32_t key = c.shared_indices ? randomk_shared_key : st.rank;
  wire::check(c.shared_indices || st.rank != randomk_shared_key, op,
              "rank 0xffffffff is reserved for shared indices");
  // Host-known flag bits; the poison bit is or-ed in on the device.
  const std::uint32_t flags = c.unbiased ? 0u : C::flag_unscaled;
  const auto step = static_cast<std::uint32_t>(st.step);
  ++st.step;
  const std::uint64_t seed = st.seed;
  const header_image img =
      make_header(C::id, dtype_traits<T>::id, n, C::param_bytes, sizeof(T) * e, op,
                  [&](std::span<std::byte> p) {
                    wire::param_writer(p)
                        .u64(e)
                        .u64(seed)
                        .u32(step)
                        .u32(key)
                        .u32(flags) // poison bit patched on the device
                        .u32(0);
                  });
  workspace_cursor cur(ws, op);
  std::uint32_t* poisoned = cur.take<std::uint32_t>(1).data();
  auto temp = cur.take<std::byte>(detail::any_nonfinite_temp<T>(n, op));
  detail::any_nonfinite(in.data(), n, poisoned, temp, stream, op);
  auto* values = reinterpret_cast<T*>(out.data() + img.size);
  for_each(e,
           detail::randomk_gather_fn<T>{in.data(), C::permutation(seed, step, key, n), poisoned,
                                        values},
           stream, op);
  // The poison flag is only known on the device: it is patched into the
  // header between the header write and the checksum.
  seal_with(img, out.data(), nullptr, cur.rest(), stream, op, [&] {
    detail::randomk_flags_kernel<><<<1, 1, 0, stream>>>(out.data() + wire::header_bytes,
                                                        poisoned, flags);
    check_launch(op);
  });
  return img.size + sizeof(T) * e;
}

/// Decoding: see device_decoder in common.cuh (gpu::decode, gpu::decode_accumulate):
/// out = n/k * value (value alone for unbiased = false) at every drawn index,
/// zero elsewhere, NaN everywhere when poisoned.
template <float_element T> struct device_decoder<randomk<T>> {
  static constexpr bool enabled = true;
  template <class Sink>
  static void run(const randomk<T>&, std::span<const std::byte> payload, std::size_t n, Sink sink,
                  T* zero, std::uint32_t* d_status, std::span<std::byte> ws, cudaStream_t stream) {
    detail::randomk_decode<T>(payload, n, sink, zero, d_status, ws, stream);
  }
};

} // namespace gradsync::compress::gpu
