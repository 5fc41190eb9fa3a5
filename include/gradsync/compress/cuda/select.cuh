// gradsync: exact device selection of the k largest magnitudes, the device
// twin of sparse::select_top (sparse.hpp), shared by topk and approx_topk.
//
// CUB has no top-k. The host ranks by (|x| key, lower index first); here each
// element gets the unique 63-bit composite key (key << 32) | (2^32-1 - index),
// so ties vanish and the k largest composites are exactly the host's set. An
// MSD radix select finds the k-th largest composite in up to six digits
// (11,11,11,10,10,10 bits): per digit one histogram kernel over the items
// (shared-memory counters, flushed with atomics: counts are exact, so the
// result is deterministic) and one single-block kernel that picks the bucket
// with a cub::BlockScan. A digit whose bucket holds exactly the missing count
// ends the search early (the later kernels return at once); random data
// usually needs three or four digits. cub::DeviceSelect::If then emits the
// selected indices in index order (the body's order) in one pass.
//
// Everything is stream-ordered; the k, the item source and whether the
// selection runs at all may be decided on the device (approx_topk).
#pragma once

#include <cub/block/block_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>

#include "../sparse.hpp"
#include "common.cuh"

namespace gradsync::compress::gpu::select {

/// Unique ranking key: larger magnitude first, then lower index.
GRADSYNC_HD inline std::uint64_t composite(std::uint32_t key, std::uint64_t index) {
  return (static_cast<std::uint64_t>(key) << 32) | (0xFFFFFFFFull - index);
}

inline constexpr int digits = 6;
/// Width and position of digit d (bits 62..0: 11, 11, 11, 10, 10, 10).
GRADSYNC_HD constexpr int digit_bits(int d) { return d < 3 ? 11 : 10; }
GRADSYNC_HD constexpr int digit_shift(int d) { return d < 3 ? 52 - 11 * d : 20 - 10 * (d - 3); }
static_assert(digit_shift(0) + digit_bits(0) == 63 && digit_shift(digits - 1) == 0);
inline constexpr unsigned buckets = 2048;
inline constexpr unsigned scan_threads = 1024; // two buckets per thread

/// The search's device state (in the caller's workspace).
struct state {
  std::uint64_t prefix; // composite bits fixed so far; the cut once done
  std::uint64_t mask;
  std::uint64_t need;   // how many items sharing `prefix` still belong to the top
  std::uint32_t done;   // search finished (or never active)
  std::uint32_t active; // 0: this selection is skipped entirely
  unsigned long long hist[buckets];
};

/// Items are element indices: item j is element j (a whole tensor).
struct all_items {
  GRADSYNC_HD std::uint64_t operator()(std::uint64_t j) const { return j; }
};
/// Item j is element list[j]; a value >= n marks an empty slot.
struct listed_items {
  const std::uint32_t* list;
  GRADSYNC_HD std::uint64_t operator()(std::uint64_t j) const { return list[j]; }
};

namespace detail {

/// Composite of element i of x.
template <class T> __device__ inline std::uint64_t composite_of(const T* x, std::uint64_t i) {
  return composite(compress::sparse::magnitude_key(x[i]), i);
}

template <class Init> __global__ void init_kernel(state* s, Init init) {
  s->prefix = 0;
  s->mask = 0;
  s->need = 0;
  s->active = 1;
  init(*s); // sets need and active
  s->done = s->active == 0 || s->need == 0 ? 1u : 0u;
  if (s->need == 0) s->prefix = ~std::uint64_t{0}; // above every composite: selects nothing
}

template <class T, class Items>
__global__ void __launch_bounds__(256)
    hist_kernel(state* s, const T* x, Items items, std::uint64_t n, std::uint64_t count, int d) {
  if (s->done) return;
  __shared__ unsigned int h[buckets];
  for (unsigned b = threadIdx.x; b < buckets; b += blockDim.x) h[b] = 0;
  __syncthreads();
  const std::uint64_t prefix = s->prefix, mask = s->mask;
  const int shift = digit_shift(d);
  const std::uint64_t dmask = (std::uint64_t{1} << digit_bits(d)) - 1;
  for (std::uint64_t j = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; j < count;
       j += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t i = items(j);
    if (i >= n) continue;
    const std::uint64_t c = composite_of(x, i);
    if ((c & mask) == prefix) atomicAdd(&h[(c >> shift) & dmask], 1u);
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b <= dmask; b += blockDim.x)
    if (h[b] != 0) atomicAdd(&s->hist[b], static_cast<unsigned long long>(h[b]));
}

/// Picks the bucket of digit d holding the need-th largest item (the host's
/// loop: the largest b with sum_{b' > b} hist[b'] < need), then clears the
/// counters for the next digit.
template <class = void> // a template: defined in a header without ODR clashes
__global__ void __launch_bounds__(scan_threads) choose_kernel(state* s, int d) {
  if (s->done) return;
  using scan_t = cub::BlockScan<unsigned long long, scan_threads>;
  __shared__ typename scan_t::TempStorage temp;
  const unsigned nb = 1u << digit_bits(d);
  // Thread t owns buckets nb-1-2t and nb-2-2t (descending order).
  unsigned long long c[2];
  for (int q = 0; q < 2; ++q) {
    const int b = static_cast<int>(nb) - 1 - static_cast<int>(2 * threadIdx.x) - q;
    c[q] = b >= 0 ? s->hist[b] : 0ull;
  }
  unsigned long long above[2];
  scan_t(temp).ExclusiveSum(c, above); // items in higher buckets
  const std::uint64_t need = s->need;
  __syncthreads();
  for (int q = 0; q < 2; ++q) {
    const int b = static_cast<int>(nb) - 1 - static_cast<int>(2 * threadIdx.x) - q;
    if (b < 0) continue;
    if (above[q] < need && (need <= above[q] + c[q] || b == 0)) {
      const int shift = digit_shift(d);
      s->prefix |= static_cast<std::uint64_t>(b) << shift;
      s->mask |= static_cast<std::uint64_t>(nb - 1) << shift;
      s->need = need - above[q];
      // Every item of this bucket belongs to the top: the cut is its lowest composite.
      if (c[q] == s->need || d == digits - 1) s->done = 1;
    }
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b < nb; b += blockDim.x) s->hist[b] = 0;
}

/// Selection predicate of the emitting pass: item value i is an element index.
template <class T> struct selected_fn {
  const T* x;
  const state* s;
  std::uint64_t n;
  __device__ bool operator()(std::uint32_t i) const {
    return s->active != 0 && i < n && composite_of(x, i) >= s->prefix;
  }
};

/// Output of the emitting pass: out[pos] = i for the first `cap` positions.
struct capped_store {
  std::uint32_t* out;
  std::uint64_t cap;
  __device__ void operator()(std::int64_t pos, std::uint32_t i) const {
    if (static_cast<std::uint64_t>(pos) < cap) out[pos] = i;
  }
};

template <class Items> struct item_values;
template <> struct item_values<all_items> {
  static thrust::counting_iterator<std::uint32_t> begin(const all_items&) {
    return thrust::counting_iterator<std::uint32_t>(0);
  }
};
template <> struct item_values<listed_items> {
  static const std::uint32_t* begin(const listed_items& l) { return l.list; }
};

template <class T, class Items> std::size_t select_temp(std::uint64_t count, const char* op) {
  std::size_t bytes = 0;
  auto out = thrust::make_tabulate_output_iterator(capped_store{});
  check(cub::DeviceSelect::If(nullptr, bytes, item_values<Items>::begin(Items{}), out,
                              static_cast<std::uint64_t*>(nullptr),
                              static_cast<std::int64_t>(count), selected_fn<T>{}),
        op, "cub::DeviceSelect::If (size query)");
  return bytes;
}

} // namespace detail

/// Device workspace of run() over `count` items.
template <class T, class Items> std::size_t workspace_bytes(std::uint64_t count, const char* op) {
  return workspace_piece<state>(1) +
         workspace_piece<std::byte>(detail::select_temp<T, Items>(count, op));
}

/// Enqueues the selection over items 0 .. count-1 (element indices into x of n
/// elements; empty slots hold a value >= n): init(state&) sets state.need (the
/// k, possibly read on the device) and may clear state.active to skip the
/// whole selection. The selected element indices, increasing, go to out[0 ..
/// cap) (at most need are selected, so cap >= need loses nothing); their count
/// to *d_selected.
template <class T, class Items, class Init>
void run(const T* x, std::uint64_t n, Items items, std::uint64_t count, Init init,
         std::uint32_t* out, std::uint64_t cap, std::uint64_t* d_selected,
         std::span<std::byte> ws, cudaStream_t stream, const char* op) {
  workspace_cursor cur(ws, op);
  state* s = cur.take<state>(1).data();
  auto temp = cur.take<std::byte>(detail::select_temp<T, Items>(count, op));
  check(cudaMemsetAsync(s->hist, 0, sizeof(s->hist), stream), op, "cudaMemsetAsync");
  detail::init_kernel<<<1, 1, 0, stream>>>(s, init);
  check_launch(op);
  const unsigned grid = grid_for((count + 255) / 256, 256, op);
  for (int d = 0; d < digits; ++d) {
    detail::hist_kernel<<<grid, 256, 0, stream>>>(s, x, items, n, count, d);
    detail::choose_kernel<><<<1, scan_threads, 0, stream>>>(s, d);
    check_launch(op);
  }
  std::size_t bytes = temp.size();
  auto sink = thrust::make_tabulate_output_iterator(detail::capped_store{out, cap});
  check(cub::DeviceSelect::If(temp.data(), bytes, detail::item_values<Items>::begin(items), sink,
                              d_selected, static_cast<std::int64_t>(count),
                              detail::selected_fn<T>{x, s, n}, stream),
        op, "cub::DeviceSelect::If");
}

/// init for a k known on the host.
struct fixed_k {
  std::uint64_t k;
  __device__ void operator()(state& s) const { s.need = k; }
};

} // namespace gradsync::compress::gpu::select
