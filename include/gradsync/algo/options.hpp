// gradsync: the options struct every collective takes, and algorithm names.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string_view>

#include "../core/policy.hpp"

namespace gradsync {

class selector; // algo/select.hpp: cost model + GRADSYNC_ALGO table

/// Collective algorithms. `automatic` lets the cost model choose per call.
enum class algorithm {
  automatic, ///< chosen per call (GRADSYNC_ALGO may override)
  ring,      ///< pipelined ring: reduce-scatter then allgather
  tree,      ///< binomial tree reduce + broadcast
  dbtree,    ///< pipelined double binary tree
  rd,        ///< recursive doubling (allreduce, allgather; reduce_scatter: recursive halving)
  rabenseifner, ///< recursive halving reduce-scatter + recursive doubling allgather
  hier,      ///< hierarchical: intra-group, inter-group, intra-group
  twod,      ///< 2-D grid: row reduce-scatter, column ring allreduce, row allgather
  direct,    ///< shared memory only: reduce in place from every rank's staged copy (algo/shm_direct.hpp)
  pairwise,  ///< alltoall(v): one peer pair per step (algo/alltoall_pairwise.hpp)
  scattered, ///< alltoall(v): a window of peers in flight (algo/alltoall_scattered.hpp)
  bruck,     ///< log2 p rounds for any p: alltoall (algo/alltoall_bruck.hpp), allgather and reduce_scatter (algo/bruck.hpp)
  scatter_allgather, ///< broadcast: binomial scatter, then ring allgather (algo/scatter_allgather.hpp)
};

/// Name used by options, the bench's `-a` and GRADSYNC_ALGO.
constexpr std::string_view algorithm_name(algorithm a) {
  switch (a) {
  case algorithm::automatic: return "auto";
  case algorithm::ring: return "ring";
  case algorithm::tree: return "tree";
  case algorithm::dbtree: return "dbtree";
  case algorithm::rd: return "rd";
  case algorithm::rabenseifner: return "rabenseifner";
  case algorithm::hier: return "hier";
  case algorithm::twod: return "2d";
  case algorithm::direct: return "direct";
  case algorithm::pairwise: return "pairwise";
  case algorithm::scattered: return "scattered";
  case algorithm::bruck: return "bruck";
  case algorithm::scatter_allgather: return "scatter_allgather";
  }
  return "?";
}

/// Parses an algorithm name; returns false if unknown.
constexpr bool parse_algorithm(std::string_view s, algorithm& out) {
  for (auto a : {algorithm::automatic, algorithm::ring, algorithm::tree, algorithm::dbtree,
                 algorithm::rd, algorithm::rabenseifner, algorithm::hier, algorithm::twod,
                 algorithm::direct, algorithm::pairwise, algorithm::scattered, algorithm::bruck,
                 algorithm::scatter_allgather})
    if (algorithm_name(a) == s) {
      out = a;
      return true;
    }
  return false;
}

/// Whether a collective checks that every rank makes the same call
/// (algo/verify.hpp: collective, count, dtype, op, root, algorithm, codec,
/// segment size, sequence number), so that ranks that disagree all fail with
/// one errc::mismatch error instead of returning wrong values or timing out.
/// Where the check travels: detail::check_path_of (collectives.hpp).
enum class verification {
  automatic, ///< every call (the default): in band where the schedule allows it
  always,    ///< every call (the same as automatic)
  never,     ///< no check (a caller that has checked the call itself)
};

/// Options of every collective (Gloo style: one struct, defaults that work).
struct options {
  /// Which schedule to run.
  algorithm algo = algorithm::automatic;
  /// Pipeline segment in bytes (0: policy::ring_segment_bytes). Small values
  /// force the multi-segment paths, which tests use.
  std::size_t segment_bytes = 0;
  /// Message tag in [0, policy::max_tag]. A collective uses tags [tag, tag +
  /// policy::tag_span), so concurrent collectives on one communicator need
  /// tags that far apart.
  int tag = policy::default_tag;
  /// Optional caller-owned scratch of at least the size the matching
  /// `*_workspace_bytes` query returns; empty: allocated per call.
  std::span<std::byte> workspace = {};
  /// Cost model and override table `automatic` consults (algo/select.hpp).
  /// Null: the default model of core/policy.hpp with GRADSYNC_ALGO's
  /// override table (read at the first such call). All
  /// ranks must pass equivalent selectors (calibrate() agrees them), or they
  /// may pick different schedules and deadlock.
  const selector* select = nullptr;
  /// Ranks per group for `hier` and row length for `twod`. 0: `hier` groups
  /// by the transport's node_of(rank) when it has one; `twod` uses ~sqrt(p).
  int group_size = 0;
  /// Schedule of the inter-group step of `hier` (automatic: by the model).
  algorithm inner = algorithm::automatic;
  /// Longest any wait of this call may block before it fails with
  /// errc::timeout; 0: the communicator's own timeout.
  std::chrono::milliseconds timeout{0};
  /// Whether to check first that every rank makes the same call.
  verification verify = verification::automatic;

  /// The pipeline segment in bytes this call uses (segment_bytes, or the
  /// policy default when that is 0).
  /// (0: the selector's segment_bytes(), or policy::ring_segment_bytes
  /// without one; defined in select.hpp).
  std::size_t segment() const noexcept;
};

} // namespace gradsync
