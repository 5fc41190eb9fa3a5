// gradsync: pieces the sparsifying codecs (topk, approx_topk, threshold)
// share: the magnitude key with its tie rule, an exact radix select, and the
// sorted (index, value) body with its validating decode loop.
//
// Sparse body of k entries (after the codec's parameter block):
//
//   offset  size          field
//   0       4 k           indices, u32, strictly increasing, each < count
//   4 k     sizeof(T) k   values, element type T, in the order of the indices
//
// Ranking rule of every sparsifier: elements are ordered by |x| as a float
// (for double: |x| rounded to float), larger first; equal magnitudes keep the
// lower index first. NaN ranks above +Inf, +Inf above every finite value, and
// -0 ties with +0. So non-finite values are the first to be sent.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>

#include "../core/config.hpp"
#include "../core/half.hpp"
#include "../core/host_simd.hpp"
#include "../core/policy.hpp"
#include "codec.hpp"
#include "wire.hpp"

namespace gradsync::compress::sparse {

/// Orderable magnitude key of one element: the bits of |float(x)|. For
/// non-negative floats the bit pattern orders like the value; every NaN key
/// lies above the +Inf key.
template <float_element T> GRADSYNC_HD inline std::uint32_t magnitude_key(T x) {
  return gradsync::detail::float_bits(to_float(x)) & 0x7fffffffu;
}

/// Key of +Inf: every key at or above it is a non-finite element.
inline constexpr std::uint32_t nonfinite_key = 0x7f800000u;

#if GRADSYNC_HOST_AVX2
/// each_at_least's whole groups of 8 for float input: keys compared eight at
/// a time (keys are < 2^31, so a signed compare orders them), and only the
/// rare groups holding a hit are walked. Returns the elements consumed.
template <class Hit>
[[gnu::target("avx2")]] inline std::size_t each_at_least_avx2(const float* x, std::size_t n, std::uint32_t thr,
                                                            Hit& hit) {
  const __m256i abs = _mm256_set1_epi32(0x7fffffff);
  const __m256i below = _mm256_set1_epi32(static_cast<int>(thr) - 1); // key >= thr <=> key > thr - 1
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i k = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs);
    auto m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, below))));
    for (; m != 0; m &= m - 1) hit(i + static_cast<unsigned>(std::countr_zero(m)));
  }
  return i;
}

/// fold_each_at_least's whole groups of 8 (same compare).
template <class Hit>
[[gnu::target("avx2")]] inline std::size_t fold_each_at_least_avx2(const float* g, float* e, std::size_t n,
                                                                 std::uint32_t thr, Hit& hit) {
  const __m256i abs = _mm256_set1_epi32(0x7fffffff);
  const __m256i below = _mm256_set1_epi32(static_cast<int>(thr) - 1);
  const __m256 zero = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(e + i)), zero);
    _mm256_storeu_ps(e + i, v);
    const __m256i k = _mm256_and_si256(_mm256_castps_si256(v), abs);
    auto m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(k, below))));
    for (; m != 0; m &= m - 1) hit(i + static_cast<unsigned>(std::countr_zero(m)));
  }
  return i;
}
#endif

/// hit(i) for every i < n with magnitude_key(x[i]) >= thr, i increasing.
template <float_element T, class Hit> void each_at_least(const T* x, std::size_t n, std::uint32_t thr, Hit hit) {
  std::size_t i = 0;
#if GRADSYNC_HOST_AVX2
  if constexpr (std::is_same_v<T, float>)
    if (thr > 0 && gradsync::detail::best_host_isa() == gradsync::detail::host_isa::avx2)
      i = each_at_least_avx2(x, n, thr, hit);
#endif
  for (; i < n; ++i)
    if (magnitude_key(x[i]) >= thr) hit(i);
}

/// The error-feedback fold of float tensors in one pass: e[i] = (g[i] +
/// e[i]) + 0 (the + 0 makes a -0 sum +0, as residual = (v - x) + x does), and
/// hit(i) for every i whose new e[i] has magnitude_key >= thr, i increasing.
template <class Hit> void fold_each_at_least(const float* g, float* e, std::size_t n, std::uint32_t thr, Hit hit) {
  std::size_t i = 0;
#if GRADSYNC_HOST_AVX2
  if (thr > 0 && gradsync::detail::best_host_isa() == gradsync::detail::host_isa::avx2)
    i = fold_each_at_least_avx2(g, e, n, thr, hit);
#endif
  for (; i < n; ++i) {
    e[i] = (g[i] + e[i]) + 0.0f;
    if (magnitude_key(e[i]) >= thr) hit(i);
  }
}

