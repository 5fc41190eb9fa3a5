// gradsync: the pipelined ring (Patarasuk & Yuan's bandwidth-optimal
// schedule). Reduce-scatter then allgather, each p-1 steps; every block is cut
// into segments so a rank forwards segment j while segment j+1 arrives.
// Bandwidth term: 2(p-1)/p * n bytes per rank for allreduce.
//
// Determinism: block b is reduced in the fixed order b+1, b+2, ..., b (each
// step computes op(received partial, local)), then copied to every rank, so
// all ranks hold bitwise identical results, identical from run to run.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "../core/ops.hpp"
#include "../core/reduce.hpp"
#include "schedule.hpp"

namespace gradsync::algo::ring {

/// Staging slots of the reduce-scatter pipeline: depth receives in flight plus
/// depth forwarded sends still draining.
inline constexpr int slots = 2 * policy::pipeline_depth;

/// Scratch elements the reduce-scatter phase needs for `blocks`.
inline std::size_t scratch_elems(const partition& blocks, std::size_t elem_bytes,
                                 std::size_t seg_bytes, int ranks) {
  if (ranks <= 1) return 0;
  return slots * segmentation::make(blocks, elem_bytes, seg_bytes).max_seg;
}

namespace detail {

// One phase of the ring (p-1 steps). Items are taken segment-major: segment j
// goes through all steps before segment j+1 starts, so the item a rank
// forwards is the very next one its successor waits for. (Step-major order
// would need a whole block of staging per rank to avoid a cyclic wait.)
//
// Step s receives block recv_block(s) from prev and sends block
// recv_block(s-1) (or block send0 at step 0) to next; sends are posted in
// exactly the order the successor receives. `Staged` phases receive into
// rotating slots (reduce-scatter); others receive in place (allgather).
// `on_recv(item, buf)` consumes a received segment and returns the buffer to
// forward from (nullptr on the last step).
template <bool Staged, transport C, class T, class RecvBlock, class OnRecv>
void phase(C& c, const segmentation& g, RecvBlock recv_block, std::size_t send0,
           const T* send0_base, T* place, T* slot_mem, int tag, OnRecv on_recv) {
  const int p = c.size(), r = c.rank();
  const int next = mod(r + 1, p), prev = mod(r - 1, p);
  const auto steps = static_cast<std::size_t>(p - 1);
  using req = request_t<C>;
  using rreq = decltype(recv(c, slot_mem, 0, 0, 0));

  struct item { std::size_t b, j, s, n; };
  std::vector<item> in_items;
  std::vector<std::size_t> index(g.nseg * steps, SIZE_MAX); // (j, s) -> in_items position
  for (std::size_t j = 0; j < g.nseg; ++j)
    for (std::size_t s = 0; s < steps; ++s) {
      const std::size_t b = recv_block(s);
      if (const auto n = g.size(b, j)) {
        index[j * steps + s] = in_items.size();
        in_items.push_back({b, j, s, n});
      }
    }
  // The successor's receive list: step 0 carries block send0, step s > 0
  // forwards what this rank received at step s-1 of the same segment.
  struct out_item { std::size_t from; const T* data; std::size_t n; };
  std::vector<out_item> out_items;
  for (std::size_t j = 0; j < g.nseg; ++j)
    for (std::size_t s = 0; s < steps; ++s) {
      if (s == 0) {
        if (const auto n = g.size(send0, j))
          out_items.push_back({SIZE_MAX, send0_base + g.offset(send0, j), n});
      } else if (const auto q = index[j * steps + s - 1]; q != SIZE_MAX) {
        out_items.push_back({q, nullptr, in_items[q].n});
      }
    }
  std::vector<const T*> fwd(in_items.size(), nullptr);
  std::vector<req> sends;          // unstaged sends, waited at the end
  std::vector<std::optional<req>> sq(Staged ? slots : 0); // staged: per slot
  std::size_t k = 0;
  auto pump = [&] {
    for (; k < out_items.size(); ++k) {
      const auto& o = out_items[k];
      const T* data = o.data;
      if (o.from != SIZE_MAX) {
        if (!fwd[o.from]) return; // not received yet
        data = fwd[o.from];
      }
      if (Staged && o.from != SIZE_MAX)
        sq[o.from % slots].emplace(send(c, data, o.n, next, tag));
      else
        sends.push_back(send(c, data, o.n, next, tag));
    }
  };
  const std::size_t depth = policy::pipeline_depth;
  const std::size_t ring_slots = Staged ? slots : depth;
  std::vector<std::optional<rreq>> rq(ring_slots);
  auto buf_of = [&](std::size_t q) {
    return Staged ? slot_mem + (q % slots) * g.max_seg : place + g.offset(in_items[q].b, in_items[q].j);
  };
  auto post = [&](std::size_t q) {
    if constexpr (Staged)
      if (auto& pending = sq[q % slots]) { pending->wait(); pending.reset(); }
    rq[q % ring_slots].emplace(recv(c, buf_of(q), in_items[q].n, prev, tag));
  };
  pump();
  for (std::size_t q = 0; q < std::min(depth, in_items.size()); ++q) post(q);
  for (std::size_t q = 0; q < in_items.size(); ++q) {
    rq[q % ring_slots]->wait();
    rq[q % ring_slots].reset();
    const auto& it = in_items[q];
    fwd[q] = on_recv(it.b, it.j, it.n, it.s + 1 == steps, buf_of(q));
    pump();
    if (q + depth < in_items.size()) post(q + depth);
  }
  wait_all(sends);
  for (auto& s : sq)
    if (s) s->wait();
}

} // namespace detail

/// Reduce-scatter phase: block r of the reduction of every rank's `in` (laid
/// out as `blocks`) is written to `own` (which may alias block r of `in`).
/// `slot_mem` holds scratch_elems(...) elements.
template <transport C, element T, reduce_op Op>
void reduce_scatter(C& c, const T* in, T* own, const partition& blocks, Op op,
                    std::size_t seg_bytes, int tag, T* slot_mem) {
  const int p = c.size(), r = c.rank();
  if (p == 1) {
    copy_elems(own, in, blocks.size(0));
    finalize(own, blocks.size(0), op, p);
    return;
  }
  const auto g = segmentation::make(blocks, sizeof(T), seg_bytes);
  auto recv_block = [&](std::size_t s) { return static_cast<std::size_t>(mod(r - static_cast<long long>(s) - 2, p)); };
  detail::phase<true>(c, g, recv_block, static_cast<std::size_t>(mod(r - 1, p)), in,
                      static_cast<T*>(nullptr), slot_mem, tag,
                      [&](std::size_t b, std::size_t j, std::size_t n, bool last, T* buf) -> const T* {
                        const T* mine = in + g.offset(b, j);
                        if (last) { // block r: the final value
                          T* dst = own + g.inner(b, j);
                          combine(dst, static_cast<const T*>(buf), mine, n, op);
                          finalize(dst, n, op, p);
                          return dst;
                        }
                        combine(buf, static_cast<const T*>(buf), mine, n, op);
                        return buf;
                      });
}

/// Allgather phase: every rank holds block r of `out` (laid out as `blocks`);
/// afterwards every rank holds all blocks.
template <transport C, element T>
void allgather(C& c, T* out, const partition& blocks, std::size_t seg_bytes, int tag) {
  const int p = c.size(), r = c.rank();
  if (p == 1) return;
  const auto g = segmentation::make(blocks, sizeof(T), seg_bytes);
  auto recv_block = [&](std::size_t s) { return static_cast<std::size_t>(mod(r - static_cast<long long>(s) - 1, p)); };
  detail::phase<false>(c, g, recv_block, static_cast<std::size_t>(r), static_cast<const T*>(out),
                       out, static_cast<T*>(nullptr), tag,
                       [](std::size_t, std::size_t, std::size_t, bool, T* buf) -> const T* { return buf; });
}

/// Scratch bytes of a ring allreduce of `count` elements on `ranks` ranks.
template <element T>
std::size_t allreduce_workspace_bytes(int ranks, std::size_t count, std::size_t seg_bytes) {
  return scratch_elems(partition{count, static_cast<std::size_t>(ranks)}, sizeof(T), seg_bytes,
                       ranks) * sizeof(T);
}

/// Ring allreduce of `count` elements from `in` into `out` (may be equal).
template <transport C, element T, reduce_op Op>
void allreduce(C& c, const T* in, T* out, std::size_t count, Op op, std::size_t seg_bytes,
               int tag, T* scratch_mem) {
  const partition blocks{count, static_cast<std::size_t>(c.size())};
  reduce_scatter(c, in, out + blocks.offset(static_cast<std::size_t>(c.rank())), blocks, op,
                 seg_bytes, tag, scratch_mem);
  allgather(c, out, blocks, seg_bytes, tag);
}

} // namespace gradsync::algo::ring
