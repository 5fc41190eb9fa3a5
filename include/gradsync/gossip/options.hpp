// gradsync: the options and report of the gossip operations.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../algo/options.hpp"

namespace gradsync::gossip {

/// Options of the gossip operations (named apart from gradsync::options so
/// that code using both namespaces stays unambiguous).
struct gossip_options {
  /// Tag (gossip uses [tag, tag + policy::tag_span)), timeout and workspace
  /// of the exchange; also the options of the allreduce (global averaging)
  /// and of the collectives inside a node (hierarchical gossip).
  gradsync::options collective{};
  /// Periodic global averaging: when H > 0, every step with
  /// (step + 1) % H == 0 is an exact allreduce average instead of a gossip
  /// round, which bounds the consensus distance on slowly mixing graphs.
  std::uint64_t global_every = 0;

  /// The options of the collectives a gossip operation runs (global
  /// averaging, the allreduce and broadcast inside a node): `collective`
  /// without the workspace, which is sized for the exchange.
  gradsync::options dense() const {
    gradsync::options o = collective;
    o.workspace = {};
    return o;
  }

  /// Whether `step` is a global-averaging step.
  constexpr bool global_step(std::uint64_t step) const noexcept {
    return global_every > 0 && (step + 1) % global_every == 0;
  }
};

/// What one round did on this rank (for benches and logs).
struct round_report {
  std::size_t bytes_sent = 0; ///< payload bytes this rank sent (gossip rounds only; 0 on a global step)
  bool global = false;        ///< the round was a global allreduce average
};

} // namespace gradsync::gossip
