// The public collectives over gradsync::mpi::communicator, on every rank count
// the suite is launched with: closed-form results for every dtype x operator
// x count x segment size, cross-rank bitwise identity, the ring's documented
// reduction order, and agreement with the MPI library's own collectives.
#include "mpi_test.hpp"
#include "../transport/staged_checks.hpp"

#include <gradsync/gradsync.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <set>
#include <thread>

using namespace gradsync;
using namespace gradsync::test;

TYPE_TO_STRING(gradsync::half);
TYPE_TO_STRING(gradsync::bfloat16);

#define GRADSYNC_ALL_DTYPES float, double, gradsync::half, gradsync::bfloat16, std::int32_t, std::int64_t

namespace {

std::string str(std::string_view s) { return std::string(s); }

// Segment sizes for a count of n: tiny segments (one element each for small
// counts; 64 bytes, i.e. 9 to 33 segments per block, for larger ones, more than
// the pipeline's staging slots) and the default.
std::vector<std::size_t> segments(std::size_t n) { return {n <= 16 ? small_segment : 64, 0}; }

// Allreduce of `n` elements in place and out of place (the latter with a
// caller-owned workspace and an extra output element that must stay untouched).
template <class T, class Op> void check_allreduce(mpi::communicator& c, std::size_t n, Op op, options o) {
  const int p = c.size(), r = c.rank();
  const auto want = [&](std::size_t i) { return expected(Op::kind, p, i); };
  INFO(str(dtype_traits<T>::name), " ", str(Op::name), " count=", n, " segment_bytes=", o.segment_bytes);
  {
    auto data = make_input<T>(Op::kind, r, n);
    allreduce(c, std::span(data), op, o);
    CHECK(first_mismatch(data.data(), n, want) == n);
  }
  {
    const auto in = make_input<T>(Op::kind, r, n);
    std::vector<T> out(n + 1, from_double<T>(sentinel));
    std::vector<std::byte> ws(allreduce_workspace_bytes<T>(c, n, o));
    o.workspace = ws;
    allreduce(c, std::span(in), std::span(out), op, o);
    CHECK(first_mismatch(out.data(), n, want) == n);
    CHECK(to_double(out[n]) == sentinel);
    CHECK(first_mismatch(in.data(), n, [&](std::size_t i) { return input(Op::kind, r, i); }) == n);
    CHECK(same_bytes_on_all_ranks(c, out.data(), n * sizeof(T)));
  }
}

template <class T, class Op> void check_reduce_scatter(mpi::communicator& c, std::size_t n, Op op, const options& o) {
  const int p = c.size(), r = c.rank();
  const auto first = n * static_cast<std::size_t>(r);
  const auto want = [&](std::size_t k) { return expected(Op::kind, p, first + k); };
  INFO(str(dtype_traits<T>::name), " ", str(Op::name), " block=", n, " segment_bytes=", o.segment_bytes);
  auto in = make_input<T>(Op::kind, r, n * static_cast<std::size_t>(p));
  std::vector<T> out(n, from_double<T>(sentinel));
  reduce_scatter(c, std::span<const T>(in), std::span(out), op, o);
  CHECK(first_mismatch(out.data(), n, want) == n);
  // In place: the output is this rank's own block of the input.
  reduce_scatter(c, std::span<const T>(in), std::span(in).subspan(first, n), op, o);
  CHECK(first_mismatch(in.data() + first, n, want) == n);
}

template <class T> void check_allgather(mpi::communicator& c, std::size_t n, const options& o) {
  const int p = c.size(), r = c.rank();
  INFO(str(dtype_traits<T>::name), " block=", n, " segment_bytes=", o.segment_bytes);
  const auto want = [&](std::size_t j) { return pattern(static_cast<int>(j / n), j % n); };
  std::vector<T> in(n);
  for (std::size_t i = 0; i < n; ++i) in[i] = from_double<T>(pattern(r, i));
  const std::size_t total = n * static_cast<std::size_t>(p);
  std::vector<T> out(total, from_double<T>(sentinel));
  allgather(c, std::span<const T>(in), std::span(out), o);
  CHECK(first_mismatch(out.data(), total, want) == total);
  // In place: the input is this rank's own block of the output.
  std::vector<T> io(total, from_double<T>(sentinel));
  std::copy(in.begin(), in.end(), io.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(r)));
  allgather(c, std::span<const T>(io).subspan(n * static_cast<std::size_t>(r), n), std::span(io), o);
  CHECK(first_mismatch(io.data(), total, want) == total);
}

