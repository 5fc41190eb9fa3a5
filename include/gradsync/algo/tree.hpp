// gradsync: binomial trees. Reduce: in round k a rank whose virtual rank
// (distance from the root) has bit k set sends its partial result to the rank
// 2^k below and leaves; the others absorb the partial from 2^k above.
// Broadcast runs the same tree downwards. ceil(lg p) rounds each, so allreduce
// (reduce to rank 0, then broadcast) costs 2 lg p messages of the full size:
// the schedule for small messages.
//
// Written over a segment operation (segment_op.hpp): a received partial is
// combined into a typed accumulator; the broadcast forwards the bytes it
// received, as they arrived.
//
// Determinism: a rank combines op(own partial, child's partial), children in
// a fixed order, so the result depends only on p and the root; allreduce
// broadcasts one rank's bits to all.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "../core/ops.hpp"
#include "../exec/executor.hpp"
#include "pairwise.hpp"
#include "schedule.hpp"
#include "segment_op.hpp"

namespace gradsync::algo::tree {

/// Scratch elements of the typed reduce (an accumulator and a receive segment).
inline std::size_t reduce_scratch_elems(std::size_t count, std::size_t elem_bytes,
                                        std::size_t seg_bytes, int ranks) {
  return 2 * pairwise::segment_elems(count, elem_bytes, seg_bytes, ranks);
}

/// Scratch elements of the typed allreduce (a receive segment; `out` accumulates).
inline constexpr auto allreduce_scratch_elems = pairwise::segment_elems;

/// Scratch bytes of broadcast over `sop`: rotating slots, where received
/// segments cannot land in place or the root's sends are staged.
template <segment_op S>
std::size_t broadcast_scratch_bytes(const S& sop, std::size_t count, std::size_t seg_bytes, int ranks) {
  if (S::in_place_copy && !S::staged_send) return 0;
  const std::size_t n = pairwise::segment_elems(count, sizeof(typename S::value_type), seg_bytes, ranks);
  return n == 0 ? 0 : staging_slots * sop.slot_bytes(n);
}

/// Scratch bytes of allreduce over `sop` (a receive slot and a send stage,
/// then the broadcast's).
template <segment_op S>
std::size_t allreduce_scratch_bytes(const S& sop, std::size_t count, std::size_t seg_bytes, int ranks) {
  const std::size_t n = pairwise::segment_elems(count, sizeof(typename S::value_type), seg_bytes, ranks);
  const std::size_t up = n == 0 ? 0 : sop.slot_bytes(n) * (S::staged_send ? 2 : 1);
  return std::max(up, broadcast_scratch_bytes(sop, count, seg_bytes, ranks));
}

/// Scratch bytes of reduce over `sop`: an accumulator of a segment's
/// elements before the receive slot and the send stage.
template <segment_op S>
std::size_t reduce_scratch_bytes(const S& sop, std::size_t count, std::size_t seg_bytes, int ranks) {
  using T = typename S::value_type;
  const std::size_t n = pairwise::segment_elems(count, sizeof(T), seg_bytes, ranks);
  return n == 0 ? 0 : n * sizeof(T) + sop.slot_bytes(n) * (S::staged_send ? 2 : 1);
}

namespace detail {

// One binomial reduction of n elements towards virtual rank 0. `acc` receives
// the partial (the result at the root); leaves send `in` as is. Received
// segments land in `slot`; a staged send is encoded into `stage`.
template <transport C, segment_op S>
void reduce_segment(C& c, const S& sop, const typename S::value_type* in, typename S::value_type* acc,
                    std::byte* slot, std::byte* stage, std::size_t n, int root, int tag) {
  const int p = c.size(), v = mod(c.rank() - root, p);
  const typename S::value_type* cur = in;
  for (int mask = 1; mask < p; mask <<= 1) {
    if (v & mask) {
      if (cur != in) sop.fence();
      send_segment(c, sop, cur, n, stage, mod(v - mask + root, p), tag).wait();
      return;
    }
    if (v + mask < p) {
      const auto got = recv_segment<S>(c, {slot, sop.slot_bytes(n)}, mod(v + mask + root, p), tag);
      sop.combine(got, cur, acc, n, false);
      cur = acc;
    }
  }
}

} // namespace detail

/// Reduce over `sop` of `count` elements of every rank's `in` into `out` at
/// `root` (`out` is not touched elsewhere). `scratch` holds
/// reduce_scratch_bytes(sop, ...).
template <transport C, segment_op S>
void reduce(C& c, const S& sop, const typename S::value_type* in, typename S::value_type* out,
            std::size_t count, int root, std::size_t seg_bytes, int tag, std::byte* scratch) {
  using T = typename S::value_type;
  if (pairwise::trivial(sop, c.size(), in, out, count)) return;
  const std::size_t seg = pairwise::seg_elems(sizeof(T), seg_bytes), m = std::min(seg, count);
  const bool at_root = c.rank() == root;
  T* const own = reinterpret_cast<T*>(scratch);                  // a non-root's accumulator
  std::byte* const slot = scratch + m * sizeof(T), *const stage = slot + sop.slot_bytes(m);
  for (std::size_t off = 0; off < count; off += seg) {
    const std::size_t n = std::min(seg, count - off);
    T* acc = at_root ? out + off : own;
    detail::reduce_segment(c, sop, in + off, acc, slot, stage, n, root, tag);
    if (at_root) sop.finish(acc, n);
  }
}

/// Broadcast over `sop` of `count` elements of `data` from `root`, segment
/// by segment (a rank forwards segment j while segment j+1 is on its way;
/// the next segments' receives are posted ahead). A rank sends to one child
/// at a time, largest subtree first, each send completing before the next
/// starts: sent at once they would share the rank's link, and the child with
/// the most to forward would get each segment only when all of them did.
/// SimGrid SMPI, 64 ranks, 512 KiB (two segments): 2578 us at once, 2225
/// one at a time; sending only the first segment one at a time, 2894. Many
/// segments pay each message's latency in turn instead (8 MiB on 100 Gbit/s
/// NICs: 2.3x the time), where the chain and scatter-allgather win anyway:
/// the model (cost_model::tree_phase) costs it so. `scratch` holds
/// broadcast_scratch_bytes(sop, ...).
template <transport C, segment_op S>
void broadcast(C& c, const S& sop, typename S::value_type* data, std::size_t count, int root,
               std::size_t seg_bytes, int tag, std::byte* scratch) {
  const int p = c.size(), v = mod(c.rank() - root, p);
  if (p == 1 || count == 0) return;
  sop.fence(); // the root's data may have been written by the executor
  int parent = -1, mask = 1;
  for (; mask < p; mask <<= 1)
    if (v & mask) {
      parent = mod(v - mask + root, p);
      break;
    }
  std::vector<int> children; // largest subtree first: it has the most to forward
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < p) children.push_back(mod(v + mask + root, p));
  const std::size_t seg = pairwise::seg_elems(sizeof(typename S::value_type), seg_bytes);
  const std::size_t nseg = (count + seg - 1) / seg;
  auto size_of = [&](std::size_t j) { return std::min(seg, count - j * seg); };
  // Sends out of a slot (a staged root, or a receive that cannot land in place).
  const bool slotted = parent < 0 ? S::staged_send : !S::in_place_copy;
  slot_pool<C> pool(scratch, slotted ? sop.slot_bytes(std::min(seg, count)) : 0, staging_slots);
  using rreq = recv_request_t<S, C>;
  std::vector<std::optional<rreq>> rq(staging_slots);
  std::vector<std::span<std::byte>> target(staging_slots);
  auto post = [&](std::size_t j) { // a slot's sends complete before it is posted again
    const std::size_t n = size_of(j);
    target[j % staging_slots] = slotted ? std::span<std::byte>(pool.acquire(j), sop.slot_bytes(n))
                                        : sop.recv_target(data + j * seg, n, nullptr);
    rq[j % staging_slots].emplace(post_recv<S>(c, target[j % staging_slots], parent, tag));
  };
  const std::size_t ahead = parent < 0 ? 0 : std::min<std::size_t>(staging_slots, nseg);
  for (std::size_t j = 0; j < ahead; ++j) post(j);
  for (std::size_t j = 0; j < nseg; ++j) {
    const std::size_t n = size_of(j);
    std::span<const std::byte> w;
    if (parent < 0) {
      w = sop.wire(data + j * seg, n, slotted ? pool.acquire(j) : nullptr);
      if constexpr (S::staged_send) sop.fence();
    } else {
      rq[j % staging_slots]->wait();
      const auto got = arrived<S>(*rq[j % staging_slots], target[j % staging_slots]);
      rq[j % staging_slots].reset();
      sop.copy(got, data + j * seg, n); // recv-copy-send: forward what arrived
      w = got;
    }
    for (std::size_t i = 0; i < children.size(); ++i) send_in_turn(c, w, children[i], tag, i + 1 < children.size());
    if (parent >= 0 && j + ahead < nseg) post(j + ahead);
  }
}

