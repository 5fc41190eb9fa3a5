// The collectives sweep: runs every collective over inproc ranks for many
// (ranks, count, dtype, op, in/out of place, segment size, root) points and
// checks each rank's result against a closed form, bit for bit. Any algorithm
// listed in algorithms.hpp runs the same sweep.
//
// Inputs are small integers, so every partial result is exact in every dtype
// (even bf16: |values| <= 160 < 2^8) and the expected value does not depend on
// the reduction order. Element i of rank r is
//   a(i) + b((r + i) mod p)          for sum, avg, min, max and the data collectives,
//   r == i mod p ? a'(i) : c((r + i) mod p)   for prod,
// with a, a' hashed from i (catches misplaced elements), b and c fixed tables
// (each rank's term is distinct, the extreme moves from rank to rank), so
// sum = p a(i) + sum b, min = a(i) + min b, prod = a'(i) prod c / c(2i mod p).
#pragma once

#include <doctest/doctest.h>

#include <gradsync/collectives.hpp>
#include <gradsync/transport/inproc.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../transport/rank_pool.hpp"
#include "algorithms.hpp"

namespace gradsync::test {

inline constexpr dtype all_dtypes[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64};
inline constexpr op_kind all_ops[] = {op_kind::sum, op_kind::avg, op_kind::min, op_kind::max, op_kind::prod};
inline constexpr int sweep_ranks[] = {1, 2, 3, 4, 5, 7, 8, 16};
inline constexpr std::size_t medium_count = 4099;     // many segments at 64 B and 4 KiB
inline constexpr std::size_t large_count = 1'000'003; // prime: ragged blocks everywhere

/// A peer that never answers fails the case after this long instead of hanging.
inline constexpr std::chrono::seconds case_timeout{60};

constexpr std::string_view collective_name(collective c) {
  switch (c) {
  case collective::allreduce: return "allreduce";
  case collective::reduce_scatter: return "reduce_scatter";
  case collective::allgather: return "allgather";
  case collective::broadcast: return "broadcast";
  case collective::reduce: return "reduce";
  }
  return "?";
}
constexpr bool reduces(collective c) {
  return c == collective::allreduce || c == collective::reduce_scatter || c == collective::reduce;
}
constexpr bool rooted(collective c) { return c == collective::broadcast || c == collective::reduce; }

/// One point of the sweep. `count` is the collective's own count: elements
/// of the buffer for allreduce, broadcast and reduce; of one rank's block for
/// reduce_scatter (output) and allgather (input).
struct sweep_case {
  collective coll = collective::allreduce;
  algorithm algo = algorithm::automatic;
  int ranks = 1;
  std::size_t count = 0;
  dtype type = dtype::f32;
  op_kind op = op_kind::sum;
  bool in_place = false;
  std::size_t segment_bytes = 0; // 0: the default
  int root = 0;
  bool caller_workspace = false; // pass o.workspace sized by the *_workspace_bytes query
};

inline std::string describe(const sweep_case& k) {
  std::ostringstream s;
  s << collective_name(k.coll) << " algo=" << algorithm_name(k.algo) << " ranks=" << k.ranks
    << " count=" << k.count << " " << dtype_name(k.type);
  if (reduces(k.coll)) s << " " << op_name(k.op);
  s << (k.in_place ? " in-place" : " out-of-place") << " seg=" << k.segment_bytes;
  if (rooted(k.coll)) s << " root=" << k.root;
  if (k.caller_workspace) s << " caller-workspace";
  return s.str();
}

// ---- the closed-form model -------------------------------------------------

namespace model {

inline std::uint64_t mix(std::size_t i) {
  std::uint64_t x = static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull;
  return x ^ (x >> 29);
}
inline long long a(std::size_t i) { return static_cast<long long>(mix(i) % 7) - 3; }  // [-3, 3]
inline long long a_prod(std::size_t i) {                                             // +-1, +-2, +-3
  const long long v = static_cast<long long>(mix(i) % 6) - 3;
  return v >= 0 ? v + 1 : v;
}
inline long long b(int k) { return (5 * k) % 11 - 5; }                       // [-5, 5]
inline long long c(int k) { return k % 5 == 1 ? 2 : (k % 3 == 2 ? -1 : 1); } // at most 3 twos up to 16
inline int slot(int r, std::size_t i, int p) {
  return static_cast<int>((static_cast<std::size_t>(r) + i % static_cast<std::size_t>(p)) % static_cast<std::size_t>(p));
}

/// Element i of rank r's input.
inline long long input(op_kind op, int r, std::size_t i, int p) {
  if (op == op_kind::prod)
    return r == static_cast<int>(i % static_cast<std::size_t>(p)) ? a_prod(i) : c(slot(r, i, p));
  return a(i) + b(slot(r, i, p));
}

/// Per-rank-count constants of the closed forms.
struct tables {
  long long sum_b = 0, min_b = 0, max_b = 0, prod_c = 1;
  explicit tables(int p) {
    min_b = max_b = b(0);
    for (int k = 0; k < p; ++k) {
      sum_b += b(k);
      min_b = std::min(min_b, b(k));
      max_b = std::max(max_b, b(k));
      prod_c *= c(k);
    }
  }
};

/// The exact reduction over p ranks of element i (for avg: the sum).
inline long long reduced(op_kind op, std::size_t i, int p, const tables& t) {
  switch (op) {
  case op_kind::sum:
  case op_kind::avg: return p * a(i) + t.sum_b;
  case op_kind::min: return a(i) + t.min_b;
  case op_kind::max: return a(i) + t.max_b;
  case op_kind::prod: return a_prod(i) * (t.prod_c / c(static_cast<int>((2 * (i % static_cast<std::size_t>(p))) % static_cast<std::size_t>(p))));
  }
  return 0;
}

} // namespace model

/// An exact small integer as element type T.
template <class T> T to_elem(long long v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}

/// The documented result of op over p ranks for element i: the exact value,
/// except avg, which is the exact sum divided once by p in the accumulation
/// type (integers truncate toward zero).
template <class T> T expected_elem(op_kind op, std::size_t i, int p, const model::tables& t) {
  const long long v = model::reduced(op, i, p, t);
  if (op != op_kind::avg) return to_elem<T>(v);
  if constexpr (std::is_integral_v<T>) return static_cast<T>(v / p);
  else {
    using A = accum_t<T>;
    return narrow<T>(static_cast<A>(v) / static_cast<A>(p));
  }
}

/// A value no result of the sweep can take (|results| <= 160).
template <class T> T sentinel() { return to_elem<T>(1000); }

/// Compares got with want bit for bit; describes the first difference.
template <class T> std::string compare(std::span<const T> got, std::span<const T> want, const char* what) {
  if (got.size() != want.size())
    return std::string(what) + ": size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  if (got.empty() || std::memcmp(got.data(), want.data(), got.size_bytes()) == 0) return {};
  std::size_t i = 0, bad = 0;
  while (std::memcmp(&got[i], &want[i], sizeof(T)) == 0) ++i;
  for (std::size_t j = i; j < got.size(); ++j) bad += std::memcmp(&got[j], &want[j], sizeof(T)) != 0;
  auto show = [](T v) {
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return std::to_string(static_cast<float>(v));
    else return std::to_string(v);
  };
  return std::string(what) + ": " + std::to_string(bad) + " of " + std::to_string(got.size()) +
         " elements differ, first at " + std::to_string(i) + ": got " + show(got[i]) + ", want " + show(want[i]);
}

namespace detail {

template <class T> std::vector<T> inputs(op_kind op, int r, std::size_t n, int p) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = to_elem<T>(model::input(op, r, i, p));
  return v;
}

// The expected reduction of elements [0, n) over p ranks.
template <class T> std::vector<T> expected(op_kind op, std::size_t n, int p) {
  const model::tables t(p);
  std::vector<T> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = expected_elem<T>(op, i, p, t);
  return want;
}

// Every algorithm, segment size and placement of one sweep point (op, count,
// ranks) starts from the same inputs and expects the same result; the sweep
// runs a point's cases back to back (sweep() below), so both are computed once
// per point here instead of once per case (they were a third of the large
// sweep's time). One entry per element type; called from the main thread only,
// before the ranks start, which then only read it.
template <class T> struct point_memo {
  struct key {
    op_kind op;
    std::size_t n;
    int p;
    bool operator==(const key&) const = default;
  };
  std::optional<key> in_key, want_key;
  std::vector<std::vector<T>> in; // in[r]: rank r's input
  std::vector<T> want;
};
template <class T> point_memo<T>& memo() {
  static point_memo<T> m;
  return m;
}
template <class T> const std::vector<std::vector<T>>& all_inputs(op_kind op, std::size_t n, int p) {
  auto& m = memo<T>();
  const typename point_memo<T>::key k{op, n, p};
  if (m.in_key != k) {
    m.in.clear();
    for (int r = 0; r < p; ++r) m.in.push_back(inputs<T>(op, r, n, p));
    m.in_key = k;
  }
  return m.in;
}
template <class T> const std::vector<T>& expected_of(op_kind op, std::size_t n, int p) {
  auto& m = memo<T>();
  const typename point_memo<T>::key k{op, n, p};
  if (m.want_key != k) {
    m.want = expected<T>(op, n, p);
    m.want_key = k;
  }
  return m.want;
}

inline options options_of(const sweep_case& k) {
  options o;
  o.algo = k.algo;
  o.segment_bytes = k.segment_bytes;
  configure(o, k.algo);
  return o;
}

template <class T> std::span<const T> cspan(const std::vector<T>& v) { return std::span<const T>(v); }


// Runs one case on k.ranks inproc ranks. `body(c, r, o, result, err)` runs
// the collective on rank r, leaves the bytes to compare across ranks in
// result (or nothing) and writes a mismatch description to err.
template <class T, class Body> std::string run_ranks(const sweep_case& k, bool same_everywhere, Body body) {
  const int p = k.ranks;
  std::vector<std::vector<T>> results(static_cast<std::size_t>(p));
  std::vector<std::string> errs(static_cast<std::size_t>(p));
  try {
    pool_of(p).run([&](inproc::communicator& c) {
      c.group().set_timeout(case_timeout);
      const auto r = static_cast<std::size_t>(c.rank());
      body(c, options_of(k), results[r], errs[r]);
    });
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  }
  for (std::size_t r = 0; r < errs.size(); ++r)
    if (!errs[r].empty()) return "rank " + std::to_string(r) + ": " + errs[r];
  if (same_everywhere)
    for (std::size_t r = 1; r < results.size(); ++r)
      if (auto e = compare<T>(results[r], results[0], "result differs from rank 0's"); !e.empty())
        return "rank " + std::to_string(r) + ": " + e;
  return {};
}

// Gives o a caller-owned workspace of `bytes` when the case asks for one.
inline void use_workspace(const sweep_case& k, options& o, std::vector<std::byte>& ws, std::size_t bytes) {
  if (!k.caller_workspace || bytes == 0) return;
  ws.resize(bytes);
  o.workspace = ws;
}

template <class T, class Op> std::string allreduce_case(const sweep_case& k, Op op) {
  const int p = k.ranks;
  const std::size_t n = k.count;
  const auto& want = expected_of<T>(k.op, n, p);
  const auto& ins = all_inputs<T>(k.op, n, p);
  return run_ranks<T>(k, true, [&](inproc::communicator& c, options o, std::vector<T>& res, std::string& err) {
    std::vector<std::byte> ws;
    use_workspace(k, o, ws, allreduce_workspace_bytes<T>(c, n, o));
    auto in = ins[static_cast<std::size_t>(c.rank())];
    if (k.in_place) {
      allreduce(c, std::span<T>(in), op, o);
      res = std::move(in);
      err = compare<T>(res, want, "result");
      return;
    }
    const auto orig = in;
    std::vector<T> out(n + 3, sentinel<T>());
    allreduce(c, cspan(in), std::span<T>(out), op, o);
    err = compare<T>(std::span<const T>(out).first(n), want, "result");
    if (err.empty()) err = compare<T>(std::span<const T>(out).subspan(n), std::vector<T>(3, sentinel<T>()), "output past count");
    if (err.empty()) err = compare<T>(in, orig, "input");
    out.resize(n);
    res = std::move(out);
  });
}

template <class T, class Op> std::string reduce_scatter_case(const sweep_case& k, Op op) {
  const int p = k.ranks;
  const std::size_t n = k.count, total = n * static_cast<std::size_t>(p);
  const auto& want = expected_of<T>(k.op, total, p);
  const auto& ins = all_inputs<T>(k.op, total, p);
  return run_ranks<T>(k, false, [&](inproc::communicator& c, options o, std::vector<T>&, std::string& err) {
    std::vector<std::byte> ws;
    use_workspace(k, o, ws, reduce_scatter_workspace_bytes<T>(c, n, o));
    const auto off = n * static_cast<std::size_t>(c.rank());
    const auto mine = std::span<const T>(want).subspan(off, n);
    auto in = ins[static_cast<std::size_t>(c.rank())];
    auto orig = in;
    if (k.in_place) {
      const std::span<T> own(in.data() + off, n);
      reduce_scatter(c, cspan(in), own, op, o);
      err = compare<T>(own, mine, "result");
      // the other blocks are input: untouched
      std::copy(own.begin(), own.end(), orig.begin() + static_cast<std::ptrdiff_t>(off));
      if (err.empty()) err = compare<T>(in, orig, "input outside the own block");
      return;
    }
    std::vector<T> out(n, sentinel<T>());
    reduce_scatter(c, cspan(in), std::span<T>(out), op, o);
    err = compare<T>(out, mine, "result");
    if (err.empty()) err = compare<T>(in, orig, "input");
  });
}

template <class T> std::string allgather_case(const sweep_case& k) {
  const int p = k.ranks;
  const std::size_t n = k.count, total = n * static_cast<std::size_t>(p);
  const auto& ins = all_inputs<T>(op_kind::sum, n, p);
  std::vector<T> want;
  want.reserve(total);
  for (const auto& block : ins) want.insert(want.end(), block.begin(), block.end());
  return run_ranks<T>(k, true, [&](inproc::communicator& c, options o, std::vector<T>& res, std::string& err) {
    std::vector<std::byte> ws;
    use_workspace(k, o, ws, allgather_workspace_bytes<T>(c, n, o));
    const auto off = n * static_cast<std::size_t>(c.rank());
    auto mine = ins[static_cast<std::size_t>(c.rank())];
    std::vector<T> out(total, sentinel<T>());
    if (k.in_place) {
      std::copy(mine.begin(), mine.end(), out.begin() + static_cast<std::ptrdiff_t>(off));
      allgather(c, std::span<const T>(out.data() + off, n), std::span<T>(out), o);
    } else {
      const auto orig = mine;
      allgather(c, cspan(mine), std::span<T>(out), o);
      err = compare<T>(mine, orig, "input");
    }
    if (err.empty()) err = compare<T>(out, want, "result");
    res = std::move(out);
  });
}

template <class T> std::string broadcast_case(const sweep_case& k) {
  const int p = k.ranks;
  const std::size_t n = k.count;
  const auto& want = all_inputs<T>(op_kind::sum, n, p)[static_cast<std::size_t>(k.root)];
  return run_ranks<T>(k, true, [&](inproc::communicator& c, options o, std::vector<T>& res, std::string& err) {
    std::vector<T> buf = c.rank() == k.root ? want : std::vector<T>(n, sentinel<T>());
    broadcast(c, std::span<T>(buf), k.root, o);
    err = compare<T>(buf, want, "result");
    res = std::move(buf);
  });
}

template <class T, class Op> std::string reduce_case(const sweep_case& k, Op op) {
  const int p = k.ranks;
  const std::size_t n = k.count;
  const auto& want = expected_of<T>(k.op, n, p);
  const auto& ins = all_inputs<T>(k.op, n, p);
  return run_ranks<T>(k, false, [&](inproc::communicator& c, options o, std::vector<T>&, std::string& err) {
    std::vector<std::byte> ws;
    use_workspace(k, o, ws, reduce_workspace_bytes<T>(c, n, o));
    const bool root = c.rank() == k.root;
    auto in = ins[static_cast<std::size_t>(c.rank())];
    const auto orig = in;
    if (k.in_place) { // the root reduces into its input; the others pass no output
      reduce(c, cspan(in), root ? std::span<T>(in) : std::span<T>(), k.root, op, o);
      err = root ? compare<T>(in, want, "result") : compare<T>(in, orig, "input");
      return;
    }
    // out of place: the others pass an output too, which must stay untouched
    std::vector<T> out(root ? n + 3 : n, sentinel<T>());
    reduce(c, cspan(in), std::span<T>(out), k.root, op, o);
    if (root) {
      err = compare<T>(std::span<const T>(out).first(n), want, "result");
      if (err.empty()) err = compare<T>(std::span<const T>(out).subspan(n), std::vector<T>(3, sentinel<T>()), "output past count");
    } else {
      err = compare<T>(out, std::vector<T>(n, sentinel<T>()), "non-root output");
    }
    if (err.empty()) err = compare<T>(in, orig, "input");
  });
}

} // namespace detail

