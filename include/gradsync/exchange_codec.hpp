// gradsync: exchanges whose blocks travel encoded. A GNN's halo features or
// an MoE layer's tokens are activations, not gradients: 16-bit floats or
// 8/4-bit blockwise integers (per-block scales) shrink the wire 2-8x at an
// error the training absorbs. run_encoded runs an exchange_plan (forwards
// or backwards), alltoall_encoded and alltoallv_encoded the one-off calls,
// with a codec of compress/spec.hpp: every block is encoded
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

// A plan block's encoded size: none for an empty block (a plan with empty
// blocks sends nothing for them, exchange_plan::sparse), else the codec's.
template <class K> std::size_t plan_wire_bytes(const K& k, std::size_t n) { return n == 0 ? 0 : k.max_encoded_bytes(n); }

} // namespace detail

/// Workspace bytes run_encoded needs on this rank (the encoded blocks out
/// and in) for `width` elements of T per item, either direction.
template <compress::float_element T>
std::size_t encoded_workspace_bytes(const exchange_plan& plan, std::size_t width, const compress::spec& codec) {
  std::size_t total = 0;
  detail::with_exchange_codec<T>(codec, "exchange_plan::run_encoded", -1, [&](const auto& k) {
    for (const std::size_t n : plan.send_counts()) total += detail::plan_wire_bytes(k, n * width);
    for (const std::size_t n : plan.recv_counts()) total += detail::plan_wire_bytes(k, n * width);
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
    for (std::size_t j = 0; j < sc.size(); ++j) out_bytes += sb[j] = detail::plan_wire_bytes(k, sc[j] * width);
    for (std::size_t j = 0; j < rc.size(); ++j) in_bytes += rb[j] = detail::plan_wire_bytes(k, rc[j] * width);
    exec::host ex;
    auto ws = ex.template scratch<std::byte>(workspace, out_bytes + in_bytes, name, r);
    const std::span<std::byte> wire_out = std::span(ws.data(), out_bytes), wire_in = std::span(ws.data() + out_bytes, in_bytes);
    typename std::decay_t<decltype(k)>::state none{};
    std::size_t at = 0;
    for (std::size_t j = 0; j < sc.size(); ++j) {
      if (sc[j] == 0) continue;
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
      if (rc[j] != 0) k.decode(wire_in.subspan(at, rb[j]), out.subspan(rd[j] * width, rc[j] * width));
      at += rb[j];
    }
  });
  return done;
}

/// Alltoallv (packed blocks, as the alltoallv overload with counts only)
/// with every block encoded by `codec` on the wire: block q of `in`
/// (send_counts[q] elements) reaches rank q as decode(encode(block)) in
/// `out` at its packed place. Pairwise, scattered or (shm) direct, as
/// alltoallv picks them; codec, dtype and the forced schedule must agree
/// on every rank (else every rank fails, errc::mismatch). Returns the bytes
/// sent. `o.workspace`: the encoded blocks out and in (the sum of the
/// codec's sizes of both count lists), or empty (allocated per call).
template <compress::float_element T, transport C>
encoded_run alltoallv_encoded(C& c, std::type_identity_t<std::span<const T>> in,
                              std::span<const std::size_t> send_counts, std::span<T> out,
                              std::span<const std::size_t> recv_counts, const compress::spec& codec,
                              const options& o = {}) {
  const char* name = "alltoallv_encoded";
  const int r = c.rank();
  const auto p = static_cast<std::size_t>(c.size());
  const scoped_timeout guard(c, o.timeout);
  const std::vector<std::size_t> sd = detail::packed(send_counts), rd = detail::packed(recv_counts);
  detail::check_alltoallv<T>(in, send_counts, sd, out, recv_counts, rd, p, o.tag, name, r);
  encoded_run done;
  detail::with_exchange_codec<T>(codec, name, r, [&](const auto& k) {
    std::vector<std::size_t> sb(p), rb(p);
    std::size_t out_bytes = 0, in_bytes = 0, largest = 0;
    for (std::size_t q = 0; q < p; ++q) {
      out_bytes += sb[q] = k.max_encoded_bytes(send_counts[q]);
      in_bytes += rb[q] = k.max_encoded_bytes(recv_counts[q]);
      largest = std::max({largest, sb[q], rb[q]});
    }
    exec::host ex;
    auto ws = ex.template scratch<std::byte>(o.workspace, out_bytes + in_bytes, name, r);
    const std::span<std::byte> wire_out(ws.data(), out_bytes), wire_in(ws.data() + out_bytes, in_bytes);
    typename std::decay_t<decltype(k)>::state none{};
    std::size_t at = 0;
    for (std::size_t q = 0; q < p; ++q) {
      k.encode(in.subspan(sd[q], send_counts[q]), none, {}, wire_out.subspan(at, sb[q]));
      at += sb[q];
      done.raw_bytes += send_counts[q] * sizeof(T);
    }
    done.sent_bytes = out_bytes;
    const std::vector<std::size_t> sbd = detail::packed(sb), rbd = detail::packed(rb);
    const algorithm a = detail::v_schedule(c, largest, o, name, true);
    const rank_groups groups = a == algorithm::hier ? detail::hier_groups(c, o, name) : rank_groups{};
    call_fingerprint f = detail::fingerprint_of<T, void>(call_kind::alltoallv, 0, a == algorithm::direct ? a : o.algo);
    f.codec = compress::spec_hash(detail::fnv_basis, codec);
    if (a == algorithm::hier) f.codec ^= detail::groups_hash(groups);
    detail::run_call(c, name, f, out_bytes, o, [&] {
      const algo::exchange::layout l{wire_out.data(), wire_in.data(), 1, sb, sbd, rb, rbd};
      if (a == algorithm::hier) algo::alltoall_hier::run_v(c, groups, l, o.tag, policy::alltoall_window, name);
      else detail::run_exchange(c, a, l, o.tag, name);
    });
    at = 0;
    for (std::size_t q = 0; q < p; ++q) {
      k.decode(wire_in.subspan(at, rb[q]), out.subspan(rd[q], recv_counts[q]));
      at += rb[q];
    }
  });
  return done;
}

/// Alltoall (equal blocks, as `alltoall`) with every block encoded by
/// `codec` on the wire: block q of `in` reaches rank q as
/// decode(encode(block)). Not in place. See alltoallv_encoded.
template <compress::float_element T, transport C>
encoded_run alltoall_encoded(C& c, std::type_identity_t<std::span<const T>> in, std::span<T> out,
                             const compress::spec& codec, const options& o = {}) {
  const auto p = static_cast<std::size_t>(c.size());
  GRADSYNC_REQUIRE(in.size() == out.size() && in.size() % p == 0, "alltoall_encoded", c.rank(),
                   "input holds " + std::to_string(in.size()) + " elements, output " + std::to_string(out.size()) +
                       " (both hold " + std::to_string(p) + " equal blocks)");
  const std::vector<std::size_t> counts(p, in.size() / p);
  return alltoallv_encoded<T>(c, in, counts, out, counts, codec, o);
}

} // namespace gradsync
