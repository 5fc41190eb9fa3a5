// gradsync: exchanges whose blocks travel encoded. A GNN's halo features or
// an MoE layer's tokens are activations, not gradients: 16-bit floats or
// 8/4-bit blockwise integers (per-block scales) shrink the wire 2-8x at an
// error the training absorbs. run_encoded runs an exchange_plan (forwards
// or backwards) with a codec of compress/spec.hpp: every block is encoded
// on its own by its sender, travels as one self-describing wire message,
// and is validated and decoded by its receiver, so what arrives from rank q
// is exactly decode(encode(q's block)), on every transport and schedule.
//
// Only deterministic codecs whose payload size is a function of the element
// count qualify (fp16, bf16, int8, int4, sign): both ends of an edge must
// know its size, and a stochastic codec's noise would need a state per
// call. fp16 and bf16 are exact for values they represent.
//
//   const auto codec = compress::parse_spec("int8:block=64");
//   encoded_run e = run_encoded<double>(plan, comm, rows, halo, width, codec);
//   // e.sent_bytes on the wire, e.raw_bytes without the codec
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "alltoall.hpp"
#include "compress/spec.hpp"
#include "core/hash.hpp"
#include "exec/host.hpp"

namespace gradsync {

/// What one encoded exchange moved from this rank.
struct encoded_run {
  std::size_t sent_bytes = 0; ///< encoded payloads sent (headers and scales included)
  std::size_t raw_bytes = 0;  ///< the same blocks unencoded
};

namespace detail {

// Calls f(codec) with the codec `s` names for T when it can encode an
// exchange (deterministic, data-independent size); else a clear error.
template <compress::float_element T, class F>
void with_exchange_codec(const compress::spec& s, const char* op, int rank, F&& f) {
  compress::with_codec<T>(s, 1, [&](const auto& k, auto state) {
    using K = std::decay_t<decltype(k)>;
    if constexpr (compress::family_of<K>() != compress::codec_family::quantizer) {
      throw error(errc::invalid_argument, op, rank, -1,
                  "codec '" + s.text + "' cannot encode an exchange: its payload size depends on the data "
                  "(fp16, bf16, int8, int4, sign can)");
    } else if constexpr (!std::is_same_v<decltype(state), compress::no_state>) {
      throw error(errc::invalid_argument, op, rank, -1,
                  "codec '" + s.text + "' cannot encode an exchange: it is stochastic and its noise needs a "
                  "state per call (fp16, bf16, int8, int4, sign can)");
    } else {
      f(k);
    }
  });
}

} // namespace detail

/// Workspace bytes run_encoded needs on this rank (the encoded blocks out
/// and in) for `width` elements of T per item, either direction.
template <compress::float_element T>
std::size_t encoded_workspace_bytes(const exchange_plan& plan, std::size_t width, const compress::spec& codec) {
  std::size_t total = 0;
  detail::with_exchange_codec<T>(codec, "exchange_plan::run_encoded", -1, [&](const auto& k) {
    for (const std::size_t n : plan.send_counts()) total += k.max_encoded_bytes(n * width);
    for (const std::size_t n : plan.recv_counts()) total += k.max_encoded_bytes(n * width);
  });
  return total;
}

/// Runs `plan` forwards (back: false; `in` holds send_items() x width
/// elements, `out` receives recv_items() x width) or backwards (the roles
/// swap) with every block encoded by `codec`. The block from each peer is
/// decode(encode(block)); codec, dtype and width must agree on every rank
/// (else every rank fails with errc::mismatch); a payload damaged on the
/// way fails its receiver (errc::corrupt_payload). `workspace`:
/// encoded_workspace_bytes or more, or empty (allocated per call).
template <compress::float_element T, transport C>
encoded_run run_encoded(const exchange_plan& plan, C& c, std::type_identity_t<std::span<const T>> in,
                        std::span<T> out, std::size_t width, const compress::spec& codec, bool back = false,
                        std::span<std::byte> workspace = {}) {
  const char* name = "exchange_plan::run_encoded";
  const int r = c.rank();
  GRADSYNC_REQUIRE(width >= 1, name, r, "width must be >= 1");
  detail::check_span(in, name, r, "input");
  detail::check_span(out, name, r, "output");
  const auto sc = back ? plan.recv_counts() : plan.send_counts();
  const auto sd = back ? plan.recv_displs() : plan.send_displs();
  const auto rc = back ? plan.send_counts() : plan.recv_counts();
  const auto rd = back ? plan.send_displs() : plan.recv_displs();
  const std::size_t need_in = detail::mul_checked(back ? plan.recv_items() : plan.send_items(), width, name, r);
  const std::size_t need_out = detail::mul_checked(back ? plan.send_items() : plan.recv_items(), width, name, r);
  GRADSYNC_REQUIRE(in.size() >= need_in && out.size() >= need_out, name, r,
                   "input holds " + std::to_string(in.size()) + " elements (needs " + std::to_string(need_in) +
                       "), output " + std::to_string(out.size()) + " (needs " + std::to_string(need_out) + ")");
  GRADSYNC_REQUIRE(!detail::overlaps(in, out), name, r, "input and output overlap (the exchange is not in place)");
  encoded_run done;
  detail::with_exchange_codec<T>(codec, name, r, [&](const auto& k) {
    std::vector<std::size_t> sb(sc.size()), rb(rc.size());
    std::size_t out_bytes = 0, in_bytes = 0;
    for (std::size_t j = 0; j < sc.size(); ++j) out_bytes += sb[j] = k.max_encoded_bytes(sc[j] * width);
    for (std::size_t j = 0; j < rc.size(); ++j) in_bytes += rb[j] = k.max_encoded_bytes(rc[j] * width);
    exec::host ex;
    auto ws = ex.template scratch<std::byte>(workspace, out_bytes + in_bytes, name, r);
    const std::span<std::byte> wire_out = std::span(ws.data(), out_bytes), wire_in = std::span(ws.data() + out_bytes, in_bytes);
    typename std::decay_t<decltype(k)>::state none{};
    std::size_t at = 0;
    for (std::size_t j = 0; j < sc.size(); ++j) {
      const std::size_t n = k.encode(in.subspan(sd[j] * width, sc[j] * width), none, {}, wire_out.subspan(at, sb[j]));
      GRADSYNC_REQUIRE(n == sb[j], name, r,
                       "codec '" + codec.text + "' wrote " + std::to_string(n) + " bytes where " +
                           std::to_string(sb[j]) + " were announced");
      at += n;
      done.raw_bytes += sc[j] * width * sizeof(T);
    }
    done.sent_bytes = out_bytes;
    plan.run_bytes(c, wire_out, sb, wire_in, rb, back, k.max_encoded_bytes(plan.largest_items() * width),
                   dtype_traits<T>::id, compress::spec_hash(detail::fnv_basis, codec));
    at = 0;
    for (std::size_t j = 0; j < rc.size(); ++j) {
      k.decode(wire_in.subspan(at, rb[j]), out.subspan(rd[j] * width, rc[j] * width));
      at += rb[j];
    }
  });
  return done;
}

} // namespace gradsync
