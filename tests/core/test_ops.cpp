// Reduction operators, dtype traits and the host reduction kernels.
#include <doctest/doctest.h>

#include <gradsync/core/dtype.hpp>
#include <gradsync/core/ops.hpp>
#include <gradsync/core/reduce.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace gradsync;

template <class T> constexpr bool is_int = std::is_integral_v<T>;

template <class T> std::vector<T> from_floats(std::initializer_list<float> fs) {
  std::vector<T> v;
  for (float f : fs) v.push_back(static_cast<T>(f));
  return v;
}

// Interesting non-NaN values of T, including the extremes.
template <class T> std::vector<T> samples() {
  if constexpr (is_int<T>)
    return {T(0), T(1), T(-1), T(7), T(-123456), std::numeric_limits<T>::max(),
            std::numeric_limits<T>::min()};
  else if constexpr (std::is_same_v<T, half>)
    return {half::from_bits(0x0000), half::from_bits(0x8000), half(1.f), half(-2.5f),
            half::from_bits(0x0001), half::from_bits(0x7bff), half::from_bits(0xfbff),
            half::from_bits(0x7c00), half::from_bits(0xfc00), half(0.1f)};
  else if constexpr (std::is_same_v<T, bfloat16>)
    return {bfloat16::from_bits(0x0000), bfloat16::from_bits(0x8000), bfloat16(1.f),
            bfloat16(-2.5f), bfloat16::from_bits(0x0001), bfloat16::from_bits(0x7f7f),
            bfloat16::from_bits(0xff7f), bfloat16::from_bits(0x7f80), bfloat16::from_bits(0xff80),
            bfloat16(0.1f)};
  else
    return {T(0), -T(0), T(1), T(-2.5), std::numeric_limits<T>::denorm_min(),
            std::numeric_limits<T>::max(), std::numeric_limits<T>::lowest(),
            std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(), T(0.1)};
}

// Small values whose sums and products cannot overflow any type.
template <class T> std::vector<T> small_samples() {
  if constexpr (is_int<T>) return {T(0), T(1), T(-1), T(3), T(-7), T(100)};
  else return from_floats<T>({0.f, -0.f, 1.f, -1.f, 3.f, -7.f, 0.375f, 12.f}); // exact even in bf16
}

template <class T> T nan_of() {
  if constexpr (std::is_same_v<T, half>) return half::from_bits(0x7e00);
  else if constexpr (std::is_same_v<T, bfloat16>) return bfloat16::from_bits(0x7fc0);
  else return std::numeric_limits<T>::quiet_NaN();
}

template <class T> bool is_nan(T v) {
  if constexpr (is_int<T>) return false;
  else return std::isnan(static_cast<double>(static_cast<float>(v)));
}

template <class T> bool same_bits(T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

template <class T> double value(T v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return static_cast<float>(v);
  else return static_cast<double>(v);
}

template <class T> std::string show(T v) {
  std::uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return std::to_string(value(v)) + " (bits " + std::to_string(u) + ")";
}

template <class T, class Op> T identity_elem() { return narrow<T>(Op::template identity<accum_t<T>>()); }

template <class F> void for_each_op(F f) {
  f(op::sum{});
  f(op::prod{});
  f(op::min{});
  f(op::max{});
  f(op::avg{});
}

template <class T, class Op> void check_identity(Op) {
  const T id = identity_elem<T, Op>();
  for (const T x : samples<T>()) {
    INFO(Op::name << " x = " << show(x));
    CHECK(same_bits(combine1(id, x, Op{}), x));
    CHECK(same_bits(combine1(x, id, Op{}), x));
  }
}

template <class T, class Op> void check_commutative(Op) {
  static_assert(Op::commutative);
  const auto vs = (Op::kind == op_kind::min || Op::kind == op_kind::max) ? samples<T>() : small_samples<T>();
  for (const T a : vs)
    for (const T b : vs) {
      INFO(Op::name << " a = " << show(a) << " b = " << show(b));
      // by value: min/max of +0 and -0 may return either zero
      CHECK(value(combine1(a, b, Op{})) == value(combine1(b, a, Op{})));
    }
}

} // namespace

