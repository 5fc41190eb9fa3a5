// gradsync: the two-step compressed allreduce (one quantisation per element
// on the way in, one on the way out; the scheme of DeepSpeed's and 1-bit
// Adam's compressed allreduce, here over any codec of the quantizer family):
//   1. every rank encodes each segment of every block of its input and sends
//      block b's payloads to rank b (an all-to-all of encoded chunks);
//   2. rank b decodes the p payloads of each of its segments, sums them in
//      rank order 0 .. p-1 (in float), finishes (avg: one division) and
//      encodes the result once;
//   3. a ring allgather forwards those payloads verbatim (codec_op.hpp).
// Same bytes on the wire as the compressed ring (2 (p-1)/p n x ratio), p-1
// fewer dependent steps (the all-to-all is one round), no re-quantisation of
// partial sums, but no overlap of the first phase's codec work with the
// transfers. The cost model of compressed.hpp chooses between the two.
//
// Error feedback: each rank's residual takes the errors of its phase-1
// encodes and, p times over for avg, of its phase-2 encode (codec_op.hpp).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "codec_op.hpp"
#include "compressed_ring.hpp"
#include "ring.hpp"
#include "schedule.hpp"

namespace gradsync::algo::compressed_two_step {

/// Scratch layout: the ring's (for the allgather) plus the encoded input
/// (p blocks) and the payloads of the own block from the p-1 others.
template <compress::codec K> struct plan {
  compressed_ring::plan<K> ring;
  std::size_t sent = 0, received = 0;
  plan(const K& k, int ranks, std::size_t count, std::size_t seg_bytes, bool feedback)
      : ring(k, ranks, count, seg_bytes, feedback) {
    const auto p = static_cast<std::size_t>(ranks);
    sent = ranks == 1 ? 0 : p * ring.g.nseg * ring.stride;
    received = ranks == 1 ? 0 : (p - 1) * ring.g.nseg * ring.stride;
  }
  std::size_t bytes() const { return ring.bytes() - ring.early + sent + received + 32; } // (no fused ring)
};

/// Scratch bytes of allreduce() for `count` elements on `ranks` ranks.
template <compress::codec K>
std::size_t workspace_bytes(const K& k, int ranks, std::size_t count, std::size_t seg_bytes, bool feedback) {
  return plan<K>(k, ranks, count, seg_bytes, feedback).bytes();
}

/// Two-step compressed allreduce in place on `data` (see the file comment);
/// arguments as compressed_ring::allreduce. Uses tags x.tag and x.tag + 1.
template <transport C, compress::codec K>
void allreduce(C& c, const K& k, typename K::value_type* data, std::size_t count,
               const compressed_ring::call<K>& x, std::span<std::byte> ws) {
  using T = typename K::value_type;
  using A = accum_t<T>;
  const int p = c.size(), r = c.rank();
  if (p == 1) return compressed_ring::allreduce(c, k, data, count, x, ws);
  const plan<K> pl(k, p, count, x.seg_bytes, x.residual != nullptr);
  GRADSYNC_REQUIRE(ws.size() >= pl.bytes(), "allreduce.compressed", r,
                   "workspace holds " + std::to_string(ws.size()) + " bytes, " + std::to_string(pl.bytes()) +
                       " needed");
  const segmentation& g = pl.ring.g;
  const std::size_t nseg = g.nseg, stride = pl.ring.stride;
  compress::workspace_cursor cur(ws, "allreduce.compressed");
  std::byte* ring_mem = cur.take<std::byte>(pl.ring.ring).data();
  std::byte* kept_mem = cur.take<std::byte>(pl.ring.kept).data();
  A* acc = cur.take<A>(g.max_seg).data();
  std::byte* sent_mem = cur.take<std::byte>(pl.sent).data();
  std::byte* recv_mem = cur.take<std::byte>(pl.received).data();
  std::vector<typename codec_segment_op<K>::kept_payload> kept;
  kept.reserve(nseg);
  auto sop = compressed_ring::segment_op_for(k, x, c, data, acc, kept_mem, stride, kept);
  sop.enc.carve(cur.rest(), g.max_seg, x.residual != nullptr, "allreduce.compressed");

  // Phase 1: post the receives of the own block's payloads, then encode and
  // send every block (the own block's payloads stay here).
  const auto ur = static_cast<std::size_t>(r);
  auto recv_slot = [&](int q, std::size_t j) {
    const std::size_t from = static_cast<std::size_t>(q < r ? q : q - 1); // ranks other than r
    return recv_mem + (from * nseg + j) * stride;
  };
  using rreq = decltype(c.irecv_upto(std::span<std::byte>{}, 0, 0));
  std::vector<rreq> recvs;
  std::vector<std::span<std::byte>> recv_at;
  for (int q = 0; q < p; ++q)
    for (std::size_t j = 0; j < nseg && q != r; ++j)
      if (const std::size_t n = g.size(ur, j)) {
        recv_at.emplace_back(recv_slot(q, j), sop.slot_bytes(n));
        recvs.push_back(c.irecv_upto(recv_at.back(), q, x.tag));
      }
  std::vector<request_t<C>> sends;
  std::vector<std::span<const std::byte>> own(nseg);
  for (int step = 1; step <= p; ++step) { // rank r+1 first: spread the incast
    const auto b = static_cast<std::size_t>(mod(r + step, p));
    for (std::size_t j = 0; j < nseg; ++j) {
      const std::size_t n = g.size(b, j), first = g.offset(b, j);
      if (n == 0) continue;
      std::byte* slot = sent_mem + (b * nseg + j) * stride;
      const A* src = sop.widened(data + first, n);
      const auto payload = sop.enc.encode(src, n, first, slot, A(1));
      if (b == ur) own[j] = payload;
      else sends.push_back(c.isend(payload, static_cast<int>(b), x.tag));
    }
  }
  for (std::size_t i = 0; i < recvs.size(); ++i) {
    recvs[i].wait();
    recv_at[i] = recv_at[i].first(recvs[i].received());
  }
  // Phase 2: sum each own segment over ranks 0 .. p-1, finish, encode once.
  std::size_t next_recv_seg = 0;
  std::vector<std::span<const std::byte>> from(static_cast<std::size_t>(p) * nseg);
  for (int q = 0; q < p; ++q)
    for (std::size_t j = 0; j < nseg; ++j)
      if (g.size(ur, j)) from[static_cast<std::size_t>(q) * nseg + j] = q == r ? own[j] : recv_at[next_recv_seg++];
  for (std::size_t j = 0; j < nseg; ++j) {
    const std::size_t n = g.size(ur, j);
    if (n == 0) continue;
    {
      const auto phase = sop.enc.decoding(n * static_cast<std::size_t>(p));
      std::fill(acc, acc + n, A(0));
      for (int q = 0; q < p; ++q)
        k.decode_accumulate(from[static_cast<std::size_t>(q) * nseg + j], std::span<A>(acc, n));
    }
    sop.keep(data + g.offset(ur, j), n);
  }
  wait_all(sends);
  sop.gather = true;
  const partition blocks{count, static_cast<std::size_t>(p)};
  ring::allgather(c, sop, data, blocks, x.seg_bytes, x.tag + 1, ring_mem);
}

} // namespace gradsync::algo::compressed_two_step
