// gradsync: random-k sparsification (Stich et al., NeurIPS'18) whose indices
// are never sent: both sides derive them from Philox under (seed, step, key),
// so the payload carries only the k values and the decoder regenerates where
// they go. By default the decoder scales by n/k, so the decoded tensor is an
// unbiased estimate of the input: E[decoded_i] = x_i. Under error feedback use
// unbiased = false (no scaling): the scaled compressor is not contractive
// (||x - C(x)|| can exceed ||x||), and its residual grows without bound, while
// the unscaled one satisfies ||x - C(x)||^2 <= ||x||^2 and E = (1 - k/n) ||x||^2.
//
// Index set: entry j (j < k) goes to perm(j), where perm is a keyed
// pseudo-random bijection of [0, n): a 4-round Feistel network (round keys
// and offset drawn with Philox) on the smallest power-of-two domain >= n,
// cycle-walked back into [0, n), then rotated by a uniform offset. The k indices are distinct by construction, each is
// computed on its own (one GPU thread per entry), and the rotation makes
// P(i selected) = k/n exactly for every i, which is what unbiasedness needs.
//
// Shared indices (default): the Philox key ignores the rank, so every rank
// with the same seed and step picks the same k indices. Then the payload
// values of all ranks line up and a collective may allreduce the k values
// directly (k * sizeof(T) bytes per rank) and decode the sum once.
// shared_indices = false keys the draw with the rank (independent masks).
//
// Non-finite input: a tensor holding any NaN or Inf is sent "poisoned"
// (flag set, values zero) and decodes to NaN in every element, like a
// poisoned block of the quantisers (docs/compression.md).
//
// Parameter block (32 bytes): u64 k, u64 seed, u32 step, u32 rank key
// (0xffffffff when shared), u32 flags (bit 0: poisoned, bit 1: unscaled),
// u32 zero.
// Body: k values of T, unscaled, in entry order; all zero when poisoned.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "../core/config.hpp"
#include "codec.hpp"
#include "philox.hpp"
#include "wire.hpp"

namespace gradsync::compress {

/// Keyed pseudo-random bijection of [0, n) (see the file comment). Built per
/// thread on a device: the constructor costs three Philox blocks, each image
/// a few 64-bit multiplies.
struct random_permutation {
  std::uint64_t n = 0;
  std::uint64_t rot = 0;                  // uniform offset in [0, n)
  std::uint64_t key[4] = {};              // Feistel round keys
  std::uint32_t hi_bits = 0, lo_bits = 0; // Feistel halves of the 2^b domain

  /// Philox block index of the permutation's draws in its stream.
  static constexpr std::uint64_t first_block = std::uint64_t{1} << 60;

  GRADSYNC_HD random_permutation(const philox_stream& s, std::uint64_t count) : n(count) {
    std::uint32_t b = 0;
    while (b < 64 && (std::uint64_t{1} << b) < n) ++b;
    hi_bits = (b + 1) / 2;
    lo_bits = b / 2;
    std::uint64_t w[6];
    for (int blk = 0; blk < 3; ++blk) {
      const philox_block r = s.block(first_block + static_cast<std::uint64_t>(blk));
      w[2 * blk] = (static_cast<std::uint64_t>(r.x[1]) << 32) | r.x[0];
      w[2 * blk + 1] = (static_cast<std::uint64_t>(r.x[3]) << 32) | r.x[2];
    }
    rot = n == 0 ? 0 : w[0] % n; // bias <= n / 2^64
    for (int round = 0; round < 4; ++round) key[round] = w[1 + round];
  }

  /// One pass of the unbalanced Feistel network over [0, 2^b): (L, R) ->
  /// (R, L xor F_round(R)), the halves swapping widths each round; four
  /// rounds bring them back. F_round(R) = mix64(R xor key[round]), the
  /// SplitMix64 finaliser under a Philox round key.
  GRADSYNC_HD std::uint64_t feistel(std::uint64_t x) const {
    std::uint32_t a = hi_bits, c = lo_bits; // widths of L and R
    std::uint64_t l = x >> c, r = x & ((std::uint64_t{1} << c) - 1u);
    for (int round = 0; round < 4; ++round) {
      const std::uint64_t f = wire::mix64(r ^ key[round]) & ((std::uint64_t{1} << a) - 1u);
      const std::uint64_t next_r = l ^ f;
      l = r;
      r = next_r;
      const std::uint32_t t = a;
      a = c;
      c = t;
    }
    return (l << c) | r;
  }

