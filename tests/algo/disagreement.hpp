// Issue 27, "no silent disagreement": one table of calls on which one rank
// deviates from the others in exactly one thing they must agree on, shared
// by the drivers that run it over inproc (tests/algo/test_disagreement.cpp),
// shm (tests/transport/test_shm_disagreement.cpp) and MPI
// (tests/mpi/test_disagreement.cpp). Each scenario names the field and the
// words algo::verify::describe uses for it; its body runs one call (or one
// gossip round) on every rank, the rank `odd` deviating (-1: none, the
// control). Bodies scale their counts from a payload size in bytes.
//
// What every driver checks (check_disagreement / check_control below): with
// a deviating rank, every rank throws gradsync::error of kind
// errc::mismatch from its own call, with one reason string on every rank
// that names the differing field, before the communicator's timeout; with
// none, every rank completes (and, where the result has a closed form, the
// body checks it against a value computed here by hand).
#pragma once

#include <gradsync/collectives.hpp>
#include <gradsync/compressed.hpp>
#include <gradsync/core/error.hpp>
#include <gradsync/gossip.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <sstream>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gradsync::test::disagreement {

using namespace std::chrono_literals;

/// Payload sizes every scaled scenario runs at (8 B, 4 KiB, 1 MiB).
inline constexpr std::size_t payload_bytes[] = {8, 4096, std::size_t{1} << 20};

/// Communicator timeout of the runs: every rank must have failed (or, in
/// the controls, finished) well within it.
inline constexpr std::chrono::milliseconds timeout = 5s;

/// A scenario without its body (what the checks need).
struct scenario_info {
  std::string name;    ///< "count: n vs n+1"
  std::string differs; ///< the words describe() uses: "count differs"
  std::string op;      ///< the collective the agreeing ranks' errors name
  std::string odd_op;  ///< the deviating rank's ("" when the same)
  bool scaled = true;  ///< depends on the payload size (else run once, at payload_bytes[0])
  int min_ranks = 2;   ///< fewer ranks cannot deviate (the two calls coincide)
};

/// A scenario_info from its fields (the optional ones defaulted).
inline scenario_info row(std::string name, std::string differs, std::string op, std::string odd_op = "",
                         bool scaled = true, int min_ranks = 2) {
  return {std::move(name), std::move(differs), std::move(op), std::move(odd_op), scaled, min_ranks};
}

/// One row of the table, its body instantiated for transport C: runs the
/// call on rank c.rank() for a payload of `bytes`, rank `odd` deviating
/// (-1: no rank deviates; then the body checks the result where it can and
/// throws std::logic_error when it is wrong).
template <class C> struct scenario : scenario_info {
  std::function<void(C&, std::size_t bytes, int odd)> run;
};

/// What one rank saw.
struct rank_result {
  bool threw = false;  ///< a gradsync::error
  errc kind = errc::internal;
  std::string op, reason;
  std::string other;   ///< any other exception's text (a wrong control value)
  double ms = 0;       ///< wall time of the body on this rank
};

/// Runs `s` on this rank, timing it and catching what it throws.
template <class C> rank_result run_one(const scenario<C>& s, C& c, std::size_t bytes, int odd) {
  rank_result out;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    s.run(c, bytes, odd);
  } catch (const error& e) {
    out.threw = true;
    out.kind = e.kind();
    out.op = e.op();
    out.reason = e.reason();
  } catch (const std::exception& e) {
    out.other = e.what();
  }
  out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

/// A rank_result as text (for results that cross a process boundary: the
/// shm driver's pipes, the MPI driver's gather): "threw kind ms op" on the
/// first line, then the reason (or the other exception's text).
inline std::string encode(const rank_result& x) {
  return std::to_string(x.threw ? 1 : 0) + " " + std::to_string(static_cast<int>(x.kind)) + " " +
         std::to_string(x.ms) + " " + (x.op.empty() ? "-" : x.op) + "\n" + (x.threw ? x.reason : x.other);
}

/// encode's inverse; text of another shape becomes `other` (an exception
/// raised outside the scenario, shown by the checks).
inline rank_result decode(const std::string& text) {
  rank_result x;
  const auto nl = text.find('\n');
  std::istringstream head(text.substr(0, nl));
  int threw = -1, kind = 0;
  std::string op;
  if (nl == std::string::npos || !(head >> threw >> kind >> x.ms >> op) || threw < 0 || threw > 1) {
    x.other = text.empty() ? "(no result)" : text;
    return x;
  }
  const std::string rest = text.substr(nl + 1);
  x.threw = threw == 1;
  x.kind = static_cast<errc>(kind);
  x.op = op == "-" ? "" : op;
  (x.threw ? x.reason : x.other) = rest;
  return x;
}

