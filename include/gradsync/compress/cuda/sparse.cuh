// gradsync: device pieces the sparsifiers share (sparse.hpp's body format):
// writing a body from selected indices, the content validation of a body
// (indices strictly increasing, below count) and the zero + scatter decode.
#pragma once

#include "../sparse.hpp"
#include "../threshold.hpp"
#include "common.cuh"

namespace gradsync::compress::gpu::sparse {

/// Stores v at p, which is only known to be aligned to min(sizeof(V), 4): a
/// double value of an odd-length sparse body sits 4-byte aligned.
template <class V> __device__ inline void store_value(std::byte* p, V v) {
  if constexpr (sizeof(V) == 8) {
    std::uint64_t w;
    std::memcpy(&w, &v, 8);
    reinterpret_cast<std::uint32_t*>(p)[0] = static_cast<std::uint32_t>(w);
    reinterpret_cast<std::uint32_t*>(p)[1] = static_cast<std::uint32_t>(w >> 32);
  } else {
    *reinterpret_cast<V*>(p) = v;
  }
}
/// Loads a value stored by store_value.
template <class V> __device__ inline V load_value(const std::byte* p) {
  if constexpr (sizeof(V) == 8) {
    const auto* q = reinterpret_cast<const std::uint32_t*>(p);
    const std::uint64_t w = q[0] | (static_cast<std::uint64_t>(q[1]) << 32);
    V v;
    std::memcpy(&v, &w, 8);
    return v;
  } else {
    return *reinterpret_cast<const V*>(p);
  }
}

/// body entry j = (idx[j], x[idx[j]]) for j < k: the gather after a selection.
template <class T> struct gather_fn {
  const T* x;
  const std::uint32_t* idx;
  std::byte* body;
  std::size_t k;
  __device__ void operator()(std::size_t j) const {
    const std::uint32_t i = idx[j];
    reinterpret_cast<std::uint32_t*>(body)[j] = i;
    store_value<T>(body + 4 * k + sizeof(T) * j, x[i]);
  }
};

/// Which extra parameters a sparsifier's block carries before the entry count.
enum class extra : std::uint8_t {
  none,      ///< topk: u64 k
  density,   ///< approx_topk: f64 density in [0, 1], k <= ceil(density * count)
  threshold, ///< threshold: f32 tau (finite, >= 0), u32 zero, every |value| >= tau
};

/// Gather with the entry count read on the device (j < k slots launched).
template <class T> struct gather_dyn_fn {
  const T* x;
  const std::uint32_t* idx;
  std::byte* body;
  const std::uint64_t* e;
  __device__ void operator()(std::size_t j) const {
    const std::uint64_t k = *e;
    if (j < k) gather_fn<T>{x, idx, body, k}(j);
  }
};

/// Parameter/body rule of a sparse payload: k (u64 at params + k_at) must not
/// exceed count, the extra parameters must be valid, and the body holds
/// exactly k entries.
template <class T> struct body_rule {
  std::uint32_t k_at;
  extra kind = extra::none;
  GRADSYNC_HD bool operator()(const std::byte* params, std::uint64_t count,
                              std::uint64_t* body) const {
    const std::uint64_t k = wire::load<std::uint64_t>(params + k_at);
    if (kind == extra::density) {
      const double d = wire::load<double>(params);
      if (!(d >= 0.0 && d <= 1.0)) return false;
      if (static_cast<double>(k) > ceil(d * static_cast<double>(count))) return false;
    }
    if (kind == extra::threshold) {
      const float tau = wire::load<float>(params);
      if (!(finite(tau) && tau >= 0.0f) || wire::load<std::uint32_t>(params + 4) != 0)
        return false;
    }
    if (k > count) return false;
    *body = k * (sizeof(std::uint32_t) + sizeof(T));
    return true;
  }
};

/// Marks the payload bad_content when an index is out of order or range, or
/// (threshold) a value is below tau.
template <class T> struct check_entries_fn {
  const std::byte* params;
  const std::byte* body;
  std::size_t k;
  std::uint64_t count;
  extra kind;
  std::uint32_t* status;
  __device__ void operator()(std::size_t j) const {
    if (*status != 0) return;
    const auto* idx = reinterpret_cast<const std::uint32_t*>(body);
    const std::uint32_t i = idx[j];
    bool ok = i < count && (j == 0 || i > idx[j - 1]);
    if (kind == extra::threshold)
      ok = ok && threshold_keeps(load_value<T>(body + 4 * k + sizeof(T) * j),
                                 wire::load<float>(params));
    if (!ok) atomicCAS(status, 0u, static_cast<std::uint32_t>(gpu::status::bad_content));
  }
};

template <class T> struct zero_fn {
  T* out;
  __device__ void operator()(std::size_t i) const { out[i] = T(0.0f); }
};

template <class T, class Sink> struct scatter_fn {
  const std::byte* body;
  std::size_t k;
  Sink sink;
  __device__ void operator()(std::size_t j) const {
    sink(reinterpret_cast<const std::uint32_t*>(body)[j],
         to_float(load_value<T>(body + 4 * k + sizeof(T) * j)));
  }
};

/// The body length of *e entries of T.
template <class T>
__global__ void body_bytes_kernel(const std::uint64_t* e, std::uint64_t* body_bytes) {
  *body_bytes = *e * (sizeof(std::uint32_t) + sizeof(T));
}

/// Ends a sparse encode whose entry count is a device value *e (at most
/// `slots`): gathers the values of the selected indices idx[j < *e] behind
/// them, derives the body length, and seals with e patched into the parameter
/// block at `e_at` (it must follow the header image, which holds a placeholder).
template <class T>
void finish_dynamic(const header_image& img, std::byte* out, std::size_t e_at, const T* x,
                    const std::uint32_t* idx, std::size_t slots, const std::uint64_t* e,
                    std::uint64_t* body_bytes, std::span<std::byte> ws, cudaStream_t stream,
                    const char* op) {
  body_bytes_kernel<T><<<1, 1, 0, stream>>>(e, body_bytes);
  check_launch(op);
  for_each(slots, gather_dyn_fn<T>{x, idx, out + img.size, e}, stream, op);
  seal_with(img, out, body_bytes, ws, stream, op,
            [&] { patch_u64(out + wire::header_bytes + e_at, e, stream, op); });
}

/// Shared device decode of every sparsifier (the twin of sparse::decode):
/// validate, check the indices, then (when `zero` is set) zero the output and
/// scatter the entries into `sink`; all writes happen only for a valid payload.
template <class Codec, class Sink>
void decode(std::span<const std::byte> payload, std::size_t out_count, Sink sink,
            typename Codec::value_type* zero, std::uint32_t* d_status, std::span<std::byte> ws,
            cudaStream_t stream, extra kind = extra::none) {
  using T = typename Codec::value_type;
  const char* op = Codec::decode_op;
  const expectation<body_rule<T>> e{Codec::id, dtype_traits<T>::id,
                                    static_cast<std::uint32_t>(Codec::param_bytes), out_count,
                                    {static_cast<std::uint32_t>(Codec::count_offset), kind}};
  validate(payload.data(), payload.size(), e, d_status, ws, stream, op);
  // A valid payload has exactly this many entries; an invalid one is never read.
  const std::size_t head = wire::header_bytes + Codec::param_bytes;
  const std::size_t k = payload.size() > head ? (payload.size() - head) / (4 + sizeof(T)) : 0;
  const std::byte* body = payload.data() + head;
  for_each(k,
           check_entries_fn<T>{payload.data() + wire::header_bytes, body, k, out_count, kind,
                               d_status},
           stream, op);
  if (zero != nullptr) for_each(out_count, if_valid<zero_fn<T>>{d_status, {zero}}, stream, op);
  for_each(k, if_valid<scatter_fn<T, Sink>>{d_status, {body, k, sink}}, stream, op);
}

/// device_decoder of a sparsifier with the given extra parameters (common.cuh).
template <class C, extra Kind> struct decoder_for {
  using T = typename C::value_type;
  static constexpr bool enabled = true;
  template <class Sink>
  static void run(const C&, std::span<const std::byte> payload, std::size_t n, Sink sink, T* zero,
                  std::uint32_t* d_status, std::span<std::byte> ws, cudaStream_t stream) {
    decode<C>(payload, n, sink, zero, d_status, ws, stream, Kind);
  }
};

} // namespace gradsync::compress::gpu::sparse