  /// Image of j < n. Cycle-walking needs under two Feistel passes on average
  /// (the domain is below 2n).
  GRADSYNC_HD std::uint64_t operator()(std::uint64_t j) const {
    std::uint64_t x = j;
    do x = feistel(x);
    while (x >= n);
    x += rot;
    return x >= n ? x - n : x;
  }
};

/// Philox rank key of the index draw: one key for all ranks when shared.
inline constexpr std::uint32_t randomk_shared_key = 0xffffffffu;

/// Random-k codec (see the file comment). State: seed, step, rank.
template <float_element T> struct randomk {
  using value_type = T;
  using state = stream_state;
  static constexpr codec_id id = codec_id::randomk;
  static constexpr std::string_view name = "randomk";
  static constexpr const char* encode_op = "encode.randomk";
  static constexpr const char* decode_op = "decode.randomk";
  static constexpr std::size_t param_bytes = 32;
  static constexpr std::uint32_t flag_poisoned = 1u, flag_unscaled = 2u;

  /// Entries sent per call (a tensor with fewer elements is sent whole).
  std::size_t k = 0;
  /// All ranks draw the same indices (so values can be allreduced directly).
  bool shared_indices = true;
  /// Scale by n/k on decode (unbiased); false for use under error feedback.
  bool unbiased = true;

  /// Entries a tensor of n elements is encoded with.
  std::size_t entries(std::size_t n) const { return k < n ? k : n; }
  /// Payload bytes for n elements (exact).
  std::size_t max_encoded_bytes(std::size_t n) const {
    return wire::header_bytes + param_bytes + sizeof(T) * entries(n);
  }
  /// No workspace: indices are computed, not stored.
  std::size_t workspace_bytes(std::size_t) const { return 0; }

  /// The index permutation a payload of (seed, step, key) uses for n elements.
  static random_permutation permutation(std::uint64_t seed, std::uint32_t step,
                                        std::uint32_t key, std::uint64_t n) {
    return random_permutation(philox_stream{seed, step, key}, n);
  }

  /// Sends in[perm(j)] for j < entries(n); advances st.step.
  std::size_t encode(std::span<const T> in, state& st, std::span<std::byte> ws,
                     std::span<std::byte> out) const {
    check_float_range(in, encode_op);
    const std::size_t n = in.size();
    check_encode_buffers(encode_op, out.size(), max_encoded_bytes(n), ws.size(), 0);
    const std::size_t e = entries(n);
    const std::uint32_t key = shared_indices ? randomk_shared_key : st.rank;
    wire::check(shared_indices || st.rank != randomk_shared_key, encode_op,
                "rank 0xffffffff is reserved for shared indices");
    const auto step = static_cast<std::uint32_t>(st.step);
    ++st.step;
    std::uint32_t top = 0; // largest exponent field: all ones only for NaN/Inf (vectorises)
    for (std::size_t i = 0; i < n; ++i)
      top = std::max(top, gradsync::detail::float_bits(to_float(in[i])) & 0x7f800000u);
    const bool poisoned = top == 0x7f800000u;
    const std::uint32_t flags = (poisoned ? flag_poisoned : 0u) | (unbiased ? 0u : flag_unscaled);
    wire::writer w(out, id, dtype_traits<T>::id, n, param_bytes, encode_op);
    wire::param_writer(w.params())
        .u64(e)
        .u64(st.seed)
        .u32(step)
        .u32(key)
        .u32(flags)
        .u32(0);
    std::byte* body = w.body().data();
    const random_permutation perm = permutation(st.seed, step, key, n);
    for (std::size_t j = 0; j < e; ++j)
      wire::store<T>(body + sizeof(T) * j, poisoned ? T(0.0f) : in[perm(j)]);
    return w.finish(sizeof(T) * e);
  }

  /// out = value (times n/k when unbiased) at every drawn index, zero
  /// elsewhere; NaN everywhere if poisoned.
  void decode(std::span<const std::byte> payload, std::span<T> out) const {
    run(payload, out.size(), store_sink<T>{out.data()}, out.data());
  }
  /// acc[index] += value (times n/k when unbiased); NaN into every element
  /// if poisoned.
  void decode_accumulate(std::span<const std::byte> payload, std::span<accum_t<T>> acc) const {
    run(payload, acc.size(), accumulate_sink<T>{acc.data()}, static_cast<T*>(nullptr));
  }

private:
  // Validates the whole payload, then zeroes `zero` (decode only) and feeds
  // (index, scaled value) pairs to `sink`.
  template <class Sink>
  static void run(std::span<const std::byte> payload, std::size_t out_count, Sink sink, T* zero) {
    const wire::view v = wire::open(payload, id, dtype_traits<T>::id, param_bytes, decode_op);
    wire::check_count(v, out_count, decode_op);
    wire::param_reader r(v.params);
    const auto e = r.get<std::uint64_t>();
    const auto seed = r.get<std::uint64_t>();
    const auto step = r.get<std::uint32_t>();
    const auto key = r.get<std::uint32_t>();
    const auto flags = r.get<std::uint32_t>();
    const auto pad = r.get<std::uint32_t>();
    wire::check_payload(e <= v.h.count, decode_op,
                        std::to_string(e) + " entries for " + std::to_string(v.h.count) + " elements");
    wire::check_payload(flags <= (flag_poisoned | flag_unscaled) && pad == 0, decode_op,
                        "unknown flags or nonzero padding");
    wire::check_body(v, wire::checked_mad(e, sizeof(T), 0, decode_op), decode_op);
    const bool poisoned = (flags & flag_poisoned) != 0;
    const std::byte* body = v.body.data();
    for (std::size_t j = 0; j < e; ++j) {
      const T x = wire::load<T>(body + sizeof(T) * j);
      if (poisoned ? !is_zero(x) : !finite(to_float(x)))
        wire::corrupt(decode_op, "entry " + std::to_string(j) +
                                     (poisoned ? " is nonzero in a poisoned payload"
                                               : " is not finite in an unpoisoned payload"));
    }
    if (zero != nullptr)
      for (std::size_t i = 0; i < out_count; ++i) zero[i] = T(0.0f);
    if (poisoned) {
      for (std::size_t i = 0; i < out_count; ++i) sink(i, std::numeric_limits<float>::quiet_NaN());
      return;
    }
    if (e == 0) return;
    const float scale = (flags & flag_unscaled) != 0
                            ? 1.0f
                            : static_cast<float>(static_cast<double>(v.h.count) /
                                                 static_cast<double>(e));
    const random_permutation perm = permutation(seed, step, key, v.h.count);
    for (std::size_t j = 0; j < e; ++j)
      sink(static_cast<std::size_t>(perm(j)), scale * to_float(wire::load<T>(body + sizeof(T) * j)));
  }

  static bool is_zero(T x) {
    const float f = to_float(x);
    return f == 0.0f && !std::signbit(f);
  }
};

} // namespace gradsync::compress