/// Collects, in index order, the indices i < n with magnitude_key(x[i]) >=
/// thr into out[0, cap); returns how many there are (more than cap: the
/// rest were counted, not stored).
template <float_element T>
inline std::size_t collect_at_least(const T* x, std::size_t n, std::uint32_t thr, std::uint32_t* out,
                                    std::size_t cap) {
  std::size_t c = 0;
  each_at_least(x, n, thr, [&](std::size_t i) {
    if (c < cap) out[c] = static_cast<std::uint32_t>(i);
    ++c;
  });
  return c;
}

/// What a sparsifier selects from: a tensor x as given.
template <float_element T> struct plain_input {
  using value_type = T;
  const T* x;
  std::size_t n;
  /// magnitude_key of element i.
  std::uint32_t key_at(std::size_t i) const { return magnitude_key(x[i]); }
  /// hit(i) for every key >= thr, i increasing.
  template <class Hit> void each_at_least(std::uint32_t thr, Hit hit) { sparse::each_at_least(x, n, thr, hit); }
  /// The whole tensor.
  const T* values() { return x; }
  /// Element i was sent.
  void sent(std::size_t) {}
  /// Element i may be sent soon.
  void will_send(std::size_t) const {}
};

/// What a sparsifier selects from under error feedback (float): x = (g +
/// residual) + 0, computed into the residual by the first pass that reads the
/// tensor (each_at_least or values()), so the fold costs no pass of its own.
/// Sent elements leave +0 in the residual (the codecs send float values
/// exactly), and finish() zeroes the non-finite ones: residual = x -
/// decoded, non-finite parts dropped, bitwise what the separate fold, encode
/// and correction give. (A residual of -0 from outside, folded with a -0
/// gradient, is sent as +0 where the separate steps would send -0; gradsync
/// never writes -0 to a residual.)
struct folded_input {
  using value_type = float;
  const float* g;
  float* e;
  std::size_t n;
  bool folded = false;
  bool nonfinite = false; ///< a non-finite x may be in the residual

  std::uint32_t key_at(std::size_t i) const { return magnitude_key(folded ? e[i] : (g[i] + e[i]) + 0.0f); }
  template <class Hit> void each_at_least(std::uint32_t thr, Hit hit) {
    if (folded) return sparse::each_at_least(e, n, thr, hit);
    folded = true;
    // Non-finite keys are hits whenever thr <= nonfinite_key; else assume some.
    nonfinite = thr > nonfinite_key;
    fold_each_at_least(g, e, n, thr, [&](std::size_t i) {
      if (magnitude_key(e[i]) >= nonfinite_key) nonfinite = true;
      hit(i);
    });
  }
  const float* values() {
    if (!folded) each_at_least(nonfinite_key, [](std::size_t) {});
    return e;
  }
  void sent(std::size_t i) { e[i] = 0.0f; }
  /// sent() stores at scattered elements of a tensor far larger than the
  /// cache: their lines are fetched ahead.
  void will_send(std::size_t i) const { __builtin_prefetch(e + i, 1, 0); }
  /// After the payload is written: non-finite residual entries become +0.
  void finish() {
    if (!nonfinite) return;
    for (std::size_t i = 0; i < n; ++i)
      if (magnitude_key(e[i]) >= nonfinite_key) e[i] = 0.0f;
  }
};

/// Largest element count a sparse payload can index (u32 indices).
inline constexpr std::uint64_t max_count = std::uint64_t{1} << 32;

/// Rejects an error-feedback encode whose residual is not the input's length.
inline void check_feedback_sizes(std::size_t n, std::size_t residual, const char* op) {
  wire::check(residual == n, op,
              "error-feedback residual of " + std::to_string(residual) + " elements for a tensor of " +
                  std::to_string(n));
}

/// Body bytes of k entries of T.
template <class T> constexpr std::size_t body_bytes(std::size_t k) {
  return k * (sizeof(std::uint32_t) + sizeof(T));
}