template <class T> void check_broadcast(mpi::communicator& c, std::size_t n, int root, const options& o) {
  INFO(str(dtype_traits<T>::name), " count=", n, " root=", root, " segment_bytes=", o.segment_bytes);
  const auto want = [&](std::size_t i) { return pattern(root, i); };
  std::vector<T> data(n, from_double<T>(sentinel));
  if (c.rank() == root)
    for (std::size_t i = 0; i < n; ++i) data[i] = from_double<T>(pattern(root, i));
  broadcast(c, std::span(data), root, o);
  CHECK(first_mismatch(data.data(), n, want) == n);
}

// Reduce to `root`: out of place (one extra element that stays untouched;
// non-roots' buffers untouched), then in place at the root with an empty
// output elsewhere.
template <class T, class Op> void check_reduce(mpi::communicator& c, std::size_t n, int root, Op op, options o) {
  const int p = c.size(), r = c.rank();
  INFO(str(dtype_traits<T>::name), " ", str(Op::name), " count=", n, " root=", root,
       " segment_bytes=", o.segment_bytes);
  const auto want = [&](std::size_t i) { return expected(Op::kind, p, i); };
  const auto untouched = [](std::size_t) { return sentinel; };
  auto in = make_input<T>(Op::kind, r, n);
  std::vector<T> out(n + 1, from_double<T>(sentinel));
  std::vector<std::byte> ws(reduce_workspace_bytes<T>(c, n, o));
  o.workspace = ws;
  reduce(c, std::span<const T>(in), std::span(out), root, op, o);
  if (r == root) {
    CHECK(first_mismatch(out.data(), n, want) == n);
    CHECK(to_double(out[n]) == sentinel);
  } else {
    CHECK(first_mismatch(out.data(), n + 1, untouched) == n + 1);
  }
  CHECK(first_mismatch(in.data(), n, [&](std::size_t i) { return input(Op::kind, r, i); }) == n);
  o.workspace = {};
  reduce(c, std::span<const T>(in), r == root ? std::span(in) : std::span<T>(), root, op, o);
  if (r == root) CHECK(first_mismatch(in.data(), n, want) == n);
}

} // namespace

TEST_CASE_TEMPLATE("allreduce: every operator, count and segment size", T, GRADSYNC_ALL_DTYPES) {
  auto c = make_comm();
  for_each_op([&](auto op) {
    for (auto n : small_counts(c.size()))
      for (auto seg : segments(n)) check_allreduce<T>(c, n, op, {.segment_bytes = seg});
  });
}

TEST_CASE("allreduce: large counts") {
  auto c = make_comm();
  check_allreduce<float>(c, large_count, op::sum{}, {});
  check_allreduce<bfloat16>(c, large_count, op::avg{}, {.segment_bytes = 4096});
  check_allreduce<std::int64_t>(c, large_count, op::max{}, {});
}

TEST_CASE_TEMPLATE("reduce_scatter: every operator, count and segment size", T, GRADSYNC_ALL_DTYPES) {
  auto c = make_comm();
  for_each_op([&](auto op) {
    for (auto n : small_counts(c.size()))
      for (auto seg : segments(n)) check_reduce_scatter<T>(c, n, op, {.segment_bytes = seg});
  });
}

TEST_CASE("reduce_scatter: large counts") {
  auto c = make_comm();
  const auto block = large_count / static_cast<std::size_t>(c.size());
  check_reduce_scatter<double>(c, block, op::sum{}, {});
  check_reduce_scatter<half>(c, block, op::min{}, {.segment_bytes = 4096});
}

TEST_CASE_TEMPLATE("allgather: every count and segment size", T, GRADSYNC_ALL_DTYPES) {
  auto c = make_comm();
  for (auto n : small_counts(c.size()))
    for (auto seg : segments(n)) check_allgather<T>(c, n, {.segment_bytes = seg});
}

