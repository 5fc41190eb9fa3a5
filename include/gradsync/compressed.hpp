// gradsync: compressed allreduce, what a trainer calls every step on a
// gradient: a codec (compress/spec.hpp) chosen at run time, error feedback
// kept in a caller-visible per-tensor state, and the schedule that suits the
// codec's family:
//   quantizers (fp16, bf16, int8, int4, sign, terngrad, qsgd): the
//     compressed ring (algo/compressed_ring.hpp) or the two-step all-to-all
//     + allgather (algo/compressed_two_step.hpp), chosen by the model below;
//   sparse codecs (topk, approx_topk, threshold): allgather of payloads and a
//     sparse sum, dense past a measured density (algo/sparse_allgather.hpp);
//   random-k: shared indices, only the values reduced (algo/randk_allreduce.hpp);
//   PowerSGD: two factor allreduces, warm start kept (algo/powersgd_allreduce.hpp).
// Whether to compress at all can be the model's choice (compress_mode::
// automatic): from the link's calibrated alpha/beta (calibrate.hpp) and the
// codec's measured encode/decode speed and ratio (measure_codec_costs), the
// call compresses only where that is predicted faster than the best dense
// allreduce. All inputs of the decision are agreed across ranks, so every
// rank takes the same path; all ranks end with bitwise identical results.
//
//   gradsync::compression z{.codec = gradsync::compress::parse_spec("int8")};
//   gradsync::compress_state<float> st;        // one per tensor, kept across steps
//   gradsync::compressed_allreduce(comm, grad, z, st);  // grad := average, compressed
//
// Host memory only (the codecs' device kernels serve device-side callers;
// a device compressed schedule is not built yet).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "algo/compressed_ring.hpp"
#include "algo/compressed_two_step.hpp"
#include "algo/powersgd_allreduce.hpp"
#include "algo/randk_allreduce.hpp"
#include "algo/sparse_allgather.hpp"
#include "calibrate.hpp"
#include "collectives.hpp"
#include "compress/spec.hpp"
#include "core/hash.hpp"
#include "core/policy.hpp"