/// Runs one case; returns an empty string on success, else what went wrong.
inline std::string run_case(const sweep_case& k) {
  return dispatch_dtype(k.type, [&](auto tv) -> std::string {
    using T = decltype(tv);
    switch (k.coll) {
    case collective::allgather: return detail::allgather_case<T>(k);
    case collective::broadcast: return detail::broadcast_case<T>(k);
    default: break;
    }
    return dispatch_op(k.op, [&](auto op) -> std::string {
      switch (k.coll) {
      case collective::allreduce: return detail::allreduce_case<T>(k, op);
      case collective::reduce_scatter: return detail::reduce_scatter_case<T>(k, op);
      default: return detail::reduce_case<T>(k, op);
      }
    });
  });
}

/// Runs every case, failing the current test for each one that fails (the
/// first few with full details).
inline void run_cases(const std::vector<sweep_case>& cases) {
  std::size_t failed = 0;
  for (const auto& k : cases) {
    const std::string e = run_case(k);
    if (e.empty()) continue;
    if (++failed <= 10) FAIL_CHECK(describe(k) << ": " << e);
  }
  INFO(failed << " of " << cases.size() << " cases failed");
  CHECK(failed == 0);
}

// ---- sweep plans -----------------------------------------------------------

/// The algorithms to sweep: algorithms_under_test, or only those named in
/// GRADSYNC_TEST_ALGO (comma separated), e.g. to split a slow sweep by algorithm.
inline std::vector<algorithm> selected_algorithms() {
  std::vector<algorithm> out;
  const char* env = std::getenv("GRADSYNC_TEST_ALGO");
  for (const algorithm a : algorithms_under_test) {
    if (env && *env) {
      const std::string list = std::string(",") + env + ",";
      if (list.find("," + std::string(algorithm_name(a)) + ",") == std::string::npos) continue;
    }
    out.push_back(a);
  }
  return out;
}

