// gradsync-bench collectives: what the command line (collective.cpp) and the
// sweeps (collective_sweep.cpp, compiled once per element type so the builds
// of the many template instances run in parallel) share.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gradsync/algo/options.hpp>
#include <gradsync/compress/spec.hpp>
#include <gradsync/core/dtype.hpp>
#include <gradsync/core/ops.hpp>

#include "common.hpp"

namespace gradsync::bench::coll_bench {

enum class coll { allreduce, reduce_scatter, allgather, broadcast, reduce };

/// allreduce, reduce_scatter and reduce take an operator; the others do not.
inline bool reduces(coll k) { return k != coll::allgather && k != coll::broadcast; }

/// Root of broadcast and reduce.
inline constexpr int root = 0;

/// One entry of -a.
struct algo_choice {
  std::string name;
  bool native = false; ///< the MPI library's own collective
  algorithm a = algorithm::automatic;
};

/// Everything the command line decided.
struct config {
  coll kind = coll::allreduce;
  std::string name, transport, algo_list;
  int ranks = 0;
  std::vector<algo_choice> algos;
  dtype dt = dtype::f32;
  op_kind op = op_kind::sum;
  std::vector<std::size_t> sizes;
  int iters = 0, warmup = -1;
  std::size_t segment_bytes = 0; ///< options::segment_bytes (0: policy default)
  int group_size = 0;            ///< options::group_size and calibrate's groups (0: the transport's nodes)
  bool check = true;
  bool inject = false; ///< corrupt one element on rank 0 per row (tests the checker)
  bool shared = false; ///< buffers from the communicator's alloc_shared (shm)
  verification verify = verification::automatic; ///< options::verify of every call (--verify)
  /// --memcpy-each-size: a "memcpy" row per size (rank 0 copies that many
  /// bytes while the others wait), what bench/cliff_check.py divides by.
  bool memcpy_each_size = false;
  /// --skip-slower F: a forced schedule the model puts above F times the
  /// best prediction of the size's rows is not run; its row says "skipped"
  /// (simulated 1024-rank tables, where such rows take minutes of host time
  /// each and would never be picked). 0: every row runs.
  double skip_slower = 0;
  std::string json;
  /// -z: codecs of compressed allreduce rows (two rows per codec and size:
  /// always compressed, and compress_mode::automatic with its decision).
  std::vector<compress::spec> codecs;
  /// --device: "cpu" (host buffers) or "gpu" (device buffers, collective_gpu.cu).
  std::string device = "cpu";
};

// nccl-tests' bus bandwidth factors: the fraction of the buffer each rank's
// busiest link must carry in a bandwidth-optimal schedule.
inline double bus_factor(coll k, int p) {
  const double n = p;
  switch (k) {
  case coll::allreduce: return 2 * (n - 1) / n;
  case coll::reduce_scatter:
  case coll::allgather: return (n - 1) / n;
  case coll::broadcast:
  case coll::reduce: break;
  }
  return 1;
}

// Closed-form data. Rank r's element i is a small integer, so every partial
// sum, product, min, max and mean is exact in every dtype (f16 and bf16
// included) whatever order an algorithm combines ranks in; the pattern
// repeats every `period` elements. Products use only values 1 and 2, and at
// most 10 ranks contribute a 2, so they never overflow.
inline constexpr std::size_t period = 33;

inline long long input_value(int r, std::size_t i, op_kind k) {
  const auto ur = static_cast<std::size_t>(r);
  if (k == op_kind::prod) return r < 30 && (i + ur) % 3 == 0 ? 2 : 1;
  return static_cast<long long>((i * 7 + ur * 3) % 11) - 5;
}

template <element T> T from_int(long long v) { return narrow<T>(static_cast<accum_t<T>>(v)); }
template <element T> T sentinel() { return from_int<T>(-99); } // never an expected value

// The reduction over `p` ranks of element i, computed directly from the inputs.
template <element T> T reduced_value(int p, std::size_t i, op_kind k) {
  long long acc = input_value(0, i, k);
  for (int r = 1; r < p; ++r) {
    const long long v = input_value(r, i, k);
    switch (k) {
    case op_kind::prod: acc *= v; break;
    case op_kind::min: acc = std::min(acc, v); break;
    case op_kind::max: acc = std::max(acc, v); break;
    case op_kind::sum:
    case op_kind::avg: acc += v; break;
    }
  }
  using A = accum_t<T>;
  if (k == op_kind::avg) return narrow<T>(static_cast<A>(static_cast<A>(acc) / static_cast<A>(p)));
  return from_int<T>(acc);
}

// Buffer shapes of one size, as nccl-tests counts them: `bytes` is the
// per-rank buffer for allreduce, broadcast and reduce, and the total (all
// blocks) for reduce_scatter's input and allgather's output.
struct shape {
  std::size_t in_n = 0, out_n = 0, count = 0, bytes = 0;
};

inline shape shape_of(coll k, std::size_t bytes, std::size_t esz, int p) {
  const std::size_t n = bytes / esz, blk = n / static_cast<std::size_t>(p);
  shape s;
  switch (k) {
  case coll::reduce_scatter: s = {blk * static_cast<std::size_t>(p), blk, blk * static_cast<std::size_t>(p)}; break;
  case coll::allgather: s = {blk, blk * static_cast<std::size_t>(p), blk * static_cast<std::size_t>(p)}; break;
  case coll::broadcast: s = {n, 0, n}; break; // in place on the input buffer
  case coll::allreduce:
  case coll::reduce: s = {n, n, n}; break;
  }
  s.bytes = s.count * esz;
  return s;
}

/// The whole sweep on one rank of `c` with elements of type T: one row per
/// size and algorithm into `rep`, every call with options::select = &sel
/// (the calibrated selector), every row with that model's prediction.
/// Returns the number of wrong elements over all ranks (0 when not
/// checking). Defined, and explicitly instantiated for each compiled-in
/// communicator, in collective_sweep.cpp.
template <class C, class T> std::int64_t sweep(C& c, const config& cfg, const selector& sel, report& rep);

/// --device gpu: the sweep on device buffers over cfg.transport staged
/// through pinned host memory (collective_gpu.cu, compiled by nvcc; without
/// nvcc these throw). Returns the wrong elements over all ranks.
std::int64_t gpu_collective(const config& cfg);

} // namespace gradsync::bench::coll_bench
