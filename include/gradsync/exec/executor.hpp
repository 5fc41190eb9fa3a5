// gradsync: the executor concept. An executor is where a schedule's element
// work happens: reducing a received segment into a local one, the final
// division of `avg`, copies, the weighted combine gossip needs, and scratch
// memory. Schedules decide who sends what to whom; they never touch elements
// themselves, so the same schedule runs on host memory (exec/host.hpp) or on
// device memory with a CUDA stream (exec/cuda.cuh).
//
// Every executor computes each element with the same GRADSYNC_HD functions
// (core/reduce.hpp: combine1, finish1, axpby1), in the same operand order, so
// host and device results are bitwise identical.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>

#include "../core/dtype.hpp"
#include "../core/ops.hpp"

namespace gradsync {

/// Where an executor's buffers live.
enum class memory_space { host, device };

/// An executor (see the file comment). For every element type T and reduce
/// operator Op it provides, with n elements and pointers into its memory space:
/// - `reduce(y, a, b, n, op)`: y[i] = op(a[i], b[i]) (y may alias a or b exactly);
/// - `finish(y, n, op, ranks)`: avg's single division by `ranks` (no-op otherwise);
/// - `copy(dst, src, n)`: a copy (nothing when dst == src);
/// - `axpby(y, a, x, b, n)`: y[i] = a*x[i] + b*y[i] in T's accumulation type;
/// - `scratch<T>(workspace, n, op, rank)`: n elements of scratch, carved from the
///   caller's workspace when it is not empty, else owned by the returned object;
/// - `fence()`: makes the results of earlier element work visible to a transport
///   that is not ordered with it (a stream synchronisation on a device; nothing
///   on the host). Schedules call it before sending what the executor wrote.
template <class E>
concept executor = requires(E& e, float* y, const float* a, std::size_t n, std::span<std::byte> ws) {
  { E::space } -> std::convertible_to<memory_space>;
  e.reduce(y, a, a, n, op::sum{});
  e.finish(y, n, op::avg{}, 2);
  e.copy(y, a, n);
  e.axpby(y, 1.0, a, 1.0, n);
  { e.template scratch<float>(ws, n, "", 0).data() } -> std::same_as<float*>;
  e.fence();
};

} // namespace gradsync