/// Stores entry j of a body holding k entries.
template <class T>
GRADSYNC_HD inline void put(std::byte* body, std::size_t k, std::size_t j, std::uint32_t index,
                            T value) {
  wire::store<std::uint32_t>(body + 4 * j, index);
  wire::store<T>(body + 4 * k + sizeof(T) * j, value);
}

/// Rejects an encode input too long for u32 indices.
inline void check_count(std::size_t n, const char* op) {
  wire::check(n <= max_count, op,
              "tensor of " + std::to_string(n) + " elements: sparse payloads index at most 2^32");
}

// ---------------------------------------------------------------------------
// Exact selection of the k largest keys: MSD radix select over the 31-bit key
// in three digits ([30..20], [19..10], [9..0]). Each digit costs one counting
// pass restricted to keys that share the prefix found so far; a final pass
// emits in source order, so the output is sorted by index for free and the
// tie rule (lower index first) falls out of that order. O(count) time,
// radix_buckets counters of workspace, no sort.

inline constexpr int radix_digits = 3;
inline constexpr int radix_shift[radix_digits + 1] = {31, 20, 10, 0};
/// Counters a radix select needs (the widest digit has 11 bits).
inline constexpr std::size_t radix_buckets = 2048;

/// Where the top k stop: every key above `key` is in, and so are the first
/// `take_equal` keys equal to it, in source order.
struct cut {
  std::uint32_t key = 0;
  std::size_t take_equal = 0;
};

/// A radix select in progress: the digits found so far (`prefix`, under
/// `mask`) and how many keys sharing them still belong to the top k.
struct radix_state {
  std::uint32_t prefix = 0, mask = 0;
  std::size_t need = 0;
};

/// One digit `d` of a radix select: counts the keys sharing the prefix by
/// their digit d and narrows the prefix to the bucket holding the k-th key.
/// Returns how many keys share the new prefix.
template <class KeyFn>
std::size_t radix_digit(std::size_t count, KeyFn key, std::span<std::size_t> hist, int d, radix_state& st) {
  const int s = radix_shift[d + 1];
  const std::uint32_t dmask = (std::uint32_t{1} << (radix_shift[d] - s)) - 1u;
  for (std::uint32_t b = 0; b <= dmask; ++b) hist[b] = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::uint32_t kk = key(j);
    if ((kk & st.mask) == st.prefix) ++hist[(kk >> s) & dmask];
  }
  // Keys sharing the prefix number at least `need`, so the scan stops at or
  // above bucket 0 with hist[b] >= need.
  std::uint32_t b = dmask;
  while (b > 0 && hist[b] < st.need) st.need -= hist[b--];
  st.prefix |= b << s;
  st.mask |= dmask << s;
  return hist[b];
}

/// The cut of the k largest among key(0) .. key(count-1); 1 <= k <= count.
template <class KeyFn>
cut radix_select(std::size_t count, std::size_t k, KeyFn key, std::span<std::size_t> hist) {
  radix_state st{0, 0, k};
  for (int d = 0; d < radix_digits; ++d) radix_digit(count, key, hist, d, st);
  return {st.prefix, st.need};
}

/// Calls emit(j) for the keys above cut c and the first c.take_equal keys
/// equal to it, j increasing.
template <class KeyFn, class Emit> void emit_cut(std::size_t count, KeyFn key, cut c, Emit emit) {
  std::size_t equal = 0;
  for (std::size_t j = 0; j < count; ++j) {
    const std::uint32_t kk = key(j);
    if (kk > c.key || (kk == c.key && equal++ < c.take_equal)) emit(j);
  }
}

/// Calls emit(j) for the k largest keys, j increasing (k <= count).
template <class KeyFn, class Emit>
void select_top(std::size_t count, std::size_t k, KeyFn key, std::span<std::size_t> hist,
                Emit emit) {
  if (k == 0) return;
  if (k >= count) {
    for (std::size_t j = 0; j < count; ++j) emit(j);
    return;
  }
  emit_cut(count, key, radix_select(count, k, key, hist), emit);
}

