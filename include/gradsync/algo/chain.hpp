// gradsync: pipelined chain broadcast and reduce. Ranks form a line starting
// at the root; data moves in segments, so after the pipeline fills every link
// is busy: time ~ (p - 2 + nseg) segment steps, bandwidth term n. Written
// over a segment operation (segment_op.hpp): the broadcast forwards what it
// received (recv-copy-send), the reduce is recv-reduce-send down the line.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "../core/ops.hpp"
#include "../exec/executor.hpp"
#include "schedule.hpp"
#include "segment_op.hpp"

namespace gradsync::algo::chain {

/// Sends in flight to the next rank (policy::chain_ranks_per_segment_for_one_send):
/// one where the pipeline's fill (p - 2 hops) outweighs its stream of
/// `nseg` segments, else as many as the receives posted ahead.
inline std::size_t sends_in_flight(int p, std::size_t nseg) {
  return static_cast<std::size_t>(p) > policy::chain_ranks_per_segment_for_one_send * nseg
             ? 1
             : static_cast<std::size_t>(policy::pipeline_depth);
}
// A slot is posted again pipeline_depth segments after the send out of it.
static_assert(staging_slots >= 2 * static_cast<std::size_t>(policy::pipeline_depth));

/// Scratch bytes of broadcast over `sop`: rotating slots where received
/// segments cannot land in place or the root's sends are staged.
template <segment_op S>
std::size_t broadcast_scratch_bytes(const S& sop, std::size_t count, std::size_t seg_bytes, int ranks) {
  if (ranks <= 1 || (S::in_place_copy && !S::staged_send)) return 0;
  return staging_slots * sop.slot_bytes(segmentation::make(partition{count, 1}, sizeof(typename S::value_type), seg_bytes).max_seg);
}

/// Broadcast over `sop` of `count` elements of `data` from `root` along the
/// chain root, root+1, ..., root-1. `scratch`: broadcast_scratch_bytes(...).
template <transport C, segment_op S>
void broadcast(C& c, const S& sop, typename S::value_type* data, std::size_t count, int root,
               std::size_t seg_bytes, int tag, std::byte* scratch) {
  using T = typename S::value_type;
  const int p = c.size(), r = c.rank();
  if (p == 1 || count == 0) return;
  sop.fence(); // the root's data may have been written by the executor
  const int v = mod(r - root, p); // position in the chain
  const int next = v + 1 < p ? mod(r + 1, p) : -1, prev = v > 0 ? mod(r - 1, p) : -1;
  const auto g = segmentation::make(partition{count, 1}, sizeof(T), seg_bytes);
  const bool slotted = prev < 0 ? S::staged_send : !S::in_place_copy;
  std::size_t nseg = 0;
  while (nseg < g.nseg && g.size(0, nseg)) ++nseg; // segments are non-increasing in size
  // sends_in_flight sends at most (segments sent at once share the link and
  // arrive together), receives policy::pipeline_depth ahead. The pool only
  // addresses the slots: a slot is posted again depth segments after its
  // send, and the window has completed that send by then.
  slot_pool<C> pool(scratch, slotted ? sop.slot_bytes(g.max_seg) : 0, staging_slots);
  send_window<C> sends(sends_in_flight(p, nseg));
  auto forward = [&](std::span<const std::byte> w) {
    if (next >= 0) sends.push(c.isend(w, next, tag));
  };
  if (prev < 0) {
    for (std::size_t j = 0; j < nseg; ++j) {
      const auto w = sop.wire(data + g.offset(0, j), g.size(0, j), slotted ? pool.acquire(j) : nullptr);
      if constexpr (S::staged_send) sop.fence();
      forward(w);
    }
  } else {
    // Receives run policy::pipeline_depth ahead, each into its own target.
    const std::size_t depth = policy::pipeline_depth;
    using rreq = recv_request_t<S, C>;
    std::vector<std::optional<rreq>> rq(depth);
    std::vector<std::span<std::byte>> target(depth);
    auto post = [&](std::size_t j) {
      const std::size_t n = g.size(0, j);
      target[j % depth] = slotted ? std::span<std::byte>(pool.acquire(j), sop.slot_bytes(n))
                                  : sop.recv_target(data + g.offset(0, j), n, nullptr);
      rq[j % depth].emplace(post_recv<S>(c, target[j % depth], prev, tag));
    };
    for (std::size_t j = 0; j < std::min(depth, nseg); ++j) post(j);
    for (std::size_t j = 0; j < nseg; ++j) {
      rq[j % depth]->wait();
      const auto got = arrived<S>(*rq[j % depth], target[j % depth]);
      rq[j % depth].reset();
      sop.copy(got, data + g.offset(0, j), g.size(0, j));
      forward(got);
      if (j + depth < nseg) post(j + depth);
    }
  }
  sends.drain();
}

/// Scratch elements of the typed chain reduce.
inline std::size_t reduce_scratch_elems(std::size_t count, std::size_t elem_bytes,
                                        std::size_t seg_bytes, int ranks) {
  if (ranks <= 1) return 0;
  return 2 * policy::pipeline_depth * segmentation::make(partition{count, 1}, elem_bytes, seg_bytes).max_seg;
}

/// Scratch bytes of reduce over `sop`: rotating receive slots (and, for
/// staged operations, the far end's send staging).
template <segment_op S>
std::size_t reduce_scratch_bytes(const S& sop, std::size_t count, std::size_t seg_bytes, int ranks) {
  if (ranks <= 1) return 0;
  return staging_slots * sop.slot_bytes(segmentation::make(partition{count, 1}, sizeof(typename S::value_type), seg_bytes).max_seg);
}

/// Reduce over `sop` of `count` elements of every rank's `in` into `out` at
/// `root` (`out` is ignored elsewhere). The chain runs root+1, root+2, ...,
/// root, so the result is op(...op(in[root+1], in[root+2])..., in[root]) for
/// every element. `scratch` holds reduce_scratch_bytes(sop, ...).
template <transport C, segment_op S>
void reduce(C& c, const S& sop, const typename S::value_type* in, typename S::value_type* out,
            std::size_t count, int root, std::size_t seg_bytes, int tag, std::byte* scratch) {
  using T = typename S::value_type;
  const int p = c.size(), r = c.rank();
  if (p == 1) {
    sop.local(in, out, count);
    return;
  }
  if (count == 0) return;
  const int v = mod(root - r, p); // distance from the root, backwards
  const int to = v > 0 ? mod(r + 1, p) : -1;     // towards the root
  const int from = v + 1 < p ? mod(r - 1, p) : -1; // away from the root
  const auto g = segmentation::make(partition{count, 1}, sizeof(T), seg_bytes);
  std::size_t nseg = 0;
  while (nseg < g.nseg && g.size(0, nseg)) ++nseg;
  const std::size_t nslots = staging_slots, stride = sop.slot_bytes(g.max_seg);
  slot_pool<C> pool(scratch, stride, nslots); // receives and the sends out of them
  // Sends in flight as in the broadcast (above); the pool only addresses the
  // slots, each send having completed before its slot is posted again.
  send_window<C> sends(sends_in_flight(p, nseg));
  if (from < 0) { // the far end of the chain sends its input as is
    for (std::size_t j = 0; j < nseg; ++j)
      sends.push(send_segment(c, sop, in + g.offset(0, j), g.size(0, j), S::staged_send ? pool.acquire(j) : nullptr, to, tag));
    sends.drain();
    return;
  }
  const std::size_t depth = policy::pipeline_depth;
  using rreq = recv_request_t<S, C>;
  std::vector<std::optional<rreq>> rq(nslots);
  auto span_of = [&](std::size_t j) { return std::span<std::byte>(scratch + (j % nslots) * stride, sop.slot_bytes(g.size(0, j))); };
  auto post = [&](std::size_t j) { rq[j % nslots].emplace(post_recv<S>(c, {pool.acquire(j), sop.slot_bytes(g.size(0, j))}, from, tag)); };
  for (std::size_t j = 0; j < std::min(depth, nseg); ++j) post(j);
  for (std::size_t j = 0; j < nseg; ++j) {
    rq[j % nslots]->wait();
    const auto got = arrived<S>(*rq[j % nslots], span_of(j));
    rq[j % nslots].reset();
    const auto off = g.offset(0, j), n = g.size(0, j);
    if (to < 0) {
      sop.combine(got, in + off, out + off, n, true);
      sop.finish(out + off, n);
    } else {
      const auto w = sop.reduce(got, in + off, n, span_of(j).data()); // recv-reduce-send
      sop.fence();
      sends.push(c.isend(w, to, tag));
    }
    if (j + depth < nseg) post(j + depth);
  }
  sends.drain();
}

/// Typed broadcast on executor `ex` (no scratch).
template <transport C, executor E, element T>
void broadcast(C& c, E& ex, T* data, std::size_t count, int root, std::size_t seg_bytes, int tag) {
  broadcast(c, typed_reduce<T, op::sum, E>{ex, op::sum{}, c.size()}, data, count, root, seg_bytes, tag,
            nullptr);
}

/// Typed reduce on executor `ex`; `scratch` holds reduce_scratch_elems(...).
template <transport C, executor E, element T, reduce_op Op>
void reduce(C& c, E& ex, const T* in, T* out, std::size_t count, int root, Op op,
            std::size_t seg_bytes, int tag, T* scratch) {
  reduce(c, typed_reduce<T, Op, E>{ex, op, c.size(), trace_of(c)}, in, out, count, root, seg_bytes, tag,
         reinterpret_cast<std::byte*>(scratch));
}

} // namespace gradsync::algo::chain
