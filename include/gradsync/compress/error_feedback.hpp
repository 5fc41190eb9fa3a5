// gradsync: error feedback around any codec (Seide et al. 2014; Karimireddy
// et al. 2019, EF-SGD), with DGC momentum correction (Lin et al. 2018) as an
// option. The sender keeps the part of its gradient the codec did not
// transmit and adds it to the next one:
//
//   u  = m u + g              (momentum correction; u = g when m = 0)
//   v  = e + u                (corrected input, what is encoded)
//   e' = v - decode(encode(v))
//   u' = 0 where decode(...) != 0, if masking is on (DGC momentum factor masking)
//
// so the sum of everything decoded over T steps equals the sum of the inputs
// minus the final residual e_T, which stays bounded for a contractive codec.
// With momentum on, the transmitted values already carry momentum: the
// optimiser must not apply it again.
//
// Non-finite input (or e + u overflowing): the payload is encoded as usual
// (the inner codec's non-finite policy makes the NaN/Inf visible to the
// receiver, which is how a loss scaler learns to skip the step) but the
// residual and momentum are left untouched, so one bad step does not poison
// every later one. For half/bfloat16 the corrected value saturates at the
// largest finite value; the excess stays in the residual.
//
// The inner codec must be a contraction for e to stay bounded; the wrapper
// encodes with feedback_form(inner) (codec.hpp), the biased form of the
// unbiased stochastic codecs (random-k unscaled, terngrad and qsgd with the
// error-minimising block scale), whatever their `unbiased` flag says.
//
// The payload is the inner codec's own (same id, same wire format): receivers
// decode with the plain codec. Only the sender needs this wrapper.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "codec.hpp"

namespace gradsync::compress {

/// Per-element math of the corrected value v = e + (m u + g), in the
/// accumulation type; `mu` = m u + g is returned through `u_new`.
template <class A> GRADSYNC_HD inline A ef_corrected(A e, A u, A g, A m, A& u_new) {
  u_new = m * u + g;
  return e + u_new;
}

/// Error feedback around codec C. Models `codec` with the same payload as C.
template <codec C> struct error_feedback {
  using value_type = typename C::value_type;
  using accum = accum_t<value_type>;
  static constexpr codec_id id = C::id;
  static constexpr std::string_view name = C::name;

  /// Per-tensor state: the inner codec's state, the residual e and the
  /// momentum u (allocated on the first encode; reset() forgets both).
  struct state {
    typename C::state inner{};
    std::vector<accum> residual;
    std::vector<accum> momentum;
    void reset() {
      residual.clear();
      momentum.clear();
    }
  };

  /// The wrapped codec and its parameters (encoded in its feedback_form).
  C inner{};
  /// DGC momentum correction factor m in [0, 1); 0 is plain error feedback.
  float momentum = 0.0f;
  /// DGC momentum factor masking: clear u where a value was transmitted.
  bool mask_momentum = true;

  /// The inner codec's bound.
  std::size_t max_encoded_bytes(std::size_t n) const { return inner.max_encoded_bytes(n); }
  /// Corrected input (n of T) + decoded values (n of accum) + the inner workspace.
  std::size_t workspace_bytes(std::size_t n) const {
    return workspace_piece<value_type>(n) + workspace_piece<accum>(n) + inner.workspace_bytes(n);
  }

  /// Encodes g + residual (with momentum correction when enabled) and updates
  /// the residual from what the payload decodes to.
  std::size_t encode(std::span<const value_type> g, state& st, std::span<std::byte> ws,
                     std::span<std::byte> out) const {
    static constexpr const char* op = "encode.error_feedback";
    const std::size_t n = g.size();
    check_encode_buffers(op, out.size(), max_encoded_bytes(n), ws.size(), workspace_bytes(n));
    wire::check(momentum >= 0.0f && momentum < 1.0f, op,
                "momentum " + std::to_string(momentum) + " outside [0, 1)");
    const bool use_u = momentum != 0.0f;
    if (st.residual.empty() && n != 0) st.residual.assign(n, accum(0));
    if (use_u && st.momentum.empty() && n != 0) st.momentum.assign(n, accum(0));
    wire::check(st.residual.size() == n && (!use_u || st.momentum.size() == n), op,
                "state belongs to a tensor of " + std::to_string(st.residual.size()) +
                    " elements, input has " + std::to_string(n) + " (one state per tensor)");

    workspace_cursor cur(ws, op);
    const std::span<value_type> corrected = cur.take<value_type>(n);
    const std::span<accum> decoded = cur.take<accum>(n);
    const accum m = static_cast<accum>(momentum);
    bool all_finite = true;
    for (std::size_t i = 0; i < n; ++i) {
      const accum gi = widen(g[i]);
      accum u_new;
      const accum v = ef_corrected(st.residual[i], use_u ? st.momentum[i] : accum(0), gi, m, u_new);
      all_finite &= std::isfinite(gi) && std::isfinite(v);
      corrected[i] = narrow<value_type>(saturate(v));
    }
    const C k = feedback_form(inner);
    const std::size_t bytes = k.encode(std::span<const value_type>(corrected), st.inner, cur.rest(), out);
    if (!all_finite) return bytes; // the step will be skipped: keep e and u as they were

    for (accum& d : decoded) d = accum(0);
    inner.decode_accumulate(std::span<const std::byte>(out.first(bytes)), decoded);
    for (std::size_t i = 0; i < n; ++i) {
      accum u_new;
      const accum v = ef_corrected(st.residual[i], use_u ? st.momentum[i] : accum(0),
                                   widen(g[i]), m, u_new);
      st.residual[i] = v - decoded[i];
      if (use_u) st.momentum[i] = mask_momentum && decoded[i] != accum(0) ? accum(0) : u_new;
    }
    return bytes;
  }
  /// The inner codec's decode.
  void decode(std::span<const std::byte> payload, std::span<value_type> out) const {
    inner.decode(payload, out);
  }
  /// The inner codec's decode_accumulate.
  void decode_accumulate(std::span<const std::byte> payload, std::span<accum> acc) const {
    inner.decode_accumulate(payload, acc);
  }

private:
  /// Clamps a finite corrected value into value_type's finite range.
  static accum saturate(accum v) {
    if constexpr (std::same_as<value_type, half> || std::same_as<value_type, bfloat16>) {
      const float top = static_cast<float>(value_type::from_bits(
          std::same_as<value_type, half> ? std::uint16_t{0x7bff} : std::uint16_t{0x7f7f}));
      if (v > top) return top;
      if (v < -top) return -top;
    }
    return v;
  }
};

} // namespace gradsync::compress
