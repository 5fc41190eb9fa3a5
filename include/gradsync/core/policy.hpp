// gradsync: every tuning constant, in one place, with the measurement behind it.
#pragma once

#include <chrono>
#include <cstddef>

namespace gradsync::policy {

/// Ring/chain pipeline segment. Segments let a rank forward the start of a
/// chunk while the rest is still arriving. Measured with
/// `gradsync-bench allreduce -a ring` (inproc 2..8 ranks and mpiexec -n 2) on
/// the 2-core CI machine; see docs/benchmarks.md. 256 KiB keeps the working
/// set of a step inside L2 while amortising per-message overhead.
inline constexpr std::size_t ring_segment_bytes = std::size_t{256} << 10;

/// Receive segments kept in flight per pipelined schedule (staging slots).
inline constexpr int pipeline_depth = 4;

/// MPI counts are ints: a transfer is split into messages of at most this size.
inline constexpr std::size_t mpi_max_message_bytes = std::size_t{1} << 30;

/// Default message tag of the collectives (each call may choose another so that
/// concurrent operations on one communicator cannot match each other).
inline constexpr int default_tag = 0x6753; // "gS"

/// How long a blocked send/receive waits for its peer before failing with an
/// error instead of hanging (a peer that never calls the collective, or calls
/// it with another count). Gloo-style; generous so slow CI never trips it.
/// Each communicator can set its own (set_timeout).
inline constexpr std::chrono::milliseconds default_timeout{300'000};

} // namespace gradsync::policy
