// gradsync: element types and their traits. MPI and NCCL handles for each
// type live with their transports (transport/mpi.hpp, transport/nccl.hpp) so
// this header needs neither library.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "config.hpp"
#include "half.hpp"

namespace gradsync {

/// Runtime tag of an element type; also used in wire formats (values are stable).
enum class dtype : std::uint8_t { f32 = 1, f64 = 2, f16 = 3, bf16 = 4, i32 = 5, i64 = 6 };

template <class T> struct dtype_traits; // undefined: not an element type

template <> struct dtype_traits<float> {
  static constexpr dtype id = dtype::f32;
  static constexpr std::string_view name = "f32";
  using accum = float;
};
template <> struct dtype_traits<double> {
  static constexpr dtype id = dtype::f64;
  static constexpr std::string_view name = "f64";
  using accum = double;
};
template <> struct dtype_traits<half> {
  static constexpr dtype id = dtype::f16;
  static constexpr std::string_view name = "f16";
  using accum = float; // every reduction step widens to float
};
template <> struct dtype_traits<bfloat16> {
  static constexpr dtype id = dtype::bf16;
  static constexpr std::string_view name = "bf16";
  using accum = float;
};
template <> struct dtype_traits<std::int32_t> {
  static constexpr dtype id = dtype::i32;
  static constexpr std::string_view name = "i32";
  using accum = std::int32_t;
};
template <> struct dtype_traits<std::int64_t> {
  static constexpr dtype id = dtype::i64;
  static constexpr std::string_view name = "i64";
  using accum = std::int64_t;
};

/// An element type gradsync can reduce.
template <class T>
concept element = requires {
  { dtype_traits<std::remove_cv_t<T>>::id } -> std::convertible_to<dtype>;
};

/// The type a reduction step computes in (float for half and bfloat16).
template <element T> using accum_t = typename dtype_traits<std::remove_cv_t<T>>::accum;

/// Size in bytes of one element of runtime type `t`.
constexpr std::size_t dtype_size(dtype t) {
  switch (t) {
  case dtype::f32: case dtype::i32: return 4;
  case dtype::f64: case dtype::i64: return 8;
  case dtype::f16: case dtype::bf16: return 2;
  }
  return 0;
}

/// Short name ("f32", "bf16", ...) of runtime type `t`; "?" when invalid.
constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
  case dtype::f32: return "f32";
  case dtype::f64: return "f64";
  case dtype::f16: return "f16";
  case dtype::bf16: return "bf16";
  case dtype::i32: return "i32";
  case dtype::i64: return "i64";
  }
  return "?";
}

/// Widen one element to its accumulation type.
template <element T> GRADSYNC_HD inline accum_t<T> widen(T v) {
  return static_cast<accum_t<T>>(v);
}
/// Narrow an accumulator back to the element type (round to nearest even).
template <element T> GRADSYNC_HD inline T narrow(accum_t<T> v) { return static_cast<T>(v); }

} // namespace gradsync
