// gradsync-bench: the subcommand registry. Each subcommand lives in its own
// source file as `int NAME_main(std::string_view subcommand, int argc, char** argv)`
// (argv[0] is the subcommand name, the options follow) and is registered here
// with ONE line: X(name on the command line, function, one-line summary).
// Add its source file to bench/meson.build.
#pragma once

#include <string_view>

#define GRADSYNC_BENCH_GOSSIP(X)                                                                   \
  X("gossip", gossip_main, "gossip rounds per topology vs the best allreduce; consensus error after R rounds")

#define GRADSYNC_BENCH_COLLECTIVES(X)                                                              \
  X("allreduce", collective_main, "allreduce: every rank gets the reduction (busbw 2(n-1)/n)")     \
  X("reduce_scatter", collective_main, "reduce-scatter: rank r gets block r (busbw (n-1)/n)")      \
  X("allgather", collective_main, "allgather: every rank gets every block (busbw (n-1)/n)")        \
  X("broadcast", collective_main, "broadcast from rank 0 (busbw 1)")                               \
  X("reduce", collective_main, "reduce to rank 0 (busbw 1)")                                      \
  X("alltoall", alltoall_main, "alltoall: block q of rank r goes to rank q (busbw (n-1)/n); -a native: MPI_Alltoall") \
  X("alltoallv", alltoall_main, "alltoallv: per-peer counts (--pattern uniform|skewed|moe|sparse, --dynamic)")

// A simulator build (GRADSYNC_BENCH_SIM, bench/sim/build.sh: SimGrid's
// smpicxx) has the collectives, the exchanges and gossip over MPI; the
// codec and fusion subcommands time computation, which it does not simulate.
#if defined(GRADSYNC_BENCH_SIM)
#define GRADSYNC_BENCH_SUBCOMMANDS(X) GRADSYNC_BENCH_COLLECTIVES(X) GRADSYNC_BENCH_GOSSIP(X)
#else
#define GRADSYNC_BENCH_SUBCOMMANDS(X)                                                              \
  GRADSYNC_BENCH_COLLECTIVES(X)                                                                    \
  X("compress", compress_main, "gradient codecs: encode/decode GB/s, ratio, error vs memcpy")      \
  X("fusion", fusion_main, "tensor fusion: many tensors fused (engine, grouped) vs one allreduce each") \
  X("check-cost", check_cost_main, "the call check's cost on a small allreduce (never vs always, alternating)") \
  GRADSYNC_BENCH_GOSSIP(X)
#endif

namespace gradsync::bench {
#define GRADSYNC_BENCH_DECLARE(name, fn, summary) int fn(std::string_view, int, char**);
GRADSYNC_BENCH_SUBCOMMANDS(GRADSYNC_BENCH_DECLARE)
#undef GRADSYNC_BENCH_DECLARE
} // namespace gradsync::bench
