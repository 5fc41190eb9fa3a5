// gradsync: approximate top-k by a sampled threshold (Deep Gradient
// Compression, Lin et al., ICLR'18).
//
// Exact top-k reads the tensor once per radix digit; this codec reads it once:
//  1. draw s sample indices with Philox (seed, step, rank), s chosen so that
//     about policy::approx_topk_sample_hits samples land above the target
//     quantile; the threshold is the sample's ceil(overshoot * s * k / n)-th
//     largest magnitude, i.e. aimed a little below the true k-th largest;
//  2. one pass collects the candidates |x| >= threshold (in index order) into a
//     buffer of candidate_factor * k slots;
//  3. more candidates than k: an exact radix select among the candidates only
//     keeps the k largest; k or fewer: all are sent (the achieved density is
//     below target, which happens when the sample overestimated the threshold).
//     A candidate buffer overflow (sample far off, or massive ties such as an
//     all-zero tensor) falls back to an exact selection over the whole tensor.
// In every case the sent set is the exact top-e of the tensor for the e it
// sends (same ranking and tie rule as topk), so only the count is approximate:
// e <= k = ceil(density * n). The achieved density is reported in the state.
//
// Parameter block (16 bytes): f64 requested density, u64 entries sent.
// Body: the sparse body of sparse.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "../core/policy.hpp"
#include "codec.hpp"
#include "philox.hpp"
#include "sparse.hpp"
#include "wire.hpp"

