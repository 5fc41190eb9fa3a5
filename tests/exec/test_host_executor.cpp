// The host executor (exec/host.hpp) against scalar references written here,
// independently of core/reduce.hpp: every dtype x every operator.
#include <doctest/doctest.h>

#include <gradsync/core/error.hpp>
#include <gradsync/exec/host.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "inputs.hpp"

namespace {

using namespace gradsync;
using exec_test::first_difference;
using exec_test::is_16bit_float;
using exec_test::random_values;

#define EXEC_ALL_DTYPES float, double, gradsync::half, gradsync::bfloat16, std::int32_t, std::int64_t

static_assert(executor<exec::host>);
static_assert(exec::host::space == memory_space::host);

// The type the reference computes in: float for the 16-bit floats.
template <class T> using ref_acc = std::conditional_t<is_16bit_float<T>, float, T>;

template <class T> ref_acc<T> up(T v) {
  if constexpr (is_16bit_float<T>) return static_cast<float>(v);
  else return v;
}
template <class T> T down(ref_acc<T> v) {
  if constexpr (is_16bit_float<T>) return T(v);
  else return v;
}

// The reference of one reduction step: the definition of each operator.
template <class T> T ref_combine(op_kind k, T a, T b) {
  const ref_acc<T> x = up(a), y = up(b);
  switch (k) {
  case op_kind::sum:
  case op_kind::avg: return down<T>(x + y);
  case op_kind::prod: return down<T>(x * y);
  case op_kind::min: return down<T>(y < x ? y : x);
  case op_kind::max: return down<T>(x < y ? y : x);
  }
  return T{};
}

constexpr std::size_t sizes[] = {0, 1, 7, 1003};

template <class T, class Op> void check_reduce(Op op) {
  const exec::host ex;
  for (std::size_t n : sizes) {
    CAPTURE(n);
    const auto a = random_values<T>(n, 11 + n), b = random_values<T>(n, 97 + n);
    std::vector<T> want(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = ref_combine(Op::kind, a[i], b[i]);

    std::vector<T> y(n + 1, T{}); // one sentinel past the end
    const T sentinel = down<T>(ref_acc<T>(42));
    y[n] = sentinel;
    ex.reduce(y.data(), a.data(), b.data(), n, op);
    CHECK(first_difference(y.data(), want.data(), n) == n);
    CHECK(first_difference(&y[n], &sentinel, 1) == 1);

    auto ya = a; // y == a, exactly
    ex.reduce(ya.data(), ya.data(), b.data(), n, op);
    CHECK(first_difference(ya.data(), want.data(), n) == n);
    auto yb = b; // y == b, exactly
    ex.reduce(yb.data(), a.data(), yb.data(), n, op);
    CHECK(first_difference(yb.data(), want.data(), n) == n);
  }
}

TEST_CASE_TEMPLATE("host executor: reduce of every operator against its definition", T,
                   EXEC_ALL_DTYPES) {
  SUBCASE("sum") { check_reduce<T>(op::sum{}); }
  SUBCASE("prod") { check_reduce<T>(op::prod{}); }
  SUBCASE("min") { check_reduce<T>(op::min{}); }
  SUBCASE("max") { check_reduce<T>(op::max{}); }
  SUBCASE("avg") { check_reduce<T>(op::avg{}); }
}

TEST_CASE("host executor: min and max keep a NaN on the left, drop one on the right") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float a[2] = {nan, 1.f}, b[2] = {1.f, nan};
  float y[2];
  exec::host{}.reduce(y, a, b, 2, op::min{});
  CHECK(y[0] != y[0]);
  CHECK(y[1] == 1.f);
  exec::host{}.reduce(y, a, b, 2, op::max{});
  CHECK(y[0] != y[0]);
  CHECK(y[1] == 1.f);
}

template <class T, class Op> void check_finish(Op op, int ranks) {
  for (std::size_t n : sizes) {
    CAPTURE(n);
    const auto v = random_values<T>(n, 5 + n);
    std::vector<T> want = v;
    if (Op::kind == op_kind::avg)
      for (std::size_t i = 0; i < n; ++i)
        want[i] = down<T>(up(v[i]) / static_cast<ref_acc<T>>(ranks)); // one division
    auto y = v;
    exec::host{}.finish(y.data(), n, op, ranks);
    CHECK(first_difference(y.data(), want.data(), n) == n);
  }
}

TEST_CASE_TEMPLATE("host executor: finish divides avg once by the rank count; other ops untouched",
                   T, EXEC_ALL_DTYPES) {
  for (int ranks : {1, 2, 3, 7}) {
    CAPTURE(ranks);
    check_finish<T>(op::avg{}, ranks);
    check_finish<T>(op::sum{}, ranks);
    check_finish<T>(op::prod{}, ranks);
    check_finish<T>(op::min{}, ranks);
    check_finish<T>(op::max{}, ranks);
  }
}

TEST_CASE("host executor: integer avg truncates toward zero") {
  std::int32_t v[4] = {7, -7, 5, -5};
  exec::host{}.finish(v, 4, op::avg{}, 2);
  CHECK(v[0] == 3);
  CHECK(v[1] == -3);
  CHECK(v[2] == 2);
  CHECK(v[3] == -2);
}

TEST_CASE_TEMPLATE("host executor: copy", T, EXEC_ALL_DTYPES) {
  for (std::size_t n : sizes) {
    CAPTURE(n);
    const auto src = random_values<T>(n, 3 + n);
    std::vector<T> dst(n + 1, down<T>(ref_acc<T>(9)));
    const T sentinel = dst[n];
    exec::host{}.copy(dst.data(), src.data(), n);
    CHECK(first_difference(dst.data(), src.data(), n) == n);
    CHECK(first_difference(&dst[n], &sentinel, 1) == 1);
    auto same = src; // dst == src: nothing to do, nothing changes
    exec::host{}.copy(same.data(), same.data(), n);
    CHECK(first_difference(same.data(), src.data(), n) == n);
  }
}

// The reference of axpby: two products and a sum in float (16-bit floats,
// float) or double (double, integers: rounded half away from zero).
template <class T> T ref_axpby(double a, T x, double b, T y) {
  if constexpr (std::is_integral_v<T>) {
    const double px = a * static_cast<double>(x), py = b * static_cast<double>(y);
    const double s = px + py;
    return static_cast<T>(s < 0 ? s - 0.5 : s + 0.5);
  } else {
    using W = ref_acc<T>;
    const W px = static_cast<W>(a) * up(x), py = static_cast<W>(b) * up(y);
    return down<T>(px + py);
  }
}

TEST_CASE_TEMPLATE("host executor: axpby against two products and a sum", T, EXEC_ALL_DTYPES) {
  for (std::size_t n : sizes) {
    for (const auto& [wa, wb] : {std::pair{0.3, 0.7}, std::pair{-1.25, 2.0}, std::pair{1.0 / 3, 1.0 / 3}}) {
      const double a = wa, b = wb;
      CAPTURE(n);
      CAPTURE(a);
      const auto x = random_values<T>(n, 21 + n), y0 = random_values<T>(n, 23 + n);
      std::vector<T> want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = ref_axpby(a, x[i], b, y0[i]);
      auto y = y0;
      exec::host{}.axpby(y.data(), a, x.data(), b, n);
      CHECK(first_difference(y.data(), want.data(), n) == n);
    }
  }
}

TEST_CASE_TEMPLATE("host executor: axpby closed forms", T, EXEC_ALL_DTYPES) {
  const std::size_t n = 1003;
  const auto x = random_values<T>(n, 1), y0 = random_values<T>(n, 2);
  const auto check_eq = [&](const std::vector<T>& got, auto&& want) {
    for (std::size_t i = 0; i < n; ++i) CHECK(static_cast<double>(up(got[i])) == want(i));
  };
  auto y = y0;
  exec::host{}.axpby(y.data(), 1.0, x.data(), 0.0, n);
  check_eq(y, [&](std::size_t i) { return static_cast<double>(up(x[i])); }); // = x
  y = y0;
  exec::host{}.axpby(y.data(), 0.0, x.data(), 1.0, n);
  check_eq(y, [&](std::size_t i) { return static_cast<double>(up(y0[i])); }); // = y
  y = x;
  exec::host{}.axpby(y.data(), 0.5, x.data(), 0.5, n);
  check_eq(y, [&](std::size_t i) { return static_cast<double>(up(x[i])); }); // mean of x and x
  // Integers in [-60, 60]: 2v - w is exact in every type (bf16 holds integers to 256).
  std::vector<T> v(n), w(n);
  const auto iv = random_values<std::int32_t>(n, 3), iw = random_values<std::int32_t>(n, 4);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = down<T>(static_cast<ref_acc<T>>(iv[i] % 61));
    w[i] = down<T>(static_cast<ref_acc<T>>(iw[i] % 61));
  }
  y = w;
  exec::host{}.axpby(y.data(), 2.0, v.data(), -1.0, n);
  check_eq(y, [&](std::size_t i) { return 2.0 * (iv[i] % 61) - (iw[i] % 61); });
}

