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

// ---- sparsifiers and PowerSGD (compress/approx_topk.hpp, compress/powersgd.hpp) ----

/// approx_topk draws enough samples that about this many land above the target
/// quantile; the candidate count then has a relative spread near
/// 1/sqrt(hits * overshoot) = 7.8 %. Measured in tests/compress/test_approx_topk.cpp
/// (Gaussian and heavy-tailed inputs, n = 2^20, densities 0.1 % .. 10 %).
inline constexpr std::size_t approx_topk_sample_hits = 128;
/// Smallest approx_topk sample (small tensors: a few thousand reads cost nothing).
inline constexpr std::size_t approx_topk_min_sample = 1024;
/// The sampled threshold aims at overshoot * k candidates, so the count falls
/// below k (sending fewer than k) only past 1/overshoot = -3.3 sigma.
inline constexpr double approx_topk_overshoot = 1.3;
/// Candidate slots per target entry; more candidates (+13 sigma) fall back to
/// an exact whole-tensor select.
inline constexpr double approx_topk_candidate_factor = 2.0;

/// PowerSGD orthogonalisation: a column whose norm after projecting out the
/// previous columns (twice) is below this fraction of its original norm is
/// numerically dependent (float rounding leaves ~1e-6 relative) and is
/// replaced by a fresh random direction.
inline constexpr float powersgd_dependence_tol = 1e-4f;

} // namespace gradsync::policy
