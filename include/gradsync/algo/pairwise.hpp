// gradsync: pairwise exchange steps shared by recursive doubling and
// Rabenseifner's algorithm, and the fold that reduces any rank count to a
// power of two for them.
//
// Determinism: two partners always combine as op(lower rank's data, higher
// rank's data), so both compute bitwise the same value.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <vector>

#include "../core/ops.hpp"
#include "../exec/executor.hpp"
#include "schedule.hpp"

namespace gradsync::algo::pairwise {

/// Elements per pipeline segment for elements of `elem_bytes`.
inline std::size_t seg_elems(std::size_t elem_bytes, std::size_t seg_bytes) {
  return std::max<std::size_t>(1, seg_bytes / std::max<std::size_t>(1, elem_bytes));
}

/// Scratch elements of a segmented exchange of up to `count` elements.
inline std::size_t scratch_elems(std::size_t count, std::size_t elem_bytes, std::size_t seg_bytes,
                                 int ranks) {
  return ranks <= 1 ? 0 : std::min(count, seg_elems(elem_bytes, seg_bytes));
}

/// Handles what every allreduce does alike: a single rank or an empty
/// vector (copy, and avg's division, which is a no-op for one rank).
/// Returns whether it did.
template <executor E, element T, reduce_op Op>
bool trivial(E& ex, int ranks, const T* in, T* out, std::size_t count, Op op) {
  if (ranks != 1 && count != 0) return false;
  ex.copy(out, in, count);
  ex.finish(out, count, op, ranks);
  return true;
}

/// The standard fold of p ranks onto the largest power of two p' <= p: of the
/// first 2*(p - p') ranks, each even one hands its data to the odd one above
/// it and waits; the remaining p' ranks run the power-of-two schedule.
struct fold {
  int p = 1, pof2 = 1, rem = 0;

  explicit fold(int ranks)
      : p(ranks), pof2(static_cast<int>(std::bit_floor(static_cast<unsigned>(ranks)))),
        rem(ranks - pof2) {}
  /// Rank among the p' survivors, or -1 for a rank folded away.
  int inner(int r) const {
    if (r < 2 * rem) return r % 2 ? r / 2 : -1;
    return r - rem;
  }
  /// Real rank of survivor `v`.
  int outer(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
  /// log2(p').
  int steps() const { return std::countr_zero(static_cast<unsigned>(pof2)); }
};

/// Sends `send_n` elements of `snd` to `peer` and receives `keep_n` elements
/// from it, setting acc = op(lower, higher) where this rank's operand is `mine`
/// (`i_am_lower` says which side it is). Both transfers are cut into segments
/// of `seg` elements staged through `tmp`. `acc` may alias `mine`, and `snd`
/// may alias both (each segment is overwritten only after it has been sent).
template <transport C, executor E, element T, reduce_op Op>
void exchange_combine(C& c, E& ex, int peer, bool i_am_lower, const T* snd, std::size_t send_n,
                      const T* mine, T* acc, std::size_t keep_n, Op op, std::size_t seg, int tag,
                      T* tmp) {
  using req = request_t<C>;
  std::vector<req> sends;
  sends.reserve((send_n + seg - 1) / seg);
  ex.fence(); // `snd` may have been written by the executor
  for (std::size_t off = 0; off < send_n; off += seg)
    sends.push_back(send(c, snd + off, std::min(seg, send_n - off), peer, tag));
  std::size_t waited = 0; // sends [0, waited) are complete
  for (std::size_t off = 0; off < keep_n; off += seg) {
    const std::size_t n = std::min(seg, keep_n - off);
    recv(c, tmp, n, peer, tag).wait();
    // Before acc[off, off+n) changes, every send that may read it must be done.
    if (snd < acc + off + n && acc + off < snd + send_n)
      for (; waited < sends.size() && waited * seg < static_cast<std::size_t>(acc + off + n - snd); ++waited)
        sends[waited].wait();
    if (i_am_lower)
      ex.reduce(acc + off, mine + off, static_cast<const T*>(tmp), n, op);
    else
      ex.reduce(acc + off, static_cast<const T*>(tmp), mine + off, n, op);
  }
  sends.erase(sends.begin(), sends.begin() + static_cast<std::ptrdiff_t>(waited));
  wait_all(sends);
}

/// Sends `send_n` elements of `snd` to `peer` and receives `recv_n` into `dst`.
template <transport C, executor E, element T>
void exchange_copy(C& c, E& ex, int peer, const T* snd, std::size_t send_n, T* dst, std::size_t recv_n,
                   int tag) {
  std::vector<request_t<C>> sends;
  ex.fence();
  if (send_n) sends.push_back(send(c, snd, send_n, peer, tag));
  if (recv_n) recv(c, dst, recv_n, peer, tag).wait();
  wait_all(sends);
}

/// The fold's first half: an even rank r < 2*rem sends `in` to r+1; an odd
/// one sets out = op(in[r-1], in[r]); every other rank copies in to out.
template <transport C, executor E, element T, reduce_op Op>
void fold_in(C& c, E& ex, const fold& f, const T* in, T* out, std::size_t count, Op op, std::size_t seg,
             int tag, T* tmp) {
  const int r = c.rank();
  if (r >= 2 * f.rem) {
    ex.copy(out, in, count);
  } else if (r % 2 == 0) {
    exchange_combine(c, ex, r + 1, true, in, count, in, out, 0, op, seg, tag, tmp);
  } else {
    exchange_combine(c, ex, r - 1, false, in, 0, in, out, count, op, seg, tag, tmp);
  }
}

/// The fold's second half: each odd rank r < 2*rem hands the result to r-1.
template <transport C, executor E, element T>
void fold_out(C& c, E& ex, const fold& f, T* out, std::size_t count, int tag) {
  const int r = c.rank();
  if (r >= 2 * f.rem) return;
  if (r % 2) exchange_copy(c, ex, r - 1, static_cast<const T*>(out), count, out, 0, tag);
  else exchange_copy(c, ex, r + 1, static_cast<const T*>(out), 0, out, count, tag);
}

/// The frame of a power-of-two schedule on any rank count: handles the
/// trivial cases, folds, runs `body(v, f, seg)` on each surviving rank (v: its
/// rank among the survivors, seg: segment elements), unfolds.
template <transport C, executor E, element T, reduce_op Op, class Body>
void folded(C& c, E& ex, const T* in, T* out, std::size_t count, Op op, std::size_t seg_bytes, int tag,
            T* scratch, Body&& body) {
  const int p = c.size();
  if (trivial(ex, p, in, out, count, op)) return;
  const fold f(p);
  const std::size_t seg = seg_elems(sizeof(T), seg_bytes);
  fold_in(c, ex, f, in, out, count, op, seg, tag, scratch);
  if (const int v = f.inner(c.rank()); v >= 0) body(v, f, seg);
  fold_out(c, ex, f, out, count, tag);
}

} // namespace gradsync::algo::pairwise