TEST_CASE_TEMPLATE("host executor: integer axpby rounds half away from zero", T, std::int32_t,
                   std::int64_t) {
  // 0.5 * x + 0 * y for odd x lands exactly on a half.
  const T x[6] = {1, -1, 3, -3, 5, -5};
  T y[6] = {100, 100, 100, 100, 100, 100};
  exec::host{}.axpby(y, 0.5, x, 0.0, 6);
  const T want[6] = {1, -1, 2, -2, 3, -3};
  for (int i = 0; i < 6; ++i) CHECK(y[i] == want[i]);
  // 0.25 * x: quarters round to the nearer integer.
  const T q[4] = {1, -1, 3, -3};
  T z[4] = {0, 0, 0, 0};
  exec::host{}.axpby(z, 0.25, q, 0.0, 4);
  const T wq[4] = {0, 0, 1, -1};
  for (int i = 0; i < 4; ++i) CHECK(z[i] == wq[i]);
}

TEST_CASE_TEMPLATE("host executor: scratch from the workspace, owned, or rejected", T,
                   EXEC_ALL_DTYPES) {
  const exec::host ex;
  alignas(64) std::byte buf[64 * sizeof(T) + 64];
  SUBCASE("workspace large enough: carved from it") {
    auto s = ex.scratch<T>(std::span(buf, 64 * sizeof(T)), 64, "t", 3);
    CHECK(static_cast<void*>(s.data()) == static_cast<void*>(buf));
  }
  SUBCASE("workspace too small: error naming the call and rank") {
    try {
      (void)ex.scratch<T>(std::span(buf, 64 * sizeof(T) - 1), 64, "t.scratch", 3);
      FAIL("no error");
    } catch (const error& e) {
      CHECK(e.kind() == errc::invalid_argument);
      CHECK(e.op() == "t.scratch");
      CHECK(e.rank() == 3);
    }
  }
  SUBCASE("workspace misaligned: error") {
    if constexpr (alignof(T) > 1) {
      CHECK_THROWS_AS((void)ex.scratch<T>(std::span(buf + 1, 64 * sizeof(T)), 64, "t", 0), error);
    }
  }
  SUBCASE("no workspace: owned memory, writable, distinct per call") {
    auto s1 = ex.scratch<T>({}, 1000, "t", 0);
    auto s2 = ex.scratch<T>({}, 1000, "t", 0);
    REQUIRE(s1.data() != nullptr);
    REQUIRE(s2.data() != nullptr);
    CHECK(s1.data() != s2.data());
    const auto v = random_values<T>(1000, 8);
    std::memcpy(s1.data(), v.data(), 1000 * sizeof(T));
    CHECK(first_difference(s1.data(), v.data(), 1000) == 1000);
  }
  SUBCASE("n = 0 needs nothing") {
    auto s = ex.scratch<T>({}, 0, "t", 0);
    CHECK(s.data() == nullptr);
  }
}

} // namespace
