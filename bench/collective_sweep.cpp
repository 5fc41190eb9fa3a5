// gradsync-bench collectives: the timed sweep for one element type (this file
// is compiled once per type, see bench/meson.build): closed-form inputs and
// expected results, buffer shapes as nccl-tests counts them, the timed loop,
// and the checked call.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <gradsync/collectives.hpp>
#include <gradsync/compressed.hpp>

#include "collective.hpp"
#include "timing.hpp"
#include "transports.hpp"

#ifndef GRADSYNC_BENCH_ELEMENT
#error "compile once per element type with -DGRADSYNC_BENCH_ELEMENT=<type> (see bench/meson.build)"
#endif

namespace gradsync::bench::coll_bench {
namespace {

template <element T, transport C>
std::size_t workspace_bytes(const C& c, coll k, const shape& s, const options& o) {
  switch (k) {
  case coll::allreduce: return allreduce_workspace_bytes<T>(c, s.in_n, o);
  case coll::reduce_scatter: return reduce_scatter_workspace_bytes<T>(c, s.out_n, o);
  case coll::reduce: return reduce_workspace_bytes<T>(c, s.in_n, o);
  // Queries a schedule of these may add later are picked up when they exist.
  case coll::allgather:
    if constexpr (requires { allgather_workspace_bytes<T>(c, s.in_n, o); })
      return allgather_workspace_bytes<T>(c, s.in_n, o);
    break;
  case coll::broadcast:
    if constexpr (requires { broadcast_workspace_bytes<T>(c, s.in_n, o); })
      return broadcast_workspace_bytes<T>(c, s.in_n, o);
    break;
  }
  return 0;
}

// What a row ran and the calibrated model's time for it, from the library's
// public plan queries (what `automatic` resolves to is what ran).
struct prediction {
  std::string picked;           // empty for native
  std::optional<double> micros; // none: native, or the model has no formula
};

template <element T, transport C>
prediction predict(const C& c, coll k, const algo_choice& a, const options& o, const shape& s, const selector& sel) {
  if (a.native) return {};
  const std::size_t seg = o.segment();
  const cost_model& m = sel.model();
  auto us = [](double sec) { return std::isfinite(sec) ? std::optional<double>(sec * 1e6) : std::nullopt; };
  auto row = [&](algorithm x, double sec) { return prediction{std::string(algorithm_name(x)), us(sec)}; };
  switch (k) {
  case coll::allreduce: {
    const algorithm x = allreduce_algorithm<T>(c, s.in_n, o);
    return row(x, m.allreduce(x, s.bytes, topology_of(c, o), seg));
  }
  case coll::broadcast: {
    const algorithm x = broadcast_algorithm<T>(c, s.in_n, o);
    return row(x, m.rooted(x, s.bytes, topology_of(c, o), false, seg)); // ring: the pipelined chain
  }
  case coll::reduce: {
    const algorithm x = reduce_algorithm<T>(c, s.in_n, o);
    return row(x, m.rooted(x, s.bytes, topology_of(c, o), true, seg));
  }
  // s.bytes is the whole input (reduce_scatter) or output (allgather), as the model takes it.
  case coll::reduce_scatter: {
    const algorithm x = reduce_scatter_algorithm<T>(c, s.out_n, o);
    return row(x, m.scatter_gather(x, s.bytes, topology_of(c, o), true));
  }
  case coll::allgather: {
    const algorithm x = allgather_algorithm<T>(c, s.in_n, o);
    return row(x, m.scatter_gather(x, s.bytes, topology_of(c, o), false));
  }
  }
  return {};
}

#if defined(GRADSYNC_BENCH_SIM)
// The simulator build's executor for unchecked (timing) rows: no element
// work. SMPI does not simulate computation (bench/sim/run.sh), so reductions
// and copies only cost the host's time: 256 simulated ranks reducing 64 MiB
// payloads are tens of host seconds per call for nothing the table shows.
struct idle_executor : exec::host {
  template <element T, reduce_op Op> void reduce(T*, const T*, const T*, std::size_t, Op) const {}
  template <element T, reduce_op Op> void finish(T*, std::size_t, Op, int) const {}
  template <class T> void copy(T*, const T*, std::size_t) const {}
  template <element T> void axpby(T*, double, const T*, double, std::size_t) const {}
};
#endif

// One call of the collective under test, element work on `ex`.
template <transport C, element T, reduce_op Op, executor E>
void invoke(C& c, E& ex, coll k, const algo_choice& a, const options& o, T* in, T* out, const shape& s) {
  const std::span<const T> cin(in, s.in_n);
  const std::span<T> cout(out, s.out_n);
#if defined(GRADSYNC_BENCH_MPI)
  if constexpr (std::is_same_v<C, mpi::communicator>) {
    if (a.native) {
      switch (k) {
      case coll::allreduce: mpi::native::allreduce<T>(c, cin, cout, Op{}); return;
      case coll::reduce_scatter: mpi::native::reduce_scatter<T>(c, cin, cout, Op{}); return;
      case coll::allgather: mpi::native::allgather<T>(c, cin, cout); return;
      case coll::broadcast: mpi::native::broadcast<T>(c, std::span<T>(in, s.in_n), root); return;
      case coll::reduce:
        mpi::native::reduce<T>(c, cin, c.rank() == root ? cout : std::span<T>{}, root, Op{});
        return;
      }
    }
  }
#endif
  require(!a.native, "bench", c.rank(), "-a native needs the MPI transport");
  switch (k) {
  case coll::allreduce: allreduce<C, E, T, Op>(c, ex, cin, cout, Op{}, o); return;
  case coll::reduce_scatter: reduce_scatter<C, E, T, Op>(c, ex, cin, cout, Op{}, o); return;
  case coll::allgather: allgather<C, E, T>(c, ex, cin, cout, o); return;
  case coll::broadcast: broadcast<C, E, T>(c, ex, std::span<T>(in, s.in_n), root, o); return;
  case coll::reduce: reduce<C, E, T, Op>(c, ex, cin, c.rank() == root ? cout : std::span<T>{}, root, Op{}, o); return;
  }
}

// Initial contents: inputs of the closed form; broadcast's buffer holds the
// data at the root and the sentinel elsewhere.
template <element T> void fill_input(coll k, T* in, const shape& s, int r, op_kind op) {
  const op_kind gen = reduces(k) ? op : op_kind::sum;
  T pat[period];
  for (std::size_t i = 0; i < period; ++i) pat[i] = from_int<T>(input_value(r, i, gen));
  if (k == coll::broadcast && r != root) {
    std::fill_n(in, s.in_n, sentinel<T>());
    return;
  }
  for (std::size_t i = 0; i < s.in_n; ++i) in[i] = pat[i % period];
}

// Wrong elements of this rank's result after one call on poisoned output.
template <element T>
long long count_wrong(coll k, const T* in, const T* out, const shape& s, int r, int p, op_kind op) {
  auto differs = [](T got, T want) { return !(widen(got) == widen(want)); };
  long long wrong = 0;
  if (reduces(k)) {
    T want[period];
    for (std::size_t i = 0; i < period; ++i) want[i] = reduced_value<T>(p, i, op);
    std::size_t first = 0, n = s.out_n; // global index of out[0]; elements to check
    if (k == coll::reduce_scatter) first = s.out_n * static_cast<std::size_t>(r);
    if (k == coll::reduce && r != root) n = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += differs(out[i], want[(first + i) % period]);
    return wrong;
  }
  const std::size_t blk = s.in_n; // allgather: one block per rank; broadcast: the buffer
  const T* got = k == coll::allgather ? out : in;
  const int blocks = k == coll::allgather ? p : 1;
  for (int b = 0; b < blocks; ++b) {
    const int src = k == coll::allgather ? b : root;
    T want[period];
    for (std::size_t i = 0; i < period; ++i) want[i] = from_int<T>(input_value(src, i, op_kind::sum));
    const T* g = got + blk * static_cast<std::size_t>(b);
    for (std::size_t i = 0; i < blk; ++i) wrong += differs(g[i], want[i % period]);
  }
  return wrong;
}


// The shared buffer type of C's alloc_shared, or no_shared.
struct no_shared {};
template <class C> struct shared_type { using type = no_shared; };
template <class C>
  requires requires(C& c) { c.alloc_shared(std::size_t{1}); }
struct shared_type<C> { using type = decltype(std::declval<C&>().alloc_shared(std::size_t{1})); };
template <class C> using shared_of = typename shared_type<C>::type;

// Gradient-like input of the compressed rows: N(0, 1)-shaped values (a sum
// of four uniforms) hashed from (rank, index). Small integers, the closed
// form of the other rows, are all ties for top-k and flatter than any
// gradient for the quantisers' scales.
[[maybe_unused]] inline float gradient_value(int r, std::size_t i) {
  std::uint64_t z = (static_cast<std::uint64_t>(r) << 48) ^ (i * 4);
  double u = 0;
  for (int k = 0; k < 4; ++k) {
    std::uint64_t h = (z + static_cast<std::uint64_t>(k)) * 0x9e3779b97f4a7c15ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    u += static_cast<double>((h ^ (h >> 31)) >> 11) * 0x1p-53 - 0.5;
  }
  return static_cast<float>(u * 1.7320508);
}

// Compressed allreduce rows of one size: per codec, a row always compressed
// ("z:CODEC>path"), one whose compress_mode::automatic decides
// ("z:CODEC:auto>path") and one never compressed ("z:CODEC:never>dense"),
// in place on `buf` (gradient_value inputs), error
// feedback on (as trainers run it). The check: every rank's result bitwise
// equal to rank 0's (lossy results have no closed form); the relative L2
// error against the exact reduction goes to the JSON. Wire bytes: the most any rank sent. f32 only
// (every codec x transport x op is a template instance: the build time).
template <transport C, element T, reduce_op Op>
std::int64_t compressed_rows(C& c, const config& cfg, const selector& sel, report& rep, const shape& s, T* buf,
                             const iteration_plan& plan) {
  if constexpr (!std::is_same_v<T, float> || !(std::is_same_v<Op, op::sum> || std::is_same_v<Op, op::avg>)) {
    return 0;
  } else {
    const int p = c.size(), r = c.rank();
    std::int64_t total_wrong = 0;
    const std::span<T> data(buf, s.in_n);
    // Per codec: always compressed, automatic, and never (the same in-place
    // call left dense: the uncompressed side that automatic must match; an
    // out-of-place dense row keeps its input cache-warm, 1.4-1.5x faster
    // than in place at 8-64 MiB over shm).
    for (const auto& spec : cfg.codecs)
      for (const compress_mode mode : {compress_mode::always, compress_mode::automatic, compress_mode::never}) {
        const bool automatic = mode == compress_mode::automatic;
        const char* suffix = automatic ? ":auto" : mode == compress_mode::never ? ":never" : "";
        const compression z{.codec = spec, .mode = mode};
        const options o{
            .segment_bytes = cfg.segment_bytes, .select = &sel, .group_size = cfg.group_size, .verify = cfg.verify};
        compress_state<T> st;
        // Measured before timing, so that no timed call (even without
        // warm-up, -w 0) includes the measurement.
        if (automatic) st.costs = measure_codec_costs<T>(c, spec);
        const auto fill = [&] {
          for (std::size_t i = 0; i < s.in_n; ++i) buf[i] = gradient_value(r, i);
        };
        fill();
        auto call = [&] { compressed_allreduce(c, data, z, st, Op{}, o); };
        const double sec = time_calls(c, call, plan);
        // Check on fresh inputs: identical on all ranks, error against the
        // closed form. Unchecked runs (-c 0: timing at simulated scale, where
        // the reference's p x n terms per rank would take hours, and a call
        // of 256 simulated ranks minutes) skip it.
        if (cfg.check) {
          fill();
          compress_state<T> fresh;
          fresh.costs = st.costs; // the decision of the timed rows, not a new measurement
          compressed_allreduce(c, data, z, fresh, Op{}, o);
        }
        std::uint64_t h = 1469598103934665603ull;
        double num = 0, den = 0;
        for (std::size_t i = 0; cfg.check && i < s.in_n; ++i) {
          double want = 0;
          for (int q = 0; q < p; ++q) want += gradient_value(q, i);
          if (std::is_same_v<Op, op::avg>) want /= p;
          const double got = static_cast<double>(widen(buf[i]));
          num += (got - want) * (got - want);
          den += want * want;
          std::uint64_t b = 0;
          std::memcpy(&b, &buf[i], sizeof(T));
          h = (h ^ b) * 1099511628211ull;
        }
        std::int64_t hs[2] = {static_cast<std::int64_t>(h >> 1), -static_cast<std::int64_t>(h >> 1)};
        allreduce(c, std::span<std::int64_t>(hs, 2), op::min{});
        std::int64_t wrong = cfg.check && hs[0] != -hs[1] ? 1 : 0; // some rank's result differs
        allreduce(c, std::span<std::int64_t>(&wrong, 1), op::sum{});
        auto wire = static_cast<std::int64_t>(st.last.wire_bytes);
        allreduce(c, std::span<std::int64_t>(&wire, 1), op::max{});
        total_wrong += wrong;
        const double algbw = static_cast<double>(s.bytes) / sec / 1e9;
        row w{cfg.name, cfg.transport, p, "z:" + spec.text + suffix,
              std::string(dtype_name(cfg.dt)), std::string(Op::name), s.bytes, s.count, sec * 1e6, algbw,
              algbw * bus_factor(coll::allreduce, p), cfg.check ? wrong : -1,
              st.last.predicted_compressed > 0 ? std::optional<double>(
                                                     (st.last.path == compressed_path::dense ? st.last.predicted_dense
                                                                                             : st.last.predicted_compressed) * 1e6)
                                               : std::nullopt,
              std::string(compressed_path_name(st.last.path)), {}, {}};
        w.text_fields = {{"codec", spec.text}, {"mode", automatic ? "automatic" : mode == compress_mode::never ? "never" : "always"},
                         {"path", std::string(compressed_path_name(st.last.path))}};
        w.number_fields = {{"wire_bytes", static_cast<double>(wire)},
                           {"wire_ratio", static_cast<double>(wire) / (2.0 * (p - 1) / p * static_cast<double>(s.bytes))},
                           {"rel_l2", !cfg.check ? std::nan("") : den > 0 ? std::sqrt(num / den) : std::sqrt(num)},
                           {"predicted_dense_us", st.last.predicted_dense * 1e6},
                           {"predicted_compressed_us", st.last.predicted_compressed * 1e6}};
        rep.add(w);
        if (rep.active()) {
          char model[128] = "";
          if (st.last.predicted_dense > 0)
            std::snprintf(model, sizeof model, " (model: dense %.1f us, compressed %.1f us)",
                          st.last.predicted_dense * 1e6, st.last.predicted_compressed * 1e6);
          char b[384];
          std::snprintf(b, sizeof b, "%s%s %s: %s, wire %.3g MB/rank (%.3f of dense), rel L2 %.2g%s",
                        spec.text.c_str(), suffix, human_bytes(s.bytes).c_str(),
                        std::string(compressed_path_name(st.last.path)).c_str(), static_cast<double>(wire) / 1e6,
                        w.number_fields[1].second, w.number_fields[2].second, model);
          rep.note(b);
        }
      }
    return total_wrong;
  }
}

template <transport C, element T, reduce_op Op>
std::int64_t sweep_op(C& c, const config& cfg, const selector& sel, report& rep) {
  const int p = c.size(), r = c.rank();
  const std::string op_label = reduces(cfg.kind) ? std::string(Op::name) : "none";
  std::int64_t total_wrong = 0;
  std::size_t last_bytes = 0;
  for (const std::size_t bytes : cfg.sizes) {
    const shape s = shape_of(cfg.kind, bytes, sizeof(T), p);
    if (s.count == 0 || s.bytes == last_bytes) continue; // rounded to nothing, or to the previous size
    last_bytes = s.bytes;
    buffer inb, outb;
    T *in = nullptr, *out = nullptr;
    [[maybe_unused]] shared_of<C> sin, sout; // --shared-buffers
    if constexpr (!std::is_same_v<shared_of<C>, no_shared>) {
      if (cfg.shared) {
        sin = c.alloc_shared(s.in_n * sizeof(T));
        sout = c.alloc_shared(s.out_n * sizeof(T));
        in = sin.template as<T>().data();
        out = sout.template as<T>().data();
      }
    }
    if (!in) {
      inb = buffer(s.in_n * sizeof(T));
      outb = buffer(s.out_n * sizeof(T));
      in = inb.as<T>();
      out = outb.as<T>();
    }
    // Every call, and the workspace query, sees the calibrated selector.
    auto options_for = [&](const algo_choice& a, std::span<std::byte> workspace) {
      return options{.algo = a.a,
                     .segment_bytes = cfg.segment_bytes,
                     .workspace = workspace,
                     .select = &sel,
                     .group_size = cfg.group_size,
                     .verify = cfg.verify};
    };
    std::size_t ws_bytes = 0; // one workspace per size, fitting every algorithm
    for (const auto& a : cfg.algos)
      if (!a.native) ws_bytes = std::max(ws_bytes, workspace_bytes<T>(c, cfg.kind, s, options_for(a, {})));
    buffer ws(ws_bytes);
    const iteration_plan plan = plan_iterations(s.bytes, cfg.iters, cfg.warmup);
    if (cfg.memcpy_each_size) { // the memory's own speed at this size, now: nothing else runs
      barrier(c);
      row like;
      like.collective = cfg.name;
      like.transport = cfg.transport;
      like.ranks = p;
      if (r == 0) rep.add_memcpy(measure_memcpy(s.bytes), like);
      barrier(c);
    }
    // Every rank holds the same calibrated model, so every rank skips alike.
    std::vector<prediction> preds;
    double best_us = std::numeric_limits<double>::infinity();
    for (const auto& a : cfg.algos) {
      preds.push_back(predict<T>(c, cfg.kind, a, options_for(a, std::span<std::byte>(ws.data(), ws.size())), s, sel));
      if (preds.back().micros) best_us = std::min(best_us, *preds.back().micros);
    }
    for (std::size_t i = 0; i < cfg.algos.size(); ++i) {
      const algo_choice& a = cfg.algos[i];
      const options o = options_for(a, std::span<std::byte>(ws.data(), ws.size()));
      const prediction& pred = preds[i];
      if (cfg.skip_slower > 0 && !a.native && a.a != algorithm::automatic && pred.micros &&
          *pred.micros > cfg.skip_slower * best_us) {
        const double nan = std::numeric_limits<double>::quiet_NaN();
        rep.add(row{cfg.name, cfg.transport, p, a.name, std::string(dtype_name(cfg.dt)), op_label, s.bytes, s.count,
                    nan, nan, nan, -1, pred.micros, pred.picked, {}, {}});
        continue;
      }
      exec::host host;
#if defined(GRADSYNC_BENCH_SIM)
      idle_executor idle;
      auto call = [&] {
        if (cfg.check) invoke<C, T, Op>(c, host, cfg.kind, a, o, in, out, s);
        else invoke<C, T, Op>(c, idle, cfg.kind, a, o, in, out, s);
      };
#else
      auto call = [&] { invoke<C, T, Op>(c, host, cfg.kind, a, o, in, out, s); };
#endif
      fill_input<T>(cfg.kind, in, s, r, cfg.op);
      const double sec = time_calls(c, call, plan);
      std::int64_t wrong = -1;
      if (cfg.check) {
        fill_input<T>(cfg.kind, in, s, r, cfg.op);
        std::fill_n(out, s.out_n, sentinel<T>());
        call();
        if (cfg.inject && r == 0) { // proves the checker: exactly one element per row is wrong
          T* victim = cfg.kind == coll::broadcast ? in : out;
          victim[0] = cfg.kind == coll::broadcast ? sentinel<T>() : from_int<T>(-98);
        }
        wrong = count_wrong<T>(cfg.kind, in, out, s, r, p, cfg.op);
        allreduce(c, std::span<std::int64_t>(&wrong, 1), op::sum{});
        total_wrong += wrong;
      }
      const double algbw = static_cast<double>(s.bytes) / sec / 1e9;
      rep.add(row{cfg.name, cfg.transport, p, a.name, std::string(dtype_name(cfg.dt)), op_label, s.bytes,
                  s.count, sec * 1e6, algbw, algbw * bus_factor(cfg.kind, p), wrong, pred.micros, pred.picked, {}, {}});
    }
    if (!cfg.codecs.empty()) total_wrong += compressed_rows<C, T, Op>(c, cfg, sel, rep, s, out, plan);
  }
  return total_wrong;
}

} // namespace

template <class C, class T> std::int64_t sweep(C& c, const config& cfg, const selector& sel, report& rep) {
  if (!reduces(cfg.kind)) return sweep_op<C, T, op::sum>(c, cfg, sel, rep);
  return dispatch_op(cfg.op, [&](auto o) { return sweep_op<C, T, decltype(o)>(c, cfg, sel, rep); });
}

#define GRADSYNC_BENCH_INSTANTIATE(C) \
  template std::int64_t sweep<C, GRADSYNC_BENCH_ELEMENT>(C&, const config&, const selector&, report&);
GRADSYNC_BENCH_COMMUNICATORS(GRADSYNC_BENCH_INSTANTIATE)
#undef GRADSYNC_BENCH_INSTANTIATE

} // namespace gradsync::bench::coll_bench