TEST_CASE("allgather: large counts") {
  auto c = make_comm();
  check_allgather<std::int32_t>(c, large_count / static_cast<std::size_t>(c.size()), {});
}

TEST_CASE_TEMPLATE("broadcast: every root, count and segment size", T, GRADSYNC_ALL_DTYPES) {
  auto c = make_comm();
  for (int root = 0; root < c.size(); ++root)
    for (auto n : small_counts(c.size()))
      for (auto seg : segments(n)) check_broadcast<T>(c, n, root, {.segment_bytes = seg});
}

TEST_CASE("broadcast: large counts") {
  auto c = make_comm();
  check_broadcast<float>(c, large_count, c.size() - 1, {});
  check_broadcast<half>(c, large_count, 0, {.segment_bytes = 4096});
}

TEST_CASE_TEMPLATE("reduce: every root, operator, count and segment size", T, GRADSYNC_ALL_DTYPES) {
  auto c = make_comm();
  for_each_op([&](auto op) {
    for (int root = 0; root < c.size(); ++root)
      for (auto n : small_counts(c.size()))
        for (auto seg : segments(n)) check_reduce<T>(c, n, root, op, {.segment_bytes = seg});
  });
}

TEST_CASE("reduce: large counts") {
  auto c = make_comm();
  check_reduce<std::int32_t>(c, large_count, 1 % c.size(), op::prod{}, {});
  check_reduce<double>(c, large_count, c.size() - 1, op::avg{}, {});
}

// Every schedule the library offers, forced through options::algo, on the
// MPI transport. A schedule that does not implement a collective says so with
// a gradsync::error before any message; that combination is reported, not failed.
TEST_CASE("every algorithm, forced, over MPI") {
  auto c = make_comm();
  const int p = c.size();
  std::set<std::string> skipped;
  for (const algorithm a : {algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd,
                            algorithm::rabenseifner, algorithm::hier, algorithm::bruck, algorithm::scatter_allgather}) {
    const std::string an(algorithm_name(a));
    auto attempt = [&](const char* what, auto f) {
      try {
        f();
      } catch (const error& e) {
        if (e.reason().find("not available") == std::string::npos) throw;
        skipped.insert(an + "/" + what);
      }
    };
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(p + 1), std::size_t{257},
                          std::size_t{100'003}}) {
      INFO("algorithm ", an, " count ", n);
      // hier: the node's group (one on this machine) for even counts, groups of 2 for odd ones
      const options o{.algo = a, .segment_bytes = n == 257 ? std::size_t{64} : std::size_t{0},
                      .group_size = a == algorithm::hier && n % 2 == 1 ? 2 : 0};
      attempt("allreduce", [&] {
        check_allreduce<float>(c, n, op::sum{}, o);
        check_allreduce<bfloat16>(c, n, op::avg{}, o);
      });
      attempt("reduce_scatter", [&] { check_reduce_scatter<double>(c, n / static_cast<std::size_t>(p), op::max{}, o); });
      attempt("allgather", [&] { check_allgather<std::int32_t>(c, n / static_cast<std::size_t>(p), o); });
      attempt("broadcast", [&] { check_broadcast<half>(c, n, p - 1, o); });
      attempt("reduce", [&] { check_reduce<std::int64_t>(c, n, 0, op::sum{}, o); });
    }
  }
  std::string list;
  for (const auto& k : skipped) list += " " + k;
  if (c.rank() == 0 && !list.empty()) MESSAGE("not offered by the library (skipped):", list);
}

TEST_CASE("integer avg truncates toward zero") {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  // Sum over ranks of r is p(p-1)/2, not a multiple of p for even p.
  std::vector<std::int32_t> v = {r, -r, 7 * r + 1};
  allreduce(c, std::span(v), op::avg{});
  const int s = p * (p - 1) / 2;
  CHECK(v[0] == s / p);
  CHECK(v[1] == -s / p);
  CHECK(v[2] == (7 * s + p) / p);
}

