// gradsync: prebuilt instantiations, an opt-in for programs built from many
// translation units. Header-only code is compiled again in every TU that
// calls it: a collective over one transport, dtype and op instantiates every
// schedule the cost model may pick, several megabytes of code, and a test
// suite or trainer with twenty TUs compiles each of them twenty times.
//
// To compile each once:
//   - compile every TU with GRADSYNC_PREBUILT defined: including a transport
//     header (transport/inproc.hpp, shm.hpp, mpi.hpp) then declares that
//     transport's collectives `extern template` (this header), so the TU
//     calls them instead of instantiating them;
//   - build one more TU per transport and dtype (prebuilt/instance.cpp.in,
//     as the top-level meson.build does) that defines them, and link it;
//   - build prebuilt/kernels.cpp, optimised, and link it: the host
//     reductions (exec/host.hpp's GRADSYNC_PREBUILT_KERNELS), which code with
//     GRADSYNC_PREBUILT and the units above call instead of instantiating.
// What is covered: allreduce, reduce, reduce_scatter (every dtype and op),
// broadcast, allgather (every dtype), compressed_allreduce (float dtypes,
// sum and avg), barrier, all on the host executor. Other calls are
// instantiated where they are used, as without the option. Code built with
// a sanitizer or another compiler (nvcc) must not define GRADSYNC_PREBUILT:
// it would call uninstrumented instantiations.
#pragma once

#include <cstdint>
#include <span>

#include "collectives.hpp"
#include "compressed.hpp"

// The instantiations of the reducing collectives over transport C, dtype T
// and op Op; KW is `extern template` (declare) or `template` (define).
#define GRADSYNC_PREBUILT_REDUCING(KW, C, T, Op)                                                                       \
  KW void ::gradsync::allreduce<C, ::gradsync::exec::host, T, Op>(C&, ::gradsync::exec::host&, std::span<const T>,    \
                                                                   std::span<T>, Op, const ::gradsync::options&);    \
  KW void ::gradsync::reduce<C, ::gradsync::exec::host, T, Op>(C&, ::gradsync::exec::host&, std::span<const T>,       \
                                                                std::span<T>, int, Op, const ::gradsync::options&);  \
  KW void ::gradsync::reduce_scatter<C, ::gradsync::exec::host, T, Op>(                                               \
      C&, ::gradsync::exec::host&, std::span<const T>, std::span<T>, Op, const ::gradsync::options&);

// Every collective of dtype T over transport C.
#define GRADSYNC_PREBUILT_DTYPE(KW, C, T)                                                                              \
  GRADSYNC_PREBUILT_REDUCING(KW, C, T, ::gradsync::op::sum)                                                            \
  GRADSYNC_PREBUILT_REDUCING(KW, C, T, ::gradsync::op::prod)                                                           \
  GRADSYNC_PREBUILT_REDUCING(KW, C, T, ::gradsync::op::min)                                                            \
  GRADSYNC_PREBUILT_REDUCING(KW, C, T, ::gradsync::op::max)                                                            \
  GRADSYNC_PREBUILT_REDUCING(KW, C, T, ::gradsync::op::avg)                                                            \
  KW void ::gradsync::broadcast<C, ::gradsync::exec::host, T>(C&, ::gradsync::exec::host&, std::span<T>, int,         \
                                                               const ::gradsync::options&);                          \
  KW void ::gradsync::allgather<C, ::gradsync::exec::host, T>(C&, ::gradsync::exec::host&, std::span<const T>,        \
                                                               std::span<T>, const ::gradsync::options&);

// The compressed allreduce of float dtype T over transport C.
#define GRADSYNC_PREBUILT_COMPRESSED(KW, C, T)                                                                         \
  KW void ::gradsync::compressed_allreduce<C, T, ::gradsync::op::sum>(                                                \
      C&, std::span<T>, const ::gradsync::compression&, ::gradsync::compress_state<T>&, ::gradsync::op::sum,           \
      const ::gradsync::options&);                                                                                     \
  KW void ::gradsync::compressed_allreduce<C, T, ::gradsync::op::avg>(                                                \
      C&, std::span<T>, const ::gradsync::compression&, ::gradsync::compress_state<T>&, ::gradsync::op::avg,           \
      const ::gradsync::options&);

// The float dtypes: their collectives and compressed allreduces.
#define GRADSYNC_PREBUILT_FLOAT(KW, C, T) GRADSYNC_PREBUILT_DTYPE(KW, C, T) GRADSYNC_PREBUILT_COMPRESSED(KW, C, T)

#define GRADSYNC_PREBUILT_BARRIER(KW, C) KW void ::gradsync::barrier<C>(C&, const ::gradsync::options&);

// Everything covered over transport C (what a TU with GRADSYNC_PREBUILT declares).
#define GRADSYNC_PREBUILT_TRANSPORT(KW, C)                                                                             \
  GRADSYNC_PREBUILT_FLOAT(KW, C, float)                                                                                \
  GRADSYNC_PREBUILT_FLOAT(KW, C, double)                                                                               \
  GRADSYNC_PREBUILT_FLOAT(KW, C, ::gradsync::half)                                                                     \
  GRADSYNC_PREBUILT_FLOAT(KW, C, ::gradsync::bfloat16)                                                                 \
  GRADSYNC_PREBUILT_DTYPE(KW, C, std::int32_t)                                                                         \
  GRADSYNC_PREBUILT_DTYPE(KW, C, std::int64_t)                                                                         \
  GRADSYNC_PREBUILT_BARRIER(KW, C)
