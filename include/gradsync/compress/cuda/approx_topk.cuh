// gradsync: device path of approximate top-k (approx_topk.hpp), the host's
// algorithm step by step, so payloads are bit-identical to the host's:
//  1. the Philox sample of magnitude keys (approx_topk_sample_index, one thread
//     per sample), sorted with cub::DeviceRadixSort::SortKeysDescending; the
//     threshold is the same order statistic the host's nth_element picks;
//  2. one cub::DeviceSelect::If pass collects the candidates |x| >= threshold
//     in index order into candidate_slots(k) slots (the rest are counted, not
//     stored);
//  3. select.cuh's exact radix select keeps the top min(k, candidates) of the
//     candidates, or, when the candidates overflowed, of the whole tensor
//     (both selections are enqueued; the device decides which one runs, the
//     other returns at once).
// The entry count e is only known on the device: the parameter block and the
// header's body length are written there, encode returns the upper bound
// max_encoded_bytes(n), and the exact payload size is 48 + e (4 + sizeof(T))
// (read the header's body length, u64 at offset 16, when it is needed on the
// host). The state's step advances on the host as in the host encode; its
// report fields (sent, achieved_density, fallbacks) are not updated by the
// device path (they would need a synchronisation).
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include "../approx_topk.hpp"
#include "select.cuh"
#include "sparse.cuh"