#define GRADSYNC_ELEMENT_TYPES float, double, gradsync::half, gradsync::bfloat16, std::int32_t, std::int64_t

TEST_CASE_TEMPLATE("ops: op(identity, x) == x bit for bit", T, GRADSYNC_ELEMENT_TYPES) {
  for_each_op([](auto o) { check_identity<T>(o); });
}

TEST_CASE_TEMPLATE("ops: commutative operators commute", T, GRADSYNC_ELEMENT_TYPES) {
  for_each_op([](auto o) { check_commutative<T>(o); });
}

TEST_CASE_TEMPLATE("ops: sum, prod, min, max give exact values", T, GRADSYNC_ELEMENT_TYPES) {
  const auto vs = small_samples<T>();
  for (const T a : vs)
    for (const T b : vs) {
      INFO("a = " << show(a) << " b = " << show(b));
      CHECK(value(combine1(a, b, op::sum{})) == value(a) + value(b));
      CHECK(value(combine1(a, b, op::avg{})) == value(a) + value(b)); // avg reduces as a sum
      CHECK(value(combine1(a, b, op::prod{})) == value(a) * value(b));
      CHECK(value(combine1(a, b, op::min{})) == std::min(value(a), value(b)));
      CHECK(value(combine1(a, b, op::max{})) == std::max(value(a), value(b)));
    }
}

TEST_CASE_TEMPLATE("ops: half-precision steps round to nearest even", T, gradsync::half, gradsync::bfloat16) {
  // 1 + 2^-11 (half) / 1 + 2^-8 (bf16) is a tie between 1 and the next value: even wins.
  const float tie = std::is_same_v<T, half> ? std::ldexp(1.f, -11) : std::ldexp(1.f, -8);
  CHECK(value(combine1(T(1.f), T(tie), op::sum{})) == 1.f);
  CHECK(value(combine1(T(1.f), T(tie * 3.f), op::sum{})) == 1.f + 4.f * tie);
  T big;
  if constexpr (std::is_same_v<T, half>) big = half::from_bits(0x7bff);
  else big = bfloat16::from_bits(0x7f7f);
  CHECK(std::isinf(value(combine1(big, big, op::sum{})))); // overflow goes to Inf
}

TEST_CASE_TEMPLATE("ops: min and max NaN policy (a NaN on the left is kept)", T, float, double,
                   gradsync::half, gradsync::bfloat16) {
  const T nan = nan_of<T>();
  for (const T x : samples<T>()) {
    INFO("x = " << show(x));
    CHECK(is_nan(combine1(nan, x, op::min{})));
    CHECK(is_nan(combine1(nan, x, op::max{})));
    CHECK(same_bits(combine1(x, nan, op::min{}), x));
    CHECK(same_bits(combine1(x, nan, op::max{}), x));
    CHECK(is_nan(combine1(nan, x, op::sum{})));
    CHECK(is_nan(combine1(x, nan, op::prod{})));
  }
}

TEST_CASE_TEMPLATE("reduce: avg divides once, at finalize", T, GRADSYNC_ELEMENT_TYPES) {
  // Three ranks' contributions reduced as a sum, then one division.
  const T a = T(7), b = T(-3), c = T(1);
  T acc = combine1(combine1(a, b, op::avg{}), c, op::avg{});
  CHECK(value(acc) == 5.0);
  finalize(&acc, 1, op::avg{}, 3);
  if constexpr (is_int<T>) CHECK(value(acc) == 1.0); // 5 / 3 truncates
  else CHECK(same_bits(acc, narrow<T>(accum_t<T>(5) / accum_t<T>(3))));

  std::vector<T> v = {T(-5), T(5), T(-1), T(9), T(0)};
  finalize(v.data(), v.size(), op::avg{}, 2);
  if constexpr (is_int<T>) {
    CHECK(v == std::vector<T>{T(-2), T(2), T(0), T(4), T(0)}); // toward zero
  } else {
    CHECK(value(v[0]) == -2.5);
    CHECK(value(v[3]) == 4.5);
  }
  // one rank: nothing to divide; other ops: finalize is the identity
  std::vector<T> w = {T(9), T(-4)};
  finalize(w.data(), w.size(), op::avg{}, 1);
  finalize(w.data(), w.size(), op::sum{}, 4);
  finalize(w.data(), w.size(), op::max{}, 4);
  CHECK(value(w[0]) == 9.0);
  CHECK(value(w[1]) == -4.0);
}