/// Draws of a sampled threshold for the top k of n: enough that about
/// policy::approx_topk_sample_hits land above the target quantile, at least
/// policy::approx_topk_min_sample; 0 when that would read half the tensor
/// (then an exact select costs no more).
inline std::size_t sample_size(std::size_t n, std::size_t k) {
  if (k == 0 || k >= n) return 0;
  const double s = std::ceil(static_cast<double>(policy::approx_topk_sample_hits) * static_cast<double>(n) /
                             static_cast<double>(k));
  const double m = std::max(s, static_cast<double>(policy::approx_topk_min_sample));
  return m * 2.0 >= static_cast<double>(n) ? 0 : static_cast<std::size_t>(m);
}

/// Sample index j of a tensor of n elements (n <= 2^32): a Philox word
/// scaled into [0, n) by a 32x32 -> 64-bit multiply (no modulo bias beyond
/// 2^-32 per index).
GRADSYNC_HD inline std::size_t sample_index(const philox_stream& rng, std::size_t j, std::size_t n) {
  return static_cast<std::size_t>((static_cast<std::uint64_t>(rng.bits(j)) * n) >> 32);
}

/// A key about overshoot x k of the n magnitudes of a tensor reach: the
/// ceil(overshoot s k / n)-th largest of s = sample.size() sampled keys
/// (key_at(index(j)), index(j) < n; `sample` is scratch).
template <class KeyAt, class Index>
std::uint32_t sampled_threshold(KeyAt key_at, std::size_t n, std::size_t k, Index index,
                                std::span<std::uint32_t> sample, double overshoot) {
  const std::size_t s = sample.size();
  for (std::size_t j = 0; j < s; ++j) sample[j] = key_at(index(j));
  const double q = std::ceil(overshoot * static_cast<double>(s) * static_cast<double>(k) / static_cast<double>(n));
  const std::size_t rank = std::min(s, static_cast<std::size_t>(q)) - 1;
  std::nth_element(sample.begin(), sample.begin() + static_cast<std::ptrdiff_t>(rank), sample.end(),
                   std::greater<>{});
  return sample[rank];
}

/// Candidate slots select_top_of uses for the top k: the first digit's
/// bucket is 1/8 of an octave wide, so for the densities gradients are sent
/// at the keys reaching the k-th one's bucket number well under 4 k.
inline std::size_t candidate_slots(std::size_t k, std::size_t count) {
  return k >= count / 4 ? count : 4 * k;
}

/// Candidates of a selection, in index order: their indices and values, so
/// that the passes after the collecting one read them sequentially instead of
/// gathering from the tensor (64 MiB at 1 %: 4 passes over 218K scattered
/// elements cost 12 ms, the whole encode with the fold 23 ms).
template <class V> struct candidates {
  std::span<std::uint32_t> index;
  std::span<V> value; ///< as many slots as index
};

/// Stores (i, x_i) for every element of src with key >= thr into `c`, in
/// index order; returns how many there are (more than c holds: the rest were
/// counted, not stored).
template <class Src> std::size_t collect(Src& src, std::uint32_t thr, candidates<typename Src::value_type> c) {
  std::size_t got = 0;
  src.each_at_least(thr, [&](std::size_t i) {
    if (got < c.index.size()) {
      c.index[got] = static_cast<std::uint32_t>(i);
      c.value[got] = src.values()[i];
    }
    ++got;
  });
  return got;
}

/// emit(i, x_i) for the k largest keys among the first `count` candidates
/// of src, i increasing. The emitting pass tells src which elements come
/// next (will_send), policy::sparse_prefetch_ahead candidates ahead.
template <class Src, class Emit>
void select_top_among(Src& src, std::size_t count, std::size_t k, candidates<typename Src::value_type> c,
                      std::span<std::size_t> hist, Emit emit) {
  if (k == 0) return;
  const auto key = [&](std::size_t j) { return magnitude_key(c.value[j]); };
  const cut ct = k >= count ? cut{0, count} : radix_select(count, k, key, hist);
  std::size_t equal = 0;
  for (std::size_t j = 0; j < count; ++j) {
    if (j + policy::sparse_prefetch_ahead < count) src.will_send(c.index[j + policy::sparse_prefetch_ahead]);
    const std::uint32_t kk = key(j);
    if (kk > ct.key || (kk == ct.key && equal++ < ct.take_equal)) emit(static_cast<std::size_t>(c.index[j]), c.value[j]);
  }
}

