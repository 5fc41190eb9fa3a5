// gradsync: the compressed ring allreduce. The pipelined ring (ring.hpp) run
// over the codec segment operation (codec_op.hpp): in the reduce-scatter each
// rank decodes the partial sum it receives, adds its own elements in float
// and re-encodes the running sum for its successor; the owner of a block
// finishes it (avg: one division), encodes it once and keeps that payload;
// the allgather forwards the kept payloads verbatim. Bytes on the wire per
// rank: 2 (p-1)/p n x (payload / input bytes) of the codec. Every element is
// quantised up to p times on its way round (once per hop and once at the
// owner), which error feedback accounts for (codec_op.hpp); the two-step
// schedule (compressed_two_step.hpp) quantises twice in all.
//
// Determinism: block b is summed in the ring's fixed order and every rank
// decodes the owner's payload, so all ranks hold bitwise identical results.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "../compress/codec.hpp"
#include "../transport/capabilities.hpp"
#include "codec_op.hpp"
#include "ring.hpp"
#include "schedule.hpp"

namespace gradsync::algo::compressed_ring {

/// Geometry and scratch layout of one compressed ring allreduce.
template <compress::codec K> struct plan {
  using T = typename K::value_type;
  using A = accum_t<T>;
  segmentation g;
  std::size_t stride = 0, ring = 0, early = 0, kept = 0, acc = 0, enc = 0;

  plan(const K& k, int ranks, std::size_t count, std::size_t seg_bytes, bool feedback) {
    const partition blocks{count, static_cast<std::size_t>(ranks)};
    g = segmentation::make(blocks, sizeof(T), seg_bytes);
    // One rank encodes its whole tensor as one payload (ring.hpp's local step).
    const std::size_t max_seg = ranks == 1 ? count : g.max_seg;
    stride = payload_slot_bytes(k, max_seg);
    const codec_segment_op<K> probe{.enc = {.codec = &k}};
    ring = ranks == 1 ? 0 : ring::phase_scratch_bytes(probe, blocks, sizeof(T), seg_bytes, ranks, true);
    early = ring::fused_scratch_bytes(probe, blocks, sizeof(T), seg_bytes, ranks);
    kept = (ranks == 1 ? 1 : g.nseg) * stride;
    acc = compress::workspace_piece<A>(max_seg);
    enc = codec_encoder<K>::scratch_bytes(k, max_seg, feedback);
  }
  std::size_t max_seg(int ranks, std::size_t count) const { return ranks == 1 ? count : g.max_seg; }
  std::size_t bytes() const { return ring + early + kept + acc + enc + 16; }
};

/// Scratch bytes of allreduce() for `count` elements on `ranks` ranks.
template <compress::codec K>
std::size_t workspace_bytes(const K& k, int ranks, std::size_t count, std::size_t seg_bytes, bool feedback) {
  return plan<K>(k, ranks, count, seg_bytes, feedback).bytes();
}

/// What one call encodes with: the noise key, error feedback, averaging.
template <compress::codec K> struct call {
  std::uint64_t seed = 0, step = 0;
  bool average = true;
  accum_t<typename K::value_type>* residual = nullptr; ///< count accumulators, or nullptr
  bool fold = false; ///< fold the previous residual into each element at its first read (else folded already)
  std::size_t seg_bytes = 0;
  int tag = 0;
  std::size_t* encoded_bytes = nullptr; ///< payload bytes this rank produced (added to)
};

/// The codec segment operation of call `x` on rank r of p over `data`
/// (accumulators `acc`, kept payloads in `kept_mem` at `stride`, listed in
/// `kept`) on communicator c; its encoder's scratch is carved by the caller.
template <compress::codec K, transport C>
codec_segment_op<K> segment_op_for(const K& k, const call<K>& x, const C& c, typename K::value_type* data,
                                   accum_t<typename K::value_type>* acc, std::byte* kept_mem, std::size_t stride,
                                   std::vector<typename codec_segment_op<K>::kept_payload>& kept) {
  const int r = c.rank(), p = c.size();
  return {.enc = {.codec = &k, .seed = x.seed, .step = x.step, .rank = r, .residual = x.residual,
                  .encoded_bytes = x.encoded_bytes, .trace = trace_of(c)},
          .ranks = p,
          .average = x.average,
          .in_base = data,
          .out_base = data,
          .acc = acc,
          .kept_mem = kept_mem,
          .kept_stride = stride,
          .kept = &kept,
          .fold = x.fold ? x.residual : nullptr,
          .data = data};
}

/// Compressed ring allreduce of `count` elements in place on `data` with
/// codec `k`; `ws` holds workspace_bytes(...) bytes. With a residual, errors
/// of this rank's encodes are added to it (the previous residual folded into
/// `data` by the caller first, or by the op at each element's first read
/// with x.fold).
template <transport C, compress::codec K>
void allreduce(C& c, const K& k, typename K::value_type* data, std::size_t count, const call<K>& x,
               std::span<std::byte> ws) {
  using T = typename K::value_type;
  using A = accum_t<T>;
  const int p = c.size(), r = c.rank();
  const plan<K> pl(k, p, count, x.seg_bytes, x.residual != nullptr);
  GRADSYNC_REQUIRE(ws.size() >= pl.bytes(), "allreduce.compressed", r,
                   "workspace holds " + std::to_string(ws.size()) + " bytes, " + std::to_string(pl.bytes()) +
                       " needed");
  compress::workspace_cursor cur(ws, "allreduce.compressed");
  std::byte* ring_mem = cur.take<std::byte>(pl.ring).data();
  std::byte* early_mem = cur.take<std::byte>(pl.early).data();
  std::byte* kept_mem = cur.take<std::byte>(pl.kept).data();
  const std::size_t max_seg = pl.max_seg(p, count);
  A* acc = cur.take<A>(max_seg).data();
  std::vector<typename codec_segment_op<K>::kept_payload> kept;
  kept.reserve(p == 1 ? 1 : pl.g.nseg);
  auto sop = segment_op_for(k, x, c, data, acc, kept_mem, pl.stride, kept);
  sop.enc.carve(cur.rest(), max_seg, x.residual != nullptr, "allreduce.compressed");
  const partition blocks{count, static_cast<std::size_t>(p)};
  ring::allreduce_fused(c, sop, data, blocks, x.seg_bytes, x.tag, ring_mem, early_mem);
}

} // namespace gradsync::algo::compressed_ring
