// gradsync: every tuning constant, in one place, with the measurement behind it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>

namespace gradsync::policy {

/// Ring/chain pipeline segment. Segments let a rank forward the start of a
/// chunk while the rest is still arriving. Measured with
/// `gradsync-bench allreduce -a ring` (inproc 2..8 ranks and mpiexec -n 2) on
/// the 2-core CI machine; see docs/benchmarks.md. 256 KiB keeps the working
/// set of a step inside L2 while amortising per-message overhead.
inline constexpr std::size_t ring_segment_bytes = std::size_t{256} << 10;

/// Segment on slow links: a calibrated beta above slow_link_beta (slower
/// than 1 GB/s: a network) makes the selector's schedules use segments of
/// slow_link_segment_bytes. Measured on bench/netrig.sh (1 Gbit/s, MPICH
/// over TCP, 2 ranks), 64 MiB f32 ring allreduce: 256 KiB segments 849 ms,
/// 1 MiB 914 ms, 4 MiB 574 ms, 16 MiB 573 ms (MPI_Allreduce 588 ms, the
/// link's floor ~560 ms): under a saturated link each message's rendezvous
/// waits behind queued bytes, ~1 ms per segment.
inline constexpr double slow_link_beta = 1e-9;
inline constexpr std::size_t slow_link_segment_bytes = std::size_t{4} << 20;

/// Peers an alltoall's scattered schedule (and the sends of a neighbour
/// exchange) keep in flight at once. Bounds the requests and unexpected
/// messages a transport holds (MPICH's own scattered alltoall uses 32).
/// Not yet tuned by a measurement of ours: every rank count we run (<= 16)
/// fits one window.
inline constexpr int alltoall_window = 32;

/// Receive segments kept in flight per pipelined schedule (staging slots).
inline constexpr int pipeline_depth = 4;

/// A rank sending to several peers in turn (algo/schedule.hpp send_in_turn:
/// the trees' children) waits for each receiver from this message size up,
/// where the transport can (synchronous_sender, MPI_Issend); below it,
/// buffered sends go out together. SimGrid SMPI, 64 ranks, 10 Gbit/s NICs,
/// binomial broadcast, simulated us buffered / synchronous: 2 KiB 75.3 /
/// 66.6, 8 KiB 117.3 / 98.0, 32 KiB 365.2 / 245.4 (scatter-allgather 512
/// KiB 1540 / 1392). SMPI does not charge the acknowledgement's way back,
/// which a real network does: one latency per child, more than a message
/// of a few KiB costs on 10-100 Gbit/s links, hence not below 8 KiB.
inline constexpr std::size_t send_in_turn_min_bytes = 8 * 1024;

/// The pipelined chain (algo/chain.hpp) keeps one send in flight to its
/// next rank where it has more than this many ranks per segment, else
/// pipeline_depth. Segments in flight at once share the link, so the first
/// arrives with the last and every hop of the pipeline's fill pays for all
/// of them; one at a time pays a whole latency per segment. The fill is
/// p - 2 hops, the stream k segments: which costs more depends on p / k.
/// SimGrid SMPI, broadcast in 256 KiB segments, simulated ms with 1 / 2 / 4
/// sends in flight: 256 ranks `shared` 4 MiB (k = 16) 21.0 / 33.8 / 40.5;
/// 64 ranks `shared` 8 MiB (k = 32) 14.8 / 14.9 / 15.9, 16 MiB 26.2 / 23.8
/// / 24.4; 64 ranks `fast` (100 Gbit/s) 8 MiB 4.17 / 3.26 / 3.22, 16 MiB
/// 6.74 / 4.65 / 4.44.
inline constexpr std::size_t chain_ranks_per_segment_for_one_send = 2;

/// MPI counts are ints: a transfer is split into messages of at most this size.
inline constexpr std::size_t mpi_max_message_bytes = std::size_t{1} << 30;
/// Largest call (bytes of payload) whose agreement check rides in its own
/// messages over MPI (collectives.hpp's check_path::framed): each message
/// then goes through a copy with the 16-byte hashes in front, which costs
/// more than the separate round beyond a few KiB at 2 ranks.
inline constexpr std::size_t mpi_framed_max_bytes = std::size_t{4} << 10;
/// The same limit on p ranks: the separate round takes ceil(log2 p) message
/// latencies (transport/mpi.hpp check_round), the frames' copies what they
/// take at 2 ranks, so the limit grows with the round's steps: 4 KiB at 2
/// ranks, 32 KiB at 256, 40 KiB at 1024.
constexpr std::size_t mpi_framed_max_bytes_on(int ranks) {
  std::size_t steps = 0;
  for (long long d = 1; d < ranks; d *= 2) ++steps;
  return mpi_framed_max_bytes * (steps > 0 ? steps : 1);
}
/// The message latency under which mpi_framed_max_bytes was chosen: 2 MPICH
/// processes on one host, an 8-byte rd allreduce (one message each way)
/// 0.51 us (docs/reliability.md). Where the round's steps cross between
/// nodes (ceil(log2 nodes) of them), their share of the limit scales by the
/// model's latency there over this one (collectives.hpp framed_limit): with
/// SMPI's calibrated 22 us between nodes, 4 KiB x (3 + 7 x 44) = 1.3 MB on
/// 1024 ranks of 8 a node.
inline constexpr double mpi_framed_reference_alpha = 0.5e-6;

/// Default message tag of the collectives (each call may choose another so that
/// concurrent operations on one communicator cannot match each other).
inline constexpr int default_tag = 0x6753; // "gS"

/// Tags one collective may use, starting at options::tag: the double binary
/// tree uses one per tree, and hierarchical schedules shift their inter-group
/// level by level_tag_shift so the two levels can never match each other.
inline constexpr int level_tag_shift = 2;
/// The tags of a call's agreement check, past every tag of the schedules:
/// options::tag + verify_tag_offset (algo/verify.hpp's round), and over MPI
/// (transport/mpi.hpp's check) + 0 / + 1 for the rounds of even / odd calls
/// (a rank already in the next call's round cannot be taken for one in
/// another call) and + 2 for the fingerprints of a disagreeing call.
inline constexpr int verify_tag_offset = 2 * level_tag_shift;
inline constexpr int tag_span = verify_tag_offset + 3;
/// Largest options::tag: a call's tags [tag, tag + tag_span) must fit an int
/// (a transport may bound tags lower: MPI's MPI_TAG_UB, checked there).
inline constexpr int max_tag = 0x7fffffff - (tag_span - 1);


/// Default alpha-beta-gamma model of algo/select.hpp (seconds per message,
/// per byte sent, per byte reduced), used when no calibrated selector is
/// passed. Measured with calibrate() on 8 inproc ranks on the 2-core CI
/// machine (6 runs, under load from parallel builds): alpha 4.06..5.23 us,
/// beta 2.24..3.38e-11 s/B (~40 GB/s memcpy), gamma 2.45..4.2e-11 s/B (float
/// sum); medians below. With them the model switches from rd to rabenseifner
/// between 32 and 256 KiB on 8 ranks, where the timed schedules cross too
/// (rd 0.11 ms vs rabenseifner 0.15 ms at 32 KiB, 0.39 vs 0.28 ms at 256 KiB;
/// docs/algorithms.md has the full table). Local and global levels share
/// them: without calibration there is no evidence the levels differ.
inline constexpr double model_alpha = 4.2e-6;
inline constexpr double model_beta = 2.4e-11;
inline constexpr double model_gamma = 3.3e-11;

/// Default model on transports with a shared-memory arena (shm), where a
/// message byte is copied into the peer's ring and out again, and large
/// buffers run at memory speed, not cache speed. calibrate() over shm, 2
/// processes, quiet CI VM, 3 runs (8 MiB messages): alpha 1.64..2.02 us,
/// beta 4.66..6.05e-10 s/B, gamma 1.03..1.65e-10 s/B, arena copy
/// 1.46..1.54e-10 s/B, arena sync 0.41..0.68 us; medians below. With the
/// inproc defaults above (one in-cache memcpy per message byte) an
/// uncalibrated `auto` ran the ring at 1-64 MiB on shm instead of the arena:
/// through the PyTorch backend 16 MiB took 17.5 ms against 6.0 ms direct.
inline constexpr double shm_model_alpha = 1.66e-6;
inline constexpr double shm_model_beta = 5.47e-10;
inline constexpr double shm_model_gamma = 1.48e-10;
inline constexpr double shm_model_arena_copy = 1.50e-10;
inline constexpr double shm_model_arena_sync = 0.42e-6;

/// calibrate(): round trips timed per link (the large message gets a quarter
/// as many) and the large message / reduce-kernel buffer size. 8 MiB, beyond
/// L2, so beta is what large messages pay: at 1 MiB (in cache) beta over
/// shm came out 4-7x below what the message path moves at 8-64 MiB, and
/// `auto` then took ring over direct for a 64 MiB allreduce in 1 of 6 runs
/// (81 ms instead of 10; 4 of 16 runs ran at ~0.1x memcpy, the same
/// symptom; mpiexec -n 2 gradsync-bench allreduce -t shm -a auto -b 64M
/// -e 64M, CI VM); at 8 MiB, 8 of 8 runs took direct. Calibration still
/// takes well under a second.
inline constexpr int calibrate_iters = 20;
inline constexpr std::size_t calibrate_bytes = std::size_t{8} << 20;
/// Message sizes between 8 B (alpha) and calibrate_bytes (beta) at which
/// calibrate() also times a step, so the model knows what a message of that
/// size costs beyond alpha + beta m (link_cost::extra): MPI libraries switch
/// protocols by size (eager to rendezvous: one more round trip), and SMPI
/// models that with latency factors from 2x at 8 B to 11.6x from 65472 B
/// and bandwidth factors of 0.34-1.09 in between. Without the points, 64
/// simulated ranks (`shared`) had the two-level allgather of 512 KiB at
/// -49 % of its time and `auto` took it over the ring (1079 vs 809 us);
/// with SMPI's factors off the same model was -22 % and auto right. With
/// the points, the 64-rank sweep of every schedule on the three simulated
/// platforms is within the model's target at 356 of 393 points (292
/// before; docs/benchmarks.md, "Message costs by size"). Powers of 8 from
/// 1 KiB: SMPI's factor changes at 1.4, 3.5, 5.8, 9.4, 15 and 64 KiB; and
/// 16 KiB, past the step at 15 KiB (latency factor 2.6 -> 3.5), which the
/// 8 KiB point had priced up to 64 KiB: with it the same sweep is within
/// target at 362 of 393 (358 without, same build and hour), the 32 KiB
/// broadcast tree -53 % -> -35 % (shared, rail), 256 ranks -65 % -> -51 %.
inline constexpr std::size_t calibrate_mid_bytes[] = {std::size_t{1} << 10, std::size_t{8} << 10,
                                                     std::size_t{16} << 10, std::size_t{64} << 10,
                                                     std::size_t{512} << 10};
inline constexpr std::size_t calibrate_mid_points = std::size(calibrate_mid_bytes);
/// Into how many messages in flight at once calibrate() splits
/// calibrate_bytes to see whether they share the link
/// (link_cost::inflight_share): pipeline_depth, as many as a chain keeps
/// in flight. SimGrid SMPI `fast`, one node of 8 ranks (FATPIPE loopback):
/// measured 0, which took the chain reduce of 8 MiB from +194 % of its
/// simulated 280 us to within a few per cent.
inline constexpr int calibrate_split = pipeline_depth;

/// How long a blocked send/receive waits for its peer before failing with an
/// error instead of hanging (a peer that never calls the collective, or calls
/// it with another count). Gloo-style; generous so slow CI never trips it.
/// Each communicator can set its own (set_timeout).
inline constexpr std::chrono::milliseconds default_timeout{300'000};

// ---- shared-memory transport (transport/shm.hpp, algo/shm_direct.hpp) -------
// Measured on the 2-core AMD EPYC CI VM (2 MiB L2 per core, one 32 MiB L3),
// two processes under `chrt -f 10` (the VM was shared with busy builds), best
// of 7 runs; numbers vary about +-10 % between runs.

/// Bytes of each ordered pair's ring (a power of two), and the largest frame
/// a big message is cut into (the receiver copies frame k out while the sender
/// streams frame k+1 in). One-way streaming, 1 MiB / 64 MiB messages:
/// ring 256 KiB: 15-17 / 3-7 GB/s; 1 MiB with 16/64/128 KiB frames:
/// 14.1/19.8/19.2 and 7.1/8.1/9.1 GB/s; 2 MiB: no better. (single-thread
/// memcpy: 41 GB/s at 1 MiB in cache, 9.5-11 GB/s at 64 MiB.)
inline constexpr std::size_t shm_ring_bytes = std::size_t{1} << 20;
inline constexpr std::size_t shm_frame_bytes = std::size_t{64} << 10;
/// All p*p rings of a group stay within this many bytes (the ring shrinks
/// for p > 8), but no ring gets smaller than shm_min_ring_bytes.
inline constexpr std::size_t shm_rings_budget = std::size_t{64} << 20;
inline constexpr std::size_t shm_min_ring_bytes = std::size_t{128} << 10;
/// Messages above this many bytes go by rendezvous (transport/shm/engine.hpp):
/// the sender announces one in a header cell and writes its payload only once
/// the receiver has matched it, straight into the receiver's buffer. Before
/// (issue 32), a message whose receive was not yet posted was drained into a
/// freshly allocated private buffer: a pipelined chain broadcast (256 KiB
/// segments, 4 receives posted ahead) took every later segment that way,
/// page-faulting in each buffer (glibc mmaps them, or trims and regrows the
/// heap, depending on the sizes freed before: hence the history dependence)
/// and copying it twice. mpiexec -n 2 gradsync-bench broadcast -t shm -a
/// ring -b 64M -e 64M, CI VM: 1.10-1.32 GB/s before (perf: 14 % of samples
/// in page faults, 20 % spinning), see docs/benchmarks.md for after.
/// One frame's worth stays eager: small messages keep their one-way latency.
inline constexpr std::size_t shm_eager_bytes = std::size_t{64} << 10;
/// Smallest frame worth writing when the ring is nearly full (no slivers).
inline constexpr std::size_t shm_min_frame_bytes = std::size_t{4} << 10;
static_assert((shm_ring_bytes & (shm_ring_bytes - 1)) == 0 && (shm_min_ring_bytes & (shm_min_ring_bytes - 1)) == 0 &&
              shm_min_ring_bytes >= 4 * shm_min_frame_bytes);
/// Idle polls (each one sweep over all rings, tens of ns) spent spinning,
/// then yielding, before a waiting rank sleeps on its futex. About 100 us of
/// spinning covers a peer's copy of a whole frame; yielding keeps 4 ranks on
/// 2 cores progressing (the shm suite runs 4-rank collectives that way).
inline constexpr unsigned shm_spin_polls = 2000;
inline constexpr unsigned shm_yield_polls = 200;
/// ... and at least this long (unless oversubscribed): MPI libraries poll
/// without end; yielding early lets busy neighbours on a shared machine take
/// the core for a whole time slice.
inline constexpr std::chrono::microseconds shm_spin_time{1000};
/// Spinning when a group has more ranks than the machine has cores: 4 ranks
/// on the 2 cores, 8 B allreduce: 89 us with 2000 polls, 6.7 us with 20.
inline constexpr unsigned shm_oversubscribed_spin_polls = 20;
/// How often a sleeping rank wakes to check that its peers are alive.
inline constexpr std::chrono::milliseconds shm_liveness_interval{10};
/// How long ranks wait for each other while setting up a shm communicator
/// (GRADSYNC_SHM_JOIN_TIMEOUT_MS overrides it; dead ranks are seen sooner).
inline constexpr std::chrono::milliseconds shm_attach_timeout{60'000};
/// Per-rank collective arena (two alternating halves) of algo/shm_direct.hpp.
/// allreduce busbw, 2 ranks, 1/4/16/64 MiB: 256 KiB arena 5.6/5.6/5.5/5.0,
/// 1 MiB 5.4/5.2/4.6/4.6, 4 MiB 6.0/6.8/5.8/5.1, 8 MiB 6.0/6.6/5.8/5.4 GB/s.
inline constexpr std::size_t shm_arena_bytes = std::size_t{4} << 20;
/// Bytes an allreduce round moves through the arenas (all shares together),
/// at most half an arena. busbw with ordinary stores, vCPUs sharing a cache,
/// 2 / 4 MiB: 512 KiB rounds 13.9-14.0 / 10.9-11.6 GB/s, 1 MiB 14.8 / 9.4,
/// 2 MiB 12.2-13.2 / 8.8-9.5 (smaller rounds keep the arena lines in cache);
/// with streaming stores no difference beyond noise (1 / 16 MiB: 512 KiB
/// rounds 7.0-8.1 / 4.7-6.9, 2 MiB 6.7-8.2 / 4.8-6.9).
inline constexpr std::size_t shm_allreduce_round_bytes = std::size_t{512} << 10;
/// Bytes a direct broadcast round moves through the root's arena (at most
/// half an arena): the root stages round e+1 while the others copy round e
/// out. See docs/benchmarks.md (issue 32) for the sizes measured.
inline constexpr std::size_t shm_rooted_round_bytes = std::size_t{1} << 20;
/// A direct reduce runs at least this many rounds (of at least
/// shm_direct_small_bytes), so the root combines round e while the others
/// stage round e+1 on small buffers too. See docs/benchmarks.md (issue 32).
inline constexpr std::size_t shm_rooted_min_rounds = 4;
/// Shares in the arena start on cache-line multiples.
inline constexpr std::size_t shm_arena_align = 64;
/// Up to this many bytes, shm_direct reduces the whole buffer on every rank
/// in one round (one synchronisation) instead of reduce-scatter + gather
/// (8 B: 0.2-0.6 us; MPICH's MPI_Allreduce: 0.86-0.93 us).
inline constexpr std::size_t shm_direct_small_bytes = std::size_t{16} << 10;
/// From this many bytes on, shm_direct writes results with streaming stores
/// (they would not stay in cache anyway). busbw at 4/16/64 MiB: streaming
/// from 4 MiB 6.7/5.9/5.8, from 16 MiB 6.7/5.4/5.5, never 7.0/5.0/4.7 GB/s.
inline constexpr std::size_t shm_stream_out_bytes = std::size_t{8} << 20;

/// How shm_direct writes into the arena: streaming stores or ordinary ones,
/// chosen per call kind and size by detail::timed_choice (core/timed_choice.hpp)
/// because the better one depends on whether the ranks' cores share a cache,
/// which on the CI VM changes within minutes. Measured there, 2 ranks,
/// allreduce 1 MiB: shared cache: ordinary 14.3 GB/s, streaming 6.7; not
/// shared: ordinary 2.0-2.4, streaming 7.5. The way not taken is timed again
/// after timed_choice_min_period calls, the period doubling while it keeps
/// losing up to timed_choice_max_period (a losing probe 3.7x slower then
/// costs about 1 % over 256 calls); the way in use is an exponential average
/// of its times with this weight (one preempted call does not flip it).
inline constexpr std::uint64_t timed_choice_min_period = 8;
inline constexpr std::uint64_t timed_choice_max_period = 256;
inline constexpr double timed_choice_weight = 0.25;
/// Below this many bytes both kinds of store are the same (stream_copy
/// uses memcpy under 256 B), so shm_direct does not time them.
inline constexpr std::size_t shm_timed_stores_min_bytes = 256;

/// From this many bytes (all ranks' data of the call: allreduce's buffer,
/// reduce_scatter's input, allgather's output) shm_direct reads peers'
/// buffers straight from their memory (process_vm_readv) instead of copying
/// through the arena, where the group can (shm communicator's single_copy();
/// GRADSYNC_SHM_SINGLE_COPY=<bytes> sets another size, `off` none).
/// Never by default: on the CI VM (Firecracker guest, 4 KiB pages) the kernel
/// spends ~0.4 us per page even on cached data (256 KiB calls: 10 GB/s, memcpy
/// 44), so the arena, whose extra copies stay in the vCPUs' shared cache,
/// wins at every size. 2 ranks, `gradsync-bench allreduce -t shm -a direct`
/// busbw GB/s, arena / single copy, 3 alternating runs under chrt -f 10:
/// 1 MiB 4.5-7.5 / 4.4-5.0, 4 MiB 3.6-4.7 / 3.1-3.5, 16 MiB 2.7-3.9 /
/// 2.2-2.8, 64 MiB 2.1-3.6 / 2.0-2.4 (memcpy limit 5.3-6.3). Buffers on
/// transparent huge pages narrow it (64 MiB 4.2 / 3.5-3.8); reduce_scatter
/// 64 MiB 2.7 / 2.0; allgather ties up to 4 MiB (5.4 / 5.5), loses beyond.
inline constexpr std::size_t shm_single_copy_min_bytes = ~std::size_t{0};
/// From this many bytes (all ranks' data of the call), shm_direct runs calls
/// whose buffers all lie in shared buffers (shm::communicator::alloc_shared)
/// in place instead of through the arena. Up to here the arena's small path
/// (one round, every rank reduces all) runs; above it shared buffers were
/// faster at every size measured (2 ranks, README suite 2026-12-01: 32 KiB
/// 4.8 us vs the arena's 9.3, 512 KiB 57 vs 74, 64 MiB 7.0 ms vs 12.7).
/// Below it not measured.
inline constexpr std::size_t shm_shared_min_bytes = shm_direct_small_bytes + 1;

/// Tag of the messages shm::communicator::alloc_shared exchanges (object
/// names, then a barrier); outside the collectives' default range.
inline constexpr int shm_alloc_tag = 0x67537e00;

/// Tag of the records and barriers the CUDA-IPC transport's direct calls
/// exchange over their shm boot transport (transport/cuda_ipc.cuh); outside
/// the collectives' default range, like shm_alloc_tag.
inline constexpr int cuda_ipc_tag = 0x67537f00;
static_assert(cuda_ipc_tag < default_tag || cuda_ipc_tag >= default_tag + tag_span);

/// Tag of the message that carries NCCL's unique id from rank 0 to every
/// rank when an nccl::communicator is built over another transport
/// (transport/nccl.hpp). Outside the collectives' default range, and at most
/// 32767, the least MPI_TAG_UB the MPI standard allows, so that any MPI
/// carries it (shm_alloc_tag's range does not: the MPICH here has 2^28 - 1).
inline constexpr int nccl_bootstrap_tag = 0x7e4e;
static_assert(nccl_bootstrap_tag <= 32767 &&
              (nccl_bootstrap_tag < default_tag || nccl_bootstrap_tag >= default_tag + tag_span));

/// Scratch a single-copy reduction reads the peers' pieces into (all peers
/// together, at least 16 KiB each): stays in L2 with room for the output.
/// 64 KiB was no faster (64 MiB allreduce 2.8 vs 2.7-3.1 GB/s).
inline constexpr std::size_t shm_single_copy_scratch_bytes = std::size_t{256} << 10;

/// CUDA codec kernels (compress/cuda/*.cuh): threads per block of the
/// block-per-codec-block kernels, and resident blocks per multiprocessor a
/// grid-stride kernel is sized for. Not yet measured on a GPU (no device was
/// available when they were written): 256 threads and 4 blocks per SM are
/// CUB's usual choices for memory-bound kernels on sm_90; tune with
/// tests/gpu/run.sh and record the numbers here.
inline constexpr unsigned cuda_block_threads = 256;
inline constexpr unsigned cuda_blocks_per_sm = 4;
/// Smallest staging block of transport/staged.hpp (blocks are powers of two
/// from here, pooled per communicator): one page, so that a pool of small
/// blocks for the schedules' small messages and the call check stays small.
/// Not measured yet (no device since it was written).
inline constexpr std::size_t staging_min_block_bytes = std::size_t{4} << 10;

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

/// Sparse allreduce sums the gathered payloads by a p-way merge up to this
/// many ranks (no accumulator array; each index found by a scan of the p
/// heads), past it through a dense accumulator visited at the entries.
inline constexpr int sparse_merge_ranks = 8;

/// How many candidates ahead a sparsifier's emitting pass fetches the
/// residual lines it will zero under error feedback (one scattered store per
/// sent entry into a tensor far beyond the cache).
inline constexpr std::size_t sparse_prefetch_ahead = 16;

/// Sparse allreduce zeroes its output while the payloads are in flight, in
/// pieces of this many bytes with a poll of the transfer after each (~25 us
/// of memset here, well under a 1.3 MB payload's ~11 ms on a 1 Gbit/s link).
inline constexpr std::size_t sparse_zero_piece_bytes = 256 * 1024;

/// PowerSGD orthogonalisation: a column whose norm after projecting out the
/// previous columns (twice) is below this fraction of its original norm is
/// numerically dependent (float rounding leaves ~1e-6 relative) and is
/// replaced by a fresh random direction.
inline constexpr float powersgd_dependence_tol = 1e-4f;

// ---- compressed collectives and tensor fusion (compressed.hpp, fusion/) ----

/// Uncompressed bytes per segment of the compressed ring: each segment is one
/// codec payload (32-byte header plus parameters and scales), so segments are
/// 4x the plain ring's to keep headers under 0.1 % of an int8 payload while
/// a 64 MiB tensor still pipelines in 32 segments per block at 2 ranks.
inline constexpr std::size_t compressed_segment_bytes = std::size_t{1} << 20;

/// Sparse codecs allgather their payloads: every rank receives p - 1 of them.
/// The sparse path stays while those bytes are below this many times the
/// bytes a dense ring allreduce of the same tensor receives (2 (p-1)/p n);
/// past it the payload is decoded and the (now sparse-valued) tensor goes
/// through the dense ring. Equal cost at 1.0 by bytes; the sparse sum's
/// scattered adds cost about what the dense ring's streaming reduce saves
/// (docs/benchmarks.md, "sparse vs dense").
inline constexpr double sparse_dense_ratio = 1.0;

/// Fusion: bytes per bucket (Horovod's fusion threshold is 64 MiB, PyTorch
/// DDP's bucket_cap_mb 25 MiB). Large enough that per-call overhead is noise
/// for 4 KiB tensors (1024 of them fill 4 MiB); docs/benchmarks.md, fusion.
inline constexpr std::size_t fusion_bucket_bytes = std::size_t{25} << 20;
/// The first bucket is small (as DDP's 1 MiB first bucket): the last layers'
/// gradients, produced first by backward, start moving while the rest is
/// still being computed.
inline constexpr std::size_t fusion_first_bucket_bytes = std::size_t{1} << 20;
/// A bucket that has not filled runs after this long (Horovod's cycle time).
inline constexpr std::chrono::microseconds fusion_cycle_time{2000};
/// Submitted tensors the planner looks ahead over to fill a bucket of one
/// key (dtype, op, codec) before it closes the bucket in submission order.
inline constexpr std::size_t fusion_lookahead = 64;

} // namespace gradsync::policy
