// gradsync: pipelined chain broadcast and reduce. Ranks form a line starting
// at the root; data moves in segments, so after the pipeline fills every link
// is busy: time ~ (p - 2 + nseg) segment steps, bandwidth term n.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "../core/ops.hpp"
#include "../exec/executor.hpp"
#include "schedule.hpp"

namespace gradsync::algo::chain {

/// Broadcast `count` elements of `data` from `root` along the chain
/// root, root+1, ..., root-1.
template <transport C, executor E, element T>
void broadcast(C& c, E& ex, T* data, std::size_t count, int root, std::size_t seg_bytes, int tag) {
  const int p = c.size(), r = c.rank();
  if (p == 1 || count == 0) return;
  ex.fence(); // the root's data may have been written by the executor
  const int v = mod(r - root, p); // position in the chain
  const int next = v + 1 < p ? mod(r + 1, p) : -1, prev = v > 0 ? mod(r - 1, p) : -1;
  const auto g = segmentation::make(partition{count, 1}, sizeof(T), seg_bytes);
  using req = request_t<C>;
  using rreq = decltype(recv(c, data, 0, 0, 0));
  std::vector<req> sends;
  if (prev < 0) {
    for (std::size_t j = 0; j < g.nseg; ++j)
      if (const auto n = g.size(0, j)) sends.push_back(send(c, static_cast<const T*>(data + g.offset(0, j)), n, next, tag));
    wait_all(sends);
    return;
  }
  const std::size_t depth = policy::pipeline_depth;
  std::vector<std::optional<rreq>> rq(depth);
  auto post = [&](std::size_t j) { rq[j % depth].emplace(recv(c, data + g.offset(0, j), g.size(0, j), prev, tag)); };
  std::size_t nseg = 0;
  while (nseg < g.nseg && g.size(0, nseg)) ++nseg; // segments are non-increasing in size
  for (std::size_t j = 0; j < std::min(depth, nseg); ++j) post(j);
  for (std::size_t j = 0; j < nseg; ++j) {
    rq[j % depth]->wait();
    rq[j % depth].reset();
    if (j + depth < nseg) post(j + depth);
    if (next >= 0) sends.push_back(send(c, static_cast<const T*>(data + g.offset(0, j)), g.size(0, j), next, tag));
  }
  wait_all(sends);
}

/// Scratch elements of a chain reduce.
inline std::size_t reduce_scratch_elems(std::size_t count, std::size_t elem_bytes,
                                        std::size_t seg_bytes, int ranks) {
  if (ranks <= 1) return 0;
  return 2 * policy::pipeline_depth * segmentation::make(partition{count, 1}, elem_bytes, seg_bytes).max_seg;
}

/// Reduce `count` elements of every rank's `in` into `out` at `root`
/// (`out` is ignored elsewhere). The chain runs root+1, root+2, ..., root, so
/// the result is op(...op(in[root+1], in[root+2])..., in[root]) for every element.
template <transport C, executor E, element T, reduce_op Op>
void reduce(C& c, E& ex, const T* in, T* out, std::size_t count, int root, Op op,
            std::size_t seg_bytes, int tag, T* slot_mem) {
  const int p = c.size(), r = c.rank();
  if (p == 1) {
    ex.copy(out, in, count);
    ex.finish(out, count, op, p);
    return;
  }
  if (count == 0) return;
  const int v = mod(root - r, p); // distance from the root, backwards
  const int to = v > 0 ? mod(r + 1, p) : -1;     // towards the root
  const int from = v + 1 < p ? mod(r - 1, p) : -1; // away from the root
  const auto g = segmentation::make(partition{count, 1}, sizeof(T), seg_bytes);
  std::size_t nseg = 0;
  while (nseg < g.nseg && g.size(0, nseg)) ++nseg;
  using req = request_t<C>;
  using rreq = decltype(recv(c, slot_mem, 0, 0, 0));
  if (from < 0) { // the far end of the chain sends its input as is
    std::vector<req> sends;
    for (std::size_t j = 0; j < nseg; ++j) sends.push_back(send(c, in + g.offset(0, j), g.size(0, j), to, tag));
    wait_all(sends);
    return;
  }
  const std::size_t depth = policy::pipeline_depth, nslots = 2 * depth;
  std::vector<std::optional<rreq>> rq(nslots);
  std::vector<std::optional<req>> sq(nslots);
  auto slot = [&](std::size_t j) { return slot_mem + (j % nslots) * g.max_seg; };
  auto post = [&](std::size_t j) {
    if (auto& s = sq[j % nslots]) { s->wait(); s.reset(); }
    rq[j % nslots].emplace(recv(c, slot(j), g.size(0, j), from, tag));
  };
  for (std::size_t j = 0; j < std::min(depth, nseg); ++j) post(j);
  for (std::size_t j = 0; j < nseg; ++j) {
    rq[j % nslots]->wait();
    rq[j % nslots].reset();
    const auto off = g.offset(0, j), n = g.size(0, j);
    if (to < 0) {
      ex.reduce(out + off, static_cast<const T*>(slot(j)), in + off, n, op);
      ex.finish(out + off, n, op, p);
    } else {
      ex.reduce(slot(j), static_cast<const T*>(slot(j)), in + off, n, op);
      ex.fence();
      sq[j % nslots].emplace(send(c, static_cast<const T*>(slot(j)), n, to, tag));
    }
    if (j + depth < nseg) post(j + depth);
  }
  for (auto& s : sq)
    if (s) s->wait();
}

} // namespace gradsync::algo::chain
