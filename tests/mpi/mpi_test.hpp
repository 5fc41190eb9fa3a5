// Helpers shared by the MPI suites: communicators with a test timeout, exact
// input patterns with closed-form results, and cross-rank comparisons.
#pragma once

#include <doctest/doctest.h>

#include <gradsync/collectives.hpp>
#include <gradsync/transport/mpi.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace gradsync::test {

using namespace std::chrono_literals;

/// Timeout of test communicators: long enough for the largest collective of
/// the suites on 4 ranks oversubscribing 2 cores, short enough that a rank
/// left waiting fails within the meson timeout instead of hanging.
inline constexpr std::chrono::milliseconds test_timeout = 30s;

/// A gradsync communicator over `user` (a fresh duplicate per test case, so
/// that a failed case cannot leave messages behind for the next one).
inline mpi::communicator make_comm(MPI_Comm user = MPI_COMM_WORLD) {
  mpi::communicator c(user);
  c.set_timeout(test_timeout);
  return c;
}

/// Converts a (small, exactly representable) value to element type T.
template <element T> T from_double(double v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}
template <element T> double to_double(T v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}

/// Input of rank r at element i for operator k. Small integers, so every sum,
/// mean and product over up to 4 ranks is exact in every dtype (bfloat16
/// holds integers up to 256 exactly, half up to 2048).
inline double input(op_kind k, int r, std::size_t i) {
  switch (k) {
  case op_kind::sum:
  case op_kind::avg: // sum over p ranks = p*(a - 5) + p*(p - 1): a multiple of p
    return static_cast<double>(static_cast<int>(i % 11) - 5 + 2 * r);
  case op_kind::min:
  case op_kind::max:
    return static_cast<double>(static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 3) % 13) - 6);
  case op_kind::prod: {
    const auto m = (i + static_cast<std::size_t>(r)) % 3;
    return m == 0 ? 2.0 : m == 1 ? -1.0 : 1.0;
  }
  }
  return 0;
}

/// Exact result of reducing input(k, 0..p-1, i).
inline double expected(op_kind k, int p, std::size_t i) {
  const double a = static_cast<double>(static_cast<int>(i % 11) - 5);
  switch (k) {
  case op_kind::sum: return p * a + p * (p - 1.0);
  case op_kind::avg: return a + (p - 1.0);
  default: break;
  }
  double acc = input(k, 0, i);
  for (int r = 1; r < p; ++r) {
    const double x = input(k, r, i);
    acc = k == op_kind::min ? std::min(acc, x) : k == op_kind::max ? std::max(acc, x) : acc * x;
  }
  return acc;
}

/// Value rank r contributes at element i to allgather/broadcast: distinct
/// per (rank, element) pattern, exact in every dtype.
inline double pattern(int r, std::size_t i) {
  return static_cast<double>(static_cast<int>((i * 5 + static_cast<std::size_t>(r) * 37) % 101) - 50);
}

/// Value written to memory a collective must not touch.
inline constexpr double sentinel = -99;

template <element T> std::vector<T> make_input(op_kind k, int r, std::size_t n, std::size_t first = 0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = from_double<T>(input(k, r, first + i));
  return v;
}

/// Index of the first element of `got` that differs from `want(i)`, or n.
template <element T, class Want> std::size_t first_mismatch(const T* got, std::size_t n, Want want) {
  for (std::size_t i = 0; i < n; ++i)
    if (to_double(got[i]) != want(i)) return i;
  return n;
}

/// True when `bytes` bytes at `p` are identical on every rank of `c`
/// (gathered with MPI_Allgather on the communicator's private duplicate).
inline bool same_bytes_on_all_ranks(const mpi::communicator& c, const void* p, std::size_t bytes) {
  const int n = static_cast<int>(bytes);
  REQUIRE(static_cast<std::size_t>(n) == bytes);
  std::vector<unsigned char> all(bytes * static_cast<std::size_t>(c.size()));
  const int rc = MPI_Allgather(bytes ? p : nullptr, n, MPI_BYTE, all.data(), n, MPI_BYTE, c.native());
  REQUIRE(rc == MPI_SUCCESS);
  for (int r = 0; r < c.size(); ++r)
    if (bytes && std::memcmp(all.data() + bytes * static_cast<std::size_t>(r), p, bytes) != 0) return false;
  return true;
}

/// Every operator, for loops over operators at compile time.
using all_ops = std::tuple<op::sum, op::avg, op::min, op::max, op::prod>;

template <class F> void for_each_op(F&& f) {
  std::apply([&](auto... o) { (f(o), ...); }, all_ops{});
}

/// Counts every collective is checked with on p ranks: empty, fewer elements
/// than ranks, one more than the ranks, and enough for many segments.
inline std::vector<std::size_t> small_counts(int p) {
  const auto q = static_cast<std::size_t>(p);
  return {0, 1, q - 1, q + 1, 257};
}

/// Large count of the suites (crossed with a few dtype/op pairs only).
inline constexpr std::size_t large_count = 1'000'003;

/// Segment sizes: 1 byte (one element per segment: the deepest pipelines)
/// and the default.
inline constexpr std::size_t small_segment = 1;

} // namespace gradsync::test