/// Allreduce over `sop`: binomial reduce to rank 0 (accumulating in `out`),
/// then binomial broadcast. `scratch` holds allreduce_scratch_bytes(sop, ...).
template <transport C, segment_op S>
void allreduce(C& c, const S& sop, const typename S::value_type* in, typename S::value_type* out,
               std::size_t count, std::size_t seg_bytes, int tag, std::byte* scratch) {
  using T = typename S::value_type;
  if (pairwise::trivial(sop, c.size(), in, out, count)) return;
  const std::size_t seg = pairwise::seg_elems(sizeof(T), seg_bytes);
  std::byte* const stage = scratch + sop.slot_bytes(std::min(seg, count));
  for (std::size_t off = 0; off < count; off += seg) {
    const std::size_t n = std::min(seg, count - off);
    detail::reduce_segment(c, sop, in + off, out + off, scratch, stage, n, 0, tag);
  }
  if (c.rank() == 0) sop.finish(out, count);
  broadcast(c, sop, out, count, 0, seg_bytes, tag, scratch);
}

/// Typed reduce on executor `ex`; `scratch` holds reduce_scratch_elems(...).
template <transport C, executor E, element T, reduce_op Op>
void reduce(C& c, E& ex, const T* in, T* out, std::size_t count, int root, Op op, std::size_t seg_bytes,
            int tag, T* scratch) {
  reduce(c, typed_reduce<T, Op, E>{ex, op, c.size(), trace_of(c)}, in, out, count, root, seg_bytes, tag,
         reinterpret_cast<std::byte*>(scratch));
}

/// Typed broadcast on executor `ex` (no scratch).
template <transport C, executor E, element T>
void broadcast(C& c, E& ex, T* data, std::size_t count, int root, std::size_t seg_bytes, int tag) {
  broadcast(c, typed_reduce<T, op::sum, E>{ex, op::sum{}, c.size()}, data, count, root, seg_bytes, tag,
            nullptr);
}

} // namespace gradsync::algo::tree
