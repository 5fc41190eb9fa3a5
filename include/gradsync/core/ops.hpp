// gradsync: reduction operators as function objects with traits.
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>

#include "config.hpp"
#include "dtype.hpp"

namespace gradsync {

/// Runtime tag of a reduction operator.
enum class op_kind : std::uint8_t { sum, prod, min, max, avg };

namespace op {

/// Elementwise sum.
struct sum {
  static constexpr op_kind kind = op_kind::sum;
  static constexpr std::string_view name = "sum";
  static constexpr bool commutative = true;
  template <class A> GRADSYNC_HD A operator()(A a, A b) const { return a + b; }
  /// -0.0 for floating types: +0.0 + -0.0 is +0.0, so only -0.0 leaves every x unchanged.
  template <class A> static constexpr A identity() {
    if constexpr (std::is_floating_point_v<A>) return -A(0);
    else return A(0);
  }
};

/// Elementwise product.
struct prod {
  static constexpr op_kind kind = op_kind::prod;
  static constexpr std::string_view name = "prod";
  static constexpr bool commutative = true;
  template <class A> GRADSYNC_HD A operator()(A a, A b) const { return a * b; }
  template <class A> static constexpr A identity() { return A(1); }
};

/// Elementwise minimum. A NaN operand on the left is kept (b < NaN is false).
struct min {
  static constexpr op_kind kind = op_kind::min;
  static constexpr std::string_view name = "min";
  static constexpr bool commutative = true;
  template <class A> GRADSYNC_HD A operator()(A a, A b) const { return b < a ? b : a; }
  template <class A> static constexpr A identity() {
    if constexpr (std::numeric_limits<A>::has_infinity) return std::numeric_limits<A>::infinity();
    else return std::numeric_limits<A>::max();
  }
};

/// Elementwise maximum. A NaN operand on the left is kept.
struct max {
  static constexpr op_kind kind = op_kind::max;
  static constexpr std::string_view name = "max";
  static constexpr bool commutative = true;
  template <class A> GRADSYNC_HD A operator()(A a, A b) const { return a < b ? b : a; }
  template <class A> static constexpr A identity() {
    if constexpr (std::numeric_limits<A>::has_infinity) return -std::numeric_limits<A>::infinity();
    else return std::numeric_limits<A>::lowest();
  }
};

/// Mean over ranks: reduced as a sum, divided by the rank count once, at the
/// end (integers divide truncating toward zero).
struct avg {
  static constexpr op_kind kind = op_kind::avg;
  static constexpr std::string_view name = "avg";
  static constexpr bool commutative = true;
  template <class A> GRADSYNC_HD A operator()(A a, A b) const { return a + b; }
  /// -0.0 for floating types: +0.0 + -0.0 is +0.0, so only -0.0 leaves every x unchanged.
  template <class A> static constexpr A identity() {
    if constexpr (std::is_floating_point_v<A>) return -A(0);
    else return A(0);
  }
};

} // namespace op

/// A reduction operator: a commutative binary function object with an identity.
template <class Op>
concept reduce_op = requires(Op o, float a) {
  { Op::kind } -> std::convertible_to<op_kind>;
  { Op::commutative } -> std::convertible_to<bool>;
  { o(a, a) } -> std::convertible_to<float>;
  { Op::template identity<float>() } -> std::convertible_to<float>;
};

/// Short name of runtime op `k`.
constexpr std::string_view op_name(op_kind k) {
  switch (k) {
  case op_kind::sum: return "sum";
  case op_kind::prod: return "prod";
  case op_kind::min: return "min";
  case op_kind::max: return "max";
  case op_kind::avg: return "avg";
  }
  return "?";
}

/// Calls `f(Op{})` for the operator named by `k` (runtime -> compile time).
template <class F> decltype(auto) dispatch_op(op_kind k, F&& f) {
  switch (k) {
  case op_kind::prod: return f(op::prod{});
  case op_kind::min: return f(op::min{});
  case op_kind::max: return f(op::max{});
  case op_kind::avg: return f(op::avg{});
  case op_kind::sum: break;
  }
  return f(op::sum{});
}

/// Calls `f(T{})` for the element type named by `t`.
template <class F> decltype(auto) dispatch_dtype(dtype t, F&& f) {
  switch (t) {
  case dtype::f64: return f(double{});
  case dtype::f16: return f(half{});
  case dtype::bf16: return f(bfloat16{});
  case dtype::i32: return f(std::int32_t{});
  case dtype::i64: return f(std::int64_t{});
  case dtype::f32: break;
  }
  return f(float{});
}

} // namespace gradsync
