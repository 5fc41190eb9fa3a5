// gradsync: the codec concept every gradient compressor models, and the small
// helpers codecs share (state types, workspace carving, decode sinks).
//
// A codec is a small value type holding its parameters, templated on the
// element type T it encodes (float, double, half, bfloat16):
//
//   compress::int8<float> c{.block = 256};
//   compress::int8<float>::state st;                       // per tensor
//   std::vector<std::byte> ws(c.workspace_bytes(n));       // phase 1: sizes
//   std::vector<std::byte> out(c.max_encoded_bytes(n));
//   std::size_t bytes = c.encode(grad, st, ws, out);        // phase 2: run
//   c.decode(std::span(out).first(bytes), grad_out);        // or, in a reduction:
//   c.decode_accumulate(std::span(out).first(bytes), acc);  // acc[i] += decoded[i]
//
// Contract of the operations (every codec, host and device paths alike):
// - encode(input, state, workspace, output) -> bytes written. Requires
//   workspace.size() >= workspace_bytes(n) and output.size() >=
//   max_encoded_bytes(n), n = input.size(); otherwise gradsync::error
//   ("encode.<name>", errc::invalid_argument). The payload is a wire-format message (wire.hpp).
//   Stochastic codecs draw Philox noise keyed by (seed, step, rank, index)
//   from their state and advance state.step by one per call.
// - decode(payload, output) and decode_accumulate(payload, accumulator) need no
//   state. They validate the whole payload (header, checksum, parameters,
//   count == output.size(), body length and content) before writing anything,
//   and throw gradsync::error ("decode.<name>", rank -1, kind
//   errc::corrupt_payload) on any defect of the payload; the caller's own
//   buffers (a workspace too small) are errc::invalid_argument.
//   decode writes narrow<T>(value); decode_accumulate adds the value into an
//   accum_t<T> accumulator (float for half/bfloat16), as a reduction step needs.
// - Per-element math lives in GRADSYNC_HD inline functions in each codec's
//   header so CUDA kernels compute bit-identical results.
// - Non-finite inputs never vanish silently; see docs/compression.md.
//
// FRAMEWORK READY
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "philox.hpp"
#include "wire.hpp"

namespace gradsync::compress {

/// Element types the codecs accept (integers are not gradients).
template <class T>
concept float_element = element<T> && (std::same_as<T, float> || std::same_as<T, double> ||
                                       std::same_as<T, half> || std::same_as<T, bfloat16>);

/// State of a deterministic codec: nothing.
struct no_state {};

/// State of a stochastic codec: the noise of call number `step` is keyed by
/// (seed, step, rank, element index). Give each tensor its own seed and each
/// rank its rank so draws are independent across both.
struct stream_state {
  std::uint64_t seed = 0;
  std::uint64_t step = 0;
  std::uint32_t rank = 0;