TEST_CASE("barrier: no rank leaves before the last one enters") {
  auto c = make_comm();
  const int p = c.size();
  // steady_clock is CLOCK_MONOTONIC, one clock for all processes of a machine,
  // so entry and exit times compare across ranks (whatever the scheduling skew).
  for (int q = 0; q < p; ++q)
    if (c.node_of(q) != c.node_of(0)) {
      if (c.rank() == 0) MESSAGE("skipped: ranks on several machines have no common clock");
      return;
    }
  const auto now_ns = [] {
    return static_cast<std::int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now().time_since_epoch())
                                         .count());
  };
  for (int late = 0; late < p; ++late) {
    MPI_Barrier(c.native());
    if (c.rank() == late) std::this_thread::sleep_for(50ms);
    std::array<std::int64_t, 2> mine{};
    mine[0] = now_ns();
    barrier(c);
    mine[1] = now_ns();
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(p));
    MPI_Allgather(mine.data(), 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, c.native());
    std::int64_t last_entry = all[0], first_exit = all[1];
    for (int q = 0; q < p; ++q) {
      last_entry = std::max(last_entry, all[2 * static_cast<std::size_t>(q)]);
      first_exit = std::min(first_exit, all[2 * static_cast<std::size_t>(q) + 1]);
    }
    INFO("late rank ", late, ": first exit - last entry = ", first_exit - last_entry, " ns");
    CHECK(first_exit >= last_entry);
  }
  for (int i = 0; i < 50; ++i) barrier(c); // back to back: no message of one matches another
  barrier(c, {.tag = 77});
}

// Inexact inputs: the rounding of every step shows, so agreement between ranks
// and with the documented order is a real check, not a coincidence.
namespace {

double noise(int r, std::size_t i) {
  std::uint64_t x = (static_cast<std::uint64_t>(r) << 40) ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<double>(x >> 11) / 9007199254740992.0 * 2.0 - 1.0; // [-1, 1)
}

template <class T> void check_ring_order(mpi::communicator& c, std::size_t n, const options& o) {
  const int p = c.size(), r = c.rank();
  INFO(str(dtype_traits<T>::name), " count=", n, " segment_bytes=", o.segment_bytes);
  std::vector<std::vector<T>> x(static_cast<std::size_t>(p), std::vector<T>(n));
  for (int q = 0; q < p; ++q)
    for (std::size_t i = 0; i < n; ++i) x[static_cast<std::size_t>(q)][i] = from_double<T>(noise(q, i) * 100);
  auto data = x[static_cast<std::size_t>(r)];
  allreduce(c, std::span(data), op::sum{}, o);
  CHECK(same_bytes_on_all_ranks(c, data.data(), n * sizeof(T)));

  // Documented order: element i of block b (blocks differ in size by at most
  // one, larger first) is op(...op(x[b+1], x[b+2])..., x[b]), narrowed per step.
  const std::size_t q = n / static_cast<std::size_t>(p), rem = n % static_cast<std::size_t>(p);
  std::size_t mism = n;
  for (std::size_t i = 0; i < n && mism == n; ++i) {
    const std::size_t b = i < rem * (q + 1) ? i / (q + 1) : rem + (i - rem * (q + 1)) / q;
    auto idx = [&](std::size_t k) { return (b + k) % static_cast<std::size_t>(p); };
    T acc = x[idx(1)][i];
    for (int k = 2; k <= p; ++k) {
      const T v = x[idx(static_cast<std::size_t>(k))][i];
      if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
        acc = T(static_cast<float>(acc) + static_cast<float>(v)); // widened to float per step
      else
        acc = acc + v;
    }
    if (std::memcmp(&acc, &data[i], sizeof(T)) != 0) mism = i;
  }
  CHECK(mism == n);

  // Run to run: the same inputs give the same bits.
  auto again = x[static_cast<std::size_t>(r)];
  allreduce(c, std::span(again), op::sum{}, o);
  CHECK(std::memcmp(again.data(), data.data(), n * sizeof(T)) == 0);
}

} // namespace

TEST_CASE_TEMPLATE("allreduce: ranks agree bitwise and follow the ring's documented order", T, float, double,
                   gradsync::half, gradsync::bfloat16) {
  auto c = make_comm();
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{1001}})
    for (auto seg : segments(n)) check_ring_order<T>(c, n, {.algo = algorithm::ring, .segment_bytes = seg});
  check_ring_order<T>(c, 200'003, {.algo = algorithm::ring, .segment_bytes = 8192});
}