TEST_CASE("reduce: combine over arrays, aliasing the output") {
  std::vector<float> a = {1, 2, 3, 4}, b = {10, 20, 30, 40}, out(4);
  combine(out.data(), a.data(), b.data(), 4, op::sum{});
  CHECK(out == std::vector<float>{11, 22, 33, 44});
  combine(a.data(), a.data(), b.data(), 4, op::max{});
  CHECK(a == b);
  combine(b.data(), out.data(), b.data(), 4, op::min{});
  CHECK(b == std::vector<float>{10, 20, 30, 40});
  combine(out.data(), out.data(), out.data(), 0, op::prod{}); // n = 0 touches nothing
  CHECK(out[0] == 11);
  std::vector<int> x = {1, 2, 3}, y(3, -1);
  copy_elems(y.data(), x.data(), 3);
  CHECK(y == x);
  copy_elems(y.data(), y.data(), 3); // same buffer: no-op
  copy_elems(static_cast<int*>(nullptr), static_cast<const int*>(nullptr), 0);
  CHECK(y == x);
}

TEST_CASE("ops: runtime dispatch reaches the matching type") {
  for (const auto k : {op_kind::sum, op_kind::prod, op_kind::min, op_kind::max, op_kind::avg}) {
    const auto got = dispatch_op(k, [](auto o) { return decltype(o)::kind; });
    CHECK(got == k);
    CHECK(dispatch_op(k, [](auto o) { return decltype(o)::name; }) == op_name(k));
  }
  CHECK(op_name(op_kind::avg) == "avg");
  CHECK(op_name(static_cast<op_kind>(99)) == "?");
  for (const auto t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64}) {
    CHECK(dispatch_dtype(t, [](auto v) { return dtype_traits<decltype(v)>::id; }) == t);
    CHECK(dispatch_dtype(t, [](auto v) { return sizeof(v); }) == dtype_size(t));
    CHECK(dispatch_dtype(t, [](auto v) { return dtype_traits<decltype(v)>::name; }) == dtype_name(t));
  }
  CHECK(dtype_size(static_cast<dtype>(0)) == 0);
  CHECK(dtype_name(static_cast<dtype>(0)) == "?");
  // wire values are stable
  CHECK(static_cast<int>(dtype::f32) == 1);
  CHECK(static_cast<int>(dtype::i64) == 6);
}

TEST_CASE("dtype: concepts and accumulation types") {
  static_assert(element<float> && element<const double> && element<half> && element<std::int64_t>);
  static_assert(!element<char> && !element<long double> && !element<std::uint32_t>);
  static_assert(std::is_same_v<accum_t<half>, float> && std::is_same_v<accum_t<bfloat16>, float>);
  static_assert(std::is_same_v<accum_t<std::int32_t>, std::int32_t>);
  static_assert(reduce_op<op::sum> && reduce_op<op::prod> && reduce_op<op::min> &&
                reduce_op<op::max> && reduce_op<op::avg>);
  struct not_an_op {};
  static_assert(!reduce_op<not_an_op>);
  CHECK(widen(half(1.5f)) == 1.5f);
  CHECK(narrow<half>(1.0f + std::ldexp(1.f, -11)).bits == half(1.0f).bits);
  CHECK(narrow<bfloat16>(3.0f).bits == 0x4040);
  CHECK(narrow<std::int32_t>(-7) == -7);
}