  /// The stream of the current step, then advance to the next step.
  philox_stream next() {
    const philox_stream s{seed, static_cast<std::uint32_t>(step), rank};
    ++step;
    return s;
  }
};

/// A gradient codec over element type C::value_type (see the contract above).
template <class C>
concept codec =
    float_element<typename C::value_type> && std::default_initializable<typename C::state> &&
    requires(const C c, typename C::state& st, std::span<const typename C::value_type> in,
             std::span<typename C::value_type> out,
             std::span<accum_t<typename C::value_type>> acc, std::span<std::byte> ws,
             std::span<std::byte> buf, std::span<const std::byte> payload, std::size_t n) {
      { C::id } -> std::convertible_to<codec_id>;
      { C::name } -> std::convertible_to<std::string_view>;
      { c.max_encoded_bytes(n) } -> std::same_as<std::size_t>;
      { c.workspace_bytes(n) } -> std::same_as<std::size_t>;
      { c.encode(in, st, ws, buf) } -> std::same_as<std::size_t>;
      { c.decode(payload, out) } -> std::same_as<void>;
      { c.decode_accumulate(payload, acc) } -> std::same_as<void>;
    };

/// Optional capability of a dense codec (the block-scaled quantisers):
/// c.decode_each(payload, n, sink) validates like decode, then calls
/// sink(i, float value) once per element, i = 0 .. n-1 in order. It is the
/// loop decode and decode_accumulate share, open to a reduction that fuses
/// its own per-element work (error feedback, the running sum) into the one
/// decode pass instead of decoding into scratch and reading it back.
template <class C, class Sink>
concept decodes_each = requires(const C c, std::span<const std::byte> payload, std::size_t n, Sink sink) {
  c.decode_each(payload, n, sink);
};

/// Codec c as error feedback must run it. Feedback keeps a residual bounded
/// only for a contraction, E||x - C(x)||^2 <= (1 - delta) ||x||^2 with
/// delta > 0 (docs/compression.md); the unbiased stochastic codecs are none
/// (their variance exceeds ||x||^2), so their `unbiased` switch goes off:
/// random-k drops the n/k scaling, terngrad and qsgd store the scale that
/// minimises E||x - C(x)||^2 (blockwise.hpp). Every other codec is returned
/// as is. The payloads stay decodable by the codec as the receiver holds it.
template <class C> constexpr C feedback_form(C c) {
  if constexpr (requires { c.unbiased = false; }) c.unbiased = false;
  if constexpr (requires { c.rule.unbiased = false; }) c.rule.unbiased = false;
  return c;
}

// ---------------------------------------------------------------------------
// Workspace: one caller-owned byte span, carved into aligned typed pieces.

/// Alignment of every workspace piece (enough for 16-byte vector loads).
inline constexpr std::size_t workspace_align = 16;

/// Bytes to reserve for a piece of n elements of V: the data plus the largest
/// alignment padding the cursor may insert before it.
template <class V> constexpr std::size_t workspace_piece(std::size_t n) {
  return n == 0 ? 0 : n * sizeof(V) + workspace_align - 1;
}

/// Hands out aligned typed pieces of a workspace, in the order they were
/// planned with workspace_piece; running out means the caller passed too little.
class workspace_cursor {
public:
  workspace_cursor(std::span<std::byte> ws, const char* op) : ws_(ws), op_(op) {}
  template <class V> std::span<V> take(std::size_t n) {
    if (n == 0) return {};
    const auto base = reinterpret_cast<std::uintptr_t>(ws_.data());
    const std::size_t pad = (workspace_align - base % workspace_align) % workspace_align;
    const std::size_t need = pad + n * sizeof(V);
    wire::check(need <= ws_.size(), op_,
                "workspace too small: " + std::to_string(ws_.size()) + " bytes left, " +
                    std::to_string(need) + " needed (size it with workspace_bytes)");
    auto* p = reinterpret_cast<V*>(ws_.data() + pad);
    ws_ = ws_.subspan(need);
    return {p, n};
  }
  /// The untouched rest (for a wrapped codec's own workspace).
  std::span<std::byte> rest() const { return ws_; }

private:
  std::span<std::byte> ws_;
  const char* op_;
};

/// Rejects encode buffers smaller than the codec's size queries.
inline void check_encode_buffers(const char* op, std::size_t out_bytes, std::size_t out_need,
                                 std::size_t ws_bytes, std::size_t ws_need) {
  wire::check(out_bytes >= out_need, op,
              "output holds " + std::to_string(out_bytes) + " bytes, max_encoded_bytes is " +
                  std::to_string(out_need));
  wire::check(ws_bytes >= ws_need, op,
              "workspace holds " + std::to_string(ws_bytes) + " bytes, workspace_bytes is " +
                  std::to_string(ws_need));
}

// ---------------------------------------------------------------------------
// Decode sinks: a codec's decode loop produces (index, float value) pairs and
// the sink decides whether to store or to accumulate, so both entry points
// share one validated loop.

/// out[i] = narrow<T>(v).
template <float_element T> struct store_sink {
  T* out;
  GRADSYNC_HD void operator()(std::size_t i, float v) const {
    out[i] = narrow<T>(static_cast<accum_t<T>>(v));
  }
};
/// acc[i] += v in the accumulation type.
template <float_element T> struct accumulate_sink {
  accum_t<T>* acc;
  GRADSYNC_HD void operator()(std::size_t i, float v) const {
    acc[i] += static_cast<accum_t<T>>(v);
  }
};

/// Widen one element to float (the domain every codec quantises in).
template <float_element T> GRADSYNC_HD inline float to_float(T v) {
  return static_cast<float>(widen(v));
}

/// True when v is neither NaN nor infinite (bit test: safe under fast-math).
GRADSYNC_HD inline bool finite(float v) {
  return (gradsync::detail::float_bits(v) & 0x7f800000u) != 0x7f800000u;
}

// ---------------------------------------------------------------------------
// Conveniences for tests and simple callers (they allocate).

/// Codecs compute in float (scales, norms, decoded values), so a finite
/// double beyond float's range would decode as Inf or poison its block;
/// their encoders reject it instead (Inf and NaN follow the non-finite
/// policy of docs/compression.md). One pass, doubles only.
template <class T> void check_float_range(std::span<const T> in, const char* op) {
  if constexpr (std::is_same_v<T, double>) {
    for (std::size_t i = 0; i < in.size(); ++i)
      if (std::isfinite(in[i]) && !std::isfinite(static_cast<float>(in[i])))
        wire::fail(op, "element " + std::to_string(i) + " is " + std::to_string(in[i]) +
                           ": beyond the float range (|x| <= 3.4e38) in which the codec computes; scale the "
                           "gradient, or send doubles uncompressed");
  } else {
    (void)in;
    (void)op;
  }
}

/// Encodes `in` into a freshly allocated payload of exactly the written size.
template <codec C>
std::vector<std::byte> encode_to_vector(const C& c, std::span<const typename C::value_type> in,
                                        typename C::state& st) {
  std::vector<std::byte> ws(c.workspace_bytes(in.size()));
  std::vector<std::byte> out(c.max_encoded_bytes(in.size()));
  out.resize(c.encode(in, st, ws, out));
  return out;
}

/// Decodes a payload into a freshly allocated vector sized by its header
/// (after the header and checksum are validated; a count no memory holds is
/// an error, not std::bad_alloc).
template <codec C>
std::vector<typename C::value_type> decode_to_vector(const C& c,
                                                     std::span<const std::byte> payload) {
  using T = typename C::value_type;
  const std::uint64_t n = wire::count_of(payload);
  wire::check_payload(n <= std::vector<T>().max_size(), "decode.header",
                      "element count " + std::to_string(n) + " exceeds what a vector can hold");
  // Sparse payloads legitimately announce far more elements than they carry,
  // so the count cannot be bounded by the payload's size. Probe with a
  // nothrow allocation instead: a throwing one is fatal under ASan (it
  // reports out-of-memory rather than throw), this one returns null there too.
  if (n > 0) {
    void* probe = ::operator new(static_cast<std::size_t>(n) * sizeof(T), std::nothrow);
    if (probe == nullptr)
      wire::fail("decode.header",
                 "cannot allocate the " + std::to_string(n) + " elements (" + std::to_string(n * sizeof(T)) +
                     " bytes) the payload announces",
                 errc::internal);
    ::operator delete(probe);
  }
  std::vector<T> out(static_cast<std::size_t>(n));
  c.decode(payload, std::span(out));
  return out;
}

} // namespace gradsync::compress