/// emit(i, x_i) for the k largest keys of the whole tensor, i increasing.
template <class Src, class Emit>
void select_top_all(Src& src, std::size_t count, std::size_t k, std::span<std::size_t> hist, Emit emit) {
  const auto* x = src.values();
  select_top(
      count, k, [x](std::size_t i) { return magnitude_key(x[i]); }, hist, [&](std::size_t i) { emit(i, x[i]); });
}

/// select_top over the magnitudes of src's count elements (plain_input or
/// folded_input), calling emit(i, x_i), reading the tensor twice instead of
/// four times: the first digit counts every element, one collecting pass
/// gathers the candidates whose key reaches its bucket into `cand`, and the
/// other digits and the emitting pass run over those (still in index order:
/// the same selection, ties included). When they would not fit in `cand`,
/// the whole-tensor passes.
/// (gradsync-bench compress, 64 MiB at 1 %: 23 % of memcpy before, 26-34 %
/// after, docs/compression.md. Four interleaved histograms for the first
/// digit, against store-to-load stalls on the few hot counters, measured
/// slower: 27 ms against 19 for the pass.)
///
/// With a `sample` (sample_size(count, k) keys of scratch) it first tries
/// one pass: a sampled threshold aimed at policy::approx_topk_overshoot x k
/// candidates, one collecting pass, and when at least k (and at most the
/// slots) reach it, an exact select among them: the candidates hold every
/// key above the threshold, so the top k is the same set. Otherwise (a
/// sample off by more than 3 sigma) the two passes above.
/// (gradsync-bench compress, 64 MiB at 1 %: ~36 ms for the two passes.)
template <class Src, class Emit>
void select_top_of(Src& src, std::size_t count, std::size_t k, std::span<std::size_t> hist,
                   candidates<typename Src::value_type> cand, Emit emit, std::span<std::uint32_t> sample = {}) {
  if (k == 0 || k >= count) return select_top_all(src, count, k, hist, emit);
  if (!sample.empty()) {
    // Stratified: sample j at a hashed offset inside the j-th of s equal
    // strata (the selection does not depend on it, only the speed; a Philox
    // draw per sample cost 0.3 ms at 256K elements, as much as the pass).
    const std::size_t stride = count / sample.size(); // >= 2 (sample_size)
    const auto index = [stride](std::size_t j) {
      std::uint64_t z = (static_cast<std::uint64_t>(j) + 1) * 0x9e3779b97f4a7c15ull;
      z = (z ^ (z >> 29)) * 0xbf58476d1ce4e5b9ull;
      return j * stride + static_cast<std::size_t>(((z >> 32) * stride) >> 32);
    };
    const std::uint32_t thr = sampled_threshold([&](std::size_t i) { return src.key_at(i); }, count, k, index,
                                                sample, policy::approx_topk_overshoot);
    if (thr > 0) {
      const std::size_t c = collect(src, thr, cand);
      if (c >= k && c <= cand.index.size()) return select_top_among(src, c, k, cand, hist, emit);
    }
  }
  const auto* x = src.values();
  const auto key = [x](std::size_t i) { return magnitude_key(x[i]); };
  radix_state st{0, 0, k};
  const std::size_t in_bucket = radix_digit(count, key, hist, 0, st);
  const std::size_t c = (k - st.need) + in_bucket; // keys at or above the bucket
  if (c > cand.index.size()) return select_top_all(src, count, k, hist, emit);
  const std::size_t got = collect(src, st.prefix, cand);
  if (got != c) // the two passes count the same keys
    wire::fail("select_top_of", std::to_string(got) + " candidates collected, " + std::to_string(c) + " counted",
               errc::internal);
  const auto ckey = [&](std::size_t j) { return magnitude_key(cand.value[j]); };
  for (int d = 1; d < radix_digits; ++d) radix_digit(c, ckey, hist, d, st);
  emit_cut(c, ckey, cut{st.prefix, st.need}, [&](std::size_t j) { emit(cand.index[j], cand.value[j]); });
}

/// A sparsifier's encode: encode_from(plain_input) over `in`.
template <float_element T, class EncodeFrom>
std::size_t encode_plain(std::span<const T> in, const char* op, EncodeFrom encode_from) {
  check_float_range(in, op);
  plain_input<T> src{in.data(), in.size()};
  return encode_from(src);
}