/// Roots a rooted collective is swept with on p ranks.
inline std::vector<int> roots_for(collective coll, int p) {
  std::vector<int> roots;
  if (coll == collective::broadcast && p <= 8)
    for (int r = 0; r < p; ++r) roots.push_back(r);
  else
    for (const int r : {0, p - 1, p / 2, 1})
      if (r < p && std::find(roots.begin(), roots.end(), r) == roots.end()) roots.push_back(r);
  return roots;
}

/// The one dtype the medium plan runs op `o` (not sum) with.
constexpr dtype medium_dtype_of(op_kind o) {
  switch (o) {
  case op_kind::avg: return dtype::f64;
  case op_kind::min: return dtype::f16;
  case op_kind::max: return dtype::bf16;
  default: return dtype::i32; // prod
  }
}

/// Which counts, dtypes, ops and segment sizes a sweep crosses.
struct plan {
  enum sizes { small, medium, large } size = small;
  std::vector<dtype> types;
  std::vector<op_kind> ops; // ignored by allgather and broadcast
  std::vector<std::size_t> segments;
  std::vector<int> ranks;
};

/// small: counts 0, 1, p-1, p+1 for every dtype and op, 64 B and default
/// segments. medium: ~4099 elements, every dtype with sum and each other op
/// with one dtype (avg f64, min f16, max bf16, prod i32: the per-element
/// math is the small and large plans'; medium is about segmentation), 64 B
/// and 4 KiB segments (many segments per block), half of the cases with a
/// caller workspace. large: ~1,000,003 elements, f32 sum/avg/max and bf16 sum,
/// default segments in place and 4 KiB out of place. reduce_scatter and allgather take the count
/// per rank block, so medium/large use count / p (rounded up) per block.
inline plan standard_plan(plan::sizes s) {
  plan pl;
  pl.size = s;
  pl.ranks.assign(std::begin(sweep_ranks), std::end(sweep_ranks));
  if (s == plan::large) {
    pl.types = {dtype::f32, dtype::bf16};
    pl.ops = {op_kind::sum, op_kind::avg, op_kind::max};
    pl.segments = {0, 4096};
    return pl;
  }
  pl.types.assign(std::begin(all_dtypes), std::end(all_dtypes));
  pl.ops.assign(std::begin(all_ops), std::end(all_ops));
  pl.segments = s == plan::small ? std::vector<std::size_t>{64, 0} : std::vector<std::size_t>{64, 4096};
  return pl;
}