/// The sizes scenario `s` runs at.
inline std::vector<std::size_t> sizes_of(const scenario_info& s) {
  if (!s.scaled) return {payload_bytes[0]};
  return {std::begin(payload_bytes), std::end(payload_bytes)};
}

/// Every rank raised the same errc::mismatch from its own call, naming the
/// field, within the timeout (rank `odd` deviated).
inline void check_disagreement(const scenario_info& s, const std::vector<rank_result>& all, int odd) {
  for (std::size_t q = 0; q < all.size(); ++q) {
    const rank_result& x = all[q];
    INFO("rank " << q << " (" << x.ms << " ms): " << (x.threw ? x.op + ": " + x.reason : "no gradsync::error")
                 << (x.other.empty() ? "" : " / other exception: " + x.other));
    CHECK(x.threw);
    if (!x.threw) continue;
    CHECK(x.kind == errc::mismatch);
    const bool deviant = static_cast<int>(q) == odd && !s.odd_op.empty();
    CHECK(x.op == (deviant ? s.odd_op : s.op));
    CHECK(x.reason == all[0].reason);
    CHECK(x.reason.find(s.differs) != std::string::npos);
    CHECK(x.ms < std::chrono::duration<double, std::milli>(timeout).count());
  }
}

/// Every rank completed (and its checks of the result passed).
inline void check_control(const std::vector<rank_result>& all) {
  for (std::size_t q = 0; q < all.size(); ++q) {
    const rank_result& x = all[q];
    INFO("rank " << q << " (" << x.ms << " ms): " << x.op << ": " << x.reason << x.other);
    CHECK_FALSE(x.threw);
    CHECK(x.other.empty());
  }
}

namespace detail {

// Input of rank r at element i: small integers, exact in f32 and i32.
template <class T> std::vector<T> input(int r, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(r + 1 + static_cast<int>(i % 5));
  return v;
}
inline double input_at(int r, std::size_t i) { return r + 1 + static_cast<double>(i % 5); }

inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::logic_error("control: " + what);
}

// v is the sum over p ranks of input(r, n), computed here by hand.
template <class T> void expect_sum(const std::vector<T>& v, int p, std::size_t n) {
  expect(v.size() >= n, "result too short");
  for (std::size_t i = 0; i < n; ++i) {
    const double want = p * (p + 1) / 2.0 + p * static_cast<double>(i % 5);
    if (static_cast<double>(v[i]) != want)
      expect(false, "element " + std::to_string(i) + " is " + std::to_string(static_cast<double>(v[i])) +
                        ", want the sum " + std::to_string(want));
  }
}

inline std::size_t elems(std::size_t bytes) { return bytes / sizeof(float); }

// The allreduce every "normal" rank runs in the collective scenarios.
template <class C> void sum_allreduce(C& c, std::size_t n, const options& o = {}) {
  auto v = input<float>(c.rank(), n);
  allreduce(c, std::span<float>(v), op::sum{}, o);
  expect_sum(v, c.size(), n);
}

// Compressed allreduce of n floats with `z` (a fresh state: one call).
template <class C> void compressed(C& c, std::size_t n, const compression& z) {
  auto v = input<float>(c.rank(), n);
  compress_state<float> st;
  compressed_allreduce(c, std::span<float>(v), z, st);
  for (const float x : v) expect(std::isfinite(x), "compressed result not finite");
}

// A compression that never measures (a fixed quantizer schedule).
inline compression fixed(const char* spec) {
  compression z;
  z.codec = compress::parse_spec(spec);
  z.algo = compressed_algorithm::ring;
  return z;
}

// ring(p) uniform: rank r averages itself and its ring neighbours.
inline double ring_mix(int p, int r, std::size_t i) {
  if (p == 2) return (input_at(0, i) + input_at(1, i)) / 2;
  return (input_at((r + p - 1) % p, i) + input_at(r, i) + input_at((r + 1) % p, i)) / 3;
}

// The user graph of the topology scenario: x_r <- 3/4 x_r + 1/4 x_{r-1}.
inline gossip::graph lopsided_ring(int p) {
  std::vector<gossip::entry> e;
  for (int r = 0; r < p; ++r) {
    e.push_back({r, r, 0.75});
    e.push_back({r, (r + p - 1) % p, 0.25});
  }
  return gossip::from_weights(p, e, "lopsided_ring");
}

// v is ring_mix (or the lopsided ring's mix) of the inputs, to rounding.
inline void expect_mix(const std::vector<float>& v, int p, int r, bool lopsided) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double want = lopsided ? 0.75 * input_at(r, i) + 0.25 * input_at((r + p - 1) % p, i) : ring_mix(p, r, i);
    if (std::abs(v[i] - want) > 1e-5 * want)
      expect(false, "gossip element " + std::to_string(i) + " is " + std::to_string(v[i]) + ", want " +
                        std::to_string(want));
  }
}

} // namespace detail

