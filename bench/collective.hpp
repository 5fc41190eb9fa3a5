// gradsync-bench collectives: what the command line (collective.cpp) and the
// sweeps (collective_sweep.cpp, compiled once per element type so the builds
// of the many template instances run in parallel) share.
#pragma once

#include <cstddef>
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
  std::string json;
  /// -z: codecs of compressed allreduce rows (two rows per codec and size:
  /// always compressed, and compress_mode::automatic with its decision).
  std::vector<compress::spec> codecs;
};

/// The whole sweep on one rank of `c` with elements of type T: one row per
/// size and algorithm into `rep`, every call with options::select = &sel
/// (the calibrated selector), every row with that model's prediction.
/// Returns the number of wrong elements over all ranks (0 when not
/// checking). Defined, and explicitly instantiated for each compiled-in
/// communicator, in collective_sweep.cpp.
template <class C, class T> std::int64_t sweep(C& c, const config& cfg, const selector& sel, report& rep);

} // namespace gradsync::bench::coll_bench
