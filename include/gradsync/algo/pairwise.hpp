// gradsync: pairwise exchange steps shared by recursive doubling and
// Rabenseifner's algorithm, and the fold that reduces any rank count to a
// power of two for them. Written over a segment operation (segment_op.hpp):
// a step sends the wire form of a local range and combines (or copies) what
// the partner sent.
//
// Determinism: two partners always combine as op(lower rank's data, higher
// rank's data), so both compute bitwise the same value.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <optional>
#include <vector>

#include "../core/ops.hpp"
#include "../core/partition.hpp"
#include "../exec/executor.hpp"
#include "schedule.hpp"
#include "segment_op.hpp"

namespace gradsync::algo::pairwise {

/// Elements per pipeline segment for elements of `elem_bytes`.
inline std::size_t seg_elems(std::size_t elem_bytes, std::size_t seg_bytes) {
  return std::max<std::size_t>(1, seg_bytes / std::max<std::size_t>(1, elem_bytes));
}

/// Sends an operation stages in flight per exchange (each in its own slot).
inline constexpr std::size_t send_slots = policy::pipeline_depth;
/// Receives a combining exchange keeps posted ahead (each into its own
/// slot): one at a time, every segment paid a whole message's latency (a
/// rendezvous handshake for large ones) before its bytes moved. SimGrid
/// SMPI, 8 ranks one per node (10 Gbit/s), reduce-scatter of 16 MiB by
/// recursive halving (256 KiB segments): 20.3 ms with one, 14.9 with
/// four, the model 13.6 (docs/benchmarks.md).
inline constexpr std::size_t recv_slots = policy::pipeline_depth;

/// Elements of one segment of an exchange of up to `count` elements (0 on
/// one rank).
inline std::size_t segment_elems(std::size_t count, std::size_t elem_bytes, std::size_t seg_bytes, int ranks) {
  return ranks <= 1 ? 0 : std::min(count, seg_elems(elem_bytes, seg_bytes));
}

/// Scratch elements of a segmented exchange of up to `count` elements with
/// the typed reduction (recv_slots receive segments).
inline std::size_t scratch_elems(std::size_t count, std::size_t elem_bytes, std::size_t seg_bytes,
                                 int ranks) {
  return recv_slots * segment_elems(count, elem_bytes, seg_bytes, ranks);
}

/// Scratch bytes of a segmented exchange of up to `count` elements with
/// `sop`: recv_slots receive slots, plus rotating send staging where it
/// stages (scratch_elems(...) elements of the typed reduction).
template <segment_op S>
std::size_t scratch_bytes(const S& sop, std::size_t count, std::size_t seg_bytes, int ranks) {
  const std::size_t n = segment_elems(count, sizeof(typename S::value_type), seg_bytes, ranks);
  return n == 0 ? 0 : sop.slot_bytes(n) * (recv_slots + (S::staged_send ? send_slots : 0));
}

/// Scratch bytes of a reduce-scatter over `blocks` (p blocks) of elements
/// of T under the typed reduction that combines into a work copy of its
/// input (recursive halving, Bruck's): the copy and one receive segment.
template <class T> std::size_t work_copy_scratch_bytes(const partition& blocks, std::size_t seg_bytes, int ranks) {
  if (ranks <= 1 || blocks.count == 0) return 0;
  return (blocks.count + scratch_elems(blocks.count, sizeof(T), seg_bytes, ranks)) * sizeof(T);
}

/// Handles what every allreduce does alike: a single rank or an empty
/// vector (copy, and avg's division, which is a no-op for one rank).
/// Returns whether it did.
template <segment_op S>
bool trivial(const S& sop, int ranks, const typename S::value_type* in, typename S::value_type* out,
             std::size_t count) {
  if (ranks != 1 && count != 0) return false;
  sop.local(in, out, count);
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
  /// First of the real ranks survivor `v` stands for (two for v < rem: the
  /// folded even rank and itself; v may equal pof2, giving p): survivors
  /// stand for consecutive ranks, so an aligned range of survivors covers a
  /// contiguous range of per-rank blocks.
  int first(int v) const { return v < rem ? 2 * v : v + rem; }
  /// log2(p').
  int steps() const { return std::countr_zero(static_cast<unsigned>(pof2)); }
};

/// The sending half of an exchange: `total` elements at `snd` go to `peer`
/// in segments of `seg`. Operations whose wire form views the elements post
/// every segment at once; staging ones keep send_slots in flight, each
/// encoded into its own slot of `stage`.
template <transport C, segment_op S> class segment_sender {
public:
  using T = typename S::value_type;
  segment_sender(C& c, const S& sop, const T* snd, std::size_t total, std::size_t seg, std::byte* stage,
                 std::size_t stride, int peer, int tag)
      : c_(c), sop_(sop), snd_(snd), total_(total), seg_(seg), nseg_((total + seg - 1) / seg),
        pool_(stage, stride, S::staged_send ? send_slots : 1), peer_(peer), tag_(tag) {
    post(S::staged_send ? send_slots : nseg_);
  }
  /// Posts the segments before `upto` (as far as staging allows).
  void post(std::size_t upto) {
    for (; posted_ < std::min(upto, nseg_); ++posted_) {
      const std::size_t off = posted_ * seg_, n = std::min(seg_, total_ - off);
      if constexpr (S::staged_send) {
        std::byte* st = pool_.acquire(posted_);
        pool_.hold(posted_, send_segment(c_, sop_, snd_ + off, n, st, peer_, tag_));
      } else {
        sends_.push_back(send_segment(c_, sop_, snd_ + off, n, nullptr, peer_, tag_));
      }
    }
  }
  /// One more segment in flight, where staging holds it back.
  void advance() {
    if constexpr (S::staged_send) post(posted_ + 1);
  }
  /// Before elements below `hi` of the send range change: waits for the
  /// sends that read them (only wire forms that view the elements read late).
  void release(std::size_t hi) {
    if constexpr (!S::staged_send)
      for (; waited_ < sends_.size() && waited_ * seg_ < hi; ++waited_) sends_[waited_].wait();
  }
  /// Posts what is left and waits for every send.
  void finish() {
    post(nseg_);
    pool_.drain();
    sends_.erase(sends_.begin(), sends_.begin() + static_cast<std::ptrdiff_t>(waited_));
    wait_all(sends_);
  }

private:
  C& c_;
  const S& sop_;
  const T* snd_;
  std::size_t total_, seg_, nseg_, posted_ = 0, waited_ = 0;
  slot_pool<C> pool_;
  std::vector<request_t<C>> sends_;
  int peer_, tag_;
};

/// Sends `send_n` elements of `snd` to `to` and receives `keep_n` elements
/// from `from`, setting acc = op(received, mine) when `got_first`, else
/// op(mine, received). Both transfers are cut into segments of `seg`
/// elements; received ones land in `scratch`'s recv_slots slots, posted
/// that many ahead (scratch_bytes(...)). `acc` may alias `mine`, and `snd`
/// may alias both (each segment is overwritten only after it has been sent).
template <transport C, segment_op S>
void shift_combine(C& c, const S& sop, int to, int from, bool got_first, const typename S::value_type* snd,
                   std::size_t send_n, const typename S::value_type* mine, typename S::value_type* acc,
                   std::size_t keep_n, std::size_t seg, int tag, std::byte* scratch) {
  const std::size_t stride = sop.slot_bytes(std::min(seg, std::max(send_n, keep_n)));
  const std::size_t nseg = (keep_n + seg - 1) / seg;
  using rreq = recv_request_t<S, C>;
  std::array<std::optional<rreq>, recv_slots> rq;
  auto target = [&](std::size_t j) {
    return std::span<std::byte>(scratch + (j % recv_slots) * stride, sop.slot_bytes(std::min(seg, keep_n - j * seg)));
  };
  auto post = [&](std::size_t j) { rq[j % recv_slots].emplace(post_recv<S>(c, target(j), from, tag)); };
  sop.fence(); // `snd` may have been written by the executor
  for (std::size_t j = 0; j < std::min(nseg, recv_slots); ++j) post(j);
  segment_sender<C, S> out(c, sop, snd, send_n, seg, scratch + recv_slots * stride, stride, to, tag);
  for (std::size_t j = 0; j < nseg; ++j) {
    const std::size_t off = j * seg, n = std::min(seg, keep_n - off);
    auto& r = *rq[j % recv_slots];
    r.wait();
    const auto got = arrived<S>(r, target(j));
    if (snd < acc + off + n && acc + off < snd + send_n) // acc[off, off+n) is about to change
      out.release(static_cast<std::size_t>(acc + off + n - snd));
    sop.combine(got, mine + off, acc + off, n, got_first);
    rq[j % recv_slots].reset();
    if (j + recv_slots < nseg) post(j + recv_slots);
    out.advance();
  }
  out.finish();
}

/// shift_combine with one partner `peer`, the two combining as op(lower
/// rank's data, higher rank's data) (`i_am_lower` says which side this is).
template <transport C, segment_op S>
void exchange_combine(C& c, const S& sop, int peer, bool i_am_lower, const typename S::value_type* snd,
                      std::size_t send_n, const typename S::value_type* mine, typename S::value_type* acc,
                      std::size_t keep_n, std::size_t seg, int tag, std::byte* scratch) {
  shift_combine(c, sop, peer, peer, !i_am_lower, snd, send_n, mine, acc, keep_n, seg, tag, scratch);
}

/// Sends `send_n` elements of `snd` to `to` and receives `recv_n` from
/// `from` into `dst`. Operations whose wire form is the elements move each
/// range as one message; others in segments of `seg`, received through
/// `scratch`.
template <transport C, segment_op S>
void shift_copy(C& c, const S& sop, int to, const typename S::value_type* snd, std::size_t send_n, int from,
                typename S::value_type* dst, std::size_t recv_n, std::size_t seg, int tag, std::byte* scratch) {
  constexpr bool whole = S::in_place_copy && !S::staged_send;
  const std::size_t cseg = whole ? std::max<std::size_t>({send_n, recv_n, 1}) : seg;
  const std::size_t stride = whole ? 0 : sop.slot_bytes(std::min(seg, std::max(send_n, recv_n)));
  sop.fence();
  segment_sender<C, S> out(c, sop, snd, send_n, cseg, scratch + stride, stride, to, tag);
  for (std::size_t off = 0; off < recv_n; off += cseg) {
    const std::size_t n = std::min(cseg, recv_n - off);
    const std::span<std::byte> t = S::in_place_copy ? sop.recv_target(dst + off, n, nullptr)
                                                    : std::span<std::byte>(scratch, sop.slot_bytes(n));
    sop.copy(recv_segment<S>(c, t, from, tag), dst + off, n);
    out.advance();
  }
  out.finish();
}

/// shift_copy with one partner `peer`.
template <transport C, segment_op S>
void exchange_copy(C& c, const S& sop, int peer, const typename S::value_type* snd, std::size_t send_n,
                   typename S::value_type* dst, std::size_t recv_n, std::size_t seg, int tag, std::byte* scratch) {
  shift_copy(c, sop, peer, snd, send_n, peer, dst, recv_n, seg, tag, scratch);
}

/// The fold's first half: an even rank r < 2*rem sends `in` to r+1; an odd
/// one sets out = op(in[r-1], in[r]); every other rank copies in to out.
template <transport C, segment_op S>
void fold_in(C& c, const S& sop, const fold& f, const typename S::value_type* in, typename S::value_type* out,
             std::size_t count, std::size_t seg, int tag, std::byte* scratch) {
  const int r = c.rank();
  if (r >= 2 * f.rem) {
    sop.assign(out, in, count);
  } else if (r % 2 == 0) {
    exchange_combine(c, sop, r + 1, true, in, count, in, out, 0, seg, tag, scratch);
  } else {
    exchange_combine(c, sop, r - 1, false, in, 0, in, out, count, seg, tag, scratch);
  }
}

/// The fold's second half: each odd rank r < 2*rem hands the result to r-1.
template <transport C, segment_op S>
void fold_out(C& c, const S& sop, const fold& f, typename S::value_type* out, std::size_t count,
              std::size_t seg, int tag, std::byte* scratch) {
  const int r = c.rank();
  if (r >= 2 * f.rem) return;
  using T = typename S::value_type;
  if (r % 2) exchange_copy(c, sop, r - 1, static_cast<const T*>(out), count, out, 0, seg, tag, scratch);
  else exchange_copy(c, sop, r + 1, static_cast<const T*>(out), 0, out, count, seg, tag, scratch);
}

/// The frame of a power-of-two schedule on any rank count: handles the
/// trivial cases, folds, runs `body(v, f, seg)` on each surviving rank (v: its
/// rank among the survivors, seg: segment elements), unfolds. `scratch`
/// holds scratch_bytes(sop, count, ...).
template <transport C, segment_op S, class Body>
void folded(C& c, const S& sop, const typename S::value_type* in, typename S::value_type* out,
            std::size_t count, std::size_t seg_bytes, int tag, std::byte* scratch, Body&& body) {
  const int p = c.size();
  if (trivial(sop, p, in, out, count)) return;
  const fold f(p);
  const std::size_t seg = seg_elems(sizeof(typename S::value_type), seg_bytes);
  fold_in(c, sop, f, in, out, count, seg, tag, scratch);
  if (const int v = f.inner(c.rank()); v >= 0) body(v, f, seg);
  fold_out(c, sop, f, out, count, seg, tag, scratch);
}

} // namespace gradsync::algo::pairwise