/// A sparsifier's encode_feedback: encode_from(folded_input) over in +
/// residual, then the residual's non-finite entries dropped.
template <class EncodeFrom>
std::size_t encode_feedback(std::span<const float> in, std::span<float> residual, const char* op,
                            EncodeFrom encode_from) {
  check_feedback_sizes(in.size(), residual.size(), op);
  folded_input src{in.data(), residual.data(), in.size()};
  const std::size_t bytes = encode_from(src);
  src.finish();
  return bytes;
}

// ---------------------------------------------------------------------------
// Decoding.

/// Validates a body of k entries for a tensor of `count` elements: exact
/// length, indices strictly increasing and below count. Writes nothing.
template <float_element T>
void validate(std::span<const std::byte> body, std::uint64_t k, std::uint64_t count,
              const char* op) {
  wire::check_payload(k <= count, op,
                      "payload announces " + std::to_string(k) + " entries for " +
                          std::to_string(count) + " elements");
  const std::uint64_t need = wire::checked_mad(k, sizeof(std::uint32_t) + sizeof(T), 0, op);
  wire::check_payload(body.size() == need, op,
                      "body is " + std::to_string(body.size()) + " bytes, " + std::to_string(k) +
                          " entries need " + std::to_string(need));
  std::uint64_t next = 0; // smallest index the next entry may carry
  for (std::size_t j = 0; j < k; ++j) {
    const std::uint64_t i = wire::load<std::uint32_t>(body.data() + 4 * j);
    if (i < next || i >= count)
      wire::corrupt(op, "entry " + std::to_string(j) + " has index " + std::to_string(i) +
                            (i >= count ? ", outside the " + std::to_string(count) + " elements"
                                        : ", not above the previous index"));
    next = i + 1;
  }
}

/// A validated sparse body of k entries, viewed in place in its payload.
template <float_element T> struct entries {
  const std::byte* body = nullptr;
  std::size_t k = 0;

  /// Index of entry j (< k).
  std::uint32_t index(std::size_t j) const { return wire::load<std::uint32_t>(body + 4 * j); }
  /// Value of entry j (< k) as float.
  float value(std::size_t j) const { return to_float(wire::load<T>(body + 4 * k + sizeof(T) * j)); }

  /// sink(index, value as float) for every entry, indices increasing.
  template <class Sink> void each(Sink sink) const {
    const std::byte* vals = body + 4 * k;
    for (std::size_t j = 0; j < k; ++j)
      sink(wire::load<std::uint32_t>(body + 4 * j), to_float(wire::load<T>(vals + sizeof(T) * j)));
  }
};

/// Opens a sparsifier's payload (param_bytes long, entry count as u64 at
/// parameter offset k_at) for a tensor of out_count elements and validates
/// all of it; the entries can then be read any number of times.
template <float_element T>
entries<T> open(std::span<const std::byte> payload, codec_id id, std::size_t param_bytes, std::size_t k_at,
                std::size_t out_count, const char* op) {
  const wire::view v = wire::open(payload, id, dtype_traits<T>::id, param_bytes, op);
  wire::check_count(v, out_count, op);
  const std::uint64_t k = wire::load<std::uint64_t>(v.params.data() + k_at);
  validate<T>(v.body, k, v.h.count, op);
  return {v.body.data(), static_cast<std::size_t>(k)};
}

/// sparse::open for codec C (its id, parameter layout and decode op).
template <class C>
entries<typename C::value_type> open_entries(std::span<const std::byte> payload, std::size_t out_count) {
  return open<typename C::value_type>(payload, C::id, C::param_bytes, C::count_offset, out_count, C::decode_op);
}

/// Codec::decode of a sparsifier: out = the sparse tensor (zeros elsewhere).
template <float_element T> void decode_store(const entries<T>& e, std::span<T> out) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = T(0.0f);
  e.each(store_sink<T>{out.data()});
}

/// Codec::decode_accumulate of a sparsifier: acc[index] += value per entry.
template <float_element T> void decode_add(const entries<T>& e, std::span<accum_t<T>> acc) {
  e.each(accumulate_sink<T>{acc.data()});
}

} // namespace gradsync::compress::sparse
