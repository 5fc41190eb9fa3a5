// gradsync: pipelined double binary tree allreduce (the idea of NCCL's tree
// algorithm). Two binary trees each carry half of the data: tree A is the
// heap-ordered tree over ranks 0..p-1 (children of node i: 2i+1, 2i+2), tree
// B is its mirror (rank r is node p-1-r). The interior nodes of A are ranks
// below p/2, those of B ranks above, so every rank is a leaf in at least one
// tree and the two trees together load every link evenly. Each half moves in
// segments: reduced up the tree, then broadcast down, pipelined.
//
// Schedule: in step s a node of height h reduces segment s - h and a node of
// depth d forwards segment s - H - d downwards (H: the root's height). Every
// wait is therefore for a message its peer posted in an earlier step, so the
// pipeline never stalls on a chain of same-step waits and cannot deadlock.
// Time ~ (nseg + 2H) steps; bandwidth ~ 2n bytes per rank.
//
// Receives are posted before they are waited for: the children's upward
// segments up_ahead segments ahead (a rank has children in one tree only),
// and a step's downward receives before its upward work, so a rank's
// incoming transfers of a step overlap instead of following one another
// (where a transport moves large messages only once the receive is posted,
// as MPI's rendezvous does, each waited-for receive otherwise cost a
// segment's time and a handshake in turn).
//
// Written over a segment operation (segment_op.hpp): partials are combined
// into typed accumulators; the broadcast forwards the bytes it received.
//
// Determinism: a node combines op(op(own, left child), right child); each
// half's result comes from its root and is copied down, so every rank holds
// the same bits. The trees use tags `tag` and `tag + 1`.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <vector>

#include "../core/ops.hpp"
#include "../exec/executor.hpp"
#include "pairwise.hpp"
#include "schedule.hpp"
#include "segment_op.hpp"

namespace gradsync::algo::dbtree {

/// Upward segments each child's receives are posted ahead: two keep the next
/// step's transfer moving while this step's is reduced.
inline constexpr std::size_t up_ahead = 2;
/// Receive slots: up_ahead per child.
inline constexpr std::size_t recv_slots = 2 * up_ahead;

/// Scratch elements of the typed allreduce: the children's receive slots.
inline std::size_t allreduce_scratch_elems(std::size_t count, std::size_t elem_bytes,
                                           std::size_t seg_bytes, int ranks) {
  if (ranks <= 1) return 0;
  return recv_slots * segmentation::make(partition{count, 2}, elem_bytes, seg_bytes).max_seg;
}

/// Scratch bytes of allreduce over `sop`: the children's receive slots, and
/// per tree rotating slots for staged upward sends and for downward
/// segments that cannot be received in place (or the root's staged ones).
template <segment_op S>
std::size_t allreduce_scratch_bytes(const S& sop, std::size_t count, std::size_t seg_bytes, int ranks) {
  if (ranks <= 1) return 0;
  const std::size_t stride =
      sop.slot_bytes(segmentation::make(partition{count, 2}, sizeof(typename S::value_type), seg_bytes).max_seg);
  const std::size_t pools = (S::staged_send ? 1 : 0) + (S::staged_send || !S::in_place_copy ? 1 : 0);
  return stride * (recv_slots + 2 * pools * staging_slots);
}

/// One rank's place in a heap-ordered binary tree of `p` nodes.
struct heap_node {
  int node = 0, parent = -1, height = 0, depth = 0;
  std::array<int, 2> child{-1, -1};