// The MPI library's collectives as an independent reference (for half and
// bfloat16 through gradsync's user-defined MPI_Op).
TEST_CASE_TEMPLATE("agreement with the native MPI collectives", T, float, double, std::int32_t, gradsync::half,
                   gradsync::bfloat16) {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(p + 1), std::size_t{10'007}}) {
    INFO(str(dtype_traits<T>::name), " count=", n);
    const auto in = make_input<T>(op_kind::sum, r, n);
    std::vector<T> ours(n), theirs(n);
    allreduce(c, std::span(in), std::span(ours), op::sum{});
    mpi::native::allreduce(c, std::span(in), std::span(theirs), op::sum{});
    CHECK(std::memcmp(ours.data(), theirs.data(), n * sizeof(T)) == 0);
    CHECK(first_mismatch(theirs.data(), n, [&](std::size_t i) { return expected(op_kind::sum, p, i); }) == n);

    auto ours_avg = in, theirs_avg = in; // in place on both sides
    allreduce(c, std::span(ours_avg), op::avg{});
    mpi::native::allreduce(c, std::span<const T>(theirs_avg), std::span(theirs_avg), op::avg{});
    CHECK(std::memcmp(ours_avg.data(), theirs_avg.data(), n * sizeof(T)) == 0);

    std::vector<T> big = make_input<T>(op_kind::max, r, n * static_cast<std::size_t>(p)), rs1(n), rs2(n);
    reduce_scatter(c, std::span<const T>(big), std::span(rs1), op::max{});
    mpi::native::reduce_scatter(c, std::span<const T>(big), std::span(rs2), op::max{});
    CHECK(std::memcmp(rs1.data(), rs2.data(), n * sizeof(T)) == 0);

    std::vector<T> ag1(n * static_cast<std::size_t>(p)), ag2(ag1.size());
    allgather(c, std::span(in), std::span(ag1));
    mpi::native::allgather(c, std::span(in), std::span(ag2));
    CHECK(std::memcmp(ag1.data(), ag2.data(), ag1.size() * sizeof(T)) == 0);

    const int root = p - 1;
    std::vector<T> rd1(n), rd2(n);
    reduce(c, std::span(in), std::span(rd1), root, op::sum{});
    mpi::native::reduce(c, std::span(in), std::span(rd2), root, op::sum{});
    if (r == root) CHECK(std::memcmp(rd1.data(), rd2.data(), n * sizeof(T)) == 0);

    auto b1 = in, b2 = in;
    broadcast(c, std::span(b1), root);
    mpi::native::broadcast(c, std::span(b2), root);
    CHECK(std::memcmp(b1.data(), b2.data(), n * sizeof(T)) == 0);
  }
  mpi::native::barrier(c);
}

TEST_CASE_TEMPLATE("inexact sums agree with native MPI within rounding", T, float, double) {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  const std::size_t n = 65'537;
  std::vector<T> in(n), ours(n), theirs(n);
  for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<T>(noise(r, i));
  allreduce(c, std::span(in), std::span(ours), op::sum{});
  mpi::native::allreduce(c, std::span(in), std::span(theirs), op::sum{});
  // p - 1 roundings each of at most half an ulp of a sum bounded by p.
  const double tol = p * p * std::numeric_limits<T>::epsilon();
  std::size_t bad = n;
  for (std::size_t i = 0; i < n && bad == n; ++i) {
    double exact = 0;
    for (int q = 0; q < p; ++q) exact += static_cast<double>(static_cast<T>(noise(q, i)));
    if (std::abs(static_cast<double>(ours[i]) - exact) > tol || std::abs(static_cast<double>(theirs[i]) - exact) > tol)
      bad = i;
  }
  CHECK(bad == n);
}

TEST_CASE("staged over MPI: every collective on staged ranges, the call check framing the staging blocks") {
  auto c = make_comm();
  // 0, 1, ragged, and large enough for many segments (kept small at 4 ranks on 2 cores).
  const std::size_t big = c.size() >= 4 ? 20001 : 70001;
  CHECK_NOTHROW(test::staged_collectives(c, {0, 1, static_cast<std::size_t>(c.size()) * 7 + 3, big}));
}