/// The cases of plan `pl` for one collective and algorithm.
inline std::vector<sweep_case> make_cases(collective coll, algorithm algo, const plan& pl) {
  std::vector<sweep_case> out;
  for (const int p : pl.ranks) {
    const auto up = static_cast<std::size_t>(p);
    const bool per_block = coll == collective::reduce_scatter || coll == collective::allgather;
    std::vector<std::size_t> counts;
    if (pl.size == plan::small) counts = {0, 1, up - 1, up + 1};
    else {
      const std::size_t total = pl.size == plan::medium ? medium_count : large_count;
      counts = {per_block ? (total + up - 1) / up : total};
    }
    std::vector<int> roots = rooted(coll) ? roots_for(coll, p) : std::vector<int>{0};
    if (pl.size == plan::large && rooted(coll)) roots = {p / 2};
    const std::vector<op_kind> ops = reduces(coll) ? pl.ops : std::vector<op_kind>{op_kind::sum};
    int serial = 0;
    for (const std::size_t n : counts)
      for (const dtype t : pl.types)
        for (const op_kind o : ops) {
          // large: f32 with every op of the plan, bf16 with sum only
          if (pl.size == plan::large && t != dtype::f32 && o != op_kind::sum) continue;
          // medium: every dtype with sum, each other op with one dtype
          if (pl.size == plan::medium && o != op_kind::sum && t != medium_dtype_of(o)) continue;
          for (const bool in_place : {true, false}) {
            if (coll == collective::broadcast && !in_place) continue; // broadcast is in place
            for (std::size_t seg : pl.segments)
              for (const int root : roots) {
                // medium at 8+ ranks: 256-B segments still cut every block into
                // 8+ segments; 64-B ones made these ranks 3/4 of the sweep's time.
                // hier's rooted schedules run two levels of segmented trees
                // and chains: 256-B segments at every rank count (still 64
                // segments of the 16 KiB vector; the reduce sweep took 75 s),
                // and so do its gathers (a tree or chain over the whole vector
                // inside each group: the reduce_scatter sweep took 62 s)
                if (pl.size == plan::medium && (p >= 8 || (algo == algorithm::hier && coll != collective::allreduce)) &&
                    seg == 64)
                  seg = 256;
                // large: in place with the first segment size, out of place with the second
                if (pl.size == plan::large && seg != pl.segments[in_place ? 0 : 1]) continue;
                sweep_case k;
                k.coll = coll;
                k.algo = algo;
                k.ranks = p;
                k.count = n;
                k.type = t;
                k.op = o;
                k.in_place = in_place;
                k.segment_bytes = seg;
                k.root = root;
                k.caller_workspace = pl.size == plan::medium && (serial++ % 2);
                out.push_back(k);
              }
          }
        }
  }
  return out;
}

/// Sweeps `coll` with plan size `s` under every selected algorithm that implements it.
/// A point's cases (every algorithm, segment size, placement and root) run
/// back to back, so its inputs and expected result are computed once.
inline void sweep(collective coll, plan::sizes s) {
  std::vector<sweep_case> cases;
  for (const algorithm a : selected_algorithms())
    if (implements(coll, a)) {
      const auto more = make_cases(coll, a, standard_plan(s));
      cases.insert(cases.end(), more.begin(), more.end());
    }
  std::stable_sort(cases.begin(), cases.end(), [](const sweep_case& x, const sweep_case& y) {
    return std::tie(x.ranks, x.count, x.type, x.op) < std::tie(y.ranks, y.count, y.type, y.op);
  });
  run_cases(cases);
}

} // namespace gradsync::test