  heap_node(int p, int i) : node(i) {
    if (i > 0) parent = (i - 1) / 2;
    for (int k = 0; k < 2; ++k)
      if (2 * i + 1 + k < p) child[static_cast<std::size_t>(k)] = 2 * i + 1 + k;
    for (long long c = 2LL * i + 1; c < p; c = 2 * c + 1) ++height; // leftmost path is longest
    for (int a = i; a > 0; a = (a - 1) / 2) ++depth;
  }
};

/// Allreduce over segment operation `sop` of `count` elements from `in` into
/// `out` (may be equal); `scratch` holds allreduce_scratch_bytes(sop, ...).
template <transport C, segment_op S>
void allreduce(C& c, const S& sop, const typename S::value_type* in, typename S::value_type* out,
               std::size_t count, std::size_t seg_bytes, int tag, std::byte* scratch) {
  using T = typename S::value_type;
  const int p = c.size(), r = c.rank();
  if (pairwise::trivial(sop, p, in, out, count)) return;
  const auto g = segmentation::make(partition{count, 2}, sizeof(T), seg_bytes);
  const auto nseg = static_cast<long long>(g.nseg);
  const int H = heap_node(p, 0).height;
  // Tree t: this rank's node and the real rank of a node.
  const std::array<heap_node, 2> me{heap_node(p, r), heap_node(p, p - 1 - r)};
  auto rank_of = [&](int t, int node) { return t == 0 ? node : p - 1 - node; };
  using req = request_t<C>;
  using rreq = recv_request_t<S, C>;
  const std::size_t stride = sop.slot_bytes(g.max_seg);
  std::byte* pools = scratch + recv_slots * stride;
  auto pool_at = [&]() {
    std::byte* m = pools;
    pools += staging_slots * stride;
    return slot_pool<C>(m, stride, staging_slots);
  };
  // Per tree: staged upward sends; downward segments that live in a slot.
  constexpr bool down_slotted_any = S::staged_send || !S::in_place_copy;
  std::array<slot_pool<C>, 2> up_stage{slot_pool<C>(nullptr, 0, 1), slot_pool<C>(nullptr, 0, 1)};
  std::array<slot_pool<C>, 2> down_slot{slot_pool<C>(nullptr, 0, 1), slot_pool<C>(nullptr, 0, 1)};
  for (int t = 0; t < 2; ++t) {
    if (S::staged_send) up_stage[static_cast<std::size_t>(t)] = pool_at();
    if (down_slotted_any) down_slot[static_cast<std::size_t>(t)] = pool_at();
  }
  // The tree in which this rank has children (interior nodes of A are below
  // (p-1)/2, of B above): its upward receives, up_ahead per child.
  const int it = me[0].child[0] >= 0 ? 0 : me[1].child[0] >= 0 ? 1 : -1;
  std::array<std::array<std::optional<rreq>, up_ahead>, 2> upr;
  auto up_slot = [&](std::size_t k, std::size_t j, std::size_t n) {
    return std::span<std::byte>(scratch + (k * up_ahead + j % up_ahead) * stride, sop.slot_bytes(n));
  };
  auto post_up = [&](long long j) {
    if (it < 0 || j >= nseg) return;
    const auto js = static_cast<std::size_t>(j);
    const std::size_t n = g.size(static_cast<std::size_t>(it), js);
    const auto& m = me[static_cast<std::size_t>(it)];
    for (std::size_t k = 0; k < 2; ++k)
      if (m.child[k] >= 0 && n)
        upr[k][js % up_ahead].emplace(post_recv<S>(c, up_slot(k, js, n), rank_of(it, m.child[k]), tag + it));
  };
  for (long long j = 0; j < static_cast<long long>(up_ahead); ++j) post_up(j);
  std::array<std::vector<std::optional<req>>, 2> up; // per tree, per segment
  for (auto& u : up) u.resize(g.nseg);
  std::vector<req> down;
  std::array<std::optional<rreq>, 2> downr; // per tree: this step's receive from the parent
  std::array<std::span<std::byte>, 2> down_dst;
  std::array<std::byte*, 2> down_sl{};
  for (long long s = 0; s < nseg + 2LL * H + 1; ++s) {
    for (int t = 0; t < 2; ++t) { // post the step's downward receives first
      const auto& m = me[static_cast<std::size_t>(t)];
      const auto b = static_cast<std::size_t>(t);
      const long long j = s - H - m.depth;
      if (m.parent < 0 || j < 0 || j >= nseg) continue;
      const auto js = static_cast<std::size_t>(j);
      const std::size_t off = g.offset(b, js), n = g.size(b, js);
      if (!n) continue;
      if (auto& u = up[b][js]) { u->wait(); u.reset(); } // out[off..] may be in flight
      down_sl[b] = !S::in_place_copy ? down_slot[b].acquire(js) : nullptr;
      down_dst[b] = !S::in_place_copy ? std::span<std::byte>(down_sl[b], sop.slot_bytes(n))
                                      : sop.recv_target(out + off, n, nullptr);
      downr[b].emplace(post_recv<S>(c, down_dst[b], rank_of(t, m.parent), tag + t));
    }
    for (int t = 0; t < 2; ++t) {
      const auto& m = me[static_cast<std::size_t>(t)];
      const auto b = static_cast<std::size_t>(t);
      const int ttag = tag + t;
      if (const long long j = s - m.height; j >= 0 && j < nseg) { // reduce upwards
        const auto js = static_cast<std::size_t>(j);
        const std::size_t off = g.offset(b, js), n = g.size(b, js);
        if (n) {
          const T* cur = in + off;
          for (std::size_t k = 0; k < 2; ++k)
            if (m.child[k] >= 0) {
              auto& r = upr[k][js % up_ahead];
              r->wait();
              sop.combine(arrived<S>(*r, up_slot(k, js, n)), cur, out + off, n, false);
              r.reset();
              cur = out + off;
            }
          if (t == it) post_up(j + static_cast<long long>(up_ahead));
          if (m.parent >= 0) {
            if (cur != in + off) sop.fence();
            std::byte* st = S::staged_send ? up_stage[b].acquire(js) : nullptr;
            auto rq = send_segment(c, sop, cur, n, st, rank_of(t, m.parent), ttag);
            if constexpr (S::staged_send) up_stage[b].hold(js, std::move(rq));
            else up[b][js].emplace(std::move(rq));
          } else {
            sop.finish(out + off, n);
          } // the root has children since p >= 2
        }
      }
      if (const long long j = s - H - m.depth; j >= 0 && j < nseg) { // broadcast downwards
        const auto js = static_cast<std::size_t>(j);
        const std::size_t off = g.offset(b, js), n = g.size(b, js);
        if (n) {
          const bool slotted = m.parent < 0 ? S::staged_send : !S::in_place_copy;
          std::byte* sl = slotted ? down_sl[b] : nullptr;
          std::span<const std::byte> w;
          if (m.parent >= 0) {
            downr[b]->wait();
            const auto got = arrived<S>(*downr[b], down_dst[b]);
            downr[b].reset();
            sop.copy(got, out + off, n); // recv-copy-send: forward what arrived
            w = got;
          } else {
            sl = slotted ? down_slot[b].acquire(js) : nullptr;
            sop.fence(); // the root's finished segment
            w = sop.wire(out + off, n, sl);
            if constexpr (S::staged_send) sop.fence();
          }
          for (int ch : m.child)
            if (ch >= 0) {
              if (slotted) down_slot[b].hold(js, c.isend(w, rank_of(t, ch), ttag));
              else down.push_back(c.isend(w, rank_of(t, ch), ttag));
            }
        }
      }
    }
  }
  for (auto* v : {&up_stage, &down_slot})
    for (auto& pl : *v) pl.drain();
  wait_all(down);
}

} // namespace gradsync::algo::dbtree