namespace gradsync::compress::gpu {

namespace detail {

template <class T> struct sample_fn {
  const T* x;
  philox_stream rng;
  std::size_t n;
  std::uint32_t* keys;
  __device__ void operator()(std::size_t j) const {
    keys[j] = compress::sparse::magnitude_key(x[approx_topk_sample_index(rng, j, n)]);
  }
};

template <class T> struct above_threshold_fn {
  const T* x;
  const std::uint32_t* thr;
  __device__ bool operator()(std::uint32_t i) const {
    return compress::sparse::magnitude_key(x[i]) >= *thr;
  }
};

/// Candidate selection: top min(k, c) of the candidates, unless they overflowed.
struct candidates_init {
  std::uint64_t k, cap;
  const std::uint64_t* c;
  __device__ void operator()(select::state& s) const {
    s.active = *c <= cap;
    s.need = *c < k ? *c : k;
  }
};
/// Fallback: the exact top k of the whole tensor, only after an overflow.
struct overflow_init {
  std::uint64_t k, cap;
  const std::uint64_t* c;
  __device__ void operator()(select::state& s) const {
    s.active = *c > cap;
    s.need = k;
  }
};

/// The entry count: the candidate trim's, or the fallback's after an overflow.
template <class = void>
__global__ void approx_entries_kernel(const std::uint64_t* c, std::uint64_t cap,
                                      const std::uint64_t* sel_cand, const std::uint64_t* sel_all,
                                      std::uint64_t* e) {
  *e = *c <= cap ? *sel_cand : *sel_all;
}

struct approx_plan {
  std::size_t n, k, s, cap, rank;
};
template <class T> approx_plan plan(const approx_topk<T>& c, std::size_t n) {
  using C = approx_topk<T>;
  approx_plan p{n, C::target(c.density, n), 0, 0, 0};
  p.s = C::sample_size(n, p.k);
  if (p.s != 0) {
    p.cap = C::candidate_slots(p.k);
    const double q = std::ceil(policy::approx_topk_overshoot * static_cast<double>(p.s) *
                               static_cast<double>(p.k) / static_cast<double>(n));
    p.rank = std::min(p.s, static_cast<std::size_t>(q)) - 1;
  }
  return p;
}

inline std::size_t sample_sort_temp(std::size_t s, const char* op) {
  std::size_t bytes = 0;
  cub::DoubleBuffer<std::uint32_t> keys(nullptr, nullptr);
  check(cub::DeviceRadixSort::SortKeysDescending(nullptr, bytes, keys, s, 0, 31), op,
        "cub::DeviceRadixSort::SortKeysDescending (size query)");
  return bytes;
}
template <class T> std::size_t candidate_temp(std::size_t n, const char* op) {
  std::size_t bytes = 0;
  auto out = thrust::make_tabulate_output_iterator(select::detail::capped_store{});
  check(cub::DeviceSelect::If(nullptr, bytes, thrust::counting_iterator<std::uint32_t>(0), out,
                              static_cast<std::uint64_t*>(nullptr), static_cast<std::int64_t>(n),
                              above_threshold_fn<T>{}),
        op, "cub::DeviceSelect::If (size query)");
  return bytes;
}

} // namespace detail

/// Device workspace of encode for n elements.
template <float_element T>
std::size_t encode_workspace_bytes(const approx_topk<T>& c, std::size_t n) {
  const char* op = approx_topk<T>::encode_op;
  const detail::approx_plan p = detail::plan(c, n);
  std::size_t bytes = 6 * workspace_piece<std::uint64_t>(1) +
                      workspace_piece<std::uint32_t>(p.k) +
                      select::workspace_bytes<T, select::all_items>(n, op) +
                      seal_workspace_bytes(c.max_encoded_bytes(n));
  if (p.s != 0)
    bytes += 2 * workspace_piece<std::uint32_t>(p.s) + workspace_piece<std::uint32_t>(p.cap) +
             workspace_piece<std::byte>(std::max(detail::sample_sort_temp(p.s, op),
                                                 detail::candidate_temp<T>(n, op))) +
             select::workspace_bytes<T, select::listed_items>(p.cap, op);
  return bytes;
}

/// Device encode (see the file comment): returns max_encoded_bytes(n); the
/// payload's exact size is in its header.
template <float_element T>
std::size_t encode(const approx_topk<T>& c, std::span<const T> in, approx_topk_state& st,
                   std::span<std::byte> ws, std::span<std::byte> out, cudaStream_t stream) {
  using C = approx_topk<T>;
  const char* op = C::encode_op;
  const std::size_t n = in.size();
  wire::check(c.density >= 0.0 && c.density <= 1.0, op,
              "density " + std::to_string(c.density) + " is outside [0, 1]");
  compress::sparse::check_count(n, op);
  wire::check(n < compress::sparse::max_count, op,
              "the device path indexes at most 2^32 - 1 elements (0xFFFFFFFF marks empty slots)");
  check_encode(op, in.data(), n * sizeof(T), out, c.max_encoded_bytes(n), ws,
               encode_workspace_bytes(c, n));
  stream_state ss{st.seed, st.step, st.rank};
  const philox_stream rng = ss.next();
  st.step = ss.step;

  const detail::approx_plan p = detail::plan(c, n);
  const double density = c.density;
  const header_image img = make_header(
      C::id, dtype_traits<T>::id, n, C::param_bytes, compress::sparse::body_bytes<T>(p.k), op,
      [density](std::span<std::byte> q) { wire::param_writer(q).f64(density); });
  const T* x = in.data();

  workspace_cursor cur(ws, op);
  std::uint64_t* cand_count = cur.take<std::uint64_t>(1).data();
  std::uint64_t* sel_cand = cur.take<std::uint64_t>(1).data();
  std::uint64_t* sel_all = cur.take<std::uint64_t>(1).data();
  std::uint64_t* e = cur.take<std::uint64_t>(1).data();
  std::uint64_t* body_bytes = cur.take<std::uint64_t>(1).data();
  cur.take<std::uint64_t>(1); // spare: keeps the plan of encode_workspace_bytes
  std::uint32_t* sel = cur.take<std::uint32_t>(p.k).data();
  auto all_ws = cur.take<std::byte>(select::workspace_bytes<T, select::all_items>(n, op));

  if (p.s == 0) { // the host's exact path: select over the whole tensor
    check(cudaMemsetAsync(cand_count, 0, sizeof(std::uint64_t), stream), op, "cudaMemsetAsync");
    if (p.k > 0)
      select::run(x, n, select::all_items{}, n, select::fixed_k{p.k}, sel, p.k, sel_all, all_ws,
                  stream, op);
    else
      check(cudaMemsetAsync(sel_all, 0, sizeof(std::uint64_t), stream), op, "cudaMemsetAsync");
    // cand_count = 0 <= cap = 0 would pick sel_cand: make the finish read sel_all.
    check(cudaMemcpyAsync(sel_cand, sel_all, sizeof(std::uint64_t), cudaMemcpyDeviceToDevice,
                          stream),
          op, "cudaMemcpyAsync");
  } else {
    auto sample = cur.take<std::uint32_t>(p.s), sorted = cur.take<std::uint32_t>(p.s);
    std::uint32_t* cand = cur.take<std::uint32_t>(p.cap).data();
    auto temp = cur.take<std::byte>(std::max(detail::sample_sort_temp(p.s, op),
                                             detail::candidate_temp<T>(n, op)));
    auto cand_ws =
        cur.take<std::byte>(select::workspace_bytes<T, select::listed_items>(p.cap, op));
    // 1. threshold from the sorted sample
    for_each(p.s, detail::sample_fn<T>{x, rng, n, sample.data()}, stream, op);
    cub::DoubleBuffer<std::uint32_t> keys(sample.data(), sorted.data());
    std::size_t tb = temp.size();
    check(cub::DeviceRadixSort::SortKeysDescending(temp.data(), tb, keys, p.s, 0, 31, stream), op,
          "cub::DeviceRadixSort::SortKeysDescending");
    const std::uint32_t* thr = keys.Current() + p.rank;
    // 2. candidates in index order; empty slots stay 0xFFFFFFFF (>= n: n < 2^32 here,
    //    since sampling needs 2 s < n and k < n)
    check(cudaMemsetAsync(cand, 0xFF, p.cap * sizeof(std::uint32_t), stream), op,
          "cudaMemsetAsync");
    tb = temp.size();
    check(cub::DeviceSelect::If(
              temp.data(), tb, thrust::counting_iterator<std::uint32_t>(0),
              thrust::make_tabulate_output_iterator(select::detail::capped_store{cand, p.cap}),
              cand_count, static_cast<std::int64_t>(n), detail::above_threshold_fn<T>{x, thr},
              stream),
          op, "cub::DeviceSelect::If");
    // 3. exact trim among the candidates, or the whole-tensor fallback
    select::run(x, n, select::listed_items{cand}, p.cap,
                detail::candidates_init{p.k, p.cap, cand_count}, sel, p.k, sel_cand, cand_ws,
                stream, op);
    select::run(x, n, select::all_items{}, n, detail::overflow_init{p.k, p.cap, cand_count}, sel,
                p.k, sel_all, all_ws, stream, op);
  }
  detail::approx_entries_kernel<><<<1, 1, 0, stream>>>(cand_count, p.cap, sel_cand, sel_all, e);
  check_launch(op);
  sparse::finish_dynamic(img, out.data(), 8, x, sel, p.k, e, body_bytes, cur.rest(), stream, op);
  return c.max_encoded_bytes(n);
}

/// Decoding: see device_decoder in common.cuh (gpu::decode, gpu::decode_accumulate).
template <float_element T>
struct device_decoder<approx_topk<T>> : sparse::decoder_for<approx_topk<T>, sparse::extra::density> {};

} // namespace gradsync::compress::gpu