/// The table, its bodies instantiated for transport C.
template <class C> std::vector<scenario<C>> scenarios() {
  using namespace detail;
  std::vector<scenario<C>> t;
  const auto add = [&](scenario_info i, std::function<void(C&, std::size_t, int)> body) {
    scenario<C> s;
    static_cast<scenario_info&>(s) = std::move(i);
    s.run = std::move(body);
    t.push_back(std::move(s));
  };
  const std::string coll = "collective differs";

  // --- collective: the deviating rank calls another collective
  add(row("collective: allreduce vs broadcast", coll, "allreduce", "broadcast"), [](C& c, std::size_t b, int odd) {
    const std::size_t n = elems(b);
    if (c.rank() != odd) return sum_allreduce(c, n);
    auto v = input<float>(c.rank(), n);
    broadcast(c, std::span<float>(v), 0);
  });
  add(row("collective: allreduce vs reduce_scatter", coll, "allreduce", "reduce_scatter"),
      [](C& c, std::size_t b, int odd) {
        const std::size_t n = elems(b);
        if (c.rank() != odd) return sum_allreduce(c, n);
        const auto in = input<float>(c.rank(), n * static_cast<std::size_t>(c.size()));
        std::vector<float> out(n);
        reduce_scatter(c, std::span<const float>(in), std::span<float>(out), op::sum{});
      });
  add(row("collective: allreduce vs barrier", coll, "allreduce", "barrier"), [](C& c, std::size_t b, int odd) {
    if (c.rank() != odd) return sum_allreduce(c, elems(b));
    barrier(c);
  });

  // --- count
  const std::string count = "count differs";
  add(row("count: 0 vs 1", count, "allreduce", "", false),
      [](C& c, std::size_t, int odd) { sum_allreduce(c, c.rank() == odd ? 0 : 1); });
  add(row("count: 2 vs 1", count, "allreduce", "", false),
      [](C& c, std::size_t, int odd) { sum_allreduce(c, c.rank() == odd ? 2 : 1); });
  add(row("count: n vs n+1", count, "allreduce"),
      [](C& c, std::size_t b, int odd) { sum_allreduce(c, elems(b) + (c.rank() == odd ? 1 : 0)); });
  add(row("count: n vs 0", count, "allreduce"),
      [](C& c, std::size_t b, int odd) { sum_allreduce(c, c.rank() == odd ? 0 : elems(b)); });

  // --- dtype, op
  add(row("dtype: f32 vs i32", "dtype differs", "allreduce"), [](C& c, std::size_t b, int odd) {
    const std::size_t n = elems(b);
    if (c.rank() != odd) return sum_allreduce(c, n);
    auto v = input<std::int32_t>(c.rank(), n);
    allreduce(c, std::span<std::int32_t>(v), op::sum{});
  });
  add(row("op: sum vs max", "op differs", "allreduce"), [](C& c, std::size_t b, int odd) {
    const std::size_t n = elems(b);
    if (c.rank() != odd) return sum_allreduce(c, n);
    auto v = input<float>(c.rank(), n);
    allreduce(c, std::span<float>(v), op::max{});
  });

  // --- root
  add(row("root: broadcast 0 vs 1", "root differs", "broadcast"), [](C& c, std::size_t b, int odd) {
    const std::size_t n = elems(b);
    auto v = input<float>(c.rank(), n);
    broadcast(c, std::span<float>(v), c.rank() == odd ? 1 : 0);
    for (std::size_t i = 0; i < n; ++i)
      expect(static_cast<double>(v[i]) == input_at(0, i), "broadcast element " + std::to_string(i));
  });
  add(row("root: reduce 0 vs 1", "root differs", "reduce"), [](C& c, std::size_t b, int odd) {
    const std::size_t n = elems(b);
    const auto in = input<float>(c.rank(), n);
    std::vector<float> out(n);
    const int root = c.rank() == odd ? 1 : 0;
    reduce(c, std::span<const float>(in), std::span<float>(out), root, op::sum{});
    if (c.rank() == 0) expect_sum(out, c.size(), n);
  });

  // --- algorithm
  add(row("algorithm: ring vs tree", "algorithm differs", "allreduce"), [](C& c, std::size_t b, int odd) {
    options o;
    o.algo = c.rank() == odd ? algorithm::tree : algorithm::ring;
    sum_allreduce(c, elems(b), o);
  });
  add(row("algorithm: automatic vs forced", "algorithm differs", "allreduce"), [](C& c, std::size_t b, int odd) {
    const std::size_t n = elems(b);
    options o;
    if (c.rank() == odd) // forced to one the automatic choice is not
      o.algo = allreduce_algorithm<float>(c, n) == algorithm::ring ? algorithm::tree : algorithm::ring;
    sum_allreduce(c, n, o);
  });

  // --- segment size (of a schedule that cuts the payload into segments)
  add(row("segment size: 1024 vs 4096", "segment size differs", "allreduce"), [](C& c, std::size_t b, int odd) {
    options o;
    o.algo = algorithm::ring;
    o.segment_bytes = c.rank() == odd ? 4096 : 1024;
    sum_allreduce(c, elems(b), o);
  });

  // --- compressed: every field of `compression`
  const std::string codec = "codec differs", cz = "compressed_allreduce";
  const auto compressed_case = [&](std::string name, const char* spec, std::function<void(compression&)> deviate) {
    add(row(std::move(name), codec, cz), [spec, deviate](C& c, std::size_t b, int odd) {
      compression z = fixed(spec);
      if (c.rank() == odd) deviate(z);
      compressed(c, elems(b), z);
    });
  };
  compressed_case("compressed codec: int8 vs int4", "int8",
                  [](compression& z) { z.codec = compress::parse_spec("int4"); });
  compressed_case("compressed topk density: 0.01 vs 0.02", "topk:density=0.01",
                  [](compression& z) { z.codec = compress::parse_spec("topk:density=0.02"); });
  compressed_case("compressed int8 block: 256 vs 128", "int8:block=256",
                  [](compression& z) { z.codec = compress::parse_spec("int8:block=128"); });
  compressed_case("compressed qsgd levels: 7 vs 15", "qsgd:levels=7",
                  [](compression& z) { z.codec = compress::parse_spec("qsgd:levels=15"); });
  compressed_case("compressed powersgd rank: 4 vs 2", "powersgd:rank=4",
                  [](compression& z) { z.codec = compress::parse_spec("powersgd:rank=2"); });
  compressed_case("compressed error feedback: on vs off", "int8", [](compression& z) { z.error_feedback = false; });
  compressed_case("compressed mode: always vs never", "int8", [](compression& z) { z.mode = compress_mode::never; });
  compressed_case("compressed schedule: ring vs two_step", "int8",
                  [](compression& z) { z.algo = compressed_algorithm::two_step; });
  compressed_case("compressed seed", "qsgd", [](compression& z) { z.seed = compress::default_seed + 1; });
  compressed_case("compressed segment: default vs 64 KiB", "int8", [](compression& z) { z.segment_bytes = 65536; });

  // --- gossip: the step's mixing matrix, the step, CHOCO's parameters
  const std::string gossip_words = "topology, step or codec differs", na = "neighbor_allreduce";
  // ring and one-peer exponential are the same matrix on 2 ranks (1/2, 1/2).
  add(row("gossip topology: ring vs one_peer_exponential", gossip_words, na, "", true, 3),
      [](C& c, std::size_t b, int odd) {
        const int p = c.size();
        auto v = input<float>(c.rank(), elems(b));
        const gossip::graph g = c.rank() == odd ? gossip::one_peer_exponential(p) : gossip::ring(p);
        gossip::neighbor_allreduce(c, std::span<float>(v), g, 0);
        expect_mix(v, p, c.rank(), false);
      });
  add(row("gossip topology: ring vs lopsided ring", gossip_words, na), [](C& c, std::size_t b, int odd) {
    const int p = c.size();
    auto v = input<float>(c.rank(), elems(b));
    const bool lopsided = odd < 0 || c.rank() != odd; // the control runs the lopsided ring
    gossip::neighbor_allreduce(c, std::span<float>(v), lopsided ? lopsided_ring(p) : gossip::ring(p), 0);
    expect_mix(v, p, c.rank(), true);
  });
  add(row("gossip step: 0 vs 1", gossip_words, na), [](C& c, std::size_t b, int odd) {
    auto v = input<float>(c.rank(), elems(b));
    gossip::neighbor_allreduce(c, std::span<float>(v), gossip::ring(c.size()), c.rank() == odd ? 1 : 0);
    expect_mix(v, c.size(), c.rank(), false);
  });
  add(row("gossip choco gamma: 0.5 vs 0.25", gossip_words, "choco_gossip"), [](C& c, std::size_t b, int odd) {
    auto v = input<float>(c.rank(), elems(b));
    gossip::choco_state<float> st;
    gossip::choco_config z;
    if (c.rank() == odd) z.gamma = 0.25;
    gossip::choco_gossip(c, std::span<float>(v), gossip::ring(c.size()), st, z);
    for (const float x : v) expect(std::isfinite(x), "choco result not finite");
  });
  return t;
}

} // namespace gradsync::test::disagreement
