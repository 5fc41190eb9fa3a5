// gradsync: the pipelined ring (Patarasuk & Yuan's bandwidth-optimal
// schedule). Reduce-scatter then allgather, each p-1 steps; every block is cut
// into segments so a rank forwards segment j while segment j+1 arrives.
// Bandwidth term: 2(p-1)/p * n bytes per rank for allreduce.
//
// The schedule is written over the ring's primitives on byte segments (see
// segment_op.hpp): step 0 is a send, middle steps of the reduce-scatter are
// recv-reduce-send, its last step recv-reduce-copy; the allgather's steps are
// recv-copy-send, its last a recv. Any segment operation runs on it: the
// typed reduction here, a compressed one (variable sizes, up-to receives).
//
// Determinism: block b is reduced in the fixed order b+1, b+2, ..., b (each
// step computes op(received partial, local)), then copied to every rank, so
// all ranks hold bitwise identical results, identical from run to run.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "../core/ops.hpp"
#include "../exec/executor.hpp"
#include "schedule.hpp"
#include "segment_op.hpp"

namespace gradsync::algo::ring {

/// Staging slots of a phase (segment_op.hpp).
inline constexpr std::size_t slots = staging_slots;

/// Bytes of one staging slot of `sop` for segments of up to `n` elements
/// (an operation's slot_bytes keeps the alignment its wire form needs).
template <segment_op S> std::size_t slot_stride(const S& sop, std::size_t n) { return sop.slot_bytes(n); }

/// Scratch bytes of one ring phase of `sop` over `blocks` (reducing or
/// copying).
template <segment_op S>
std::size_t phase_scratch_bytes(const S& sop, const partition& blocks, std::size_t elem_bytes,
                                std::size_t seg_bytes, int ranks, bool reducing) {
  if (ranks <= 1) return 0;
  const auto g = segmentation::make(blocks, elem_bytes, seg_bytes);
  const std::size_t stride = slot_stride(sop, g.max_seg);
  return ((reducing || !S::in_place_copy) ? slots * stride : 0) + (S::staged_send ? g.nseg * stride : 0);
}

/// Scratch elements the typed reduce-scatter phase needs for `blocks`.
inline std::size_t scratch_elems(const partition& blocks, std::size_t elem_bytes,
                                 std::size_t seg_bytes, int ranks) {
  if (ranks <= 1) return 0;
  return slots * segmentation::make(blocks, elem_bytes, seg_bytes).max_seg;
}

namespace detail {

// A fused allreduce's allgather step 0 (allreduce_fused): its receives,
// posted before the reduce-scatter (one per segment of the own block's
// predecessor, in segment order, into their own staging), and the
// reduce-scatter's recv-reduce-copy-sends that feed the successor's.
template <transport C, segment_op S> struct early_gather {
  using rreq = recv_request_t<S, C>;
  int tag = 0;
  std::vector<std::optional<rreq>> recvs;
  std::vector<std::span<std::byte>> at;
  std::vector<request_t<C>> sends;
};

// The order a phase takes its items (segment j, step s) in: segments in
// groups of `wave` (policy::pipeline_depth), and inside a group along its
// anti-diagonals t = (j - first) + s, j rising, so the group's segments
// travel the ring one hop apart, up to `wave` on each link at once. The item
// a rank forwards, (j, s+1) of its successor, comes at most `wave` items
// after the one it arrived as, so the receives posted pipeline_depth ahead
// and the 2 x pipeline_depth staging slots never wait on each other around
// the ring. One segment at a time (segment-major) paid every hop of every
// segment a whole message's latency: SimGrid SMPI, 8 ranks one per node
// (10 Gbit/s), reduce-scatter of 16 MiB in 256 KiB segments, 19.4 ms
// against a bandwidth of 13.3 (docs/benchmarks.md). Step-major order would
// need a whole block of staging per rank.
// Calls f(j, s) for each item in that order (no allocation: a phase walks
// it twice per call).
template <class F> void for_each_item(std::size_t nseg, std::size_t steps, F&& f) {
  constexpr auto wave = static_cast<std::size_t>(policy::pipeline_depth);
  static_assert(wave <= staging_slots - policy::pipeline_depth);
  for (std::size_t first = 0; first < nseg; first += wave) {
    const std::size_t w = std::min(wave, nseg - first);
    for (std::size_t t = 0; t + 1 < w + steps; ++t)
      for (std::size_t d = t >= steps ? t - steps + 1 : 0; d < w && d <= t; ++d) f(first + d, t - d);
  }
}
/// The items of for_each_item as a list.
inline std::vector<std::pair<std::size_t, std::size_t>> item_order(std::size_t nseg, std::size_t steps) {
  std::vector<std::pair<std::size_t, std::size_t>> order;
  order.reserve(nseg * steps);
  for_each_item(nseg, steps, [&](std::size_t j, std::size_t s) { order.emplace_back(j, s); });
  return order;
}

// One phase of the ring (p-1 steps) over the primitives, its items in
// for_each_item's order.
//
// Step s receives block recv_block(s) from prev and sends block
// recv_block(s-1) (or block send0 at step 0) to next; sends are posted in
// exactly the order the successor receives. `Reduce`: the reduce-scatter
// primitives (recv-reduce-send; recv-reduce-copy into `dst` at the last
// step), with `mine` the local operand; otherwise recv-copy-send into `dst`
// (`mine` is what step 0 sends). Received segments are staged in rotating
// slots unless the operation copies in place.
//
// With `early` (a fused allreduce): the reduce-scatter's last step also
// sends each finished segment on as the allgather's step 0 (on early->tag);
// the allgather phase then posts no step-0 sends and takes its step-0
// segments from the receives posted before the reduce-scatter.
template <bool Reduce, transport C, segment_op S, class RecvBlock, class DstOf>
void phase(C& c, const S& sop, const segmentation& g, RecvBlock recv_block, std::size_t send0,
           const typename S::value_type* mine, DstOf dst_of, std::byte* scratch, int tag,
           early_gather<C, S>* early = nullptr) {
  using T = typename S::value_type;
  const int p = c.size(), r = c.rank();
  const int next = mod(r + 1, p), prev = mod(r - 1, p);
  const auto steps = static_cast<std::size_t>(p - 1);
  constexpr bool staged = Reduce || !S::in_place_copy;
  using req = request_t<C>;
  using rreq = recv_request_t<S, C>;

  struct item { std::size_t b, j, s, n; };
  std::vector<item> in_items;
  std::vector<std::size_t> index(g.nseg * steps, SIZE_MAX); // (j, s) -> in_items position
  for_each_item(g.nseg, steps, [&](std::size_t j, std::size_t s) {
    const std::size_t b = recv_block(s);
    if (const auto n = g.size(b, j)) {
      index[j * steps + s] = in_items.size();
      in_items.push_back({b, j, s, n});
    }
  });
  // The successor's receive list, in the same order: step 0 sends segment j
  // of block send0, step s > 0 forwards what this rank received at step s-1
  // of segment j (earlier in the order).
  struct out_item { std::size_t from, j, n; };
  std::vector<out_item> out_items;
  for_each_item(g.nseg, steps, [&](std::size_t j, std::size_t s) {
    if (s == 0) {
      if (!Reduce && early) return; // sent by the reduce-scatter
      if (const auto n = g.size(send0, j)) out_items.push_back({SIZE_MAX, j, n});
    } else if (const auto q = index[j * steps + s - 1]; q != SIZE_MAX) {
      out_items.push_back({q, j, in_items[q].n});
    }
  });
  const std::size_t stride = slot_stride(sop, g.max_seg);
  std::byte* const slot_mem = scratch;
  std::byte* const send_mem = scratch + (staged ? slots * stride : 0);
  auto slot = [&](std::size_t q) { return slot_mem + (q % slots) * stride; };

  std::vector<std::span<const std::byte>> fwd(in_items.size()); // what item q forwards
  std::vector<bool> ready(in_items.size(), false);
  std::vector<req> sends;                                  // waited at the end
  std::vector<std::optional<req>> sq(staged ? slots : 0);  // forwards out of slot q % slots
  // An allgather step-0 item of a fused allreduce: received into early->at.
  auto pre_posted = [&](std::size_t q) { return !Reduce && early && in_items[q].s == 0; };
  std::size_t k = 0, first = 0;
  auto pump = [&] {
    for (; k < out_items.size(); ++k) {
      const auto& o = out_items[k];
      if (o.from == SIZE_MAX) { // send
        // A staged send gets its own staging (one block's segments): waiting
        // here for an older send to drain could wait on a successor that
        // waits on this rank's receives, which are posted after the pump.
        std::byte* st = S::staged_send ? send_mem + first * stride : nullptr;
        const auto w = sop.wire(mine + g.offset(send0, o.j), o.n, st);
        if constexpr (S::staged_send) sop.fence();
        sends.push_back(c.isend(w, next, tag));
        ++first;
        continue;
      }
      if (!ready[o.from]) return; // not received yet
      const bool slotted = staged && !pre_posted(o.from); // early receives have their own staging
      if (slotted) sq[o.from % slots].emplace(c.isend(fwd[o.from], next, tag));
      else sends.push_back(c.isend(fwd[o.from], next, tag));
    }
  };
  const std::size_t depth = policy::pipeline_depth;
  const std::size_t ring_slots = staged ? slots : depth;
  std::vector<std::optional<rreq>> rq(ring_slots);
  std::vector<std::span<std::byte>> target(ring_slots);
  auto post = [&](std::size_t q) {
    const auto& it = in_items[q];
    if (pre_posted(q)) return;
    std::span<std::byte> t;
    if constexpr (staged) {
      if (auto& pending = sq[q % slots]) { pending->wait(); pending.reset(); }
      t = {slot(q), sop.slot_bytes(it.n)};
    } else {
      t = sop.recv_target(dst_of(it.b, it.j), it.n, nullptr);
    }
    target[q % ring_slots] = t;
    rq[q % ring_slots].emplace(post_recv<S>(c, t, prev, tag));
  };
  sop.fence(); // what step 0 sends may have been written by the executor
  pump();
  for (std::size_t q = 0; q < std::min(depth, in_items.size()); ++q) post(q);
  std::size_t next_early = 0;
  for (std::size_t q = 0; q < in_items.size(); ++q) {
    std::span<std::byte> got;
    if (pre_posted(q)) {
      auto& rr = *early->recvs[next_early];
      rr.wait();
      got = arrived<S>(rr, early->at[next_early]);
      early->recvs[next_early++].reset();
    } else {
      auto& rr = *rq[q % ring_slots];
      rr.wait();
      got = arrived<S>(rr, target[q % ring_slots]);
      rq[q % ring_slots].reset();
    }
    const auto& it = in_items[q];
    const bool last = it.s + 1 == steps;
    if constexpr (Reduce) {
      const T* local = mine + g.offset(it.b, it.j);
      if (last) {
        const auto w = sop.reduce_copy(got, local, dst_of(it.b, it.j), it.n); // recv-reduce-copy
        if (early) { // -send: the allgather's step 0 (w views the final segment or its kept payload)
          sop.fence();
          early->sends.push_back(c.isend(w, next, early->tag));
        }
      } else {
        fwd[q] = sop.reduce(got, local, it.n, slot(q)); // recv-reduce-send
        sop.fence();
      }
    } else {
      sop.copy(got, dst_of(it.b, it.j), it.n); // recv-copy(-send): forward what arrived
      fwd[q] = got;
    }
    ready[q] = true;
    pump();
    if (q + depth < in_items.size()) post(q + depth);
  }
  wait_all(sends);
  for (auto& s : sq)
    if (s) s->wait();
}

} // namespace detail

/// Reduce-scatter phase over segment operation `sop`: block r of the
/// reduction of every rank's `in` (laid out as `blocks`) is written to `own`
/// (which may alias block r of `in`). `scratch` holds
/// phase_scratch_bytes(sop, blocks, ..., true) bytes.
template <transport C, segment_op S>
void reduce_scatter(C& c, const S& sop, const typename S::value_type* in, typename S::value_type* own,
                    const partition& blocks, std::size_t seg_bytes, int tag, std::byte* scratch,
                    detail::early_gather<C, S>* early = nullptr) {
  using T = typename S::value_type;
  const int p = c.size(), r = c.rank();
  if (p == 1) {
    sop.local(in, own, blocks.size(0));
    return;
  }
  const auto g = segmentation::make(blocks, sizeof(T), seg_bytes);
  auto recv_block = [&](std::size_t s) { return static_cast<std::size_t>(mod(r - static_cast<long long>(s) - 2, p)); };
  detail::phase<true>(c, sop, g, recv_block, static_cast<std::size_t>(mod(r - 1, p)), in,
                      [&](std::size_t b, std::size_t j) { return own + g.inner(b, j); }, scratch, tag, early);
}

/// Allgather phase over `sop`: every rank holds block r of `out` (laid out
/// as `blocks`); afterwards every rank holds all blocks. `scratch` holds
/// phase_scratch_bytes(sop, blocks, ..., false) bytes (none for the typed op).
template <transport C, segment_op S>
void allgather(C& c, const S& sop, typename S::value_type* out, const partition& blocks,
               std::size_t seg_bytes, int tag, std::byte* scratch, detail::early_gather<C, S>* early = nullptr) {
  using T = typename S::value_type;
  const int p = c.size(), r = c.rank();
  if (p == 1) return;
  const auto g = segmentation::make(blocks, sizeof(T), seg_bytes);
  auto recv_block = [&](std::size_t s) { return static_cast<std::size_t>(mod(r - static_cast<long long>(s) - 1, p)); };
  detail::phase<false>(c, sop, g, recv_block, static_cast<std::size_t>(r), static_cast<const T*>(out),
                       [&](std::size_t b, std::size_t j) { return out + g.offset(b, j); }, scratch, tag, early);
}

/// Staging bytes allreduce_fused needs besides the phases' scratch: one
/// slot per segment of a block.
template <segment_op S>
std::size_t fused_scratch_bytes(const S& sop, const partition& blocks, std::size_t elem_bytes, std::size_t seg_bytes,
                                int ranks) {
  if (ranks <= 1) return 0;
  const auto g = segmentation::make(blocks, elem_bytes, seg_bytes);
  return g.nseg * slot_stride(sop, g.max_seg);
}

/// Allreduce in place on `data` over `sop` as one pipeline (NCCL's
/// recv-reduce-copy-send): the allgather's step-0 receives are posted first,
/// and the reduce-scatter sends each segment of the own block on as soon as
/// it is final, so on a slow link the allgather's first half travels while
/// the reduce-scatter still reduces (before, it waited for the whole
/// reduce-scatter: int8 over the 1 Gbit/s rig, docs/benchmarks.md). The same
/// bytes and arithmetic as reduce_scatter + allgather. For operations that
/// stage what they receive (a codec's); `scratch` holds the phases'
/// scratch, `early_mem` fused_scratch_bytes. Tags `tag` and `tag + 1`.
template <transport C, segment_op S>
void allreduce_fused(C& c, S& sop, typename S::value_type* data, const partition& blocks, std::size_t seg_bytes,
                     int tag, std::byte* scratch, std::byte* early_mem) {
  static_assert(!S::in_place_copy, "allreduce_fused stages the allgather's early receives");
  using T = typename S::value_type;
  const int p = c.size(), r = c.rank();
  T* own = data + blocks.offset(static_cast<std::size_t>(r));
  if (p == 1) {
    reduce_scatter(c, sop, data, own, blocks, seg_bytes, tag, scratch);
    return;
  }
  const auto g = segmentation::make(blocks, sizeof(T), seg_bytes);
  const std::size_t stride = slot_stride(sop, g.max_seg), from = static_cast<std::size_t>(mod(r - 1, p));
  detail::early_gather<C, S> early;
  early.tag = tag + 1;
  for (std::size_t j = 0; j < g.nseg; ++j)
    if (const std::size_t n = g.size(from, j)) {
      early.at.emplace_back(early_mem + j * stride, sop.slot_bytes(n));
      early.recvs.emplace_back(post_recv<S>(c, early.at.back(), mod(r - 1, p), early.tag));
    }
  reduce_scatter(c, sop, data, own, blocks, seg_bytes, tag, scratch, &early);
  if constexpr (requires { sop.gather; }) sop.gather = true; // a codec op now forwards its kept payloads
  allgather(c, sop, data, blocks, seg_bytes, tag, scratch, &early);
  wait_all(early.sends);
}

/// Scratch bytes of a typed ring allreduce of `count` elements on `ranks` ranks.
template <element T>
std::size_t allreduce_workspace_bytes(int ranks, std::size_t count, std::size_t seg_bytes) {
  return scratch_elems(partition{count, static_cast<std::size_t>(ranks)}, sizeof(T), seg_bytes,
                       ranks) * sizeof(T);
}

/// Typed ring allreduce of `count` elements from `in` into `out` (may be
/// equal) with executor `ex`; `scratch` holds allreduce_workspace_bytes<T>.
template <transport C, executor E, element T, reduce_op Op>
void allreduce(C& c, E& ex, const T* in, T* out, std::size_t count, Op op, std::size_t seg_bytes,
               int tag, T* scratch) {
  const partition blocks{count, static_cast<std::size_t>(c.size())};
  const typed_reduce<T, Op, E> sop{ex, op, c.size(), trace_of(c)};
  auto* mem = reinterpret_cast<std::byte*>(scratch);
  reduce_scatter(c, sop, in, out + blocks.offset(static_cast<std::size_t>(c.rank())), blocks, seg_bytes,
                 tag, mem);
  allgather(c, sop, out, blocks, seg_bytes, tag, mem);
}

} // namespace gradsync::algo::ring
