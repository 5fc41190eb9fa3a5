// gradsync: fixed-threshold sparsification (Strom, Interspeech'15): sends
// every element with |x| >= tau as sorted (index, value) pairs.
//
// The count sent depends on the data, from 0 to n, so max_encoded_bytes(n)
// covers all n (n * (4 + sizeof(T)) bytes of body, more than the dense
// tensor): size the buffer for it, or pick tau so that the expected density
// stays well below sizeof(T) / (4 + sizeof(T)). Selection compares the
// magnitude keys of sparse.hpp, so NaN and +-Inf always pass any finite tau:
// non-finite values are always sent.
//
// Parameter block (16 bytes): f32 tau, u32 zero, u64 entries sent.
// Body: the sparse body of sparse.hpp; every value has |value| >= tau.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "codec.hpp"
#include "sparse.hpp"
#include "wire.hpp"

namespace gradsync::compress {

/// True when x passes threshold tau (tau finite, >= 0): |x| >= tau, NaN included.
template <float_element T> GRADSYNC_HD inline bool threshold_keeps(T x, float tau) {
  return sparse::magnitude_key(x) >= sparse::magnitude_key(tau);
}

/// Fixed-threshold sparsifier (see the file comment). Deterministic.
template <float_element T> struct threshold {
  using value_type = T;
  using state = no_state;
  static constexpr codec_id id = codec_id::threshold;
  static constexpr std::string_view name = "threshold";
  static constexpr const char* encode_op = "encode.threshold";
  static constexpr const char* decode_op = "decode.threshold";
  static constexpr std::size_t param_bytes = 16;
  static constexpr std::size_t count_offset = 8;

  /// Magnitudes at or above tau are sent; finite and >= 0.
  float tau = 0.0f;

  /// Payload bytes for n elements: all n may pass (more than the dense tensor).
  std::size_t max_encoded_bytes(std::size_t n) const {
    return wire::header_bytes + param_bytes + sparse::body_bytes<T>(n);
  }
  /// No workspace: one pass writes the payload directly.
  std::size_t workspace_bytes(std::size_t) const { return 0; }

  /// Encodes the elements with |x| >= tau in one pass; returns payload bytes.
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
    check_content(payload);
    return sparse::open_entries<threshold>(payload, n);
  }

private:
  template <class Src> std::size_t encode_from(Src& src, std::span<std::byte> ws, std::span<std::byte> out) const {
    const std::size_t n = src.n;
    wire::check(valid_tau(tau), encode_op,
                "tau " + std::to_string(tau) + " must be finite and >= 0");
    sparse::check_count(n, encode_op);
    check_encode_buffers(encode_op, out.size(), max_encoded_bytes(n), ws.size(), 0);
    wire::writer w(out, id, dtype_traits<T>::id, n, param_bytes, encode_op);
    std::byte* body = w.body().data();
    std::size_t e = 0;
    // Values go to the slots of an n-entry body and move down once e is known.
    // (threshold_keeps(x, tau) is magnitude_key(x) >= magnitude_key(tau).)
    src.each_at_least(sparse::magnitude_key(tau), [&](std::size_t i) {
      sparse::put<T>(body, n, e++, static_cast<std::uint32_t>(i), src.values()[i]);
      src.sent(i);
    });
    if (e < n) std::memmove(body + 4 * e, body + 4 * n, sizeof(T) * e);
    wire::param_writer(w.params()).f32(tau).u32(0).u64(e);
    return w.finish(sparse::body_bytes<T>(e));
  }

  static bool valid_tau(float t) { return finite(t) && t >= 0.0f; }

  // tau valid, padding zero, and every value really passes tau. The body
  // length is checked first so the value loop stays inside the payload.
  static void check_content(std::span<const std::byte> payload) {
    const wire::view v = wire::open(payload, id, dtype_traits<T>::id, param_bytes, decode_op);
    wire::param_reader r(v.params);
    const float t = r.get<float>();
    const std::uint32_t pad = r.get<std::uint32_t>();
    const std::uint64_t e = r.get<std::uint64_t>();
    wire::check_payload(valid_tau(t), decode_op, "tau " + std::to_string(t) + " is not finite and >= 0");
    wire::check_payload(pad == 0, decode_op, "nonzero padding in the parameter block");
    sparse::validate<T>(v.body, e, v.h.count, decode_op);
    const std::byte* vals = v.body.data() + 4 * e;
    for (std::size_t j = 0; j < e; ++j)
      wire::check_payload(threshold_keeps(wire::load<T>(vals + sizeof(T) * j), t), decode_op,
                          "entry " + std::to_string(j) + " has a magnitude below tau");
  }
};

} // namespace gradsync::compress