TEST_CASE("staged over a CUDA-aware MPI (GRADSYNC_MPI_DEVICE=1, host memory standing in): unstaged outside the framed check") {
  {
    auto plain = make_comm();
    CHECK_FALSE(plain.gpu_aware()); // Debian's MPICH is not CUDA-aware
  }
  ::setenv("GRADSYNC_MPI_DEVICE", "1", 1);
  auto c = make_comm();
  ::unsetenv("GRADSYNC_MPI_DEVICE");
  REQUIRE(c.gpu_aware());
  const int p = c.size(), r = c.rank();
  CHECK_NOTHROW(test::staged_collectives(c, {1, 20001}));
  auto m = test::counting_copier::all_device();
  staged s(c, m);
  test::device_host ex;
  options o;
  o.algo = algorithm::ring;
  o.verify = verification::never;
  std::vector<float> v(20001, static_cast<float>(r + 1));
  allreduce(s, ex, std::span(v), op::sum{}, o);
  CHECK(v[0] == static_cast<float>(p * (p + 1) / 2));
  CHECK(v[20000] == v[0]);
  CHECK(m.n->to_host.load() == 0); // the library took the "device" ranges as they are
  o.verify = verification::always;  // framed: each message a host frame, so staged
  std::vector<float> w(8, 1.0f);
  allreduce(s, ex, std::span(w), op::sum{}, o);
  CHECK(w[7] == static_cast<float>(p));
  CHECK(m.n->to_host.load() > 0);
}

TEST_CASE("call check between nodes: a large call rides framed where the model's latency between nodes makes the "
          "round dearer; results exact, a deviating count fails every rank (ring, hier)") {
  const int p = make_comm().size();
  if (p < 2) return;
  cost_model m;
  m.global.alpha = 1e-3; // 2000x the 0.5 us the 4 KiB per step was chosen at
  const selector sel(m);
  const std::size_t steps = static_cast<std::size_t>(std::bit_width(static_cast<unsigned>(p - 1)));
  // (schedule, ranks per node): every rank its own node, or nodes of 2
  for (const auto& run : {std::pair{algorithm::ring, 1}, std::pair{algorithm::hier, 1}, std::pair{algorithm::hier, 2}})
    for (const std::size_t n : {std::size_t{8}, std::size_t{300000}}) { // 32 B; 1.2 MB (frames beyond the 256 KiB slab)
      const algorithm a = run.first;
      const int gs = run.second;
      INFO(algorithm_name(a) << " nodes of " << gs << ", " << n << " floats");
      options o;
      o.group_size = gs;
      o.select = &sel;
      o.algo = a;
      o.verify = verification::always;
      {
        auto c = make_comm();
        const std::size_t base = 4096 * steps, limit = detail::framed_limit(c, o);
        const int nodes = (p + gs - 1) / gs;
        if (nodes > 1) { // the round's ceil(log2 nodes) crossing steps at 4 KiB x 2000, the rest at 4 KiB
          const std::size_t crossing = static_cast<std::size_t>(std::bit_width(static_cast<unsigned>(nodes - 1)));
          const std::size_t want = 4096 * ((steps - crossing) + crossing * 2000);
          CHECK(limit >= want - 1);
          CHECK(limit <= want + 1);
        } else {
          CHECK(limit == base);
        }
        std::vector<float> v(n, static_cast<float>(c.rank() + 1));
        allreduce(c, std::span(v), op::sum{}, o);
        CHECK(v[0] == static_cast<float>(p * (p + 1) / 2));
        CHECK(v.back() == v[0]);
      }
      auto c = make_comm();
      c.set_timeout(std::chrono::seconds(20));
      std::vector<float> w(n + (c.rank() == p - 1 ? 1 : 0), 1.0f);
      errc got = errc::invalid_argument;
      bool threw = false;
      try {
        allreduce(c, std::span(w), op::sum{}, o);
      } catch (const error& e) {
        threw = true;
        got = e.kind();
      }
      CHECK(threw);
      CHECK(got == errc::mismatch);
    }
}