namespace gradsync {

/// Whether a call compresses.
enum class compress_mode {
  always,    ///< always run the codec
  automatic, ///< only where the model predicts it beats the dense allreduce
  never,     ///< dense allreduce (the codec spec is still validated)
};

/// Schedule of the quantizer family (other families have one schedule each).
enum class compressed_algorithm {
  automatic, ///< by the model
  ring,      ///< algo/compressed_ring.hpp
  two_step,  ///< algo/compressed_two_step.hpp
};

/// The path a call took.
enum class compressed_path { dense, ring, two_step, sparse, sparse_dense, randk, powersgd };

constexpr std::string_view compressed_path_name(compressed_path p) {
  switch (p) {
  case compressed_path::dense: return "dense";
  case compressed_path::ring: return "ring";
  case compressed_path::two_step: return "two_step";
  case compressed_path::sparse: return "sparse";
  case compressed_path::sparse_dense: return "sparse_dense";
  case compressed_path::randk: return "randk";
  case compressed_path::powersgd: return "powersgd";
  }
  return "?";
}

/// Measured speed of a codec on this machine: seconds per input byte to
/// encode and to decode, and payload bytes per input byte.
struct codec_costs {
  double encode = 0;
  double decode = 0;
  double ratio = 1;
};

/// What a tensor asks of compressed_allreduce.
struct compression {
  compress::spec codec = compress::parse_spec("int8");
  compress_mode mode = compress_mode::always;
  /// Error feedback (compress/error_feedback.hpp's scheme, across the reduction).
  bool error_feedback = true;
  compressed_algorithm algo = compressed_algorithm::automatic;
  /// Seed of the stochastic codecs, random-k's indices and PowerSGD's draws:
  /// the same on every rank (combine it with a tensor id for many tensors).
  std::uint64_t seed = compress::default_seed;
  /// Uncompressed bytes per ring segment (0: policy::compressed_segment_bytes).
  std::size_t segment_bytes = 0;
  std::size_t segment() const { return segment_bytes ? segment_bytes : policy::compressed_segment_bytes; }
};

namespace detail {
// Hash of everything in a compression that ranks must agree on (equal
// compressions, equal hashes; never 0, which fingerprints read as none).
inline std::uint64_t compression_hash(const compression& z) {
  std::uint64_t h = compress::spec_hash(fnv_basis, z.codec);
  h = fnv1a(h, z.mode);
  h = fnv1a(h, z.error_feedback);
  h = fnv1a(h, z.algo);
  h = fnv1a(h, z.seed);
  h = fnv1a(h, z.segment());
  return h ? h : 1;
}
} // namespace detail

/// What the last call did (for benches and logs).
struct compressed_report {
  compressed_path path = compressed_path::dense;
  std::size_t wire_bytes = 0;       ///< bytes this rank sent (dense steps by the ring's count)
  double predicted_dense = 0;       ///< model seconds of the dense allreduce (automatic decisions)
  double predicted_compressed = 0;  ///< model seconds of the compressed schedule chosen
};

/// Per-tensor state, owned by the caller and kept across steps: the error
/// feedback residual, the step counter of the noise streams, the PowerSGD
/// warm start, the codec's measured costs (measured on the first automatic
/// call when unset; all ranks measure together) and reusable scratch.
template <compress::float_element T> struct compress_state {
  std::vector<accum_t<T>> residual; ///< sized to the tensor on first use
  std::uint64_t step = 0;           ///< calls made (keys the noise of the next one)
  compress::powersgd_state powersgd{};
  std::optional<codec_costs> costs;
  compressed_report last;
  std::vector<std::byte> workspace, gathered;
  /// Forgets the residual and the warm start (e.g. after a skipped step).
  void reset() {
    residual.clear();
    powersgd = {};
  }
};

namespace detail {

// Counts the bytes the compressed schedules send (the report's wire_bytes).
template <upto_receiver C> struct counted {
  static constexpr auto name = C::name;
  C& c;
  std::size_t* sent;
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  auto isend(std::span<const std::byte> s, int peer, int tag) {
    *sent += s.size();
    return c.isend(s, peer, tag);
  }
  auto irecv(std::span<std::byte> d, int peer, int tag) { return c.irecv(d, peer, tag); }
  auto irecv_upto(std::span<std::byte> d, int peer, int tag) { return c.irecv_upto(d, peer, tag); }
  timeline* trace() const { return trace_of(c); }
};

// Gaussian-like calibration input: a sum of 4 uniforms from SplitMix64.
template <class T> void calibration_input(std::span<T> x) {
  std::uint64_t s = 0x1234;
  for (auto& v : x) {
    double u = 0;
    for (int k = 0; k < 4; ++k) {
      std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      u += static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1p-53 - 0.5;
    }
    v = static_cast<T>(static_cast<float>(u * 1.7320508));
  }
}

} // namespace detail

/// Measures codec `s` on this machine (encode and decode speed over
/// `elements` calibration values, best of `iters`) and agrees the slowest
/// rank's numbers on every rank (collective: every rank calls it).
template <compress::float_element T, transport C>
codec_costs measure_codec_costs(C& c, const compress::spec& s, std::size_t elements = std::size_t{1} << 20,
                                int iters = 3) {
  std::vector<T> x(elements), y(elements);
  detail::calibration_input(std::span<T>(x));
  double t[3] = {0, 0, 0}; // encode, decode, payload bytes
  compress::with_codec<T>(s, elements, [&](const auto& k, auto st) {
    std::vector<std::byte> ws(k.workspace_bytes(elements)), out(k.max_encoded_bytes(elements));
    std::size_t bytes = 0;
    t[0] = detail::best_seconds(c, iters, [&] { bytes = k.encode(std::span<const T>(x), st, ws, out); });
    t[1] = detail::best_seconds(c, iters, [&] { k.decode(std::span<const std::byte>(out.data(), bytes), std::span<T>(y)); });
    t[2] = static_cast<double>(bytes);
  });
  const double in_bytes = static_cast<double>(elements * sizeof(T));
  double v[3] = {t[0] / in_bytes, t[1] / in_bytes, t[2] / in_bytes};
  allreduce(c, std::span<double>(v, 3), op::max{});
  return {v[0], v[1], v[2]};
}

/// The model's prediction (seconds) of each way to allreduce `count`
/// elements of T with codec family `f` (see docs/algorithms.md).
struct compressed_prediction {
  double dense = 0, ring = 0, two_step = 0, sparse = 0, randk = 0, powersgd = 0;
};

template <compress::float_element T, transport C>
compressed_prediction predict_compressed(const C& c, std::size_t count, const compression& z, const codec_costs& k,
                                         const options& o = {}) {
  const selector& sel = detail::selector_for<C>(o);
  const topology topo = topology_of(c, o);
  const cost_model& m = sel.model();
  const int p = c.size();
  const double pf = p, n = static_cast<double>(count * sizeof(T)), q = (pf - 1) / pf;
  const auto dense_of = [&](double bytes) {
    const auto b = static_cast<std::size_t>(bytes);
    return m.allreduce(sel.choose(b, topo, o.segment()), b, topo, o.segment());
  };
  const double fb = z.error_feedback ? 1 : 0; // error feedback decodes what it encodes
  compressed_prediction r;
  r.dense = dense_of(n);
  if (p <= 1) return r;
  // The schedules' messages costed on the topology as the dense ones are
  // (cost_model's step terms), not on one flat link: the rings send to the
  // next rank, one crossing per group (the flat link's shared NIC put the
  // int8 two-step at 2x SMPI's time at 64 ranks, 1-4 MiB, and auto chose
  // dense where compressing was faster).
  const double pay = n * k.ratio;                                  // a rank's encoded tensor
  const double chain = m.gather_cost(algorithm::ring, pay, topo, false); // p - 1 steps of pay / p
  r.ring = 2 * chain + n * k.encode + (2 * q + fb) * n * k.decode;
  // two-step: every payload block in flight at once (an all-to-all), then the ring allgather.
  r.two_step = m.exchange(algorithm::scattered, pay / pf, topo, p - 1) + chain + n * (1 + 1 / pf) * k.encode +
               (1 + q + fb * (1 + 1 / pf)) * n * k.decode;
  // sparse_allgather: Bruck's 8-byte size exchange, then its rule
  // (sparse_pays): the ring of whole payloads while a rank receives at most
  // sparse_dense_ratio x a dense ring's bytes, else its own payload decoded
  // and the dense allreduce.
  const double sizes = m.gather_cost(algorithm::bruck, 8 * pf, topo, false);
  r.sparse = algo::sparse_allgather::sparse_pays((pf - 1) * pay, n, p)
                 ? sizes + m.gather_cost(algorithm::ring, pf * pay, topo, false) + n * k.encode + (pf + fb) * n * k.decode
                 : sizes + dense_of(n) + n * (k.encode + k.decode);
  const double density = z.codec.params.count("density") ? z.codec.number("density", 0.01) : 0.01;
  r.randk = dense_of(n * density) + n * (k.encode + k.decode);
  r.powersgd = 2 * dense_of(n * k.ratio / 2) + n * (k.encode + k.decode);
  return r;
}

/// Scratch bytes compressed_allreduce keeps in the state for `count`
/// elements (the quantizer schedules' size query; the others size their own).
template <compress::float_element T, transport C>
std::size_t compressed_workspace_bytes(const C& c, std::size_t count, const compression& z) {
  std::size_t bytes = 0;
  if (z.codec.family() != compress::codec_family::quantizer) return 0;
  compress::with_codec<T>(z.codec, count, [&](const auto& k, auto) {
    bytes = std::max(algo::compressed_ring::workspace_bytes(k, c.size(), count, z.segment(), z.error_feedback),
                     algo::compressed_two_step::workspace_bytes(k, c.size(), count, z.segment(), z.error_feedback));
  });
  return bytes;
}

/// Compressed allreduce in place on `data`: `data` becomes the average (op::avg,
/// the default) or sum (op::sum) over ranks of each rank's data after the
/// codec of `z`, with error feedback in `st` (one state per tensor, kept
/// across steps, same tensor size each call or the residual restarts).
/// Every rank must pass the same count and an equal `z`; all ranks end with
/// bitwise identical results. `o` sets the tag, timeout and the selector
/// (calibrate()'s) that automatic decisions and the dense steps use.
template <transport C, compress::float_element T, class Op = op::avg>
void compressed_allreduce(C& c, std::span<T> data, const compression& z, compress_state<T>& st, Op = {},
                          const options& o = {}) {
  static_assert(std::same_as<Op, op::avg> || std::same_as<Op, op::sum>,
                "compressed_allreduce reduces with op::avg or op::sum");
  static_assert(upto_receiver<C>, "compressed_allreduce needs a transport with irecv_upto (every built-in one)");
  using A = accum_t<T>;
  constexpr bool average = std::same_as<Op, op::avg>;
  const char* name = "compressed_allreduce";
  const int r = c.rank(), p = c.size();
  const scoped_timeout guard(c, o.timeout);
  detail::check_span(data, name, r, "data");
  const std::size_t n = data.size();
  const compress::codec_family family = z.codec.family();
  GRADSYNC_REQUIRE(family != compress::codec_family::sparse || n < compress::sparse::max_count, name, r,
                   std::to_string(n) + " elements: sparse payloads index at most 2^32");
  detail::check_tag(o.tag, name, r);
  call_fingerprint fp = detail::fingerprint_of<T, Op>(call_kind::compressed_allreduce, n, algorithm::automatic);
  fp.codec = detail::compression_hash(z);
  detail::run_call(c, name, fp, n * sizeof(T), o, [&] {
    options dense_o = o;
    dense_o.workspace = {};
    dense_o.verify = verification::never; // this call checked the whole call
    const auto dense = [&](auto span) { allreduce(c, span, Op{}, dense_o); };
    st.last = {};
    auto& rep = st.last;
    const std::uint64_t step = st.step++;

    // The decision: agreed inputs only (count, z, selector, agreed costs).
    bool compress = z.mode == compress_mode::always;
    compressed_path quant = z.algo == compressed_algorithm::two_step ? compressed_path::two_step : compressed_path::ring;
    if (z.mode != compress_mode::never && p > 1 &&
        (z.mode == compress_mode::automatic || (family == compress::codec_family::quantizer &&
                                                z.algo == compressed_algorithm::automatic))) {
      if (!st.costs) st.costs = measure_codec_costs<T>(c, z.codec);
      const compressed_prediction pr = predict_compressed<T>(c, n, z, *st.costs, o);
      double best = 0;
      switch (family) {
      case compress::codec_family::quantizer:
        if (z.algo == compressed_algorithm::automatic) quant = pr.two_step < pr.ring ? compressed_path::two_step : compressed_path::ring;
        best = quant == compressed_path::two_step ? pr.two_step : pr.ring;
        break;
      case compress::codec_family::sparse: best = pr.sparse; break;
      case compress::codec_family::shared_randk: best = pr.randk; break;
      case compress::codec_family::low_rank: best = pr.powersgd; break;
      }
      rep.predicted_dense = pr.dense;
      rep.predicted_compressed = best;
      if (z.mode == compress_mode::automatic) compress = best < pr.dense;
    }
    if (!compress || z.mode == compress_mode::never) {
      compress::with_codec<T>(z.codec, n, [](const auto&, auto) {}); // a bad spec fails here too
      dense(data);
      rep.path = compressed_path::dense;
      rep.wire_bytes = p > 1 ? 2 * (static_cast<std::size_t>(p) - 1) * n / static_cast<std::size_t>(p) * sizeof(T) : 0;
      return;
    }

    // Error feedback: fold the residual in; the new residual starts as the
    // rounding of that sum to T (nothing for float) and takes each encode's
    // error. (The sparse path folds in its own first pass, the quantizers'
    // segment op at each element's first read, inside the pipeline.)
    A* residual = nullptr;
    if (z.error_feedback) {
      if (st.residual.size() != n) st.residual.assign(n, A(0));
      residual = st.residual.data();
      if (family != compress::codec_family::sparse && family != compress::codec_family::quantizer)
        algo::fold_residual(data.data(), residual, n);
    }
    // Under error feedback the codecs run in their contractive form (random-k
    // unscaled, terngrad and qsgd with the error-minimising scale;
    // compress::feedback_form): the unbiased ones make the residual diverge.
    const auto form = [&](const auto& k) { return residual ? compress::feedback_form(k) : k; };
    std::size_t sent = 0;
    detail::counted<C> cc{c, &sent};
    const std::size_t dense_bytes_per_elem = p > 1 ? 2 * (static_cast<std::size_t>(p) - 1) * sizeof(T) : 0;
    const auto dense_counted = [&](auto span) {
      dense(span);
      sent += dense_bytes_per_elem * span.size() / static_cast<std::size_t>(p);
    };
    switch (family) {
    case compress::codec_family::quantizer:
      compress::with_codec<T>(z.codec, n, [&](const auto& k0, auto) {
        using K = std::remove_cvref_t<decltype(k0)>;
        if constexpr (compress::family_of<K>() == compress::codec_family::quantizer) {
          const K k = form(k0);
        const algo::compressed_ring::call<K> x{.seed = z.seed, .step = step, .average = average, .residual = residual,
                                               .fold = residual != nullptr, .seg_bytes = z.segment(), .tag = o.tag};
        const bool two = quant == compressed_path::two_step;
        const std::size_t need = two ? algo::compressed_two_step::workspace_bytes(k, p, n, z.segment(), residual != nullptr)
                                     : algo::compressed_ring::workspace_bytes(k, p, n, z.segment(), residual);
        if (st.workspace.size() < need) st.workspace.resize(need);
        const std::span<std::byte> ws(st.workspace.data(), need);
        if (two) algo::compressed_two_step::allreduce(cc, k, data.data(), n, x, ws);
        else algo::compressed_ring::allreduce(cc, k, data.data(), n, x, ws);
        rep.path = two ? compressed_path::two_step : compressed_path::ring;
        }
      });
      break;
    case compress::codec_family::sparse:
      compress::with_codec<T>(z.codec, n, [&](const auto& k, auto state) {
        if constexpr (compress::family_of<std::remove_cvref_t<decltype(k)>>() == compress::codec_family::sparse) {
        if constexpr (requires { state.step; }) {
          state.seed = algo::segment_seed(z.seed, 0);
          state.step = step;
          state.rank = static_cast<std::uint32_t>(r);
        }
        const std::size_t need = algo::sparse_allgather::workspace_bytes(k, n, p) + k.max_encoded_bytes(n) + 16;
        if (st.workspace.size() < need) st.workspace.resize(need);
        const std::span<std::byte> ws(st.workspace);
        const std::size_t payload_bytes = (k.max_encoded_bytes(n) + 15) / 16 * 16;
        const auto res = algo::sparse_allgather::allreduce(cc, k, state, data.data(), n, average, residual,
                                                           ws.first(payload_bytes), ws.subspan(payload_bytes),
                                                           st.gathered, o.tag, dense_counted);
        rep.path = res.sparse ? compressed_path::sparse : compressed_path::sparse_dense;
        }
      });
      break;
    case compress::codec_family::shared_randk:
      compress::with_codec<T>(z.codec, n, [&](const auto& k0, auto) {
        const auto k = form(k0);
        if constexpr (compress::family_of<std::remove_cvref_t<decltype(k)>>() == compress::codec_family::shared_randk) {
          const std::size_t e = k.entries(n);
          const std::size_t need = compress::workspace_piece<T>(e) + compress::workspace_piece<std::uint64_t>(e) + 32;
          if (st.workspace.size() < need) st.workspace.resize(need);
          compress::workspace_cursor cur(st.workspace, name);
          const auto values = cur.take<T>(e);
          const auto index = cur.take<std::uint64_t>(e);
          algo::randk_allreduce::allreduce(k, z.seed, step, data.data(), n, residual, values, index, dense_counted,
                                           trace_of(c));
        }
        rep.path = compressed_path::randk;
      });
      break;
    case compress::codec_family::low_rank:
      compress::with_codec<T>(z.codec, n, [&](const auto& k, auto) {
        if constexpr (compress::family_of<std::remove_cvref_t<decltype(k)>>() == compress::codec_family::low_rank) {
          if (st.powersgd.seed == 0 && st.powersgd.q.empty()) st.powersgd.seed = z.seed;
          const std::size_t floats = algo::powersgd_allreduce::scratch_floats(k.rows, k.cols, k.used_rank());
          const std::size_t need = compress::workspace_piece<float>(floats) + 16;
          if (st.workspace.size() < need) st.workspace.resize(need);
          compress::workspace_cursor cur(st.workspace, name);
          const auto f = cur.take<float>(floats);
          const auto dense_float = [&](std::span<float> s, bool avg) {
            if (avg) allreduce(c, s, op::avg{}, dense_o);
            else allreduce(c, s, op::sum{}, dense_o);
            sent += dense_bytes_per_elem / sizeof(T) * sizeof(float) * s.size() / static_cast<std::size_t>(p);
          };
          algo::powersgd_allreduce::allreduce(k, st.powersgd, data.data(), n, average, residual, f, dense_float,
                                              dense_counted, trace_of(c));
        }
        rep.path = compressed_path::powersgd;
      });
      break;
    }
    rep.wire_bytes = sent;
  });
}

} // namespace gradsync
