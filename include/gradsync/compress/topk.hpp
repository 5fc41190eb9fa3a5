// gradsync: exact top-k sparsification by magnitude.
//
// Keeps the k elements of largest |x| and sends them as sorted (index, value)
// pairs; the decoder scatters them into a zero tensor. Ties are broken by the
// lower index (sparse.hpp's ranking rule), so the selection is a pure function
// of the input: every rank, run and device path picks the same set. NaN and
// Inf rank above every finite magnitude and are sent first.
//
// Host path: MSD radix select on the magnitude bits, not a sort, over the
// candidates one pass collects above a sampled threshold; should the sample
// miss, one counting pass for the first digit, one collecting the candidates
// that reach its bucket, the rest over those (sparse::select_top_of); O(n),
// 16 KiB of counters, 4 k candidate indices and values and 128 n / k sampled
// keys of workspace.
//
// Parameter block (8 bytes): u64 entries sent (min(k, count)).
// Body: the sparse body of sparse.hpp.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "codec.hpp"
#include "sparse.hpp"
#include "wire.hpp"

namespace gradsync::compress {

/// Exact top-k codec (see the file comment). Deterministic: state is empty.
template <float_element T> struct topk {
  using value_type = T;
  using state = no_state;
  static constexpr codec_id id = codec_id::topk;
  static constexpr std::string_view name = "topk";
  static constexpr const char* encode_op = "encode.topk";
  static constexpr const char* decode_op = "decode.topk";
  static constexpr std::size_t param_bytes = 8;
  static constexpr std::size_t count_offset = 0;

  /// Entries kept per call; a tensor with fewer elements is sent whole.
  std::size_t k = 0;

  /// Entries a tensor of n elements is encoded with.
  std::size_t entries(std::size_t n) const { return k < n ? k : n; }

  /// Payload bytes for n elements (exact: top-k always sends entries(n)).
  std::size_t max_encoded_bytes(std::size_t n) const {
    return wire::header_bytes + param_bytes + sparse::body_bytes<T>(entries(n));
  }

  /// Workspace bytes for n elements: the radix counters and candidate
  /// indices and values, when a selection runs.
  std::size_t workspace_bytes(std::size_t n) const {
    const std::size_t e = entries(n);
    return e == 0 || e == n ? 0
                            : workspace_piece<std::size_t>(sparse::radix_buckets) +
                                  workspace_piece<std::uint32_t>(sparse::candidate_slots(e, n)) +
                                  workspace_piece<T>(sparse::candidate_slots(e, n)) +
                                  workspace_piece<std::uint32_t>(sparse::sample_size(n, e));
  }

  /// Encodes the entries(n) largest magnitudes of `in`; returns payload bytes.
  std::size_t encode(std::span<const T> in, state&, std::span<std::byte> ws,
                     std::span<std::byte> out) const {
    return sparse::encode_plain(in, encode_op, [&](auto& src) { return encode_from(src, ws, out); });
  }

  /// Error-feedback encode in one pass over the tensor (sparse::folded_input):
  /// encodes x = in + residual and leaves residual = x - decode(payload),
  /// non-finite parts dropped; returns payload bytes.
  std::size_t encode_feedback(std::span<const T> in, std::span<T> residual, state&, std::span<std::byte> ws,
                              std::span<std::byte> out) const
    requires std::same_as<T, float>
  {
    return sparse::encode_feedback(in, residual, encode_op, [&](auto& src) { return encode_from(src, ws, out); });
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
    return sparse::open_entries<topk>(payload, n);
  }

private:
  template <class Src> std::size_t encode_from(Src& src, std::span<std::byte> ws, std::span<std::byte> out) const {
    const std::size_t n = src.n;
    sparse::check_count(n, encode_op);
    check_encode_buffers(encode_op, out.size(), max_encoded_bytes(n), ws.size(), workspace_bytes(n));
    const std::size_t e = entries(n);
    wire::writer w(out, id, dtype_traits<T>::id, n, param_bytes, encode_op);
    wire::param_writer(w.params()).u64(e);
    workspace_cursor cur(ws, encode_op);
    const bool selects = e != 0 && e != n;
    const auto hist = cur.take<std::size_t>(selects ? sparse::radix_buckets : 0);
    const std::size_t slots = selects ? sparse::candidate_slots(e, n) : 0;
    const sparse::candidates<T> cand{cur.take<std::uint32_t>(slots), cur.take<T>(slots)};
    const auto sample = cur.take<std::uint32_t>(selects ? sparse::sample_size(n, e) : 0);
    std::byte* body = w.body().data();
    std::size_t j = 0;
    sparse::select_top_of(
        src, n, e, hist, cand,
        [&](std::size_t i, T v) {
          sparse::put<T>(body, e, j++, static_cast<std::uint32_t>(i), v);
          src.sent(i);
        },
        sample);
    return w.finish(sparse::body_bytes<T>(e));
  }
};

} // namespace gradsync::compress
