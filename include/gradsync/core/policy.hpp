// gradsync: every tuning constant, in one place, with the measurement behind it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

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

// ---- quantisers (compress/int8.hpp, int4.hpp, sign.hpp, terngrad.hpp, qsgd.hpp) ----

/// Default elements per scale of the blockwise quantisers. Measured on the
/// 2-core CI host with a bench loop over 2^22 floats drawn from Student-t(3)
/// in 64 "layers" whose scales span 4 decades (heavy tails as in real
/// gradients); relative RMS error ||x - decoded|| / ||x|| against bits per
/// element (codes + 32-bit scales), see docs/compression.md for the table.
/// Host throughput was flat in the block size (within noise), so the choice
/// is the knee of error against scale overhead:
/// int8: 64 -> 1.08 % at 8.50 b, 256 -> 1.71 % at 8.13 b, 1024 -> 2.70 % at 8.03 b.
inline constexpr std::uint32_t int8_block = 256;
/// int4: 32 -> 14.4 % at 5.0 b, 64 -> 18.1 % at 4.5 b, 128 -> 22.4 % at 4.25 b.
inline constexpr std::uint32_t int4_block = 64;
/// sign: error is flat (75.5 % at block 32 .. 76.7 % at 16384; the sign
/// discards magnitudes), so take a block whose scale costs 0.03 b.
inline constexpr std::uint32_t sign_block = 1024;
/// terngrad: 128 -> 154 % at 2.25 b, 256 -> 179 % at 2.13 b, 512 -> 207 % at 2.06 b
/// (one draw; the noise averages out over steps and ranks, it is unbiased).
inline constexpr std::uint32_t terngrad_block = 256;
/// qsgd, 7 levels (4-bit codes): 64 -> 45 % at 4.5 b, 128 -> 63 % at 4.25 b,
/// 512 (the paper's bucket) -> 112 % at 4.06 b.
inline constexpr std::uint32_t qsgd_bucket = 128;
/// qsgd levels: 7 is the most that fits 4-bit sign-magnitude codes.
inline constexpr std::uint16_t qsgd_levels = 7;

} // namespace gradsync::policy