namespace gradsync::compress {

/// Per-tensor state of approx_topk: the Philox key of the sample and what the
/// last call achieved.
struct approx_topk_state {
  std::uint64_t seed = 0;
  std::uint64_t step = 0; ///< advanced by one per encode
  std::uint32_t rank = 0;
  std::size_t sent = 0;          ///< entries of the last payload
  double achieved_density = 0.0; ///< sent / n of the last call (0 for n = 0)
  std::uint64_t fallbacks = 0;   ///< calls that needed an exact whole-tensor select
};

/// Sample index j of a tensor of n elements (sparse::sample_index).
GRADSYNC_HD inline std::size_t approx_topk_sample_index(const philox_stream& rng, std::size_t j,
                                                        std::size_t n) {
  return sparse::sample_index(rng, j, n);
}

/// Approximate top-k codec (see the file comment).
template <float_element T> struct approx_topk {
  using value_type = T;
  using state = approx_topk_state;
  static constexpr codec_id id = codec_id::approx_topk;
  static constexpr std::string_view name = "approx_topk";
  static constexpr const char* encode_op = "encode.approx_topk";
  static constexpr const char* decode_op = "decode.approx_topk";
  static constexpr std::size_t param_bytes = 16;
  static constexpr std::size_t count_offset = 8;

  /// Target fraction of elements sent, in [0, 1].
  double density = 0.01;

  /// Target entries for n elements: ceil(density * n), at most n (0 for a
  /// density that is not positive, NaN included; encode rejects those).
  static std::size_t target(double density, std::size_t n) {
    if (!(density > 0.0)) return 0;
    const double k = std::ceil(density * static_cast<double>(n));
    return k >= static_cast<double>(n) ? n : static_cast<std::size_t>(k);
  }
  /// Sample size for n elements and target k; 0 selects the exact path (when
  /// sampling would read half the tensor anyway).
  static std::size_t sample_size(std::size_t n, std::size_t k) { return sparse::sample_size(n, k); }
  /// Candidate slots for target k.
  static std::size_t candidate_slots(std::size_t k) {
    return static_cast<std::size_t>(
        std::ceil(policy::approx_topk_candidate_factor * static_cast<double>(k)));
  }

  /// Payload bytes for n elements: target(density, n) entries at most.
  std::size_t max_encoded_bytes(std::size_t n) const {
    return wire::header_bytes + param_bytes + sparse::body_bytes<T>(target(density, n));
  }

  /// Sample keys, candidate indices and values, and radix counters.
  std::size_t workspace_bytes(std::size_t n) const {
    const std::size_t k = target(density, n), s = sample_size(n, k);
    if (k == 0 || k == n) return 0;
    if (s == 0) return workspace_piece<std::size_t>(sparse::radix_buckets);
    return workspace_piece<std::uint32_t>(s) + workspace_piece<std::uint32_t>(candidate_slots(k)) +
           workspace_piece<T>(candidate_slots(k)) + workspace_piece<std::size_t>(sparse::radix_buckets);
  }

  /// Encodes about density * n of the largest magnitudes; records the result in `st`.
  std::size_t encode(std::span<const T> in, state& st, std::span<std::byte> ws,
                     std::span<std::byte> out) const {
    return sparse::encode_plain(in, encode_op, [&](auto& src) { return encode_from(src, st, ws, out); });
  }

  /// Error-feedback encode in one pass over the tensor (sparse::folded_input):
  /// encodes x = in + residual and leaves residual = x - decode(payload),
  /// non-finite parts dropped; returns payload bytes.
  std::size_t encode_feedback(std::span<const T> in, std::span<T> residual, state& st, std::span<std::byte> ws,
                              std::span<std::byte> out) const
    requires std::same_as<T, float>
  {
    return sparse::encode_feedback(in, residual, encode_op, [&](auto& src) { return encode_from(src, st, ws, out); });
  }

  /// out = the sparse tensor of `payload` (zeros off the sent indices).
  void decode(std::span<const std::byte> payload, std::span<T> out) const {
    sparse::decode_store(open_entries(payload, out.size()), out);
  }
  /// acc[i] += value for every sent entry.
  void decode_accumulate(std::span<const std::byte> payload, std::span<accum_t<T>> acc) const {
    sparse::decode_add(open_entries(payload, acc.size()), acc);
  }
  /// The validated entries of `payload` for a tensor of n elements, read in
  /// place (sparse::entries): what a sparse reduction visits more than once.
  sparse::entries<T> open_entries(std::span<const std::byte> payload, std::size_t n) const {
    check_params(payload);
    return sparse::open_entries<approx_topk>(payload, n);
  }

private:
  template <class Src>
  std::size_t encode_from(Src& src, state& st, std::span<std::byte> ws, std::span<std::byte> out) const {
    const std::size_t n = src.n;
    wire::check(density >= 0.0 && density <= 1.0, encode_op,
                "density " + std::to_string(density) + " is outside [0, 1]");
    sparse::check_count(n, encode_op);
    check_encode_buffers(encode_op, out.size(), max_encoded_bytes(n), ws.size(),
                         workspace_bytes(n));
    stream_state ss{st.seed, st.step, st.rank};
    const philox_stream rng = ss.next();
    st.step = ss.step;

    const std::size_t k = target(density, n), s = sample_size(n, k);
    wire::writer w(out, id, dtype_traits<T>::id, n, param_bytes, encode_op);
    std::byte* body = w.body().data();
    workspace_cursor cur(ws, encode_op);
    // The body is written with a stride of k entries and compacted at the end
    // when fewer are sent, so entries can stream out as they are selected.
    std::size_t e = 0;
    const auto emit = [&](std::size_t i, T v) {
      sparse::put<T>(body, k, e++, static_cast<std::uint32_t>(i), v);
      src.sent(i);
    };
    if (s == 0) {
      const auto hist = cur.take<std::size_t>(k == 0 || k == n ? 0 : sparse::radix_buckets);
      sparse::select_top_all(src, n, k, hist, emit);
    } else {
      const auto sample = cur.take<std::uint32_t>(s);
      const sparse::candidates<T> cand{cur.take<std::uint32_t>(candidate_slots(k)), cur.take<T>(candidate_slots(k))};
      const auto hist = cur.take<std::size_t>(sparse::radix_buckets);
      const std::uint32_t thr = sparse::sampled_threshold(
          [&](std::size_t i) { return src.key_at(i); }, n, k,
          [&](std::size_t j) { return approx_topk_sample_index(rng, j, n); }, sample, policy::approx_topk_overshoot);
      const std::size_t c = sparse::collect(src, thr, cand);
      if (c > cand.index.size()) {
        ++st.fallbacks;
        sparse::select_top_all(src, n, k, hist, emit);
      } else {
        sparse::select_top_among(src, c, k, cand, hist, emit);
      }
    }
    if (e < k) // compact: values move up against the e indices
      std::memmove(body + 4 * e, body + 4 * k, sizeof(T) * e);
    wire::param_writer(w.params()).f64(density).u64(e);
    st.sent = e;
    st.achieved_density = n == 0 ? 0.0 : static_cast<double>(e) / static_cast<double>(n);
    return w.finish(sparse::body_bytes<T>(e));
  }

  // The requested density must be a valid one and the entry count within its target.
  static void check_params(std::span<const std::byte> payload) {
    const wire::view v = wire::open(payload, id, dtype_traits<T>::id, param_bytes, decode_op);
    wire::param_reader r(v.params);
    const double d = r.get<double>();
    const std::uint64_t e = r.get<std::uint64_t>();
    wire::check_payload(d >= 0.0 && d <= 1.0, decode_op,
                        "requested density " + std::to_string(d) + " is outside [0, 1]");
    const double limit = std::ceil(d * static_cast<double>(v.h.count));
    wire::check_payload(static_cast<double>(e) <= limit, decode_op,
                        std::to_string(e) + " entries exceed the density target " +
                            std::to_string(limit));
  }
};

} // namespace gradsync::compress
